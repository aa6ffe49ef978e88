"""Split-V statistics of logits rows (the Triton twin of csrc/chain_common.cuh's argmax pieces).

A program reduces one V-chunk of a row to partials, stores them, and the row's merging
program (`_tickets`) combines them:
- the max and its lowest index (argmax, ties -> lowest id; NaN counts as -inf);
- how many ids rank ahead of a draft d with logit l_x, #{v: l_v > l_x} + #{v < d: l_v == l_x}
  (counts add up exactly across chunks);
- sum_v exp(l_v - m), m the chunk max, with a running max rescaled per tile (online softmax),
  merged as lse = M + log(sum_s S_s * exp(m_s - M)) (lse = M when M is +-inf, like
  torch.logsumexp).
The greedy, relaxed and BiLD verify kernels and the tree-greedy split kernel use these.
"""

import triton
import triton.language as tl

from ._tickets import load_partials


@triton.jit
def chunk_stats(base, start, vocab, lx, d, BLOCK_V: tl.constexpr, TILES: tl.constexpr, ARGMAX: tl.constexpr,
                RANK: tl.constexpr, SUMEXP: tl.constexpr):
    """Statistics of the TILES tiles of one row from `start`: (max, lowest argmax id or V,
    sum exp(x - max), #ids ranking ahead of draft d with logit lx). Unused ones stay 0."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    big = vocab  # larger than any valid index
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int64) + big
    total = tl.full((), 0.0, tl.float32)  # sum exp(x - best_val) over the chunk so far
    ahead = tl.full((), 0, tl.int32)
    for t in range(TILES):
        offs = start + t * BLOCK_V + lanes
        mask = offs < vocab
        x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("-inf"), x)
        tile_max = tl.max(x, axis=0)
        new_max = tl.maximum(best_val, tile_max)
        if SUMEXP:
            # shift by the running max; an infinite max shifts by 0 (the sum is then unused
            # when it is +inf, and exactly 0 when it is -inf)
            shift = tl.where(tl.abs(new_max) < float("inf"), new_max, 0.0)
            total = total * tl.exp(best_val - shift) + tl.sum(tl.exp(x - shift), axis=0)
        if RANK:
            before = (x > lx) | ((x == lx) & (offs < d))
            ahead += tl.sum((before & mask).to(tl.int32), axis=0)
        if ARGMAX:
            tile_idx = tl.min(tl.where(mask & (x == tile_max), offs, big), axis=0)
            take = (tile_max > best_val) | ((tile_max == best_val) & (tile_idx < best_idx))
            best_idx = tl.where(take, tile_idx, best_idx)
        best_val = new_max
    return best_val, best_idx, total, ahead


@triton.jit
def merge_lse(vals, sums, mask, AXIS: tl.constexpr):
    """(max, logsumexp) from chunk maxima `vals` and their shifted sums `sums` along AXIS."""
    top = tl.max(vals, axis=AXIS)
    finite = tl.abs(top) < float("inf")
    shift = tl.where(finite, top, 0.0)
    if AXIS == 1:
        shift = shift[:, None]
    total = tl.sum(tl.where(mask, sums * tl.exp(vals - shift), 0.0), axis=AXIS)
    total = tl.where(finite, total, 1.0)  # >= 1 when the max is finite
    return top, tl.where(finite, top + tl.log(total), top)  # +-inf max: lse = max, like torch


@triton.jit
def merge_argmax(part_val_ptr, part_idx_ptr, rows, row_mask, num_splits, vocab, BLOCK_S: tl.constexpr):
    """Per row: (max, argmax with the lowest id among equal maxima, all -inf -> 0) from
    the chunk partials, plus the [rows, BLOCK_S] chunk maxima and their mask."""
    vals, mask = load_partials(part_val_ptr, rows, row_mask, num_splits, float("-inf"), BLOCK_S)
    idxs, _ = load_partials(part_idx_ptr, rows, row_mask, num_splits, vocab, BLOCK_S)
    top_val = tl.max(vals, axis=1)
    top = tl.min(tl.where(mask & (vals == top_val[:, None]), idxs, vocab), axis=1)
    return top_val, tl.where(top < vocab, top, 0), vals, mask
