"""Reference tree/chain verification attention over a contiguous or paged KV cache."""

import math

import torch

from .tree import ancestor_mask


def row_kv(cache, b: int, length: int, block_table=None):
    """Row b's first `length` cache positions as [Hkv, length, D].

    cache is contiguous [B, Hkv, S_max, D] when block_table is None, else a page pool
    [num_pages, page_size, Hkv, D] whose position s of row b sits at page
    block_table[b, s // page_size], slot s % page_size.
    """
    if block_table is None:
        return cache[b, :, :length]
    page_size = cache.shape[1]
    pages = block_table[b, : -(-length // page_size)].long()
    return cache[pages].flatten(0, 1)[:length].transpose(0, 1)


def paged_from_contiguous(cache, page_size: int, *, generator=None, spare_pages: int = 0):
    """The contiguous cache [B, Hkv, S_max, D] copied into a page pool (for tests and benchmarks).

    Returns (pool [num_pages, page_size, Hkv, D], block_table [B, ceil(S_max / page_size)]
    int32) with the pages in a random order (`generator`: a CPU torch.Generator) and
    `spare_pages` extra pages. Slots no position maps to hold NaN, so a kernel that reads
    them shows it. row_kv(pool, b, s, block_table) == cache[b, :, :s].
    """
    batch, hkv, s_max, d = cache.shape
    max_pages = -(-s_max // page_size)
    num_pages = batch * max_pages + spare_pages
    order = torch.randperm(num_pages, generator=generator)[: batch * max_pages].to(cache.device)
    padded = cache.new_full((batch, hkv, max_pages * page_size, d), float("nan"))
    padded[:, :, :s_max] = cache
    pages = padded.view(batch, hkv, max_pages, page_size, d).permute(0, 2, 3, 1, 4).reshape(-1, page_size, hkv, d)
    pool = cache.new_full((num_pages, page_size, hkv, d), float("nan"))
    pool[order] = pages
    return pool, order.view(batch, max_pages).to(torch.int32)


# Rows are processed in groups whose score tensor stays under this many elements (CPU decoding runs this
# reference, so batching rows matters; the cap keeps 32k-token prefixes at large batch in memory).
_SCORE_ELEMENTS_PER_GROUP = 1 << 25


def tree_attention(q, k_cache, v_cache, seq_lens, parents=None, block_table=None, *, sm_scale=None):
    """Each of the N new tokens attends to its row's whole prefix (seq_lens[b] tokens) plus
    its ancestors and itself among the N tokens, whose K/V sit at seq_lens[b] + node.

    Returns (out [B, N, Hq, D] in q's dtype, lse [B, N, Hq] float32, natural log of the
    softmax denominator of the scaled scores).
    """
    batch, n, hq, d = q.shape
    hkv = k_cache.shape[1] if block_table is None else k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    if parents is None:
        tree = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device)).expand(batch, n, n)
    else:
        tree = ancestor_mask(parents.to(torch.int64))  # int32 or int64 parents
    lengths = seq_lens.to(device=q.device, dtype=torch.int64)
    span = int(lengths.max()) + n if batch else n  # host read: the reference is not graph-capturable
    rows_per_group = max(1, _SCORE_ELEMENTS_PER_GROUP // max(1, hq * n * span))
    out = torch.empty_like(q)
    lse = torch.empty(batch, n, hq, dtype=torch.float32, device=q.device)
    for first in range(0, batch, rows_per_group):
        rows = slice(first, min(batch, first + rows_per_group))
        out[rows], lse[rows] = _rows_attention(q[rows], _rows_kv(k_cache, rows, span, block_table),
                                               _rows_kv(v_cache, rows, span, block_table), lengths[rows],
                                               tree[rows], scale)
    return out, lse


def _rows_kv(cache, rows: slice, span: int, block_table):
    """Positions [0, span) of a group of rows as [R, Hkv, span, D] (slots past the cache end or a row's
    block table are clamped: they are masked out by _rows_attention before use)."""
    if block_table is None:
        window = cache[rows, :, :span]
        if window.shape[2] < span:  # the longest row ends at S_max: pad the view, never read past it
            window = torch.nn.functional.pad(window, (0, 0, 0, span - window.shape[2]))
        return window
    page_size = cache.shape[1]
    table = block_table[rows, : -(-span // page_size)].long()
    pages = cache[table]  # [R, pages, page_size, Hkv, D]
    return pages.flatten(1, 2)[:, :span].transpose(1, 2)


def _rows_attention(q, keys, values, lengths, tree, scale):
    """q [R, N, Hq, D]; keys/values [R, Hkv, span, D]; lengths [R]; tree [R, N, N] -> (out, lse)."""
    rows, n, hq, d = q.shape
    hkv, span = keys.shape[1], keys.shape[2]
    if rows == 0 or n == 0:  # nothing to attend from (torch's fused CPU kernel dies of SIGFPE on 0 query rows)
        return q.new_empty(rows, n, hq, d), torch.empty(rows, n, hq, dtype=torch.float32, device=q.device)
    position = torch.arange(span, device=q.device)
    node = position - lengths[:, None]  # [R, span]: which new token a slot holds (< 0: prefix)
    exists = node < n
    # visible[r, i, s]: prefix slot, or slot of node i's ancestor-or-self
    in_tree = (node >= 0) & exists
    tree_bits = tree.gather(2, node.clamp(0, n - 1)[:, None, :].expand(rows, n, span))
    visible = (node[:, None, :] < 0) | (in_tree[:, None, :] & tree_bits)  # [R, N, span]
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        return _rows_attention_flash_cpu(q, keys, values, exists, visible, scale)
    # slots no row owns may hold anything (NaN in tests): zero them so 0-probability * NaN cannot leak
    keys = torch.where(exists[:, None, :, None], keys.float(), 0.0)
    values = torch.where(exists[:, None, :, None], values.float(), 0.0)
    grouped_q = q.float().view(rows, n, hkv, hq // hkv, d)  # query head h reads KV head h // group
    scores = torch.einsum("rnkgd,rksd->rkgns", grouped_q, keys) * scale
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    row_lse = torch.logsumexp(scores, dim=-1)  # [R, Hkv, G, N]
    probs = torch.exp(scores - row_lse.unsqueeze(-1))
    out = torch.einsum("rkgns,rksd->rnkgd", probs, values).reshape(rows, n, hq, d)
    return out.to(q.dtype), row_lse.permute(0, 3, 1, 2).reshape(rows, n, hq)


# torch's fused CPU attention kernel, which also returns the log-sum-exp (private to aten, so looked up
# once and optional): CPU decoding runs this reference in every layer, and the einsum path above costs
# 2.5x (one row, one token) to 5x (batch 4, 5 tokens, 300-token prefix) as much.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _rows_attention_flash_cpu(q, keys, values, exists, visible, scale):
    """_rows_attention on the CPU through _FLASH_CPU, in float32 (its 16-bit path scales q in the
    input dtype, off by ~1e-4 in the lse): lse in natural log, out in q's dtype. GQA folds the G
    query heads of a KV head into its query rows ([R, Hkv, G*N, D]), so K/V are not repeated."""
    rows, n, hq, d = q.shape
    hkv, span = keys.shape[1], keys.shape[2]
    group = hq // hkv
    grouped_q = q.float().view(rows, n, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(rows, hkv, group * n, d)
    owned = exists[:, None, :, None]  # unowned slots zeroed: 0-probability * NaN would leak
    keys, values = (torch.where(owned, cache.float(), 0.0) for cache in (keys, values))
    bias = torch.zeros(rows, group, n, span).masked_fill_(~visible[:, None], float("-inf"))
    out, lse = _FLASH_CPU(grouped_q, keys, values, 0.0, False, attn_mask=bias.view(rows, 1, group * n, span),
                          scale=scale)[:2]
    out = out.view(rows, hkv, group, n, d).permute(0, 3, 1, 2, 4).reshape(rows, n, hq, d)
    return out.to(q.dtype), lse.view(rows, hkv, group, n).permute(0, 3, 1, 2).reshape(rows, n, hq)
