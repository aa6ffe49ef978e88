"""Block verification of chain drafts (Sun et al., ICLR 2025, Algorithm 2).

The same drafts and the same target law as `rejection_sample`, and at least as many
accepted drafts in expectation: a draft that fails its own test can still be kept when a
later draft's block test passes. Shapes, outputs and randomness are `rejection_sample`'s.
"""

from torch import Tensor

from .. import reference
from ..common.registry import register, resolve
from ._chain import chain_sizes, logits_op_args, logits_sampling_op, probs_op_args, probs_sampling_op


_block_verify_op = probs_sampling_op("block_verify")
_block_verify_logits_op = logits_sampling_op("block_verify_logits")


def block_verify(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
                 uniforms: Tensor | None = None, seed: int | Tensor | None = None, offsets: Tensor | None = None,
                 num_draft_tokens: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Block verification: lossless, and accepts at least as much as `rejection_sample`.

    With p_0 = 1 and p_i = min(1, p_{i-1} p(X_i) / q(X_i)), the residual mass after the
    i-token prefix Z(i) = sum_x max(p_i p(x | X^i) - q(x | X^i), 0) and the thresholds
    h_i = Z(i) / (Z(i) + 1 - p_i) (i < g), h_g = p_g, the row keeps the longest prefix
    X_1..X_tau whose coin passes (eta_tau < h_tau; a later pass rescues an earlier failure)
    and then emits Y ~ norm(max(p_tau p(. | X^tau) - q(. | X^tau), 0)), or the bonus
    Y ~ p(. | X^g) when tau = g. With one-hot drafts (q(X_i) = 1) Z(i) = p_i (1 - p(X_{i+1})).
    An empty residual falls back to p, a row with no mass to its lowest index: ids are
    always in [0, V). The exact arithmetic (float64 prefix ratios stored as float32, 2^-40
    fixed-point residual weights summed exactly) is in `reference/block_verification.py`.

    Args:
        target_probs: [B, g+1, V] float32/float16/bfloat16, the target's distributions at
            the g draft positions and the bonus position (after the sampling filters).
        draft_probs: [B, g, V], same dtype: the distributions the drafts were sampled from
            (one-hot rows for deterministic drafts).
        draft_tokens: [B, g] int64/int32 (any strides), ids in [0, V) (-1 padding is never kept).
        uniforms: [B, g+1] float32/float64 in [0, 1): eta_1..eta_g in columns 0..g-1, the
            final draw in column g (whatever the row's num_draft_tokens). Bit-identical
            results across backends.
        seed: int (rows keyed by batch index) or int64/int32 [B] (one seed per request)
            instead of `uniforms`: the counters of `rejection_sample` (eta_i at
            offsets[b] + i - 1, the final draw at offsets[b] + tau).
        offsets: [B] int64/int32, each row's draw cursor (seeded mode; default 0): the call reads
            every coin at offsets[b] .. offsets[b] + g - 1, not only the accepted prefix's. In a
            loop with one seed, advance it by g + 1 after every call: a cursor that moves by the
            accepted count + 1 (sequence lengths) hands the next call coins this one already
            examined, and the loop's output leaves the target's law (common/rng.py).
        num_draft_tokens: [B] int64/int32 in [0, g]: ragged rows (row b's last threshold is
            h_{n_b} = p_{n_b}, its bonus row target_probs[b, n_b]).
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64 (= tau).
    """
    op = "block_verify"
    op_args = probs_op_args(op, target_probs, draft_probs, draft_tokens, uniforms, seed, offsets, num_draft_tokens)
    return _block_verify_op(*op_args, resolve(op, backend, draft_tokens.device, sizes=chain_sizes(target_probs)))


def block_verify_logits(target_logits: Tensor, draft_logits: Tensor, draft_tokens: Tensor, *,
                        temperature: float | Tensor = 1.0, uniforms: Tensor | None = None,
                        seed: int | Tensor | None = None, offsets: Tensor | None = None,
                        num_draft_tokens: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """`block_verify` on logits: p = softmax(target_logits / T), q = softmax(draft_logits / T).

    The drafts must have been sampled from exactly this q (same temperature); apply
    top-k/top-p yourself and call `block_verify` with probabilities when you need them.

    Args:
        target_logits: [B, g+1, V] float32/float16/bfloat16.
        draft_logits: [B, g, V], same dtype.
        draft_tokens: [B, g] int64/int32.
        temperature: float > 0, or float32 [B] per-row temperatures (> 0).
        uniforms, seed, offsets, num_draft_tokens, backend: as in `block_verify`.

    Returns:
        output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64.
    """
    op = "block_verify_logits"
    op_args = logits_op_args(op, target_logits, draft_logits, draft_tokens, temperature, uniforms, seed, offsets,
                             num_draft_tokens)
    backend = resolve(op, backend, draft_tokens.device, sizes=chain_sizes(target_logits))
    return _block_verify_logits_op(*op_args, backend)


register("block_verify", "torch", reference.block_verify)
register("block_verify_logits", "torch", reference.block_verify_logits)
