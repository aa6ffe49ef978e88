"""Traversal verification (reference/traversal_verification.py): the exact law of what it emits.

Method (no sampling, no grid): for a small random tree shape, every assignment of the drafted tokens is
enumerated with its probability under the sibling rule (independent: child c from its own q_c; without
replacement: a node's children drawn one after the other from one q, earlier siblings removed). For each
assignment the walk itself (`traverse`) runs under a scripted coin: each node's coin is compared once,
against one threshold alpha fixed by the earlier outcomes, so it accepts with probability alpha exactly;
every sequence of outcomes is enumerated (forking at each coin). The final token is drawn, as the op
draws it, from the fixed-point weights of the accepted node's row, token v with probability w_v / sum w
exactly. Each emitted sequence is completed to length D+1 with the target (what the next steps would
emit), and the resulting law must equal the target's law of length-(D+1) sequences to 1e-9; the only
rounding is float64 arithmetic and the 2^-40 fixed-point weights (the largest error measured is 7e-13).
The two exact-law tests take about 8 s on one CPU core (200 trees, ~6,600 draft assignments).
"""

import pytest
import torch

from specdec_kernels import reference
from specdec_kernels.common.sampling import to_weights
from specdec_kernels.reference import traversal_verification as tv
from specdec_kernels.reference.tree import chain_parents, children_table, tree_depths

TOLERANCE = 1e-9
MAX_DEPTH = 3


# ------------------------------------------------------------------ the model: rows as functions of the prefix

class Rows:
    """A random next-token row for each prefix (tuple of tokens), drawn once and kept: the target p and the
    drafter's q must be functions of the prefix, so siblings with the same token share their future."""

    def __init__(self, vocab: int, gen: torch.Generator, zeros: bool):
        self.vocab, self.gen, self.zeros, self.rows = vocab, gen, zeros, {}

    def __call__(self, *key) -> torch.Tensor:
        if key not in self.rows:
            row = torch.rand(self.vocab, generator=self.gen, dtype=torch.float64) ** 2 + 1e-3
            if self.zeros:  # some tokens the model never produces (keep at least one)
                row = torch.where(torch.rand(self.vocab, generator=self.gen) < 0.25, 0.0, row)
                row[int(torch.randint(self.vocab, (1,), generator=self.gen))] += 0.5
            self.rows[key] = row / row.sum()
        return self.rows[key]


def random_shape(n: int, gen: torch.Generator) -> list[int]:
    """parents of n nodes in topological order, depth <= MAX_DEPTH."""
    parents, depth = [-1], [0]
    for _ in range(1, n):
        allowed = [v for v in range(len(parents)) if depth[v] < MAX_DEPTH]
        parent = allowed[int(torch.randint(len(allowed), (1,), generator=gen))]
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return parents


class Case:
    """A tree shape with its target, its drafter and the sibling rule; `assignments` enumerates the drafts."""

    def __init__(self, parents, vocab, siblings, gen, per_child_q=False):
        self.parents, self.vocab, self.siblings = parents, vocab, siblings
        self.n = len(parents)
        self.target = Rows(vocab, gen, zeros=True)
        self.draft = Rows(vocab, gen, zeros=siblings == "independent")  # without replacement: full support
        self.per_child_q = per_child_q  # independent siblings, each rank drawn from its own q
        self.rank = [sum(1 for j in range(1, i) if parents[j] == parents[i]) for i in range(self.n)]
        tensor_parents = torch.tensor([parents])
        self.depth = int(tree_depths(tensor_parents).max())

    def prefix(self, tokens, node):
        path = []
        while node > 0:
            path.append(tokens[node])
            node = self.parents[node]
        return tuple(reversed(path))

    def draft_row(self, tokens, child):
        """The law child was drawn from (before removing earlier siblings)."""
        key = self.prefix(tokens, self.parents[child])
        return self.draft(key, self.rank[child]) if self.per_child_q else self.draft(key)

    def assignments(self, tokens=None, node=1, prob=1.0):
        """(probability, tokens) for every way the drafter could fill nodes 1..n-1."""
        tokens = [0] if tokens is None else tokens
        if node == self.n:
            yield prob, list(tokens)
            return
        q = self.draft_row(tokens, node)
        if self.siblings == "without_replacement":
            earlier = [tokens[j] for j in range(1, node) if self.parents[j] == self.parents[node]]
            q = q.clone()
            q[earlier] = 0.0
            q = q / q.sum()
        for x in range(self.vocab):
            if q[x] > 0:
                yield from self.assignments(tokens + [x], node + 1, prob * float(q[x]))

    def inputs(self, tokens):
        """target_probs, draft_probs [1, N, V], tree_tokens, parents [1, N] in the op's layout."""
        target = torch.stack([self.target(self.prefix(tokens, v)) for v in range(self.n)])
        if self.siblings == "independent":
            draft = torch.stack([self.draft_row(tokens, c) if c else torch.zeros(self.vocab) for c in range(self.n)])
        else:
            draft = torch.stack([self.draft(self.prefix(tokens, v)) for v in range(self.n)])
        return target.unsqueeze(0), draft.unsqueeze(0), torch.tensor([tokens]), torch.tensor([self.parents])

    def tree(self, tokens):
        target, draft, tree_tokens, parents = self.inputs(tokens)
        return tv.TraversalTree(target[0], draft[0], tree_tokens[0], children_table(parents)[0],
                                tree_depths(parents)[0], self.depth, self.siblings)

    def target_law(self, length):
        """{sequence: probability} of the target's first `length` tokens."""
        law = {(): 1.0}
        for _ in range(length):
            law = {seq + (y,): prob * float(self.target(seq)[y])
                   for seq, prob in law.items() for y in range(self.vocab)}
        return law


