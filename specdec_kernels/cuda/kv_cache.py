"""CUDA backend of `kv_compact` (csrc/kv_cache.cu): every layer's K and V in one
kernel launch, in place, no host sync; cache addresses from common.kv_layout (fast path:
base pointers and layer steps; else a cached device table)."""

import torch

from ..common.registry import register
from ..common.kv_layout import cache_layout
from ._launch import as_int64, library, on_device, plan_limits, pointer, stream_handle


def kv_compact(k_caches, v_caches, seq_lens, accepted_nodes):
    accepted_nodes = as_int64(accepted_nodes)  # the kernel reads int64 entries (seq_lens: int32 or int64)
    lib = library()
    batch, m = accepted_nodes.shape
    device = seq_lens.device
    new_lens = torch.empty(batch, dtype=seq_lens.dtype, device=device)
    if batch == 0:
        return new_lens
    first_k, first_v = (k_caches[0], v_caches[0]) if k_caches else (None, None)
    heads, seq_capacity, head_dim = first_k.shape[1:] if k_caches else (0, 0, 0)  # no layers: lengths only
    with on_device(device):  # the launcher queries the current device's SM count; a new table goes here
        layout = cache_layout(k_caches, v_caches)
        lib.kv_compact(
            pointer(first_k), pointer(first_v), layout.k_step, layout.v_step, layout.k_strides, layout.v_strides,
            pointer(layout.table), layout.num_layers, heads, seq_capacity, head_dim,
            first_k.element_size() if k_caches else 2, layout.vector_bytes,
            seq_lens.data_ptr(), seq_lens.dtype == torch.int32, seq_lens.stride(0),
            accepted_nodes.data_ptr(), accepted_nodes.stride(0), accepted_nodes.stride(1),
            new_lens.data_ptr(), batch, m, stream_handle(device))
    return new_lens


def _plan_sizes(sizes):
    """vector_bytes is only known from the cache addresses: plan for the narrowest (most CTAs)."""
    if "Hkv" not in sizes:  # no layers: lengths only
        return dict(B=sizes["B"], L=0)
    return dict(B=sizes["B"], L=sizes["L"], Hkv=sizes["Hkv"], S_max=sizes["S_max"], D=sizes["D"],
                elem_size=sizes["dtype"].itemsize, vector_bytes=2)


register("kv_compact", "cuda", kv_compact, limits=plan_limits("kv_compact", _plan_sizes))
