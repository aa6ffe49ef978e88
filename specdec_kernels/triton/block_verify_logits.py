"""Triton backend of `block_verify_logits`: block verification on p = softmax(target_logits / T),
q = softmax(draft_logits / T) in float32, without writing a softmax to memory.

Two launches, no host sync, no data-dependent allocation:
1. `_softmax_stats_kernel`, grid (B * (g + 1) + B * g, num_stat_splits): per chunk of every row
   a ragged row uses (target positions <= n_b, draft positions < n_b), the chunk max and
   sum exp(x / T - max), exactly as `rejection_sample_logits` computes them
   (`_chunk_softmax_stats`: IEEE x / T, online rescaling, NaN chunks poisoned).
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

import triton
import triton.language as tl

from ..common.registry import register
from ._launch import chain_launch, device_scope, grid_x_refusal, temperature_args
from .block_verify import launch_block
from .logit_verify import _split_plan
from .rejection_sample_logits import (_chunk_softmax_stats, _drafts_in_row, _row_temperature, _stats_buffers,
                                      _stats_row)

STATS_BLOCK_V = 1024  # vocabulary elements per tile of the statistics launch
TILES_PER_PROGRAM = 4  # tiles one statistics program streams before V is split further
MAX_SPLITS = 64  # cap on statistics programs per row (the block kernel merges them per position)


# Not specialised (tests/test_triton_recompiles.py): g and the target row count B * (g + 1),
# which decide each program's row; the split plan is V's alone.
@triton.jit(do_not_specialize=["g", "target_rows"])
def _softmax_stats_kernel(target_ptr, draft_ptr, counts_ptr, temps_ptr, part_max_ptr, part_sum_ptr,
                          temperature, g, vocab, num_splits, target_rows,
                          stride_tb, stride_tp, stride_qb, stride_qp, stride_c, stride_temp,
                          HAS_COUNTS: tl.constexpr, PER_ROW_TEMP: tl.constexpr, BLOCK_V: tl.constexpr,
                          TILES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # target rows b * (g + 1) + i first, then draft rows b * g + i
    split = tl.program_id(1).to(tl.int64)
    b, base, last_needed = _stats_row(row, target_rows, g, target_ptr, draft_ptr, stride_tb, stride_tp, stride_qb,
                                      stride_qp)
    n = _drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS)
    if last_needed <= n:  # rows the batch row never uses are not read (the block kernel masks them)
        temp = _row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP)
        best, total = _chunk_softmax_stats(base, split * (BLOCK_V * TILES), vocab, temp, BLOCK_V, TILES)
        tl.store(part_max_ptr + row * num_splits + split, best)
        tl.store(part_sum_ptr + row * num_splits + split, total)


def _launch(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, stats_block_v: int = STATS_BLOCK_V, tiles_per_program: int = TILES_PER_PROGRAM,
            max_splits: int = MAX_SPLITS, **plan):
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    draft = target_logits if g == 0 else draft_logits  # [B, 0, V] has nothing to read; keep a valid pointer
    per_row_temp, temps_t, temp_value, stride_temp = temperature_args(temperature, placeholder)
    counts_t = placeholder if num_draft_tokens is None else num_draft_tokens
    block_v, tiles, num_splits = _split_plan(vocab, stats_block_v, tiles_per_program, max_splits)
    target_rows, rows, part_max, part_sum = _stats_buffers(batch, g, num_splits, device)
    with device_scope(device):
        _softmax_stats_kernel[(rows, num_splits)](
            target_logits, draft, counts_t, temps_t, part_max, part_sum,
            temp_value, g, vocab, num_splits, target_rows,
            target_logits.stride(0), target_logits.stride(1), draft.stride(0), draft.stride(1),
            counts_t.stride(0) if num_draft_tokens is not None else 0, stride_temp,
            HAS_COUNTS=num_draft_tokens is not None, PER_ROW_TEMP=per_row_temp, BLOCK_V=block_v, TILES=tiles)
    launch_block(target_logits, draft_logits, draft_tokens, out_tokens, num_accepted, uniforms=uniforms, seed=seed,
                 offsets=offsets, num_draft_tokens=num_draft_tokens, temperature=temperature,
                 stats=(part_max, part_sum), **plan)
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