# ------------------------------------------------------------------ exact integration over the coins

class _Fork(Exception):
    def __init__(self, alpha):
        self.alpha = alpha


def walk_outcomes(tree):
    """[(probability, path, pi)] over every outcome of the node coins (each compared once with its alpha)."""
    done, pending = [], [((), 1.0)]
    while pending:
        script, weight = pending.pop()
        answered = []

        def decide(node, alpha):
            if len(answered) == len(script):
                raise _Fork(alpha)
            answered.append(script[len(answered)])
            return answered[-1]

        try:
            path, pi = tv.traverse(tree, decide)
        except _Fork as fork:
            pending += [(script + (True,), weight * fork.alpha), (script + (False,), weight * (1.0 - fork.alpha))]
            continue
        done.append((weight, path, pi))
    return done


def final_token_law(tree, path, pi) -> torch.Tensor:
    """float64 [V]: the op's final draw from pi's fixed-point weights, falling back to p's."""
    weights = tv.final_weights(pi)
    if int(weights.sum()) == 0:
        weights = to_weights(tree.p[path[-1]])
    return weights.double() / weights.sum().double()


def emitted_law(case):
    """({emitted sequence: probability}, expected number of accepted drafts), drafts and coins integrated."""
    law, accepted = {}, 0.0
    for draft_prob, tokens in case.assignments():
        tree = case.tree(tokens)
        for weight, path, pi in walk_outcomes(tree):
            prefix = tuple(tokens[v] for v in path[1:])
            for y, prob in enumerate(final_token_law(tree, path, pi).tolist()):
                if prob > 0:
                    law[prefix + (y,)] = law.get(prefix + (y,), 0.0) + draft_prob * weight * prob
            accepted += draft_prob * weight * (len(path) - 1)
    return law, accepted


def completed(case, law, length):
    """The emitted law with every sequence continued by the target up to `length` tokens."""
    while any(len(seq) < length for seq in law):
        longer = {}
        for seq, prob in law.items():
            if len(seq) == length:
                longer[seq] = longer.get(seq, 0.0) + prob
                continue
            for y, py in enumerate(case.target(seq).tolist()):
                if py > 0:
                    longer[seq + (y,)] = longer.get(seq + (y,), 0.0) + prob * py
        law = longer
    return law


def law_error(case) -> float:
    law, _ = emitted_law(case)
    length = case.depth + 1
    ours, target = completed(case, law, length), case.target_law(length)
    return max(abs(ours.get(seq, 0.0) - target.get(seq, 0.0)) for seq in set(ours) | set(target))


