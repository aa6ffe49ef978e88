"""Reference KV-cache bookkeeping after verification."""

import torch


def kv_rollback(seq_lens, num_accepted):
    """Chain rollback: the verify pass wrote the root and g drafts at seq_lens[b] ...; keep
    the root and the accepted drafts. No data moves: rejected slots are simply reused."""
    return seq_lens + num_accepted.to(seq_lens.dtype) + 1


def kv_compact(k_caches, v_caches, seq_lens, accepted_nodes):
    """Move the accepted tree nodes' K/V (node i sits at seq_lens[b] + i) to the contiguous
    slots seq_lens[b], seq_lens[b] + 1, ... in every layer, in place; return the new lengths.

    accepted_nodes [B, M] lists the path (root first, increasing indices), padded with -1.
    """
    accepted_nodes = accepted_nodes.to(torch.int64)  # int32 or int64: indexing below wants int64
    batch, m = accepted_nodes.shape
    valid = accepted_nodes >= 0
    lengths = seq_lens.to(torch.int64).unsqueeze(1)
    src = lengths + accepted_nodes.clamp(min=0)
    dst = lengths + torch.arange(m, device=seq_lens.device).unsqueeze(0)
    rows = torch.arange(batch, device=seq_lens.device).unsqueeze(1).expand(batch, m)
    rows, src, dst = rows[valid], src[valid], dst[valid]
    for cache in (*k_caches, *v_caches):
        moved = cache[rows, :, src].clone()  # gather first: sources and destinations may overlap
        cache[rows, :, dst] = moved
    return seq_lens + valid.sum(dim=1).to(seq_lens.dtype)
