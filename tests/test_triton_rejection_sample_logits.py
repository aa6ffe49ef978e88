"""The Triton rejection_sample_logits backend against the torch reference.

The cases are the catalog's (specdec_kernels/selftest/cases_rejection_sampling.py at profile "tiny": every
randomness mode, ragged rows, temperatures 1 / 0.6 / 1.7 / per row, -1 drafts, V = 1, g = 0,
an empty batch, the adversarial rows (NaN / inf / all -inf / huge / p == q / NaN q / NaN
bonus), identical logits, strided / unaligned / position-major / column-major inputs), judged
as `specdec-kernels selftest` judges them: exp and the summation order differ from torch's in
the last ulps, so rows may differ only where a decision lies within 1e-4 of its boundary
(float64), at most 2% of them. Here besides, with this file's stricter near-boundary rule
(MARGIN below): the launch plans the catalog cannot pick (split rows), seeded determinism and
batch invariance, and the distribution (chi-square, with a mutation check). Here a row may
differ only where a decision lies within MARGIN of its boundary, measured on float64
probabilities (`near_boundary_rows`). Runs on CPU tensors under the Triton interpreter
(TRITON_INTERPRET=1), so shapes are small.
"""

import pytest
import torch
from catalog_support import catalog_cases, check_case
from scipy import stats

from specdec_kernels import ops, reference
from specdec_kernels.common import rng
from specdec_kernels.common.draws import seed_and_row_key
from specdec_kernels.common.sampling import sample_weights, to_weights
from specdec_kernels.triton import rejection_sampling_logits as triton_module

pytestmark = [
    # inf - inf, 0 * inf and NaN arithmetic on adversarial rows are intended; the interpreter
    # evaluates them with numpy, which warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

INF, NAN = float("inf"), float("nan")
MARGIN = 1e-5


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("rejection_sample_logits",)))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


# ------------------------------------------------------------------ helpers

