"""GPU tests of the CUDA (csrc/kv_cache.cu) and Triton kv_compact backends.

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_kv_cache.py, the "full"
tier, the one `specdec-kernels selftest` runs): real shapes (32 layers, B in {1, 8, 32}, N in
{8, 64}, Hkv 8, D 128, bf16) in one allocation (fast path) and as separate tensors (device
table), other dtypes with int32 lengths, misaligned views, long paths, chains / root-only / empty
rows, M = 0 / 1, no layers; each runs a backend on GPU caches in place against the reference, bit
for bit over whole cache tensors, and graph cases are captured and replayed on new inputs.
What the catalog cannot express stays here: unvalidated out-of-range rows, capture of separate
caches (the kept table), the launcher's argument checks, and the table across streams.
Everything skips cleanly without CUDA or without a built _C.
"""

import pytest

torch = pytest.importorskip("torch")

from gpu_support import CUDA_KERNEL_MARKS, _C  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.common import kv_layout as _kv_layout  # noqa: E402
from specdec_kernels.selftest.cases_kv_cache import random_accepted  # noqa: E402

BACKENDS = ["cuda", "triton"]


@pytest.mark.parametrize("case,backend", gpu_catalog("cuda", ("kv_compact",), BACKENDS))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, "cuda")
    check_case(case, backend, "cuda", profile=gpu_profile(), graphs=True)


def stacked_caches(layers, batch, heads, seq, dim, dtype, gen):
    """One [L, 2, B, Hkv, S, D] allocation: K and V of every layer are views (fast path)."""
    kv = torch.randn(layers, 2, batch, heads, seq, dim, generator=gen, device="cuda").to(dtype)
    return list(kv[:, 0]), list(kv[:, 1])


