"""CUDA backend of `tree_attention` (csrc/attention.cu): one launch per call, no host sync.

K/V are passed as they are (any strides with a unit last stride, contiguous or paged); the
kernel reads them through (outer, slot, head) strides: outer is the row b and slot the
position for a contiguous cache [B, Hkv, S_max, D], outer the page and slot the position in
the page for a page pool [num_pages, page_size, Hkv, D]. The split tickets come from the
per-stream zeroed workspace (left zeroed); the partial states of split rows use a scratch
buffer sized by the static shapes only.
"""

import torch

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ._launch import DTYPE_CODES, library, on_device, plan_limits, pointer, stream_handle


def _index(t: torch.Tensor | None) -> tuple[int, bool, int, int]:
    """(address or 0, is int64, stride0, stride1) of an optional int32/int64 index tensor."""
    if t is None:
        return 0, False, 0, 0
    return t.data_ptr(), t.dtype == torch.int64, t.stride(0), t.stride(1) if t.dim() > 1 else 0


def tree_attention(q, k_cache, v_cache, seq_lens, parents, block_table=None, *, sm_scale):
    """CUDA `tree_attention` on validated inputs (see specdec_kernels.ops.tree_attention)."""
    lib = library()
    batch, n, hq, d = q.shape
    device = q.device
    out = torch.empty_like(q)
    lse = torch.empty(batch, n, hq, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out, lse
    if block_table is None:  # [B, Hkv, S_max, D]: outer = b, slot = position
        _, hkv, s_max, _ = k_cache.shape
        num_pages, page_size, max_pages, capacity = 0, 0, 0, s_max
        k = (k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(2), k_cache.stride(1))
        v = (v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(2), v_cache.stride(1))
    else:  # [num_pages, page_size, Hkv, D]: outer = page, slot = position % page_size
        num_pages, page_size, hkv, _ = k_cache.shape
        max_pages, s_max = block_table.shape[1], 0
        capacity = max_pages * page_size
        k = (k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
        v = (v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
    dtype = DTYPE_CODES[q.dtype]
    with on_device(device):  # the plan and the launch use the current device's SM count and stream
        _, _, _, counter_bytes, partial_bytes, _ = lib.tree_attention_plan(batch, n, hq, hkv, d, capacity, dtype)
        counters = zeroed_workspace(device, counter_bytes) if counter_bytes else None
        partials = torch.empty(partial_bytes // 4, dtype=torch.float32, device=device) if partial_bytes else None
        lib.tree_attention(
            q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), k, v, _index(seq_lens), _index(parents),
            _index(block_table), page_size, num_pages, max_pages, s_max,
            out.data_ptr(), out.stride(0), out.stride(1), out.stride(2), lse.data_ptr(),
            batch, n, hq, hkv, d, float(sm_scale), dtype,
            pointer(counters), 0 if counters is None else counters.numel(),
            pointer(partials), partial_bytes, stream_handle(device))
    return out, lse


def _plan_sizes(sizes):
    return dict(B=sizes["B"], N=sizes["N"], Hq=sizes["Hq"], Hkv=sizes["Hkv"], D=sizes["D"],
                capacity=sizes["capacity"], dtype=DTYPE_CODES[sizes["dtype"]])


register("tree_attention", "cuda", tree_attention, limits=plan_limits("tree_attention", _plan_sizes))
