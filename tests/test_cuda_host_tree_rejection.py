"""tree_rejection_sample's CUDA launch plan and residual arithmetic, host builds checked on
the CPU (no GPU needed; runs wherever _C is built): the launcher allocates nothing that
grows with V, and the per-id residual the kernel recomputes is the reference's."""

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.common.sampling import to_weights

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None, reason="specdec_kernels._C is not built here")

NAN, INF = float("nan"), float("inf")


def test_plan_has_no_buffer_that_grows_with_vocab():
    """The old launcher allocated an int64 [B, V] residual scratch: 311 MB at B = 256,
    V = 151936 (tree_rejection_sample_scratch_bytes). Now the workspace is the rank
    tables, B * N * 2 int64, whatever V."""
    plan = _C.tree_rejection_sample_plan(256, 64, 151936)
    assert plan["grid"] == (256,) and plan["threads"] == 512
    assert plan["workspace_bytes"] == 256 * 64 * 2 * 8  # 256 KiB
    assert _C.tree_rejection_sample_plan(256, 64, 1)["workspace_bytes"] == plan["workspace_bytes"]
    assert _C.tree_rejection_sample_plan(0, 64, 151936)["workspace_bytes"] == 0
    with pytest.raises(ValueError):
        _C.tree_rejection_sample_plan(-1, 64, 10)


def reference_residual(p, qs):
    """R_k and [S_1..S_k] with the expressions of reference/tree_verify.py (float32 rows)."""
    weights = to_weights(p - qs[0])
    totals = [int(weights.sum())]
    for q in qs[1:]:
        total = weights.sum().double()
        q_clean = torch.nan_to_num(q, nan=1.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0).double()
        weights = (weights - torch.floor(total * q_clean).to(torch.int64)).clamp(min=0)
        totals.append(int(weights.sum()))
    return weights, totals


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_host_residual_is_the_reference(dtype):
    """Ten rejected siblings over V = 3000, with NaN, +-inf, negatives, values > 1,
    subnormals and an all-zero q row; the kernel widens every dtype to float32 first."""
    gen = torch.Generator().manual_seed(7)
    vocab, siblings = 3000, 10
    p = torch.softmax(4 * torch.randn(vocab, generator=gen), -1)
    p[:5] = torch.tensor([NAN, INF, -INF, -0.5, 1.5])
    p[5:20] = 1e-40 if dtype == torch.float32 else 1e-6
    qs = torch.softmax(4 * torch.randn(siblings, vocab, generator=gen), -1)
    qs[1, ::7] = NAN
    qs[2, 3:9] = INF
    qs[3, 10:30] = -INF
    qs[4] = 0.0
    qs[5, 100:200] = 2.0
    qs[6, 40:60] = -1.0
    qs[7] *= 1e-3  # small cuts: R stays non-empty for the later siblings
    p, qs = p.to(dtype).float(), qs.to(dtype).float()
    for k in (1, 2, siblings):
        want_r, want_totals = reference_residual(p, qs[:k])
        got_r, got_totals = _C.host_tree_residual(p.tolist(), qs[:k].tolist())
        assert torch.equal(torch.tensor(got_r, dtype=torch.int64), want_r), k
        assert got_totals == want_totals, k
    assert want_totals[-1] > 0 and want_totals[-1] < want_totals[0]  # the cuts acted, R not emptied


# ------------------------------------------------------------------ siblings="without_replacement"

def reference_sampled_residual(p, q, rejected):
    """R after the rejected tokens, [S_1..S_k] and the scales, with the expressions of
    reference/tree_verify.py `_without_replacement` (float32 rows, one q for all siblings)."""
    q_weights = to_weights(q)
    weights = to_weights(p - q)
    q_left = int(q_weights.sum())
    removed = torch.zeros(p.shape[0], dtype=torch.bool)
    totals, scales = [], []
    for i, x in enumerate(rejected):
        scale = torch.tensor(0.0, dtype=torch.float64)
        if i > 0:
            scale = torch.tensor(totals[-1], dtype=torch.float64) / torch.tensor(q_left, dtype=torch.float64)
            cut = torch.floor((scale * q_weights.double()).clamp(max=2.0**41)).to(torch.int64)
            weights = (weights - torch.where(removed, 0, cut)).clamp(min=0)
        removed[x] = True
        q_left -= int(q_weights[x])
        totals.append(int(weights.sum()))
        scales.append(float(scale))
    return weights, totals, scales


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_host_sampled_residual_is_the_reference(dtype):
    """Up to ten rejected siblings of one q over V = 3000 (NaN, +-inf, negatives, values > 1,
    subnormals in p and q); the kernel widens every dtype to float32 first."""
    gen = torch.Generator().manual_seed(11)
    vocab = 3000
    p = torch.softmax(3 * torch.randn(vocab, generator=gen), -1)
    q = torch.softmax(3 * torch.randn(vocab, generator=gen), -1)
    p[:5] = torch.tensor([NAN, INF, -INF, -0.5, 1.5])
    q[5:10] = torch.tensor([NAN, INF, -INF, -0.5, 1.5])
    p[20:40] = 1e-40 if dtype == torch.float32 else 1e-6
    p, q = p.to(dtype).float(), q.to(dtype).float()
    order = torch.argsort(q[10:], descending=True)[:10] + 10  # real siblings: distinct, Q > 0
    for k in (1, 2, 5, 10):
        rejected = order[:k].tolist()
        want_r, want_totals, want_scales = reference_sampled_residual(p, q, rejected)
        got_r, got_totals, got_scales = _C.host_sampled_residual(p.tolist(), q.tolist(), rejected)
        assert torch.equal(torch.tensor(got_r, dtype=torch.int64), want_r), k
        assert got_totals == want_totals and got_scales == want_scales, k
    assert 0 < want_totals[-1] < want_totals[1]  # the later cuts acted, R not emptied
    with pytest.raises(ValueError, match="real sibling"):
        _C.host_sampled_residual(p.tolist(), q.tolist(), [order[0].item()] * 2)  # a repeat is no sibling


def test_host_sampled_accept_order():
    """u * (c * Q(x)) < R(x), in that float64 order (not (u * c) * Q(x))."""
    gen = torch.Generator().manual_seed(5)
    u = torch.rand(2000, generator=gen, dtype=torch.float64)
    scale = torch.rand(2000, generator=gen, dtype=torch.float64) * 3
    q_weight = torch.randint(1, 2**40, (2000,), generator=gen)
    r = (u * (scale * q_weight.double())).round().to(torch.int64)  # near the boundary on purpose
    want = u * (scale * q_weight.double()) < r.double()
    got = [_C.host_sampled_accept(*args) for args in zip(u.tolist(), scale.tolist(), q_weight.tolist(), r.tolist())]
    assert got == want.tolist()
