"""SGLang's tree-verification kernels with SGLang's argument layout, running on our ops.

`verify_tree_greedy` and `tree_speculative_sampling_target_only` take the arguments of
`sgl_kernel`'s functions of the same names and write their outputs in place, so a call site
(or a `HookRegistry` REPLACE hook) can swap SGLang's kernels for ours. Nothing here imports
SGLang.

SGLang's layout, per row b of B, N tree nodes (node 0 the root, the last verified token):
  candidates [B, N]             token of each node (the root's is ignored).
  retrive_next_token [B, N]     first child of each node, -1 for none.
  retrive_next_sibling [B, N]   next sibling of each node, -1 for none; siblings are tried in
                                this list order.
  retrive_index [B, N]          each node's slot in the flat `predicts` buffer (SGLang: b*N + i).
  predicts [P] (in place)       predicts[retrive_index[b, i]] = the token after node i, for every
                                node i on the accepted path (the last one gets the new token);
                                other slots are left as they were.
  accept_index [B, S] (in place)   retrive_index of the root, then of each accepted node; later
                                   entries are left as they were. S - 1 bounds the accepted depth.
  accept_token_num [B] (in place)  number of accepted draft nodes.

Translation: the linked lists become our `parents [B, N]` layout with pointer jumping (each
node's sibling rank and list head, then its parent and depth), and the nodes are renumbered
breadth first with siblings in list order (our ops try children in index order and need a
parent before its children); nodes deeper than S - 1 or not reachable from the root become
unused slots. Our accepted nodes are mapped back through the renumbering into accept_index,
accept_token_num and predicts. All of it is vectorised torch (loops over tree depth only),
with no host sync outside the CPU-only value checks.

Sampling. With SGLang's default thresholds (1.0, 1.0) SGLang's rule is lossless: one coin u
per depth (uniform_samples[b, parent]), sibling k accepted iff u <= p(x_1) + ... + p(x_k),
the new token drawn from p with the rejected siblings removed. That is our
`ops.tree_rejection_sample` with the drafts as one-hot distributions (what SGLang's all-zero
`draft_probs` stands for: its acceptance never reads them; read literally, q = 0 would make
our rule accept any token with p > 0). The call runs our op with one-hot drafts and each
SGLang coin turned into the conditional coin our rule consumes for each sibling, so the same
uniforms give SGLang's tokens. Thresholds below 1 select SGLang's lossy rule (accept sibling
k iff u <= (p(x_1) + ... + p(x_k)) / threshold_acc or p(x_k) >= threshold_single, in float32
as SGLang computes it), reproduced exactly; the new token is then drawn with our op.
LOSSY: with thresholds below 1 the output no longer follows the target distribution.

Beyond SGLang: a row whose `draft_probs` are not all zero is verified with those draft
probabilities (SGLang's source marks using them as work still to do): draft_probs[b, i] is the
draft distribution after node i (SGLang's layout, like target_probs), node i's children are
taken as i.i.d. draws from it, and our op runs SpecInfer-style recursive rejection sampling,
lossless. A node's coin is then its own column, uniform_samples[b, c]. All-zero rows in the
same batch stay target-only. (At thresholds below 1, draft_probs are used as SGLang uses them:
subtracted in the final residual only.)

Remaining differences from SGLang's kernels (each has a test in tests/test_integrations_sglang.py):
 1. Boundaries. Our acceptance is strict and in 2^-40 fixed point (SGLang: `<=` on float32
    sums), so a coin exactly on, or within ~1e-7 of, a cumulative boundary may decide the
    other way; the new token likewise (our fixed-point inverse CDF vs SGLang's float32 one).
    In particular a coin of exactly 0 never accepts a sibling of target probability 0 (SGLang
    accepts it: sglang #35771).
 2. Duplicate sibling tokens: SGLang gives a repeated token a second acceptance interval
    (lossy); ours never accepts a token already rejected at that node (lossless), and the
    later siblings of that node no longer follow SGLang's coin.
 3. `draft_probs` is read only: SGLang writes p(x) into draft_probs[b, node, x] for every
    rejected sibling x (its scratch space); ours leaves the caller's tensor as it was.
 4. Real draft probabilities (rows not all zero) are used as described above; SGLang
    ignores them in acceptance and subtracts them from p in its final residual.
 5. An empty residual (possible only for rows that do not sum to 1) draws from p, then the
    argmax; SGLang emits token V - 1 (older builds: the last positive token).
 6. `verify_tree_greedy` reads target_predict[b, i] for node i; SGLang's kernel reads the flat
    target_predict at retrive_index[b, i], the same slot for SGLang's retrive_index = b*N + i.
 7. Dtypes: index inputs may be int64 or int32, the in-place outputs int32 or int64, the
    probabilities float32, float16 or bfloat16 (SGLang: int64 inputs, int32 outputs, float32).
 8. `deterministic` is accepted and ignored: our kernels are always deterministic.
 9. Values are checked on CPU tensors (one-line ValueError: links out of range, a node linked
    twice, a link to the root, retrive_index outside predicts, token ids outside [0, V),
    coins outside [0, 1), thresholds outside [0, 1]); SGLang hangs on a cyclic sibling list
    and reads out of bounds. On a GPU nothing is inspected (no sync) and every index is
    clamped into range.
10. Cost: SGLang runs one kernel; ours runs a few small torch ops on [B, N] and [B, N, N]
    index tensors, one [B, N, V] gather of target_probs into the renumbered order and one
    [B, N, V] one-hot draft tensor (two more [B, N, V] temporaries when draft_probs is passed:
    the all-zero test and the per-row choice), then our kernel; no host sync.
Also: `backend=` (keyword only) picks our backend; both of SGLang's spellings of the list
arguments (`retrive_*`, `retrieve_*`) are accepted as keywords.
"""

