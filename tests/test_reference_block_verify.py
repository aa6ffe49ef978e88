"""Reference block verification (Sun et al., ICLR 2025, Algorithm 2) against exact laws.

Toy autoregressive models are tables indexed by the whole prefix (every prefix of length
0..g gets its own target row p and draft row q), so the target law of any emitted
sequence is exact and small enough to enumerate.

- exact enumeration (float64 / Fractions) of Algorithm 2 reproduces the target law, the
  paper's motivating example (E[tau] 11/9 against token-wise 10/9), block >= token-wise,
  and g = 1 == token-wise; the shipped thresholds match the enumerated ones;
- the shipped reference, run on drafts sampled from q: chi-square of the first two emitted
  tokens jointly against the exact target law, and two mutations that must fail it;
- ragged rows, edge rows, seeds and bad inputs.
"""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

import oracles

from specdec_kernels import ops, reference
from specdec_kernels.reference import block_verification as bv
from specdec_kernels.reference.block_verification import block_verify


# ---------------------------------------------------------------- toy models

class PrefixModel:
    """Target and draft tables over every prefix of length 0..depth (vocabulary V)."""

    def __init__(self, vocab: int, depth: int, kind: str, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.vocab, self.depth = vocab, depth
        self.offsets = [sum(vocab**k for k in range(n)) for n in range(depth + 2)]
        rows = self.offsets[depth + 1]
        logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 1.2
        if kind == "sparse":  # a filtered target (zeros) and a draft that puts mass there
            logits[torch.arange(rows), torch.randint(0, vocab, (rows,), generator=gen)] = -math.inf
        self.p = torch.softmax(logits, dim=-1).float()
        draft_logits = torch.where(torch.isinf(logits), torch.zeros_like(logits), logits)
        draft_logits = draft_logits + torch.randn(rows, vocab, generator=gen, dtype=torch.float64)
        if kind == "onehot":  # deterministic drafts (n-gram / greedy drafter): q is one-hot
            self.q = torch.nn.functional.one_hot(draft_logits.argmax(-1), vocab).float()
        else:
            self.q = torch.softmax(draft_logits, dim=-1).float()

    def row(self, prefix: torch.Tensor) -> torch.Tensor:
        """[N, k] prefixes -> [N] table rows."""
        n, k = prefix.shape
        code = torch.zeros(n, dtype=torch.int64)
        for j in range(k):
            code = code * self.vocab + prefix[:, j]
        return code + self.offsets[k]

    def row_of(self, prefix: tuple) -> int:
        return int(self.row(torch.tensor([prefix], dtype=torch.int64).view(1, len(prefix)))[0])

    def sample_step(self, n: int, g: int, gen: torch.Generator):
        """Drafts sampled from q, and the op's inputs for them."""
        drafts = torch.zeros(n, g, dtype=torch.int64)
        for d in range(g):
            drafts[:, d] = torch.multinomial(self.q[self.row(drafts[:, :d])], 1, generator=gen).squeeze(1)
        target = torch.stack([self.p[self.row(drafts[:, :d])] for d in range(g + 1)], dim=1)
        draft = torch.stack([self.q[self.row(drafts[:, :d])] for d in range(g)], dim=1) if g else \
            torch.zeros(n, 0, self.vocab)
        return target, draft, drafts

    def target_pair_law(self) -> torch.Tensor:
        """[V, V] float64: p(t1) p(t2 | t1)."""
        first = self.p[0].double()
        second = self.p[self.row(torch.arange(self.vocab).view(-1, 1))].double()
        return first.unsqueeze(1) * second


# ---------------------------------------------------------------- exact enumeration of the algorithms

def positive_part_normalised(row):
    total = sum(max(x, 0.0) for x in row)
    return ([max(x, 0.0) / total for x in row] if total > 0 else None), total


def block_rule(ps, qs, xs, g, mutant=None):
    """Algorithm 2 on one draft sequence, float64: (P(tau = k) for k = 0..g, p_0..p_g, Z(0..g-1)).

    ps: g+1 target rows, qs: g draft rows, xs: g tokens. mutant: None, "h=p" (thresholds
    without the residual mass) or "no-scale" (residuals without the p_j factor).
    """
    p = [1.0]
    for i in range(g):
        q_x = qs[i][xs[i]]
        p.append(min(1.0, p[-1] * ps[i][xs[i]] / q_x) if q_x > 0 else (1.0 if p[-1] * ps[i][xs[i]] > 0 else 0.0))
    scale = (lambda j: 1.0) if mutant == "no-scale" else (lambda j: p[j])
    z = [sum(max(scale(j) * a - b, 0.0) for a, b in zip(ps[j], qs[j])) for j in range(g)]
    h = []
    for i in range(1, g + 1):
        if i == g:
            h.append(p[g])
        elif mutant == "h=p":
            h.append(p[i])
        else:
            denom = z[i] + 1.0 - p[i]
            h.append(z[i] / denom if denom > 0 else 1.0)
    tau_law = []
    for k in range(g + 1):
        prob = 1.0 if k == 0 else h[k - 1]
        for j in range(k + 1, g + 1):
            prob *= 1.0 - h[j - 1]
        tau_law.append(prob)

    def final_row(k):
        if k == g:
            return list(ps[g])
        row, total = positive_part_normalised([scale(k) * a - b for a, b in zip(ps[k], qs[k])])
        return row if total > 0 else list(ps[k])  # empty residual: fall back to p
    return tau_law, final_row, h


def token_rule(ps, qs, xs, g):
    """Leviathan et al. Algorithm 1 on one draft sequence: (P(tau = k), final row law)."""
    accept = [min(1.0, ps[i][xs[i]] / qs[i][xs[i]]) if qs[i][xs[i]] > 0 else float(ps[i][xs[i]] > 0) for i in range(g)]
    tau_law = []
    for k in range(g + 1):
        prob = math.prod(accept[:k])
        tau_law.append(prob * (1.0 - accept[k]) if k < g else prob)

    def final_row(k):
        if k == g:
            return list(ps[g])
        row, total = positive_part_normalised([a - b for a, b in zip(ps[k], qs[k])])
        return row if total > 0 else list(ps[k])
    return tau_law, final_row


def exact_law(model: PrefixModel, g: int, rule: str = "block", mutant=None):
    """([V, V] law of the first two emitted tokens (completed by sampling the target when the
    step emits one token), E[tau]) by enumerating every draft sequence."""
    V = model.vocab
    P, Q = model.p.double().tolist(), model.q.double().tolist()
    law = [[0.0] * V for _ in range(V)]
    mean_tau = 0.0
    for xs in itertools.product(range(V), repeat=g):
        rows = [model.row_of(xs[:d]) for d in range(g + 1)]
        q_seq = math.prod(Q[rows[d]][xs[d]] for d in range(g))
        if q_seq == 0:
            continue
        ps, qs = [P[r] for r in rows], [Q[r] for r in rows[:g]]
        tau_law, final_row = block_rule(ps, qs, xs, g, mutant)[:2] if rule == "block" else token_rule(ps, qs, xs, g)
        for k, pk in enumerate(tau_law):
            if pk == 0:
                continue
            mean_tau += q_seq * pk * k
            y_law = final_row(k)
            if k >= 2:
                law[xs[0]][xs[1]] += q_seq * pk
            elif k == 1:
                for y, py in enumerate(y_law):
                    law[xs[0]][y] += q_seq * pk * py
            else:
                for y, py in enumerate(y_law):
                    nxt = P[model.row_of((y,))]
                    for t2 in range(V):
                        law[y][t2] += q_seq * pk * py * nxt[t2]
    return torch.tensor(law, dtype=torch.float64), mean_tau


MODELS = [(4, "full", 1), (4, "onehot", 2), (4, "sparse", 3), (3, "full", 4)]


@pytest.mark.parametrize("g", [1, 2, 3])
@pytest.mark.parametrize("vocab,kind,seed", MODELS)
def test_algorithm_2_as_read_is_lossless_and_beats_token_wise(vocab, kind, seed, g):
    """Our reading of Algorithm 2 (the enumeration above) gives exactly the target law, and
    E[tau] >= token-wise; both mutations change the law."""
    model = PrefixModel(vocab, g, kind, seed)
    target = model.target_pair_law()
    block, block_tau = exact_law(model, g, "block")
    token, token_tau = exact_law(model, g, "token")
    assert torch.allclose(block, target, atol=1e-6, rtol=0)  # float32 tables, float64 sums
    assert torch.allclose(token, target, atol=1e-6, rtol=0)
    assert block_tau >= token_tau - 1e-6  # equal for one-hot drafts, up to the float32 tables
    if g >= 2 and kind != "onehot":
        for mutant in ("h=p", "no-scale"):
            wrong, _ = exact_law(model, g, "block", mutant)
            assert (wrong - target).abs().sum() > 1e-3, mutant


# ---------------------------------------------------------------- exact expected accepted length

def fraction_block_tau(p, q, g):
    """E[tau] of Algorithm 2 with context-independent p, q (exact Fractions)."""
    total = Fraction(0)
    for xs in itertools.product(range(len(p)), repeat=g):
        q_seq = math.prod((q[x] for x in xs), start=Fraction(1))
        if q_seq == 0:
            continue
        h = exact_block_thresholds(p, q, xs)
        for k in range(1, g + 1):  # P(tau = k) = h_k prod_{j > k} (1 - h_j)
            total += q_seq * k * h[k - 1] * math.prod((1 - h[j - 1] for j in range(k + 1, g + 1)), start=Fraction(1))
    return total


def fraction_token_tau(p, q, g):
    alpha = sum(min(a, b) for a, b in zip(p, q))
    return sum(alpha**k for k in range(1, g + 1))


def shipped_mean_tau(fn, p, q, g, thresholds_of):
    """E[tau] of a shipped verifier by enumeration: every draft sequence, and for each coin
    the two cells [0, t) and [t, 1) of its exact threshold t, probed at their midpoints."""
    V = len(p)
    rows, weights = [], []
    for xs in itertools.product(range(V), repeat=g):
        q_seq = math.prod((q[x] for x in xs), start=Fraction(1))
        if q_seq == 0:
            continue
        t = thresholds_of(xs)
        for cells in itertools.product((0, 1), repeat=g):
            width = q_seq * math.prod((t[i] if c == 0 else 1 - t[i] for i, c in enumerate(cells)), start=Fraction(1))
            if width == 0:
                continue
            etas = [float(t[i] / 2) if c == 0 else float((1 + t[i]) / 2) for i, c in enumerate(cells)]
            rows.append((xs, etas))
            weights.append(width)
    n = len(rows)
    target = torch.tensor([float(x) for x in p]).expand(n, g + 1, V).contiguous()
    draft = torch.tensor([float(x) for x in q]).expand(n, g, V).contiguous()
    drafts = torch.tensor([r[0] for r in rows], dtype=torch.int64)
    uniforms = torch.tensor([r[1] + [0.5] for r in rows], dtype=torch.float64)
    _, accepted = fn(target, draft, drafts, uniforms=uniforms)
    return sum(float(w) * int(a) for w, a in zip(weights, accepted))


def exact_block_thresholds(p, q, xs):
    g = len(xs)
    pc = [Fraction(1)]
    for x in xs:
        pc.append(min(Fraction(1), pc[-1] * p[x] / q[x]))
    h = []
    for i in range(1, g + 1):
        if i == g:
            h.append(pc[g])
        else:
            z = sum(max(pc[i] * a - b, Fraction(0)) for a, b in zip(p, q))
            h.append(z / (z + 1 - pc[i]) if z + 1 - pc[i] > 0 else Fraction(1))
    return h


def exact_token_thresholds(p, q, xs):
    return [min(Fraction(1), p[x] / q[x]) for x in xs]


F = Fraction
HAND_CASES = [
    # the paper's motivating example (Section 1): p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2:
    # token-wise E[tau] = 10/9, block verification 11/9
    ((F(1, 3), F(2, 3)), (F(2, 3), F(1, 3)), 2, F(11, 9), F(10, 9)),
    ((F(1, 2), F(1, 4), F(1, 4)), (F(1, 4), F(1, 2), F(1, 4)), 2, None, None),
    ((F(1, 8), F(3, 8), F(1, 2)), (F(1, 2), F(1, 4), F(1, 4)), 2, None, None),
    ((F(1, 2), F(1, 2)), (F(1, 2), F(1, 2)), 2, F(2), F(2)),  # p == q: everything accepted
    ((F(1, 4), F(3, 4)), (F(1), F(0)), 2, None, None),  # one-hot draft
]


@pytest.mark.parametrize("p,q,g,block_closed,token_closed", HAND_CASES)
def test_expected_accepted_length_exact(p, q, g, block_closed, token_closed):
    block_exact = fraction_block_tau(p, q, g)
    token_exact = fraction_token_tau(p, q, g)
    assert block_exact >= token_exact
    if block_closed is not None:
        assert block_exact == block_closed and token_exact == token_closed
    # the shipped references, by the same enumeration
    block = shipped_mean_tau(block_verify, p, q, g, lambda xs: exact_block_thresholds(p, q, xs))
    token = shipped_mean_tau(reference.rejection_sample, p, q, g, lambda xs: exact_token_thresholds(p, q, xs))
    assert block == pytest.approx(float(block_exact), abs=1e-12)
    assert token == pytest.approx(float(token_exact), abs=1e-12)
    assert block >= token - 1e-12


def test_one_hot_residual_mass_closed_form():
    """One-hot drafts: Z(i) = p_i (1 - p(X_{i+1} | X^i)) (up to the 2^-40 fixed point)."""
    model = PrefixModel(5, 3, "onehot", 7)
    target, draft, drafts = model.sample_step(64, 3, torch.Generator().manual_seed(0))
    p_cum = bv.prefix_ratios(target, draft, drafts, torch.ones_like(drafts, dtype=torch.bool))
    masses = bv.residual_masses(p_cum, target, draft)
    p_next = target[:, :3].gather(2, drafts.unsqueeze(2)).squeeze(2).double()
    closed = p_cum[:, :3].double() * (1.0 - p_next)
    assert torch.allclose(masses, closed, atol=5 * 2.0**-40 + 1e-7, rtol=0)


@pytest.mark.parametrize("vocab,kind,seed", MODELS)
def test_shipped_thresholds_match_enumeration(vocab, kind, seed):
    g = 3
    model = PrefixModel(vocab, g, kind, seed)
    P, Q = model.p.double().tolist(), model.q.double().tolist()
    seqs = list(itertools.product(range(vocab), repeat=g))
    drafts = torch.tensor(seqs, dtype=torch.int64)
    target = torch.stack([model.p[model.row(drafts[:, :d])] for d in range(g + 1)], dim=1)
    draft = torch.stack([model.q[model.row(drafts[:, :d])] for d in range(g)], dim=1)
    p_cum = bv.prefix_ratios(target, draft, drafts, torch.ones_like(drafts, dtype=torch.bool))
    h = bv.acceptance_thresholds(p_cum, bv.residual_masses(p_cum, target, draft), torch.full((len(seqs),), g))
    for b, xs in enumerate(seqs):
        rows = [model.row_of(xs[:d]) for d in range(g + 1)]
        want = block_rule([P[r] for r in rows], [Q[r] for r in rows[:g]], xs, g)[2]
        assert h[b].tolist() == pytest.approx(want, abs=1e-6), xs


# ---------------------------------------------------------------- g = 1 is token-wise verification

def test_g1_equals_token_wise():
    """g = 1: h_1 = p_1 = min(1, p/q) and the residual at tau = 0 is max(p - q, 0): the same
    algorithm as rejection_sample, so the same law, and with the same uniforms the same outputs."""
    for vocab, kind, seed in MODELS:
        model = PrefixModel(vocab, 1, kind, seed)
        block, block_tau = exact_law(model, 1, "block")
        token, token_tau = exact_law(model, 1, "token")
        assert torch.allclose(block, token, atol=1e-12, rtol=0) and block_tau == pytest.approx(token_tau, abs=1e-12)
    gen = torch.Generator().manual_seed(11)
    n, vocab = 4000, 7
    logits = torch.randn(n, 2, vocab, generator=gen) * 2
    logits[torch.rand(n, 2, vocab, generator=gen) < 0.2] = -math.inf
    logits[..., 0] = 0.0
    target = torch.softmax(logits, dim=-1)
    draft = torch.softmax(torch.randn(n, 1, vocab, generator=gen) * 2, dim=-1)
    drafts = torch.multinomial(draft[:, 0], 1, generator=gen)
    uniforms = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    out_b, acc_b = block_verify(target, draft, drafts, uniforms=uniforms)
    out_t, acc_t = reference.rejection_sample(target, draft, drafts, uniforms=uniforms)
    assert torch.equal(acc_b, acc_t) and torch.equal(out_b, out_t)
    seeded_b = block_verify(target, draft, drafts, seed=5)
    seeded_t = reference.rejection_sample(target, draft, drafts, seed=5)
    assert torch.equal(seeded_b[0], seeded_t[0])


# ---------------------------------------------------------------- chi-square of the emitted sequence

def first_two_tokens(model: PrefixModel, out, accepted, gen):
    """The first two tokens of the emitted sequence; when the step emits only one token the
    second is drawn from the target given it (what every later step must produce)."""
    t1 = out[:, 0]
    nxt = torch.multinomial(model.p[model.row(t1.view(-1, 1))], 1, generator=gen).squeeze(1)
    return t1, torch.where(accepted >= 1, out[:, 1], nxt)


def pair_pvalue(model: PrefixModel, g: int, n: int, seed: int, seeded: bool) -> float:
    gen = torch.Generator().manual_seed(seed)
    target, draft, drafts = model.sample_step(n, g, gen)
    if seeded:
        out, accepted = block_verify(target, draft, drafts, seed=seed)
    else:
        out, accepted = block_verify(target, draft, drafts, uniforms=torch.rand(n, g + 1, generator=gen))
    assert bool(((out[:, 0] >= 0) & (out[:, 0] < model.vocab)).all())
    t1, t2 = first_two_tokens(model, out, accepted, gen)
    V = model.vocab
    counts = torch.bincount(t1 * V + t2, minlength=V * V).double()
    expected = model.target_pair_law().flatten() * n
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing the target cannot produce
    return float(stats.chisquare(counts[keep].numpy(), expected[keep].numpy(), sum_check=False).pvalue)


CHI_CASES = [(1, 4, "full"), (2, 4, "full"), (4, 4, "full"), (1, 5, "onehot"), (2, 4, "onehot"),
             (4, 4, "onehot"), (2, 5, "sparse"), (4, 3, "sparse")]


@pytest.mark.parametrize("g,vocab,kind", CHI_CASES)
def test_emitted_pair_matches_target_chi_square(g, vocab, kind):
    model = PrefixModel(vocab, g, kind, seed=100 + g)
    assert pair_pvalue(model, g, 200_000, seed=10 + g, seeded=False) > 1e-4
    assert pair_pvalue(model, g, 200_000, seed=50 + g, seeded=True) > 1e-4


def thresholds_without_residual(p_cum, masses, num_drafts):
    """Mutation: h_i = p_i (the residual mass left out)."""
    g = masses.shape[1]
    index = torch.arange(1, g + 1).unsqueeze(0)
    p_i = p_cum[:, 1:].double()
    return torch.where(index <= num_drafts.unsqueeze(1), p_i, torch.zeros_like(p_i))


def residuals_without_scale(scale, target_rows, draft_rows):
    """Mutation: max(p - q, 0) instead of max(p_j p - q, 0) (masses and final draw)."""
    return MUTATED["residual_weights"](torch.ones_like(scale), target_rows, draft_rows)


MUTATED = {"residual_weights": bv.residual_weights}


@pytest.mark.parametrize("mutant,patch", [("h=p", ("acceptance_thresholds", thresholds_without_residual)),
                                          ("no-scale", ("residual_weights", residuals_without_scale))])
def test_mutations_fail_chi_square(monkeypatch, mutant, patch):
    g, vocab = 2, 4
    model = PrefixModel(vocab, g, "full", seed=102)
    wrong, _ = exact_law(model, g, "block", mutant)
    assert (wrong - model.target_pair_law()).abs().sum() > 0.02  # the mutation is visible at this size
    assert pair_pvalue(model, g, 200_000, seed=3, seeded=False) > 1e-4
    monkeypatch.setattr(bv, *patch)
    assert pair_pvalue(model, g, 200_000, seed=3, seeded=False) < 1e-8


def test_block_accepts_more_on_sampled_drafts():
    """Same drafts, same uniforms: the mean accepted length is at least token-wise (well
    beyond noise on this pair) and agrees with the enumerated expectation."""
    g, vocab = 4, 4
    model = PrefixModel(vocab, g, "full", seed=104)
    _, block_tau = exact_law(model, g, "block")
    _, token_tau = exact_law(model, g, "token")
    assert block_tau > token_tau + 0.02
    gen = torch.Generator().manual_seed(9)
    n = 40_000
    target, draft, drafts = model.sample_step(n, g, gen)
    uniforms = torch.rand(n, g + 1, generator=gen)
    _, acc_b = block_verify(target, draft, drafts, uniforms=uniforms)
    _, acc_t = reference.rejection_sample(target, draft, drafts, uniforms=uniforms)
    for acc, want in ((acc_b, block_tau), (acc_t, token_tau)):
        se = acc.double().std().item() / math.sqrt(n)
        assert abs(acc.double().mean().item() - want) < 5 * se


# ---------------------------------------------------------------- ragged rows, edges, seeds, bad inputs

def random_case(seed, batch=16, g=4, vocab=9, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * 2
    logits[torch.rand(batch, g + 1, vocab, generator=gen) < 0.3] = -math.inf
    logits[..., 0] = 0.0
    target = torch.softmax(logits, dim=-1).to(dtype)
    draft = torch.softmax(logits[:, :g] + torch.randn(batch, g, vocab, generator=gen), dim=-1).to(dtype)
    drafts = torch.multinomial(draft.float().reshape(-1, vocab), 1, generator=gen).view(batch, g)
    counts = torch.randint(0, g + 1, (batch,), generator=gen)
    uniforms = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
    return target, draft, drafts, counts, uniforms


def oracle_block_verify(p, q, drafts, u, n_b):
    """The docstring's arithmetic as a scalar loop: p [g+1][V], q [g][V], drafts [g], u [g+1]."""
    vocab, g = len(p[0]), len(drafts)
    with np.errstate(all="ignore"):
        pc = [1.0]  # p_0..p_g, float32 values
        for i in range(g):
            x = drafts[i]
            if i >= n_b or not 0 <= x < vocab:
                pc.append(0.0)
                continue
            r = float(np.float64(pc[-1]) * np.float64(p[i][x]) / np.float64(q[i][x]))
            pc.append(float(np.float32(0.0 if r != r else min(max(r, 0.0), 1.0))))

        def residual(j):
            return [oracles.weight(np.float64(pc[j]) * np.float64(a) - np.float64(b)) for a, b in zip(p[j], q[j])]

        tau = 0
        for i in range(1, n_b + 1):
            if i == n_b:
                h = pc[i]
            else:
                z = sum(residual(i)) / 2**40
                denom = z + (1.0 - pc[i])
                h = z / denom if denom > 0 else 1.0
            if float(u[i - 1]) < h:
                tau = i
    primary = [oracles.weight(v) for v in p[tau]] if tau == n_b else residual(tau)
    y = oracles.draw_or_fallback(primary, p[tau], float(u[g]))
    return oracles.pad(list(drafts[:tau]) + [y], g + 1), tau


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_matches_scalar_loop_bit_for_bit(seed, dtype):
    target, draft, drafts, counts, uniforms = random_case(20 + seed, batch=24, g=5, vocab=11, dtype=dtype)
    drafts[0, 1] = -1  # padding id inside the row
    target[1, 2] = float("nan")
    draft[2, 0] = 0.0  # q == 0 everywhere at position 0: p_1 = 1
    draft[3] = target[3, :5]  # p == q: every ratio 1, empty residuals
    drafts[4] = target[4, :5].float().argmax(-1)
    out, acc = block_verify(target, draft, drafts, uniforms=uniforms, num_draft_tokens=counts)
    for b in range(drafts.shape[0]):
        want = oracle_block_verify(target[b].float().tolist(), draft[b].float().tolist(), drafts[b].tolist(),
                                   uniforms[b].tolist(), int(counts[b]))
        assert (out[b].tolist(), int(acc[b])) == want, b


@pytest.mark.parametrize("seed", range(3))
def test_ragged_rows_equal_truncated_calls(seed):
    target, draft, drafts, counts, uniforms = random_case(seed)
    g = drafts.shape[1]
    garbage = drafts.clone()
    pad = torch.arange(g).unsqueeze(0) >= counts.unsqueeze(1)
    garbage[pad] = -1  # slots past n_b are never read
    target_g = target.clone()
    draft_g = draft.clone()
    for b in range(drafts.shape[0]):
        n = int(counts[b])
        target_g[b, n + 1:] = float("nan")
        draft_g[b, n:] = float("nan")
    out, acc = block_verify(target_g, draft_g, garbage, uniforms=uniforms, num_draft_tokens=counts)
    seeds, offsets = torch.arange(16) * 31 + seed, torch.arange(16) * 3
    seeded, seeded_acc = block_verify(target_g, draft_g, garbage.to(torch.int32), seed=seeds, offsets=offsets,
                                      num_draft_tokens=counts.to(torch.int32))
    for b in range(drafts.shape[0]):
        n = int(counts[b])
        u = torch.cat([uniforms[b:b + 1, :n], uniforms[b:b + 1, g:]], dim=1)  # the final draw: column g
        want, want_acc = block_verify(target[b:b + 1, :n + 1], draft[b:b + 1, :n], drafts[b:b + 1, :n], uniforms=u)
        assert int(acc[b]) == int(want_acc[0]) <= n
        assert out[b, :n + 1].tolist() == want[0].tolist() and bool((out[b, n + 1:] == -1).all())
        # seeded: per-request seeds key draws by (seed, position) only, so the row alone agrees
        alone, alone_acc = block_verify(target[b:b + 1, :n + 1], draft[b:b + 1, :n], drafts[b:b + 1, :n],
                                        seed=seeds[b:b + 1], offsets=offsets[b:b + 1])
        assert int(seeded_acc[b]) == int(alone_acc[0])
        assert seeded[b, :n + 1].tolist() == alone[0].tolist() and bool((seeded[b, n + 1:] == -1).all())


def test_seeds_are_deterministic_and_batch_invariant():
    target, draft, drafts, counts, _ = random_case(4)
    seeds = torch.arange(16) * 7919 + 1
    offsets = torch.arange(16) * 5
    a = block_verify(target, draft, drafts, seed=seeds, offsets=offsets, num_draft_tokens=counts)
    b = block_verify(target, draft, drafts, seed=seeds, offsets=offsets, num_draft_tokens=counts)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    c = block_verify(target[perm], draft[perm], drafts[perm], seed=seeds[perm], offsets=offsets[perm],
                     num_draft_tokens=counts[perm])
    assert torch.equal(c[0], a[0][perm]) and torch.equal(c[1], a[1][perm])
    d = block_verify(target, draft, drafts, seed=seeds, offsets=offsets + 1, num_draft_tokens=counts)
    assert not torch.equal(d[0], a[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_index_widths_and_strides(dtype):
    target, draft, drafts, counts, uniforms = random_case(5, dtype=dtype)
    out, acc = block_verify(target, draft, drafts, uniforms=uniforms, num_draft_tokens=counts)
    wide = torch.zeros(drafts.shape[0], drafts.shape[1] * 2, dtype=torch.int32)
    wide[:, ::2] = drafts.to(torch.int32)
    out2, acc2 = block_verify(target, draft, wide[:, ::2], uniforms=uniforms, num_draft_tokens=counts.to(torch.int32))
    u32 = uniforms.float().clamp(max=1 - 2.0**-24)  # float32 uniforms are accepted too
    assert torch.equal(block_verify(target, draft, drafts, uniforms=u32)[0],
                       block_verify(target, draft, drafts.to(torch.int32), uniforms=u32.double())[0])
    assert out.dtype == torch.int64 and acc.dtype == torch.int64
    assert torch.equal(acc, acc2) and torch.equal(out, out2)
    valid = torch.arange(drafts.shape[1] + 1).unsqueeze(0) <= acc.unsqueeze(1)
    assert bool(((out >= 0) & (out < target.shape[-1]))[valid].all()) and bool((out[~valid] == -1).all())


def test_edge_rows_give_ids_in_range():
    """NaN, inf, all-zero and p == q rows, q == 0 < p, p == 0, -1 drafts, g = 0."""
    V, g = 6, 3
    target = torch.full((7, g + 1, V), 1.0 / V)
    draft = torch.full((7, g, V), 1.0 / V)
    drafts = torch.tensor([[1, 2, 3]] * 7)
    target[0] = float("nan")
    draft[1] = float("nan")
    target[2] = 0.0
    target[3, :, 0] = float("inf")
    draft[4, :, 1] = 0.0
    draft[4, :, 2] = 2.0 / V  # q == 0 < p at token 1: p_1 = 1
    target[5, :, 2] = 0.0  # p == 0 at the draft: never accepted from there on
    drafts[6, 1] = -1
    drafts[4] = 1
    for uniforms in (torch.zeros(7, g + 1), torch.full((7, g + 1), 1 - 2.0**-53, dtype=torch.float64),
                     torch.rand(7, g + 1, generator=torch.Generator().manual_seed(0))):
        out, acc = block_verify(target, draft, drafts, uniforms=uniforms)
        emitted = out.gather(1, acc.unsqueeze(1)).squeeze(1)
        assert bool(((emitted >= 0) & (emitted < V)).all()), out
        assert int(acc[5]) <= 1 and int(acc[6]) <= 1
    out, acc = block_verify(target, draft, drafts, uniforms=torch.zeros(7, g + 1))
    assert int(acc[4]) == g  # every threshold is 1 when p_i = 1 throughout
    assert out[2].tolist() == [0, -1, -1, -1] and out[0].tolist() == [0, -1, -1, -1]  # no mass: lowest index
    empty = block_verify(target[:, :1], draft[:, :0], drafts[:, :0], uniforms=torch.rand(7, 1))
    assert empty[1].tolist() == [0] * 7 and bool(((empty[0][:, 0] >= 0) & (empty[0][:, 0] < V)).all())


@pytest.mark.parametrize("mutate,error,needle", [
    (lambda a: a.update(target_probs=a["target_probs"][:, :-1]), ValueError, "`target_probs`"),
    (lambda a: a.update(draft_probs=a["draft_probs"].double()), TypeError, "`draft_probs`"),
    (lambda a: a.update(draft_probs=a["draft_probs"].half()), TypeError, "`target_probs` and `draft_probs`"),
    (lambda a: a.update(draft_tokens=a["draft_tokens"].float()), TypeError, "`draft_tokens`"),
    (lambda a: a.update(draft_tokens=a["draft_tokens"] + 9), ValueError, "`draft_tokens`"),
    (lambda a: a.update(num_draft_tokens=torch.full((16,), 5)), ValueError, "`num_draft_tokens`"),
    (lambda a: a.update(num_draft_tokens=torch.zeros(3, dtype=torch.int64)), ValueError, "`num_draft_tokens`"),
    (lambda a: a.update(uniforms=a["uniforms"] + 1), ValueError, "`uniforms`"),
    (lambda a: a.update(uniforms=a["uniforms"][:, :-1]), ValueError, "`uniforms`"),
    (lambda a: a.update(seed=3), ValueError, "`uniforms`"),
    (lambda a: (a.pop("uniforms"), a.update(seed=1.5)), TypeError, "`seed`"),
    (lambda a: (a.pop("uniforms"), a.update(seed=2**64)), ValueError, "`seed`"),
    (lambda a: (a.pop("uniforms"), a.update(seed=torch.zeros(2, dtype=torch.int64))), ValueError, "`seed`"),
    (lambda a: a.update(offsets=torch.zeros(16, dtype=torch.int64)), ValueError, "`offsets`"),
    (lambda a: (a.pop("uniforms"), a.update(seed=1, offsets=torch.zeros(16))), TypeError, "`offsets`"),
    (lambda a: a.update(target_probs=[1.0]), TypeError, "`target_probs`"),
])
def test_bad_inputs_name_the_argument(mutate, error, needle):
    """The public op validates (the reference takes validated inputs, like every reference op)."""
    block_verify = functools.partial(ops.block_verify, backend="torch")
    target, draft, drafts, counts, uniforms = random_case(6)
    args = dict(target_probs=target, draft_probs=draft, draft_tokens=drafts, uniforms=uniforms,
                num_draft_tokens=counts)
    mutate(args)
    with pytest.raises(error, match=needle) as info:
        block_verify(args.pop("target_probs"), args.pop("draft_probs"), args.pop("draft_tokens"), **args)
    assert str(info.value).startswith("block_verify: ") and "\n" not in str(info.value)
    neither = dict(target_probs=target, draft_probs=draft, draft_tokens=drafts)
    with pytest.raises(ValueError, match="exactly one of `uniforms`"):
        block_verify(neither["target_probs"], neither["draft_probs"], neither["draft_tokens"])


def test_a_coin_below_zero_keeps_nothing_it_should_not():
    """The op cannot inspect a caller's coins on a GPU: a negative one passes only where p_i > 0, so it
    never keeps a slot past n_b, a -1 padding draft, or a prefix the target gives no mass."""
    V = 5
    target = torch.full((3, 4, V), 1.0 / V)
    draft = torch.full((3, 3, V), 1.0 / V)
    drafts = torch.tensor([[1, 2, 3], [1, -1, 3], [1, 2, 3]])
    target[2, 1, 2] = 0.0  # p(X_2) = 0: p_2 = p_3 = 0
    uniforms = torch.tensor([[0.9, -0.25, 0.5, 0.3], [0.9, -0.25, 0.5, 0.3], [0.9, 0.9, -0.25, 0.3]],
                            dtype=torch.float64)
    out, acc = block_verify(target, draft, drafts, uniforms=uniforms, num_draft_tokens=torch.tensor([1, 3, 3]))
    assert acc.tolist() == [1, 1, 1]
    assert bool((out >= -1).all()) and out[1, 0] == 1 and out[1, 1] != -1
