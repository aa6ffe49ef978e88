"""Reference verification of token trees (multi-draft speculative sampling and greedy).

Outputs: output_tokens [B, D+1] int64 padded with -1, num_accepted [B] int64 and
accepted_nodes [B, D+1] int64 (root 0 first, then the accepted nodes, padded -1), where
D = max_depth. Every row walks the tree from the root, one level per step (vectorised
over the batch); at each node its children are tried in index order, and the walk ends
with one emitted token that is not a node of the tree.
"""

import torch

from ..common import rng
from ..common.draws import seed_and_row_key
from ..common.sampling import as_int64, gather_token_values, safe_argmax, sample_with_fallback, to_weights
from .tree import children_table

SIBLINGS_INDEPENDENT = "independent"  # each child drawn from its own q_c (i.i.d. or one-hot siblings)
SIBLINGS_WITHOUT_REPLACEMENT = "without_replacement"  # a node's children drawn from one q without replacement
SIBLINGS = (SIBLINGS_INDEPENDENT, SIBLINGS_WITHOUT_REPLACEMENT)


class _Walk:
    """Per-row walk state: current node, path so far, and the output tensors."""

    def __init__(self, tree_tokens: torch.Tensor, max_depth: int):
        batch = tree_tokens.shape[0]
        device = tree_tokens.device
        self.rows = torch.arange(batch, device=device)
        self.tree_tokens = tree_tokens
        self.cur = torch.zeros(batch, dtype=torch.int64, device=device)
        self.alive = torch.ones(batch, dtype=torch.bool, device=device)
        self.num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
        self.out_tokens = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
        self.accepted_nodes = self.out_tokens.clone()
        self.accepted_nodes[:, 0] = 0

    def levels(self, max_depth: int):
        """Depths 0..max_depth, while any row still walks (each step ends in `advance`)."""
        for level in range(max_depth + 1):
            if not bool(self.alive.any()):
                return
            yield level

    def sibling(self, children: torch.Tensor, slot: int, accepted_child: torch.Tensor) -> tuple:
        """(child, trying, safe_child) [B] at sibling `slot` of each row's current node: trying where
        the row still walks, has accepted no child yet and the slot holds one; safe_child >= 0."""
        child = children[self.rows, self.cur, slot]
        trying = self.alive & (accepted_child < 0) & (child >= 0)
        return child, trying, child.clamp(min=0)

    def advance(self, accepted_child: torch.Tensor, final_token: torch.Tensor) -> None:
        """Rows with accepted_child >= 0 move down; the other live rows emit final_token and stop."""
        moving = self.alive & (accepted_child >= 0)
        finishing = self.alive & ~moving
        rows, slot = self.rows[moving], self.num_accepted[moving]
        self.out_tokens[rows, slot] = self.tree_tokens[rows, accepted_child[moving]]
        self.accepted_nodes[rows, slot + 1] = accepted_child[moving]
        rows = self.rows[finishing]
        self.out_tokens[rows, self.num_accepted[finishing]] = final_token[finishing]
        self.num_accepted += moving.to(torch.int64)
        self.cur = torch.where(moving, accepted_child, self.cur)
        self.alive = moving

    def outputs(self):
        return self.out_tokens, self.num_accepted, self.accepted_nodes


def tree_greedy_verify(target_logits, tree_tokens, parents, *, max_depth: int):
    """Follow the first child (index order) whose token equals the target argmax at the
    current node; emit the argmax where no child matches or at depth max_depth."""
    tree_tokens, parents = as_int64(tree_tokens), as_int64(parents)
    top1 = safe_argmax(target_logits)  # [B, N]
    children = children_table(parents)  # [B, N, N-1]
    walk = _Walk(tree_tokens, max_depth)
    for level in walk.levels(max_depth):
        want = top1[walk.rows, walk.cur]
        kids = children[walk.rows, walk.cur]  # [B, N-1]
        matches = (kids >= 0) & (tree_tokens.gather(1, kids.clamp(min=0)) == want.unsqueeze(1))
        if level == max_depth:
            matches = torch.zeros_like(matches)
        first = torch.argmax(matches.to(torch.int8), dim=1)  # first True (0 if none)
        accepted_child = torch.where(matches.any(dim=1), kids.gather(1, first.unsqueeze(1)).squeeze(1), -1)
        walk.advance(accepted_child, want)
    return walk.outputs()


