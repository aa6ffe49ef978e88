"""GPU tests of the Triton tree_attention (specdec_kernels/triton/attention.py).

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_attention.py, the
"full" tier, the one `specdec-kernels selftest` runs): real shapes (Hq 32 / Hkv 8, D 128 and 64,
N 8 / 32 / 64, long and ragged prefixes, one 32K row that splits the prefix), chains and random
trees, contiguous and paged caches, dtypes, GQA sweeps with sm_scale, and CUDA-graph capture
replayed on new values; the same cases run on the cuda backend in test_gpu_tree_attention_cuda.py.
What the catalog cannot express stays here: auto's choice and no host sync. Skipped without CUDA.
"""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402

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


@pytest.mark.parametrize("case,backend", gpu_catalog(DEVICE, ("tree_attention",), ("triton",)))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, DEVICE)
    check_case(case, backend, DEVICE, profile=gpu_profile(), graphs=True)


def assert_close_to_reference(case, got):
    want = ops.tree_attention(**case, backend="torch")
    out_tol, lse_tol = TOL[case["q"].dtype]
    assert got[0].dtype == case["q"].dtype and got[1].dtype == torch.float32
    assert torch.allclose(got[0].float(), want[0].float(), atol=out_tol, rtol=out_tol), \
        (got[0].float() - want[0].float()).abs().max()
    assert torch.allclose(got[1], want[1], atol=lse_tol, rtol=1e-5), (got[1] - want[1]).abs().max()


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


