"""bench/lookup.py's smoke mode runs and writes what it promises: every method at each batch size (HF's prompt
lookup refused past batch 1), greedy identity per row, the issue's targets, device/date/command, a plot."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_lookup_bench_smoke(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/lookup.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "lookup_cpu.json").read_text())
    meta, rows = result["meta"], result["rows"]
    assert meta["command"].startswith("python bench/lookup.py") and meta["date"] and meta["device"]
    methods = {"HF greedy", "HF prompt lookup", "ours plain", "ours lookup chain", "ours lookup tree",
               "ours lookup chain, repeated requests (LookupCache)"}
    assert {(row["batch"], row["method"]) for row in rows} == {(b, m) for b in (1, 2) for m in methods}
    refused = [row for row in rows if row["status"] != "ok"]
    assert [(row["batch"], row["method"]) for row in refused] == [(2, "HF prompt lookup")]
    assert all(row["identical_to_greedy"] == "yes" and row["tokens_per_s"] > 0 for row in rows if row["status"] == "ok")
    assert len(meta["targets"]) == 5 and all(line.endswith(("met", "NOT met")) for line in meta["targets"])
    report = (tmp_path / "lookup_cpu.md").read_text()
    assert "Targets (the issue's, CPU)" in report and "| batch | method | tokens_per_s |" in report
    assert (tmp_path / "lookup_cpu_tokens.png").stat().st_size > 0
