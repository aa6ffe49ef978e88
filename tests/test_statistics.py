"""Chi-square tests: speculative sampling (chain and tree) reproduces the target distribution.

Each test runs >= 100,000 independent rows in one batched call, with drafts sampled from
q and uniforms from a seeded generator, and compares the emitted tokens with the exact
target probabilities. Seeds are fixed, so the tests are deterministic.
"""

import pytest
import torch
from scipy import stats

from specdec_kernels import ops
from specdec_kernels.reference import rejection_sampling

DRAWS = 120_000
P_MIN = 1e-4  # reject the null below this p-value


def chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square of observed token counts against probs; cells with expected count
    below 5 are merged, and any draw of a zero-probability token fails outright."""
    vocab = probs.numel()
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = probs.double() * tokens.numel()
    if bool((counts[probs == 0] > 0).any()):
        return 0.0
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    if int(keep.sum()) < 2:
        return 1.0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def dist(vocab: int, gen: torch.Generator, zeros: float = 0.0) -> torch.Tensor:
    p = torch.rand(vocab, generator=gen) ** 2
    p[torch.rand(vocab, generator=gen) < zeros] = 0
    p[int(torch.randint(0, vocab, (1,), generator=gen))] += 0.05
    return p / p.sum()


def chain_cases():
    gen = torch.Generator().manual_seed(0)
    cases = {}
    for vocab in (8, 17, 32):
        cases[f"random-V{vocab}"] = (dist(vocab, gen), dist(vocab, gen))
    p = dist(12, gen)
    q = dist(12, gen)
    q[p > p.median()] = 0  # q is zero where p is not: those tokens only come from the residual
    cases["q-zero-where-p-positive"] = (p, q / q.sum())
    p = dist(10, gen)
    cases["p-equals-q"] = (p, p.clone())
    cases["one-hot-p"] = (torch.nn.functional.one_hot(torch.tensor(3), 16).float(), dist(16, gen))
    q = torch.zeros(9)
    q[:4] = 0.25
    p = torch.zeros(9)
    p[4:] = 0.2
    cases["disjoint-supports"] = (p, q)
    return cases


RANDOMNESS = ("uniforms", "int_seed", "row_seeds")


def randomness_kwargs(mode: str, rows: int, width: int, gen: torch.Generator, device="cpu") -> dict:
    """Caller uniforms [rows, width], one int seed (rows keyed by batch index), or one
    seed per row (row key 0) with per-row offsets: the three ways to feed the ops."""
    if mode == "uniforms":
        return {"uniforms": torch.rand(rows, width, generator=gen, dtype=torch.float64).to(device)}
    if mode == "int_seed":
        return {"seed": int(torch.randint(0, 2**62, (1,), generator=gen))}
    seeds = torch.randint(-(2**62), 2**62, (rows,), generator=gen)
    offsets = torch.randint(0, 2**20, (rows,), generator=gen)
    return {"seed": seeds.to(device), "offsets": offsets.to(device)}


def run_chain(p0: torch.Tensor, q0: torch.Tensor, p1: torch.Tensor, seed: int, *, mode: str = "uniforms",
              backend: str = "torch", device="cpu", draws: int = DRAWS):
    """Two drafts per row: position 0 uses (p0, q0), position 1 (p1, q0); bonus from p1."""
    vocab = p0.numel()
    gen = torch.Generator().manual_seed(seed)
    target = torch.stack([p0, p1, p1]).expand(draws, 3, vocab).to(device)
    draft = torch.stack([q0, q0]).expand(draws, 2, vocab).to(device)
    drafts = torch.multinomial(q0, draws * 2, replacement=True, generator=gen).reshape(draws, 2).to(device)
    randomness = randomness_kwargs(mode, draws, 3, gen, device)
    out, accepted = ops.rejection_sample(target, draft, drafts, backend=backend, **randomness)
    return out.cpu(), accepted.cpu()


def check_chain_statistics(p, q, p1, out, accepted, draws=DRAWS):
    assert chi_square_pvalue(out[:, 0], p) > P_MIN
    second = out[accepted >= 1, 1]  # the second emitted token follows p1 whatever came first
    if second.numel() > 1000:
        assert chi_square_pvalue(second, p1) > P_MIN
    # acceptance of the first draft happens with probability sum(min(p, q)) (Leviathan Thm 3.5)
    alpha = float(torch.minimum(p, q).sum())
    rate = float((accepted >= 1).double().mean())
    assert abs(rate - alpha) < 5 * (alpha * (1 - alpha) / draws) ** 0.5 + 1e-9


@pytest.mark.parametrize("name", list(chain_cases()))
def test_rejection_sample_reproduces_target(name):
    p, q = chain_cases()[name]
    p1 = torch.roll(p, 1)
    out, accepted = run_chain(p, q, p1, seed=1)
    check_chain_statistics(p, q, p1, out, accepted)


@pytest.mark.parametrize("mode", ["int_seed", "row_seeds"])
@pytest.mark.parametrize("name", ["random-V17", "q-zero-where-p-positive", "disjoint-supports"])
def test_seeded_rejection_sample_reproduces_target(name, mode):
    """The counter-based (Philox) draws of the seeded mode, which every backend reproduces
    bit for bit, give the target distribution too: coins and final draws are independent
    across rows, positions and purposes."""
    p, q = chain_cases()[name]
    p1 = torch.roll(p, 1)
    out, accepted = run_chain(p, q, p1, seed=2, mode=mode)
    check_chain_statistics(p, q, p1, out, accepted)


def test_chi_square_catches_a_wrong_residual(monkeypatch):
    """Mutation check: resampling from p instead of norm(max(0, p - q)) must be detected."""
    p, q = chain_cases()["random-V17"]
    correct = rejection_sampling.sample_with_fallback
    monkeypatch.setattr(rejection_sampling, "sample_with_fallback", lambda primary, fallback, u: correct(fallback, fallback, u))
    out, _ = run_chain(p, q, torch.roll(p, 1), seed=1)
    assert chi_square_pvalue(out[:, 0], p) < 1e-12


def build_tree_batch(p0, q0, p1, q1, gen, one_hot_first_level=False):
    """Root with 3 children, each with 2 children: N = 10 nodes per row.

    Level-1 tokens are i.i.d. from q0 (or the 3 distinct most likely tokens of q0 with
    one-hot draft rows); level-2 tokens under a child with token t are i.i.d. from q1[t].
    The target at the root is p0 and at a level-1 node with token t is p1[t].
    """
    vocab = p0.numel()
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]).expand(DRAWS, 10)
    tokens = torch.zeros(DRAWS, 10, dtype=torch.int64)
    if one_hot_first_level:
        top3 = torch.topk(q0, 3).indices
        tokens[:, 1:4] = top3
        level1_q = torch.nn.functional.one_hot(top3, vocab).float().expand(DRAWS, 3, vocab)
    else:
        tokens[:, 1:4] = torch.multinomial(q0, DRAWS * 3, replacement=True, generator=gen).reshape(DRAWS, 3)
        level1_q = q0.expand(DRAWS, 3, vocab)
    parent_tokens = tokens[:, [1, 1, 2, 2, 3, 3]]
    tokens[:, 4:] = torch.multinomial(q1[parent_tokens.reshape(-1)], 1, generator=gen).reshape(DRAWS, 6)
    target = torch.empty(DRAWS, 10, vocab)
    target[:, 0] = p0
    target[:, 1:4] = p1[tokens[:, 1:4]]
    target[:, 4:] = p0  # leaves: the bonus distribution (any fixed choice)
    draft = torch.zeros(DRAWS, 10, vocab)
    draft[:, 1:4] = level1_q
    draft[:, 4:] = q1[parent_tokens]
    return target, draft, tokens, parents


def run_tree(vocab: int, one_hot: bool, *, mode: str = "uniforms", backend: str = "torch", device="cpu"):
    gen = torch.Generator().manual_seed(vocab)
    p0, q0 = dist(vocab, gen, zeros=0.2), dist(vocab, gen)
    p1 = torch.stack([dist(vocab, gen, zeros=0.2) for _ in range(vocab)])
    q1 = torch.stack([dist(vocab, gen) for _ in range(vocab)])
    target, draft, tokens, parents = build_tree_batch(p0, q0, p1, q1, gen, one_hot_first_level=one_hot)
    randomness = randomness_kwargs(mode, DRAWS, 10, gen, device)
    out, accepted, nodes = ops.tree_rejection_sample(target.to(device), draft.to(device), tokens.to(device),
                                                     parents.to(device), backend=backend, **randomness)
    return p0, p1, out.cpu(), accepted.cpu(), nodes.cpu()


def check_tree_statistics(vocab, p0, p1, out, accepted, nodes):
    assert chi_square_pvalue(out[:, 0], p0) > P_MIN
    # given the first token t, the second follows p1[t]: pooled conditional chi-square
    two = accepted >= 1
    first, second = out[two, 0], out[two, 1]
    chi2, dof = 0.0, 0
    for t in range(vocab):
        sel = second[first == t]
        if sel.numel() < 200:
            continue
        expected = p1[t].double() * sel.numel()
        counts = torch.bincount(sel, minlength=vocab).double()
        assert not bool((counts[p1[t] == 0] > 0).any())
        big = expected >= 5
        chi2 += float((((counts - expected) ** 2)[big] / expected[big]).sum())
        dof += int(big.sum()) - 1
    assert dof >= 4 and stats.chi2.sf(chi2, dof) > P_MIN
    # the accepted path is consistent with the tree
    assert bool((nodes[:, 0] == 0).all())
    assert bool(((nodes[two, 1] >= 1) & (nodes[two, 1] <= 3)).all())


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("vocab", [8, 12])
def test_tree_rejection_sample_reproduces_target(vocab, one_hot):
    check_tree_statistics(vocab, *run_tree(vocab, one_hot))


@pytest.mark.parametrize("mode", ["int_seed", "row_seeds"])
def test_seeded_tree_rejection_sample_reproduces_target(mode):
    check_tree_statistics(8, *run_tree(8, one_hot=False, mode=mode))


def test_tree_chi_square_catches_a_wrong_residual(monkeypatch):
    """Mutation check for the tree: drawing the final token from p instead of the residual."""
    from specdec_kernels.reference import tree_verify

    correct = tree_verify.sample_with_fallback
    monkeypatch.setattr(tree_verify, "sample_with_fallback", lambda primary, fallback, u: correct(fallback, fallback, u))
    gen = torch.Generator().manual_seed(8)
    p0, q0 = dist(8, gen, zeros=0.2), dist(8, gen)
    p1 = torch.stack([dist(8, gen, zeros=0.2) for _ in range(8)])
    q1 = torch.stack([dist(8, gen) for _ in range(8)])
    target, draft, tokens, parents = build_tree_batch(p0, q0, p1, q1, gen)
    uniforms = torch.rand(DRAWS, 10, generator=gen, dtype=torch.float64)
    out, _, _ = ops.tree_rejection_sample(target, draft, tokens, parents, uniforms=uniforms, backend="torch")
    assert chi_square_pvalue(out[:, 0], p0) < 1e-12


def test_seeded_chi_square_catches_reused_randomness(monkeypatch):
    """Mutation check of the counter layout: if the final draw reused the coin's counter
    (same salt), a rejected row's final uniform would be biased high; the test must see it."""
    from specdec_kernels.common import rng

    monkeypatch.setattr(rng, "SALT_FINAL", rng.SALT_ACCEPT)
    p, q = chain_cases()["random-V17"]
    out, _ = run_chain(p, q, torch.roll(p, 1), seed=2, mode="int_seed")
    assert chi_square_pvalue(out[:, 0], p) < 1e-12
