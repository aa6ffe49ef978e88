"""Verification of chain drafts: speculative sampling, greedy, SpecDec relaxed, BiLD.

Shapes: B rows, g drafts per row, vocabulary V.
Outputs of every verify op: `output_tokens [B, g+1]` int64 (the accepted drafts, then one
correction or bonus token, then -1 padding) and `num_accepted [B]` int64; a row emits
num_accepted + 1 tokens.
"""

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from . import _validate as check
from ..common.registry import custom_op, implementation, register, resolve


def _chain_sizes(scores: Tensor) -> dict:
    """The sizes the backends' launch limits are checked against: scores are [B, g+1, V]."""
    batch, g1, vocab = scores.shape
    return dict(B=batch, G=g1 - 1, V=vocab, dtype=scores.dtype)


def _chain_fake(draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    batch, g = draft_tokens.shape
    return draft_tokens.new_empty(batch, g + 1), draft_tokens.new_empty(batch)


def _check_chain(op: str, scores: Tensor, name: str, draft_tokens: Tensor, num_draft_tokens) -> tuple[int, int, int]:
    check.tensor(op, "draft_tokens", draft_tokens, shape=("B", "g"), dtypes=check.OP_INDEX_DTYPES, last_dim_contiguous=False)
    batch, g = draft_tokens.shape
    check.tensor(op, name, scores, shape=(batch, g + 1, "V"), dtypes=check.FLOAT_DTYPES, device=draft_tokens.device)
    vocab = scores.shape[-1]
    if vocab == 0:
        check.fail(op, f"`{name}` has an empty vocabulary dimension")
    check.token_range(op, "draft_tokens", draft_tokens, vocab, allow_padding=True)
    check.num_draft_tokens(op, num_draft_tokens, batch=batch, g=g, device=draft_tokens.device)
    return batch, g, vocab


def _check_sampling(op: str, target: Tensor, target_name: str, draft: Tensor, draft_name: str, draft_tokens: Tensor,
                    num_draft_tokens, uniforms, seed, offsets) -> tuple[int, int, int]:
    """The checks shared by the two speculative-sampling ops (probs or logits in)."""
    batch, g, vocab = _check_chain(op, target, target_name, draft_tokens, num_draft_tokens)
    check.tensor(op, draft_name, draft, shape=(batch, g, vocab), dtypes=check.FLOAT_DTYPES, device=draft_tokens.device)
    check.same_dtype(op, (target_name, draft_name), target, draft)
    check.randomness(op, uniforms, seed, offsets, shape=(batch, g + 1), batch=batch, device=draft_tokens.device)
    return batch, g, vocab


# ---------------------------------------------------------------- rejection_sample

@custom_op("specdec::rejection_sample", mutates_args=())
def _rejection_sample_op(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, uniforms: Optional[Tensor],
                         seed: Optional[int], seeds: Optional[Tensor], offsets: Optional[Tensor],
                         num_draft_tokens: Optional[Tensor], backend: str) -> tuple[Tensor, Tensor]:
    return implementation("rejection_sample", backend)(
        target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed if seeds is None else seeds,
        offsets=offsets, num_draft_tokens=num_draft_tokens)


@_rejection_sample_op.register_fake
def _(target_probs, draft_probs, draft_tokens, uniforms, seed, seeds, offsets, num_draft_tokens, backend):
    return _chain_fake(draft_tokens)


def rejection_sample(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
                     uniforms: Tensor | None = None, seed: int | Tensor | None = None, offsets: Tensor | None = None,
                     num_draft_tokens: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Speculative sampling (Leviathan et al., Algorithm 1): lossless verification of sampled drafts.

    Draft i is accepted with probability min(1, p_i(x_i) / q_i(x_i)), tested as u_i * q < p
    (so q == 0 < p accepts, p == 0 never does). At the first rejection the row emits a draw
    from norm(max(0, p - q)) at that position; if every draft passes, a bonus token from
    target_probs[:, g]. An empty residual (p == q) falls back to p, and a row with no mass
    at all (zeros or NaN) to its lowest index, so ids are always in [0, V).

    Args:
        target_probs: [B, g+1, V] float32/float16/bfloat16, the target's (standardised)
            distributions at each draft position plus the bonus position.
        draft_probs: [B, g, V], same dtype: the distributions the drafts were sampled from.
        draft_tokens: [B, g] int64/int32 (any strides), ids in [0, V) (-1 or any invalid id is rejected).
        uniforms: [B, g+1] float32/float64 in [0, 1): coins for drafts 0..g-1, then the
            final draw. Makes the result bit-identical across backends.
        seed: int (rows keyed by batch index) or int64/int32 [B] (one seed per request) instead
            of `uniforms`; each draw is Philox(seed, offsets[b] + i, row, purpose): draft i's
            coin at i, the final draw at num_accepted.
        offsets: [B] int64/int32, each row's draw cursor (seeded mode; default 0): the call reads
            counters offsets[b] .. offsets[b] + g. In a loop with one seed, advance it by g + 1
            after every call (the loop-safe rule of reference/rng.py; advancing by the accepted
            count + 1 happens to be safe for this op, not for `block_verify` or the tree ops).
        num_draft_tokens: [B] int64/int32 in [0, g]: ragged rows (row b uses drafts < n_b and
            its bonus comes from target_probs[b, n_b]).
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64.
    """
    op = "rejection_sample"
    _check_sampling(op, target_probs, "target_probs", draft_probs, "draft_probs", draft_tokens, num_draft_tokens,
                    uniforms, seed, offsets)
    seed_int, seeds = check.split_seed(seed)
    return _rejection_sample_op(target_probs, draft_probs, draft_tokens, uniforms, seed_int, seeds, offsets,
                                num_draft_tokens, resolve(op, backend, draft_tokens.device, sizes=_chain_sizes(target_probs)))


@custom_op("specdec::rejection_sample_logits", mutates_args=())
def _rejection_sample_logits_op(target_logits: Tensor, draft_logits: Tensor, draft_tokens: Tensor, temperature: float,
                                temperatures: Optional[Tensor], uniforms: Optional[Tensor], seed: Optional[int],
                                seeds: Optional[Tensor], offsets: Optional[Tensor], num_draft_tokens: Optional[Tensor],
                                backend: str) -> tuple[Tensor, Tensor]:
    return implementation("rejection_sample_logits", backend)(
        target_logits, draft_logits, draft_tokens, temperature=temperature if temperatures is None else temperatures,
        uniforms=uniforms, seed=seed if seeds is None else seeds, offsets=offsets, num_draft_tokens=num_draft_tokens)


@_rejection_sample_logits_op.register_fake
def _(target_logits, draft_logits, draft_tokens, temperature, temperatures, uniforms, seed, seeds, offsets,
      num_draft_tokens, backend):
    return _chain_fake(draft_tokens)


def rejection_sample_logits(target_logits: Tensor, draft_logits: Tensor, draft_tokens: Tensor, *,
                            temperature: float | Tensor = 1.0, uniforms: Tensor | None = None,
                            seed: int | Tensor | None = None, offsets: Tensor | None = None,
                            num_draft_tokens: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """`rejection_sample` on logits: p = softmax(target_logits / T), q = softmax(draft_logits / T).

    The GPU backends never write the softmax to memory. The drafts must have been sampled
    from exactly this q (same temperature); apply top-k/top-p yourself and call
    `rejection_sample` with probabilities when you need them.

    Args:
        target_logits: [B, g+1, V] float32/float16/bfloat16.
        draft_logits: [B, g, V], same dtype.
        draft_tokens: [B, g] int64/int32.
        temperature: float > 0, or float32 [B] per-row temperatures (> 0).
        uniforms, seed, offsets, num_draft_tokens, backend: as in `rejection_sample`.

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64.
    """
    op = "rejection_sample_logits"
    batch, _, _ = _check_sampling(op, target_logits, "target_logits", draft_logits, "draft_logits", draft_tokens,
                                  num_draft_tokens, uniforms, seed, offsets)
    temperature, temperatures = check.temperature(op, temperature, batch=batch, device=draft_tokens.device)
    seed_int, seeds = check.split_seed(seed)
    return _rejection_sample_logits_op(target_logits, draft_logits, draft_tokens, temperature, temperatures,
                                       uniforms, seed_int, seeds, offsets, num_draft_tokens,
                                       resolve(op, backend, draft_tokens.device, sizes=_chain_sizes(target_logits)))


# ---------------------------------------------------------------- greedy_verify

@custom_op("specdec::greedy_verify", mutates_args=())
def _greedy_verify_op(target_logits: Tensor, draft_tokens: Tensor, num_draft_tokens: Optional[Tensor],
                      backend: str) -> tuple[Tensor, Tensor]:
    return implementation("greedy_verify", backend)(target_logits, draft_tokens, num_draft_tokens=num_draft_tokens)


@_greedy_verify_op.register_fake
def _(target_logits, draft_tokens, num_draft_tokens, backend):
    return _chain_fake(draft_tokens)


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
    _check_chain("greedy_verify", target_logits, "target_logits", draft_tokens, num_draft_tokens)
    return _greedy_verify_op(target_logits, draft_tokens, num_draft_tokens,
                             resolve("greedy_verify", backend, draft_tokens.device, sizes=_chain_sizes(target_logits)))


# ---------------------------------------------------------------- relaxed_verify (SpecDec)

@custom_op("specdec::relaxed_verify", mutates_args=())
def _relaxed_verify_op(target_logits: Tensor, draft_tokens: Tensor, top_beta: int, tau: float,
                       num_draft_tokens: Optional[Tensor], backend: str) -> tuple[Tensor, Tensor]:
    return implementation("relaxed_verify", backend)(target_logits, draft_tokens, top_beta=top_beta, tau=tau,
                                                     num_draft_tokens=num_draft_tokens)


@_relaxed_verify_op.register_fake
def _(target_logits, draft_tokens, top_beta, tau, num_draft_tokens, backend):
    return _chain_fake(draft_tokens)


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
    _check_chain(op, target_logits, "target_logits", draft_tokens, num_draft_tokens)
    top_beta = check.positive_int(op, "top_beta", top_beta)
    tau = check.real_number(op, "tau", tau, minimum=0.0)
    return _relaxed_verify_op(target_logits, draft_tokens, top_beta, tau, num_draft_tokens,
                              resolve(op, backend, draft_tokens.device, sizes=_chain_sizes(target_logits)))


# ---------------------------------------------------------------- bild_verify, fallback_check, max_prob (BiLD)

@custom_op("specdec::bild_verify", mutates_args=())
def _bild_verify_op(target_logits: Tensor, draft_tokens: Tensor, rollback_threshold: float,
                    num_draft_tokens: Optional[Tensor], backend: str) -> tuple[Tensor, Tensor]:
    return implementation("bild_verify", backend)(target_logits, draft_tokens, rollback_threshold=rollback_threshold,
                                                  num_draft_tokens=num_draft_tokens)


@_bild_verify_op.register_fake
def _(target_logits, draft_tokens, rollback_threshold, num_draft_tokens, backend):
    return _chain_fake(draft_tokens)


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
    _check_chain(op, target_logits, "target_logits", draft_tokens, num_draft_tokens)
    rollback_threshold = check.real_number(op, "rollback_threshold", rollback_threshold, minimum=0.0)
    return _bild_verify_op(target_logits, draft_tokens, rollback_threshold, num_draft_tokens,
                           resolve(op, backend, draft_tokens.device, sizes=_chain_sizes(target_logits)))


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


for _name in ("rejection_sample", "rejection_sample_logits", "greedy_verify", "relaxed_verify", "bild_verify", "max_prob"):
    register(_name, "torch", getattr(reference, _name))
