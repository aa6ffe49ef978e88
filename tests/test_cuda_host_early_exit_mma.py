"""The tensor-core early_exit_topk path (csrc/early_exit.cu, early_exit_mma_kernel) emulated
on the CPU by `_C.host_early_exit_mma` with the kernel's own fragment arithmetic
(csrc/early_exit_mma.cuh): the hi/lo split, every lane's 16-byte loads and the mma
registers built from them, a software m16n8k16 reading those registers through the PTX
fragment layout, the epilogue's (vocab id, batch column) mapping, the kept sets and both
merges, over the launch plan's own values (csrc/launch_plans.cpp). The results must equal
the reference top-k within float rounding (ids exactly where the logits are separated, and
exactly everywhere for integer-valued inputs, whose sums are exact). The hardware MMA itself
is checked on a GPU (tests/test_gpu_early_exit_topk.py)."""

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.common.limits import FUSED_MAX_K
from specdec_kernels.reference.early_exit import normalize

from early_exit_support import assert_topk_matches, random_inputs

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "host_early_exit_mma"),
                                reason="needs the built specdec_kernels._C extension")

CODES = {torch.float16: 1, torch.bfloat16: 2}


def ptx_layout():
    """The m16n8k16 .f16/.bf16 fragment layout as the PTX ISA tables draw it (groupID = lane / 4,
    threadID_in_group = lane % 4), written out independently of csrc/early_exit_mma.cuh."""
    a, b, c = [], [], []
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a.append([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1),
                  (g, 2 * t + 8), (g, 2 * t + 9), (g + 8, 2 * t + 8), (g + 8, 2 * t + 9)])
        b.append([(2 * t, g), (2 * t + 1, g), (2 * t + 8, g), (2 * t + 9, g)])
        c.append([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)])
    return a, b, c


def test_fragment_layout_is_the_ptx_one():
    got = _C.host_mma_layout()
    a, b, c = ptx_layout()
    assert [list(map(tuple, row)) for row in got["a"]] == a
    assert [list(map(tuple, row)) for row in got["b"]] == b
    assert [list(map(tuple, row)) for row in got["c"]] == c
    # the loads: lane (g, t) reads rows g and g + 8 at columns 8t..8t+7 of the 32-column chunk
    assert [tuple(x) for x in got["load"]] == [(l // 4, l // 4 + 8, 8 * (l % 4)) for l in range(32)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hi_lo_split_rounds_like_torch(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(2000, generator=gen) * 10.0 ** torch.randint(-9, 6, (2000,), generator=gen),
                   torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 65504.0, 65519.0, 65520.0, 1e-8, 3e-8,
                                 5.9604645e-08, 2.9802322e-08, 2.98e-08, -1e-6, 6.1e-5, 3.4e38])])
    hi, lo = _C.host_early_exit_split(x.tolist(), CODES[dtype])
    hi = torch.tensor(hi, dtype=torch.int32).to(torch.int16).view(dtype)
    lo = torch.tensor(lo, dtype=torch.int32).to(torch.int16).view(dtype)
    assert torch.equal(hi.view(torch.int16), x.to(dtype).view(torch.int16))  # round to nearest even, like torch
    rest = x - hi.float()
    want_lo = torch.where(torch.isnan(rest), 0.0, rest).to(dtype)
    assert torch.equal(lo.view(torch.int16), want_lo.view(torch.int16))
    finite = x.abs() < (6e4 if dtype == torch.float16 else 3e38)  # hi stays finite
    normal = finite & (x.abs() > (1e-3 if dtype == torch.float16 else 1e-30))
    err = (hi.float() + lo.float() - x).abs()
    assert bool((err[normal] <= x.abs()[normal] * 2.0**-15).all())  # ~16 bits kept


def plan_values(B, H, V, k, dtype, arch=90):
    p = _C.launch_plan("early_exit_topk", dict(B=B, H=H, V=V, k=k, dtype=CODES[dtype]), arch)
    assert p["refusal"] is None and p["mma"] == 1, p
    return p


