"""pytest-benchmark suite over the same cases as bench_verify.py.

    pytest bench/ --benchmark-only                  # the full grid on a GPU, tiny shapes on a CPU
    pytest bench/ --benchmark-only -k "rejection and B64"
Each case is first checked: our backends against the torch reference (bench_verify.agrees, as the
benchmark's own rows), every backend for an accepted count within [0, g]; a failing one fails its test.
Bandwidth figures (pct_bound and pct_nominal, bench/_bound.py; L2 not flushed here) go to extra_info.
"""

import pytest
import torch

import bench_verify as bv
from _bound import pct_of_bound

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BANDWIDTH = None


def bandwidth():
    global BANDWIDTH
    if BANDWIDTH is None and DEVICE.type == "cuda":
        BANDWIDTH = bv.copy_bandwidth(DEVICE)
    return BANDWIDTH


CASES = [(case, backend) for case in bv.grid(DEVICE.type == "cpu", torch.bfloat16, DEVICE)
         for backend in bv.backends_for(case.op, DEVICE)]


@pytest.mark.parametrize("case,backend", CASES, ids=[f"{c.name}-{b}" for c, b in CASES])
def test_verify(benchmark, case, backend):
    inputs = bv.make_inputs(case)
    fn = bv.callable_for(case, backend, inputs)
    out = fn()
    if case.op != "max_prob":
        assert bool(((out[1] >= 0) & (out[1] <= case.g)).all()), f"{backend}: an accepted count outside [0, g]"
    if backend not in ("naive", "torch"):
        assert bv.agrees(case.op, out, bv.callable_for(case, "torch", inputs)()), f"{backend} differs from torch"
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

    def call():
        fn()
        sync()

    benchmark(call)
    benchmark.extra_info.update({"op": case.op, "B": case.batch, "g": case.g, "V": case.vocab, "regime": case.regime})
    bw = bandwidth()
    if bw and benchmark.stats is not None:  # stats is None under --benchmark-disable
        seconds = benchmark.stats.stats.median
        benchmark.extra_info["pct_bound"] = pct_of_bound(bv.minimal_bytes(case), seconds, bw)
        benchmark.extra_info["pct_nominal"] = pct_of_bound(bv.nominal_bytes(case), seconds, bw)
