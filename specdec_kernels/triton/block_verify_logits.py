"""Triton backend of `block_verify_logits`: block verification on p = softmax(target_logits / T),
q = softmax(draft_logits / T) in float32, without writing a softmax to memory.

Two launches, no host sync, no data-dependent allocation:
1. `_softmax_stats`, grid (B * (g + 1) + B * g, num_stat_splits): per chunk of every row
   a ragged row uses (target positions <= n_b, draft positions < n_b), the chunk max and
   sum exp(x / T - max), exactly as `rejection_sample_logits` computes them.
2. the block kernel of `block_verify.py` with LOGITS: every program merges the statistics of
   its row's positions (M = max, S = sum S_s exp(m_s - M)), gathers p(X_i) = exp(z - M) / S
   and q(X_i), and streams its chunk of position pos computing p and q from the logits on
   the fly; the rest is the probs kernel's (prefix ratios, int64 residual totals, tickets,
   tau, a one-chunk rescan for the final token).
Block verification needs the residual masses sum_x max(p_j p(x) - q(x), 0), which need the
normalised rows, so a second launch after the softmax statistics is the price of not reading
each row in one program (one launch would leave B = 1 with a single program streaming
n_b + 1 row pairs). Each logit row is read twice in all (statistics, residual), plus one chunk.

Exactness contract (`rejection_sample_logits`'s): z = x / T and the row maxima are
bit-identical to the reference, but exp and the summation order differ from torch's in the
last ulps, so p and q carry a relative error of a few float32 ulps. With supplied uniforms the
output equals `reference.block_verify_logits` except where a decision lies within a relative
margin of about 1e-5 of its boundary: a prefix ratio p_i (through its min(1, .)) or a
threshold h_i within 1e-5 of its coin, a residual weight whose sign flips (|p_j p - q| within
1e-5 max(p_j p, q)), or a final draw whose threshold falls within 1e-5 of a cdf boundary.
Identical target and draft rows give identical p and q here too, so their residual is exactly
empty, as in the reference; rows torch.softmax makes all NaN (a NaN, a +inf, no finite
logit) are NaN here too.
"""

from ..common.registry import register
from ._launch import chain_launch, grid_x_refusal
from ._softmax_stats import launch_softmax_stats
from ._split_plans import BLOCK_V, STATS_MAX_SPLITS, STATS_TILES
from .block_verify import launch_block


def _launch(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, stats_block_v: int = BLOCK_V, tiles_per_program: int = STATS_TILES,
            max_splits: int = STATS_MAX_SPLITS, **plan):
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    stats = launch_softmax_stats(target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature,
                                 block_v=stats_block_v, tiles_per_program=tiles_per_program, max_splits=max_splits)
    launch_block(target_logits, draft_logits, draft_tokens, out_tokens, num_accepted, uniforms=uniforms, seed=seed,
                 offsets=offsets, num_draft_tokens=num_draft_tokens, temperature=temperature, stats=stats, **plan)
    return out_tokens, num_accepted


def block_verify_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                        offsets=None, num_draft_tokens=None):
    """Triton `block_verify_logits` on validated inputs (see specdec_kernels.ops.block_verify_logits)."""
    return _launch(target_logits, draft_logits, draft_tokens, temperature=temperature, uniforms=uniforms, seed=seed,
                   offsets=offsets, num_draft_tokens=num_draft_tokens)


def launch_limits(sizes: dict) -> str | None:
    """The registry's `limits`: the statistics launch has a program per target and draft row, B * (2g + 1)."""
    return grid_x_refusal(sizes["B"] * (2 * sizes["G"] + 1), "B * (2g + 1)")


register("block_verify_logits", "triton", block_verify_logits, limits=launch_limits)