def separate_caches(layers, batch, heads, seq, dim, dtype, gen):
    """One tensor per cache, every other one NHD-strided: only a device table describes them."""
    caches = []
    for i in range(2 * layers):
        if i % 2:
            caches.append(torch.randn(batch, seq, heads, dim, generator=gen, device="cuda").to(dtype).transpose(1, 2))
        else:
            caches.append(torch.randn(batch, heads, seq, dim, generator=gen, device="cuda").to(dtype))
    return caches[:layers], caches[layers:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unvalidated_out_of_range_rows_are_skipped(backend):
    """Rows whose source or destination lies outside [0, S_max) are skipped; memory around the
    caches stays untouched (on a GPU the op does not inspect values)."""
    layers, batch, heads, seq, dim = 2, 3, 2, 8, 16
    guard = torch.randn(2 * layers + 2, batch, heads, seq, dim, device="cuda")
    before = guard.clone()
    caches = list(guard[1:-1])
    accepted = torch.tensor([[0, 3, 9], [0, 1, 2], [0, 2, 5]], device="cuda")
    seq_lens = torch.tensor([2, -3, 4], device="cuda")
    new = ops.kv_compact(caches[:layers], caches[layers:], seq_lens, accepted, backend=backend)
    assert new.tolist() == [5, 0, 7]
    assert torch.equal(guard[0], before[0]) and torch.equal(guard[-1], before[-1])
    for cache, old in zip(caches, before[1:-1]):
        assert torch.equal(cache[0, :, 3], old[0, :, 5]) and torch.equal(cache[0, :, 4], old[0, :, 4])
        assert torch.equal(cache[1], old[1])
        assert torch.equal(cache[2, :, 5], old[2, :, 6]) and torch.equal(cache[2, :, 6], old[2, :, 6])


@pytest.mark.parametrize("layout", ["stacked", "separate"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_capture_and_replay(backend, layout):
    """Capture once (after a warm-up call, which builds the table of separate caches), then
    replay with new paths and lengths written into the captured inputs."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    cpu_gen = torch.Generator().manual_seed(5)
    layers, batch, heads, dim, n = 32, 8, 8, 128, 16
    make = stacked_caches if layout == "stacked" else separate_caches
    k, v = make(layers, batch, heads, 64 + n, dim, torch.bfloat16, gen)
    seq_lens = torch.randint(0, 65, (batch,), generator=cpu_gen).cuda()
    accepted = torch.full((batch, n), -1, dtype=torch.int64, device="cuda")
    ops.kv_compact(k, v, seq_lens, accepted, backend=backend)  # warm-up (Triton compiles, table cached)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        new_lens = ops.kv_compact(k, v, seq_lens, accepted, backend=backend)
    if layout == "separate":
        assert len(_kv_layout._captured) >= 1  # the captured table is kept for good
    for _ in range(3):
        seq_lens.copy_(torch.randint(0, 65, (batch,), generator=cpu_gen))
        fresh = random_accepted(batch, n, cpu_gen)
        accepted.fill_(-1)
        accepted[:, :fresh.shape[1]].copy_(fresh)
        ref_k, ref_v = [c.clone() for c in k], [c.clone() for c in v]
        want = ops.kv_compact(ref_k, ref_v, seq_lens, accepted, backend="torch")
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(new_lens, want)
        assert all(torch.equal(a, b) for a, b in zip([*k, *v], [*ref_k, *ref_v]))


def test_capture_without_warm_up_explains_the_rule():
    gen = torch.Generator(device="cuda").manual_seed(6)
    k, v = separate_caches(2, 2, 2, 16, 8, torch.float16, gen)
    seq_lens = torch.tensor([1, 2], device="cuda")
    accepted = torch.tensor([[0, 2], [0, -1]], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="before capturing"):
        with torch.cuda.graph(graph):
            ops.kv_compact(k, v, seq_lens, accepted, backend="cuda")


def test_launcher_rejects_bad_arguments():
    with pytest.raises(ValueError, match="vector_bytes"):
        _C.kv_compact(0, 0, 0, 0, (0, 0, 0), (0, 0, 0), 0, 1, 1, 1, 8, 2, 3, 0, False, 1, 0, 1, 1, 0, 0, 1, 0)
    with pytest.raises(ValueError, match="elem_size"):
        _C.kv_compact(0, 0, 0, 0, (0, 0, 0), (0, 0, 0), 0, 1, 1, 1, 8, 8, 16, 0, False, 1, 0, 1, 1, 0, 0, 1, 0)
    with pytest.raises(ValueError, match="divide every base address"):  # fast path, misaligned base
        _C.kv_compact(2, 16, 0, 0, (0, 0, 0), (0, 0, 0), 0, 1, 1, 1, 8, 2, 16, 16, False, 1, 16, 1, 1, 16, 1, 1, 0)


def test_auto_picks_cuda():
    assert ops.resolve("kv_compact", "auto", torch.device("cuda")) == "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
def test_table_made_on_one_stream_serves_another(backend, monkeypatch):
    """A table uploaded (non-blocking) on stream A behind a long kernel, then used at once on stream B
    with no sync in between: B must wait on A's upload event (else it reads the table before it
    lands), and the table is recorded on B, so evicting it (MAX_TABLES=1 here) while B's kernel may
    still run never lets a new allocation overwrite it."""
    monkeypatch.setattr(_kv_layout, "MAX_TABLES", 1)
    gen = torch.Generator(device="cuda").manual_seed(7)
    cpu_gen = torch.Generator().manual_seed(7)
    layers, batch, heads, dim, n = 8, 4, 4, 64, 8
    k, v = separate_caches(layers, batch, heads, 32 + n, dim, torch.bfloat16, gen)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(3):
        seq_lens = torch.randint(0, 33, (batch,), generator=cpu_gen).cuda()
        accepted = random_accepted(batch, n, cpu_gen).cuda()
        ref_k, ref_v = [c.clone() for c in k], [c.clone() for c in v]
        want = ops.kv_compact(ref_k, ref_v, seq_lens, accepted, backend="torch")
        torch.cuda.synchronize()
        with torch.cuda.stream(a):  # A is busy for a while, then uploads the table
            torch.cuda._sleep(50_000_000)
            _kv_layout.cache_layout(k, v)
        with torch.cuda.stream(b):  # no wait on A here: ordering the table is the library's job
            got = ops.kv_compact(k, v, seq_lens, accepted, backend=backend)
        entry = next(iter(_kv_layout._tables.values()))
        assert b.cuda_stream in entry.streams and a.cuda_stream in entry.streams
        other_k, other_v = separate_caches(2, 1, 1, 4, 8, torch.bfloat16, gen)  # evicts the table at once
        with torch.cuda.stream(a):
            ops.kv_compact(other_k, other_v, torch.zeros(1, dtype=torch.int64, device="cuda"),
                           torch.zeros(1, 1, dtype=torch.int64, device="cuda"), backend=backend)
            torch.empty(16 * layers * 4, dtype=torch.int64, device="cuda").fill_(-1)  # may reuse freed blocks
        torch.cuda.synchronize()
        assert torch.equal(got, want)
        assert all(torch.equal(x, y) for x, y in zip([*k, *v], [*ref_k, *ref_v]))
