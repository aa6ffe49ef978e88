"""Sampled siblings for trees: recursive rejection sampling WITHOUT replacement (Jeon et al. 2024).

Statistics: the first two emitted tokens, jointly, follow the exact target distribution when a
node's K in {2, 3} children are drawn from one q without replacement, both for a full tree with
fixed shape (the op alone) and for trees drafted and pruned by draft_tree.grow_tree(siblings=
"sampled") (drafter + op). Mutations that must fail: the same siblings verified with the
independent rule (q not updated after a rejection), and a pruning that looks at the sampled
child's own probability. Plus the op's edge cases (a single child equals the independent rule,
skipped siblings, NaN/zero rows, ids in range) and one-line argument errors.
"""

import pytest
import torch
from scipy import stats

from specdec_kernels import ops
from specdec_kernels.decoding import draft_tree
from specdec_kernels.common.sampling import sample_weights, to_weights

P_MIN = 1e-4  # reject the null below this p-value
NAN, INF = float("nan"), float("inf")


def dist(vocab: int, gen: torch.Generator, power: float = 2.0) -> torch.Tensor:
    p = torch.rand(vocab, generator=gen) ** power + 0.02
    return p / p.sum()


def joint_pvalue(first: torch.Tensor, second: torch.Tensor, p0: torch.Tensor, p1: torch.Tensor) -> float:
    """Pearson chi-square of the (first, second) pairs against p0[a] * p1[a, b] (V^2 cells;
    a pair of probability 0 fails outright, cells below 5 expected are merged)."""
    vocab = p0.numel()
    counts = torch.bincount(first * vocab + second, minlength=vocab * vocab).double()
    probs = (p0.double().unsqueeze(1) * p1.double()).flatten()
    if bool((counts[probs == 0] > 0).any()):
        return 0.0
    expected = probs * first.numel()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def first_two(out, num_accepted, p1, gen):
    """The first two emitted tokens; where the step emitted one, the second is drawn exactly from
    the target after it (what the next step would do), so the pair's law is the target's."""
    first = out[:, 0]
    completion = torch.multinomial(p1[first], 1, generator=gen).squeeze(1)
    return first, torch.where(num_accepted >= 1, out[:, 1], completion)


