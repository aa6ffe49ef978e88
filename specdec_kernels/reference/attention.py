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
        tree = ancestor_mask(parents)
    out = torch.empty_like(q)
    lse = torch.empty(batch, n, hq, dtype=torch.float32, device=q.device)
    for b in range(batch):
        prefix = int(seq_lens[b])
        keys = row_kv(k_cache, b, prefix + n, block_table).float().repeat_interleave(hq // hkv, dim=0)  # [Hq, L, D]
        values = row_kv(v_cache, b, prefix + n, block_table).float().repeat_interleave(hq // hkv, dim=0)
        scores = torch.einsum("nhd,hld->hnl", q[b].float(), keys) * scale  # [Hq, N, L]
        visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=q.device), tree[b]], dim=1)
        scores = scores.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [Hq, N]
        probs = torch.exp(scores - row_lse.unsqueeze(-1))
        out[b] = torch.einsum("hnl,hld->nhd", probs, values).to(q.dtype)
        lse[b] = row_lse.transpose(0, 1)
    return out, lse
