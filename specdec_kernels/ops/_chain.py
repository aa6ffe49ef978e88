"""What the chain-draft ops share (rejection_sampling, logit_verify, block_verification): the sizes the
backends' launch limits read, the fake of their outputs, the argument checks, and the custom ops of the
speculative-sampling ops (on probabilities or logits), which differ only in name; rejection_sample defines
its own, probs_sampling_op's schema plus its optional per-draft output. Each op module still resolves its
own backend (tests watch `resolve` there).

Shapes: B rows, g drafts per row, vocabulary V. Outputs of every chain verify op: `output_tokens [B, g+1]`
int64 (the accepted drafts, then one correction or bonus token, then -1 padding) and `num_accepted [B]`
int64; a row emits num_accepted + 1 tokens.
"""

from typing import Callable, Optional

from torch import Tensor

from ..common import validate as check
from ..common.registry import custom_op, implementation


def chain_sizes(scores: Tensor) -> dict:
    """The sizes the backends' launch limits are checked against: scores are [B, g+1, V]."""
    batch, g1, vocab = scores.shape
    return dict(B=batch, G=g1 - 1, V=vocab, dtype=scores.dtype)


def chain_fake(draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    batch, g = draft_tokens.shape
    return draft_tokens.new_empty(batch, g + 1), draft_tokens.new_empty(batch)


def check_chain(op: str, scores: Tensor, name: str, draft_tokens: Tensor, num_draft_tokens) -> tuple[int, int, int]:
    check.tensor(op, "draft_tokens", draft_tokens, shape=("B", "g"), dtypes=check.OP_INDEX_DTYPES, last_dim_contiguous=False)
    batch, g = draft_tokens.shape
    check.tensor(op, name, scores, shape=(batch, g + 1, "V"), dtypes=check.FLOAT_DTYPES, device=draft_tokens.device)
    vocab = scores.shape[-1]
    if vocab == 0:
        check.fail(op, f"`{name}` has an empty vocabulary dimension")
    check.token_range(op, "draft_tokens", draft_tokens, vocab, allow_padding=True)
    check.num_draft_tokens(op, num_draft_tokens, batch=batch, g=g, device=draft_tokens.device)
    return batch, g, vocab


def check_sampling(op: str, target: Tensor, target_name: str, draft: Tensor, draft_name: str, draft_tokens: Tensor,
                    num_draft_tokens, uniforms, seed, offsets) -> tuple[int, int, int]:
    """The checks shared by the two speculative-sampling ops (probs or logits in)."""
    batch, g, vocab = check_chain(op, target, target_name, draft_tokens, num_draft_tokens)
    check.tensor(op, draft_name, draft, shape=(batch, g, vocab), dtypes=check.FLOAT_DTYPES, device=draft_tokens.device)
    check.same_dtype(op, (target_name, draft_name), target, draft)
    check.randomness(op, uniforms, seed, offsets, shape=(batch, g + 1), batch=batch, device=draft_tokens.device)
    return batch, g, vocab


def _sampling_fake(target: Tensor, draft: Tensor, draft_tokens: Tensor, *settings) -> tuple[Tensor, Tensor]:
    """The fake of every speculative-sampling op: its outputs' shapes follow draft_tokens alone."""
    return chain_fake(draft_tokens)


# The op schemas cannot hold an int-or-tensor argument: a tensor seed travels as `seeds` (and a
# per-row temperature as `temperatures`), the scalar slot then unused.

def probs_sampling_op(op: str) -> Callable:
    """Defines and returns the custom op `specdec::<op>` of a sampling op on probabilities (with its fake);
    its arguments: probs_op_args(...), then the backend."""
    @custom_op(f"specdec::{op}", mutates_args=())
    def dispatch(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, uniforms: Optional[Tensor],
                 seed: Optional[int], seeds: Optional[Tensor], offsets: Optional[Tensor],
                 num_draft_tokens: Optional[Tensor], backend: str) -> tuple[Tensor, Tensor]:
        return implementation(op, backend)(
            target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed if seeds is None else seeds,
            offsets=offsets, num_draft_tokens=num_draft_tokens)

    dispatch.register_fake(_sampling_fake)
    return dispatch


def logits_sampling_op(op: str) -> Callable:
    """Defines and returns the custom op `specdec::<op>` of a sampling op on logits (with its fake); its
    arguments: logits_op_args(...), then the backend."""
    @custom_op(f"specdec::{op}", mutates_args=())
    def dispatch(target_logits: Tensor, draft_logits: Tensor, draft_tokens: Tensor, temperature: float,
                 temperatures: Optional[Tensor], uniforms: Optional[Tensor], seed: Optional[int],
                 seeds: Optional[Tensor], offsets: Optional[Tensor], num_draft_tokens: Optional[Tensor],
                 backend: str) -> tuple[Tensor, Tensor]:
        return implementation(op, backend)(
            target_logits, draft_logits, draft_tokens, temperature=temperature if temperatures is None else temperatures,
            uniforms=uniforms, seed=seed if seeds is None else seeds, offsets=offsets, num_draft_tokens=num_draft_tokens)

    dispatch.register_fake(_sampling_fake)
    return dispatch


def probs_op_args(op: str, target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, uniforms, seed, offsets,
                  num_draft_tokens) -> tuple:
    """The checked arguments of a probs_sampling_op custom op, but for the backend."""
    check_sampling(op, target_probs, "target_probs", draft_probs, "draft_probs", draft_tokens, num_draft_tokens,
                   uniforms, seed, offsets)
    seed_int, seeds = check.split_seed(seed)
    return target_probs, draft_probs, draft_tokens, uniforms, seed_int, seeds, offsets, num_draft_tokens


def logits_op_args(op: str, target_logits: Tensor, draft_logits: Tensor, draft_tokens: Tensor, temperature, uniforms,
                   seed, offsets, num_draft_tokens) -> tuple:
    """The checked arguments of a logits_sampling_op custom op, but for the backend."""
    batch, _, _ = check_sampling(op, target_logits, "target_logits", draft_logits, "draft_logits", draft_tokens,
                                 num_draft_tokens, uniforms, seed, offsets)
    temperature, temperatures = check.temperature(op, temperature, batch=batch, device=draft_tokens.device)
    seed_int, seeds = check.split_seed(seed)
    return (target_logits, draft_logits, draft_tokens, temperature, temperatures, uniforms, seed_int, seeds, offsets,
            num_draft_tokens)
