"""Reference tree/chain verification attention over a contiguous KV cache."""

import math

import torch

from .tree import ancestor_mask


def tree_attention(q, k_cache, v_cache, seq_lens, parents=None, *, sm_scale=None):
    """Each of the N new tokens attends to its row's whole prefix (seq_lens[b] tokens) plus
    its ancestors and itself among the N tokens, whose K/V sit at seq_lens[b] + node.

    Returns (out [B, N, Hq, D] in q's dtype, lse [B, N, Hq] float32, natural log of the
    softmax denominator of the scaled scores).
    """
    batch, n, hq, d = q.shape
    hkv = k_cache.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    if parents is None:
        tree = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device)).expand(batch, n, n)
    else:
        tree = ancestor_mask(parents)
    out = torch.empty_like(q)
    lse = torch.empty(batch, n, hq, dtype=torch.float32, device=q.device)
    for b in range(batch):
        prefix = int(seq_lens[b])
        keys = k_cache[b, :, : prefix + n].float().repeat_interleave(hq // hkv, dim=0)  # [Hq, L, D]
        values = v_cache[b, :, : prefix + n].float().repeat_interleave(hq // hkv, dim=0)
        scores = torch.einsum("nhd,hld->hnl", q[b].float(), keys) * scale  # [Hq, N, L]
        visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=q.device), tree[b]], dim=1)
        scores = scores.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [Hq, N]
        probs = torch.exp(scores - row_lse.unsqueeze(-1))
        out[b] = torch.einsum("hnl,hld->nhd", probs, values).to(q.dtype)
        lse[b] = row_lse.transpose(0, 1)
    return out, lse
