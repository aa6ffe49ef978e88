"""Helpers for tests/test_integrations_sglang.py: SGLang-layout trees and a plain-Python model of
SGLang's two tree kernels (written from their documented semantics, one row and one sibling at a time)."""

import numpy as np
import torch


def lists_from_children(children: list[list[int]], n: int) -> tuple[list[int], list[int]]:
    """children[i] = node i's children in list order -> (first child, next sibling) per node."""
    first, sibling = [-1] * n, [-1] * n
    for node, kids in enumerate(children):
        if kids:
            first[node] = kids[0]
            for a, b in zip(kids, kids[1:]):
                sibling[a] = b
    return first, sibling


def kary_children(n: int, k: int) -> list[list[int]]:
    """Breadth-first k-ary tree of n nodes, siblings in index order."""
    children, queue, free = [[] for _ in range(n)], [0], 1
    while queue and free < n:
        node = queue.pop(0)
        for _ in range(min(k, n - free)):
            children[node].append(free)
            queue.append(free)
            free += 1
    return children


def star_children(n: int, k: int) -> list[list[int]]:
    children = [[] for _ in range(n)]
    children[0] = list(range(1, min(k, n - 1) + 1))
    return children


def random_children(n: int, k: int, gen: torch.Generator, relabel: bool = True) -> list[list[int]]:
    """A random tree with out-degree <= k, siblings in random list order; with `relabel`, the
    non-root nodes get random labels too (a parent may carry a larger label than its child)."""
    children = [[] for _ in range(n)]
    for node in range(1, n):
        open_nodes = [i for i in range(node) if len(children[i]) < k]
        parent = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=gen))]
        children[parent].append(node)
    for kids in children:
        kids[:] = [kids[j] for j in torch.randperm(len(kids), generator=gen).tolist()]
    if relabel and n > 2:
        label = [0] + (torch.randperm(n - 1, generator=gen) + 1).tolist()
        relabelled = [[] for _ in range(n)]
        for node, kids in enumerate(children):
            relabelled[label[node]] = [label[c] for c in kids]
        children = relabelled
    return children


def tree_tensors(children_per_row: list[list[list[int]]], n: int):
    """(retrive_index, retrive_next_token, retrive_next_sibling) int64 [B, N], SGLang's b*N + i slots."""
    firsts, siblings = zip(*(lists_from_children(c, n) for c in children_per_row))
    batch = len(children_per_row)
    index = torch.arange(batch * n).view(batch, n)
    return index, torch.tensor(firsts), torch.tensor(siblings)


def distinct_sibling_tokens(children_per_row, n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[B, N] int64 candidates whose siblings never share a token (root 0)."""
    out = torch.zeros(len(children_per_row), n, dtype=torch.int64)
    for b, children in enumerate(children_per_row):
        for kids in children:
            picks = torch.randperm(vocab, generator=gen)[: len(kids)]
            for node, token in zip(kids, picks.tolist()):
                out[b, node] = token
    return out


def outputs(batch: int, n: int, steps: int, dtype=torch.int32, slots: int | None = None):
    """Fresh in-place outputs as SGLang's callers allocate them."""
    return (torch.full((slots or batch * n,), -1, dtype=dtype), torch.full((batch, steps), -1, dtype=dtype),
            torch.zeros(batch, dtype=dtype))


def sglang_greedy_model(predicts, accept_index, accept_token_num, candidates, retrive_index, next_token, next_sibling,
                        target_predict):
    """SGLang's verify_tree_greedy, row by row; target_predict is read at the flat slot
    retrive_index[b, i], as SGLang's kernel reads it. Returns new (predicts, accept_index, accept_token_num)."""
    predicts, accept_index, accept_token_num = predicts.clone(), accept_index.clone(), accept_token_num.clone()
    flat_target = target_predict.reshape(-1)
    steps = accept_index.shape[1]
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        node, accepted = 0, 0
        for _ in range(1, steps):
            child = int(next_token[b, node])
            while child != -1:
                if int(candidates[b, child]) == int(flat_target[last]):
                    predicts[last] = int(flat_target[last])
                    accepted += 1
                    last = int(retrive_index[b, child])
                    accept_index[b, accepted] = last
                    node = child
                    break
                child = int(next_sibling[b, child])
            if child == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = int(flat_target[last])
    return predicts, accept_index, accept_token_num


def sglang_sampling_model(predicts, accept_index, accept_token_num, candidates, retrive_index, next_token,
                          next_sibling, coins, final_coins, target_probs, draft_probs=None, threshold_single=1.0,
                          threshold_acc=1.0):
    """SGLang's tree_speculative_sampling_target_only, row by row, with its float32 acceptance
    arithmetic, its writes into draft_probs and its token V - 1 for an empty residual.
    Returns new (predicts, accept_index, accept_token_num, draft_probs after the call)."""
    predicts, accept_index, accept_token_num = predicts.clone(), accept_index.clone(), accept_token_num.clone()
    probs = target_probs.float().numpy()
    draft = np.zeros_like(probs) if draft_probs is None else draft_probs.float().numpy().copy()
    coins, final_coins = coins.float().numpy(), final_coins.float().numpy()
    single = np.float32(threshold_single)
    acc_scale = max(np.float32(threshold_acc), np.float32(1e-9))
    steps, vocab = accept_index.shape[1], probs.shape[2]
    for b in range(candidates.shape[0]):
        row, coin = 0, coins[b, 0]
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        for _ in range(1, steps):
            child = int(next_token[b, row])
            prob_acc = np.float32(0.0)
            while child != -1:
                token = int(candidates[b, child])
                p = probs[b, row, token]
                prob_acc = np.float32(prob_acc + p)
                if coin <= np.float32(prob_acc / acc_scale) or p >= single:
                    predicts[last] = token
                    accepted += 1
                    last = int(retrive_index[b, child])
                    accept_index[b, accepted] = last
                    row, coin = child, coins[b, child]
                    break
                draft[b, row, token] = p
                child = int(next_sibling[b, child])
            if child == -1:
                break
        accept_token_num[b] = accepted
        residual = probs[b, row].astype(np.float64)
        if accepted != steps - 1:
            residual = np.maximum(residual - draft[b, row], 0.0)
        cdf = np.cumsum(residual)
        picks = np.nonzero((cdf > final_coins[b] * cdf[-1]) & (residual > 0))[0]
        predicts[last] = int(picks[0]) if len(picks) else vocab - 1
    return predicts, accept_index, accept_token_num, torch.from_numpy(draft)


def sglang_example():
    """The two-row tree of SGLang's kernel tests: (candidates, retrive_index, next_token,
    next_sibling, target logits [2, 6, 20]). Row 0: root -> {1 -> 2, 3 -> 4 -> 5}; row 1: root's
    list is 4 then 1 (not index order), 4 -> 5, 1 -> 2 -> 3. The target's favourite token: 3 at
    row 0's root, 4 after node 3, 5 after node 4; 11 at row 1's root, 12 after node 4; 18 elsewhere."""
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    children = [[[1, 3], [2], [], [4], [5], []], [[4, 1], [2], [3], [], [5], []]]
    retrive_index, next_token, next_sibling = tree_tensors(children, 6)
    favourite = torch.full((2, 6), 18)
    favourite[0, 0], favourite[0, 3], favourite[0, 4], favourite[1, 0], favourite[1, 4] = 3, 4, 5, 11, 12
    logits = torch.ones(2, 6, 20).scatter_(2, favourite.unsqueeze(2), 10.0)
    return candidates, retrive_index, next_token, next_sibling, logits
