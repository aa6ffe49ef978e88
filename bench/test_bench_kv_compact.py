"""pytest-benchmark suite over the same cases as bench_kv_compact.py.

    pytest bench/test_bench_kv_compact.py --benchmark-only          # full grid on a GPU, tiny shapes on a CPU
    pytest bench/test_bench_kv_compact.py --benchmark-only -k "B32 and cuda"
Each backend is first checked against the torch reference (bench_kv_compact.agrees: equal caches and
lengths, bit for bit; a failing one fails its test). Moved bytes, GB/s and pct_bound (bench/_bound.py)
go to extra_info. Calls are eager (one call + a sync per round); bench_kv_compact.py also replays
CUDA graphs.
"""

import pytest
import torch

import bench_kv_compact as bk
from _bound import pct_of_bound

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
COPY_BW = None


def copy_bandwidth():
    global COPY_BW
    if COPY_BW is None and DEVICE.type == "cuda":
        COPY_BW = bk.copy_bandwidth(DEVICE)
    return COPY_BW


CASES = bk.runs(bk.grid(DEVICE.type == "cpu", torch.bfloat16, DEVICE), bk.backends_for(DEVICE))


@pytest.mark.parametrize("case,backend", CASES, ids=[f"{c.name}-{b}" for c, b in CASES])
def test_kv_compact(benchmark, case, backend):
    inputs = bk.make_inputs(case)
    if backend != "torch":
        assert bk.agrees(backend, inputs), f"{backend} leaves other caches than the torch reference"
    fn = bk.callable_for(backend, inputs)
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

    def call():
        fn()
        sync()

    benchmark(call)
    nbytes = bk.moved_bytes(case, inputs["accepted_nodes"])
    benchmark.extra_info.update({"B": case.batch, "N": case.nodes, "layers": case.layers, "layout": case.layout,
                                 "moved_MB": round(nbytes / 2**20, 3)})
    if benchmark.stats is not None:  # stats is None under --benchmark-disable
        seconds = benchmark.stats.stats.median
        benchmark.extra_info["GBps"] = round(nbytes / seconds / 1e9, 1)
        bw = copy_bandwidth()
        if bw:
            benchmark.extra_info["pct_bound"] = pct_of_bound(nbytes, seconds, bw)
