"""The Triton early_exit_topk backend against the torch reference, under the interpreter.

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_early_exit.py, the
"tiny" tier: every norm x dtype x k, partial tiles and many splits forced by small tiles, ties
that go to the lower id, NaN / inf rows, strided rows, k = V, k past the fused kernels, an empty
batch), judged as `specdec-kernels selftest` judges them. What the catalog cannot express stays
here: the split plan, and that a NaN row's answer is the same on a second call.
"""

import pytest
import torch
from catalog_support import catalog_cases, check_case

from specdec_kernels.selftest import cases_early_exit
from specdec_kernels.triton import early_exit as triton_module

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")]


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("early_exit_topk",)))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


def test_nan_rows_are_deterministic():
    cases = cases_early_exit.early_exit_cases("tiny", torch.device("cpu"))
    case = next(c for c in cases if c.name == "NaN and inf rows")
    inputs = case.build(0)
    first, again = case.run(inputs, "triton"), case.run(inputs, "triton")
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_split_plan_covers_every_tile_once():
    for vocab, block_v, wanted in ((300, 16, None), (32000, 128, 264), (128256, 64, 7), (10, 64, 50)):
        tiles, per_split, splits = triton_module.split_plan(vocab, block_v, 1, torch.device("cpu"), wanted)
        assert tiles == -(-vocab // block_v)
        assert (splits - 1) * per_split < tiles <= splits * per_split  # no empty split
