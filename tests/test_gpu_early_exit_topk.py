"""GPU tests of early_exit_topk: the cuda and triton backends against the torch reference
at the benchmark shapes (V in {32000, 128256}, H in {2048, 4096}, B in {1, 8, 64}), ties,
NaN rows, k > 16 fallback, CUDA-graph capture, and the workspace handed back zeroed.
Values within float rounding, ids exact where separated (tests/early_exit_support.py).
Skips without CUDA (the triton cases also run without the built _C)."""

import pytest
import torch
from early_exit_support import assert_topk_matches, random_inputs, tie_inputs

from specdec_kernels import ops
from specdec_kernels.reference import early_exit_topk as reference_topk

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEVICE = "cuda"
SHAPES = [(b, h, v) for v in (32000, 128256) for h in (2048, 4096) for b in (1, 8, 64)]


def backends():
    names = []
    for backend in ("cuda", "triton"):
        try:
            ops.resolve("early_exit_topk", backend, torch.device(DEVICE))
        except (ValueError, RuntimeError):
            continue
        names.append(backend)
    return names


BACKENDS = backends() if torch.cuda.is_available() else []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,hidden,vocab", SHAPES, ids=[f"B{b}-H{h}-V{v}" for b, h, v in SHAPES])
def test_benchmark_shapes(backend, batch, hidden, vocab):
    inputs = random_inputs(batch, hidden, vocab, torch.bfloat16, seed=batch + vocab, device=DEVICE)
    h, nw, w, _ = inputs
    got = ops.early_exit_topk(h, nw, w, 8, backend=backend)
    assert_topk_matches(got, h, nw, w, 8, min_exact=0.5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("norm", ("rms", "layer", "none"))
@pytest.mark.parametrize("k", (1, 5, 16))
def test_norms_dtypes_k(backend, dtype, norm, k):
    h, nw, w, bias = random_inputs(5, 520, 3001, dtype, norm=norm, seed=k, device=DEVICE)
    got = ops.early_exit_topk(h, nw, w, k, norm=norm, norm_bias=bias, backend=backend)
    assert_topk_matches(got, h, nw, w, k, norm=norm, norm_bias=bias, min_exact=0.5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", (1, 5, 16))
def test_ties_and_nan_rows(backend, k):
    hidden, weight = tie_inputs(9, 136, 5003, torch.bfloat16, copies=(4000, 7, 2500, 8), device=DEVICE, seed=k)
    got = ops.early_exit_topk(hidden, None, weight, k, norm="none", backend=backend)
    want = reference_topk(hidden, None, weight, k, norm="none")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    h, nw, w, _ = random_inputs(4, 256, 1000, torch.float16, device=DEVICE)
    h[2, 3] = float("nan")
    w[[1, 500]] = float("nan")
    got = ops.early_exit_topk(h, nw, w, k, backend=backend)
    assert_topk_matches(got, h, nw, w, k)
    assert got[1][2].tolist() == list(range(k))


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_over_16_and_k_equals_v(backend):
    h, nw, w, _ = random_inputs(3, 64, 16, torch.bfloat16, device=DEVICE)
    assert_topk_matches(ops.early_exit_topk(h, nw, w, 16, backend=backend), h, nw, w, 16)
    h, nw, w, _ = random_inputs(3, 64, 100, torch.bfloat16, device=DEVICE)
    assert_topk_matches(ops.early_exit_topk(h, nw, w, 40, backend=backend), h, nw, w, 40)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_capture_and_zeroed_workspace(backend):
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
        from specdec_kernels.cuda import _launch
        for buffer in _launch._zeroed_workspaces.values():
            assert int(buffer.count_nonzero()) == 0
