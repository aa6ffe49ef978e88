"""The Triton early_exit_topk backend against the torch reference, under the interpreter.

Small shapes with partial tiles (H and V not multiples of the tiles) and many splits
forced by small tiles; values within float rounding, ids exactly where the reference's
logits are separated (tests/early_exit_support.py), and exactly everywhere on the
integer-valued tie inputs, where every backend's logits are exact.
"""

import pytest
import torch
from early_exit_support import assert_topk_matches, random_inputs, reference_logits, tie_inputs

from specdec_kernels import ops
from specdec_kernels.common.limits import FUSED_MAX_K
from specdec_kernels.reference import early_exit_topk as reference_topk
from specdec_kernels.triton import early_exit_topk as triton_module

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731
NORMS = ("rms", "layer", "none")


def run(hidden, norm_weight, weight, k, **kw):
    """The kernels directly (so tests can override tiles and splits)."""
    kw.setdefault("eps", 1e-6)
    kw.setdefault("norm", "rms")
    return triton_module.early_exit_topk(hidden, norm_weight, weight, k, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("k", (1, 5, 16))
def test_matches_reference(norm, dtype, k):
    hidden, nw, weight, bias = random_inputs(3, 80, 300, dtype, norm=norm, seed=k)
    got = ops.early_exit_topk(hidden, nw, weight, k, norm=norm, norm_bias=bias, backend="triton")
    assert_topk_matches(got, hidden, nw, weight, k, norm=norm, norm_bias=bias, min_exact=0.8)


@pytest.mark.parametrize("splits,block_v,block_h", [(None, 16, 16), (19, 16, 32), (1, 64, 16), (7, 32, 64)])
def test_many_splits_and_partial_tiles(splits, block_v, block_h):
    hidden, nw, weight, _ = random_inputs(5, 72, 301, torch.bfloat16, seed=3)
    got = run(hidden, nw, weight, 16, num_splits=splits, block_v=block_v, block_h=block_h)
    assert_topk_matches(got, hidden, nw, weight, 16, min_exact=0.8)


def test_batch_one_and_batch_over_one_block():
    for batch in (1, 70):  # 70 rows: two BLOCK_B programs per split
        hidden, nw, weight, bias = random_inputs(batch, 40, 130, torch.float16, norm="layer", seed=batch)
        got = run(hidden, nw, weight, 4, norm="layer", norm_bias=bias, eps=1e-5)
        assert_topk_matches(got, hidden, nw, weight, 4, norm="layer", norm_bias=bias, eps=1e-5, min_exact=0.8)


def test_strided_rows_and_no_norm_weight():
    hidden, _, weight, _ = random_inputs(4, 48, 100, torch.float32, seed=2)
    wide = torch.zeros(4, 80)
    wide[:, :48] = hidden
    rows = wide[:, :48]  # row stride 80
    assert rows.stride(0) == 80
    got = ops.early_exit_topk(rows, None, weight, 6, backend="triton")
    assert_topk_matches(got, rows, None, weight, 6, min_exact=0.8)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("k", (1, 5, 16))
def test_ties_go_to_the_lower_id(dtype, k):
    # rows 3, 17, 64 and 65 (tile boundary at 64) are copies of the winning row; k=1 and k=5
    # cut through tied groups. Integer data: every backend's logits are exact, so values
    # and ids must equal the reference everywhere, including all the other ties
    hidden, weight = tie_inputs(4, 40, 150, dtype, copies=(65, 3, 64, 17), seed=k)
    got = run(hidden, None, weight, k, norm="none", num_splits=5, block_v=16)
    want = reference_topk(hidden, None, weight, k, norm="none")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (got, want)
    assert got[1][0, :min(k, 4)].tolist() == [3, 17, 64, 65][:k]


def test_ties_after_rms_norm():
    # |hidden| constant per row: rms norm maps it to exactly +-1 (eps 0), logits stay integers
    hidden, weight = tie_inputs(2, 32, 90, torch.bfloat16, copies=(40, 8), seed=1)
    hidden = 2 * hidden.sign() + (hidden == 0).to(hidden.dtype) * 2
    got = run(hidden, None, weight, 5, norm="rms", eps=0.0, num_splits=3, block_v=16)
    want = reference_topk(hidden, None, weight, 5, norm="rms", eps=0.0)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_nan_and_inf_rows_give_in_range_ids_like_the_reference():
    hidden, nw, weight, _ = random_inputs(4, 40, 120, torch.float32, seed=5)
    hidden[1, 7] = float("nan")  # the whole row's norm is NaN: every logit -inf, ids 0..k-1
    weight[[0, 2, 50]] = float("nan")  # these ids are -inf in every row
    weight[9, 3] = float("inf")  # +-inf or NaN (-inf) in every row, by the sign of norm(h)[:, 3]
    got = run(hidden, nw, weight, 8, num_splits=4, block_v=16)
    assert_topk_matches(got, hidden, nw, weight, 8)
    assert got[1][1].tolist() == list(range(8)) and bool((got[0][1] == float("-inf")).all())
    again = run(hidden, nw, weight, 8, num_splits=4, block_v=16)
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1])


def test_inf_hidden_without_norm():
    hidden, _, weight, _ = random_inputs(2, 32, 64, torch.float16, seed=6)
    hidden[0, 4] = float("inf")
    weight[5, 4] = 0.0  # inf * 0 = NaN: id 5 ranks as -inf in row 0
    got = run(hidden, None, weight, 5, norm="none", block_v=16)
    logits, _ = reference_logits(hidden, None, weight, norm="none")
    assert logits[0, 5] == float("-inf")
    assert_topk_matches(got, hidden, None, weight, 5, norm="none")


def test_k_equals_v_and_k_over_max_k():
    hidden, nw, weight, _ = random_inputs(2, 24, 13, torch.float32, seed=7)
    got = run(hidden, nw, weight, 13, block_v=16)  # k = V <= FUSED_MAX_K: the fused kernels
    assert_topk_matches(got, hidden, nw, weight, 13, min_exact=0.8)
    hidden, nw, weight, _ = random_inputs(2, 24, 40, torch.float32, seed=8)
    k = FUSED_MAX_K + 4  # the op takes the materialised path
    got = ops.early_exit_topk(hidden, nw, weight, k, backend="triton")
    assert_topk_matches(got, hidden, nw, weight, k, min_exact=0.8)


def test_empty_batch():
    _, nw, weight, _ = random_inputs(1, 16, 20, torch.float32)
    values, indices = ops.early_exit_topk(torch.empty(0, 16), nw, weight, 3, backend="triton")
    assert values.shape == (0, 3) and indices.shape == (0, 3)


def test_split_plan_covers_every_tile_once():
    for vocab, block_v, wanted in ((300, 16, None), (32000, 128, 264), (128256, 64, 7), (10, 64, 50)):
        tiles, per_split, splits = triton_module.split_plan(vocab, block_v, 1, torch.device("cpu"), wanted)
        assert tiles == -(-vocab // block_v)
        assert (splits - 1) * per_split < tiles <= splits * per_split  # no empty split