def random_cases(count, siblings, seed):
    """Small trees: V in 2..6, 2..6 nodes, at most ~500 draft assignments each."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    while len(cases) < count:
        vocab = int(torch.randint(2, 7, (1,), generator=gen))
        n = int(torch.randint(2, 7, (1,), generator=gen))
        if (vocab ** (n - 1)) > 500:
            continue
        parents = random_shape(n, gen)
        per_child_q = siblings == "independent" and bool(torch.rand(1, generator=gen) < 0.3)
        if siblings == "without_replacement" and max(parents[1:].count(v) for v in range(n)) > vocab:
            continue  # more children than tokens: the shape would depend on the draws
        cases.append(Case(parents, vocab, siblings, gen, per_child_q))
    return cases


# ------------------------------------------------------------------ the tests

@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
def test_traversal_emits_the_target_law_exactly(siblings):
    cases = random_cases(100, siblings, seed=51)
    assert sum(case.depth == MAX_DEPTH for case in cases) >= 10 and max(case.vocab for case in cases) == 6
    errors = [law_error(case) for case in cases]
    assert max(errors) < TOLERANCE, (max(errors), cases[errors.index(max(errors))].parents)


@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
def test_token_level_residual_breaks_the_law(siblings, monkeypatch):
    """Mutation: after a rejection, the token-level residual norm(max(pi - q, 0)) instead of the sequence one."""
    def token_level(alpha, pi, q):
        new_alpha, _ = exact(alpha, pi, q)
        owed = (pi - q).clamp(min=0.0)
        return new_alpha, owed / owed.sum() if owed.sum() > 0 else owed

    exact = tv.sequence_residual
    monkeypatch.setattr(tv, "sequence_residual", token_level)
    errors = [law_error(case) for case in random_cases(30, siblings, seed=52)]
    assert max(errors) > 1e-3


def test_level_kept_after_a_rejection_breaks_the_law(monkeypatch):
    """Mutation: a rejected child updates pi but leaves the parent's alpha as it was."""
    exact = tv.sequence_residual
    monkeypatch.setattr(tv, "sequence_residual", lambda alpha, pi, q: (alpha, exact(alpha, pi, q)[1]))
    assert max(law_error(case) for case in random_cases(30, "independent", seed=53)) > 1e-3


def token_level_expected_accepted(tree, node=0, r=None) -> float:
    """E[accepted drafts] of top-down recursive rejection (tree_rejection_sample's rule) below `node`, exact."""
    r = tree.p[node] if r is None else r
    draws = (tv._DrawsWithoutReplacement if tree.without_replacement else tv._IndependentDraws)(tree, node)
    reach, total = 1.0, 0.0
    for child in tree.children[node]:
        if draws.skip(child):
            continue
        q = draws.law(child)
        accept = tv.child_level(1.0, r, q, tree.tokens[child])
        total += reach * accept * (1.0 + token_level_expected_accepted(tree, child))
        reach *= 1.0 - accept
        left = (r - q).clamp(min=0.0)
        r = left / left.sum() if left.sum() > 0 else left
        draws.reject(child)
    return total


def token_level_expected(case) -> float:
    return sum(prob * token_level_expected_accepted(case.tree(tokens)) for prob, tokens in case.assignments())


@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
def test_traversal_accepts_at_least_as_many_as_token_level(siblings):
    cases = [case for case in random_cases(40, siblings, seed=54) if case.depth >= 2][:12]
    gains = []
    for case in cases:
        _, ours = emitted_law(case)
        theirs = token_level_expected(case)
        assert ours >= theirs - TOLERANCE, (ours, theirs, case.parents)
        gains.append(ours - theirs)
    assert max(gains) > 1e-3  # strictly better somewhere


