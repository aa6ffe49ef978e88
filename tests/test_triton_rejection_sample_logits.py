"""The Triton rejection_sample_logits backend against the torch reference.

exp and the summation order differ from torch's in the last ulps, so the comparison is exact
everywhere except on rows where a decision lies within MARGIN of its boundary, measured on
float64 probabilities (`near_boundary_rows`): a coin with |u q - p| < MARGIN max(p, q), or a
final draw whose threshold u * total is within MARGIN (probability units) of a cdf step, or
whose residual mass is below 10 MARGIN. Such rows must be rare; every other row must match.
Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1), so shapes are small.
"""

import pytest
import torch
from scipy import stats

from specdec_kernels import ops, reference
from specdec_kernels.reference import chain_verify, rng
from specdec_kernels.reference._sampling import sample_weights, to_weights
from specdec_kernels.triton import rejection_sample_logits as triton_module

pytestmark = [
    # inf - inf, 0 * inf and NaN arithmetic on adversarial rows are intended; the interpreter
    # evaluates them with numpy, which warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731
MARGIN = 1e-5


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
    seeds, row_key = chain_verify.seed_and_row_key(seed, batch, "cpu")
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


def random_temperature(batch, gen, k):
    choice = k % 4
    if choice == 3:
        return 0.3 + 2 * torch.rand(batch, generator=gen)  # per-row float32 temperatures
    return (1.0, 0.6, 1.7)[choice]


# ------------------------------------------------------------------ random shapes

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", range(2))
def test_matches_reference(dtype, case):
    gen = torch.Generator().manual_seed(1000 * case + DTYPES.index(dtype))
    rows = near_rows = 0
    for k in range(6):
        batch = int(torch.randint(1, 7, (1,), generator=gen))
        g = int(torch.randint(0, 5, (1,), generator=gen))
        vocab = (1, 5, 64, 300)[int(torch.randint(0, 4, (1,), generator=gen))]
        temperature = random_temperature(batch, gen, k + case)
        target, draft, drafts = random_case(batch, g, vocab, dtype, gen, scale=(1.0, 3.0)[k % 2],
                                            temperature=temperature)
        counts = torch.randint(0, g + 1, (batch,), generator=gen) if k % 3 == 1 else None
        random = random_modes(batch, g, gen)[(k + case) % 4]
        near, _ = check(target, draft, drafts, temperature=temperature, num_draft_tokens=counts, **random)
        rows += batch
        near_rows += int(near.sum())
    assert near_rows <= max(1, rows // 50), (near_rows, rows)


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


def test_no_drafts_and_empty_batch():
    gen = torch.Generator().manual_seed(3)
    target, draft, drafts = random_case(3, 0, 50, torch.float16, gen)
    for random in random_modes(3, 0, gen)[::2]:
        near, (out, accepted) = check(target, draft, drafts, temperature=0.8, **random)
        assert accepted.tolist() == [0, 0, 0] and not bool(near.any())
    out, accepted = ops.rejection_sample_logits(torch.rand(0, 3, 10), torch.rand(0, 2, 10),
                                                torch.zeros(0, 2, dtype=torch.int64), seed=1, backend="triton")
    assert out.shape == (0, 3) and accepted.shape == (0,)


# ------------------------------------------------------------------ adversarial rows

def adversarial_case(dtype):
    """One crafted row per case, g = 3, V = 64."""
    batch, g, vocab = 11, 3, 64
    gen = torch.Generator().manual_seed(21)
    target, draft, drafts = random_case(batch, g, vocab, torch.float32, gen, pad=0.0)
    target[0, 0, 7] = NAN  # NaN in the target row: p is NaN -> rejected at 0, no mass -> id 0
    target[1, 1, 9] = INF  # +inf: torch.softmax gives an all-NaN row too
    target[1, 0] = draft[1, 0]  # (position 0 accepted, so position 1 is reached)
    target[2, 0] = -INF  # all -inf: all-NaN row
    target[3] = torch.randn(g + 1, vocab, generator=gen) * 1e4  # huge logits (fp16 holds +-6e4)
    draft[3] = target[3, :g] + torch.randn(g, vocab, generator=gen) * 1e3
    drafts[3] = torch.argmax(draft[3], -1)
    target[4, :g] = draft[4]  # identical logits: always accepted (p == q) ...
    target[4, 1, 5] = draft[4, 1, 5] = -INF  # ... but a draft on a -inf id rejects, residual empty -> p
    drafts[4, 1] = 5
    draft[5, 0, 3] = NAN  # NaN q row: rejected, NaN residual -> draw from p
    target[6, 0] = draft[6, 0]
    draft[6, 1, 11] = INF  # +inf in q at position 1
    draft[7, 0] = -INF  # all -inf q row
    target[8, :g] = draft[8]  # every draft accepted, then an all-NaN bonus row -> id 0
    target[8, g, ::3] = NAN
    target[9, 0, 32:] = -INF  # a draft on a -inf target id: p = 0 rejects; residual p - q
    drafts[9, 0] = 40
    target[10, :, :] = 0.0  # uniform target, one-hot-ish draft: residual on everything but the draft
    draft[10, :, :] = -1e4
    draft[10, torch.arange(g), drafts[10]] = 0.0
    return target.to(dtype), draft.to(dtype), drafts


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_adversarial_rows(dtype):
    target, draft, drafts = adversarial_case(dtype)
    batch, g = drafts.shape
    gen = torch.Generator().manual_seed(22)
    modes = [dict(uniforms=torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)),
             dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-53, dtype=torch.float64)),  # largest u
             dict(uniforms=torch.zeros(batch, g + 1)),  # every coin and draw at exactly 0
             dict(seed=torch.arange(batch) * 7919 + 5)]
    temperatures = (1.0, torch.tensor([0.5, 1.0, 2.0, 0.7, 1.3, 1.0, 0.9, 1.1, 3.0, 0.25, 1.0]))
    for i, random in enumerate(modes):
        for temperature in temperatures if i == 0 else temperatures[i % 2:i % 2 + 1]:  # 5 runs
            near, (out, accepted) = check(target, draft, drafts, temperature=temperature, **random)
            assert not bool(near[[0, 1, 2, 4, 5, 7, 8]].any()), (near.tolist(), sorted(random))
            assert accepted[0] == 0 and out[0, 0] == 0  # NaN target row
            assert accepted[1] == 1 and out[1, 1] == 0  # +inf at position 1: all-NaN row
            assert accepted[2] == 0 and out[2, 0] == 0  # all -inf target row
            assert accepted[4] == 1  # p == q accepts; p = q = 0 rejects
            assert accepted[5] == 0 and accepted[7] == 0  # NaN q rows reject
            assert accepted[8] == g and out[8, g] == 0  # NaN bonus row
            assert accepted[9] == 0 and 0 <= int(out[9, 0]) < 32  # residual only where p > 0
            if accepted[10] < g:
                assert out[10, accepted[10]] != drafts[10, accepted[10]]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_identical_logits_draw_from_p(dtype):
    """p == q at the rejection (forced by a draft on a -inf id): the residual is empty in the
    kernel too (same float32 arithmetic on both rows), so the draw comes from p."""
    gen = torch.Generator().manual_seed(31)
    batch, g, vocab = 6, 2, 40
    target = torch.randn(batch, g + 1, vocab, generator=gen).to(dtype)
    target[:, 0, :4] = -INF
    draft = target[:, :g].clone()
    drafts = torch.stack([torch.arange(batch) % 4, torch.zeros(batch, dtype=torch.int64)], 1)
    u = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
    near, (out, accepted) = check(target, draft, drafts, temperature=0.7, uniforms=u)
    assert not bool(near.any()) and accepted.tolist() == [0] * batch
    p0 = torch.softmax(target[:, 0].float() / 0.7, dim=-1)  # the reference's float32 softmax
    manual, _ = sample_weights(to_weights(p0), u[:, g])
    assert torch.equal(out[:, 0], manual) and bool((out[:, 0] >= 4).all())


