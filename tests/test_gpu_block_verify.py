"""GPU tests of block_verify / block_verify_logits on every GPU backend this machine has
(`gpu_support.backends_here`: triton, and cuda once csrc/block_verify*.cu is built and registered).

Through the public ops (or, for ids the op would refuse on the CPU, the backend itself) with
backend="triton"/"cuda", compared with backend="torch" on the same GPU tensors at production
shapes (B 1/8/64, V 32000/151936, bf16 and the other dtypes): bit for bit for probabilities in
both randomness modes, and for logits equal up to decisions within a tiny margin of their
boundary (the selftest's `compare_block_logits`). Also hostile rows, g = 0, one-hot drafts,
20 back-to-back calls (the ticket protocol on real hardware) and a CUDA-graph capture.
"""

import pytest

torch = pytest.importorskip("torch")

from gpu_support import backends_here  # noqa: E402
from specdec_kernels import ops  # noqa: E402
from specdec_kernels.common import registry  # noqa: E402
from specdec_kernels.common import workspace as _workspace  # noqa: E402
from specdec_kernels.selftest.cases_chain import compare_block_logits  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731
BACKENDS = ("triton", "cuda")
SHAPES = [(1, 4, 151936), (8, 4, 32000), (64, 4, 151936), (64, 7, 32000)]


def need(op: str, backend: str) -> None:
    if backend not in backends_here(op):
        pytest.skip(f"no {backend} backend of {op} here")


def make_probs(batch, g, vocab, dtype, gen):
    """Close target/draft rows (long accepted prefixes and rescues), some zero target entries."""
    target = torch.rand(batch, g + 1, vocab, generator=gen, device=DEV) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen, device=DEV) < 0.2, 0.0, target)
    target[..., 0] += 1e-3
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, g, vocab, generator=gen, device=DEV)
    draft = 0.7 * target[:, :g] + 0.3 * noise / noise.sum(-1, keepdim=True)
    drafts = (torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, g) if g else
              torch.empty(batch, 0, dtype=torch.int64, device=DEV))
    return target.to(dtype), draft.to(dtype), drafts


def modes(batch, g, gen):
    offsets = torch.tensor([0, 2**32 - 2, 17, 2**40, 3], device=DEV).repeat(batch)[:batch]
    return [dict(uniforms=torch.rand(batch, g + 1, generator=gen, device=DEV, dtype=torch.float64)),
            dict(uniforms=torch.rand(batch, g + 1, generator=gen, device=DEV)),
            dict(seed=1234, offsets=offsets),
            dict(seed=torch.randint(-2**62, 2**62, (batch,), generator=gen, device=DEV),
                 num_draft_tokens=torch.randint(0, g + 1, (batch,), generator=gen, device=DEV).int())]