@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
def test_token_level_exact_expectation_matches_the_reference_op(siblings):
    """The test's exact E[accepted] for token-level verification is the reference op's (Monte Carlo, 5 sigma)."""
    case = next(c for c in random_cases(40, siblings, seed=55) if c.depth >= 2 and c.n >= 4)
    prob, tokens = max(case.assignments())
    target, draft, tree_tokens, parents = case.inputs(tokens)
    rows = 20000
    expand = lambda x: x.expand(rows, *x.shape[1:]).contiguous()  # noqa: E731
    uniforms = torch.rand(rows, case.n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _, accepted, _ = reference.tree_rejection_sample(expand(target).float(), expand(draft).float(), expand(tree_tokens),
                                                     expand(parents), max_depth=case.depth, uniforms=uniforms,
                                                     siblings=siblings)
    expected = token_level_expected_accepted(case.tree(tokens))
    sigma = float(accepted.double().std()) / rows ** 0.5
    assert abs(float(accepted.double().mean()) - expected) < 5 * sigma + 1e-6


# ------------------------------------------------------------------ the op: chain == block verification, coins

def chain_inputs(batch, g, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, g + 1, vocab, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(batch, g, vocab, generator=gen) * 1.5, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    uniforms = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
    return p, q, drafts, uniforms


@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
def test_on_a_chain_traversal_is_block_verification(siblings):
    """Same outputs on the same coins: node i's coin is block_verify's eta_i, column 0 its final draw; seeded,
    node i's coin and the final draw sit at block_verify's counters."""
    batch, g, vocab = 400, 4, 5
    p, q, drafts, uniforms = chain_inputs(batch, g, vocab, seed=56)
    zeros_row, zero_token = torch.zeros(batch, 1, vocab), torch.zeros(batch, 1, dtype=torch.int64)
    tree_tokens, parents = torch.cat([zero_token, drafts], 1), chain_parents(batch, g + 1)
    # independent: row c is the law node c was drawn from; without replacement: row v is the law of v's child
    draft_rows = torch.cat([zeros_row, q], 1) if siblings == "independent" else torch.cat([q, zeros_row], 1)
    node_uniforms = torch.cat([uniforms[:, g:], uniforms[:, :g]], 1)
    block = reference.block_verify(p, q, drafts, uniforms=uniforms)
    ours = reference.tree_traversal_sample(p, draft_rows, tree_tokens, parents, max_depth=g, uniforms=node_uniforms,
                                           siblings=siblings)
    assert torch.equal(ours[0], block[0]) and torch.equal(ours[1], block[1])
    offsets = torch.arange(batch) * 7
    block = reference.block_verify(p, q, drafts, seed=3, offsets=offsets)
    ours = reference.tree_traversal_sample(p, draft_rows, tree_tokens, parents, max_depth=g, seed=3, offsets=offsets,
                                           siblings=siblings)
    assert torch.equal(ours[0], block[0]) and torch.equal(ours[1], block[1])
    assert torch.equal(ours[2], torch.where(torch.arange(g + 1) <= ours[1].unsqueeze(1), torch.arange(g + 1), -1))


def test_outputs_are_deterministic_and_consistent():
    case = next(c for c in random_cases(40, "independent", seed=57) if c.depth >= 2 and c.n >= 4)
    prob, tokens = max(case.assignments())
    target, draft, tree_tokens, parents = (x.expand(64, *x.shape[1:]) for x in case.inputs(tokens))
    uniforms = torch.rand(64, case.n, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    first = reference.tree_traversal_sample(target, draft, tree_tokens, parents, max_depth=case.depth,
                                            uniforms=uniforms)
    again = reference.tree_traversal_sample(target, draft, tree_tokens, parents, max_depth=case.depth,
                                            uniforms=uniforms)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    out, accepted, nodes = first
    for b in range(64):
        path = nodes[b, :int(accepted[b]) + 1].tolist()
        assert path[0] == 0 and all(case.parents[c] == v for v, c in zip(path, path[1:]))
        assert out[b, :int(accepted[b])].tolist() == [tokens[c] for c in path[1:]]


def test_root_alone_draws_from_p_and_unknown_siblings_fail():
    p = torch.tensor([[[0.0, 0.25, 0.75]]])
    out, accepted, nodes = reference.tree_traversal_sample(p, p, torch.zeros(1, 1, dtype=torch.int64),
                                                           torch.tensor([[-1]]), max_depth=0,
                                                           uniforms=torch.tensor([[0.5]], dtype=torch.float64))
    assert out.tolist() == [[2]] and accepted.tolist() == [0] and nodes.tolist() == [[0]]
    with pytest.raises(ValueError, match="siblings"):
        reference.tree_traversal_sample(p, p, torch.zeros(1, 1, dtype=torch.int64), torch.tensor([[-1]]),
                                        max_depth=0, siblings="sampled")


def spread_outcomes(cases):
    """(case, tokens, P(walk ends at node) [N]) for drafts whose walk ends at >= 4 nodes with probability >= 2%."""
    for case in cases:
        for _, tokens in case.assignments():
            exact = [0.0] * case.n
            for weight, path, _ in walk_outcomes(case.tree(tokens)):
                exact[path[-1]] += weight
            if sum(prob >= 0.02 for prob in exact) >= 4:
                yield case, tokens, exact


@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
@pytest.mark.parametrize("mode", ["uniforms", "seed"])
def test_the_op_draws_its_coins_as_the_walk_says(siblings, mode):
    """The op on one fixed bushy tree: the accepted node's frequencies over many rows match the exact law of
    `traverse` (chi-square), with caller uniforms and with the counter-based draws (distinct per node)."""
    from scipy import stats

    case, tokens, exact = next(found for found in spread_outcomes(random_cases(60, siblings, seed=58)))
    rows = 2000
    inputs = [x.expand(rows, *x.shape[1:]) for x in case.inputs(tokens)]
    randomness = (dict(uniforms=torch.rand(rows, case.n, generator=torch.Generator().manual_seed(7),
                                           dtype=torch.float64)) if mode == "uniforms" else dict(seed=8))
    _, accepted, nodes = reference.tree_traversal_sample(*inputs, max_depth=case.depth, siblings=siblings,
                                                         **randomness)
    last = nodes.gather(1, accepted.unsqueeze(1)).squeeze(1)
    counts = torch.bincount(last, minlength=case.n).double()
    expected = torch.tensor(exact, dtype=torch.float64) * rows
    assert bool((counts[expected == 0] == 0).all())
    keep = expected > 0
    assert stats.chisquare(counts[keep], expected[keep]).pvalue > 1e-4
