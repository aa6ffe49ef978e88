"""Triton backend of `kv_compact`: every layer's K and V in one launch, in place.

Row b's entry j moves cache row seq_lens[b] + accepted_nodes[b, j] to seq_lens[b] + j. The entries
increase strictly from >= 0, so src_j >= dst_j and no row is read after an earlier entry wrote it;
the only hazard is a write after a read in the same column. So programs split the columns freely and
go through the rows in increasing j (csrc/kv_cache.cu rests on the same argument). Grid (B x column
blocks, 2L): K layers, then V layers; tensor addresses come from common.kv_layout.
"""

import torch
import triton
import triton.language as tl

from ..common.registry import register
from ..common.kv_layout import cache_layout
from . import _launch
from ._launch import device_scope

MAX_BLOCK_A = 1024  # accepted entries scanned per step of the metadata loop
CHUNK_ELEMENTS = 8192  # elements one program holds per row chunk (BLOCK_M x BLOCK_H x BLOCK_D)
MAX_COLUMNS = 2048  # elements of one row one program moves (BLOCK_H x BLOCK_D)
MIN_BLOCK_D = 32  # head-dim elements per program when splitting for parallelism
TARGET_PROGRAMS = 1024  # on a GPU: split heads, then head-dim, until the grid has about this many programs
INTERPRETER_TARGET_PROGRAMS = 1  # on the CPU (interpreter) there are no SMs to fill: fewest programs


