"""The benchmark's smoke mode and the examples run and produce what they promise."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_greedy_verify_bench_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/bench_greedy_verify.py"), "--smoke", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "greedy_verify.json").read_text())
    assert result["rows"] and all(row["exact"] for row in result["rows"])
    assert {row["backend"] for row in result["rows"]} >= {"torch"}
    assert "| B | g | V |" in (tmp_path / "greedy_verify.md").read_text()


def test_ops_example_runs():
    done = subprocess.run([sys.executable, str(ROOT / "python/ops_as_backend.py")], check=True, capture_output=True,
                          text=True)
    assert "greedy   accepted" in done.stdout and "sampling accepted" in done.stdout


def test_cli_info_prints_build_info():
    done = subprocess.run([sys.executable, "-m", "specdec_kernels", "info"], check=True, capture_output=True, text=True)
    info = json.loads(done.stdout)
    assert info["version"] and "greedy_verify" in info["auto_backends"]
