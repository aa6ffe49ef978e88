"""Speculative sampling of chain drafts (Leviathan et al.): `rejection_sample` on probabilities and
`rejection_sample_logits` on logits. Shapes and outputs: ops/_chain.py."""

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..common import validate as check
from ..common.registry import custom_op, implementation, register, resolve
from ._chain import chain_fake, chain_sizes, logits_op_args, logits_sampling_op, probs_op_args


# probs_sampling_op's schema plus the optional per-draft output, which the op writes in place (a mutated
# argument, not a third output: no allocation inside, so CUDA graphs capture the caller's buffer)
@custom_op("specdec::rejection_sample", mutates_args=("draft_passes",))
def _rejection_sample_op(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, uniforms: Optional[Tensor],
                         seed: Optional[int], seeds: Optional[Tensor], offsets: Optional[Tensor],
                         num_draft_tokens: Optional[Tensor], draft_passes: Optional[Tensor],
                         backend: str) -> tuple[Tensor, Tensor]:
    return implementation("rejection_sample", backend)(
        target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed if seeds is None else seeds,
        offsets=offsets, num_draft_tokens=num_draft_tokens, draft_passes=draft_passes)


@_rejection_sample_op.register_fake
def _(target_probs, draft_probs, draft_tokens, *settings):
    return chain_fake(draft_tokens)


_rejection_sample_logits_op = logits_sampling_op("rejection_sample_logits")


def _check_draft_passes(op: str, draft_passes: Tensor | None, draft_tokens: Tensor) -> None:
    """The optional output: bool [B, g] on the drafts' device, contiguous (the kernels write it row by row)."""
    batch, g = draft_tokens.shape
    check.optional_tensor(op, "draft_passes", draft_passes, shape=(batch, g), dtypes=(torch.bool,),
                          device=draft_tokens.device)
    if draft_passes is not None and not draft_passes.is_contiguous():
        check.fail(op, "`draft_passes` must be contiguous (the op writes it in place); pass a new tensor")


def rejection_sample(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
                     uniforms: Tensor | None = None, seed: int | Tensor | None = None, offsets: Tensor | None = None,
                     num_draft_tokens: Tensor | None = None, draft_passes: Tensor | None = None,
                     backend: str = "auto") -> tuple[Tensor, Tensor]:
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
            after every call (the loop-safe rule of common/rng.py; advancing by the accepted
            count + 1 happens to be safe for this op, not for `block_verify` or the tree ops).
        num_draft_tokens: [B] int64/int32 in [0, g]: ragged rows (row b uses drafts < n_b and
            its bonus comes from target_probs[b, n_b]).
        draft_passes: optional output, a contiguous bool [B, g] tensor on the inputs' device that
            the op overwrites with each draft's own test u_i * q < p on the call's own coins, also
            for the drafts after the first rejection (num_accepted is the length of its leading
            run of True); False for slots j >= num_draft_tokens[b] and for ids outside [0, V).
            For counters of draft/target agreement (FlashInfer's accepted_num). None: not written.
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64.
    """
    op = "rejection_sample"
    op_args = probs_op_args(op, target_probs, draft_probs, draft_tokens, uniforms, seed, offsets, num_draft_tokens)
    _check_draft_passes(op, draft_passes, draft_tokens)
    backend = resolve(op, backend, draft_tokens.device, sizes=chain_sizes(target_probs))
    return _rejection_sample_op(*op_args, draft_passes, backend)


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
    op_args = logits_op_args(op, target_logits, draft_logits, draft_tokens, temperature, uniforms, seed, offsets,
                             num_draft_tokens)
    backend = resolve(op, backend, draft_tokens.device, sizes=chain_sizes(target_logits))
    return _rejection_sample_logits_op(*op_args, backend)


for _name in ("rejection_sample", "rejection_sample_logits"):
    register(_name, "torch", getattr(reference, _name))
