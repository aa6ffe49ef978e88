"""Triton backend of `early_exit_topk`: final norm + LM head + top-k, never writing [B, V] logits.

The work is a skinny GEMM over the [V, H] LM-head weight, memory-bound at B <= 64: the
kernel reads the weight once for all rows.

Three launches: `_normalize_kernel` writes norm(hidden) once (as hi + lo halves of a 16-bit weight
dtype), `_split_topk_kernel` streams whole vocabulary tiles for BLOCK_B rows and keeps a running
top-k of packed int64 keys per row, `_merge_kernel` merges the splits' candidates. Sized from static
shapes only (CUDA-graph capturable); k > FUSED_MAX_K runs on the materialised torch path.
"""

import torch
import triton
import triton.language as tl

from ..common.registry import register
from ..common.limits import FUSED_MAX_K
from ..common.outputs import topk_outputs
from . import _launch
from ._launch import device_scope

BLOCK_B_MAX = 64  # rows per program: B <= 64 reads the weight once
PROGRAMS_PER_SM = 2  # splits fill about this many programs per SM
NORM_CODES = {"none": 0, "rms": 1, "layer": 2}
NONE_NORM: tl.constexpr = tl.constexpr(0)
LAYER_NORM: tl.constexpr = tl.constexpr(2)
# _dot_acc modes
DOT_SPLIT16: tl.constexpr = tl.constexpr(0)  # 16-bit weights: hi + lo halves of the hidden state
DOT_TF32X3: tl.constexpr = tl.constexpr(1)  # float32 weights on a GPU
DOT_IEEE: tl.constexpr = tl.constexpr(2)  # interpreter: everything in IEEE float32
EMPTY_KEY: tl.constexpr = tl.constexpr(-1)  # below every fill value and every real key


@triton.jit
def _order_key(x, ids):
    """int64 key, larger = higher logit, then lower id. NaN ranks as -inf; -0.0 as +0.0.
    Real keys are >= ord(-inf) << 31, far above the fill values 0..K-1."""
    x = tl.where(x != x, float("-inf"), x)
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    order = tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)
    return (order << 31) | (0x7FFFFFFF - ids.to(tl.int64))


@triton.jit
def _key_value(key):
    order = key >> 31
    bits = tl.where(order >= 0x80000000, order - 0x80000000, 0xFFFFFFFF - order)
    return bits.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _key_id(key):
    return 0x7FFFFFFF - (key & 0x7FFFFFFF)


@triton.jit
def _split_halves(x, DTYPE: tl.constexpr):
    """(hi, lo) of float32 x in DTYPE: hi = x rounded, lo = the rest rounded (0 where x is inf:
    inf - inf; the hi half carries it)."""
    hi = x.to(DTYPE)
    lo = x - hi.to(tl.float32)
    return hi, tl.where(lo == lo, lo, 0.0).to(DTYPE)


@triton.jit
def _dot_acc(acc, x, x_lo, w, DOT_MODE: tl.constexpr):
    """acc + x @ w^T, w [BLOCK_V, BLOCK_H]: x [BLOCK_B, BLOCK_H] is the normalised hidden state,
    float32, or with DOT_SPLIT16 its hi half and x_lo its lo half in the weight dtype."""
    if DOT_MODE == DOT_SPLIT16:  # two tensor-core dots: ~16 significant bits of x, the weights exact
        acc = tl.dot(x, tl.trans(w), acc)
        return tl.dot(x_lo, tl.trans(w), acc)
    elif DOT_MODE == DOT_TF32X3:
        return tl.dot(x, tl.trans(w), acc, input_precision="tf32x3")
    else:
        return tl.dot(x, tl.trans(w.to(tl.float32)), acc, input_precision="ieee")


