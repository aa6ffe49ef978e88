"""Triton backend of `tree_attention`: decode-shaped tree/chain verification attention.

The problem is decode-shaped: N draft nodes per row (8..64) against a long prefix, so the
cost is reading the KV cache, and the kernel reads every KV tile once per KV head for all
N nodes and all Hq/Hkv query heads that share it.

One launch of `_split_kernel` (plus `_merge_kernel` with several prefix splits); the split count
depends on static shapes only, and values the host cannot check are clamped in the kernel (seq_lens,
page ids, parents), so a call is CUDA-graph capturable and never reads out of bounds.
"""

import torch
import triton
import triton.language as tl

from ..common.registry import register
from . import _launch
from ._launch import device_scope

LOG2E = 1.4426950408889634
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # lse is reported in natural log
MIN_TILES_PER_SPLIT = 4  # a split streams at least this many BLOCK_N tiles of prefix
MAX_SPLITS = 64
PROGRAMS_PER_SM = 2  # program slots per SM the split count fills (the 16-bit tiles compile to 1-2 resident per SM)
MERGE_BLOCK_R = 16  # rows per program of the merge kernel


@triton.jit
def _kv_offsets(start, keys, b, table_ptr, stride_tb, stride_tp, num_pages, stride_outer, stride_pos,
                PAGE_SIZE: tl.constexpr, ONE_PAGE: tl.constexpr):
    """Element offsets of cache positions start + keys (int64) of row b, KV head 0.

    PAGE_SIZE 0: contiguous [B, Hkv, S_max, D] (outer = row). Otherwise a page pool
    [num_pages, PAGE_SIZE, Hkv, D] (outer = page) with page ids from the block table,
    clamped to a real page. ONE_PAGE: the tile starts on a BLOCK_N boundary and
    pages are whole multiples of BLOCK_N, so one scalar lookup serves every key.
    """
    if PAGE_SIZE == 0:
        return b * stride_outer + (start + keys) * stride_pos
    else:
        if ONE_PAGE:
            page = tl.load(table_ptr + b * stride_tb + (start // PAGE_SIZE) * stride_tp)
            slot = start % PAGE_SIZE + keys
        else:
            pos = start + keys
            page = tl.load(table_ptr + b * stride_tb + (pos // PAGE_SIZE) * stride_tp)
            slot = pos % PAGE_SIZE
        page = tl.minimum(tl.maximum(page.to(tl.int64), 0), num_pages - 1)
        return page * stride_outer + slot * stride_pos


@triton.jit
def _load_tile(head_ptr, start, keys, key_ok, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages, stride_outer,
               stride_pos, PAGE_SIZE: tl.constexpr, ONE_PAGE: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """[len(keys), BLOCK_D] of one cache (K or V) at positions start + keys; with MASKED the
    lanes outside key_ok (whose keys the caller keeps on a real position) load zeros."""
    off = _kv_offsets(start, keys, b, table_ptr, stride_tb, stride_tp, num_pages, stride_outer, stride_pos, PAGE_SIZE,
                      ONE_PAGE)
    if MASKED:
        return tl.load(head_ptr + off[:, None], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        return tl.load(head_ptr + off[:, None])
    else:
        return tl.load(head_ptr + off[:, None], mask=d_ok[None, :], other=0.0)


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation. UPCAST: multiply as fp32 (exact for 16-bit inputs):
    the Triton interpreter (CPU) gets bfloat16 dots wrong."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _attend_tile(q, k, v, m_i, l_i, acc, qk_scale, visible, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr):
    """One online-softmax step (base 2) of the M query rows over one tile of keys."""
    s = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST) * qk_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet stays at zero
    alpha = tl.exp2(m_i - shift)
    p = tl.exp2(s - shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)  # p rounded like v, as on a GPU
    return m_new, l_i, acc


@triton.jit
def _tree_visibility(parents_ptr, b, stride_pb, stride_pn, n_nodes, node, BLOCK_T: tl.constexpr,
                     DOUBLINGS: tl.constexpr):
    """bool [BLOCK_M, BLOCK_T]: tail key j is node[r] itself or one of its ancestors."""
    i = tl.arange(0, BLOCK_T)
    par = tl.load(parents_ptr + b * stride_pb + i * stride_pn, mask=(i > 0) & (i < n_nodes), other=-1).to(tl.int32)
    par = tl.where((par >= 0) & (par < i), par, -1)  # topological order; anything else has no parent
    closure = ((i[None, :] == i[:, None]) | (i[None, :] == par[:, None])).to(tl.float16)
    for _ in tl.static_range(DOUBLINGS):  # after k squarings: every ancestor up to 2^k levels up
        closure = (tl.dot(closure, closure) > 0.5).to(tl.float16)
    onehot = (node[:, None] == i[None, :]).to(tl.float16)  # picks each M row's node row of the closure
    return tl.dot(onehot, closure) > 0.5


# Not specialised, in both kernels (tests/test_triton_recompiles.py): the ints that follow the
# node count N or, through the split plan, the batch size (n_nodes, num_splits, the parents
# stride N, the lse batch stride N * Hq): Triton would compile a variant for the value 1 and
# for multiples of 16 as rows finish or N changes. The q / out strides keep their alignment
# (multiples of Hq * D for every N). N enters the keys through BLOCK_T (and DOUBLINGS, taken
# from it), BLOCK_M and its launch options; B only through DIRECT.
_PLAN_INTS = ["n_nodes", "num_splits", "stride_lb"]


@triton.jit
def _attend_prefix(q, k_head, v_head, lo, hi, b, table_ptr, stride_tb, stride_tp, num_pages, stride_ko, stride_kp,
                   stride_vo, stride_vp, d_ok, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr, ONE_PAGE: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """(m, l, acc) of the online softmax over prefix positions [lo, hi): whole tiles with no masks
    (the hot loop), then the row's last, partial tile."""
    full_end = lo + (hi - lo) // BLOCK_N * BLOCK_N
    keys = tl.arange(0, BLOCK_N).to(tl.int64)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start in range(lo, full_end, BLOCK_N):
        k = _load_tile(k_head, start, keys, None, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages,
                       stride_ko, stride_kp, PAGE_SIZE, ONE_PAGE, False, HEAD_DIM == BLOCK_D)
        v = _load_tile(v_head, start, keys, None, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages,
                       stride_vo, stride_vp, PAGE_SIZE, ONE_PAGE, False, HEAD_DIM == BLOCK_D)
        m_i, l_i, acc = _attend_tile(q, k, v, m_i, l_i, acc, qk_scale, None, False, DOT_PRECISION, UPCAST)
    if full_end < hi:
        ok = full_end + keys < hi
        in_row = tl.where(ok, keys, 0)
        k = _load_tile(k_head, full_end, in_row, ok, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages,
                       stride_ko, stride_kp, PAGE_SIZE, False, True, False)
        v = _load_tile(v_head, full_end, in_row, ok, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages,
                       stride_vo, stride_vp, PAGE_SIZE, False, True, False)
        m_i, l_i, acc = _attend_tile(q, k, v, m_i, l_i, acc, qk_scale, ok[None, :], True, DOT_PRECISION, UPCAST)
    return m_i, l_i, acc


@triton.jit
def _attend_draft(q, k_head, v_head, m_i, l_i, acc, prefix, node, n_nodes, b, parents_ptr, stride_pb, stride_pn,
                  table_ptr, stride_tb, stride_tp, num_pages, stride_ko, stride_kp, stride_vo, stride_vp, d_ok,
                  qk_scale, BLOCK_T: tl.constexpr, DOUBLINGS: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  TREE: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One more online-softmax step over the N draft positions after the prefix, under the tree
    mask (TREE) or the causal chain mask."""
    t = tl.arange(0, BLOCK_T)
    t_ok = t < n_nodes
    in_tail = tl.where(t_ok, t, 0).to(tl.int64)
    k = _load_tile(k_head, prefix, in_tail, t_ok, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages,
                   stride_ko, stride_kp, PAGE_SIZE, False, True, False)
    v = _load_tile(v_head, prefix, in_tail, t_ok, d_ok, b, table_ptr, stride_tb, stride_tp, num_pages,
                   stride_vo, stride_vp, PAGE_SIZE, False, True, False)
    if TREE:
        visible = _tree_visibility(parents_ptr, b, stride_pb, stride_pn, n_nodes, node, BLOCK_T, DOUBLINGS)
    else:
        visible = t[None, :] <= node[:, None]
    visible = visible & t_ok[None, :]
    return _attend_tile(q, k, v, m_i, l_i, acc, qk_scale, visible, True, DOT_PRECISION, UPCAST)


@triton.jit
def _store_output(out_ptr, lse_ptr, m_i, l_i, acc, b, node, head, row_ok, d, d_ok, stride_ob, stride_on, stride_oh,
                  stride_lb, stride_ln, stride_lh):
    """The finished rows (one split had the whole row): out = acc / l, lse in natural log."""
    l_safe = tl.where(row_ok, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) * LN2
    o_off = b * stride_ob + node[:, None].to(tl.int64) * stride_on + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + node.to(tl.int64) * stride_ln + head * stride_lh, lse, mask=row_ok)


@triton.jit
def _store_partial(part_o_ptr, part_ml_ptr, m_i, l_i, acc, bh, split, num_splits, rows, m_rows, row_ok, d, d_ok,
                   HEAD_DIM: tl.constexpr):
    """This split's partial state for the merge: workspace [B * Hkv, num_splits, 2 | rows, ...]."""
    slot = bh.to(tl.int64) * num_splits + split
    tl.store(part_ml_ptr + (slot * 2) * m_rows + rows, m_i, mask=row_ok)
    tl.store(part_ml_ptr + (slot * 2 + 1) * m_rows + rows, l_i, mask=row_ok)
    o_off = (slot * m_rows + rows[:, None]) * HEAD_DIM + d[None, :]
    tl.store(part_o_ptr + o_off, acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=_PLAN_INTS + ["stride_pb"])
def _split_kernel(q_ptr, k_ptr, v_ptr, seq_lens_ptr, parents_ptr, table_ptr, out_ptr, lse_ptr,
                  part_o_ptr, part_ml_ptr,
                  n_nodes, group, num_kv_heads, capacity, num_pages, num_splits, qk_scale,
                  stride_qb, stride_qn, stride_qh, stride_ko, stride_kh, stride_kp, stride_vo, stride_vh, stride_vp,
                  stride_sl, stride_pb, stride_pn, stride_tb, stride_tp,
                  stride_ob, stride_on, stride_oh, stride_lb, stride_ln, stride_lh,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_T: tl.constexpr, DOUBLINGS: tl.constexpr, PAGE_SIZE: tl.constexpr, ONE_PAGE: tl.constexpr,
                  TREE: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    m_rows = n_nodes * group
    m_blocks = tl.cdiv(m_rows, BLOCK_M)
    # (row, KV head, M block) folded into grid x (grid y and z stop at 65535), M block fastest so that the
    # programs of one KV head run side by side and share its tiles in L2
    pid_m = tl.program_id(0) % m_blocks
    bh = tl.program_id(0) // m_blocks
    split = tl.program_id(1)
    b = (bh // num_kv_heads).to(tl.int64)
    kvh = (bh % num_kv_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < m_rows
    node = rows // group  # the MMA's M packs (node, query head of this KV head) pairs
    head = kvh * group + rows % group
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + node[:, None].to(tl.int64) * stride_qn + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    prefix = tl.load(seq_lens_ptr + b * stride_sl).to(tl.int64)
    prefix = tl.maximum(tl.minimum(prefix, capacity - n_nodes), 0)
    k_head = k_ptr + kvh * stride_kh + d[None, :]
    v_head = v_ptr + kvh * stride_vh + d[None, :]

    # this split's chunk of the prefix: whole tiles, so only the row's last tile is partial
    tiles_per_split = tl.cdiv(tl.cdiv(prefix, BLOCK_N), num_splits)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.maximum(tl.minimum(lo + tiles_per_split * BLOCK_N, prefix), lo)
    m_i, l_i, acc = _attend_prefix(q, k_head, v_head, lo, hi, b, table_ptr, stride_tb, stride_tp, num_pages,
                                   stride_ko, stride_kp, stride_vo, stride_vp, d_ok, qk_scale, HEAD_DIM, BLOCK_M,
                                   BLOCK_N, BLOCK_D, PAGE_SIZE, ONE_PAGE, DOT_PRECISION, UPCAST)
    if split == num_splits - 1:  # the last split also takes the N draft positions
        m_i, l_i, acc = _attend_draft(q, k_head, v_head, m_i, l_i, acc, prefix, node, n_nodes, b, parents_ptr,
                                      stride_pb, stride_pn, table_ptr, stride_tb, stride_tp, num_pages, stride_ko,
                                      stride_kp, stride_vo, stride_vp, d_ok, qk_scale, BLOCK_T, DOUBLINGS, PAGE_SIZE,
                                      TREE, DOT_PRECISION, UPCAST)
    if DIRECT:  # one split: this program has the whole row
        _store_output(out_ptr, lse_ptr, m_i, l_i, acc, b, node, head, row_ok, d, d_ok, stride_ob, stride_on, stride_oh,
                      stride_lb, stride_ln, stride_lh)
    else:
        _store_partial(part_o_ptr, part_ml_ptr, m_i, l_i, acc, bh, split, num_splits, rows, m_rows, row_ok, d, d_ok,
                       HEAD_DIM)


@triton.jit(do_not_specialize=_PLAN_INTS)
def _merge_kernel(part_o_ptr, part_ml_ptr, out_ptr, lse_ptr, n_nodes, group, num_kv_heads, num_splits,
                  stride_ob, stride_on, stride_oh, stride_lb, stride_ln, stride_lh,
                  HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the splits' (acc, max, sum) of BLOCK_R rows of one (row b, KV head)."""
    m_rows = n_nodes * group
    r_blocks = tl.cdiv(m_rows, BLOCK_R)
    bh = tl.program_id(0) // r_blocks
    b = (bh // num_kv_heads).to(tl.int64)
    kvh = (bh % num_kv_heads).to(tl.int64)
    rows = (tl.program_id(0) % r_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < m_rows
    d = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    big_m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    big_l = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    for s in range(num_splits):
        slot = bh.to(tl.int64) * num_splits + s
        m_s = tl.load(part_ml_ptr + (slot * 2) * m_rows + rows, mask=row_ok, other=float("-inf"))
        l_s = tl.load(part_ml_ptr + (slot * 2 + 1) * m_rows + rows, mask=row_ok, other=0.0)
        o_s = tl.load(part_o_ptr + (slot * m_rows + rows[:, None]) * HEAD_DIM + d[None, :], mask=mask, other=0.0)
        m_new = tl.maximum(big_m, m_s)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # an empty split has max -inf and sum 0
        alpha = tl.exp2(big_m - shift)
        weight = tl.exp2(m_s - shift)
        big_l = big_l * alpha + l_s * weight
        acc = acc * alpha[:, None] + o_s * weight[:, None]
        big_m = m_new
    l_safe = tl.where(row_ok, big_l, 1.0)
    node = rows // group
    head = kvh * group + rows % group
    o_off = b * stride_ob + node[:, None].to(tl.int64) * stride_on + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(lse_ptr + b * stride_lb + node.to(tl.int64) * stride_ln + head * stride_lh,
             (big_m + tl.log2(l_safe)) * LN2, mask=row_ok)


def _tile_config(m_rows: int, head_dim: int, dtype: torch.dtype) -> dict:
    """Tile sizes and launch options from static shapes. Compiled for sm_90 and sm_80 in CI
    (tests/test_triton_compile_targets.py): the 16-bit tiles do not spill on sm_90 (128-row tiles
    on warp-group MMAs); on sm_80 (mma.sync) a 64-node tree spills ~300 bytes a thread, and
    64-row tiles spill too. Timing on a GPU is still owed."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    if dtype == torch.float32:  # IEEE fp32 dots run on the FMA units: small tiles keep them in registers
        block_m = min(max(16, triton.next_power_of_2(m_rows)), 32)
        return dict(BLOCK_M=block_m, BLOCK_N=32, BLOCK_D=block_d, num_warps=8 if block_d >= 128 else 4,
                    num_stages=2)
    block_m = min(max(16, triton.next_power_of_2(m_rows)), 64 if head_dim > 128 else 128)
    block_n = 32 if head_dim > 128 else 64
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=8 if block_m >= 128 else 4,
                num_stages=2 if block_m >= 128 else 3)


def num_splits_for(programs: int, max_prefix: int, block_n: int, device: torch.device) -> int:
    """Prefix splits per (row, KV head, M block), from static shapes only: as many as fit
    the GPU's program slots (PROGRAMS_PER_SM per SM) without starting a partial extra wave
    (splits are equal in work, so a wave of 1.2 slots' worth would cost two), each split at
    least MIN_TILES_PER_SPLIT tiles of the longest possible prefix."""
    wanted = PROGRAMS_PER_SM * _launch.sm_count(device) // max(programs, 1)
    most = triton.cdiv(max(max_prefix, 1), MIN_TILES_PER_SPLIT * block_n)
    return max(1, min(wanted, most, MAX_SPLITS))


def tree_attention(q, k_cache, v_cache, seq_lens, parents, block_table, *, sm_scale: float, **overrides):
    """Triton `tree_attention` on validated inputs (see specdec_kernels.ops.tree_attention).

    overrides (num_splits, block_m, block_n) replace the static choices: tests use them to
    force several splits and M blocks at small shapes.
    """
    out, lse, launches = plan(q, k_cache, v_cache, seq_lens, parents, block_table, sm_scale=sm_scale, **overrides)
    with device_scope(q.device):
        for kernel, grid, args, meta in launches:
            kernel[grid](*args, **meta)
    return out, lse


def plan(q, k_cache, v_cache, seq_lens, parents, block_table, *, sm_scale: float, num_splits: int | None = None,
         block_m: int | None = None, block_n: int | None = None):
    """(out, lse, launches): the outputs and workspace allocated, and every kernel launch of
    the call as (kernel, grid, positional args, keyword meta-parameters). Launching them in
    order computes the op; tests also compile them for a GPU target without a GPU."""
    batch, n, hq, head_dim = q.shape
    paged = block_table is not None
    hkv = k_cache.shape[2] if paged else k_cache.shape[1]
    group = hq // hkv
    out = torch.empty_like(q)
    lse = torch.empty(batch, n, hq, dtype=torch.float32, device=q.device)
    if batch == 0 or n == 0:
        return out, lse, []
    m_rows = n * group
    cfg = _tile_config(m_rows, head_dim, q.dtype)
    if block_m is not None:
        cfg["BLOCK_M"] = block_m
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    m_blocks = triton.cdiv(m_rows, cfg["BLOCK_M"])
    if paged:
        num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
        outer = (k_cache.stride(0), v_cache.stride(0))  # page
        pos_strides = (k_cache.stride(1), v_cache.stride(1))  # slot in page
        head_strides = (k_cache.stride(2), v_cache.stride(2))
        table, stride_tb, stride_tp = block_table, block_table.stride(0), block_table.stride(1)
    else:
        num_pages, page_size, capacity = 1, 0, k_cache.shape[2]
        outer = (k_cache.stride(0), v_cache.stride(0))  # row
        pos_strides = (k_cache.stride(2), v_cache.stride(2))
        head_strides = (k_cache.stride(1), v_cache.stride(1))
        table, stride_tb, stride_tp = seq_lens, 0, 0  # never read
    if num_splits is None:
        num_splits = num_splits_for(batch * hkv * m_blocks, capacity - n, cfg["BLOCK_N"], q.device)
    direct = num_splits == 1
    if direct:  # nothing to merge: the workspace pointers are never used
        part_o = part_ml = lse
    else:
        part_o = torch.empty(batch * hkv * num_splits * m_rows * head_dim, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(batch * hkv * num_splits * 2 * m_rows, dtype=torch.float32, device=q.device)
    tree = parents is not None
    out_strides = (out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2))
    split_args = (q, k_cache, v_cache, seq_lens, parents if tree else seq_lens, table, out, lse, part_o, part_ml,
                  n, group, hkv, capacity, num_pages, num_splits, sm_scale * LOG2E,
                  q.stride(0), q.stride(1), q.stride(2), outer[0], head_strides[0], pos_strides[0],
                  outer[1], head_strides[1], pos_strides[1], seq_lens.stride(0),
                  parents.stride(0) if tree else 0, parents.stride(1) if tree else 0, stride_tb, stride_tp,
                  *out_strides)
    block_t = max(16, triton.next_power_of_2(n))
    # log2(BLOCK_T) >= ceil(log2(N - 1)) squarings close every ancestor path (extra ones keep the
    # closure): from BLOCK_T, so N compiles apart only per BLOCK_T, not per ceil(log2(N - 1))
    split_meta = dict(HEAD_DIM=head_dim, BLOCK_T=block_t, DOUBLINGS=block_t.bit_length() - 1, PAGE_SIZE=page_size,
                      ONE_PAGE=page_size > 0 and page_size % cfg["BLOCK_N"] == 0,  # a prefix tile never spans pages
                      TREE=tree, DIRECT=direct, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                      UPCAST=q.dtype == torch.bfloat16 and not _launch.plans_for_gpu(q.device), **cfg)
    launches = [(_split_kernel, (batch * hkv * m_blocks, num_splits), split_args, split_meta)]
    if not direct:
        launches.append((_merge_kernel, (batch * hkv * triton.cdiv(m_rows, MERGE_BLOCK_R),),
                         (part_o, part_ml, out, lse, n, group, hkv, num_splits, *out_strides),
                         dict(HEAD_DIM=head_dim, BLOCK_R=MERGE_BLOCK_R, BLOCK_D=cfg["BLOCK_D"])))
    return out, lse, launches


def launch_limits(sizes: dict) -> str | None:
    """Why the kernels cannot serve a call of these sizes (the registry's `limits`), or None.
    Grid x holds B * Hkv * (M blocks), the merge's B * Hkv * cdiv(N * group, MERGE_BLOCK_R) >=
    the split kernel's; grid y (num_splits) is at most MAX_SPLITS."""
    batch, hkv, m_rows = sizes["B"], sizes["Hkv"], sizes["N"] * (sizes["Hq"] // max(sizes["Hkv"], 1))
    block_m = _tile_config(m_rows, sizes["D"], sizes["dtype"])["BLOCK_M"]
    return _launch.grid_x_refusal(batch * hkv * triton.cdiv(m_rows, min(block_m, MERGE_BLOCK_R)),
                                  "B * Hkv * row blocks")


register("tree_attention", "triton", tree_attention, limits=launch_limits)