# Not specialised (tests/test_triton_recompiles.py): M, the accepted path's length (the
# draft length + 1), and its row stride: Triton would compile a variant for the value 1 and
# for multiples of 16 as the draft length adapts. M enters the key through BLOCK_A and
# BLOCK_M (powers of two); B through the column tiling of `_plan` (a few regimes).
@triton.jit(do_not_specialize=["stride_ab", "M"])
def _kv_compact_kernel(k_ptr, v_ptr, table_ptr, seq_lens_ptr, accepted_ptr, new_lens_ptr,
                       num_tensors, num_layers, heads, head_dim, seq_cap, col_blocks, d_blocks,
                       k_step, v_step, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                       stride_len, stride_ab, stride_am, M,
                       TABLE: tl.constexpr, VEC_BYTES: tl.constexpr, ALIGN: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_A: tl.constexpr):
    b = (tl.program_id(0) // col_blocks).to(tl.int64)
    col_block = tl.program_id(0) % col_blocks
    t = tl.program_id(1)
    acc_row = accepted_ptr + b * stride_ab

    # 1. this row's entries: how many are valid (new length), which ones move ([first, end))
    count = tl.zeros((), tl.int64)
    end = tl.zeros((), tl.int64)
    first = tl.zeros((), tl.int64) + M
    for m0 in range(0, M, BLOCK_A):
        j = m0 + tl.arange(0, BLOCK_A).to(tl.int64)
        a = tl.load(acc_row + j * stride_am, mask=j < M, other=-1)
        valid = a >= 0
        count += tl.sum(valid.to(tl.int64), axis=0)
        end = tl.maximum(end, tl.max(tl.where(valid, j + 1, 0), axis=0))
        # entries with src == dst (the root, a chain-shaped path) are a prefix: a_j > j implies a_k > k for k > j
        first = tl.minimum(first, tl.min(tl.where(valid & (a != j), j, M), axis=0))
    seq_len = tl.load(seq_lens_ptr + b * stride_len)
    if (t == 0) & (col_block == 0):
        tl.store(new_lens_ptr + b, seq_len + count.to(seq_len.dtype))

    # 2. the moves, BLOCK_M rows at a time in increasing j
    if (t < num_tensors) & (first < end):
        if TABLE:
            entry = table_ptr + t * 4
            base = tl.load(entry).to(tl.pointer_type(k_ptr.dtype.element_ty))
            sb = tl.load(entry + 1)
            sh = tl.load(entry + 2)
            ss = tl.load(entry + 3)
        else:
            is_v = t >= num_layers
            layer = tl.where(is_v, t - num_layers, t).to(tl.int64)
            base = tl.where(is_v, v_ptr + layer * v_step, k_ptr + layer * k_step)
            sb = tl.where(is_v, v_sb, k_sb).to(tl.int64)
            sh = tl.where(is_v, v_sh, k_sh).to(tl.int64)
            ss = tl.where(is_v, v_ss, k_ss).to(tl.int64)
        if ALIGN > 1:  # every address, stride and D is a multiple of VEC_BYTES (checked on the host)
            # a kernel argument cannot carry the hint, an op result can (head_dim >= ALIGN here)
            head_dim = tl.multiple_of(tl.maximum(head_dim, ALIGN), ALIGN)
            base = tl.multiple_of(base, VEC_BYTES)
            sb = tl.multiple_of(sb, ALIGN)
            sh = tl.multiple_of(sh, ALIGN)
            ss = tl.multiple_of(ss, ALIGN)
        h = (col_block // d_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
        d = (col_block % d_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
        col_off = h.to(tl.int64)[:, None] * sh + d[None, :]
        col_mask = (h < heads)[:, None] & (d < head_dim)[None, :]
        row_base = base + b * sb
        start = seq_len.to(tl.int64)
        for j0 in range(first, end, BLOCK_M):
            j = j0 + tl.arange(0, BLOCK_M).to(tl.int64)
            a = tl.load(acc_row + j * stride_am, mask=j < end, other=-1)
            src = start + a
            dst = start + j
            # unvalidated GPU inputs (seq_lens + node past S_max, negative lengths) skip rows, never leave the cache
            move = (a >= 0) & (a != j) & (src >= 0) & (src < seq_cap) & (dst >= 0) & (dst < seq_cap)
            mask = move[:, None, None] & col_mask[None, :, :]
            rows = tl.load(row_base + src[:, None, None] * ss + col_off[None, :, :], mask=mask)
            tl.debug_barrier()  # every load of the chunk before any store (write-after-read)
            tl.store(row_base + dst[:, None, None] * ss + col_off[None, :, :], rows, mask=mask)


def _plan(batch: int, num_tensors: int, heads: int, head_dim: int, m: int,
          target_programs: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_H, BLOCK_D, column blocks): whole heads per program when the grid is
    big enough, else fewer heads, then a slice of D, for about target_programs programs."""
    block_d = min(triton.next_power_of_2(head_dim), MAX_COLUMNS)
    block_h = min(triton.next_power_of_2(heads), max(1, MAX_COLUMNS // block_d))

    def col_blocks(bh, bd):
        return triton.cdiv(heads, bh) * triton.cdiv(head_dim, bd)

    while batch * num_tensors * col_blocks(block_h, block_d) < target_programs:
        if block_h > 1:
            block_h //= 2
        elif block_d > MIN_BLOCK_D:
            block_d //= 2
        else:
            break
    block_m = max(1, min(triton.next_power_of_2(max(m, 1)), 16, CHUNK_ELEMENTS // (block_h * block_d)))
    return block_m, block_h, block_d, col_blocks(block_h, block_d)


def kv_compact(k_caches, v_caches, seq_lens, accepted_nodes):
    """Triton `kv_compact` on validated inputs (see specdec_kernels.ops.kv_compact)."""
    batch, m = accepted_nodes.shape
    new_lens = torch.empty(batch, dtype=seq_lens.dtype, device=seq_lens.device)
    if batch == 0:
        return new_lens
    num_layers = len(k_caches)
    block_a = min(triton.next_power_of_2(max(m, 1)), MAX_BLOCK_A)
    if num_layers == 0 or k_caches[0].numel() == 0:  # only the lengths; no cache is dereferenced
        with device_scope(seq_lens.device):
            _kv_compact_kernel[(batch, 1)](
                seq_lens, seq_lens, seq_lens, seq_lens, accepted_nodes, new_lens,
                0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0,
                seq_lens.stride(0), accepted_nodes.stride(0), accepted_nodes.stride(1), m,
                TABLE=False, VEC_BYTES=1, ALIGN=1, BLOCK_M=1, BLOCK_H=1, BLOCK_D=1, BLOCK_A=block_a)
        return new_lens
    _, heads, seq_cap, head_dim = k_caches[0].shape
    num_tensors = 2 * num_layers
    target = TARGET_PROGRAMS if _launch.plans_for_gpu(seq_lens.device) else INTERPRETER_TARGET_PROGRAMS
    block_m, block_h, block_d, num_col_blocks = _plan(batch, num_tensors, heads, head_dim, m, target)
    elem = k_caches[0].element_size()
    with device_scope(seq_lens.device):  # a new table is uploaded on this device's current stream
        layout = cache_layout(k_caches, v_caches)
        align = layout.vector_bytes // elem if layout.vector_bytes > elem else 1
        _kv_compact_kernel[(batch * num_col_blocks, num_tensors)](
            k_caches[0], v_caches[0], layout.table if layout.table is not None else accepted_nodes,
            seq_lens, accepted_nodes, new_lens,
            num_tensors, num_layers, heads, head_dim, seq_cap, num_col_blocks, triton.cdiv(head_dim, block_d),
            layout.k_step, layout.v_step, *layout.k_strides, *layout.v_strides,
            seq_lens.stride(0), accepted_nodes.stride(0), accepted_nodes.stride(1), m,
            TABLE=layout.table is not None, VEC_BYTES=layout.vector_bytes, ALIGN=align,
            BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_A=block_a,
            num_warps=4 if block_m * block_h * block_d <= 4096 else 8)
    return new_lens


def launch_limits(sizes: dict) -> str | None:
    """The registry's `limits`: grid y holds the 2 * L cache tensors (x, B * column blocks, fits)."""
    if 2 * sizes["L"] > _launch.MAX_GRID_YZ:
        return f"2 * L = {2 * sizes['L']} cache tensors, past CUDA's grid-y limit of {_launch.MAX_GRID_YZ}"
    return None


register("kv_compact", "triton", kv_compact, limits=launch_limits)