class _Coins:
    """The uniforms of a tree walk: the caller's uniforms [B, N] (column c: node c's coin, column 0:
    the final draw), or Philox draws at (seed, offsets[b] + depth, row key, salt, sibling rank)."""

    def __init__(self, uniforms, seed, offsets, batch, device):
        self.uniforms = uniforms
        if uniforms is None:
            self.offsets = (torch.zeros(batch, dtype=torch.int64, device=device) if offsets is None
                            else offsets.to(torch.int64))
            self.seeds, self.row_key = seed_and_row_key(seed, batch, device)

    def accept(self, rows, child, level, rank):
        """The coin of `child` (clamped to a node), tried at sibling rank `rank` and depth `level`."""
        if self.uniforms is None:
            return rng.philox_uniform(self.seeds, self.offsets + level, self.row_key, rng.SALT_ACCEPT, rank)
        return self.uniforms[rows, child].to(torch.float64)

    def final(self, level):
        """The uniform of the final draw at depth `level`."""
        if self.uniforms is None:
            return rng.philox_uniform(self.seeds, self.offsets + level, self.row_key, rng.SALT_FINAL)
        return self.uniforms[:, 0].to(torch.float64)


def tree_rejection_sample(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                          seed=None, offsets=None, siblings: str = "independent"):
    """Multi-draft speculative sampling over a tree (SpecInfer-style recursive rejection).

    One walk for both sibling rules: at node `cur` with target distribution p =
    target_probs[b, cur], children are tried in index order under the rule `siblings` names
    (`_Independent`, the default, or `_WithoutReplacement`), which keeps the residual after
    each rejection in fixed point (weights R with total S, r = R / S) so that every backend
    can reproduce it exactly. Accepting moves to the child; when every child is rejected (or
    at a leaf or at depth max_depth: the bonus) the row emits a draw from the residual,
    falling back to p, then to argmax.
    Randomness: uniforms [B, N] (column c is node c's coin, column 0 the final draw) or
    counter-based draws: node coins at (seed, offsets[b] + depth - 1, row, ACCEPT, sibling
    rank) and the final draw at (seed, offsets[b] + depth of the last node, row, FINAL), so
    a chain-shaped tree reproduces `rejection_sample` in both modes.
    """
    rule = _WithoutReplacement if siblings == SIBLINGS_WITHOUT_REPLACEMENT else _Independent
    tree_tokens, parents = as_int64(tree_tokens), as_int64(parents)
    children = children_table(parents)
    walk = _Walk(tree_tokens, max_depth)
    coins = _Coins(uniforms, seed, offsets, tree_tokens.shape[0], tree_tokens.device)
    for level in walk.levels(max_depth):
        p = target_probs[walk.rows, walk.cur].float()  # [B, V]
        node = rule(p, draft_probs, walk.rows, walk.cur)
        accepted_child = torch.full_like(walk.cur, -1)
        for slot in range(children.shape[2] if level < max_depth else 0):  # no children past max_depth
            child, trying, safe_child = walk.sibling(children, slot, accepted_child)
            if not bool(trying.any()):
                break
            x = tree_tokens[walk.rows, safe_child]
            u = coins.accept(walk.rows, safe_child, level, node.rank(slot))
            accepted_child = torch.where(node.test(trying, safe_child, x, u), child, accepted_child)
        final = sample_with_fallback(node.residual(), to_weights(p), coins.final(level))
        walk.advance(accepted_child, final)
    return walk.outputs()


class _Independent:
    """Siblings drawn independently: child c was drawn from its own q_c = draft_probs[b, c] (i.i.d.
    siblings from one q, or deterministic distinct siblings with one-hot q_c), lossless then.
    The first child is accepted when u * q(x) < p(x) (the chain rule); after each rejection the
    target becomes the normalised residual r <- norm(max(0, r - q_c)):
      R_1 = to_weights(p - q_c1);   later children:  accept iff (u * q(x)) * S < R(x);
      after a later rejection  R <- max(0, R - floor(S * q_c))  (q_c with NaN/inf -> 1).
    A child whose token is outside [0, V) is rejected (its q still cuts the residual). The
    coin's rank is the child's slot among its siblings."""

    def __init__(self, p, draft_probs, rows, cur):
        self.p, self.draft_probs, self.rows = p, draft_probs, rows
        self.weights = to_weights(p)  # R once a child was rejected; p's weights (the final draw's) before
        self.rejected_any = torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)

    def rank(self, slot: int):
        return slot

    def test(self, trying, child, x, u):
        """Accept or reject child `child` (token x, coin u) where `trying`; a rejection updates R."""
        q = self.draft_probs[self.rows, child].float()
        p_x, in_range = gather_token_values(self.p, x)
        q_x, _ = gather_token_values(q, x)
        weights = self.weights
        r_x = weights.gather(1, x.clamp(0, weights.shape[1] - 1).unsqueeze(1)).squeeze(1)  # exact: <= 2^40
        total = weights.sum(dim=1).double()
        first_rule = u * q_x.double() < p_x.double()
        later_rule = (u * q_x.double()) * total < r_x.to(torch.float64)
        accept = trying & in_range & torch.where(self.rejected_any, later_rule, first_rule)
        rejected = trying & ~accept
        q_clean = torch.nan_to_num(q, nan=1.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0).double()
        later_weights = (weights - torch.floor(total.unsqueeze(1) * q_clean).to(torch.int64)).clamp(min=0)
        new_weights = torch.where(self.rejected_any.unsqueeze(1), later_weights, to_weights(self.p - q))
        self.weights = torch.where(rejected.unsqueeze(1), new_weights, weights)
        self.rejected_any |= rejected
        return accept

    def residual(self):
        """The final draw's weights: R after a rejection, else p's."""
        return self.weights


