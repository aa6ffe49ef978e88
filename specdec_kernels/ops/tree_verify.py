"""Verification of token trees: multi-draft speculative sampling and greedy.

Tree format (see reference/tree.py): `parents [B, N]` int64/int32, node 0 the root (the last
accepted token, parent -1), node i > 0 with a parent in [0, i), or -1 for an unused slot;
`tree_tokens [B, N]` int64/int32 (the root's entry is ignored). Per-node scores are indexed by
node: `target_*[b, i]` is the target's prediction for the token after node i.

Outputs: output_tokens [B, D+1] int64 padded with -1, num_accepted [B] int64, and
accepted_nodes [B, D+1] int64 (0 first, then the accepted nodes; padded -1), where
D = max_depth (default: the deepest node in the batch, which costs a host sync on a GPU:
pass it for CUDA-graph capture).
"""

from typing import Optional

from torch import Tensor

from .. import reference
from ..reference.tree_verify import SIBLINGS
from ..common import validate as check
from ..common.registry import custom_op, implementation, register, resolve

VERIFICATIONS = ("token", "traversal")  # tree_rejection_sample's rules: top-down per node, or leaves-first walk


def _tree_fake(tree_tokens: Tensor, max_depth: int):
    batch = tree_tokens.shape[0]
    return (tree_tokens.new_empty(batch, max_depth + 1), tree_tokens.new_empty(batch),
            tree_tokens.new_empty(batch, max_depth + 1))


def _check_tree(op: str, scores: Tensor, name: str, tree_tokens: Tensor, parents: Tensor, max_depth) -> tuple[int, int, int, int]:
    check.tensor(op, "tree_tokens", tree_tokens, shape=("B", "N"), dtypes=check.OP_INDEX_DTYPES, last_dim_contiguous=False)
    batch, n = tree_tokens.shape
    if n == 0:
        check.fail(op, "`tree_tokens` needs at least the root node (N >= 1)")
    device = tree_tokens.device
    check.tensor(op, "parents", parents, shape=(batch, n), dtypes=check.OP_INDEX_DTYPES, device=device,
                 last_dim_contiguous=False)
    check.tensor(op, name, scores, shape=(batch, n, "V"), dtypes=check.FLOAT_DTYPES, device=device)
    check.tree_parents(op, parents)
    vocab = scores.shape[-1]
    check.token_range(op, "tree_tokens[:, 1:]", tree_tokens[:, 1:], vocab, allow_padding=True)
    if max_depth is None:
        max_depth = reference.max_tree_depth(parents)
    max_depth = check.positive_int(op, "max_depth", max_depth, minimum=0)
    return batch, n, vocab, max_depth


@custom_op("specdec::tree_greedy_verify", mutates_args=())
def _tree_greedy_verify_op(target_logits: Tensor, tree_tokens: Tensor, parents: Tensor, max_depth: int,
                           backend: str) -> tuple[Tensor, Tensor, Tensor]:
    return implementation("tree_greedy_verify", backend)(target_logits, tree_tokens, parents, max_depth=max_depth)


@_tree_greedy_verify_op.register_fake
def _(target_logits, tree_tokens, parents, max_depth, backend):
    return _tree_fake(tree_tokens, max_depth)


