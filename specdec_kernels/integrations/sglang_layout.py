"""SGLang's tree layout in ours: its first-child / next-sibling lists renumbered into our `parents`
layout (`Tree`), SGLang's per-depth coins turned into the per-sibling coins our op consumes
(`conditional_coins`), the lossless call of `ops.tree_rejection_sample` on the result (`sample_with_op`),
and SGLang's in-place outputs written back (`write_back`). docs/flashinfer-sglang.md has the why."""

import torch
from torch import Tensor

from .. import ops
from ..common.sampling import WEIGHT_SCALE

BELOW_ONE = 1.0 - 2.0**-53  # the largest float64 < 1


class Tree:
    """A row-wise renumbering of SGLang's lists into our parents layout.

    old numbering (SGLang's): parent [B, N] (-1: root or unused), rank [B, N] (place in the
    sibling list), used [B, N] (reachable from the root within max_depth);
    pos [B, N]: new index of each old node; inverse [B, N]: old node at each new index;
    parents [B, N]: our parents layout in the new numbering (children of a node in list order).
    """

    def __init__(self, next_token: Tensor, next_sibling: Tensor, max_depth: int):
        batch, n = next_token.shape
        device = next_token.device
        index = torch.arange(n, device=device).expand(batch, n).contiguous()
        rounds = max(0, (n - 1).bit_length())  # pointer jumping reaches 2^rounds >= N - 1 links
        # links to nothing, to the root, out of range (unchecked GPU input) and the root's sibling
        # link go to a dump column n
        first = next_token.long()
        first = torch.where((first >= 1) & (first < n), first, n)
        sibling = next_sibling.long()
        sibling = torch.where((sibling >= 1) & (sibling < n) & (index > 0), sibling, n)
        empty = torch.full((batch, n + 1), -1, dtype=torch.int64, device=device)
        parent_of_first = empty.clone().scatter_(1, first, index)[:, :n]
        previous = empty.scatter_(1, sibling, index)[:, :n]
        # each node's sibling rank and the head of its sibling list
        head = torch.where(previous >= 0, previous, index)
        rank = (previous >= 0).long()
        for _ in range(rounds):
            rank = rank + rank.gather(1, head)
            head = head.gather(1, head)
        parent = torch.where(index > 0, parent_of_first.gather(1, head), -1)
        # depth, and whether the parent chain ends at the root
        pointer = torch.where(parent >= 0, parent, index)
        depth = (parent >= 0).long()
        for _ in range(rounds):
            depth = depth + depth.gather(1, pointer)
            pointer = pointer.gather(1, pointer)
        used = (pointer == 0) & (depth <= max_depth)
        rank = rank.clamp(max=max(n - 1, 0))
        # breadth-first renumbering, siblings in list order
        pos = torch.where(index == 0, 0, -1)
        count = torch.ones(batch, 1, dtype=torch.int64, device=device)
        beyond = n * n + n
        for level in range(1, min(max_depth, n - 1) + 1):
            at_level = used & (depth == level)
            key = torch.where(at_level, pos.gather(1, parent.clamp(min=0)) * n + rank, beyond)
            order = torch.argsort(key, dim=1, stable=True)
            slot = torch.empty_like(order).scatter_(1, order, index)
            pos = torch.where(at_level, count + slot, pos)
            count = count + at_level.sum(1, keepdim=True)
        unplaced = pos < 0
        pos = torch.where(unplaced, count + torch.cumsum(unplaced.long(), 1) - 1, pos)
        self.pos = pos
        self.inverse = torch.empty_like(pos).scatter_(1, pos, index)
        parent_at = torch.where(used & (index > 0), pos.gather(1, parent.clamp(min=0)), -1)
        self.parents = torch.empty_like(pos).scatter_(1, pos, parent_at)
        self.parent = torch.where(used, parent, -1)
        self.rank, self.used, self.n = rank, used, n

    def children(self) -> Tensor:
        """[B, N, K] old ids: children[b, i, r] is node i's r-th child in list order, or -1."""
        batch, n = self.parent.shape
        k = max(n - 1, 1)
        child = self.used & (self.parent >= 0)
        slot = torch.where(child, self.parent.clamp(min=0) * (k + 1) + self.rank.clamp(max=k - 1), k)  # k: dump
        index = torch.arange(n, device=self.parent.device).expand(batch, n).contiguous()
        table = torch.full((batch, n * (k + 1)), -1, dtype=torch.int64, device=self.parent.device)
        table.scatter_(1, slot, torch.where(child, index, -1))
        return table.view(batch, n, k + 1)[:, :, :k]

    def to_old(self, nodes: Tensor) -> Tensor:
        """Our accepted_nodes (new numbering, -1 padded) as SGLang's node ids (-1 padded)."""
        return torch.where(nodes >= 0, self.inverse.gather(1, nodes.clamp(min=0)), -1)


