"""The Triton tree_attention backend against the torch reference and the branch-equivalence
oracle (tests/oracles.py), on CPU tensors under the Triton interpreter.

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_attention.py, the
"tiny" tier, judged as `specdec-kernels selftest` judges them): every dtype, layout (contiguous,
paged, HND pools) and mask kind, GQA groups, split counts (empty splits included), M blocks, head
dims, page sizes, node counts, unused slots, a row filling the cache, strided inputs, sm_scale and
empty batches. Small BLOCK_N, BLOCK_M and forced split counts (the cases' triton_overrides) make
the few keys span several tiles, M blocks and splits; cache slots a row must not read hold NaN.
What the catalog cannot express stays here: the independent per-path oracle, a chain passed as
parents being bit-identical to parents=None, and unvalidated out-of-range values.
"""

import math

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.reference.attention import paged_from_contiguous
from specdec_kernels.triton import attention as triton_module

import oracles
from catalog_support import catalog_cases, check_case
from test_triton_tree_verify import random_parents

def make_case(seq_lens, n, hq, hkv, d, dtype, *, layout="contiguous", page_size=4, tree=True, spare=0, seed=0):
    """Inputs of one call; the cache holds NaN wherever a row must not read."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
    s_max = int(seq_lens.max()) + n + spare
    q = torch.randn(batch, n, hq, d, generator=gen).to(dtype)
    caches = []
    for _ in range(2):
        cache = torch.randn(batch, hkv, s_max, d, generator=gen)
        beyond = torch.arange(s_max).view(1, 1, s_max, 1) >= (seq_lens + n).view(batch, 1, 1, 1)
        caches.append(cache.masked_fill(beyond, float("nan")).to(dtype))
    block_table = None
    if layout != "contiguous":
        paged = [paged_from_contiguous(c, page_size, generator=torch.Generator().manual_seed(seed), spare_pages=3)
                 for c in caches]
        caches, block_table = [p for p, _ in paged], paged[0][1]
        used_pages = (seq_lens + n + page_size - 1) // page_size
        unread = torch.arange(block_table.shape[1]).unsqueeze(0) >= used_pages.unsqueeze(1)
        block_table = block_table.masked_fill(unread, -1)  # entries past a row's last page are never read
        if layout == "hnd":  # an HND pool [P, Hkv, page_size, D] passed as .transpose(1, 2)
            caches = [c.transpose(1, 2).contiguous().transpose(1, 2) for c in caches]
    parents = torch.tensor([random_parents(gen, n) for _ in range(batch)]) if tree else None
    return dict(q=q, k_cache=caches[0], v_cache=caches[1], seq_lens=seq_lens, parents=parents,
                block_table=block_table)


def tolerances(dtype):
    """(out atol/rtol, lse atol): fp32 dots are IEEE; half inputs round p to their dtype for P @ V."""
    return (2e-5, 1e-5) if dtype == torch.float32 else (2e-2, 1e-4)


def run_triton(case, **overrides):
    """The Triton launcher directly (to force splits / block sizes), else through the op."""
    if not overrides:
        return ops.tree_attention(**case, backend="triton")
    scale = overrides.pop("sm_scale", 1.0 / math.sqrt(case["q"].shape[-1]))
    return triton_module.tree_attention(case["q"], case["k_cache"], case["v_cache"], case["seq_lens"],
                                        case["parents"], case["block_table"], sm_scale=scale, **overrides)


def assert_matches_reference(case, got=None, **overrides):
    out, lse = got if got is not None else run_triton(case, **overrides)
    want_out, want_lse = ops.tree_attention(**case, backend="torch")
    tol, lse_tol = tolerances(case["q"].dtype)
    assert out.dtype == case["q"].dtype and out.shape == case["q"].shape
    assert lse.dtype == torch.float32 and lse.shape == case["q"].shape[:3]
    assert torch.allclose(out.float(), want_out.float(), atol=tol, rtol=tol), (out.float() - want_out.float()).abs().max()
    assert torch.allclose(lse, want_lse, atol=lse_tol, rtol=1e-5), (lse - want_lse).abs().max()
    return out, lse


# ------------------------------------------------------------------ against the reference

@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("tree_attention",)))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_branch_equivalence_oracle(layout):
    """Each node's output equals attention over the prefix plus its own root-to-node path,
    computed by a Python loop that shares no code with the op."""
    case = make_case([3, 40], 6, 4, 2, 16, torch.float32, layout=layout, page_size=8, seed=5)
    out, lse = run_triton(case, num_splits=2, block_n=16)
    want_out, want_lse = oracles.tree_attention(case["q"], case["k_cache"], case["v_cache"], case["seq_lens"],
                                                case["parents"], case["block_table"], 1 / math.sqrt(16))
    assert torch.allclose(out.double(), torch.tensor(want_out, dtype=torch.float64), atol=2e-5, rtol=1e-5)
    assert torch.allclose(lse.double(), torch.tensor(want_lse, dtype=torch.float64), atol=1e-5, rtol=1e-5)


def test_deep_chain_as_parents_equals_the_causal_chain():
    """A chain passed as parents (depth N - 1, so every squaring of the ancestor closure
    is needed) masks exactly like parents=None: the outputs are bit-identical."""
    n = 33
    case = make_case([7, 20], n, 2, 1, 16, torch.float32, tree=False, seed=9)
    chain = run_triton(case, num_splits=2, block_n=16)
    as_tree = run_triton({**case, "parents": (torch.arange(n) - 1).expand(2, n).contiguous()}, num_splits=2, block_n=16)
    assert torch.equal(chain[0], as_tree[0]) and torch.equal(chain[1], as_tree[1])
    assert_matches_reference(case, got=chain)


# ------------------------------------------------------------------ values the GPU cannot check

def test_no_nodes():
    """N = 0 (the catalog has B = 0 only: the torch reference dies with SIGFPE at N = 0 on the CPU)."""
    q = torch.randn(2, 0, 2, 16)
    cache = torch.randn(2, 1, 8, 16)
    out, lse = ops.tree_attention(q, cache, cache, torch.zeros(2, dtype=torch.int64), backend="triton")
    assert out.shape == q.shape and lse.shape == (2, 0, 2)


def test_out_of_range_values_are_clamped_not_read_out_of_bounds():
    """What a GPU call gets when nobody can validate the values: seq_lens past the cache
    acts as capacity - N (negative as 0), page ids are clamped to real pages, a parent
    outside [0, node) reads as none. The kernel is called directly (no validation)."""
    case = make_case([5, 30], 4, 2, 1, 16, torch.float32, layout="paged", page_size=4, seed=13)
    capacity = case["block_table"].shape[1] * 4
    bad = {**case, "seq_lens": torch.tensor([-3, 10**6]),
           "parents": torch.tensor([[7, 0, -9, 9], [-1, 3, 0, 2]])}
    bad["block_table"] = case["block_table"].clone()
    bad["block_table"][0, 0] = -5
    bad["block_table"][1, -1] = 10**6
    num_pages = case["k_cache"].shape[0]
    clamped = {**bad, "seq_lens": torch.tensor([0, capacity - 4]),
               "parents": torch.tensor([[-1, 0, -1, -1], [-1, -1, 0, 2]]),
               "block_table": bad["block_table"].clamp(0, num_pages - 1)}
    pool = [c.nan_to_num(0.0) for c in (case["k_cache"], case["v_cache"])]  # clamped pages hold real values
    bad["k_cache"], bad["v_cache"] = pool
    clamped["k_cache"], clamped["v_cache"] = pool
    got = run_triton(bad, num_splits=2, block_n=16)
    assert_matches_reference(clamped, got=got)
