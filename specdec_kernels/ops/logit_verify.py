"""Verification of chain drafts on the target's logits: greedy, SpecDec's relaxed rule, BiLD's rollback
and fallback policies (and the max_prob they rest on). Shapes and outputs: ops/_chain.py."""

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..common import validate as check
from ._chain import chain_fake, chain_sizes, check_chain
from ..common.registry import custom_op, implementation, register, resolve


# ---------------------------------------------------------------- greedy_verify

@custom_op("specdec::greedy_verify", mutates_args=())
def _greedy_verify_op(target_logits: Tensor, draft_tokens: Tensor, num_draft_tokens: Optional[Tensor],
                      backend: str) -> tuple[Tensor, Tensor]:
    return implementation("greedy_verify", backend)(target_logits, draft_tokens, num_draft_tokens=num_draft_tokens)


@_greedy_verify_op.register_fake
def _(target_logits, draft_tokens, num_draft_tokens, backend):
    return chain_fake(draft_tokens)


def greedy_verify(target_logits: Tensor, draft_tokens: Tensor, *, num_draft_tokens: Tensor | None = None,
                  backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Greedy verification: accept drafts while each equals the target's argmax.

    The argmax treats NaN as -inf and breaks ties toward the lowest id, like torch.argmax
    on clean rows, so the output is token-identical to greedy decoding with the target.

    Args:
        target_logits: [B, g+1, V] float32/float16/bfloat16 (probabilities work too).
        draft_tokens: [B, g] int64/int32.
        num_draft_tokens: optional [B] int64/int32 in [0, g] for ragged rows.
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        output_tokens [B, g+1] int64 (accepted drafts, then the argmax at the first
        mismatch or the bonus argmax, then -1), num_accepted [B] int64.
    """
    check_chain("greedy_verify", target_logits, "target_logits", draft_tokens, num_draft_tokens)
    return _greedy_verify_op(target_logits, draft_tokens, num_draft_tokens,
                             resolve("greedy_verify", backend, draft_tokens.device, sizes=chain_sizes(target_logits)))


# ---------------------------------------------------------------- relaxed_verify (SpecDec)

@custom_op("specdec::relaxed_verify", mutates_args=())
def _relaxed_verify_op(target_logits: Tensor, draft_tokens: Tensor, top_beta: int, tau: float,
                       num_draft_tokens: Optional[Tensor], backend: str) -> tuple[Tensor, Tensor]:
    return implementation("relaxed_verify", backend)(target_logits, draft_tokens, top_beta=top_beta, tau=tau,
                                                     num_draft_tokens=num_draft_tokens)


@_relaxed_verify_op.register_fake
def _(target_logits, draft_tokens, top_beta, tau, num_draft_tokens, backend):
    return chain_fake(draft_tokens)


def relaxed_verify(target_logits: Tensor, draft_tokens: Tensor, *, top_beta: int, tau: float,
                   num_draft_tokens: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """SpecDec relaxed verification (Xia et al., Eq. 8 and 9). LOSSY unless top_beta=1 or tau=0.

    Draft i is accepted while every earlier draft was and both hold at its position:
    (8) it ranks within the target's top `top_beta` tokens, ranking by logit with ties
    broken toward the lower id (so rank 0 is exactly the argmax); (9) it is the argmax or
    its logit is less than `tau` below the top-1 logit (log-prob gaps equal logit gaps).
    The row then emits the target's top-1 at the first rejection, or the bonus top-1.
    With top_beta=1 or tau=0 the result equals `greedy_verify` exactly, ties included.

    Args:
        target_logits: [B, g+1, V] float32/float16/bfloat16 raw logits (temperature 1).
        draft_tokens: [B, g] int64/int32.
        top_beta: int >= 1.  tau: float >= 0 (nats).
        num_draft_tokens: optional [B] int64/int32 in [0, g] for ragged rows.

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64.
    """
    op = "relaxed_verify"
    check_chain(op, target_logits, "target_logits", draft_tokens, num_draft_tokens)
    top_beta = check.positive_int(op, "top_beta", top_beta)
    tau = check.real_number(op, "tau", tau, minimum=0.0)
    return _relaxed_verify_op(target_logits, draft_tokens, top_beta, tau, num_draft_tokens,
                              resolve(op, backend, draft_tokens.device, sizes=chain_sizes(target_logits)))


# ---------------------------------------------------------------- bild_verify, fallback_check, max_prob (BiLD)

@custom_op("specdec::bild_verify", mutates_args=())
def _bild_verify_op(target_logits: Tensor, draft_tokens: Tensor, rollback_threshold: float,
                    num_draft_tokens: Optional[Tensor], backend: str) -> tuple[Tensor, Tensor]:
    return implementation("bild_verify", backend)(target_logits, draft_tokens, rollback_threshold=rollback_threshold,
                                                  num_draft_tokens=num_draft_tokens)


@_bild_verify_op.register_fake
def _(target_logits, draft_tokens, rollback_threshold, num_draft_tokens, backend):
    return chain_fake(draft_tokens)


def bild_verify(target_logits: Tensor, draft_tokens: Tensor, *, rollback_threshold: float,
                num_draft_tokens: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """BiLD rollback policy (Kim et al.). LOSSY: not distribution- or greedy-preserving.

    The first draft j whose target negative log-likelihood -log softmax(target_logits[:, j])
    [draft_j] exceeds `rollback_threshold` is replaced by the target's top-1 and everything
    after it is dropped; if none exceeds it, every draft is kept and the bonus top-1 from
    position g is appended. NaN logits count as -inf (so a draft on one is rolled back).

    Args:
        target_logits: [B, g+1, V] float32/float16/bfloat16 raw target logits.
        draft_tokens: [B, g] int64/int32, the small model's tokens.
        rollback_threshold: float >= 0 (the paper's alpha_RB, in nats).
        num_draft_tokens: optional [B] int64/int32 in [0, g] for ragged rows.

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64.
    """
    op = "bild_verify"
    check_chain(op, target_logits, "target_logits", draft_tokens, num_draft_tokens)
    rollback_threshold = check.real_number(op, "rollback_threshold", rollback_threshold, minimum=0.0)
    return _bild_verify_op(target_logits, draft_tokens, rollback_threshold, num_draft_tokens,
                           resolve(op, backend, draft_tokens.device, sizes=chain_sizes(target_logits)))


@custom_op("specdec::max_prob", mutates_args=())
def _max_prob_op(logits: Tensor, backend: str) -> Tensor:
    return implementation("max_prob", backend)(logits)


@_max_prob_op.register_fake
def _(logits, backend):
    return logits.new_empty(logits.shape[:-1], dtype=torch.float32)


def _checked_max_prob(op: str, name: str, logits: Tensor, backend: str) -> Tensor:
    if not isinstance(logits, Tensor):
        check.fail(op, f"`{name}` must be a torch.Tensor (got {type(logits).__name__})", TypeError)
    if logits.dim() == 0 or logits.shape[-1] == 0:
        check.fail(op, f"`{name}` must have a non-empty last (vocabulary) dimension (got shape {list(logits.shape)})")
    check.tensor(op, name, logits, shape=(*["..."] * (logits.dim() - 1), "V"), dtypes=check.FLOAT_DTYPES)
    return _max_prob_op(logits, resolve(op, backend, logits.device, runs_as="max_prob",
                                                 sizes=dict(R=logits.numel() // logits.shape[-1], V=logits.shape[-1],
                                                            dtype=logits.dtype)))


def max_prob(logits: Tensor, *, backend: str = "auto") -> Tensor:
    """Largest softmax probability along the last dimension (a confidence score).

    Args:
        logits: [..., V] float32/float16/bfloat16 (NaN counts as -inf).

    Returns:
        [...] float32 in [0, 1]; 0 for a row with no finite logit, 1 if a logit is +inf.
    """
    return _checked_max_prob("max_prob", "logits", logits, backend)


def fallback_check(draft_logits: Tensor, threshold: float, *, backend: str = "auto") -> Tensor:
    """BiLD fallback policy: True where the draft model is not confident enough.

    Args:
        draft_logits: [B, V] float32/float16/bfloat16, the small model's next-token logits.
        threshold: float in [0, 1] (the paper's alpha_FB).

    Returns:
        [B] bool: max softmax probability < threshold (hand control to the target).
    """
    op = "fallback_check"
    check.tensor(op, "draft_logits", draft_logits, shape=("B", "V"), dtypes=check.FLOAT_DTYPES)
    threshold = check.real_number(op, "threshold", threshold, minimum=0.0)
    if threshold > 1.0:
        check.fail(op, f"`threshold` is a probability and must be <= 1 (got {threshold})")
    return _checked_max_prob(op, "draft_logits", draft_logits, backend) < threshold


for _name in ("greedy_verify", "relaxed_verify", "bild_verify", "max_prob"):
    register(_name, "torch", getattr(reference, _name))
