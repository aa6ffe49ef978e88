"""block_verify_logits (torch backend) against the exact target law: chi-square of the first two
emitted tokens jointly, on toy models whose target and draft logits are tables indexed by the
whole prefix, with a temperature (scalar and per-row), full-q and one-hot drafts, g in {1, 2, 4}.
Two mutations must fail it: the draft's temperature left out (q != the law the drafts came
from) and thresholds without the residual mass (h_i = p_i). The probs path has its own
chi-square in tests/test_reference_block_verify.py; the Triton backend is compared with this
one bit for bit (up to its documented margin) in tests/test_triton_block_verify.py.
"""

import math

import pytest
import torch
from scipy import stats

from specdec_kernels import ops, reference
from specdec_kernels.common import registry
from specdec_kernels.reference import block_verification as bv

N = 200_000


class LogitModel:
    """Target and draft logit tables over every prefix of length 0..depth (vocabulary V)."""

    def __init__(self, vocab: int, depth: int, kind: str, temperature: float, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.vocab, self.temperature = vocab, temperature
        self.offsets = [sum(vocab**k for k in range(n)) for n in range(depth + 2)]
        rows = self.offsets[depth + 1]
        self.target = (torch.randn(rows, vocab, generator=gen) * 1.5).float()
        draft = self.target + torch.randn(rows, vocab, generator=gen)
        if kind == "onehot":  # deterministic drafts: one finite logit, softmax is exactly one-hot
            draft = torch.where(torch.nn.functional.one_hot(draft.argmax(-1), vocab).bool(), 0.0, -math.inf)
        self.draft = draft.float()
        self.p = torch.softmax(self.target.double() / temperature, -1)  # the exact target law
        self.q = torch.softmax(self.draft.double() / temperature, -1)

    def row(self, prefix: torch.Tensor) -> torch.Tensor:
        n, k = prefix.shape
        code = torch.zeros(n, dtype=torch.int64)
        for j in range(k):
            code = code * self.vocab + prefix[:, j]
        return code + self.offsets[k]

    def sample_step(self, n: int, g: int, gen: torch.Generator):
        """Drafts sampled from q = softmax(draft / T), and the op's logit inputs for them."""
        drafts = torch.zeros(n, g, dtype=torch.int64)
        for d in range(g):
            drafts[:, d] = torch.multinomial(self.q[self.row(drafts[:, :d])].float(), 1, generator=gen).squeeze(1)
        target = torch.stack([self.target[self.row(drafts[:, :d])] for d in range(g + 1)], dim=1)
        draft = torch.stack([self.draft[self.row(drafts[:, :d])] for d in range(g)], dim=1)
        return target, draft, drafts

    def pair_law(self) -> torch.Tensor:
        """[V, V] float64: p(t1) p(t2 | t1)."""
        second = self.p[self.row(torch.arange(self.vocab).view(-1, 1))]
        return self.p[0].unsqueeze(1) * second


def pair_pvalue(model: LogitModel, g: int, seed: int, per_row_temperature: bool) -> float:
    gen = torch.Generator().manual_seed(seed)
    target, draft, drafts = model.sample_step(N, g, gen)
    temperature = torch.full((N,), model.temperature) if per_row_temperature else model.temperature
    randomness = dict(seed=seed) if per_row_temperature else dict(uniforms=torch.rand(N, g + 1, generator=gen))
    out, accepted = ops.block_verify_logits(target, draft, drafts, temperature=temperature, backend="torch",
                                            **randomness)
    t1 = out[:, 0]
    assert bool(((t1 >= 0) & (t1 < model.vocab)).all())
    # a step that emits one token: its second is the next step's, drawn from the target given t1
    nxt = torch.multinomial(model.p[model.row(t1.view(-1, 1))].float(), 1, generator=gen).squeeze(1)
    t2 = torch.where(accepted >= 1, out[:, 1], nxt)
    V = model.vocab
    counts = torch.bincount(t1 * V + t2, minlength=V * V).double()
    expected = model.pair_law().flatten() * N
    return float(stats.chisquare(counts.numpy(), expected.numpy(), sum_check=False).pvalue)


CASES = [(1, 5, "full", 0.7), (2, 4, "full", 1.0), (4, 4, "full", 1.3), (1, 4, "onehot", 0.8),
         (2, 4, "onehot", 1.0), (4, 3, "onehot", 0.6)]


@pytest.mark.parametrize("g,vocab,kind,temperature", CASES)
def test_emitted_pair_matches_the_target_law(g, vocab, kind, temperature):
    model = LogitModel(vocab, g, kind, temperature, seed=200 + g)
    assert pair_pvalue(model, g, seed=20 + g, per_row_temperature=False) > 1e-4
    assert pair_pvalue(model, g, seed=60 + g, per_row_temperature=True) > 1e-4


def draft_without_temperature(target_logits, draft_logits, draft_tokens, *, temperature=1.0, **kwargs):
    """Mutation: q = softmax(draft_logits), not softmax(draft_logits / T)."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.float().view(-1, 1, 1)
    target_probs = torch.softmax(target_logits.float() / temperature, dim=-1)
    draft_probs = torch.softmax(draft_logits.float(), dim=-1)
    return reference.block_verify(target_probs, draft_probs, draft_tokens, **kwargs)


def thresholds_without_residual(p_cum, masses, num_drafts):
    """Mutation: h_i = p_i (the residual mass left out)."""
    index = torch.arange(1, masses.shape[1] + 1).unsqueeze(0)
    p_i = p_cum[:, 1:].double()
    return torch.where(index <= num_drafts.unsqueeze(1), p_i, torch.zeros_like(p_i))


@pytest.mark.parametrize("mutant", ["draft-without-temperature", "h=p"])
def test_mutations_fail(monkeypatch, mutant):
    g, vocab = 2, 4
    model = LogitModel(vocab, g, "full", 0.5, seed=7)
    assert pair_pvalue(model, g, seed=3, per_row_temperature=False) > 1e-4
    if mutant == "h=p":
        monkeypatch.setattr(bv, "acceptance_thresholds", thresholds_without_residual)
    else:
        monkeypatch.setitem(registry._IMPLS["block_verify_logits"], "torch", draft_without_temperature)
    assert pair_pvalue(model, g, seed=3, per_row_temperature=False) < 1e-8


def test_selftest_comparator_excuses_only_boundary_rows():
    """The GPU selftest's `compare_block_logits`: the reference's own answer passes, a row whose
    final token moved far from any decision boundary fails."""
    from specdec_kernels.selftest.cases_block_verification import compare_block_logits

    gen = torch.Generator().manual_seed(1)
    batch, g, vocab = 64, 3, 50
    target = torch.randn(batch, g + 1, vocab, generator=gen) * 3
    draft = target[:, :g] + torch.randn(batch, g, vocab, generator=gen) * 0.7
    drafts = torch.multinomial(torch.softmax(draft / 0.8, -1).reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    inputs = dict(target_logits=target, draft_logits=draft, draft_tokens=drafts, temperature=0.8,
                  uniforms=torch.rand(batch, g + 1, generator=gen, dtype=torch.float64))
    want = reference.block_verify_logits(**inputs)
    assert compare_block_logits(tuple(t.clone() for t in want), want, inputs) == (0.0, None)
    got = want[0].clone(), want[1].clone()
    b = 5
    tau = int(got[1][b])
    got[0][b, tau] = (got[0][b, tau] + vocab // 2) % vocab  # far from the drawn cdf boundary
    _, problem = compare_block_logits(got, want, inputs)
    assert problem is not None and "row 5" in problem
