"""The CUDA early_exit_topk kernels' top-k selection (csrc/early_exit_math.cuh), run on the
CPU by `_C.host_early_exit_select` over the kernels' structure (plan slices, per-warp
kept sets, per-CTA merge, the merge kernel's sorted lists and block-max pops), against a
stable descending sort. Selection is comparisons only: values and ids must match exactly.
The GEMV itself is checked on a GPU (tests/test_gpu_early_exit_topk.py)."""

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "host_early_exit_select"),
                                reason="needs the built specdec_kernels._C extension")


def want(logits, k):
    clean = torch.where(torch.isnan(logits), float("-inf"), logits)
    values, ids = torch.sort(clean, dim=-1, descending=True, stable=True)
    return values[:, :k], ids[:, :k]


def select(logits, k, sms=4, ctas=2, threads=8):
    batch, vocab = logits.shape
    values, ids, splits = _C.host_early_exit_select(logits.flatten().tolist(), batch, vocab, k, sms, ctas, threads)
    return torch.tensor(values).view(batch, k), torch.tensor(ids).view(batch, k), splits


@pytest.mark.parametrize("vocab,k,sms", [(1, 1, 4), (13, 13, 4), (300, 16, 4), (1000, 5, 16), (257, 1, 1), (64, 16, 132)])
def test_selection_matches_a_stable_sort(vocab, k, sms):
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(3, vocab, generator=gen).round(decimals=1)  # many exact ties
    logits[1, ::7] = float("nan")
    logits[2, : vocab // 2] = float("-inf")
    logits[0, -1] = float("inf")
    values, ids, splits = select(logits, k, sms=sms)
    ref_values, ref_ids = want(logits, k)
    assert splits >= 1
    assert torch.equal(ids, ref_ids), (ids, ref_ids)
    assert torch.equal(values, ref_values)


def test_all_nan_row_and_negative_zero():
    logits = torch.full((2, 40), float("nan"))
    logits[1] = 0.0
    logits[1, 3] = -0.0  # ties with +0.0: ids stay in order
    values, ids, _ = select(logits, 6)
    assert ids.tolist() == [list(range(6))] * 2
    assert bool((values[0] == float("-inf")).all()) and bool((values[1] == 0).all())


def test_more_splits_than_merge_threads_and_many_warps_per_slice():
    logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(1))
    for sms, threads in ((64, 3), (1, 256)):
        values, ids, _ = select(logits, 16, sms=sms, threads=threads)
        ref_values, ref_ids = want(logits, 16)
        assert torch.equal(ids, ref_ids) and torch.equal(values, ref_values)
