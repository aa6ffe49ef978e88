"""SGLang's tree-verification kernels (`sgl_kernel.verify_tree_greedy`,
`sgl_kernel.tree_speculative_sampling_target_only`) with SGLang's arguments, on our ops.

Each takes sgl_kernel's arguments and writes its outputs in place, so a call site can swap SGLang's
kernels for ours; nothing here imports SGLang. The layouts are translated in `sglang_layout`
(linked lists -> our `parents`, SGLang's coins -> ours, the outputs written back). The sampling runs at
SGLang's default thresholds (1.0, 1.0), where its rule is exact (lossless); lower thresholds select SGLang's
lossy rule, which is not an op of ours: refused (keep sgl_kernel's kernel for it). What still differs from
SGLang, each with its test: docs/flashinfer-sglang.md.
"""

import functools

import torch
from torch import Tensor

from .. import ops
from ..common import validate as check
from .sglang_layout import Tree, sample_with_op, write_back

# the upstream this adapter tracks: sgl-kernel's python/sgl_kernel/speculative.py at that sglang commit, whose
# positional parameters ours keep in order (tests/test_integrations_sglang.py holds them to UPSTREAM_PARAMETERS)
TRACKS = "sgl-kernel at sglang@01fe7c22 (sgl-kernel/python/sgl_kernel/speculative.py): verify_tree_greedy, " \
         "tree_speculative_sampling_target_only"
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
        if isinstance(value, torch.Tensor):  # an older sgl-kernel's draft_probs, passed by position
            check.fail(op, f"`{name}` got a tensor: `draft_probs` is keyword-only (sgl-kernel's signature at "
                           "sglang@01fe7c22 has no such parameter)", TypeError)
        value = check.real_number(op, name, value, minimum=0.0)
        if value != 1.0:  # below 1, SGLang's rule stops following the target distribution
            check.fail(op, f"`{name}` must be 1.0, the lossless rule (got {value!r}); thresholds below 1 "
                           "select SGLang's lossy rule, which this adapter does not run")
    if not isinstance(deterministic, bool):
        check.fail(op, f"`deterministic` must be a bool (got {type(deterministic).__name__})", TypeError)


# ----------------------------------------------------------------------------- translation


def _check_sampling(op, batch, n, device, target_probs, draft_probs, uniform_samples, final_coins,
                    threshold_single, threshold_acc, deterministic):
    """The sampling inputs' checks; returns V."""
    check.tensor(op, "target_probs", target_probs, shape=(batch, n, "V"), dtypes=_PROB_DTYPES, device=device,
                 last_dim_contiguous=False)
    vocab = target_probs.shape[2]
    if vocab == 0:
        check.fail(op, "`target_probs` has an empty vocabulary (V = 0)")
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor):
            check.fail(op, f"`draft_probs` must be a [B, N, V] tensor or None (got {type(draft_probs).__name__})",
                       TypeError)
        check.tensor(op, "draft_probs", draft_probs, shape=(batch, n, vocab), dtypes=_PROB_DTYPES, device=device,
                     last_dim_contiguous=False)
        check.same_dtype(op, ("target_probs", "draft_probs"), target_probs, draft_probs)
    check.tensor(op, "uniform_samples", uniform_samples, shape=(batch, n), dtypes=(torch.float32,), device=device,
                 last_dim_contiguous=False)
    check.tensor(op, "uniform_samples_for_final_sampling", final_coins, shape=(batch,), dtypes=(torch.float32,),
                 device=device, last_dim_contiguous=False)
    _check_thresholds(op, threshold_single, threshold_acc, deterministic)
    if check.can_inspect(uniform_samples) and batch > 0:
        for name, coins in (("uniform_samples", uniform_samples), ("uniform_samples_for_final_sampling", final_coins)):
            if not bool(((coins >= 0) & (coins < 1)).all()):
                check.fail(op, f"`{name}` must lie in [0, 1) (no NaN)")
    return vocab


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
    tree = Tree(retrive_next_token, retrive_next_sibling, steps - 1)
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
    write_back(predicts, accept_index, accept_token_num, retrive_index, path, num,
                target.gather(1, path.clamp(min=0)))


@_either_spelling
def tree_speculative_sampling_target_only(predicts: Tensor, accept_index: Tensor, accept_token_num: Tensor,
                                          candidates: Tensor, retrive_index: Tensor, retrive_next_token: Tensor,
                                          retrive_next_sibling: Tensor, uniform_samples: Tensor,
                                          uniform_samples_for_final_sampling: Tensor, target_probs: Tensor,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True, *, draft_probs: Tensor | None = None,
                                          backend: str = "auto") -> None:
    """SGLang's `tree_speculative_sampling_target_only`: speculative sampling over a token tree
    whose drafts are deterministic (top-k) tokens, at SGLang's default thresholds (1.0, 1.0), where it
    is exact (lossless): our `ops.tree_rejection_sample` with one-hot drafts, SGLang's coins turned
    into our per-sibling coins. Lower thresholds (SGLang's lossy rule) are refused. Rows whose
    `draft_probs` are not all zero: lossless recursive rejection sampling with those draft
    probabilities (beyond SGLang). Writes its outputs in place, returns None. What still differs
    from SGLang's kernel: docs/flashinfer-sglang.md.

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
        threshold_single: 1.0 (SGLang's default; lower values select its lossy rule: refused).
        threshold_acc: 1.0 (likewise).
        deterministic: bool, ignored (ours always is).
        draft_probs: keyword-only (beyond sgl-kernel's signature): None, or [B, N, V] same dtype as
            `target_probs`: a row that is not all zero holds the draft distribution after each node (its
            children's source), verified losslessly with it. Read only.
        backend: "auto" | "torch" | "triton" | "cuda" (our op's backend).
    """
    op = "sglang.tree_speculative_sampling_target_only"
    batch, n, steps = _check_common(op, predicts, accept_index, accept_token_num, candidates, retrive_index,
                                    retrive_next_token, retrive_next_sibling)
    vocab = _check_sampling(
        op, batch, n, candidates.device, target_probs, draft_probs, uniform_samples,
        uniform_samples_for_final_sampling, threshold_single, threshold_acc, deterministic)
    if batch == 0:
        return
    tree = Tree(retrive_next_token, retrive_next_sibling, steps - 1)
    tokens = candidates.long()
    if check.can_inspect(tokens):
        reached = tokens[tree.used & (tree.parent >= 0)]
        if reached.numel() and (int(reached.min()) < 0 or int(reached.max()) >= vocab):
            check.fail(op, f"`candidates` of tree nodes hold ids outside [0, {vocab}) "
                           f"(min {int(reached.min())}, max {int(reached.max())})")
    path, num, emitted = sample_with_op(tree, tokens, target_probs, draft_probs, uniform_samples,
                                        uniform_samples_for_final_sampling, steps, backend)
    write_back(predicts, accept_index, accept_token_num, retrive_index, path, num, emitted)


__all__ = ["tree_speculative_sampling_target_only", "verify_tree_greedy"]
