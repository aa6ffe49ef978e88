"""pytest-benchmark suite over the same cases as bench_early_exit_topk.py.

    pytest bench/test_bench_early_exit_topk.py --benchmark-only           # full grid on a GPU, tiny shapes on a CPU
    pytest bench/test_bench_early_exit_topk.py --benchmark-only -k "B64 and cuda"
Each backend is first checked against the float32 reference: at least 90% of the top-k ids equal
(near-ties may differ; a failing one fails its test). Weight bytes and GB/s of weight read go to
extra_info. Calls are eager (one call + a sync per round); bench_early_exit_topk.py also replays
CUDA graphs and flushes L2.
"""

import pytest
import torch

import bench_early_exit_topk as be

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CASES = [(case, backend) for case in be.grid(DEVICE.type == "cpu", torch.bfloat16, DEVICE)
         for backend in be.backends_for(DEVICE)]


@pytest.mark.parametrize("case,backend", CASES, ids=[f"{c.name}-{b}" for c, b in CASES])
def test_early_exit_topk(benchmark, case, backend):
    inputs = be.make_inputs(case)
    agreement = be.id_agreement(backend, inputs)
    assert agreement >= 0.9, f"{backend}: only {agreement:.0%} of the top-k ids equal the reference's"
    fn = be.callable_for(backend, inputs)
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

    def call():
        fn()
        sync()

    benchmark(call)
    benchmark.extra_info.update({"B": case.batch, "H": case.hidden, "V": case.vocab,
                                 "weight_MB": round(case.weight_bytes / 2**20, 1)})
    if benchmark.stats is not None:  # stats is None under --benchmark-disable
        benchmark.extra_info["GBps"] = round(case.weight_bytes / benchmark.stats.stats.median / 1e9, 1)
