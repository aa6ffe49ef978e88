"""bench/_bound.py, the one "% of bound" of every benchmark and of the GPU probe: the bytes the op must move /
the time / the measured copy bandwidth, the copy's read + written bytes per second taken whole (never half of
it, which made every such figure 2x too generous)."""

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _timing  # noqa: E402
import bench_early_exit_topk as bx  # noqa: E402
import bench_kv_compact as bk  # noqa: E402
import bench_tree_attention as ba  # noqa: E402
import bench_verify as bv  # noqa: E402
from _bound import pct_of_bound  # noqa: E402

CPU = torch.device("cpu")
US = 10.0  # the time every measure() below is told its call took
BANDWIDTH = 1e9  # bytes/s, read + written, as _timing.copy_bandwidth measures it


def test_known_bytes_time_and_bandwidth_give_the_exact_percentage():
    assert pct_of_bound(1.2e9, 1e-3, 2e12) == 60.0  # 1.2 TB/s of a 2 TB/s copy
    assert pct_of_bound(2_904_900_000_000, 1.0, 2904.9e9) == 100.0  # the H100 copy's own bytes per second
    assert pct_of_bound(123_456, 1e-5, 3e12) == 0.4  # 12.3 GB/s of 3 TB/s, to 0.1
    assert pct_of_bound(0, 1e-6, 1e12) == 0.0


def test_without_a_measured_bandwidth_there_is_no_percentage():
    assert pct_of_bound(1e6, 1e-3, None) is None and pct_of_bound(1e6, 1e-3, 0) is None  # the CPU has none


@pytest.mark.parametrize("nbytes,seconds,bandwidth,name", [(-1, 1.0, 1e9, "nbytes"), (1, 0.0, 1e9, "seconds"),
                                                           (1, -1e-6, 1e9, "seconds"), (1, 1.0, -1e9, "bandwidth")])
def test_bad_input_names_the_argument(nbytes, seconds, bandwidth, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        pct_of_bound(nbytes, seconds, bandwidth)


def exact(nbytes: int) -> float:
    """The convention written out again (not imported): bytes / time / the whole bandwidth, in percent."""
    return round(100 * nbytes / (US * 1e-6) / BANDWIDTH, 1)


def test_bench_verify_uses_it(monkeypatch):
    monkeypatch.setattr(bv, "time_eager", lambda *args, **kwargs: US)
    case = bv.Case("rejection_sample", 2, 3, 50, "natural", torch.float32, CPU)
    row = bv.measure(case, "torch", 1, BANDWIDTH)
    assert row["pct_bound"] == exact(bv.minimal_bytes(case)) == pct_of_bound(bv.minimal_bytes(case), US * 1e-6,
                                                                             BANDWIDTH)
    assert row["pct_nominal"] == exact(bv.nominal_bytes(case)) > row["pct_bound"]


def test_bench_kv_compact_uses_it(monkeypatch):
    monkeypatch.setattr(bk, "time_calls", lambda *args, **kwargs: US)
    case = bk.grid(True, torch.float32, CPU, batches=(3,))[0]  # B=1's accepted path moves nothing here
    row = bk.measure(case, "torch", 1, BANDWIDTH)
    moved = bk.moved_bytes(case, bk.make_inputs(case)["accepted_nodes"])
    assert moved > 0 and row["pct_bound"] == exact(moved)


def test_bench_early_exit_topk_uses_it(monkeypatch):
    monkeypatch.setattr(bx, "time_calls", lambda *args, **kwargs: US)
    case = bx.grid(True, torch.float32, CPU)[0]
    row = bx.measure(case, "baseline", 1, BANDWIDTH)
    assert row["pct_bound"] == exact(case.weight_bytes)


def test_bench_tree_attention_uses_it(monkeypatch):
    monkeypatch.setattr(ba, "time_us", lambda *args, **kwargs: (US, "eager"))
    case = ba.grid(True, torch.float32, CPU, trees=("tree",), layouts=("contiguous",), prefix_kinds=("uniform",))[0]
    row, = ba.measure(case, ["torch"], 1, BANDWIDTH)
    assert row["ok"] and row["pct_bound"] == exact(ba.kv_bytes(ba.make_inputs(case)))


def test_no_bench_divides_by_a_bandwidth_but_the_helper():
    """Half the copy bandwidth (`bandwidth / 2`), a nominal HBM figure, any bandwidth in a denominator: only
    _bound.py divides by a bandwidth."""
    denominator = re.compile(r"/\s*\(?\s*\w*(bandwidth|bw|nominal)\w*\b|\b\w*(bandwidth|bw)\w*\s*/\s*2\b")
    offenders = [f"{path.name}:{number}: {line.strip()}"
                 for path in sorted((ROOT / "bench").glob("*.py")) if path.name != "_bound.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if denominator.search(line.split("#")[0])]
    assert not offenders, offenders


def test_verify_timings_flush_l2_by_default(monkeypatch, tmp_path):
    """bench_verify.measure and the grid flush L2 before every timed call unless --warm-l2 says otherwise."""
    flushed = []
    monkeypatch.setattr(bv, "time_eager", lambda fn, device, repeats, flush_bytes=0: flushed.append(flush_bytes) or US)
    bv.measure(bv.Case("greedy_verify", 1, 2, 50, "natural", torch.float32, CPU), "torch", 1, None)
    assert flushed == [_timing.FLUSH_BYTES] and _timing.FLUSH_BYTES >= 50 * 2**20  # more than an H100's L2

    asked = []
    monkeypatch.setattr(bv, "measure", lambda case, backend, repeats, bandwidth, flush_bytes: asked.append(flush_bytes)
                        or {"op": case.op, "backend": backend})
    monkeypatch.setattr(bv, "grid", lambda *args, **kwargs: [bv.Case("greedy_verify", 1, 1, 50, "natural",
                                                                     torch.float32, CPU)])
    for flags, want in (([], _timing.FLUSH_BYTES), (["--warm-l2"], 0)):
        asked.clear()
        assert bv.main(["--smoke", "--out", str(tmp_path), *flags]) == 0
        assert asked and set(asked) == {want}, flags