def emulate(hidden, norm_weight, weight, k, *, norm="rms", norm_bias=None, per_split=None, k_block=None, arch=90,
            eps=1e-6):
    B, H = hidden.shape
    V = weight.shape[0]
    p = plan_values(B, H, V, k, weight.dtype, arch)
    hn = normalize(hidden, None if norm == "none" else norm_weight, norm_bias, eps=eps, norm=norm)
    bits = weight.view(torch.int16).flatten().tolist()
    values, ids = _C.host_early_exit_mma(hn.flatten().tolist(), bits, B, H, V, k, CODES[weight.dtype],
                                         per_split or p["per_split"], k_block or p["k_block"], p["n_tiles"])
    return torch.tensor(values).view(B, k), torch.tensor(ids).view(B, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B", [1, 3, 8, 9, 64])
@pytest.mark.parametrize("H, V", [(40, 300), (96, 257)])
def test_emulated_kernel_matches_the_reference(dtype, B, H, V):
    k = 7
    hidden, norm_weight, weight, _ = random_inputs(B, H, V, dtype, seed=B * 1000 + H)
    hidden[0, 5] = float("nan")  # a NaN row: every logit -inf, ids 0..k-1
    got = emulate(hidden, norm_weight, weight, k)
    assert got[1][0].tolist() == list(range(k)) and bool((got[0][0] == float("-inf")).all())
    assert_topk_matches(got, hidden, norm_weight, weight, k, min_exact=0.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_k_blocks_splits_and_partial_tiles(dtype):
    """Restaged k-blocks (32 columns while H = 104 needs 4 chunks), one V tile per split and
    several V tiles per CTA: the same answer."""
    B, H, V, k = 11, 104, 700, 16
    hidden, norm_weight, weight, bias = random_inputs(B, H, V, dtype, norm="layer", seed=5)
    p = plan_values(B, H, V, k, dtype)
    tile = 128 * (2 if p["n_tiles"] >= 4 else 1)
    for per_split, k_block in [(None, 32), (tile, None), (4 * tile, 64), (tile, 32)]:
        got = emulate(hidden, norm_weight, weight, k, norm="layer", norm_bias=bias, per_split=per_split,
                      k_block=k_block)
        assert_topk_matches(got, hidden, norm_weight, weight, k, min_exact=0.5, norm="layer", norm_bias=bias)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B", [1, 9, 64])
def test_ties_go_to_the_lower_id_exactly(dtype, B):
    """Integer-valued inputs: every product and sum is exact, so values and ids equal a stable sort."""
    gen = torch.Generator().manual_seed(B)
    H, V, k = 48, 333, 16
    hidden = torch.randint(-3, 4, (B, H), generator=gen).to(dtype)
    weight = torch.randint(-1, 2, (V, H), generator=gen).to(dtype)
    weight[[5, 77, 200, 201, 332]] = weight[300].clone()  # repeated rows: exact ties across tiles and splits
    hidden[-1] = float("nan") if B > 1 else hidden[-1]
    values, ids = emulate(hidden, None, weight, k, norm="none")
    logits = hidden.float() @ weight.float().t()
    logits = torch.where(torch.isnan(logits), float("-inf"), logits)
    want_values, want_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    assert torch.equal(ids, want_ids[:, :k]) and torch.equal(values, want_values[:, :k])
    assert bool(((ids >= 0) & (ids < V)).all())


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="H must be a multiple of 8"):
        _C.host_early_exit_mma([0.0] * 12, [0] * 36, 1, 12, 3, 1, 2, 128, 32, 1)
    with pytest.raises(ValueError, match="per_split"):
        _C.host_early_exit_mma([0.0] * 8, [0] * 24, 1, 8, 3, 1, 2, 100, 32, 1)


@pytest.mark.parametrize("profile", ["tiny", "quick"])
def test_emulated_kernel_over_the_case_catalog(profile):
    """Every case of the early-exit catalog that the tensor-core path takes (fp16/bf16 weights,
    H % 8 == 0, B > 0, k <= FUSED_MAX_K: random rows at every norm and k, ties, NaN rows, strided
    rows, k = V), judged by the case's own comparison with the reference."""
    from specdec_kernels.selftest.cases_early_exit import early_exit_cases

    ran = []
    for case in early_exit_cases(profile, torch.device("cpu")):
        x = case.build(0)
        weight, (batch, hidden_size) = x["lm_head_weight"], x["hidden"].shape
        if weight.dtype not in CODES or hidden_size % 8 or batch == 0 or x["k"] > FUSED_MAX_K:
            continue
        got = emulate(x["hidden"], x.get("norm_weight"), weight.contiguous(), x["k"], norm=x.get("norm", "rms"),
                      norm_bias=x.get("norm_bias"), eps=x.get("eps", 1e-6))
        want = case.reference(x) if case.reference else case.run(x, "torch")
        _, problem = case.compare(got, want, x)
        assert problem is None, f"{case.name}: {problem}"
        ran.append(case.name)
    assert len(ran) >= 30, ran  # 32 at tiny, 30 at quick
