"""GPU tests of the CUDA tree_attention (csrc/attention.cu).

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_attention.py, the
"full" tier, the one `specdec-kernels selftest` runs; the same cases run on triton in
test_gpu_tree_attention_triton.py): heads (32/8, 8/8, 28/4) x D (64, 128) x dtypes x chain / tree
with boosted draft keys and NaN past each row, draft sizes and batches at 4K prefixes, 32K
prefixes (uniform and ragged), paged pools (page sizes 1 / 16 / 64 / 48, int32 and int64 indices,
NHD and HND views), strided inputs, head dims without a tensor-core kernel, N = 130 with sm_scale,
and CUDA-graph capture replayed on new values. The tests below check what the catalog cannot
express: the per-path oracle, paged == contiguous bit for bit, strided == contiguous bit for bit,
determinism and the workspace handed back zeroed.

Every test below runs the public op with backend="cuda" and compares it with two oracles:
  * reference.tree_attention (the torch specification; a paged cache is first gathered
    into a contiguous one here, independently of the op's own paged path), and
  * for trees, a float64 per-path oracle: each node is plain, unmasked attention over its
    row's prefix plus its own root-to-node path (branch equivalence).
Tolerances (out vs the float32 reference, which rounds to q's dtype too): bfloat16
atol = rtol = 1e-2 (P enters the P.V tensor-core product as bf16, ~2^-9 relative, and both
outputs round to bf16, 2^-8); float16 2e-3; float32 2e-5. lse (float32 everywhere): atol 2e-4.

Inputs are built so that mistakes show: the draft nodes' keys are scaled up (the tree part
carries as much weight as a long prefix, so a wrong ancestor bit moves the output far past
the tolerance; the tests assert that the tree and the chain answers differ), and every K/V
element the kernel must not read (positions past a row's prefix + N, unused pages, table
entries past a row's length) is NaN, which would reach the output through P.V.
Everything skips cleanly without CUDA or without a built _C.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from catalog_support import check_case, gpu_catalog, gpu_profile  # noqa: E402
from gpu_support import CUDA_KERNEL_MARKS, _C  # noqa: E402
from specdec_kernels.selftest.tree_inputs import biased_parents as random_parents  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

from specdec_kernels import ops, reference  # noqa: E402
from specdec_kernels.common import workspace  # noqa: E402
from specdec_kernels.cuda import _launch  # noqa: E402

DTYPE_IDS = lambda d: str(d).split(".")[-1]  # noqa: E731
TOL = {torch.bfloat16: dict(atol=1e-2, rtol=1e-2), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.float32: dict(atol=2e-5, rtol=2e-5)}
LSE_TOL = dict(atol=2e-4, rtol=1e-5)
NAN = float("nan")
HEADS = [(32, 8), (8, 8), (28, 4)]
HEAD_IDS = [f"{hq}q{hkv}kv" for hq, hkv in HEADS]
DEVICE = "cuda"


# ----------------------------------------------------------------------------- inputs

def make_inputs(B, N, Hq, Hkv, D, dtype, prefixes, *, s_max=None, tree="random", seed=0, boost=3.0,
                unused_frac=0.25):
    """q [B, N, Hq, D], contiguous K/V [B, Hkv, S_max, D] (NaN past each row's prefix + N, the
    draft keys scaled by `boost`), seq_lens [B] int64 and parents [B, N] (None for a chain)."""
    gen = torch.Generator().manual_seed(seed)
    cgen = torch.Generator(device=DEVICE).manual_seed(seed)
    s_max = s_max or max(prefixes) + N + 37
    q = torch.randn(B, N, Hq, D, generator=cgen, device=DEVICE)
    k = torch.randn(B, Hkv, s_max, D, generator=cgen, device=DEVICE)
    v = torch.randn(B, Hkv, s_max, D, generator=cgen, device=DEVICE)
    for b, prefix in enumerate(prefixes):
        k[b, :, prefix:prefix + N] *= boost
        k[b, :, prefix + N:] = NAN
        v[b, :, prefix + N:] = NAN
    seq_lens = torch.tensor(prefixes, dtype=torch.int64, device=DEVICE)
    parents = None if tree == "chain" else random_parents(B, N, gen, unused_frac).to(DEVICE)
    return q.to(dtype), k.to(dtype), v.to(dtype), seq_lens, parents


def to_pages(k, v, seq_lens, n, page_size, seed, *, index_dtype=torch.int64, hnd=False, spare=3):
    """The same keys as page pools [num_pages, page_size, Hkv, D] in a random page order, and
    block_table [B, max_pages]. Slots past a row's prefix + N, spare pages and the table entries
    past a row's pages are NaN / point at a NaN page. hnd: the pool is stored [P, Hkv, ps, D]
    and passed as a transposed view."""
    gen = torch.Generator().manual_seed(seed)
    B, hkv, _, d = k.shape
    lengths = [int(p) + n for p in seq_lens.tolist()]
    pages = [math.ceil(length / page_size) for length in lengths]
    total = sum(pages) + spare
    order = torch.randperm(total, generator=gen).tolist()
    shape = (total, hkv, page_size, d) if hnd else (total, page_size, hkv, d)
    pool_k = torch.full(shape, NAN, dtype=k.dtype, device=k.device)
    pool_v = torch.full(shape, NAN, dtype=k.dtype, device=k.device)
    view_k, view_v = (pool_k.transpose(1, 2), pool_v.transpose(1, 2)) if hnd else (pool_k, pool_v)
    poison = order[-1]  # a spare page: never holds a real key
    table = torch.full((B, max(pages) + 1), poison, dtype=torch.int64)
    used = 0
    for b in range(B):
        for j in range(pages[b]):
            page = order[used]
            used += 1
            table[b, j] = page
            lo, hi = j * page_size, min((j + 1) * page_size, lengths[b])
            view_k[page, : hi - lo] = k[b, :, lo:hi].transpose(0, 1)
            view_v[page, : hi - lo] = v[b, :, lo:hi].transpose(0, 1)
    return view_k, view_v, table.to(index_dtype).to(k.device)


# ----------------------------------------------------------------------------- oracles

def cuda_attention(q, k, v, seq_lens, parents=None, *, block_table=None, sm_scale=None):
    paged = {} if block_table is None else {"block_table": block_table}
    return ops.tree_attention(q, k, v, seq_lens, parents, sm_scale=sm_scale, backend="cuda", **paged)


def path_oracle(q, k, v, seq_lens, parents, sm_scale=None):
    """float64 (out, lse): node i of row b = softmax attention over keys [0, P) + P + path(i),
    path(i) = i and its ancestors, walked on the host. No mask anywhere."""
    B, N, Hq, D = q.shape
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    out = torch.empty(B, N, Hq, D, dtype=torch.float64, device=q.device)
    lse = torch.empty(B, N, Hq, dtype=torch.float64, device=q.device)
    par = None if parents is None else parents.tolist()
    for b, prefix in enumerate(seq_lens.tolist()):
        for i in range(N):
            path, node = [], i
            while node >= 0:
                path.append(node)
                node = (node - 1 if node > 0 else -1) if par is None else (par[b][node] if node > 0 else -1)
            keys = torch.cat([torch.arange(prefix), prefix + torch.tensor(sorted(path))]).to(q.device)
            kk = k[b][:, keys].double().repeat_interleave(group, 0)  # [Hq, L, D]
            vv = v[b][:, keys].double().repeat_interleave(group, 0)
            scores = torch.einsum("hd,hld->hl", q[b, i].double(), kk) * scale
            lse[b, i] = torch.logsumexp(scores, -1)
            out[b, i] = torch.einsum("hl,hld->hd", torch.softmax(scores, -1), vv)
    return out, lse


def contiguous_from_pages(k_pool, v_pool, table, seq_lens, n):
    """Gather each row's pages back into [B, Hkv, S, D] (NaN past the row's keys)."""
    B = table.shape[0]
    page_size, hkv, d = k_pool.shape[1:]
    lengths = [int(p) + n for p in seq_lens.tolist()]
    s = max(lengths)
    k = torch.full((B, hkv, s, d), NAN, dtype=k_pool.dtype, device=k_pool.device)
    v = torch.full_like(k, NAN)
    for b, length in enumerate(lengths):
        pos = torch.arange(length, device=k_pool.device)
        pages = table[b].long()[pos // page_size]
        k[b, :, :length] = k_pool[pages, pos % page_size].transpose(0, 1)
        v[b, :, :length] = v_pool[pages, pos % page_size].transpose(0, 1)
    return k, v


def check(q, k, v, seq_lens, parents=None, *, block_table=None, sm_scale=None, oracle=False):
    """cuda vs the reference (and the per-path oracle); returns the cuda (out, lse)."""
    out, lse = cuda_attention(q, k, v, seq_lens, parents, block_table=block_table, sm_scale=sm_scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all()), "read a key it must not read"
    rk, rv = (k, v) if block_table is None else contiguous_from_pages(k, v, block_table, seq_lens, q.shape[1])
    want_out, want_lse = reference.tree_attention(q, rk, rv, seq_lens, parents, sm_scale=sm_scale)
    torch.testing.assert_close(out.float(), want_out.float(), **TOL[q.dtype])
    torch.testing.assert_close(lse, want_lse, **LSE_TOL)
    if oracle:
        path_out, path_lse = path_oracle(q, rk, rv, seq_lens, parents, sm_scale)
        torch.testing.assert_close(out.double(), path_out, **TOL[q.dtype])
        torch.testing.assert_close(lse.double(), path_lse, **LSE_TOL)
    return out, lse


def same_plan(q, hkv, capacity_a, capacity_b):
    """Whether two K/V capacities give the same split count (and so the same summation order)."""
    B, N, hq, D = q.shape
    plans = [_C.tree_attention_plan(B, N, hq, hkv, D, cap, _launch.DTYPE_CODES[q.dtype])[0]
             for cap in (capacity_a, capacity_b)]
    return plans[0] == plans[1]


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("case,backend", gpu_catalog(DEVICE, ("tree_attention",), ("cuda",)))
def test_catalog_case(case, backend):
    check_case(case, backend, DEVICE, profile=gpu_profile(), graphs=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS)
def test_per_path_oracle(dtype):
    """Branch equivalence, with unused slots (parent -1) that must see the prefix and themselves."""
    for N, heads, D, prefixes in ((32, (28, 4), 64, [0, 100, 1500]), (64, (8, 8), 128, [5000, 1]),
                                  (9, (32, 8), 128, [300])):
        q, k, v, seq_lens, parents = make_inputs(len(prefixes), N, *heads, D, dtype, prefixes, seed=N,
                                                 unused_frac=0.3)
        check(q, k, v, seq_lens, parents, oracle=True)


@pytest.mark.parametrize("hnd", [False, True], ids=["nhd", "hnd_view"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=DTYPE_IDS)
@pytest.mark.parametrize("page_size", [1, 16, 64, 48])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS)
def test_paged(dtype, page_size, index_dtype, hnd):
    N, prefixes = 16, [0, 1000, 2500, 63]
    q, k, v, seq_lens, parents = make_inputs(4, N, 32, 8, 128, dtype, prefixes, seed=page_size)
    k_pool, v_pool, table = to_pages(k, v, seq_lens, N, page_size, seed=page_size, index_dtype=index_dtype, hnd=hnd)
    out, lse = check(q, k_pool, v_pool, seq_lens.to(index_dtype), parents.to(index_dtype), block_table=table,
                     oracle=page_size == 16)
    contiguous_out, contiguous_lse = cuda_attention(q, k, v, seq_lens, parents)
    if same_plan(q, k.shape[1], k.shape[2], table.shape[1] * page_size):  # same keys, tiles and splits: same bits
        torch.testing.assert_close(out, contiguous_out, atol=0, rtol=0)
        torch.testing.assert_close(lse, contiguous_lse, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=DTYPE_IDS)
def test_non_contiguous_inputs(dtype):
    """q a slice of a wider tensor; K/V as a [B, S, Hkv, D] buffer seen through transpose(1, 2),
    and as rows padded to D + 1 elements (not 16-byte aligned: the kernel's plain-load path);
    seq_lens and parents strided views."""
    B, N, hq, hkv, D = 3, 12, 32, 8, 128
    q, k, v, seq_lens, parents = make_inputs(B, N, hq, hkv, D, dtype, [10, 600, 1234], seed=3)
    wide_q = torch.zeros(B, N, hq, D + 8, dtype=dtype, device=DEVICE)
    wide_q[..., :D] = q
    q_view = wide_q[..., :D]
    nhd_k = k.transpose(1, 2).contiguous().transpose(1, 2)  # strides of a [B, S, Hkv, D] buffer
    nhd_v = v.transpose(1, 2).contiguous().transpose(1, 2)
    padded_k = torch.full(k.shape[:-1] + (D + 1,), NAN, dtype=dtype, device=DEVICE)
    padded_v = torch.full_like(padded_k, NAN)
    padded_k[..., :D], padded_v[..., :D] = k, v
    strided_lens = torch.stack([seq_lens.int(), seq_lens.int()], 1)[:, 0]
    strided_parents = torch.stack([parents, parents], 2)[..., 1]
    assert not strided_lens.is_contiguous() and not strided_parents.is_contiguous()
    want = check(q, k, v, seq_lens, parents)
    for kk, vv in ((nhd_k, nhd_v), (padded_k[..., :D], padded_v[..., :D])):
        got = check(q_view, kk, vv, strided_lens, strided_parents)
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
        torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)


def test_seq_len_extremes():
    """Empty prefixes and rows that fill the cache to the last slot (int32 seq_lens)."""
    N, s_max = 24, 3000
    for tree in ("chain", "random"):
        q, k, v, seq_lens, parents = make_inputs(4, N, 8, 8, 64, torch.float16, [0, s_max - N, 0, s_max - N - 1],
                                                 s_max=s_max, tree=tree, seed=11)
        check(q, k, v, seq_lens.int(), parents, oracle=True)


@pytest.mark.parametrize("dtype,D", [(torch.float16, 80), (torch.bfloat16, 256), (torch.float16, 32),
                                     (torch.float32, 256)], ids=["fp16-80", "bf16-256", "fp16-32", "fp32-256"])
def test_head_dims_without_a_tensor_core_kernel(dtype, D):
    q, k, v, seq_lens, parents = make_inputs(2, 10, 8, 2, D, dtype, [700, 5], seed=D)
    check(q, k, v, seq_lens, parents, oracle=True)


def test_many_nodes_and_custom_scale():
    """N = 130 (ancestor words of several tiles, two M-tiles per KV head) and sm_scale."""
    q, k, v, seq_lens, parents = make_inputs(2, 130, 2, 2, 128, torch.bfloat16, [333, 2100], seed=130,
                                             unused_frac=0.1)
    check(q, k, v, seq_lens, parents, sm_scale=0.05, oracle=True)
    check(q, k, v, seq_lens, None, sm_scale=0.2)


def test_deterministic_and_workspace_left_zeroed():
    """Split rows merge in a fixed order (no float atomics): two calls agree bit for bit; the
    split tickets are handed back zeroed."""
    q, k, v, seq_lens, parents = make_inputs(1, 32, 32, 8, 128, torch.bfloat16, [30000], seed=5)
    splits = _C.tree_attention_plan(1, 32, 32, 8, 128, k.shape[2], 2)[0]
    assert splits > 1  # the case exercises the ticket and the merge
    first = cuda_attention(q, k, v, seq_lens, parents)
    second = cuda_attention(q, k, v, seq_lens, parents)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    torch.cuda.synchronize()
    for buffer in workspace._zeroed_workspaces.values():
        assert not bool(buffer.any())


