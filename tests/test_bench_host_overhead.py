"""bench/host_overhead.py: every op's host path is timed with its kernels stubbed, and the report is written."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from specdec_kernels import ops
from specdec_kernels.common import registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import host_overhead  # noqa: E402


def test_the_bench_covers_every_op_in_both_modes(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/host_overhead.py"), "--rounds", "2", "--calls", "3",
                    "--out", str(tmp_path), "--stem", "h"], check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "h.json").read_text())
    rows = result["rows"]
    assert {r["op"] for r in rows} == {*registry.registered_ops(), "fallback_check"}
    assert {r["mode"] for r in rows} == {"device", "cpu"}
    assert {r["case"] for r in rows if r["op"] == "kv_compact"} == {
        f"L{n} {form}" for n in (2, 32) for form in ("stacked views", "separate", "stacked tensor")}
    assert all(r["us"] > 0 and "error" not in r for r in rows)
    assert result["meta"]["threads"] == 1 and result["meta"]["command"].startswith("python ")
    assert "| op | case | mode | us |" in (tmp_path / "h.md").read_text()


def test_stubbed_kernels_are_not_run_and_are_put_back():
    rows = host_overhead.cases()
    calls = []
    real = registry._IMPLS["greedy_verify"]["torch"]
    registry._IMPLS["greedy_verify"]["torch"] = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        outputs = host_overhead.reference_outputs(rows)
        assert len(calls) == 1  # the one real call whose outputs the stub hands back
        with host_overhead.stubbed_kernels(outputs):
            tokens, accepted = next(call for op, _, call in rows if op == "greedy_verify")()
        assert len(calls) == 1 and tokens is outputs["greedy_verify"][0]
    finally:
        registry._IMPLS["greedy_verify"]["torch"] = real
    assert registry._IMPLS["greedy_verify"]["torch"] is real


def test_the_kv_compact_stub_still_works_out_the_layout(monkeypatch):
    seen = []
    monkeypatch.setattr(host_overhead, "cache_layout", lambda k, v: seen.append(len(k)))
    stub = host_overhead._stub_outputs("kv_compact", "lens")
    assert stub([torch.zeros(1)] * 3, [torch.zeros(1)] * 3, None, None) == "lens" and seen == [3]
    assert ops.kv_compact([], [], torch.tensor([1]), torch.tensor([[0]])).tolist() == [2]  # the op itself untouched