def softmax64(logits, temperature):
    """float64 softmax of the reference's float32 logits / T (NaN rows where torch's are)."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.float().view(-1, 1, 1)
    return torch.softmax((logits.float() / temperature).double(), dim=-1)


def effective_uniforms(batch, g, ref_accepted, uniforms=None, seed=None, offsets=None):
    """[B, g+1] float64: the coins and the final draw the reference used (seeded: Philox)."""
    if uniforms is not None:
        return uniforms.double()
    offsets = torch.zeros(batch, dtype=torch.int64) if offsets is None else offsets
    seeds, row_key = seed_and_row_key(seed, batch, "cpu")
    coins = rng.philox_uniform(seeds[:, None], offsets[:, None] + torch.arange(g), row_key[:, None], rng.SALT_ACCEPT)
    final = rng.philox_uniform(seeds, offsets + ref_accepted, row_key, rng.SALT_FINAL)
    return torch.cat([coins, final[:, None]], dim=1)


def near_boundary_rows(target, draft, drafts, temperature, u, counts, ref_accepted):
    """bool [B]: rows where a decision of the reference lies within MARGIN of its boundary."""
    batch, g = drafts.shape
    vocab = target.shape[-1]
    p64 = softmax64(target, temperature)
    q64 = softmax64(draft, temperature) if g else None
    near = torch.zeros(batch, dtype=torch.bool)
    for b in range(batch):
        n = g if counts is None else int(counts[b])
        a = int(ref_accepted[b])
        for j in range(min(a + 1, n)):  # the accepted drafts and the first rejection
            x = int(drafts[b, j])
            if not 0 <= x < vocab:
                continue
            p, q = float(p64[b, j, x]), float(q64[b, j, x])
            if p != p or q != q or p == q:
                continue  # a NaN softmax row rejects; identical rows give p == q in both: u * q < p iff p > 0
            scale = max(p, q)
            if 0 < scale < 1e-30 or abs(float(u[b, j]) * q - p) < MARGIN * scale:
                near[b] = True
        p_row = p64[b, a]
        if bool(torch.isnan(p_row).any()):
            continue  # no mass: id 0 whatever the rounding
        r = p_row
        if a < n and not bool(torch.isnan(q64[b, a]).any()):
            r = (p_row - q64[b, a]).clamp(min=0)
            if float(r.sum()) == 0:
                r = p_row  # p == q exactly (identical logits): empty residual in both
            elif float(r.sum()) < 10 * MARGIN:
                near[b] = True  # empty or not may depend on rounding
        cdf = torch.cumsum(r, 0)
        threshold = float(u[b, g]) * float(cdf[-1])
        steps = cdf[(r > 0) & (cdf < cdf[-1])]  # threshold < total: the last step never decides
        if bool(((steps - threshold).abs() < MARGIN).any()):
            near[b] = True
    return near


def check(target, draft, drafts, *, temperature=1.0, num_draft_tokens=None, launch=None, **random):
    """Triton vs reference on every row not near a boundary; returns (near [B], triton outputs)."""
    if launch is None:
        got = ops.rejection_sample_logits(target, draft, drafts, temperature=temperature,
                                          num_draft_tokens=num_draft_tokens, backend="triton", **random)
    else:
        got = launch(target, draft, drafts, temperature=temperature, num_draft_tokens=num_draft_tokens, **random)
    want = reference.rejection_sample_logits(target, draft, drafts, temperature=temperature,
                                             num_draft_tokens=num_draft_tokens, **random)
    out, accepted = got
    batch, g = drafts.shape
    vocab = target.shape[-1]
    assert out.dtype == torch.int64 and out.shape == (batch, g + 1) and accepted.shape == (batch,)
    # structure: accepted drafts, one id in [0, V), then -1
    emitted = out.gather(1, accepted[:, None])[:, 0]
    assert bool(((emitted >= 0) & (emitted < vocab)).all()), emitted
    pos = torch.arange(g + 1)
    padded = torch.cat([drafts, torch.full((batch, 1), -1)], 1)
    assert torch.equal(torch.where(pos < accepted[:, None], out, -1), torch.where(pos < accepted[:, None], padded, -1))
    assert bool((out[pos > accepted[:, None]] == -1).all())
    u = effective_uniforms(batch, g, want[1], **random)
    near = near_boundary_rows(target, draft, drafts, temperature, u, num_draft_tokens, want[1])
    far = ~near
    assert torch.equal(accepted[far], want[1][far]), (accepted.tolist(), want[1].tolist(), near.tolist())
    assert torch.equal(out[far], want[0][far]), (out.tolist(), want[0].tolist(), near.tolist())
    return near, got


def random_case(batch, g, vocab, dtype, gen, *, scale=2.0, noise=0.7, temperature=1.0, pad=0.1):
    """Target logits, draft logits = target + noise (so drafts are often accepted), drafts
    sampled from q = softmax(draft / T), a few -1 paddings."""
    target = (torch.randn(batch, g + 1, vocab, generator=gen) * scale).to(dtype)
    draft = (target[:, :g].float() + noise * torch.randn(batch, g, vocab, generator=gen)).to(dtype)
    if g:
        q = softmax64(draft, temperature).reshape(-1, vocab)
        drafts = torch.multinomial(q, 1, generator=gen).reshape(batch, g)
        drafts = torch.where(torch.rand(batch, g, generator=gen) < pad, -1, drafts)
    else:
        drafts = torch.zeros(batch, 0, dtype=torch.int64)
    return target, draft, drafts


def random_modes(batch, g, gen):
    """kwargs of each randomness mode."""
    return [
        dict(uniforms=torch.rand(batch, g + 1, generator=gen)),
        dict(uniforms=torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)),
        dict(seed=int(torch.randint(-2**62, 2**62, (1,), generator=gen)),
             offsets=torch.randint(0, 2**33, (batch,), generator=gen)),
        dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)),
    ]


# ------------------------------------------------------------------ launch plans


@pytest.mark.parametrize("vocab,block_v,tiles,max_splits,mode", [(200, 16, 2, 64, 1), (200, 16, 1, 4, 2),
                                                                (1000, 64, 1, 64, 3)])
def test_split_rows(vocab, block_v, tiles, max_splits, mode):
    """Small tiles: rows split over many programs (merged statistics) and many tiles per
    program (online rescaling), and the draw's cdf carried across tiles."""
    gen = torch.Generator().manual_seed(vocab + tiles)
    target, draft, drafts = random_case(4, 3, vocab, torch.float32, gen, scale=4.0)
    target[0, 1, 150:] = -INF
    draft[1, 0, :100] = -INF

    def launch(*args, **kwargs):
        return triton_module._launch(*args, block_v=block_v, tiles_per_program=tiles, max_splits=max_splits, **kwargs)

    near, _ = check(target, draft, drafts, temperature=torch.tensor([0.5, 1.0, 1.5, 2.5]),
                    num_draft_tokens=torch.tensor([3, 2, 0, 1]), launch=launch, **random_modes(4, 3, gen)[mode])
    assert int(near.sum()) <= 1


# ------------------------------------------------------------------ seeded mode

