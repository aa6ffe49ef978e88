"""GPU tests of early_exit_topk: the cuda and triton backends against the torch reference.

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_early_exit.py, the
"full" tier, the one `specdec-kernels selftest` runs): every norm x dtype x k, the benchmark
shapes (V in {32000, 128256, 151936}, H in {2048, 4096}, B in {1, 8, 64}), partial tiles, ties,
NaN / inf rows, strided rows, k = V and k > 16, an empty batch, and a CUDA-graph capture replayed
on new inputs. What the catalog cannot express stays here: the CUDA workspace handed back zeroed.
Skips without CUDA (the triton cases also run without the built _C)."""

import pytest
import torch
from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend
from early_exit_support import random_inputs

from specdec_kernels import ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEVICE = "cuda"
BACKENDS = ("cuda", "triton")


@pytest.mark.parametrize("case,backend", gpu_catalog(DEVICE, ("early_exit_topk",), BACKENDS))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, DEVICE)
    check_case(case, backend, DEVICE, profile=gpu_profile(), graphs=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_capture_and_zeroed_workspace(backend):
    skip_unless_backend("early_exit_topk", backend, DEVICE)
    h, nw, w, _ = random_inputs(8, 2048, 32000, torch.bfloat16, device=DEVICE)
    want = ops.early_exit_topk(h, nw, w, 5, backend=backend)  # warm-up: the cached workspace exists
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.early_exit_topk(h, nw, w, 5, backend=backend)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            got = ops.early_exit_topk(h, nw, w, 5, backend=backend)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if backend == "cuda":
        from specdec_kernels.common import workspace
        for buffer in workspace._zeroed_workspaces.values():
            assert int(buffer.count_nonzero()) == 0
