"""GPU tests of rejection_sample / rejection_sample_logits (csrc/rejection_sampling.cu, and Triton).

The kernel cases are the catalog's (selftest/cases_rejection_sampling.py: a sample per op; `--gpu-tier full`:
all of "full": V up to 151936, B up to 300, every dtype and randomness mode, ragged rows, small and odd
vocabularies (1, 7, 2047, 2048, 2049, 8200, 50000), g = 0, the adversarial row patterns with
out-of-range ids, an empty residual, strided / unaligned / expanded inputs, temperatures, CUDA-
graph replays), through the public ops on backend "cuda" and "triton", judged as
`specdec-kernels selftest` judges them: bit for bit for probabilities, and up to decisions
within a tiny margin of their boundary for logits (the softmax sums are reduced in another
order). Here besides: the per-stream workspace left zeroed, CUDA-graph replays that advance
offsets and temperatures, and the distribution (chi-square over a large vocabulary).
Skips cleanly without CUDA or `_C`.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402
from gpu_support import CUDA_KERNEL_MARKS  # noqa: E402
from specdec_kernels import ops  # noqa: E402
from specdec_kernels.selftest.compare import compare_logits_sampling  # noqa: E402
from specdec_kernels.selftest.runner import cuda_graph_capture  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731
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
    from specdec_kernels.common import workspace
    torch.cuda.synchronize()
    return all(int(ws.count_nonzero()) == 0 for ws in workspace._zeroed_workspaces.values())


# ------------------------------------------------------------------ the catalog

CATALOG_OPS = ("rejection_sample", "rejection_sample_logits")


@pytest.mark.parametrize("case,backend", gpu_catalog("cuda", CATALOG_OPS))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, "cuda")
    check_case(case, backend, "cuda", profile=gpu_profile(), graphs=True)


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

    (static_out, static_acc), replay = cuda_graph_capture(DEV, call)
    for step in range(4):
        new_t, new_q, new_d = make_probs(batch, g, vocab, torch.float16, gen)
        target.copy_(new_t), draft.copy_(new_q), drafts.copy_(new_d)
        counts.copy_(torch.randint(0, g + 1, (batch,), device=DEV, generator=gen))
        if mode == "uniforms":
            kwargs["uniforms"].copy_(uniforms(batch, g, gen, torch.float64))
        else:
            kwargs["offsets"].add_(g + 1)
        replay()
        want = ops.rejection_sample(target, draft, drafts, num_draft_tokens=counts, backend="torch", **kwargs)
        assert torch.equal(static_out, want[0]) and torch.equal(static_acc, want[1]), step
        eager = call()
        assert torch.equal(static_out, eager[0]) and torch.equal(static_acc, eager[1]), step
    assert cached_workspaces_are_zero()


def _passes_of(backend, target, draft, drafts, **kwargs):
    passes = torch.ones(drafts.shape, dtype=torch.bool, device=DEV)  # every slot overwritten, False ones too
    out = ops.rejection_sample(target, draft, drafts, draft_passes=passes, backend=backend, **kwargs)
    return out, passes


@pytest.mark.parametrize("backend", ("cuda", "triton"))
def test_draft_passes_output_matches_the_reference(backend):
    """The optional per-draft output on a split final row (V = 151936: many blocks per row, split 0
    writes) equals the reference's, in both randomness modes, with ragged rows, -1 ids (the op does
    not inspect GPU ids) and a NaN row; the op's other outputs are unchanged by asking for it."""
    skip_unless_backend("rejection_sample", backend, "cuda")
    gen = torch.Generator(device=DEV).manual_seed(21)
    batch, g, vocab = 9, 5, 151936
    target, draft, drafts = make_probs(batch, g, vocab, torch.bfloat16, gen)
    drafts[1, 2], drafts[4, 0] = -1, -1
    target[5] = float("nan")
    counts = torch.tensor([5, 3, 0, 5, 2, 5, 1, 4, 5], device=DEV)
    modes = (dict(uniforms=uniforms(batch, g, gen, torch.float64)),
             dict(seed=torch.randint(0, 2**62, (batch,), device=DEV, generator=gen),
                  offsets=torch.arange(batch, device=DEV) * 7))
    for kwargs in modes:
        got, got_passes = _passes_of(backend, target, draft, drafts, num_draft_tokens=counts, **kwargs)
        want, want_passes = _passes_of("torch", target, draft, drafts, num_draft_tokens=counts, **kwargs)
        assert torch.equal(got_passes, want_passes), sorted(kwargs)
        plain = ops.rejection_sample(target, draft, drafts, num_draft_tokens=counts, backend=backend, **kwargs)
        assert all(torch.equal(x, y) for x, y in zip(got, want)) and all(torch.equal(x, y) for x, y in zip(got, plain))
        assert not bool(got_passes[5].any()) and not bool(got_passes[2].any())


