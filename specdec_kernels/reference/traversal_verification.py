"""Reference traversal verification of token trees (Weng et al., "Traversal Verification for
Speculative Tree Decoding", NeurIPS 2025, arXiv 2505.12398, Algorithm 1): the executable specification.

Same inputs and outputs as tree_verify.tree_rejection_sample (token-level, top-down recursive
rejection), but the tree is verified from the leaves towards the root with sequence-level acceptance:

  * every node v carries an acceptance level alpha_v and a target row pi_v (the paper's p_alpha and
    M_b; q is its M_s). The root starts at alpha = 1, pi = p_root; a child c (token x, drafted from q)
    starts at alpha_c = min(1, alpha_v * pi_v(x) / q(x)) and pi_c = p_c (its target row), computed when
    the walk reaches it, from its parent's state at that moment;
  * the walk is a post-order depth-first traversal, children in index order: a node is tested only
    once every child of it is gone, with its own coin: u_v < alpha_v accepts the whole path root..v
    and ends the walk (a child with alpha_c = 0 is rejected with its subtree untested: no coin passes 0);
  * a rejected child c (drafted from q) is deleted and its parent v updated, with
    Z = sum_x max(alpha_v pi_v(x) - q(x), 0) (the target mass no draft covers):
        alpha_v <- Z / (Z + 1 - alpha_v)   (computed as Z / sum_x max(q(x) - alpha_v pi_v(x), 0))
        pi_v    <- norm(max(alpha_v pi_v - q, 0))   (the alpha_v before the update)
    and, for siblings drawn without replacement, v's draft law loses x (renormalised);
  * the root is never tested: once its children are all gone it is accepted;
  * the accepted node w emits one more token drawn from pi_w (the residual if a child of w was
    rejected, else p_w), falling back to p_w, then to argmax, as tree_rejection_sample does.

Invariant the losslessness proof rests on (induction over the subtree, leaves first): when the walk
reaches a node v with (alpha_v, pi_v) and v's remaining children are drafted as the sibling rule says,
then for every continuation s, P(the walk ends at v or below it and what it emits after v, continued by
the target, is s) = alpha_v * P_target(s | v), pi_v standing for the target's next-token row at v. A
leaf has it from its coin and its draw from pi_v. A child with token x drafted from q then delivers
q(x) * min(1, alpha_v pi_v(x) / q(x)) = min(q(x), alpha_v pi_v(x)) of v's mass (the invariant at the
child), so after its rejection max(alpha_v pi_v - q, 0) is still owed, and the walk gets there with
probability sum_x max(q(x) - alpha_v pi_v(x), 0) = Z + 1 - alpha_v: the update above restores the
invariant in the same form, whatever the rejected token was (so it holds for both sibling laws). At the
root alpha = 1: the emitted tokens follow the target. On a chain this is block verification (Sun et al.
2025, Algorithm 2): alpha along the chain is its p_i, the level after a rejection is its h_i, and the
leaf-first test order realises tau = max{i : eta_i < h_i}; the outputs are equal on the same coins
(tests/test_traversal_verification_law.py, which also integrates the exact law on small trees).

Sibling laws: "independent" (child c drawn from its own q_c = draft_probs[b, c], e.g. i.i.d. siblings
or one-hot top-k drafts) and "without_replacement" (all children of v drawn from q_v = draft_probs[b, v]
without replacement, in index order; a child that law could not have produced, an id outside [0, V),
q_v(x) = 0 or a rejected sibling's token again, is skipped: no coin, no update). The invariant needs
only that the next child, given what came before, is drawn from the current draft law, so the rule
covers both.

Randomness (each node is tested at most once): uniforms [B, N], column c > 0 is node c's coin and
column 0 the final draw; or counter-based draws, node c's coin at (seed, offsets[b] + depth(c) - 1, row,
ACCEPT, extra = c - depth(c)) and the final draw at (seed, offsets[b] + depth(w), row, FINAL). The extra
word is distinct among the nodes of one depth (nodes are in topological order, so c >= depth(c)) and 0
along a chain, where the draws are block_verify's. Deterministic given the uniforms or the seed.
Arithmetic: float64 per row (this is the specification of the rule; a fixed-point form for the kernels
is later work).
"""

import torch

from ..common import rng
from ..common.draws import seed_and_row_key
from ..common.sampling import WEIGHT_SCALE, as_int64, sample_with_fallback, to_weights
from .tree import children_table, tree_depths
from .tree_verify import SIBLINGS, SIBLINGS_WITHOUT_REPLACEMENT