class _WithoutReplacement:
    """Siblings drawn WITHOUT replacement (Jeon et al. 2024): all children of node v were drawn from
    ONE draft distribution q = draft_probs[b, v] (row v: the distribution after node v, indexed like
    target_probs) without replacement, in index order (Gumbel-top-k, or the equivalent sequential
    draws). With p = target_probs[b, v]:
      Q = to_weights(q), T = sum Q (fixed point, as the drafter draws),
      child 1 (token x, coin u): accept iff u * q(x) < p(x) in float64 (rejection_sample's rule);
        on rejection R <- to_weights(p - q) (float32 difference), S = sum R, T' = T - Q(x);
      child j > 1 (rejected tokens X = {x_1..x_{j-1}}, T' = T - sum_{X} Q): with the float64 scale
        c = S / T' (q_j = Q_j / T', put in R's units), accept iff u * (c * Q(x)) < R(x);
        on rejection R(v) <- max(0, R(v) - floor(c * Q(v))) for v not in X (q_j is 0 on X),
        S = sum R, T' <- T' - Q(x).
    So r = R / S is norm(max(r - q_j, 0)) and q_{j+1} is q_j without x_j, renormalised, both
    computed from the row of q and the sibling tokens, nothing of size V kept per rank. A child
    that q_j could not have produced (token outside [0, V), Q(x) = 0, or a rejected sibling's
    token again) is skipped: no coin, no update. The final draw is from R (if a child was
    rejected), else from p. The coin's rank is the number of real siblings rejected before the
    child. A node with one child reproduces the independent rule exactly."""

    def __init__(self, p, draft_probs, rows, cur):
        self.p = p
        self.q = draft_probs[rows, cur].float()
        self.q_weights = to_weights(self.q)
        self.weights = to_weights(p - self.q)  # R after the first rejection; meaningful only once rank > 0
        self.total = self.weights.sum(dim=1)  # S
        self.q_left = self.q_weights.sum(dim=1)  # T' (before any rejection: T)
        self.removed = torch.zeros_like(self.q_weights, dtype=torch.bool)  # the reference may keep [B, V]
        self.ranks = torch.zeros(p.shape[0], dtype=torch.int64, device=p.device)

    def rank(self, slot: int):
        return self.ranks

    def test(self, trying, child, x, u):
        """Accept, reject or skip the child (token x, coin u) where `trying`; a rejection updates R, S, T'."""
        vocab = self.p.shape[1]
        in_range = (x >= 0) & (x < vocab)
        safe_x = x.clamp(0, vocab - 1).unsqueeze(1)
        q_x_weight = self.q_weights.gather(1, safe_x).squeeze(1)
        real = trying & in_range & (q_x_weight > 0) & ~self.removed.gather(1, safe_x).squeeze(1)
        p_x = self.p.gather(1, safe_x).squeeze(1).double()
        q_x = self.q.gather(1, safe_x).squeeze(1).double()
        r_x = self.weights.gather(1, safe_x).squeeze(1).double()  # <= 2^40: exact
        scale = self.total.double() / self.q_left.clamp(min=1).double()  # c = S / T'
        first_rule = u * q_x < p_x
        later_rule = u * (scale * q_x_weight.double()) < r_x
        later = self.ranks > 0
        accept = real & torch.where(later, later_rule, first_rule)
        rejected = real & ~accept
        # capped at 2^41 > any R(v): the same result, and the cast never overflows
        cut = torch.floor((scale.unsqueeze(1) * self.q_weights.double()).clamp(max=2.0**41)).to(torch.int64)
        cut = torch.where(self.removed, 0, cut)
        new_weights = torch.where(later.unsqueeze(1), (self.weights - cut).clamp(min=0), self.weights)
        self.weights = torch.where(rejected.unsqueeze(1), new_weights, self.weights)
        self.total = torch.where(rejected, self.weights.sum(dim=1), self.total)
        self.q_left = torch.where(rejected, self.q_left - q_x_weight, self.q_left)
        self.removed = self.removed | (rejected.unsqueeze(1) & (torch.arange(vocab, device=x.device) == safe_x))
        self.ranks = self.ranks + rejected.to(torch.int64)
        return accept

    def residual(self):
        """The final draw's weights: R once a real child was rejected, else none (p's are the fallback)."""
        return torch.where((self.ranks > 0).unsqueeze(1), self.weights, 0)