def without_replacement(q: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k draws per row of q [R, V] without replacement (the fixed-point sequential draws)."""
    u = torch.rand(q.shape[0], k, generator=gen, dtype=torch.float64)
    tokens, _ = draft_tree.sample_children(q, u)
    return tokens


# ------------------------------------------------------------------ the op on full trees

def full_tree_batch(rows: int, k: int, p0, q0, p1, q1, gen):
    """Root with k children drawn w/o replacement from q0; child c has k children drawn w/o
    replacement from q1[x_c]. Rows: target [R, N, V], per-parent draft [R, N, V], and the per-child
    draft the independent rule would read (the mutation)."""
    vocab = p0.numel()
    n = 1 + k + k * k
    level1 = without_replacement(q0.expand(rows, vocab), k, gen)  # [R, k]
    level2 = without_replacement(q1[level1].reshape(rows * k, vocab), k, gen).reshape(rows, k * k)
    tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.int64), level1, level2], dim=1)
    parents = torch.tensor([-1] + [0] * k + [1 + i // k for i in range(k * k)]).expand(rows, n)
    target = torch.empty(rows, n, vocab)
    target[:, 0] = p0
    target[:, 1:1 + k] = p1[level1]
    target[:, 1 + k:] = p0  # the leaves' bonus distribution: any fixed one
    per_parent = torch.rand(rows, n, vocab, generator=gen)  # leaves' rows: never read
    per_parent[:, 0] = q0
    per_parent[:, 1:1 + k] = q1[level1]
    per_child = per_parent.gather(1, parents.clamp(min=0).unsqueeze(2).expand(-1, -1, vocab))
    return target, per_parent, per_child, tokens, parents


def tables(vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    p0, q0 = dist(vocab, gen), dist(vocab, gen, power=4.0)
    p1 = torch.stack([dist(vocab, gen) for _ in range(vocab)])
    q1 = torch.stack([dist(vocab, gen, power=4.0) for _ in range(vocab)])
    return gen, p0, q0, p1, q1


ROWS = 60_000


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("randomness", ["uniforms", "seed"])
def test_full_tree_reproduces_target(k, randomness):
    gen, p0, q0, p1, q1 = tables(5, 10 + k)
    target, per_parent, _, tokens, parents = full_tree_batch(ROWS, k, p0, q0, p1, q1, gen)
    extra = (dict(uniforms=torch.rand(ROWS, tokens.shape[1], generator=gen, dtype=torch.float64))
             if randomness == "uniforms" else dict(seed=1234 + k))
    out, num, nodes = ops.tree_rejection_sample(target, per_parent, tokens, parents, backend="torch",
                                                siblings="without_replacement", **extra)
    assert bool(((num >= 0) & (num <= 2)).all())
    assert joint_pvalue(*first_two(out, num, p1, gen), p0, p1) > P_MIN
    # the siblings were really tried past the first: some rows accept a second or third child
    assert bool(((nodes[:, 1] > 1) & (num >= 1)).any())


@pytest.mark.parametrize("k", [2, 3])
def test_full_tree_mutation_without_removal_fails(k):
    """The same drafts verified as if each sibling were an independent draw from q (q not
    updated after a rejected sibling, SpecInfer's rule): the output leaves the target."""
    gen, p0, q0, p1, q1 = tables(5, 10 + k)
    target, _, per_child, tokens, parents = full_tree_batch(ROWS // 2, k, p0, q0, p1, q1, gen)
    out, num, _ = ops.tree_rejection_sample(target, per_child, tokens, parents, backend="torch", seed=99)
    assert joint_pvalue(*first_two(out, num, p1, gen), p0, p1) < 1e-8


# ------------------------------------------------------------------ drafter + op (pruned trees)

class ToyModels:
    """Target and draft whose next-token law depends on (depth, last token): P[d, t] and Q[d, t]."""

    def __init__(self, vocab: int, depth: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.p = torch.stack([torch.stack([dist(vocab, gen) for _ in range(vocab)]) for _ in range(depth + 1)])
        self.q = torch.stack([torch.stack([dist(vocab, gen, power=4.0) for _ in range(vocab)])
                              for _ in range(depth + 1)])

    @staticmethod
    def depths(parents: torch.Tensor) -> torch.Tensor:
        """Depth of every node of [B, M] topological parents (-1 = root / unused)."""
        depth = torch.zeros_like(parents)
        for i in range(1, parents.shape[1]):
            par = parents[:, i]
            depth[:, i] = torch.where(par >= 0, depth.gather(1, par.clamp(min=0).unsqueeze(1)).squeeze(1) + 1, 0)
        return depth

    def forward(self, tokens, parents):  # the draft's tree forward: log q as logits
        return torch.log(self.q[self.depths(parents), tokens])


def draft_and_verify(models: ToyModels, rows: int, k: int, depth: int, nodes: int, *, siblings: str,
                     rule: str = "without_replacement", seed: int = 5, root_token: int = 1):
    root = torch.full((rows,), root_token, dtype=torch.int64)
    seeds = torch.arange(rows, dtype=torch.int64) * 7919 + seed
    cursors = torch.full((rows,), 100, dtype=torch.int64)
    shape = draft_tree.tree_shape(depth, k, nodes)
    tree = draft_tree.grow_tree(shape, root, torch.log(models.q[0, root]), models.forward,
                                lambda logits: torch.log_softmax(logits, -1), siblings=siblings,
                                seeds=seeds, cursors=cursors)
    tokens = torch.cat([root.unsqueeze(1), tree.tokens], dim=1)
    target = models.p[models.depths(tree.parents), tokens]
    if rule == "without_replacement":
        draft = tree.draft_probs
    else:  # the mutation: each child verified as an independent draw from its parent's q
        draft = tree.draft_probs.gather(1, tree.parents.clamp(min=0).unsqueeze(2).expand(-1, -1, models.vocab))
    out, num, _ = ops.tree_rejection_sample(target, draft, tokens, tree.parents, seed=seeds, offsets=cursors,
                                            max_depth=depth, siblings=rule, backend="torch")
    return tree, out, num


DRAFTED_ROWS = 40_000


@pytest.mark.parametrize("k, nodes", [(2, 5), (3, 10)])
def test_drafted_pruned_tree_reproduces_target(k, nodes):
    models = ToyModels(5, 3, seed=k)
    tree, out, num = draft_and_verify(models, DRAFTED_ROWS, k, 3, nodes, siblings="sampled")
    gen = torch.Generator().manual_seed(k)
    p0, p1 = models.p[0, 1], models.p[1]
    assert joint_pvalue(*first_two(out, num, p1, gen), p0, p1) > P_MIN
    assert float(num.double().mean()) > 0.5  # the tree is used


@pytest.mark.parametrize("k, nodes", [(2, 5), (3, 10)])
def test_drafted_tree_mutation_without_removal_fails(k, nodes):
    models = ToyModels(5, 3, seed=k)
    _, out, num = draft_and_verify(models, DRAFTED_ROWS // 2, k, 3, nodes, siblings="sampled", rule="independent")
    gen = torch.Generator().manual_seed(k)
    assert joint_pvalue(*first_two(out, num, p1 := models.p[1], gen), models.p[0, 1], p1) < 1e-8


def test_drafted_tree_mutation_pruning_by_own_probability_fails(monkeypatch):
    """Ranking a sampled child by its own q(x_j) (the top-K score) keeps or drops it depending on
    its value: the kept siblings are no longer draws from q_j and the output leaves the target.
    This is why draft_tree scores sampled children without looking at their tokens."""
    correct = draft_tree.sample_children

    def peeking(q, uniforms):
        tokens, _ = correct(q, uniforms)
        return tokens, torch.log(q.gather(-1, tokens)).float()

    monkeypatch.setattr(draft_tree, "sample_children", peeking)
    models = ToyModels(5, 3, seed=2)
    _, out, num = draft_and_verify(models, DRAFTED_ROWS // 2, 2, 3, 5, siblings="sampled")
    gen = torch.Generator().manual_seed(2)
    assert joint_pvalue(*first_two(out, num, p1 := models.p[1], gen), models.p[0, 1], p1) < 1e-8


def test_sampled_tree_children_are_draws_without_replacement():
    """Siblings are distinct, in draw order; row v of draft_probs is the q they came from; the
    scores put a node's children in a prefix of its draws (no sibling kept after a dropped one)."""
    models = ToyModels(7, 3, seed=3)
    tree, _, _ = draft_and_verify(models, 2000, 3, 3, 6, siblings="sampled")
    parents, tokens = tree.parents, torch.cat([torch.ones(2000, 1, dtype=torch.int64), tree.tokens], 1)
    for i in range(1, 7):
        for j in range(i + 1, 7):
            same_parent = parents[:, i] == parents[:, j]
            assert not bool((same_parent & (tokens[:, i] == tokens[:, j])).any())
    depths = ToyModels.depths(parents)
    want = models.q[depths, tokens]
    has_children = torch.stack([(parents == v).any(1) for v in range(7)], 1)
    # exp(log_softmax(log q)): q up to rounding; the op gets exactly the rows the draws used
    assert torch.allclose(tree.draft_probs[has_children], want[has_children].float(), rtol=1e-5, atol=0)
    assert bool((tree.draft_probs[~has_children & (tree.draft_node < 0)] == 0).all())


def test_sampled_children_follow_sequential_law():
    """sample_children's pair (x1, x2) follows q(a) q(b) / (1 - q(a))."""
    gen = torch.Generator().manual_seed(0)
    q = dist(6, gen, power=3.0)
    tokens, inc = draft_tree.sample_children(q.expand(200_000, 6), torch.rand(200_000, 2, generator=gen,
                                                                              dtype=torch.float64))
    assert bool((tokens[:, 0] != tokens[:, 1]).all())
    p1 = (q.unsqueeze(0).expand(6, 6) * (1 - torch.eye(6)))
    p1 = p1 / p1.sum(1, keepdim=True)
    assert joint_pvalue(tokens[:, 0], tokens[:, 1], q, p1) > P_MIN
    assert bool((inc[:, 1] <= inc[:, 0]).all() and (inc <= 0).all())


def test_sampled_children_with_exhausted_support():
    """q with 2 ids for K = 3: the third child repeats the first draw and scores -inf."""
    q = torch.tensor([[0.0, 0.7, 0.0, 0.3]])
    tokens, inc = draft_tree.sample_children(q, torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64))
    assert sorted(tokens[0, :2].tolist()) == [1, 3] and tokens[0, 2] == tokens[0, 0]
    assert inc[0, 2] == -INF and bool((inc[0, :2] > -INF).all())


def test_sampled_draws_are_seeded_and_batch_independent():
    models = ToyModels(6, 2, seed=1)
    a, _, _ = draft_and_verify(models, 8, 2, 2, 4, siblings="sampled", seed=11)
    b, _, _ = draft_and_verify(models, 8, 2, 2, 4, siblings="sampled", seed=11)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)


def test_grow_tree_bad_siblings():
    models = ToyModels(4, 2, seed=0)
    shape = draft_tree.tree_shape(2, 2, 3)
    root = torch.ones(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="siblings"):
        draft_tree.grow_tree(shape, root, torch.log(models.q[0, root]), models.forward, torch.log_softmax,
                             siblings="random")
    with pytest.raises(ValueError, match="cursors"):
        draft_tree.grow_tree(shape, root, torch.log(models.q[0, root]), models.forward, torch.log_softmax,
                             siblings="sampled", seeds=torch.zeros(2, dtype=torch.int64))


# ------------------------------------------------------------------ op edge cases

def chain_vs_tree_inputs(gen, rows=64, vocab=33, depth=3):
    target = torch.softmax(torch.randn(rows, depth + 1, vocab, generator=gen) * 2, -1)
    draft = torch.softmax(torch.randn(rows, depth + 1, vocab, generator=gen) * 2, -1)
    tokens = torch.randint(0, vocab, (rows, depth + 1), generator=gen)
    parents = torch.arange(-1, depth).expand(rows, depth + 1)
    return target, draft, tokens, parents


def test_single_child_nodes_equal_the_independent_rule():
    """One child per node: without replacement is the independent rule (per-parent rows shifted)."""
    gen = torch.Generator().manual_seed(4)
    target, draft, tokens, parents = chain_vs_tree_inputs(gen)
    uniforms = torch.rand(target.shape[:2], generator=gen, dtype=torch.float64)
    per_child = torch.roll(draft, 1, dims=1)  # child c's q = its parent's row
    for extra in (dict(uniforms=uniforms), dict(seed=3)):
        want = ops.tree_rejection_sample(target, per_child, tokens, parents, backend="torch", **extra)
        got = ops.tree_rejection_sample(target, draft, tokens, parents, backend="torch",
                                        siblings="without_replacement", **extra)
        for w, g in zip(want, got):
            assert torch.equal(w, g)


def test_skipped_siblings_and_bad_rows_stay_in_range():
    """Children q_j cannot draw (a repeated token, zero draft weight) are skipped; NaN / inf /
    zero rows still emit ids in [0, V)."""
    vocab = 6
    parents = torch.tensor([[-1, 0, 0, 0, 0]] * 4)
    tokens = torch.tensor([[0, 2, 2, 5, 3]] * 4)
    target = torch.full((4, 5, vocab), 1.0 / vocab)
    target[:, 0] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5])  # p(2) = p(3) = 0: both rejected
    draft = torch.full((4, 5, vocab), 0.0)
    draft[:, 0] = torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0, 0.0])  # q(5) = 0: child 3 (token 5) skipped
    draft[1, 0] = NAN
    draft[2, 0] = INF
    target[3, 0] = NAN
    uniforms = torch.full((4, 5), 0.5, dtype=torch.float64)
    out, num, nodes = ops.tree_rejection_sample(target, draft, tokens, parents, uniforms=uniforms, backend="torch",
                                                siblings="without_replacement")
    assert bool(((out[:, 0] >= 0) & (out[:, 0] < vocab)).all())
    # row 0: 2 rejected (p = 0), the repeat skipped, 5 skipped (q = 0), 3 rejected: the residual
    # max(p - q, ...) puts all mass on 4 and 5
    assert num[0] == 0 and int(out[0, 0]) in (4, 5)


def test_bad_siblings_argument():
    gen = torch.Generator().manual_seed(0)
    target, draft, tokens, parents = chain_vs_tree_inputs(gen, rows=2)
    with pytest.raises(ValueError, match=r"tree_rejection_sample.*`siblings`"):
        ops.tree_rejection_sample(target, draft, tokens, parents, seed=1, siblings="sampled")
