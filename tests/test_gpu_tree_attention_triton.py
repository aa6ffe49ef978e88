"""GPU tests of the Triton tree_attention (specdec_kernels/triton/tree_attention.py) at real
shapes: Hq 32 / Hkv 8, D 128 and 64, long and ragged prefixes, chains and random trees,
contiguous and paged caches, the op's own split choice, CUDA-graph capture and no host
sync. Compared with the torch reference on the same GPU tensors; skipped without CUDA.
"""

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.reference.attention import paged_from_contiguous  # noqa: E402

DEVICE = "cuda"
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-4), torch.bfloat16: (2e-2, 1e-4)}  # (out, lse)


def random_parents(batch, n, gen):
    """Per-row random trees, parents before children, about 10% unused slots."""
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        used = [0]
        for i in range(1, n):
            if float(torch.rand((), generator=gen)) < 0.1:
                continue
            parents[b, i] = used[int(torch.randint(max(0, len(used) - 4), len(used), (), generator=gen))]
            used.append(i)
    return parents.to(DEVICE)


def make_case(seq_lens, n, *, hq=32, hkv=8, d=128, dtype=torch.bfloat16, tree=True, page_size=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
    s_max = int(seq_lens.max()) + n
    q = torch.randn(batch, n, hq, d, generator=gen).to(DEVICE, dtype)
    k = torch.randn(batch, hkv, s_max, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(batch, hkv, s_max, d, generator=gen).to(DEVICE, dtype)
    block_table = None
    if page_size is not None:
        k, block_table = paged_from_contiguous(k, page_size, generator=torch.Generator().manual_seed(seed), spare_pages=7)
        v, _ = paged_from_contiguous(v, page_size, generator=torch.Generator().manual_seed(seed), spare_pages=7)
    return dict(q=q, k_cache=k, v_cache=v, seq_lens=seq_lens.to(DEVICE), parents=random_parents(batch, n, gen)
                if tree else None, block_table=block_table)


def assert_close_to_reference(case, got):
    want = ops.tree_attention(**case, backend="torch")
    out_tol, lse_tol = TOL[case["q"].dtype]
    assert got[0].dtype == case["q"].dtype and got[1].dtype == torch.float32
    assert torch.allclose(got[0].float(), want[0].float(), atol=out_tol, rtol=out_tol), \
        (got[0].float() - want[0].float()).abs().max()
    assert torch.allclose(got[1], want[1], atol=lse_tol, rtol=1e-5), (got[1] - want[1]).abs().max()


@pytest.mark.parametrize("n", [8, 32, 64])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
def test_real_shapes(n, tree, page_size):
    case = make_case([4096, 3000, 17, 4095, 0, 2500, 4000, 1], n, tree=tree, page_size=page_size, seed=n)
    assert_close_to_reference(case, ops.tree_attention(**case, backend="triton"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["float16", "float32"])
@pytest.mark.parametrize("d", [64, 128])
def test_dtypes_and_head_dims(dtype, d):
    case = make_case([1000, 333], 16, d=d, dtype=dtype, seed=d)
    assert_close_to_reference(case, ops.tree_attention(**case, backend="triton"))


@pytest.mark.parametrize("page_size", [None, 1, 64])
def test_one_long_row_uses_split_kv(page_size):
    """B = 1 at 32K prefix: the op splits the prefix over programs and merges by LSE."""
    case = make_case([32768], 32, page_size=page_size, seed=3)
    assert_close_to_reference(case, ops.tree_attention(**case, backend="triton"))


def test_auto_picks_triton_and_matches():
    case = make_case([100, 200], 8, hq=8, hkv=2, d=64, seed=4)
    assert ops.resolve("tree_attention", "auto", torch.device(DEVICE)) in ("triton", "cuda")
    assert_close_to_reference(case, ops.tree_attention(**case))


def test_no_host_sync():
    case = make_case([512, 4000], 32, page_size=16, seed=5)
    ops.tree_attention(**case, backend="triton")  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops.tree_attention(**case, backend="triton")
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("page_size", [None, 16])
def test_cuda_graph_replay_follows_new_values(page_size):
    """Capture once, then change seq_lens, parents, q, the caches and the block table in place:
    the replay must compute the new problem (nothing data-dependent was baked in)."""
    case = make_case([1000, 2000, 64], 16, page_size=page_size, seed=6)
    static = {name: (t.clone() if isinstance(t, torch.Tensor) else t) for name, t in case.items()}

    def call():
        return ops.tree_attention(**static, backend="triton")

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()  # warm up (compile) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    fresh = make_case([1999, 5, 2000], 16, page_size=page_size, seed=7)  # same S_max, so the same shapes
    for name in ("q", "k_cache", "v_cache", "seq_lens", "parents", "block_table"):
        if static[name] is not None:
            static[name].copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(static, (out, lse))


def test_sm_scale_and_gqa_sweep():
    for hq, hkv in ((32, 32), (32, 4), (8, 1)):
        case = make_case([700, 1300], 24, hq=hq, hkv=hkv, seed=hq + hkv)
        got = ops.tree_attention(**case, sm_scale=0.5 / math.sqrt(128), backend="triton")
        want = ops.tree_attention(**case, sm_scale=0.5 / math.sqrt(128), backend="torch")
        assert torch.allclose(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
        assert torch.allclose(got[1], want[1], atol=1e-4, rtol=1e-5)