class TraversalTree:
    """One row's tree: float64 target rows p [N, V], draft rows q [N, V], tokens [N], and each node's
    children in index order (none for nodes at depth max_depth, as the token-level walk)."""

    def __init__(self, target_probs, draft_probs, tree_tokens, children, depths, max_depth: int, siblings: str):
        self.p = target_probs.double()  # [N, V]
        self.q = draft_probs.double()  # [N, V]
        self.tokens = tree_tokens.tolist()  # [N]
        self.vocab = self.p.shape[1]
        self.children = [[c for c in row if c >= 0] if depth < max_depth else []
                         for row, depth in zip(children.tolist(), depths.tolist())]
        self.without_replacement = siblings == SIBLINGS_WITHOUT_REPLACEMENT

    def in_vocab(self, x: int) -> bool:
        return 0 <= x < self.vocab


class _IndependentDraws:
    """Child c was drawn from its own q_c = draft_probs[b, c]."""

    def __init__(self, tree: TraversalTree, node: int):
        self.tree = tree

    def skip(self, child: int) -> bool:
        return False

    def law(self, child: int) -> torch.Tensor:
        return self.tree.q[child]

    def reject(self, child: int) -> None:
        pass


class _DrawsWithoutReplacement:
    """All children of `node` drawn from q_node without replacement: the j-th real child's law is
    q_node without the rejected siblings' tokens, renormalised (q_node as given for the first)."""

    def __init__(self, tree: TraversalTree, node: int):
        self.tree, self.base = tree, tree.q[node]
        self.removed = torch.zeros(tree.vocab, dtype=torch.bool, device=self.base.device)

    def skip(self, child: int) -> bool:
        x = self.tree.tokens[child]
        return not self.tree.in_vocab(x) or bool(self.base[x] <= 0) or bool(self.removed[x])

    def law(self, child: int) -> torch.Tensor:
        if not bool(self.removed.any()):
            return self.base
        kept = torch.where(self.removed, 0.0, self.base)
        return kept / kept.sum()

    def reject(self, child: int) -> None:
        self.removed[self.tree.tokens[child]] = True


def child_level(alpha: float, pi: torch.Tensor, q: torch.Tensor, x: int) -> float:
    """alpha_c = min(1, alpha * pi(x) / q(x)) for a child with token x drafted from q [V]; 0 for an id
    outside [0, V) or no target mass, 1 for q(x) = 0 < alpha * pi(x)."""
    if not 0 <= x < pi.shape[0]:
        return 0.0
    mass, drafted = alpha * float(pi[x]), float(q[x])
    if not mass > 0:
        return 0.0
    return 1.0 if not drafted > 0 else min(1.0, mass / drafted)