def test_seeded_deterministic_and_batch_invariant():
    batch, g, vocab = 6, 3, 50
    gen = torch.Generator().manual_seed(8)
    target, draft, drafts = random_case(batch, g, vocab, torch.float16, gen)
    temperature = 0.5 + torch.rand(batch, generator=gen)
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)
    offsets = torch.randint(0, 1000, (batch,), generator=gen)
    counts = torch.randint(0, g + 1, (batch,), generator=gen)
    kw = dict(seed=seeds, offsets=offsets, num_draft_tokens=counts, temperature=temperature)
    near, (out, accepted) = check(target, draft, drafts, **kw)
    assert not bool(near.any())
    again = ops.rejection_sample_logits(target, draft, drafts, backend="triton", **kw)
    assert torch.equal(again[0], out) and torch.equal(again[1], accepted)
    perm = torch.randperm(batch, generator=gen)
    out_p, accepted_p = ops.rejection_sample_logits(
        target[perm], draft[perm], drafts[perm], seed=seeds[perm], offsets=offsets[perm],
        num_draft_tokens=counts[perm], temperature=temperature[perm], backend="triton")
    assert torch.equal(out_p, out[perm]) and torch.equal(accepted_p, accepted[perm])
    b = int(perm[0])
    one = ops.rejection_sample_logits(target[b:b + 1], draft[b:b + 1], drafts[b:b + 1], seed=seeds[b:b + 1],
                                      offsets=offsets[b:b + 1], num_draft_tokens=counts[b:b + 1],
                                      temperature=temperature[b:b + 1], backend="triton")
    assert torch.equal(one[0][0], out[b]) and int(one[1][0]) == int(accepted[b])
    # an int seed keys rows by batch index: deterministic, and equal to the reference
    for _ in range(2):
        near, got = check(target, draft, drafts, seed=12345, offsets=offsets, temperature=0.9)
        assert not bool(near.any())


# ------------------------------------------------------------------ interpreter versions

def test_an_interpreter_whose_max_propagates_nan(monkeypatch):
    """triton < 3.7's interpreter evaluates the NaN-ignoring tl.maximum with np.maximum, which
    propagates NaN; the division's remainder of a masked (-inf) lane is NaN, so every statistic
    was NaN and every row emitted token 0 there (CI at the floor, 2026-12-06). Emulate that
    interpreter under any triton: the answers must not change."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    monkeypatch.setattr(builder, "create_maxnumf", lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.maximum))
    gen = torch.Generator().manual_seed(3)
    target, draft, drafts = random_case(3, 2, 50, torch.float32, gen)  # 50 < BLOCK_V: masked lanes
    near, _ = check(target, draft, drafts, temperature=0.8, uniforms=torch.rand(3, 3, generator=gen))
    assert not bool(near.any())


# ------------------------------------------------------------------ distribution (chi-square)

CHI_ROWS = 200  # every expected count >= 10; a wrong residual adds ~47 to the statistic (5 dof)
CHI_T = 0.8
CHI_TARGET = torch.tensor([[0.8, 0.7, 0.0, -0.1, -0.2, 1.5], [0.0, 1.0, 2.0, 0.5, -1.0, 0.3]])  # positions 0, 1 (bonus)
CHI_DRAFT = torch.tensor([[1.3, 1.4, 1.3, 0.6, 0.4, -1.2]])


def chi_square_pvalue(tokens, probs):
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    return float(stats.chisquare(counts, probs * tokens.numel()).pvalue)


@pytest.fixture(scope="module")
def seeded_run():
    """CHI_ROWS rows with the same logits and per-row seeds in one launch; drafts ~ q."""
    gen = torch.Generator().manual_seed(77)
    vocab = CHI_TARGET.shape[-1]
    target = CHI_TARGET.expand(CHI_ROWS, 2, vocab).contiguous()
    draft = CHI_DRAFT.expand(CHI_ROWS, 1, vocab).contiguous()
    q = softmax64(draft[:1], CHI_T)[0, 0]
    drafts = torch.multinomial(q, CHI_ROWS, replacement=True, generator=gen)[:, None]
    seeds = torch.arange(CHI_ROWS) * 1_000_003 + 17
    out, accepted = ops.rejection_sample_logits(target, draft, drafts, temperature=CHI_T, seed=seeds,
                                                backend="triton")
    return target, draft, drafts, seeds, out, accepted


@pytest.mark.slow  # the 200-row interpreted launch behind both chi-square tests takes ~50 s
def test_chi_square_seeded(seeded_run):
    """The token emitted at position 0 follows p = softmax(target_logits[0] / T)."""
    target, draft, drafts, seeds, out, accepted = seeded_run
    p = softmax64(target[:1], CHI_T)[0, 0]
    q = softmax64(draft[:1], CHI_T)[0, 0]
    assert chi_square_pvalue(out[:, 0], p) > 1e-3
    # acceptance happens with probability sum(min(p, q)) (Leviathan Thm 3.5)
    alpha = float(torch.minimum(p, q).sum())
    rate = float((accepted >= 1).double().mean())
    assert abs(rate - alpha) < 5 * (alpha * (1 - alpha) / CHI_ROWS) ** 0.5


@pytest.mark.slow
def test_chi_square_catches_a_wrong_residual(seeded_run):
    """Mutation check: the same run with the correction drawn from p instead of the residual
    (same seeded uniforms) must fail the chi-square test."""
    target, draft, drafts, seeds, out, accepted = seeded_run
    p = softmax64(target[:1], CHI_T)[0, 0]
    u = rng.philox_uniform(seeds, torch.zeros_like(seeds), 0, rng.SALT_FINAL)
    from_p, _ = sample_weights(to_weights(p.float()).expand(CHI_ROWS, -1), u)
    wrong = torch.where(accepted >= 1, out[:, 0], from_p)
    assert chi_square_pvalue(wrong, p) < 1e-5
