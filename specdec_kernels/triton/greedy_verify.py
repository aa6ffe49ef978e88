"""Triton backend of `greedy_verify` (chain drafts, greedy acceptance).

Two launches, no host sync and no data-dependent allocation:

1. `_row_argmax_kernel`, grid (B * (g+1), num_splits): each program streams one chunk of
   one logits row in BLOCK_V tiles (fp32 compare, NaN -> -inf, lowest index on ties) and
   writes a partial (max value, lowest index) pair. Splitting V across programs keeps the
   GPU busy when B * (g+1) is small, which is the usual case for speculative decoding.
2. `_greedy_accept_kernel`, grid (B,): merges each position's partials into the argmax
   (lowest index on ties, so an all -inf/NaN row gives 0), then walks positions 0..g
   accepting drafts while they equal the argmax, and writes output_tokens/num_accepted.

Two launches because the accept walk needs every position's finished argmax, and a
single launch would need a cross-program handshake (a later issue fuses them). The
result matches `specdec_kernels.reference.greedy_verify` bit for bit.
"""

import contextlib

import torch
import triton
import triton.language as tl

from ..ops._backend import register

BLOCK_V = 1024  # elements per tile (power of two)
TILES_PER_PROGRAM = 4  # tiles one program streams before the V dimension is split further
MAX_SPLITS = 64  # cap on programs per row; larger V gives each program more tiles


@triton.jit
def _row_argmax_kernel(logits_ptr, part_val_ptr, part_idx_ptr, vocab, num_pos, num_splits,
                       stride_b, stride_p, BLOCK_V: tl.constexpr, TILES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row = b * (g+1) + position
    split = tl.program_id(1).to(tl.int64)
    b = row // num_pos
    p = row % num_pos
    base = logits_ptr + b * stride_b + p * stride_p
    start = split * (BLOCK_V * TILES)
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    big = vocab  # larger than any valid index
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int64) + big
    for t in range(TILES):
        offs = start + t * BLOCK_V + lanes
        mask = offs < vocab
        x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("-inf"), x)
        tile_max = tl.max(x, axis=0)
        tile_idx = tl.min(tl.where(mask & (x == tile_max), offs, big), axis=0)
        take = (tile_max > best_val) | ((tile_max == best_val) & (tile_idx < best_idx))
        best_val = tl.where(take, tile_max, best_val)
        best_idx = tl.where(take, tile_idx, best_idx)
    out = row * num_splits + split
    tl.store(part_val_ptr + out, best_val)
    tl.store(part_idx_ptr + out, best_idx)


@triton.jit
def _merge_partials(part_val_ptr, part_idx_ptr, row, num_splits, vocab, BLOCK_S: tl.constexpr):
    """argmax of one row from its num_splits partials (lowest index among equal maxima)."""
    s = tl.arange(0, BLOCK_S)
    mask = s < num_splits
    vals = tl.load(part_val_ptr + row * num_splits + s, mask=mask, other=float("-inf"))
    idxs = tl.load(part_idx_ptr + row * num_splits + s, mask=mask, other=0)
    top = tl.max(vals, axis=0)
    idx = tl.min(tl.where(mask & (vals == top), idxs, vocab), axis=0)
    return tl.where(idx < vocab, idx, 0)  # unreachable guard: a chunk always holds a valid index


@triton.jit
def _greedy_accept_kernel(part_val_ptr, part_idx_ptr, draft_ptr, counts_ptr, out_ptr, num_acc_ptr,
                          g, vocab, num_splits, stride_db, stride_dg, stride_c, stride_ob,
                          HAS_COUNTS: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    num_pos = g + 1
    if HAS_COUNTS:
        n = tl.load(counts_ptr + b * stride_c)
        n = tl.minimum(tl.maximum(n, 0), g)
    else:
        n = tl.full((), 0, tl.int64) + g
    accepted = tl.full((), 0, tl.int64)
    active = accepted == 0  # still accepting
    for p in range(0, g):
        top = _merge_partials(part_val_ptr, part_idx_ptr, b * num_pos + p, num_splits, vocab, BLOCK_S)
        d = tl.load(draft_ptr + b * stride_db + p * stride_dg)
        ok = active & (p < n) & (d == top)
        # accepted: the draft; first rejection: the target's argmax; afterwards: padding
        tok = tl.where(ok, d, tl.where(active, top, -1))
        tl.store(out_ptr + b * stride_ob + p, tok)
        accepted += ok.to(tl.int64)
        active = ok
    top = _merge_partials(part_val_ptr, part_idx_ptr, b * num_pos + g, num_splits, vocab, BLOCK_S)
    tl.store(out_ptr + b * stride_ob + g, tl.where(active, top, -1))  # bonus token
    tl.store(num_acc_ptr + b, accepted)


def _launch(target_logits, draft_tokens, num_draft_tokens, *, block_v: int, tiles_per_program: int,
            max_splits: int):
    batch, g = draft_tokens.shape
    vocab = target_logits.shape[-1]
    device = draft_tokens.device
    out_tokens = torch.empty(batch, g + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return out_tokens, num_accepted
    block_v = min(block_v, max(16, triton.next_power_of_2(vocab)))
    num_tiles = triton.cdiv(vocab, block_v)
    tiles = max(tiles_per_program, triton.cdiv(num_tiles, max_splits))
    tiles = min(triton.next_power_of_2(tiles), num_tiles)  # few distinct constexpr values
    num_splits = triton.cdiv(num_tiles, tiles)
    rows = batch * (g + 1)
    part_val = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
    part_idx = torch.empty(rows, num_splits, dtype=torch.int64, device=device)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _row_argmax_kernel[(rows, num_splits)](
            target_logits, part_val, part_idx, vocab, g + 1, num_splits,
            target_logits.stride(0), target_logits.stride(1), BLOCK_V=block_v, TILES=tiles)
        counts = draft_tokens if num_draft_tokens is None else num_draft_tokens  # placeholder when absent
        _greedy_accept_kernel[(batch,)](
            part_val, part_idx, draft_tokens, counts, out_tokens, num_accepted,
            g, vocab, num_splits, draft_tokens.stride(0), draft_tokens.stride(1),
            0 if num_draft_tokens is None else num_draft_tokens.stride(0), out_tokens.stride(0),
            HAS_COUNTS=num_draft_tokens is not None, BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    return out_tokens, num_accepted


def greedy_verify(target_logits, draft_tokens, *, num_draft_tokens=None):
    """Triton `greedy_verify` on validated inputs (see specdec_kernels.ops.greedy_verify)."""
    return _launch(target_logits, draft_tokens, num_draft_tokens, block_v=BLOCK_V,
                   tiles_per_program=TILES_PER_PROGRAM, max_splits=MAX_SPLITS)


register("greedy_verify", "triton", greedy_verify)