def assert_exact(got, want, vocab, what=""):
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        if not torch.equal(g_, w_):
            rows = (g_ != w_).reshape(g_.shape[0], -1).any(1).nonzero().flatten()[:5].tolist()
            raise AssertionError(f"{name} differs in rows {rows}: {g_[rows].tolist()} != {w_[rows].tolist()} {what}")
    final = got[0].gather(1, got[1].unsqueeze(1))
    assert bool(((final >= 0) & (final < vocab)).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,g,vocab", SHAPES)
def test_probs_bit_exact_at_production_shapes(backend, batch, g, vocab):
    need("block_verify", backend)
    gen = torch.Generator(device=DEV).manual_seed(batch * 1000 + g)
    for dtype in (torch.bfloat16,) if vocab == 151936 and batch == 64 else DTYPES:
        target, draft, drafts = make_probs(batch, g, vocab, dtype, gen)
        for kwargs in modes(batch, g, gen):
            got = ops.block_verify(target, draft, drafts, backend=backend, **kwargs)
            want = ops.block_verify(target, draft, drafts, backend="torch", **kwargs)
            assert_exact(got, want, vocab, f"{dtype} {sorted(kwargs)}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_probs_hostile_rows_g0_and_one_hot(backend):
    need("block_verify", backend)
    fn = registry.implementation("block_verify", backend)  # ids >= V reach the kernel (the op cannot look on a GPU)
    gen = torch.Generator(device=DEV).manual_seed(5)
    batch, g, vocab = 8, 4, 32000
    target, draft, drafts = make_probs(batch, g, vocab, torch.float32, gen)
    target[0, 1] = draft[0, 1]  # p == q
    target[1, 0] = 0.0  # no mass
    target[2, 4, ::7] = NAN
    draft[3, 0, 11] = INF
    draft[4, 2] = torch.nn.functional.one_hot(drafts[4, 2], vocab).float()
    drafts[5, 1], drafts[6, 0] = -1, vocab + 7
    target[7] = NAN
    for dtype in DTYPES:
        t, d = target.to(dtype), draft.to(dtype)
        for kwargs in modes(batch, g, gen):
            assert_exact(fn(t, d, drafts, **kwargs), ops.block_verify(t, d, drafts, backend="torch", **kwargs), vocab)
    one_hot = torch.nn.functional.one_hot(drafts.clamp(0, vocab - 1), vocab).float()
    want = ops.block_verify(target, one_hot, drafts, backend="torch", seed=3)
    assert_exact(fn(target, one_hot, drafts, seed=3), want, vocab)
    t0, d0, x0 = make_probs(16, 0, vocab, torch.bfloat16, gen)
    assert_exact(fn(t0, d0, x0, seed=9), ops.block_verify(t0, d0, x0, backend="torch", seed=9), vocab)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,g,vocab", SHAPES)
def test_logits_match_within_the_contract(backend, batch, g, vocab):
    need("block_verify_logits", backend)
    gen = torch.Generator(device=DEV).manual_seed(batch + g)
    for dtype, temperature in ((torch.bfloat16, 0.8), (torch.float32, torch.full((batch,), 1.1, device=DEV))):
        target = torch.randn(batch, g + 1, vocab, generator=gen, device=DEV) * 3
        draft = target[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=DEV) * 0.7
        t = temperature.view(-1, 1, 1) if isinstance(temperature, torch.Tensor) else temperature
        q = torch.softmax(draft.to(dtype).float() / t, -1)
        drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
        inputs = dict(target_logits=target.to(dtype), draft_logits=draft.to(dtype), draft_tokens=drafts,
                      temperature=temperature, uniforms=torch.rand(batch, g + 1, generator=gen, device=DEV,
                                                                   dtype=torch.float64))
        got = ops.block_verify_logits(**inputs, backend=backend)
        want = ops.block_verify_logits(**inputs, backend="torch")
        error, problem = compare_block_logits(got, want, inputs)
        assert problem is None, problem
        seeded = {k: v for k, v in inputs.items() if k != "uniforms"}
        out, accepted = ops.block_verify_logits(**seeded, seed=7, backend=backend)
        assert_exact((out, accepted), ops.block_verify_logits(**seeded, seed=7, backend=backend), vocab)  # repeatable


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["block_verify", "block_verify_logits"])
def test_repeat_calls_and_graph_replay(backend, op):
    need(op, backend)
    batch, g, vocab = 8, 4, 151936
    gen = torch.Generator(device=DEV).manual_seed(11)

    def build():
        target, draft, drafts = make_probs(batch, g, vocab, torch.bfloat16, gen)
        if op == "block_verify":
            return dict(target_probs=target, draft_probs=draft, draft_tokens=drafts, seed=5)
        return dict(target_logits=target.log(), draft_logits=draft.log(), draft_tokens=drafts, seed=5,
                    temperature=0.9)

    call = getattr(ops, op)
    static = build()
    first = call(**static, backend=backend)
    for _ in range(20):
        again = call(**static, backend=backend)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(int(buf.count_nonzero()) == 0 for buf in _workspace._zeroed_workspaces.values())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(**static, backend=backend)
    for _ in range(3):
        fresh = build()
        for k, v in fresh.items():
            if isinstance(v, torch.Tensor):
                static[k].copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        want = call(**static, backend="torch")
        if op == "block_verify":
            assert_exact(out, want, vocab)
        else:
            assert_exact(out, call(**static, backend=backend), vocab)  # the replay equals an eager call