def sequence_residual(alpha: float, pi: torch.Tensor, q: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(alpha', pi' [V]) of a node once a child drafted from q [V] was rejected: alpha' = Z / (Z + 1 - alpha)
    and pi' = norm(max(alpha pi - q, 0)), Z the mass of that residual (see the module docstring). A
    rejection of probability 0 (no q above alpha pi) keeps 1 as the level; an empty residual is all zeros."""
    owed = (alpha * pi - q).clamp(min=0.0)  # [V]: target mass the rejected subtree did not deliver
    reached = float((q - alpha * pi).clamp(min=0.0).sum())  # P(the child's subtree was rejected)
    z = float(owed.sum())
    new_alpha = min(1.0, z / reached) if reached > 0 else 1.0
    return new_alpha, (owed / z if z > 0 else owed)


def traverse(tree: TraversalTree, decide, node: int = 0, alpha: float = 1.0, pi: torch.Tensor | None = None):
    """Post-order walk of `node`'s subtree. decide(node, alpha) -> bool is the node's coin test (u_node <
    alpha); it is never called for the root. Returns (path [node, ..., accepted node], pi [V] of the
    accepted node) or None when `node` is rejected."""
    pi = tree.p[node] if pi is None else pi
    draws = (_DrawsWithoutReplacement if tree.without_replacement else _IndependentDraws)(tree, node)
    for child in tree.children[node]:
        if draws.skip(child):
            continue
        q = draws.law(child)
        level = child_level(alpha, pi, q, tree.tokens[child])
        found = traverse(tree, decide, child, level, tree.p[child]) if level > 0 else None  # level 0: all rejected
        if found is not None:
            return [node] + found[0], found[1]
        alpha, pi = sequence_residual(alpha, pi, q)
        draws.reject(child)
    if node == 0 or decide(node, alpha):
        return [node], pi
    return None


def final_weights(pi: torch.Tensor) -> torch.Tensor:
    """int64 [V]: fixed-point weights floor(pi * 2^40) of the final draw, computed in float64 (a float32
    cast of a residual would move its law by ~1e-8)."""
    pi = torch.nan_to_num(pi.double(), nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    return torch.floor(pi * WEIGHT_SCALE).to(torch.int64)


class _TraversalCoins:
    """node [B, N] float64 coins (column c: node c's) and final(b, depth): the bonus draw's uniform."""

    def __init__(self, uniforms, seed, offsets, depths):
        batch, n = depths.shape
        self.uniforms = uniforms
        if uniforms is not None:
            self.node = uniforms.to(torch.float64)
            return
        device = depths.device
        self.offsets = (torch.zeros(batch, dtype=torch.int64, device=device) if offsets is None
                        else offsets.to(torch.int64))
        self.seeds, self.row_key = seed_and_row_key(seed, batch, device)
        rank = torch.arange(n, device=device).unsqueeze(0) - depths  # distinct within a depth, 0 on a chain
        self.node = rng.philox_uniform(self.seeds.unsqueeze(1), self.offsets.unsqueeze(1) + depths - 1,
                                       self.row_key.unsqueeze(1), rng.SALT_ACCEPT, rank)

    def final(self, depths: torch.Tensor) -> torch.Tensor:
        """[B] float64: each row's final draw, depths [B] the accepted depths (one call for the batch: a
        counter-based draw per row costs more than the walk)."""
        if self.uniforms is not None:
            return self.node[:, 0]
        return rng.philox_uniform(self.seeds, self.offsets + depths, self.row_key, rng.SALT_FINAL)


def tree_traversal_sample(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                          seed=None, offsets=None, siblings: str = "independent"):
    """Traversal verification of a token tree (module docstring): lossless, same interface as
    tree_verify.tree_rejection_sample. A per-row loop (the reference favours clarity over speed).

    Args:
        target_probs: [B, N, V] float, the target distribution at each node.
        draft_probs: [B, N, V] float: "independent": row c is the law node c was drawn from;
            "without_replacement": row v is the law v's children were drawn from.
        tree_tokens, parents: [B, N] int64/int32 (tree.py's layout).
        max_depth: int >= 0; nodes deeper are ignored.
        uniforms: [B, N] float in [0, 1): column c > 0 is node c's coin, column 0 the final draw;
            or seed (int or [B]) and offsets [B]: the counter-based draws of the module docstring.
        siblings: "independent" | "without_replacement".

    Returns:
        output_tokens [B, D+1] int64 (accepted tokens, the drawn token, -1 padding), num_accepted [B]
        int64 and accepted_nodes [B, D+1] int64 (root 0, the accepted path, -1 padding), D = max_depth.
    """
    if siblings not in SIBLINGS:
        raise ValueError(f"tree_traversal_sample: `siblings` must be one of {SIBLINGS} (got {siblings!r})")
    tree_tokens, parents = as_int64(tree_tokens), as_int64(parents)
    batch = tree_tokens.shape[0]
    depths = tree_depths(parents)  # [B, N]
    children = children_table(parents)  # [B, N, N-1]
    coins = _TraversalCoins(uniforms, seed, offsets, depths)
    out_tokens = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=tree_tokens.device)
    accepted_nodes = out_tokens.clone()
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=tree_tokens.device)
    residuals, targets = [], []  # per row: float64 [V] of the final draw, and the accepted node's p [V]
    for b in range(batch):
        tree = TraversalTree(target_probs[b], draft_probs[b], tree_tokens[b], children[b], depths[b], max_depth,
                             siblings)
        path, pi = traverse(tree, lambda node, alpha, b=b: bool(coins.node[b, node] < alpha))
        depth = len(path) - 1
        residuals.append(pi)
        targets.append(tree.p[path[-1]])
        accepted_nodes[b, :depth + 1] = torch.tensor(path, device=tree_tokens.device)
        out_tokens[b, :depth] = tree_tokens[b, path[1:]]
        num_accepted[b] = depth
    if batch:
        tokens = sample_with_fallback(final_weights(torch.stack(residuals)), to_weights(torch.stack(targets)),
                                      coins.final(num_accepted))  # [B]
        out_tokens.scatter_(1, num_accepted.unsqueeze(1), tokens.unsqueeze(1))
    return out_tokens, num_accepted, accepted_nodes
