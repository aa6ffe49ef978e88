"""Tree / chain verification attention: N new tokens per row against a KV cache."""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..common import validate as check
from ..common.registry import custom_op, implementation, register, resolve

HALF_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@custom_op("specdec::tree_attention", mutates_args=())
def _tree_attention_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, parents: Optional[Tensor],
                       block_table: Optional[Tensor], sm_scale: float, backend: str) -> tuple[Tensor, Tensor]:
    return implementation("tree_attention", backend)(q, k_cache, v_cache, seq_lens, parents, block_table,
                                                     sm_scale=sm_scale)


@_tree_attention_op.register_fake
def _(q, k_cache, v_cache, seq_lens, parents, block_table, sm_scale, backend):
    batch, n, hq, _ = q.shape
    return torch.empty_like(q), q.new_empty(batch, n, hq, dtype=torch.float32)


def tree_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, parents: Tensor | None = None, *,
                   block_table: Tensor | None = None, sm_scale: float | None = None,
                   backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Attention of N draft tokens (a chain or a tree) per row over the row's KV cache.

    The N tokens' own K/V must already be written at logical positions seq_lens[b] ..
    seq_lens[b]+N-1 (node i at seq_lens[b] + i). Node i attends to the whole prefix
    [0, seq_lens[b]) and to itself and its ancestors among the N nodes; `parents=None` is
    a causal chain. An unused slot (parent -1, i > 0) attends to the prefix and itself.

    Two cache layouts:
    - contiguous (block_table None): k_cache, v_cache [B, Hkv, S_max, D], position s of
      row b at [b, :, s]; needs seq_lens[b] + N <= S_max.
    - paged (block_table given): k_cache, v_cache are page pools
      [num_pages, page_size, Hkv, D] (NHD pages; an HND pool [P, Hkv, page_size, D]
      passes as `.transpose(1, 2)`), position s of row b at page block_table[b, s //
      page_size], slot s % page_size; needs seq_lens[b] + N <= max_pages * page_size.
      Only the pages a row uses (its first ceil((seq_lens[b] + N) / page_size)
      entries) are read; on CPU they are checked to lie in [0, num_pages).
    Any strides are accepted as long as the last dimension (D) is contiguous.

    Args:
        q: [B, N, Hq, D] float16/bfloat16/float32 queries (RoPE already applied).
        k_cache, v_cache: [B, Hkv, S_max, D] or [num_pages, page_size, Hkv, D], q's dtype;
            Hq must be a multiple of Hkv (GQA).
        seq_lens: [B] int64/int32 (any stride), prefix lengths.
        parents: [B, N] int64/int32 (any strides) tree (see ops.tree_verify) or None for a chain.
        block_table: [B, max_pages] int32/int64 (any strides) page ids, or None for the contiguous layout.
        sm_scale: softmax scale (default 1/sqrt(D)).
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        out [B, N, Hq, D] in q's dtype, lse [B, N, Hq] float32 (natural-log
        log-sum-exp of the scaled scores, for merging partial attentions).

    Values the GPU cannot check without a host sync (seq_lens, parents, page ids) are
    clamped into range by the kernels: out-of-range input gives a wrong answer, never an
    out-of-bounds access.
    """
    op = "tree_attention"
    check.tensor(op, "q", q, shape=("B", "N", "Hq", "D"), dtypes=HALF_DTYPES)
    batch, n, hq, d = q.shape
    if block_table is None:
        check.tensor(op, "k_cache", k_cache, shape=(batch, "Hkv", "S_max", d), dtypes=(q.dtype,), device=q.device)
        hkv, s_max = k_cache.shape[1], k_cache.shape[2]
        check.tensor(op, "v_cache", v_cache, shape=(batch, hkv, s_max, d), dtypes=(q.dtype,), device=q.device)
        capacity, capacity_name = s_max, f"S_max={s_max}"
    else:
        capacity, capacity_name, hkv = _check_paged(op, q, k_cache, v_cache, block_table)
    if hkv == 0 or hq % hkv:
        check.fail(op, f"query heads Hq={hq} must be a multiple of KV heads Hkv={hkv}")
    if capacity < n:  # a shape check, so it also guards GPU calls
        check.fail(op, f"the cache holds {capacity_name} positions per row, fewer than the N={n} draft nodes")
    check.tensor(op, "seq_lens", seq_lens, shape=(batch,), dtypes=check.OP_INDEX_DTYPES, device=q.device,
                 last_dim_contiguous=False)
    if check.can_inspect(seq_lens) and batch and (int(seq_lens.min()) < 0 or int(seq_lens.max()) + n > capacity):
        check.fail(op, f"need 0 <= seq_lens[b] and seq_lens[b] + N <= {capacity_name} (N={n}, "
                       f"seq_lens in [{int(seq_lens.min())}, {int(seq_lens.max())}])")
    if block_table is not None:
        _check_page_ids(op, block_table, seq_lens, n, num_pages=k_cache.shape[0], page_size=k_cache.shape[1])
    if parents is not None:
        check.tensor(op, "parents", parents, shape=(batch, n), dtypes=check.OP_INDEX_DTYPES, device=q.device,
                     last_dim_contiguous=False)
        check.tree_parents(op, parents)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else check.real_number(op, "sm_scale", sm_scale)
    return _tree_attention_op(q, k_cache, v_cache, seq_lens, parents, block_table, scale,
                              resolve(op, backend, q.device, sizes=dict(B=batch, N=n, Hq=hq, Hkv=hkv, D=d, capacity=capacity,
                                                              paged=block_table is not None, dtype=q.dtype)))


def _check_paged(op: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor) -> tuple[int, str, int]:
    """Shapes of a paged call; returns (capacity per row, its description, Hkv)."""
    batch, d = q.shape[0], q.shape[3]
    check.tensor(op, "k_cache", k_cache, shape=("num_pages", "page_size", "Hkv", d), dtypes=(q.dtype,),
                 device=q.device)
    num_pages, page_size, hkv = k_cache.shape[:3]
    check.tensor(op, "v_cache", v_cache, shape=(num_pages, page_size, hkv, d), dtypes=(q.dtype,), device=q.device)
    if num_pages == 0 or page_size == 0:
        check.fail(op, f"a paged `k_cache` needs at least one page of at least one slot (got shape {list(k_cache.shape)})")
    check.tensor(op, "block_table", block_table, shape=(batch, "max_pages"), dtypes=check.OP_INDEX_DTYPES, device=q.device,
                 last_dim_contiguous=False)
    max_pages = block_table.shape[1]
    return max_pages * page_size, f"max_pages * page_size = {max_pages} * {page_size}", hkv


def _check_page_ids(op: str, block_table: Tensor, seq_lens: Tensor, n: int, *, num_pages: int, page_size: int) -> None:
    """The pages each row reads (its first ceil((seq_lens[b] + N) / page_size) entries) are real pages."""
    if not (check.can_inspect(block_table) and check.can_inspect(seq_lens)) or block_table.numel() == 0:
        return
    used_pages = (seq_lens.long() + n + page_size - 1) // page_size
    used = torch.arange(block_table.shape[1]).unsqueeze(0) < used_pages.unsqueeze(1)
    bad = used & ((block_table < 0) | (block_table >= num_pages))
    if bool(bad.any()):
        b, j = (int(v) for v in bad.nonzero()[0])
        check.fail(op, f"`block_table[{b}, {j}]` = {int(block_table[b, j])} is not a page id in [0, {num_pages})")


register("tree_attention", "torch", reference.tree_attention)
