"""The softmax-statistics launch of the logits sampling ops (`rejection_sample_logits`,
`block_verify_logits`): the first of their two launches.

`_softmax_stats_kernel`, grid (B * (g + 1) + B * g, num_splits): program (row, split) reduces
one chunk of one logits row to (max m, sum exp(x / T - m)) (`chunk_softmax_stats`: IEEE x / T,
online rescaling, a NaN poisons the chunk). The target rows come first, b * (g + 1) + i, then
the draft rows, B * (g + 1) + b * g + i. Rows a ragged row never uses (target positions > n_b,
draft positions >= n_b) are not read; the second launch never merges them. The chunks follow
V only (`stats_plan`), so a row's merge reads the same partials whatever the batch.
"""

import torch
import triton
import triton.language as tl

from ._launch import device_scope, temperature_args
from ._split_plans import BLOCK_V, STATS_MAX_SPLITS, STATS_TILES, stats_plan
from ._split_v_sampling import chunk_softmax_stats, drafts_in_row, row_temperature


@triton.jit
def _stats_row(row, target_rows, g, target_ptr, draft_ptr, stride_tb, stride_tp, stride_qb, stride_qp):
    """(b, row pointer, last_needed) of statistics row `row`: target rows b * (g + 1) + i first,
    then draft rows b * g + i. The row is read only when last_needed <= n_b."""
    if row < target_rows:
        b = row // (g + 1)
        pos = row % (g + 1)
        base = target_ptr + b * stride_tb + pos * stride_tp
        last_needed = pos  # target position pos is read when pos <= n_b
    else:
        r = row - target_rows
        gd = tl.maximum(g, 1)  # only reached when g >= 1
        b = r // gd
        pos = r % gd
        base = draft_ptr + b * stride_qb + pos * stride_qp
        last_needed = pos + 1  # draft position pos is read when pos < n_b
    return b, base, last_needed


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
    n = drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS)
    if last_needed <= n:  # rows the batch row never uses are not read (the second launch masks them)
        temp = row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP)
        best, total = chunk_softmax_stats(base, split * (BLOCK_V * TILES), vocab, temp, BLOCK_V, TILES)
        tl.store(part_max_ptr + row * num_splits + split, best)
        tl.store(part_sum_ptr + row * num_splits + split, total)


def launch_softmax_stats(target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature, *,
                         block_v: int = BLOCK_V, tiles_per_program: int = STATS_TILES,
                         max_splits: int = STATS_MAX_SPLITS) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the statistics kernel (B >= 1) and return its float32 partials (part_max, part_sum),
    [B * (2g + 1), num_splits] each: what the second launch's `position_stats` merges."""
    batch, g = draft_tokens.shape
    vocab = target_logits.shape[-1]
    device = draft_tokens.device
    draft = target_logits if g == 0 else draft_logits  # [B, 0, V] has nothing to read; keep a valid pointer
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    per_row_temp, temps_t, temp_value, stride_temp = temperature_args(temperature, placeholder)
    counts_t = placeholder if num_draft_tokens is None else num_draft_tokens
    block_v, tiles, num_splits = stats_plan(vocab, block_v, tiles_per_program, max_splits)
    target_rows = batch * (g + 1)
    rows = target_rows + batch * g
    part_max = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
    part_sum = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
    with device_scope(device):
        _softmax_stats_kernel[(rows, num_splits)](
            target_logits, draft, counts_t, temps_t, part_max, part_sum,
            temp_value, g, vocab, num_splits, target_rows,
            target_logits.stride(0), target_logits.stride(1), draft.stride(0), draft.stride(1),
            counts_t.stride(0) if num_draft_tokens is not None else 0, stride_temp,
            HAS_COUNTS=num_draft_tokens is not None, PER_ROW_TEMP=per_row_temp, BLOCK_V=block_v, TILES=tiles)
    return part_max, part_sum