@triton.jit
def _load_normalized(h_ptr, nw_ptr, nb_ptr, rows, row_ok, cols, col_ok, stride_hb, mean, rstd,
                     NORM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """[BLOCK_B, BLOCK_H] float32 of norm(hidden), zero outside the valid rows / columns."""
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(h_ptr + rows[:, None] * stride_hb + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM != NONE_NORM:
        x = (x - mean[:, None]) * rstd[:, None]
        if HAS_W:
            x = x * tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_B:
            x = x + tl.load(nb_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return tl.where(mask, x, 0.0)


# Not specialised (tests/test_triton_recompiles.py): the batch size, which shrinks as rows finish.
@triton.jit(do_not_specialize=["batch"])
def _normalize_kernel(h_ptr, nw_ptr, nb_ptr, x_ptr, x_lo_ptr, batch, hidden, eps, stride_hb,
                      NORM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_B: tl.constexpr,
                      BLOCK_H: tl.constexpr, DOT_MODE: tl.constexpr):
    """norm(hidden) of BLOCK_B rows, stored once as `_dot_acc`'s operands ([B, H], contiguous)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    h_lanes = tl.arange(0, BLOCK_H)
    # per-row norm statistics (two passes for layer norm, like the reference)
    mean = tl.zeros((BLOCK_B,), tl.float32)
    rstd = tl.full((BLOCK_B,), 1.0, tl.float32)
    if NORM != NONE_NORM:
        if NORM == LAYER_NORM:
            total = tl.zeros((BLOCK_B,), tl.float32)
            for h0 in range(0, hidden, BLOCK_H):
                cols = h0 + h_lanes
                mask = row_ok[:, None] & (cols < hidden)[None, :]
                x = tl.load(h_ptr + rows[:, None] * stride_hb + cols[None, :], mask=mask, other=0.0)
                total += tl.sum(x.to(tl.float32), axis=1)
            mean = total / hidden
        squares = tl.zeros((BLOCK_B,), tl.float32)
        for h0 in range(0, hidden, BLOCK_H):
            cols = h0 + h_lanes
            mask = row_ok[:, None] & (cols < hidden)[None, :]
            x = tl.load(h_ptr + rows[:, None] * stride_hb + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            x = tl.where(mask, x - mean[:, None], 0.0)
            squares += tl.sum(x * x, axis=1)
        rstd = 1.0 / tl.sqrt(squares / hidden + eps)
    for h0 in range(0, hidden, BLOCK_H):
        cols = h0 + h_lanes
        col_ok = cols < hidden
        x = _load_normalized(h_ptr, nw_ptr, nb_ptr, rows, row_ok, cols, col_ok, stride_hb, mean, rstd,
                             NORM, HAS_W, HAS_B)
        out = rows[:, None] * hidden + cols[None, :]
        mask = row_ok[:, None] & col_ok[None, :]
        if DOT_MODE == DOT_SPLIT16:
            hi, lo = _split_halves(x, x_ptr.dtype.element_ty)
            tl.store(x_ptr + out, hi, mask=mask)
            tl.store(x_lo_ptr + out, lo, mask=mask)
        else:
            tl.store(x_ptr + out, x, mask=mask)


# Not specialised, in the kernels (tests/test_triton_recompiles.py): k (the candidates per
# row, which follows the draft width), the batch size and the split plan that follows it
# (tiles_per_split, num_splits, a row's candidates): Triton would compile a variant for the
# value 1 and for multiples of 16 as rows finish or k adapts. k is a runtime int, not a
# constexpr: it enters the keys only through K_PAD (and BLOCK_C), powers of two; B through
# BLOCK_B (`_tile_config`, three regimes).
@triton.jit(do_not_specialize=["batch", "tiles_per_split", "num_splits", "k"])
def _split_topk_kernel(x_ptr, x_lo_ptr, w_ptr, cand_ptr, batch, hidden, vocab, num_tiles, tiles_per_split,
                       num_splits, k, stride_wv,
                       K_PAD: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                       DOT_MODE: tl.constexpr):
    split = tl.program_id(1)  # the few splits in y (<= 65535); the B blocks, which grow with B, in x
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    h_lanes = tl.arange(0, BLOCK_H)

    # the kept set: k unique fill keys 0..k-1 below every real key; padding slots never the minimum
    slot = tl.arange(0, K_PAD)
    top = tl.where(slot < k, slot.to(tl.int64), 0x7FFFFFFFFFFFFFFF)[None, :] + tl.zeros((BLOCK_B, K_PAD), tl.int64)
    thresh = tl.min(top, axis=1)
    v_lanes = tl.arange(0, BLOCK_V)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, num_tiles)
    for tile in range(first, last):
        ids = tile * BLOCK_V + v_lanes
        v_ok = ids < vocab
        w_rows = w_ptr + ids.to(tl.int64)[:, None] * stride_wv
        acc = tl.zeros((BLOCK_B, BLOCK_V), tl.float32)
        for h0 in range(0, hidden, BLOCK_H):
            cols = h0 + h_lanes
            col_ok = cols < hidden
            x_mask = row_ok[:, None] & col_ok[None, :]
            x_offs = rows[:, None] * hidden + cols[None, :]
            x = tl.load(x_ptr + x_offs, mask=x_mask, other=0.0)
            x_lo = x
            if DOT_MODE == DOT_SPLIT16:
                x_lo = tl.load(x_lo_ptr + x_offs, mask=x_mask, other=0.0)
            w = tl.load(w_rows + cols[None, :], mask=v_ok[:, None] & col_ok[None, :], other=0.0)
            acc = _dot_acc(acc, x, x_lo, w, DOT_MODE)
        keys = _order_key(acc, ids)
        # the kept keys are an unsorted set whose minimum is the threshold; tile keys above it replace it
        cand = tl.where(row_ok[:, None] & v_ok[None, :] & (keys > thresh[:, None]), keys, EMPTY_KEY)
        best = tl.max(cand, axis=1)
        while tl.max(best, axis=0) > EMPTY_KEY:  # at most k steps: candidates come largest first
            take = best > EMPTY_KEY
            top = tl.where((top == thresh[:, None]) & take[:, None], best[:, None], top)  # keys are unique
            thresh = tl.min(top, axis=1)
            cand = tl.where((cand != best[:, None]) & (cand > thresh[:, None]), cand, EMPTY_KEY)
            best = tl.max(cand, axis=1)

    out = (rows[:, None] * num_splits + split) * k + slot[None, :]
    tl.store(cand_ptr + out, top, mask=row_ok[:, None] & (slot < k)[None, :])


@triton.jit(do_not_specialize=["num_cand", "k"])
def _merge_kernel(cand_ptr, val_ptr, idx_ptr, num_cand, k, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    keys = tl.load(cand_ptr + row * num_cand + c, mask=c < num_cand, other=EMPTY_KEY)
    for j in range(k):  # k <= V real keys exist, so fill keys are never picked
        best = tl.max(keys, axis=0)
        tl.store(val_ptr + row * k + j, _key_value(best))
        tl.store(idx_ptr + row * k + j, _key_id(best))
        keys = tl.where(keys == best, EMPTY_KEY, keys)


def _tile_config(batch: int, dtype: torch.dtype, interpreting: bool) -> dict:
    """Tile sizes and launch options from static shapes (not tuned on a GPU yet)."""
    block_b = min(max(16, triton.next_power_of_2(batch)), BLOCK_B_MAX)
    if interpreting:
        return dict(BLOCK_B=block_b, BLOCK_V=64, BLOCK_H=64, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_B=block_b, BLOCK_V=64, BLOCK_H=32, num_warps=4, num_stages=3)
    # 8 warps: with 4 the per-tile top-k selection needs 250+ registers a thread and spills at B 64
    # (compiled for sm_90, tests/test_triton_compile_targets.py). BLOCK_V 128 at every B: with the
    # hidden state normalised once (`_normalize_kernel`) the B 64 tile fits without spilling, and each
    # hidden tile loaded serves twice the weight rows it did at 64; 64-wide H steps in 4 stages keep
    # that spill-free at every B (135 KiB of shared memory at B 64)
    return dict(BLOCK_B=block_b, BLOCK_V=128, BLOCK_H=64, num_warps=8, num_stages=4)


def split_plan(vocab: int, block_v: int, b_blocks: int, device: torch.device,
               num_splits: int | None = None) -> tuple[int, int, int]:
    """(num_tiles, tiles_per_split, num_splits): contiguous runs of whole tiles, about
    PROGRAMS_PER_SM programs per SM over all B blocks, every split non-empty."""
    num_tiles = triton.cdiv(vocab, block_v)
    wanted = num_splits or max(1, PROGRAMS_PER_SM * _launch.sm_count(device) // b_blocks)
    tiles_per_split = triton.cdiv(num_tiles, min(wanted, num_tiles))
    return num_tiles, tiles_per_split, triton.cdiv(num_tiles, tiles_per_split)


def plan(hidden, norm_weight, lm_head_weight, k: int, *, eps: float, norm: str, norm_bias=None,
         num_splits: int | None = None, block_v: int | None = None, block_h: int | None = None):
    """(values, indices, launches) for k <= FUSED_MAX_K: outputs and workspace allocated, and each
    launch as (kernel, grid, positional args, keyword meta-parameters). Launching them in
    order computes the op. num_splits / block_v / block_h override the static choices
    (tests force many splits and partial tiles at small shapes)."""
    if k > FUSED_MAX_K:
        raise ValueError(f"early_exit_topk: the fused kernels take k <= {FUSED_MAX_K} (got {k}); "
                         "ops.early_exit_topk runs larger k on the torch path")
    batch, hidden_size = hidden.shape
    vocab = lm_head_weight.shape[0]
    device = hidden.device
    values, indices = topk_outputs(hidden, k)
    if batch == 0:
        return values, indices, []
    hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
    weight = lm_head_weight if lm_head_weight.stride(1) == 1 else lm_head_weight.contiguous()
    norm_weight = None if norm_weight is None else norm_weight.contiguous()
    norm_bias = None if norm_bias is None else norm_bias.contiguous()
    interpreting = not _launch.plans_for_gpu(device)
    cfg = _tile_config(batch, weight.dtype, interpreting)
    if block_v is not None:
        cfg["BLOCK_V"] = block_v
    if block_h is not None:
        cfg["BLOCK_H"] = block_h
    b_blocks = triton.cdiv(batch, cfg["BLOCK_B"])
    num_tiles, tiles_per_split, splits = split_plan(vocab, cfg["BLOCK_V"], b_blocks, device, num_splits)
    k_pad = max(2, triton.next_power_of_2(k))
    cand = torch.empty(batch * splits * k, dtype=torch.int64, device=device)
    if interpreting:
        dot_mode = DOT_IEEE.value
    else:
        dot_mode = DOT_TF32X3.value if weight.dtype == torch.float32 else DOT_SPLIT16.value
    # norm(hidden) once, as the dot's operands: hi and lo halves in the weight dtype, or float32
    split16 = dot_mode == DOT_SPLIT16.value
    x = torch.empty(batch, hidden_size, dtype=weight.dtype if split16 else torch.float32, device=device)
    x_lo = torch.empty_like(x) if split16 else x
    norm_args = (hidden, norm_weight if norm_weight is not None else hidden,
                 norm_bias if norm_bias is not None else hidden, x, x_lo, batch, hidden_size, float(eps),
                 hidden.stride(0))
    norm_meta = dict(NORM=NORM_CODES[norm], HAS_W=norm_weight is not None, HAS_B=norm_bias is not None,
                     BLOCK_B=cfg["BLOCK_B"], BLOCK_H=cfg["BLOCK_H"], DOT_MODE=dot_mode, num_warps=4)
    split_args = (x, x_lo, weight, cand, batch, hidden_size, vocab, num_tiles, tiles_per_split, splits, k,
                  weight.stride(0))
    split_meta = dict(K_PAD=k_pad, DOT_MODE=dot_mode, **cfg)
    # a row's candidates, sized for the most splits any batch size gets with this V and dtype
    # (one B block, either BLOCK_V of the tile regimes), so B stays out of the merge kernel's key
    most_splits = max(split_plan(vocab, block_v or _tile_config(size, weight.dtype, interpreting)["BLOCK_V"], 1,
                                 device, num_splits)[2] for size in (1, BLOCK_B_MAX))
    merge_meta = dict(BLOCK_C=max(16, triton.next_power_of_2(most_splits) * k_pad))
    launches = [(_normalize_kernel, (b_blocks,), norm_args, norm_meta),
                (_split_topk_kernel, (b_blocks, splits), split_args, split_meta),
                (_merge_kernel, (batch,), (cand, values, indices, splits * k, k), merge_meta)]
    return values, indices, launches


def early_exit_topk(hidden, norm_weight, lm_head_weight, k: int, *, eps: float, norm: str, norm_bias=None,
                    **overrides):
    """Triton `early_exit_topk` on validated inputs (see specdec_kernels.ops.early_exit_topk), k <= FUSED_MAX_K."""
    values, indices, launches = plan(hidden, norm_weight, lm_head_weight, k, eps=eps, norm=norm, norm_bias=norm_bias,
                                     **overrides)
    with device_scope(hidden.device):
        for kernel, grid, args, meta in launches:
            kernel[grid](*args, **meta)
    return values, indices


register("early_exit_topk", "triton", early_exit_topk)
