"""The Triton tree_attention backend against the torch reference and the branch-equivalence
oracle (tests/oracles.py), on CPU tensors under the Triton interpreter.

Shapes stay small (the interpreter runs every program in numpy); small BLOCK_N, BLOCK_M
and forced split counts make the few keys span several tiles, M blocks and splits. Cache
slots a row must not read (past seq_lens[b] + N, unused pages) hold NaN, so any stray
read shows up in the output.
"""

import math

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.reference.attention import paged_from_contiguous
from specdec_kernels.triton import tree_attention as triton_module

import oracles
from test_triton_tree_verify import random_parents

dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731


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

# every dtype, layout and mask kind, each with the others (not the full product: the interpreter is slow)
COMBOS = [(torch.float32, "contiguous", False), (torch.float32, "contiguous", True), (torch.float16, "contiguous", True),
          (torch.bfloat16, "contiguous", False), (torch.float32, "paged", False), (torch.float16, "paged", True),
          (torch.bfloat16, "paged", True), (torch.bfloat16, "hnd", True), (torch.float32, "hnd", False)]


@pytest.mark.parametrize("dtype, layout, tree", COMBOS,
                         ids=[f"{dtype_id(d)}-{lay}-{'tree' if t else 'chain'}" for d, lay, t in COMBOS])
def test_matches_reference(dtype, layout, tree):
    case = make_case([0, 21, 70], 7, 4, 2, 16, dtype, layout=layout, tree=tree, spare=5)
    assert_matches_reference(case, num_splits=3, block_n=16)


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


@pytest.mark.parametrize("hq, hkv", [(1, 1), (4, 4), (8, 1), (6, 2)])
def test_gqa_groups(hq, hkv):
    case = make_case([9, 33], 5, hq, hkv, 16, torch.float32, seed=hq * 10 + hkv)
    assert_matches_reference(case, num_splits=2, block_n=16)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 12])
def test_split_counts_give_the_same_answer(num_splits):
    """12 splits of at most 6 tiles of prefix leave splits empty: the merge must ignore them."""
    case = make_case([0, 17, 90], 5, 4, 2, 16, torch.float32, seed=3)
    assert_matches_reference(case, num_splits=num_splits, block_n=16)


@pytest.mark.parametrize("block_m", [16, 32])
def test_several_m_blocks(block_m):
    """N * group = 9 * 4 = 36 packed rows over 3 (or 2) programs per KV head."""
    case = make_case([4, 50], 9, 8, 2, 16, torch.float16, seed=4)
    assert_matches_reference(case, num_splits=2, block_m=block_m, block_n=16)


@pytest.mark.parametrize("d", [8, 24, 64])
def test_head_dims(d):
    """D below the 16-wide dot minimum and a non-power of two are padded and masked."""
    case = make_case([6, 30], 4, 4, 2, d, torch.float32, seed=d)
    assert_matches_reference(case, num_splits=2, block_n=16)


@pytest.mark.parametrize("page_size", [1, 3, 16, 32])
def test_page_sizes(page_size):
    """Pages smaller than, not dividing, equal to and larger than a tile."""
    case = make_case([5, 47, 0], 6, 4, 2, 16, torch.bfloat16, layout="paged", page_size=page_size, seed=page_size)
    assert_matches_reference(case, num_splits=2, block_n=16)


@pytest.mark.parametrize("n", [1, 2, 17, 33])
def test_node_counts(n):
    """From the root alone to more nodes than one 32-bit word of ancestor bits."""
    case = make_case([11, 0], n, 2, 1, 16, torch.float32, seed=n)
    assert_matches_reference(case, num_splits=2, block_n=16)


def test_deep_chain_as_parents_equals_the_causal_chain():
    """A chain passed as parents (depth N - 1, so every squaring of the ancestor closure
    is needed) masks exactly like parents=None: the outputs are bit-identical."""
    n = 33
    case = make_case([7, 20], n, 2, 1, 16, torch.float32, tree=False, seed=9)
    chain = run_triton(case, num_splits=2, block_n=16)
    as_tree = run_triton({**case, "parents": (torch.arange(n) - 1).expand(2, n).contiguous()}, num_splits=2, block_n=16)
    assert torch.equal(chain[0], as_tree[0]) and torch.equal(chain[1], as_tree[1])
    assert_matches_reference(case, got=chain)


def test_unused_slots_see_the_prefix_and_themselves():
    case = make_case([12, 3], 6, 2, 1, 16, torch.float32, seed=2)
    case["parents"] = torch.tensor([[-1, 0, -1, 1, -1, 3], [-1, -1, -1, -1, -1, -1]])
    assert_matches_reference(case, num_splits=2, block_n=16)


def test_ragged_lengths_with_a_full_row():
    """seq_lens[b] + N == S_max for one row, 0 for another, through the op's own choices."""
    case = make_case([0, 13, 45], 4, 4, 2, 16, torch.bfloat16, seed=6)
    assert case["k_cache"].shape[2] == 45 + 4
    assert_matches_reference(case, got=run_triton(case))


def test_strided_inputs():
    """q and the caches as views with padded strides (only the last dim contiguous)."""
    case = make_case([8, 26], 5, 4, 2, 16, torch.float32, seed=8)
    wide = torch.full((2, 5, 4, 32), float("nan"))
    wide[..., :16] = case["q"]
    kv_wide = [torch.full((2, 3, 40, 16), float("nan")) for _ in range(2)]
    for big, cache in zip(kv_wide, (case["k_cache"], case["v_cache"])):
        big[:, 1:, : cache.shape[2]] = cache
    strided = {**case, "q": wide[..., :16], "k_cache": kv_wide[0][:, 1:, : case["k_cache"].shape[2]],
               "v_cache": kv_wide[1][:, 1:, : case["v_cache"].shape[2]]}
    assert not strided["q"].is_contiguous() and not strided["k_cache"].is_contiguous()
    assert_matches_reference(strided, num_splits=2, block_n=16)


def test_sm_scale():
    case = make_case([10, 20], 4, 2, 1, 16, torch.float32, seed=12)
    want = ops.tree_attention(**case, sm_scale=0.05, backend="torch")
    assert_matches_reference({**case, "sm_scale": 0.05}, got=ops.tree_attention(**case, sm_scale=0.05, backend="triton"))
    assert not torch.allclose(want[1], ops.tree_attention(**case, backend="torch")[1])  # the scale matters


def test_empty_batch_and_no_nodes():
    for batch, n in ((0, 3), (2, 0)):
        q = torch.randn(batch, n, 2, 16)
        cache = torch.randn(batch, 1, 8, 16)
        out, lse = ops.tree_attention(q, cache, cache, torch.zeros(batch, dtype=torch.int64), backend="triton")
        assert out.shape == q.shape and lse.shape == (batch, n, 2)


# ------------------------------------------------------------------ values the GPU cannot check

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