def tree_greedy_verify(target_logits: Tensor, tree_tokens: Tensor, parents: Tensor, *, max_depth: int | None = None,
                       backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """Greedy verification of a token tree: from the root, move to the first child (in
    index order) whose token equals the target argmax at the current node; emit the argmax
    where no child matches. Token-identical to greedy decoding with the target.

    Args:
        target_logits: [B, N, V] float32/float16/bfloat16, the target's logits at each node.
        tree_tokens: [B, N] int64/int32.  parents: [B, N] int64/int32 (any strides).
        max_depth: int >= 0, bounds the accepted path (default: the tree depth).
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        output_tokens [B, D+1], num_accepted [B], accepted_nodes [B, D+1] (int64).
    """
    op = "tree_greedy_verify"
    batch, n, vocab, max_depth = _check_tree(op, target_logits, "target_logits", tree_tokens, parents, max_depth)
    sizes = dict(B=batch, N=n, V=vocab, depth=max_depth, dtype=target_logits.dtype)
    return _tree_greedy_verify_op(target_logits, tree_tokens, parents, max_depth,
                                  resolve(op, backend, tree_tokens.device, sizes=sizes))


@custom_op("specdec::tree_rejection_sample", mutates_args=())
def _tree_rejection_sample_op(target_probs: Tensor, draft_probs: Tensor, tree_tokens: Tensor, parents: Tensor,
                              max_depth: int, uniforms: Optional[Tensor], seed: Optional[int], seeds: Optional[Tensor],
                              offsets: Optional[Tensor], backend: str, siblings: str = "independent",
                              verification: str = "token") -> tuple[Tensor, Tensor, Tensor]:
    # traversal has no kernel yet: the public function resolved it to torch, and its reference runs here
    rule = reference.tree_traversal_sample if verification == "traversal" else implementation(
        "tree_rejection_sample", backend)
    return rule(target_probs, draft_probs, tree_tokens, parents, max_depth=max_depth, uniforms=uniforms,
                seed=seed if seeds is None else seeds, offsets=offsets, siblings=siblings)


@_tree_rejection_sample_op.register_fake
def _(target_probs, draft_probs, tree_tokens, parents, max_depth, uniforms, seed, seeds, offsets, backend,
      siblings="independent", verification="token"):
    return _tree_fake(tree_tokens, max_depth)


def tree_rejection_sample(target_probs: Tensor, draft_probs: Tensor, tree_tokens: Tensor, parents: Tensor, *,
                          uniforms: Tensor | None = None, seed: int | Tensor | None = None,
                          offsets: Tensor | None = None, max_depth: int | None = None,
                          siblings: str = "independent", verification: str = "token",
                          backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """Multi-draft speculative sampling over a token tree (lossless), token-level or by traversal.

    At each node the children are tried in index order: child c (token x, drawn from
    q_c = draft_probs[b, c]) is accepted with probability min(1, r(x) / q_c(x)), where r
    starts as p = target_probs[b, node] and becomes norm(max(0, r - q_c)) after each
    rejected sibling. An accepted child becomes the current node; when all children are
    rejected (or at a leaf, the bonus) the row emits a draw from r. The output follows the
    target distribution provided every child was drawn independently from its own q_c:
    i.i.d. samples from one draft distribution, or distinct deterministic (top-k) drafts
    with one-hot q_c. Exact fixed-point rules in reference/tree_verify.py.

    siblings="without_replacement" (sampled siblings, recursive rejection sampling without
    replacement, Jeon et al. 2024): every child of node v was drawn from ONE q_v =
    draft_probs[b, v] (row v is the draft distribution AFTER node v, indexed like
    target_probs, so the caller passes the q each expanded node was sampled from and no row
    is duplicated per child) without replacement, in index order (Gumbel-top-k or sequential
    draws). Child x_j is accepted with min(1, r(x_j) / q_j(x_j)), q_j = q_v without the
    rejected x_1..x_{j-1}, renormalised; a rejection sets r <- norm(max(0, r - q_j)). The
    removal is recomputed from the sibling tokens (no [B, V] buffer). A child q_j cannot have
    produced (id outside [0, V), zero draft weight, a rejected sibling's token again) is skipped.
    Lossless when the children are such draws (a prefix of them, in draw order, whose presence
    does not depend on its own value). One child per node reproduces the default rule.
    Fixed point (reference/tree_verify.py `_WithoutReplacement`): the first child uses q_v(x)
    as given, like rejection_sample; later ones q_v's weights over their total T less the
    rejected siblings' weights. decoding/draft_tree.py drafts such trees (siblings="sampled").

    verification="traversal" (Weng et al., NeurIPS 2025): the tree is walked leaves first, each node
    tested once with a sequence-level acceptance level, a rejected child moving its parent to the
    sequence residual, so a path can be kept whose prefix the top-down rule would have rejected.
    Lossless for both sibling rules; on a chain it is block verification (same outputs on the same
    coins). The rule and its coins: reference/traversal_verification.py. Only the torch backend
    has it for now, as the reference: a host-side float64 loop per row (it reads the tree on the host,
    so a CUDA graph cannot capture it); backend "auto" picks torch, "triton" and "cuda" refuse it.

    Args:
        target_probs: [B, N, V] float32/float16/bfloat16, the target distribution at each node.
        draft_probs: [B, N, V], same dtype: siblings="independent": row c is the distribution
            node c was drawn from (row 0 unused); "without_replacement": row v is the distribution
            v's children were drawn from (rows of leaves unused).
        tree_tokens: [B, N] int64/int32.  parents: [B, N] int64/int32 (any strides).
        uniforms: [B, N] float32/float64 in [0, 1): column c > 0 is node c's coin, column 0
            the final draw (bit-exact mode).
        seed: int or int64/int32 [B] instead of `uniforms`: level d's coins and final draw at
            offsets[b] + d (extra word: the sibling rank).
        offsets: [B] int64/int32, each row's draw cursor (default 0): the call reads counters
            offsets[b] .. offsets[b] + max_depth. In a loop with one seed, advance it by at least
            max_depth + 1 after every call, never by the accepted depth alone (common/rng.py).
        max_depth: int >= 0 (default: the tree depth).
        siblings: "independent" (default) | "without_replacement", how siblings were drawn.
        verification: "token" (default, the rule above) | "traversal". Traversal's coins: node c's
            is uniforms column c, or seeded the counter offsets[b] + depth(c) - 1 with extra word
            c - depth(c); the final draw is column 0, or offsets[b] + the accepted depth.

    Returns:
        output_tokens [B, D+1], num_accepted [B], accepted_nodes [B, D+1] (int64).
    """
    op = "tree_rejection_sample"
    if verification not in VERIFICATIONS:
        check.fail(op, f"`verification` must be one of {VERIFICATIONS} (got {verification!r})")
    if siblings not in SIBLINGS:
        check.fail(op, f"`siblings` must be one of {SIBLINGS} (got {siblings!r})")
    batch, n, vocab, max_depth = _check_tree(op, target_probs, "target_probs", tree_tokens, parents, max_depth)
    device = tree_tokens.device
    check.tensor(op, "draft_probs", draft_probs, shape=(batch, n, vocab), dtypes=check.FLOAT_DTYPES, device=device)
    check.same_dtype(op, ("target_probs", "draft_probs"), target_probs, draft_probs)
    check.randomness(op, uniforms, seed, offsets, shape=(batch, n), batch=batch, device=device)
    seed_int, seeds = check.split_seed(seed)
    if verification == "traversal":
        backend = _traversal_backend(op, backend)
    backend = resolve(op, backend, device, sizes=dict(B=batch, N=n, V=vocab, depth=max_depth, dtype=target_probs.dtype))
    return _tree_rejection_sample_op(target_probs, draft_probs, tree_tokens, parents, max_depth, uniforms, seed_int,
                                     seeds, offsets, backend, siblings, verification)


def _traversal_backend(op: str, backend: str) -> str:
    """The backend traversal verification runs on: torch, the only one with the rule so far."""
    if backend in ("triton", "cuda"):
        check.fail(op, f"verification='traversal' has no kernel yet on the {backend!r} backend (the torch "
                       "backend runs it: backend='torch' or 'auto')")
    return "torch" if backend == "auto" else backend


register("tree_greedy_verify", "torch", reference.tree_greedy_verify)
register("tree_rejection_sample", "torch", reference.tree_rejection_sample)
