"""bench/engine_overhead.py --smoke (CI): the per-token breakdown runs, covers every method and batch,
its parts add up, and our greedy output equals HF's in it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import engine_overhead  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("engine_overhead")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, str(ROOT / "bench/engine_overhead.py"), "--smoke", "--out", str(out)],
                   check=True, capture_output=True, text=True, cwd=ROOT, env=env)  # this checkout's package
    return out


def test_rows_cover_methods_and_batches(smoke):
    result = json.loads((smoke / "engine_overhead.json").read_text())
    rows = result["rows"]
    assert {(r["method"], r["batch"]) for r in rows} == {(m, b) for m in engine_overhead.METHODS for b in (1, 2)}
    assert result["meta"]["command"].startswith("python ") and "--smoke" in result["meta"]["command"]
    assert "| pair | params_m | batch | method |" in (smoke / "engine_overhead.md").read_text()
    for row in rows:
        assert row["tok_s_min"] <= row["tok_s"] <= row["tok_s_max"]
        assert row["vs_hf_min"] <= row["vs_hf"] <= row["vs_hf_max"]
        if row["method"] != "hf_greedy":
            assert row["matches_hf"] is True  # token identity with HF greedy, batch 2 left-padded and ragged
        if row["method"] == "speculative":
            assert 0 <= row["alpha"] <= 1 and row["c"] > 0 and row["leviathan"] > 0 and row["v"] > 0
            assert (row["leviathan_v"] < row["leviathan"]) == (row["v"] > 1)  # v prices the verify forward


def test_breakdown_parts_are_attributed(smoke):
    rows = json.loads((smoke / "engine_overhead.json").read_text())["rows"]
    for row in rows:
        parts = {p: row[f"{p}_ms"] for p in engine_overhead.PARTS}
        assert parts["model"] > 0 and parts["attention"] > 0  # both sides' attention kernels were seen
        ours = row["method"] != "hf_greedy"
        assert (parts["cache_write"] > 0) == ours and (parts["verify_op"] > 0) == ours
        assert (parts["draft_model"] > 0) == (row["method"] == "speculative")


def test_sections_count_exclusive_time(monkeypatch):
    clock = [0.0]  # a fake perf_counter that the wrapped functions advance: exact, whatever the load
    monkeypatch.setattr(engine_overhead.time, "perf_counter", lambda: clock[0])

    def spend(seconds):
        clock[0] += seconds

    sections = engine_overhead.Sections()
    inner = sections.wrap("inner", lambda: spend(2.0))
    outer = sections.wrap("outer", lambda: (spend(1.0), inner(), spend(0.5)))
    outer()
    inner()
    assert sections.totals == {"inner": 4.0, "outer": 1.5}  # the nested calls are not counted twice


def test_alpha_inverts_expected_tokens():
    for alpha in (0.0, 0.3, 0.8):
        tokens = engine_overhead.expected_tokens(alpha, 4)
        assert abs(engine_overhead.alpha_of(tokens, 4) - alpha) < 1e-6
    assert engine_overhead.expected_tokens(1.0, 4) == 5
    assert abs(engine_overhead.leviathan(0.8, 4, 0.1) - (1 - 0.8 ** 5) / (0.2 * 1.4)) < 1e-9