def test_draft_passes_output_in_a_cuda_graph():
    """A captured call writes the caller's draft_passes buffer on every replay."""
    gen = torch.Generator(device=DEV).manual_seed(22)
    batch, g, vocab = 4, 3, 32000
    target, draft, drafts = make_probs(batch, g, vocab, torch.float32, gen)
    u = uniforms(batch, g, gen, torch.float32)
    passes = torch.zeros(batch, g, dtype=torch.bool, device=DEV)

    def call():
        return ops.rejection_sample(target, draft, drafts, uniforms=u, draft_passes=passes, backend="cuda")

    _, replay = cuda_graph_capture(DEV, call)
    for step in range(3):
        new_t, new_q, new_d = make_probs(batch, g, vocab, torch.float32, gen)
        target.copy_(new_t), draft.copy_(new_q), drafts.copy_(new_d)
        u.copy_(uniforms(batch, g, gen, torch.float32))
        passes.fill_(True)
        replay()
        _, want = _passes_of("torch", target, draft, drafts, uniforms=u)
        assert torch.equal(passes, want), step


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


def assert_logits_match(target_logits, draft_logits, drafts, temperature=1.0, **kwargs):
    """cuda == torch except rows whose difference a near-boundary decision explains (few)."""
    got = ops.rejection_sample_logits(target_logits, draft_logits, drafts, temperature=temperature, backend="cuda",
                                      **kwargs)
    want = ops.rejection_sample_logits(target_logits, draft_logits, drafts, temperature=temperature,
                                       backend="torch", **kwargs)
    assert_in_range(*got, target_logits.shape[-1])
    inputs = dict(target_logits=target_logits, draft_logits=draft_logits, draft_tokens=drafts, temperature=temperature,
                  **kwargs)
    _, problem = compare_logits_sampling(got, want, inputs)  # the catalog's near-boundary rule, at most 2% of rows
    assert problem is None, problem
    return got


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

    (static_out, static_acc), replay = cuda_graph_capture(DEV, call)
    for step in range(3):
        offsets.add_(g + 1)
        temps.copy_(torch.rand(batch, generator=gen, device=DEV) + 0.5)
        replay()
        eager = call()
        assert torch.equal(static_out, eager[0]) and torch.equal(static_acc, eager[1]), step
    assert cached_workspaces_are_zero()


def test_auto_backend_follows_the_measurements():
    """common/auto_table.py: rejection_sample Triton at every batch; rejection_sample_logits torch at B=1
    (both kernels measured slower than torch there), CUDA at B=64."""
    dev = torch.device(DEV)
    sizes = dict(G=4, V=128256, dtype=torch.bfloat16)
    assert ops.resolve("rejection_sample", "auto", dev, sizes=dict(B=64, **sizes)) == "triton"
    assert ops.resolve("rejection_sample_logits", "auto", dev, sizes=dict(B=1, **sizes)) == "torch"
    assert ops.resolve("rejection_sample_logits", "auto", dev, sizes=dict(B=64, **sizes)) == "cuda"
