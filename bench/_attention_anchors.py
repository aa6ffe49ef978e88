"""The two anchors bench_tree_attention.py times beside our tree_attention: SDPA with a dense mask, and Flex.

SDPA: F.scaled_dot_product_attention with a dense boolean mask [B, 1, N, max P + N] and enable_gqa (the
default dispatch; the mask is built outside the timed call).

Flex: torch.compile(flex_attention) with a block mask of (prefix | ancestor lookup). Compiling is what costs
(seconds per shape on an H100), so each shape (B, N, KV length, heads, D, dtype, device) gets one mask
function, reading the case's lengths and ancestor bits from buffers it owns: the next case of that shape
copies its values in and runs the already compiled graph (a new mask function would recompile). Every case
reads the same KV length, max P + N of the grid's prefix (ragged rows mask the rest), so ragged and uniform
prefixes share a shape. `warm_up` compiles one shape ahead of any timing.
"""

import functools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec_kernels import reference


def ancestors(inputs: dict) -> torch.Tensor:
    """bool [B, N, N]: node j is node i itself or one of its ancestors."""
    q, parents = inputs["q"], inputs["parents"]
    batch, n = q.shape[:2]
    if parents is None:
        return torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device)).expand(batch, n, n)
    return reference.ancestor_mask(parents)


def kv_length(inputs: dict) -> int:
    """The KV positions the anchors read: every position any row may see (max P + N)."""
    return inputs["k_cache"].shape[2]


def visibility(inputs: dict) -> torch.Tensor:
    """bool [B, N, KV length]: what each node attends to (the SDPA mask)."""
    seq_lens, q = inputs["seq_lens"], inputs["q"]
    batch, n = q.shape[:2]
    length = kv_length(inputs)
    rel = torch.arange(length, device=q.device).view(1, 1, length) - seq_lens.view(batch, 1, 1)
    tail = ancestors(inputs).gather(2, rel.clamp(0, n - 1).expand(batch, n, length))
    return (rel < 0) | ((rel < n) & tail)


def sdpa_call(inputs: dict, scale: float):
    q = inputs["q"]
    mask = visibility(inputs).unsqueeze(1)  # [B, 1, N, L]
    q_t, k, v = q.transpose(1, 2), inputs["k_cache"], inputs["v_cache"]
    return lambda: F.scaled_dot_product_attention(q_t, k, v, attn_mask=mask, scale=scale,
                                                  enable_gqa=True).transpose(1, 2)


@functools.cache
def compiled_flex(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):  # the default limit silently falls back to eager after 8 shapes
            setattr(torch._dynamo.config, knob, 100_000)
    if device_type != "cuda":
        return flex_attention  # eager (smoke runs on the CPU only check the plumbing)
    return torch.compile(flex_attention, dynamic=False)


@dataclass
class FlexShape:
    """One compiled shape: the buffers its mask function reads, refilled by each case of the shape."""

    seq_lens: torch.Tensor  # [B] int64
    tree: torch.Tensor  # [B, N, N] bool ancestor bits
    mask_mod: object


def _shape_key(inputs: dict) -> tuple:
    q = inputs["q"]
    return (*q.shape, inputs["k_cache"].shape[1], kv_length(inputs), q.dtype, q.device)


@functools.cache
def flex_shape(key: tuple) -> FlexShape:
    batch, n, device = key[0], key[1], key[-1]
    seq_lens = torch.zeros(batch, dtype=torch.int64, device=device)
    tree = torch.zeros(batch, n, n, dtype=torch.bool, device=device)

    def mask_mod(b, h, q_idx, kv_idx):  # the prefix, then an N x N ancestor lookup
        rel = kv_idx - seq_lens[b]
        return (rel < 0) | ((rel < n) & tree[b, q_idx, rel.clamp(0, n - 1)])

    return FlexShape(seq_lens, tree, mask_mod)


def flex_call(inputs: dict, scale: float):
    """The compiled Flex call of this case: its shape's mask function over the case's values."""
    from torch.nn.attention.flex_attention import create_block_mask
    q = inputs["q"]
    batch, n = q.shape[:2]
    shape = flex_shape(_shape_key(inputs))
    shape.seq_lens.copy_(inputs["seq_lens"])
    shape.tree.copy_(ancestors(inputs))
    block_mask = create_block_mask(shape.mask_mod, batch, None, n, kv_length(inputs), device=q.device)
    flex = compiled_flex(q.device.type)
    q_t, k, v = q.transpose(1, 2), inputs["k_cache"], inputs["v_cache"]
    return lambda: flex(q_t, k, v, block_mask=block_mask, scale=scale, enable_gqa=True).transpose(1, 2)


def warm_up(inputs: dict, scale: float) -> float:
    """Compile this case's shape (if it is new) by one call; seconds taken, block mask included."""
    started = time.perf_counter()
    flex_call(inputs, scale)()
    if inputs["q"].device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started