import functools

import torch
from torch import Tensor

from .. import ops
from ..ops import _validate as check

# Our ops' fixed-point sampling scale (reference/_sampling.py, WEIGHT_SCALE; a test keeps them equal).
_WEIGHT_SCALE = 2.0**40
_BELOW_ONE = 1.0 - 2.0**-53  # the largest float64 < 1
_SPELLINGS = {"retrieve_index": "retrive_index", "retrieve_next_token": "retrive_next_token",
              "retrieve_next_sibling": "retrive_next_sibling"}
_PROB_DTYPES = check.FLOAT_DTYPES
_INDEX = check.OP_INDEX_DTYPES


def _either_spelling(fn):
    """Accept SGLang's `retrieve_*` keyword spelling (some of its releases) for `retrive_*`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for alias, name in _SPELLINGS.items():
            if alias in kwargs:
                if name in kwargs:
                    raise TypeError(f"sglang.{fn.__name__}: pass `{name}` or `{alias}`, not both")
                kwargs[name] = kwargs.pop(alias)
        return fn(*args, **kwargs)
    return wrapper


# ----------------------------------------------------------------------------- validation


def _check_common(op, predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                  retrive_next_sibling):
    check.tensor(op, "candidates", candidates, shape=("B", "N"), dtypes=_INDEX, last_dim_contiguous=False)
    batch, n = candidates.shape
    if n == 0:
        check.fail(op, "`candidates` needs at least the root node (N >= 1)")
    device = candidates.device
    for name, x in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        check.tensor(op, name, x, shape=(batch, n), dtypes=_INDEX, device=device, last_dim_contiguous=False)
    check.tensor(op, "predicts", predicts, shape=("P",), dtypes=_INDEX, device=device, last_dim_contiguous=False)
    check.tensor(op, "accept_index", accept_index, shape=(batch, "S"), dtypes=_INDEX, device=device,
                 last_dim_contiguous=False)
    check.tensor(op, "accept_token_num", accept_token_num, shape=(batch,), dtypes=_INDEX, device=device,
                 last_dim_contiguous=False)
    steps = accept_index.shape[1]
    if steps == 0:
        check.fail(op, "`accept_index` needs at least one column (the root): [B, S] with S >= 1")
    if predicts.shape[0] == 0 and batch > 0:
        check.fail(op, "`predicts` is empty: it needs a slot for every retrive_index")
    if check.can_inspect(candidates) and batch > 0:
        _check_lists(op, retrive_next_token, retrive_next_sibling)
        low, high = int(retrive_index.min()), int(retrive_index.max())
        if low < 0 or high >= predicts.shape[0]:
            check.fail(op, f"`retrive_index` holds slots outside `predicts` [0, {predicts.shape[0]}) "
                           f"(min {low}, max {high})")
    return batch, n, steps


def _check_lists(op, next_token, next_sibling):
    """The first-child / next-sibling lists form a tree under node 0 (CPU tensors only)."""
    batch, n = next_token.shape
    for name, links in (("retrive_next_token", next_token), ("retrive_next_sibling", next_sibling)):
        bad = (links < -1) | (links >= n)
        if bool(bad.any()):
            b, i = (int(v) for v in bad.nonzero()[0])
            check.fail(op, f"`{name}[{b}, {i}]` = {int(links[b, i])} is not a node in [0, {n}) or -1")
    siblings = next_sibling.long().clone()
    siblings[:, 0] = -1  # the root's sibling link is never read (as in SGLang)
    for name, links in (("retrive_next_token", next_token.long()), ("retrive_next_sibling", siblings)):
        to_root = links == 0
        if bool(to_root.any()):
            b, i = (int(v) for v in to_root.nonzero()[0])
            check.fail(op, f"`{name}[{b}, {i}]` = 0 links to the root, which is no node's child or sibling")
    incoming = torch.zeros(batch, n + 1, dtype=torch.int64)
    for links in (next_token.long(), siblings):
        incoming.scatter_add_(1, torch.where(links >= 0, links, n), torch.ones_like(links))
    twice = incoming[:, :n] > 1
    if bool(twice.any()):
        b, i = (int(v) for v in twice.nonzero()[0])
        check.fail(op, f"node {i} of row {b} is linked {int(incoming[b, i])} times by retrive_next_token / "
                       "retrive_next_sibling: the lists must form a tree")


def _check_thresholds(op, threshold_single, threshold_acc, deterministic):
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        value = check.real_number(op, name, value, minimum=0.0)
        if value > 1.0:
            check.fail(op, f"`{name}` must lie in [0, 1] (got {value!r})")
    if not isinstance(deterministic, bool):
        check.fail(op, f"`deterministic` must be a bool (got {type(deterministic).__name__})", TypeError)
    return float(threshold_single), float(threshold_acc)


# ----------------------------------------------------------------------------- translation


class _Tree:
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


def _write_back(predicts: Tensor, accept_index: Tensor, accept_token_num: Tensor, retrive_index: Tensor,
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


# ----------------------------------------------------------------------------- greedy


@_either_spelling
def verify_tree_greedy(predicts: Tensor, accept_index: Tensor, accept_token_num: Tensor, candidates: Tensor,
                       retrive_index: Tensor, retrive_next_token: Tensor, retrive_next_sibling: Tensor,
                       target_predict: Tensor, *, backend: str = "auto") -> None:
    """SGLang's `verify_tree_greedy`: from the root, follow the first child (in sibling-list
    order) whose token equals the target's prediction at the current node, up to S - 1 nodes;
    the new token is the target's prediction at the last accepted node. Runs
    `ops.tree_greedy_verify`. Writes its outputs in place, returns None.

    Args:
        predicts: [P] int32 (or int64), in place: predicts[retrive_index[b, i]] = the token after
            node i for each node i on the accepted path; other slots untouched.
        accept_index: [B, S] int32 (or int64), in place: retrive_index of the root and of each
            accepted node; later columns untouched. S - 1 bounds the accepted depth.
        accept_token_num: [B] int32 (or int64), in place: accepted draft nodes per row.
        candidates: [B, N] int64 (or int32): token of each node (node 0, the root, ignored).
        retrive_index: [B, N] int64 (or int32): each node's slot in `predicts`, in [0, P).
        retrive_next_token: [B, N] int64 (or int32): first child of each node, or -1.
        retrive_next_sibling: [B, N] int64 (or int32): next sibling of each node, or -1.
        target_predict: [B, N] int64 (or int32): the target's greedy token after each node.
        backend: "auto" | "torch" | "triton" | "cuda" (our op's backend).
    """
    op = "sglang.verify_tree_greedy"
    batch, n, steps = _check_common(op, predicts, accept_index, accept_token_num, candidates, retrive_index,
                                    retrive_next_token, retrive_next_sibling)
    check.tensor(op, "target_predict", target_predict, shape=(batch, n), dtypes=_INDEX, device=candidates.device,
                 last_dim_contiguous=False)
    if batch == 0:
        return
    tree = _Tree(retrive_next_token, retrive_next_sibling, steps - 1)
    tokens, target = candidates.long(), target_predict.long()
    # tokens only matter through equality: class c = the first node whose candidate equals it
    # (class N: no node's), so the logits need N + 1 classes instead of the vocabulary
    token_class = (tokens.unsqueeze(2) == tokens.unsqueeze(1)).to(torch.int8).argmax(2)
    hits = target.unsqueeze(2) == tokens.unsqueeze(1)
    target_class = torch.where(hits.any(2), hits.to(torch.int8).argmax(2), n)
    logits = torch.zeros(batch, n, n + 1, device=candidates.device).scatter_(  # one_hot would sync to check
        2, target_class.gather(1, tree.inverse).unsqueeze(2), 1.0)
    tree_tokens = torch.where(tree.parents >= 0, token_class.gather(1, tree.inverse), -1)
    _, num, nodes = ops.tree_greedy_verify(logits, tree_tokens, tree.parents, max_depth=steps - 1, backend=backend)
    path = tree.to_old(nodes)
    _write_back(predicts, accept_index, accept_token_num, retrive_index, path, num,
                target.gather(1, path.clamp(min=0)))


# ----------------------------------------------------------------------------- sampling


def _conditional_coins(tree: _Tree, tokens: Tensor, target_probs: Tensor, coins: Tensor) -> Tensor:
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
                         * _WEIGHT_SCALE)
    weight = torch.where(in_range & tree.used, weight, 0.0)
    earlier = ((tree.parent.unsqueeze(2) == tree.parent.unsqueeze(1)) & tree.used.unsqueeze(1)
               & (tree.rank.unsqueeze(1) < tree.rank.unsqueeze(2)))  # [b, c, j]: j an earlier sibling of c
    before = (earlier.double() * weight.unsqueeze(1)).sum(2)  # exact: integers below 2^53
    total = target_probs.sum(2, dtype=torch.float64).gather(1, parent) * _WEIGHT_SCALE
    later = (u * _WEIGHT_SCALE - before) / (total - before)
    coin = torch.where(tree.rank == 0, u, later)
    return torch.nan_to_num(coin, nan=0.0, posinf=_BELOW_ONE, neginf=0.0).clamp(0.0, _BELOW_ONE)


def _sample_with_op(tree, tokens, target_probs, draft_probs, uniform_samples, final_coins, steps, backend):
    """Thresholds 1: our tree_rejection_sample on the renumbered tree. Returns (path, num, emitted)."""
    batch, n, vocab = target_probs.shape
    rows = torch.arange(batch, device=tokens.device).unsqueeze(1)
    inverse = tree.inverse
    target = target_probs[rows, inverse]
    tree_tokens = torch.where(tree.parents >= 0, tokens.gather(1, inverse), -1)
    in_range = (tree_tokens >= 0) & (tree_tokens < vocab)
    one_hot = torch.zeros_like(target).scatter_(2, tree_tokens.clamp(0, vocab - 1).unsqueeze(2),
                                                in_range.unsqueeze(2).to(target.dtype))
    coins = _conditional_coins(tree, tokens, target_probs, uniform_samples)
    draft = one_hot
    if draft_probs is not None:
        real = (draft_probs != 0).flatten(1).any(1)  # [B]: rows with draft probabilities
        # our layout: row c is the distribution node c was drawn from, SGLang's row of c's parent
        drawn_from = draft_probs[rows, tree.parent.clamp(min=0).gather(1, inverse)]
        draft = torch.where(real.view(batch, 1, 1), drawn_from, one_hot)
        own = uniform_samples.double().clamp(0.0, _BELOW_ONE)  # real drafts: node c's coin is column c
        coins = torch.where(real.unsqueeze(1), own, coins)
    uniforms = coins.gather(1, inverse)
    uniforms[:, 0] = final_coins.double().clamp(0.0, _BELOW_ONE)
    emitted, num, nodes = ops.tree_rejection_sample(target, draft, tree_tokens, tree.parents, uniforms=uniforms,
                                                    max_depth=steps - 1, backend=backend)
    return tree.to_old(nodes), num, emitted


def _sglang_rule(tree, tokens, target_probs, draft_probs, uniform_samples, final_coins, threshold_single,
                 threshold_acc, steps, backend):
    """SGLang's acceptance rule at any thresholds, in float32 as SGLang computes it; the new token
    from SGLang's residual relu(p - d) at the last node, drawn with our op. Returns (path, num, emitted)."""
    batch, n, vocab = target_probs.shape
    device = tokens.device
    rows = torch.arange(batch, device=device)
    children = tree.children()
    single = torch.tensor(threshold_single, dtype=torch.float32, device=device)
    acc_scale = torch.tensor(threshold_acc, dtype=torch.float32, device=device).clamp(min=1e-9)  # SGLang's cap
    coins = uniform_samples.float()
    cur = torch.zeros(batch, dtype=torch.int64, device=device)
    num = torch.zeros(batch, dtype=torch.int64, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, steps), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    coin = coins[:, 0]

    def child_tokens(node):
        kids = children[rows, node]  # [B, K] in list order
        token = tokens.gather(1, kids.clamp(min=0))
        valid = (kids >= 0) & (token >= 0) & (token < vocab)
        return kids, token.clamp(0, vocab - 1), valid

    for step in range(1, steps):
        kids, token, valid = child_tokens(cur)
        p = torch.where(valid, target_probs[rows.unsqueeze(1), cur.unsqueeze(1), token].float(), 0.0)
        prob_acc = torch.cumsum(p, 1)
        accept = (kids >= 0) & alive.unsqueeze(1) & ((coin.unsqueeze(1) <= prob_acc / acc_scale) | (p >= single))
        moved = accept.any(1)
        chosen = kids.gather(1, accept.to(torch.int8).argmax(1, keepdim=True)).squeeze(1)
        cur = torch.where(moved, chosen, cur)
        path[:, step] = torch.where(moved, chosen, -1)
        num = num + moved.long()
        coin = torch.where(moved, coins.gather(1, cur.unsqueeze(1)).squeeze(1), coin)
        alive = moved
    # the residual at the last node: p minus the caller's draft row with p written at every
    # rejected child (all of them: the walk stopped there); the bonus (depth S - 1) draws from p
    bonus = num == steps - 1
    p_last = target_probs[rows, cur].float()
    draft = (torch.zeros_like(p_last) if draft_probs is None else draft_probs[rows, cur].float())
    _, token, valid = child_tokens(cur)
    valid = valid & ~bonus.unsqueeze(1)
    spill = torch.cat([draft, torch.zeros_like(draft[:, :1])], 1)  # column V: writes of invalid slots
    spill.scatter_(1, torch.where(valid, token, vocab), p_last.gather(1, token))
    draft = torch.where(bonus.unsqueeze(1), 0.0, spill[:, :vocab])
    residual = (p_last - draft).clamp(min=0.0)
    residual = torch.where((residual.sum(1) > 0).unsqueeze(1), residual, p_last)
    single_node = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    final, _, _ = ops.tree_rejection_sample(residual.unsqueeze(1), torch.zeros_like(residual).unsqueeze(1),
                                            torch.zeros_like(single_node), single_node, max_depth=0,
                                            uniforms=final_coins.double().clamp(0.0, _BELOW_ONE).unsqueeze(1),
                                            backend=backend)
    following = torch.cat([path[:, 1:], torch.full_like(path[:, :1], -1)], 1)
    steps_index = torch.arange(steps, device=device).unsqueeze(0)
    emitted = torch.where(steps_index < num.unsqueeze(1), tokens.gather(1, following.clamp(min=0)), final[:, :1])
    return path, num, emitted


@_either_spelling
def tree_speculative_sampling_target_only(predicts: Tensor, accept_index: Tensor, accept_token_num: Tensor,
                                          candidates: Tensor, retrive_index: Tensor, retrive_next_token: Tensor,
                                          retrive_next_sibling: Tensor, uniform_samples: Tensor,
                                          uniform_samples_for_final_sampling: Tensor, target_probs: Tensor,
                                          draft_probs: Tensor | None = None, threshold_single: float = 1.0,
                                          threshold_acc: float = 1.0, deterministic: bool = True, *,
                                          backend: str = "auto") -> None:
    """SGLang's `tree_speculative_sampling_target_only`: speculative sampling over a token tree
    whose drafts are deterministic (top-k) tokens. Exact (lossless) at the default thresholds
    (1.0, 1.0): our `ops.tree_rejection_sample` with one-hot drafts, SGLang's coins turned into
    our per-sibling coins. Thresholds below 1: SGLang's lossy rule, reproduced exactly (LOSSY).
    Rows whose `draft_probs` are not all zero: lossless recursive rejection sampling with those
    draft probabilities (beyond SGLang). Writes its outputs in place, returns None. The module
    docstring lists the remaining differences from SGLang's kernel.

    Args:
        predicts: [P] int32 (or int64), in place: predicts[retrive_index[b, i]] = the token after
            node i for each node i on the accepted path (the last one's is the new token).
        accept_index: [B, S] int32 (or int64), in place: retrive_index of the root and of each
            accepted node; later columns untouched. S - 1 bounds the accepted depth.
        accept_token_num: [B] int32 (or int64), in place: accepted draft nodes per row.
        candidates: [B, N] int64 (or int32): token of each node, in [0, V) (root's ignored).
        retrive_index: [B, N] int64 (or int32): each node's slot in `predicts`, in [0, P).
        retrive_next_token: [B, N] int64 (or int32): first child of each node, or -1.
        retrive_next_sibling: [B, N] int64 (or int32): next sibling of each node, or -1.
        uniform_samples: [B, N] float32 in [0, 1): column i is the coin that tests node i's
            children (real draft probabilities: column c tests node c).
        uniform_samples_for_final_sampling: [B] float32 in [0, 1): the new token's draw.
        target_probs: [B, N, V] float32 (or float16, bfloat16): the target distribution after each node.
        draft_probs: None, or [B, N, V] same dtype: SGLang passes zeros (target-only); a row that is
            not all zero holds the draft distribution after each node (its children's source). Read only.
        threshold_single: float in [0, 1]: also accept a sibling whose target probability is at least this.
        threshold_acc: float in [0, 1]: accept while the coin <= cumulative probability / threshold_acc.
        deterministic: bool, ignored (ours always is).
        backend: "auto" | "torch" | "triton" | "cuda" (our op's backend).
    """
    op = "sglang.tree_speculative_sampling_target_only"
    batch, n, steps = _check_common(op, predicts, accept_index, accept_token_num, candidates, retrive_index,
                                    retrive_next_token, retrive_next_sibling)
    device = candidates.device
    check.tensor(op, "target_probs", target_probs, shape=(batch, n, "V"), dtypes=_PROB_DTYPES, device=device,
                 last_dim_contiguous=False)
    vocab = target_probs.shape[2]
    if vocab == 0:
        check.fail(op, "`target_probs` has an empty vocabulary (V = 0)")
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor):
            check.fail(op, f"`draft_probs` must be a [B, N, V] tensor or None (got {type(draft_probs).__name__}); "
                           "pass the thresholds by keyword", TypeError)
        check.tensor(op, "draft_probs", draft_probs, shape=(batch, n, vocab), dtypes=_PROB_DTYPES, device=device,
                     last_dim_contiguous=False)
        check.same_dtype(op, ("target_probs", "draft_probs"), target_probs, draft_probs)
    check.tensor(op, "uniform_samples", uniform_samples, shape=(batch, n), dtypes=(torch.float32,), device=device,
                 last_dim_contiguous=False)
    check.tensor(op, "uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, shape=(batch,),
                 dtypes=(torch.float32,), device=device, last_dim_contiguous=False)
    threshold_single, threshold_acc = _check_thresholds(op, threshold_single, threshold_acc, deterministic)
    if check.can_inspect(uniform_samples) and batch > 0:
        for name, coins in (("uniform_samples", uniform_samples),
                            ("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling)):
            if not bool(((coins >= 0) & (coins < 1)).all()):
                check.fail(op, f"`{name}` must lie in [0, 1) (no NaN)")
    if batch == 0:
        return
    tree = _Tree(retrive_next_token, retrive_next_sibling, steps - 1)
    tokens = candidates.long()
    if check.can_inspect(tokens):
        reached = tokens[tree.used & (tree.parent >= 0)]
        if reached.numel() and (int(reached.min()) < 0 or int(reached.max()) >= vocab):
            check.fail(op, f"`candidates` of tree nodes hold ids outside [0, {vocab}) "
                           f"(min {int(reached.min())}, max {int(reached.max())})")
    if threshold_single >= 1.0 and threshold_acc >= 1.0:
        path, num, emitted = _sample_with_op(tree, tokens, target_probs, draft_probs, uniform_samples,
                                             uniform_samples_for_final_sampling, steps, backend)
    else:
        path, num, emitted = _sglang_rule(tree, tokens, target_probs, draft_probs, uniform_samples,
                                          uniform_samples_for_final_sampling, threshold_single, threshold_acc,
                                          steps, backend)
    _write_back(predicts, accept_index, accept_token_num, retrive_index, path, num, emitted)


__all__ = ["tree_speculative_sampling_target_only", "verify_tree_greedy"]
