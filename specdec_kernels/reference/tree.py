"""Token-tree structure helpers shared by tree verification and tree attention.

A tree is `parents [B, N]` int64: node 0 is the root (the last accepted token, parent -1),
every other node i has parents[b, i] in [0, i) (topological order), and a slot i > 0 with
parent -1 is unused padding. The ancestor relation is derived here in torch; the GPU
backends derive the same bits on the device.
"""

import torch


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """int64 [B, N]: depth of each node (root 0); unused slots get depth 0."""
    batch, n = parents.shape
    depth = torch.zeros(batch, n, dtype=torch.int64, device=parents.device)
    for i in range(1, n):  # parents come before children, so one pass suffices
        p = parents[:, i]
        has_parent = p >= 0
        depth[:, i] = torch.where(has_parent, depth.gather(1, p.clamp(min=0).unsqueeze(1)).squeeze(1) + 1, 0)
    return depth


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: mask[b, i, j] is True when j is i itself or one of its ancestors.

    parents=None callers use a lower-triangular chain instead.
    """
    batch, n = parents.shape
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(batch, n, n).clone()
    for i in range(1, n):
        p = parents[:, i]
        has_parent = p >= 0
        inherited = mask[torch.arange(batch, device=parents.device), p.clamp(min=0)]
        mask[:, i] |= inherited & has_parent.unsqueeze(1)
    return mask


def chain_parents(batch: int, n: int, device=None) -> torch.Tensor:
    """parents of a chain of n nodes: [-1, 0, 1, ..., n-2] per row."""
    return (torch.arange(n, device=device) - 1).expand(batch, n).clone()


def max_tree_depth(parents: torch.Tensor) -> int:
    """The deepest node over the batch (a host sync for device tensors)."""
    return int(tree_depths(parents).max().item()) if parents.numel() else 0


def children_table(parents: torch.Tensor) -> torch.Tensor:
    """int64 [B, N, N-1]: children[b, i, r] is node i's r-th child in index order, or -1."""
    batch, n = parents.shape
    index = torch.arange(n, device=parents.device)
    same_parent_before = (parents.unsqueeze(2) == parents.unsqueeze(1)) & (index.view(1, 1, n) < index.view(1, n, 1))
    rank = same_parent_before.sum(dim=2)  # [B, N]: how many earlier siblings
    table = torch.full((batch, n, max(n - 1, 1)), -1, dtype=torch.int64, device=parents.device)
    has_parent = (parents >= 0) & (index.unsqueeze(0) > 0)
    rows, nodes = has_parent.nonzero(as_tuple=True)
    table[rows, parents[rows, nodes], rank[rows, nodes]] = nodes
    return table
