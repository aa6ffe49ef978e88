"""Triton backend of `rejection_sample_logits`: speculative sampling on logits and a
temperature, p = softmax(target_logits / T), q = softmax(draft_logits / T) in float32,
without ever writing a softmax to memory.

Two launches, no host sync, no data-dependent allocation:
1. `_softmax_stats`, grid (B * (g + 1) + B * g, stats splits): the per-chunk softmax
   statistics (max m, sum exp(x / T - m)) of every row a batch row uses (target positions
   <= n_b, draft positions < n_b), as `block_verify_logits` computes them.
2. the chain kernel of `rejection_sample.py` with LOGITS, grid (B, splits): every program
   merges its row's statistics (M = max, S = sum S_s exp(m_s - M); p(v) = exp(z_v - M) / S),
   gathers p(x_i) and q(x_i), draws the coins exactly as `rejection_sample` (caller uniforms,
   or Philox(seed, offsets[b] + i, row key, SALT_ACCEPT)) and accepts while u * q < p in
   float64; then it sums the fixed-point weights of its chunk of the one row pair the final
   token comes from (the residual max(0, p - q) at the first rejection, the bonus row p
   otherwise), computing p and q from the logits on the fly. The row's last program (ticket)
   draws floor(u * total) (u = Philox(seed, offsets[b] + num_accepted, row key, SALT_FINAL)
   in seeded mode) and rescans the one chunk that holds it. An empty residual (p == q, or a
   NaN q row) draws from p; a row without mass (a NaN p row) gives 0. A row torch.softmax makes
   all NaN (a NaN, a +inf, or no finite value) is NaN here too. Ids are always in [0, V) and
   no load leaves its row.
Each logits row is read once for its statistics and the final row pair once more (plus one
chunk): the final draw is split over V like the statistics, never one program's pass over V.

Exactness contract: z = x / T is bit-identical to the reference and so are the row maxima,
but exp and the summation order differ from torch's in the last ulps, so p and q carry a
relative error of a few float32 ulps (up to ~1e-6 with a GPU's approximate exp for
exponents near -100). With supplied uniforms the output equals
`reference.rejection_sample_logits` except where a decision lies within a relative margin
of about 1e-5 of its boundary: a coin with |u q - p| < 1e-5 max(p, q), or a final draw
whose threshold u * total is within 1e-5 (in probability units) of a cdf boundary, or
whose residual mass is below ~1e-5 (empty vs not). Identical target and draft rows give
identical p and q here too, so their residual is exactly empty, as in the reference.
"""

from ..common.registry import register
from ._launch import chain_launch, grid_x_refusal
from ._softmax_stats import launch_softmax_stats
from ._split_plans import BLOCK_V, STATS_MAX_SPLITS, STATS_TILES
from .rejection_sample import launch_chain


def _launch(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, block_v: int = BLOCK_V, tiles_per_program: int = STATS_TILES,
            max_splits: int = STATS_MAX_SPLITS, **plan):
    """Both launches; block_v is both launches' tile, tiles_per_program and max_splits the statistics
    plan's, `plan` the chain kernel's (min_tiles, max_tiles, target_programs)."""
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    stats = launch_softmax_stats(target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature,
                                 block_v=block_v, tiles_per_program=tiles_per_program, max_splits=max_splits)
    launch_chain(target_logits, draft_logits, draft_tokens, out_tokens, num_accepted, uniforms=uniforms, seed=seed,
                 offsets=offsets, num_draft_tokens=num_draft_tokens, temperature=temperature, stats=stats,
                 block_v=block_v, **plan)
    return out_tokens, num_accepted


def rejection_sample_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                            offsets=None, num_draft_tokens=None):
    """Triton `rejection_sample_logits` on validated inputs (see specdec_kernels.ops.rejection_sample_logits)."""
    return _launch(target_logits, draft_logits, draft_tokens, temperature=temperature, uniforms=uniforms, seed=seed,
                   offsets=offsets, num_draft_tokens=num_draft_tokens)


def launch_limits(sizes: dict) -> str | None:
    """The registry's `limits`: the statistics launch has a program per target and draft row, B * (2g + 1)."""
    return grid_x_refusal(sizes["B"] * (2 * sizes["G"] + 1), "B * (2g + 1)")


register("rejection_sample_logits", "triton", rejection_sample_logits, limits=launch_limits)
