"""Chi-square tests of the GPU backends (triton, cuda) in all three randomness modes.

The same cases as tests/test_statistics.py (which runs the torch reference in CI), run on
CUDA tensors: the kernels' Philox draws and fixed-point inverse CDF must give the target
distribution at real batch sizes (120,000 rows in one launch).
"""

import pytest
import torch

from specdec_kernels import ops
from test_statistics import RANDOMNESS, chain_cases, check_chain_statistics, check_tree_statistics, run_chain, run_tree

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def need(op: str, backend: str) -> None:
    if backend not in ops.implemented_backends(op):
        pytest.skip(f"{op} has no {backend} backend")
    try:
        ops.resolve(op, backend, torch.device("cuda"))
    except (RuntimeError, ValueError) as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("name", ["random-V17", "q-zero-where-p-positive", "p-equals-q", "disjoint-supports"])
def test_gpu_rejection_sample_reproduces_target(name, mode, backend):
    need("rejection_sample", backend)
    p, q = chain_cases()[name]
    p1 = torch.roll(p, 1)
    out, accepted = run_chain(p, q, p1, seed=3, mode=mode, backend=backend, device="cuda")
    check_chain_statistics(p, q, p1, out, accepted)
    reference = run_chain(p, q, p1, seed=3, mode=mode, backend="torch", device="cuda")
    assert torch.equal(out, reference[0]) and torch.equal(accepted, reference[1])  # bit-exact on the GPU too


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("mode", RANDOMNESS)
def test_gpu_tree_rejection_sample_reproduces_target(mode, backend):
    need("tree_rejection_sample", backend)
    check_tree_statistics(8, *run_tree(8, one_hot=False, mode=mode, backend=backend, device="cuda"))