def test_strided_inputs():
    batch, g, vocab = 3, 2, 100
    gen = torch.Generator().manual_seed(41)
    target, draft, drafts = random_case(batch, g, vocab, torch.bfloat16, gen, pad=0.0)
    big = torch.zeros(batch, g + 3, vocab, dtype=torch.bfloat16)
    big[:, 1:g + 2] = target
    target_view = big[:, 1:g + 2]
    draft_view = draft.transpose(0, 1).contiguous().transpose(0, 1)
    drafts_view = drafts.t().contiguous().t()
    temperature = torch.tensor([0.5, 0.0, 1.5, 0.0, 1.0, 0.0])[::2]
    assert not (target_view.is_contiguous() or draft_view.is_contiguous() or temperature.is_contiguous())
    near, _ = check(target_view, draft_view, drafts_view, temperature=temperature,
                    num_draft_tokens=torch.tensor([2, 9, 1, 9, 0, 9])[::2], seed=torch.tensor([5, 0, 6, 0, 7, 0])[::2])
    assert not bool(near.any())


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


def test_chi_square_catches_a_wrong_residual(seeded_run):
    """Mutation check: the same run with the correction drawn from p instead of the residual
    (same seeded uniforms) must fail the chi-square test."""
    target, draft, drafts, seeds, out, accepted = seeded_run
    p = softmax64(target[:1], CHI_T)[0, 0]
    u = rng.philox_uniform(seeds, torch.zeros_like(seeds), 0, rng.SALT_FINAL)
    from_p, _ = sample_weights(to_weights(p.float()).expand(CHI_ROWS, -1), u)
    wrong = torch.where(accepted >= 1, out[:, 0], from_p)
    assert chi_square_pvalue(wrong, p) < 1e-5
