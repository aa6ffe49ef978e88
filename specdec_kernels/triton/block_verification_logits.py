"""Triton backend of `block_verify_logits`: block verification on p = softmax(target_logits / T),
q = softmax(draft_logits / T) in float32, without writing a softmax to memory.

Two launches: the per-chunk softmax statistics of every row a batch row uses, then the block
kernel of block_verification.py with LOGITS, which computes p and q from the logits on the fly.
The residual masses need normalised rows, so the second launch is the price of not streaming a
row's n_b + 1 row pairs in one program; each logit row is read twice. Decisions within ~1e-5
(relative) of their boundary may differ from the reference (docs/ops.md, "Numerics").
"""

import functools

from ..common.registry import register
from ._chain_launch import launch_on_logits, logits_launch_limits
from .block_verification import launch_block

# Both launches; stats_block_v, tiles_per_program and max_splits plan the statistics, the other
# keywords (block_v, min_tiles, max_tiles, target_programs) the block kernel.
_launch = functools.partial(launch_on_logits, launch_block)
launch_limits = logits_launch_limits


def block_verify_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                        offsets=None, num_draft_tokens=None):
    """Triton `block_verify_logits` on validated inputs (see specdec_kernels.ops.block_verify_logits)."""
    return _launch(target_logits, draft_logits, draft_tokens, temperature=temperature, uniforms=uniforms, seed=seed,
                   offsets=offsets, num_draft_tokens=num_draft_tokens)


register("block_verify_logits", "triton", block_verify_logits, limits=launch_limits)
