"""Triton backend of `rejection_sample_logits`: speculative sampling on logits and a
temperature, p = softmax(target_logits / T), q = softmax(draft_logits / T) in float32,
without ever writing a softmax to memory.

Two launches: the per-chunk softmax statistics of every row a batch row uses, then the chain
kernel of rejection_sampling.py with LOGITS, which merges them and computes p and q on the fly; the
final draw is split over V like the statistics. z = x / T and the row maxima equal the reference's
bit for bit, exp and the summation order do not, so decisions within ~1e-5 (relative) of their
boundary may differ (docs/ops.md, "Numerics").
"""

from ..common.registry import register
from ._chain_launch import launch_on_logits, logits_launch_limits
from ._split_plans import BLOCK_V
from .rejection_sampling import launch_chain

launch_limits = logits_launch_limits


def _launch(target_logits, draft_logits, draft_tokens, *, block_v: int = BLOCK_V, **options):
    """Both launches; block_v is both launches' tile, tiles_per_program and max_splits the statistics
    plan's, the rest the chain kernel's (min_tiles, max_tiles, target_programs)."""
    return launch_on_logits(launch_chain, target_logits, draft_logits, draft_tokens, stats_block_v=block_v,
                            block_v=block_v, **options)


def rejection_sample_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                            offsets=None, num_draft_tokens=None):
    """Triton `rejection_sample_logits` on validated inputs (see specdec_kernels.ops.rejection_sample_logits)."""
    return _launch(target_logits, draft_logits, draft_tokens, temperature=temperature, uniforms=uniforms, seed=seed,
                   offsets=offsets, num_draft_tokens=num_draft_tokens)


register("rejection_sample_logits", "triton", rejection_sample_logits, limits=launch_limits)