def write_back(predicts: Tensor, accept_index: Tensor, accept_token_num: Tensor, retrive_index: Tensor,
                path: Tensor, num: Tensor, emitted: Tensor) -> None:
    """SGLang's in-place outputs from path [B, S] (old node ids, root first), num [B] and
    emitted [B, S] (emitted[b, j] = the token after path node j, for j <= num[b])."""
    steps = accept_index.shape[1]
    on_path = torch.arange(steps, device=path.device).unsqueeze(0) <= num.unsqueeze(1)
    slots = retrive_index.long().gather(1, path.clamp(min=0))
    accept_index.copy_(torch.where(on_path, slots, accept_index.long()))
    accept_token_num.copy_(num)
    # entries off the path rewrite the root's slot with the root's own value (no mask, no sync)
    target = torch.where(on_path, slots, slots[:, :1]).clamp(0, predicts.shape[0] - 1)
    values = torch.where(on_path, emitted, emitted[:, :1])
    predicts.index_put_((target.reshape(-1),), values.reshape(-1).to(predicts.dtype))


def conditional_coins(tree: Tree, tokens: Tensor, target_probs: Tensor, coins: Tensor) -> Tensor:
    """[B, N] float64, old numbering: the coin our rule consumes at each node so that it accepts
    exactly when SGLang's per-depth coin does (threshold 1). SGLang accepts sibling k of parent
    a iff u_a <= p_a(x_1) + ... + p_a(x_k); ours accepts sibling 1 iff u < p_a(x_1) and later
    sibling k iff u_k * T_{k-1} < w(x_k), with w = floor(p_a * 2^40) and T_{k-1} the weight left
    after the rejected siblings. So u_1 = u_a and u_k = (u_a * 2^40 - w(x_1..x_{k-1})) / T_{k-1}."""
    batch, n, vocab = target_probs.shape
    rows = torch.arange(batch, device=tokens.device).unsqueeze(1)
    parent = tree.parent.clamp(min=0)
    u = coins.double().gather(1, parent)
    in_range = (tokens >= 0) & (tokens < vocab)
    p_token = target_probs[rows, parent, tokens.clamp(0, vocab - 1)].float()
    weight = torch.floor(torch.nan_to_num(p_token, nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0).double()
                         * WEIGHT_SCALE)
    weight = torch.where(in_range & tree.used, weight, 0.0)
    earlier = ((tree.parent.unsqueeze(2) == tree.parent.unsqueeze(1)) & tree.used.unsqueeze(1)
               & (tree.rank.unsqueeze(1) < tree.rank.unsqueeze(2)))  # [b, c, j]: j an earlier sibling of c
    before = (earlier.double() * weight.unsqueeze(1)).sum(2)  # exact: integers below 2^53
    total = target_probs.sum(2, dtype=torch.float64).gather(1, parent) * WEIGHT_SCALE
    later = (u * WEIGHT_SCALE - before) / (total - before)
    coin = torch.where(tree.rank == 0, u, later)
    return torch.nan_to_num(coin, nan=0.0, posinf=BELOW_ONE, neginf=0.0).clamp(0.0, BELOW_ONE)


def sample_with_op(tree, tokens, target_probs, draft_probs, uniform_samples, final_coins, steps, backend):
    """Thresholds 1: our tree_rejection_sample on the renumbered tree. Returns (path, num, emitted)."""
    batch, n, vocab = target_probs.shape
    rows = torch.arange(batch, device=tokens.device).unsqueeze(1)
    inverse = tree.inverse
    target = target_probs[rows, inverse]
    tree_tokens = torch.where(tree.parents >= 0, tokens.gather(1, inverse), -1)
    in_range = (tree_tokens >= 0) & (tree_tokens < vocab)
    one_hot = torch.zeros_like(target).scatter_(2, tree_tokens.clamp(0, vocab - 1).unsqueeze(2),
                                                in_range.unsqueeze(2).to(target.dtype))
    coins = conditional_coins(tree, tokens, target_probs, uniform_samples)
    draft = one_hot
    if draft_probs is not None:
        real = (draft_probs != 0).flatten(1).any(1)  # [B]: rows with draft probabilities
        # our layout: row c is the distribution node c was drawn from, SGLang's row of c's parent
        drawn_from = draft_probs[rows, tree.parent.clamp(min=0).gather(1, inverse)]
        draft = torch.where(real.view(batch, 1, 1), drawn_from, one_hot)
        own = uniform_samples.double().clamp(0.0, BELOW_ONE)  # real drafts: node c's coin is column c
        coins = torch.where(real.unsqueeze(1), own, coins)
    uniforms = coins.gather(1, inverse)
    uniforms[:, 0] = final_coins.double().clamp(0.0, BELOW_ONE)
    emitted, num, nodes = ops.tree_rejection_sample(target, draft, tree_tokens, tree.parents, uniforms=uniforms,
                                                    max_depth=steps - 1, backend=backend)
    return tree.to_old(nodes), num, emitted
