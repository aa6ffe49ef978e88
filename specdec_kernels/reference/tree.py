"""Token-tree structure helpers shared by tree verification and tree attention.

A tree is `parents [B, N]` int64: node 0 is the root (the last accepted token, parent -1),
every other node i has parents[b, i] in [0, i) (topological order), and a slot i > 0 with
parent -1 is unused padding. The ancestor relation is derived here in torch; the GPU
backends derive the same bits on the device.
"""

import torch


def _jump_start(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pointer-jumping start: each node's parent, roots and unused slots pointing at themselves."""
    self_index = torch.arange(parents.shape[1], device=parents.device).expand_as(parents)
    has_parent = parents >= 0
    return torch.where(has_parent, parents.long(), self_index), has_parent


def _jump_rounds(n: int) -> int:
    """Rounds of pointer jumping that reach every ancestor: depths are < n, each round doubles the reach."""
    return max(0, (n - 1).bit_length())


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """int64 [B, N]: depth of each node (root 0); unused slots get depth 0.

    Pointer jumping: O(log N) tensor ops instead of a loop over the nodes (this runs on every tree
    verification forward, where each op is a kernel launch)."""
    pointer, has_parent = _jump_start(parents)
    depth = has_parent.long()  # distance to `pointer`
    for _ in range(_jump_rounds(parents.shape[1])):
        depth = depth + depth.gather(1, pointer)
        pointer = pointer.gather(1, pointer)
    return depth


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: mask[b, i, j] is True when j is i itself or one of its ancestors.

    parents=None callers use a lower-triangular chain instead. Pointer jumping, as tree_depths:
    after round r, row i holds its ancestors closer than 2^r and `pointer` its 2^r-th ancestor.
    """
    batch, n = parents.shape
    pointer, has_parent = _jump_start(parents)
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(batch, n, n).clone()
    mask |= torch.nn.functional.one_hot(pointer, n).bool() & has_parent.unsqueeze(-1)
    for _ in range(_jump_rounds(n)):
        mask = mask | mask.gather(1, pointer.unsqueeze(-1).expand(batch, n, n))
        pointer = pointer.gather(1, pointer)
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
