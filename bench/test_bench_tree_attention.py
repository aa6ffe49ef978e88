"""pytest-benchmark suite over the same cases as bench_tree_attention.py.

    pytest bench/test_bench_tree_attention.py --benchmark-only             # the default grid on a GPU, tiny shapes on a CPU
    pytest bench/test_bench_tree_attention.py --benchmark-only -k "triton and B8-P4096"
Each case is first checked against the torch reference (a failing one fails its test);
the bandwidth and tensor-core figures go to extra_info.
"""

import math

import pytest
import torch

import bench_tree_attention as bta
import bench_verify as bv
from _bound import pct_of_bound

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
COPY_BW = []


def copy_bandwidth():
    if not COPY_BW:
        COPY_BW.append(bv.copy_bandwidth(DEVICE))
    return COPY_BW[0]


CASES = [(case, impl) for case in bta.grid(DEVICE.type == "cpu", torch.bfloat16, DEVICE)
         for impl in bta.implementations(DEVICE) if impl not in bta.ANCHORS or case.layout == "contiguous"]


@pytest.mark.parametrize("case,impl", CASES, ids=[f"{impl}-{c.name}" for c, impl in CASES])
def test_tree_attention(benchmark, case, impl):
    inputs = bta.make_inputs(case)
    scale = 1.0 / math.sqrt(case.head_dim)
    try:
        fn = {"sdpa": bta.sdpa_call, "flex": bta.flex_call}[impl](inputs, scale) if impl in bta.ANCHORS \
            else bta.ours_call(inputs, impl)
        got = fn()
    except Exception as error:  # noqa: BLE001 - e.g. Flex failing to lower at N = 64
        if impl in bta.ANCHORS:
            pytest.skip(f"{impl} failed: {type(error).__name__}")
        raise
    ok, err = bta.check(impl, got, bta.ops.tree_attention(**inputs, backend="torch"), case.dtype)
    assert ok, f"{impl} differs from the reference by {err}"
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

    def call():
        fn()
        sync()

    benchmark(call)
    benchmark.extra_info.update({"impl": impl, "B": case.batch, "P": case.prefix, "N": case.nodes,
                                 "prefix": case.prefix_kind, "tree": case.tree, "layout": case.layout,
                                 "kv_MiB": round(bta.kv_bytes(inputs) / 2**20, 1)})
    _, tc_peak = bta.device_peaks(DEVICE)
    if benchmark.stats is not None and DEVICE.type == "cuda":  # stats is None under --benchmark-disable
        seconds = benchmark.stats.stats.median
        benchmark.extra_info["pct_bound"] = pct_of_bound(bta.kv_bytes(inputs), seconds, copy_bandwidth())
        if tc_peak:
            benchmark.extra_info["pct_tc"] = round(100 * bta.flops(inputs) / seconds / tc_peak, 1)
