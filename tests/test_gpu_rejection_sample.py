"""GPU tests of the CUDA rejection_sample / rejection_sample_logits (csrc/rejection_sample.cu).

Everything goes through the public ops with backend="cuda" and is compared with
backend="torch" on the same GPU tensors: bit for bit for probabilities (every dtype, both
randomness modes), and up to decisions within a tiny margin of their boundary for logits
(the softmax sums are reduced in another order). Skips cleanly without CUDA or `_C`.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from gpu_support import CUDA_KERNEL_MARKS  # noqa: E402
from specdec_kernels import ops  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731
INF, NAN = float("inf"), float("nan")
DEV = "cuda"


# ------------------------------------------------------------------ helpers

def make_probs(batch, g, vocab, dtype, gen, *, zero_frac=0.2):
    """Close target/draft distributions (drafts often accepted), some zero target entries
    (some rejected), drafts sampled from the draft rows."""
    target = torch.rand(batch, g + 1, vocab, generator=gen, device=DEV) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen, device=DEV) < zero_frac, 0.0, target)
    target[..., 0] += 1e-3
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, g, vocab, generator=gen, device=DEV)
    draft = 0.7 * target[:, :g] + 0.3 * noise / noise.sum(-1, keepdim=True)
    if g:
        drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    else:
        drafts = torch.empty(batch, 0, dtype=torch.int64, device=DEV)
    return target.to(dtype), draft.to(dtype), drafts


def uniforms(batch, g, gen, dtype, zero_frac=0.1):
    u = torch.rand(batch, g + 1, generator=gen, device=DEV, dtype=torch.float64).to(dtype)
    return torch.where(torch.rand(u.shape, generator=gen, device=DEV) < zero_frac, torch.zeros_like(u), u)


def all_modes(batch, g, gen):
    """float32 / float64 uniforms (with exact 0.0 coins), an int seed with offsets (the counter
    crosses 2^32), per-row seeds without offsets, and per-row seeds with offsets."""
    offsets = torch.tensor([0, 2**32 - 2, 17, -5, 2**40, 3, 2**31 - 1], device=DEV).repeat(batch)[:batch]
    return [
        dict(uniforms=uniforms(batch, g, gen, torch.float32)),
        dict(uniforms=uniforms(batch, g, gen, torch.float64)),
        dict(seed=int(torch.randint(-2**62, 2**62, (1,), generator=gen, device=DEV)), offsets=offsets),
        dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen, device=DEV)),
        dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen, device=DEV), offsets=offsets.flip(0)),
    ]


def assert_in_range(out, accepted, vocab):
    emitted = out.gather(1, accepted.unsqueeze(1)).squeeze(1)
    assert bool(((emitted >= 0) & (emitted < vocab)).all()), emitted
    pos = torch.arange(out.shape[1], device=out.device).unsqueeze(0)
    assert bool((out[pos > accepted.unsqueeze(1)] == -1).all())


def assert_matches(target, draft, drafts, **kwargs):
    got = ops.rejection_sample(target, draft, drafts, backend="cuda", **kwargs)
    want = ops.rejection_sample(target, draft, drafts, backend="torch", **kwargs)
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape, name
        if not torch.equal(g_, w_):
            rows = (g_ != w_).reshape(g_.shape[0], -1).any(1).nonzero().flatten()[:5].tolist()
            raise AssertionError(f"{name} differs in rows {rows}: cuda {g_[rows].tolist()} != torch "
                                 f"{w_[rows].tolist()} ({sorted(kwargs)})")
    assert_in_range(*got, target.shape[-1])
    return got


def cached_workspaces_are_zero():
    from specdec_kernels.cuda import _launch
    torch.cuda.synchronize()
    return all(int(ws.count_nonzero()) == 0 for ws in _launch._zeroed_workspaces.values())


# ------------------------------------------------------------------ rejection_sample: shapes x dtypes x modes

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab", (32000, 128256, 151936))
@pytest.mark.parametrize("batch", (1, 3, 64))
@pytest.mark.parametrize("g", (1, 4, 8))
def test_matches_reference(dtype, vocab, batch, g):
    gen = torch.Generator(device=DEV).manual_seed(vocab + 100 * batch + g)
    target, draft, drafts = make_probs(batch, g, vocab, dtype, gen)
    ragged = torch.randint(0, g + 1, (batch,), generator=gen, device=DEV)
    for i, kwargs in enumerate(all_modes(batch, g, gen)):
        assert_matches(target, draft, drafts, **kwargs)
        if i in (1, 2, 4):
            assert_matches(target, draft, drafts, num_draft_tokens=ragged, **kwargs)
    assert cached_workspaces_are_zero()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab", (1, 7, 2047, 2048, 2049, 8200, 50000))
def test_small_and_odd_vocabularies(dtype, vocab):
    gen = torch.Generator(device=DEV).manual_seed(vocab)
    for batch, g in ((1, 3), (5, 1), (300, 2)):
        target, draft, drafts = make_probs(batch, g, vocab, dtype, gen)
        for kwargs in all_modes(batch, g, gen)[1:4]:
            assert_matches(target, draft, drafts, **kwargs)
            assert_matches(target, draft, drafts, num_draft_tokens=torch.randint(0, g + 1, (batch,), device=DEV,
                                                                                 generator=gen), **kwargs)


def test_no_drafts():
    gen = torch.Generator(device=DEV).manual_seed(1)
    target, draft, drafts = make_probs(4, 0, 32000, torch.float16, gen)
    for kwargs in all_modes(4, 0, gen):
        out, acc = assert_matches(target, draft, drafts, **kwargs)
        assert acc.tolist() == [0] * 4


# ------------------------------------------------------------------ adversarial rows

def adversarial_rows(vocab, gen):
    """(target row, draft row) pairs of fp32 [V] rows hitting the corner cases."""
    base = torch.rand(vocab, generator=gen, device=DEV) ** 3
    base /= base.sum()
    other = torch.rand(vocab, generator=gen, device=DEV)
    other /= other.sum()
    zeros = torch.zeros(vocab, device=DEV)
    rows = [(base, base),                                  # p == q: empty residual -> draw from p
            (base, other),
            (torch.full((vocab,), NAN, device=DEV), base),  # NaN target: nothing accepted, weights 0
            (base, torch.full((vocab,), NAN, device=DEV)),  # NaN draft
            (zeros, base),                                  # no target mass -> token 0
            (zeros, zeros)]
    r = zeros.clone(); r[-1] = 1.0; rows.append((r, base))                   # all mass on the last id
    r = zeros.clone(); r[-3000:] = 1 / 3000; rows.append((r, zeros))         # last chunk only, q == 0
    r = zeros.clone(); r[vocab // 2] = 1.0; rows.append((r, r.clone()))     # one-hot p == q
    r = base.clone(); r[::7] = INF; rows.append((r, base))                  # +inf weighs 1
    r = base.clone(); r[1::5] = -INF; rows.append((r, -other))              # negative / -inf weigh 0
    rows.append((torch.ones(vocab, device=DEV), torch.full((vocab,), 0.5, device=DEV)))  # unnormalised
    r = base.clone(); r[:vocab - 1] = 0; r[-1] = 1e-30; rows.append((r, zeros))  # below the 2^-40 grid: no mass
    r = zeros.clone(); r[0] = 2.0**-40; r[-1] = 2.0**-40; rows.append((r, zeros))  # one weight unit each
    return rows


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab", (32000, 151936))
def test_adversarial_rows(dtype, vocab):
    g = 3
    gen = torch.Generator(device=DEV).manual_seed(vocab + 1)
    rows = adversarial_rows(vocab, gen)
    n = len(rows)
    batch = 2 * n
    target = torch.empty(batch, g + 1, vocab, device=DEV)
    draft = torch.empty(batch, g, vocab, device=DEV)
    for b in range(batch):  # rotate the patterns so every pattern meets every position
        for k in range(g + 1):
            target[b, k] = rows[(b + k) % n][0]
        for k in range(g):
            draft[b, k] = rows[(b + k) % n][1]
    target, draft = target.to(dtype), draft.to(dtype)
    drafts = torch.randint(0, vocab, (batch, g), generator=gen, device=DEV)
    drafts[:, 0] = vocab - 1
    drafts[n:, 0] = 0
    bad = torch.tensor([-1, vocab, vocab + 3, -(2**40), 2**40, 2**62], device=DEV)
    drafts[::3, 1] = bad[torch.arange(0, batch, 3, device=DEV) % len(bad)]  # out-of-range ids: rejected
    ragged = torch.arange(batch, device=DEV) % (g + 1)
    for kwargs in all_modes(batch, g, gen):
        assert_matches(target, draft, drafts, **kwargs)
        assert_matches(target, draft, drafts, num_draft_tokens=ragged, **kwargs)
    for split_b in (1, 4):  # fewer rows: more blocks per row
        for kwargs in all_modes(split_b, g, gen)[:3]:
            assert_matches(target[:split_b], draft[:split_b], drafts[:split_b], **kwargs)


def test_empty_residual_never_leaves_the_vocabulary():
    """p == q with the draft on a zero-probability token: rejected, residual identically 0.
    FlashInfer reads uninitialised shared memory here; we must draw from p instead."""
    vocab, batch = 128256, 8
    p = torch.softmax(torch.randn(batch, 2, vocab, device=DEV), -1)
    p[..., 0] = 0.0
    q = p[:, :1].clone()
    drafts = torch.zeros(batch, 1, dtype=torch.int64, device=DEV)
    for kwargs in (dict(uniforms=torch.rand(batch, 2, device=DEV)), dict(seed=4)):
        out, acc = assert_matches(p, q, drafts, **kwargs)
        assert bool((acc == 0).all()) and bool((out[:, 0] > 0).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_and_unaligned_inputs(dtype):
    gen = torch.Generator(device=DEV).manual_seed(7)
    batch, g, vocab = 3, 4, 128256
    big_t = torch.rand(batch, g + 3, vocab + 5, generator=gen, device=DEV).to(dtype)
    big_q = torch.rand(batch, g + 2, vocab + 5, generator=gen, device=DEV).to(dtype)
    drafts_big = torch.randint(0, vocab, (batch, 2 * g), generator=gen, device=DEV)
    drafts = drafts_big[:, ::2]  # non-contiguous ids too
    for cols in (slice(0, vocab), slice(1, vocab + 1), slice(5, vocab + 5)):  # aligned and unaligned rows
        target = big_t[:, 1:g + 2, cols]
        draft = big_q[:, 2:g + 2, cols]
        assert not target.is_contiguous() and not draft.is_contiguous()
        u = uniforms(batch * 2, g, gen, torch.float64)[::2]  # non-contiguous uniforms
        assert_matches(target, draft, drafts, uniforms=u)
        assert_matches(target, draft, drafts, seed=11, offsets=torch.arange(0, 6, 2, device=DEV)[:batch])
        seeds = torch.randint(0, 2**62, (batch * 2,), device=DEV, generator=gen)[::2]
        assert_matches(target, draft, drafts, seed=seeds, num_draft_tokens=torch.tensor([0, g, 2], device=DEV))
    # expanded (stride 0) batch dimension
    target = big_t[:1, :g + 1, :vocab].expand(batch, -1, -1)
    draft = big_q[:1, :g, :vocab].expand(batch, -1, -1)
    assert_matches(target, draft, drafts, seed=3)


# ------------------------------------------------------------------ workspace, graphs, statistics

def test_repeated_calls_reuse_the_workspace():
    gen = torch.Generator(device=DEV).manual_seed(8)
    batch, g, vocab = 17, 4, 151936
    target, draft, drafts = make_probs(batch, g, vocab, torch.bfloat16, gen)
    u = uniforms(batch, g, gen, torch.float32)
    first = ops.rejection_sample(target, draft, drafts, uniforms=u, backend="cuda")
    assert cached_workspaces_are_zero()
    second = ops.rejection_sample(target, draft, drafts, uniforms=u, backend="cuda")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for _ in range(3):  # new data on the same (re-zeroed) workspace
        target, draft, drafts = make_probs(batch, g, vocab, torch.bfloat16, gen)
        assert_matches(target, draft, drafts, seed=5, offsets=torch.arange(batch, device=DEV))
    assert cached_workspaces_are_zero()


@pytest.mark.parametrize("mode", ("uniforms", "seeds"))
def test_cuda_graph_capture_and_replay(mode):
    gen = torch.Generator(device=DEV).manual_seed(9)
    batch, g, vocab = 6, 4, 128256
    target, draft, drafts = make_probs(batch, g, vocab, torch.float16, gen)
    counts = torch.full((batch,), g, device=DEV)
    if mode == "uniforms":
        kwargs = dict(uniforms=uniforms(batch, g, gen, torch.float64))
    else:
        kwargs = dict(seed=torch.randint(0, 2**62, (batch,), device=DEV, generator=gen),
                      offsets=torch.zeros(batch, dtype=torch.int64, device=DEV))

    def call():
        return ops.rejection_sample(target, draft, drafts, num_draft_tokens=counts, backend="cuda", **kwargs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up: the per-stream workspace exists before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_acc = call()
    for step in range(4):
        new_t, new_q, new_d = make_probs(batch, g, vocab, torch.float16, gen)
        target.copy_(new_t), draft.copy_(new_q), drafts.copy_(new_d)
        counts.copy_(torch.randint(0, g + 1, (batch,), device=DEV, generator=gen))
        if mode == "uniforms":
            kwargs["uniforms"].copy_(uniforms(batch, g, gen, torch.float64))
        else:
            kwargs["offsets"].add_(g + 1)
        graph.replay()
        want = ops.rejection_sample(target, draft, drafts, num_draft_tokens=counts, backend="torch", **kwargs)
        assert torch.equal(static_out, want[0]) and torch.equal(static_acc, want[1]), step
        eager = call()
        assert torch.equal(static_out, eager[0]) and torch.equal(static_acc, eager[1]), step
    assert cached_workspaces_are_zero()


def _chi_square(counts, probs):
    expected = probs * counts.sum()
    keep = expected > 0
    assert int(counts[~keep].sum()) == 0, "a zero-probability token was drawn"
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return stat, df


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_seeded_mode_is_lossless_chi_square(dtype):
    """Speculative sampling is lossless: the first emitted token of every row is distributed as
    p_0 whatever q is. Many rows with the same distributions and different row keys (an int
    seed keys rows by batch index), support spread over every chunk of a large vocabulary."""
    vocab, g, batch, calls = 151936, 2, 32768, 4
    gen = torch.Generator(device=DEV).manual_seed(10)
    support = torch.cat([torch.tensor([0, 1, vocab - 1], device=DEV),
                         torch.randperm(vocab - 2, generator=gen, device=DEV)[:21] + 1]).unique()
    p = torch.zeros(g + 1, vocab, device=DEV)
    q = torch.zeros(g, vocab, device=DEV)
    p[:, support] = torch.rand(g + 1, len(support), generator=gen, device=DEV) + 0.05
    q[:, support] = torch.rand(g, len(support), generator=gen, device=DEV) ** 2 + 0.01
    p /= p.sum(-1, keepdim=True)
    q /= q.sum(-1, keepdim=True)
    p, q = p.to(dtype), q.to(dtype)
    q_used = q.float() / q.float().sum(-1, keepdim=True)
    target = p.unsqueeze(0).expand(batch, -1, -1)
    draft = q.unsqueeze(0).expand(batch, -1, -1)
    counts = torch.zeros(vocab, device=DEV)
    accepted_total = 0
    for call in range(calls):
        drafts = torch.multinomial(q_used, batch, replacement=True, generator=gen).T.contiguous()
        out, acc = ops.rejection_sample(target, draft, drafts, seed=1234 + call,
                                        offsets=torch.full((batch,), 100 * call, device=DEV), backend="cuda")
        assert_in_range(out, acc, vocab)
        counts += torch.bincount(out[:, 0], minlength=vocab).float()
        accepted_total += int(acc.sum())
    p0 = p[0].double() / p[0].double().sum()
    stat, df = _chi_square(counts.double(), p0)
    limit = df + 8 * math.sqrt(2 * df)  # ~1e-7 false-alarm rate for df ~ 20
    assert stat < limit, (stat, df)
    assert 0 < accepted_total < batch * calls * g  # both branches exercised


# ------------------------------------------------------------------ rejection_sample_logits

def make_logits(batch, g, vocab, dtype, gen, scale=3.0):
    t = torch.randn(batch, g + 1, vocab, generator=gen, device=DEV) * scale
    q = t[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=DEV) * 0.7
    if g:
        drafts = torch.multinomial(torch.softmax(q.to(dtype).float(), -1).reshape(-1, vocab), 1,
                                   generator=gen).reshape(batch, g)
    else:
        drafts = torch.empty(batch, 0, dtype=torch.int64, device=DEV)
    return t.to(dtype), q.to(dtype), drafts


def _row_uniforms(kwargs, b, batch, g, accepted):
    """Row b's float64 uniforms [g+1] as the op uses them: the coins, then the final draw
    (in seeded mode the final draw depends on the number of accepted drafts)."""
    from specdec_kernels.reference import chain_verify, rng

    if kwargs.get("uniforms") is not None:
        return kwargs["uniforms"][b].double()
    seeds, row_key = chain_verify.seed_and_row_key(kwargs["seed"], batch, DEV)
    offsets = kwargs.get("offsets")
    offset = 0 if offsets is None else int(offsets[b])
    positions = offset + torch.arange(g, device=DEV)
    coins = rng.philox_uniform(seeds[b], positions, row_key[b], rng.SALT_ACCEPT)
    final = rng.philox_uniform(seeds[b], torch.tensor(offset + accepted, device=DEV), row_key[b], rng.SALT_FINAL)
    return torch.cat([coins, final.reshape(1)])


def _boundary_explains(b, target_logits, draft_logits, drafts, temperature, kwargs, got, want, margin=1e-4):
    """True when row b's cuda/torch difference comes from a decision within `margin` of its
    boundary, recomputed in float64."""
    batch, g = drafts.shape
    t = temperature[b].item() if isinstance(temperature, torch.Tensor) else temperature
    p = torch.softmax(target_logits[b].double() / t, -1)
    q = torch.softmax(draft_logits[b].double() / t, -1)
    counts = kwargs.get("num_draft_tokens")
    n = g if counts is None else int(counts[b].clamp(0, g))
    a_got, a_want = int(got[1][b]), int(want[1][b])
    vocab = p.shape[-1]
    if a_got != a_want:
        j = min(a_got, a_want)
        tok = int(drafts[b, j])
        if not 0 <= tok < vocab:
            return False
        u = _row_uniforms(kwargs, b, batch, g, j)
        lhs, rhs = float(u[j]) * float(q[j, tok]), float(p[j, tok])
        return abs(lhs - rhs) <= margin * max(abs(rhs), abs(lhs), 1e-30)
    a = a_got
    u = _row_uniforms(kwargs, b, batch, g, a)
    residual = (p[a] - q[a]).clamp(min=0) if a < n else p[a]
    if float(residual.sum()) < margin:
        return True  # residual nearly empty: the fallback decision itself is marginal
    cdf = residual.cumsum(0)
    lo = min(int(got[0][b, a]), int(want[0][b, a]))
    return abs(float(cdf[lo]) - float(u[g]) * float(cdf[-1])) <= margin * float(cdf[-1])


def assert_logits_match(target_logits, draft_logits, drafts, temperature=1.0, max_mismatch_frac=0.02, **kwargs):
    """cuda == torch except rows whose difference a near-boundary decision explains (few)."""
    got = ops.rejection_sample_logits(target_logits, draft_logits, drafts, temperature=temperature, backend="cuda",
                                      **kwargs)
    want = ops.rejection_sample_logits(target_logits, draft_logits, drafts, temperature=temperature,
                                       backend="torch", **kwargs)
    assert_in_range(*got, target_logits.shape[-1])
    rows = ((got[0] != want[0]).any(1) | (got[1] != want[1])).nonzero().flatten().tolist()
    assert len(rows) <= max(1, max_mismatch_frac * drafts.shape[0]), f"{len(rows)} rows differ"
    for b in rows:
        assert _boundary_explains(b, target_logits, draft_logits, drafts, temperature, kwargs, got, want), \
            f"row {b}: cuda {got[0][b].tolist()} torch {want[0][b].tolist()}"
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab", (32000, 151936))
@pytest.mark.parametrize("batch,g", ((1, 4), (3, 8), (64, 1), (64, 4)))
def test_logits_match_reference(dtype, vocab, batch, g):
    gen = torch.Generator(device=DEV).manual_seed(vocab + batch + g)
    t, q, drafts = make_logits(batch, g, vocab, dtype, gen)
    ragged = torch.randint(0, g + 1, (batch,), generator=gen, device=DEV)
    temps = torch.rand(batch, generator=gen, device=DEV) + 0.3
    for i, kwargs in enumerate(all_modes(batch, g, gen)):
        assert_logits_match(t, q, drafts, **kwargs)
        assert_logits_match(t, q, drafts, temperature=0.6, num_draft_tokens=ragged, **kwargs)
        if i in (0, 3):
            assert_logits_match(t, q, drafts, temperature=temps, **kwargs)
    assert cached_workspaces_are_zero()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_logits_adversarial_rows(dtype):
    vocab, g = 32000, 2
    gen = torch.Generator(device=DEV).manual_seed(12)
    base = torch.randn(vocab, generator=gen, device=DEV)
    rows = [base]
    r = base.clone(); r[5] = NAN; rows.append(r)                     # NaN: softmax all NaN
    r = base.clone(); r[-1] = INF; rows.append(r)                    # +inf: all NaN
    rows.append(torch.full((vocab,), -INF, device=DEV))              # all -inf: all NaN
    r = torch.full((vocab,), -INF, device=DEV); r[-1] = 0.0; rows.append(r)  # one finite logit, last id
    r = torch.full((vocab,), -INF, device=DEV); r[20000:] = base[20000:]; rows.append(r)  # -inf chunks
    rows.append(torch.zeros(vocab, device=DEV))                      # uniform
    rows.append(base * 50)                                           # very peaked
    n = len(rows)
    batch = n
    target = torch.stack([torch.stack([rows[(b + k) % n] for k in range(g + 1)]) for b in range(batch)]).to(dtype)
    draft = torch.stack([torch.stack([rows[(b + k + 3) % n] for k in range(g)]) for b in range(batch)]).to(dtype)
    drafts = torch.randint(0, vocab, (batch, g), generator=gen, device=DEV)
    drafts[:, 0] = vocab - 1
    drafts[1, 1] = -1
    ragged = torch.arange(batch, device=DEV) % 3
    for kwargs in all_modes(batch, g, gen):
        assert_logits_match(target, draft, drafts, **kwargs)
        assert_logits_match(target, draft, drafts, temperature=0.5, num_draft_tokens=ragged, **kwargs)


def test_logits_strided_workspace_and_graph():
    gen = torch.Generator(device=DEV).manual_seed(13)
    batch, g, vocab = 4, 3, 128256
    big_t = torch.randn(batch, g + 2, vocab + 1, generator=gen, device=DEV).to(torch.bfloat16)
    big_q = torch.randn(batch, g + 1, vocab + 1, generator=gen, device=DEV).to(torch.bfloat16)
    target, draft = big_t[:, 1:, 1:], big_q[:, 1:, :vocab]  # unaligned target rows, strided dims
    drafts = torch.randint(0, vocab, (batch, g), generator=gen, device=DEV)
    u = uniforms(batch, g, gen, torch.float32)
    first = assert_logits_match(target, draft, drafts, uniforms=u)
    second = ops.rejection_sample_logits(target, draft, drafts, uniforms=u, backend="cuda")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert cached_workspaces_are_zero()

    temps = torch.full((batch,), 0.8, device=DEV)
    offsets = torch.zeros(batch, dtype=torch.int64, device=DEV)

    def call():
        return ops.rejection_sample_logits(target, draft, drafts, temperature=temps, seed=77, offsets=offsets,
                                           backend="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_acc = call()
    for step in range(3):
        offsets.add_(g + 1)
        temps.copy_(torch.rand(batch, generator=gen, device=DEV) + 0.5)
        graph.replay()
        eager = call()
        assert torch.equal(static_out, eager[0]) and torch.equal(static_acc, eager[1]), step
    assert cached_workspaces_are_zero()


def test_auto_backend_is_cuda():
    dev = torch.device(DEV)
    assert ops.resolve("rejection_sample", "auto", dev) == "cuda"
    assert ops.resolve("rejection_sample_logits", "auto", dev) == "cuda"
