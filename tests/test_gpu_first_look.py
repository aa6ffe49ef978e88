"""bench/gpu_first_look.sh on the CPU (--dry-run): the first GPU call must not die of a typo.

The dry run takes every stage's code path with CPU stand-ins (the selftest's dev mode, pytest -m gpu
collecting and skipping, the probe's tiny shapes) and must leave the same <= 8 files the GPU call
returns, each readable, and a summary with a digest. The digest itself is checked on made-up stage
files: failures must be listed, and a pytest cut off before its junit file still counted from its log.
"""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import first_look_summary  # noqa: E402

MAX_FILES = 8  # what one device call brings back
FIRST_FILES = {"summary.txt", "facts.json", "log.txt", "cuda_ops.jsonl", "engine.jsonl", "pytest_gpu.log",
               "pytest_gpu.xml", "probe.jsonl"}
SECOND_FILES = {"summary.txt", "facts.json", "log.txt", "verify.jsonl", "tree_attention.jsonl", "kv_compact.jsonl",
                "early_exit_topk.jsonl"}


def dry_run(out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    env["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_first_look.sh"), "--dry-run", *flags, str(out)],
                          capture_output=True, text=True, env=env, timeout=900)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_first_call_dry_run_leaves_its_eight_files(tmp_path):
    done = dry_run(tmp_path)
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + (tmp_path / "log.txt").read_text()[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == FIRST_FILES and len(files) <= MAX_FILES
    for stage in ("cuda_ops: ok", "engine: ok", "tests: ok", "probe: ok", "== digest", "== exit 0"):
        assert stage in summary, stage
    ops = records(tmp_path / "cuda_ops.jsonl")
    assert "header" in ops[0] and all(row["status"] == "pass" for row in ops[1:]) and len(ops) > 5
    engine = [row for row in records(tmp_path / "engine.jsonl") if "status" in row]
    assert sum(row["status"] == "pass" for row in engine) == 6  # every strategy vs HF per prompt, eager
    probe = records(tmp_path / "probe.jsonl")
    sections = {row["section"] for row in probe}
    assert sections == {"facts", "verify", "attention", "kv", "exit", "engine", "done"}
    assert not [row for row in probe if "error" in row or row.get("exact") is False or row.get("ok") is False]
    suite = ET.parse(tmp_path / "pytest_gpu.xml").getroot()
    assert sum(int(s.get("tests", 0)) for s in suite.iter("testsuite")) > 100  # collected, skipped without a GPU
    assert json.loads((tmp_path / "facts.json").read_text())["cuda_available"] is False


def test_the_second_call_dry_run_leaves_its_grids(tmp_path):
    done = dry_run(tmp_path, "--second")
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + (tmp_path / "log.txt").read_text()[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == SECOND_FILES and len(files) <= MAX_FILES
    for stage in ("memcheck: ok", "racecheck: ok", "verify: ok", "tree_attention: ok", "kv_compact: ok",
                  "early_exit_topk: ok", "== digest"):
        assert stage in summary, stage
    for name in ("verify", "tree_attention", "kv_compact", "early_exit_topk"):
        assert records(tmp_path / f"{name}.jsonl"), name


def test_an_unknown_flag_is_refused(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_first_look.sh"), "--dryrun", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown option --dryrun" in done.stderr


def test_the_digest_lists_failures_and_counts_a_cut_off_pytest(tmp_path, capsys):
    check = dict(op="greedy_verify", backend="cuda", case="B=256 V=151936", dtype="bfloat16", error=None,
                 message="", seconds=0.1)
    lines = [{"header": {}}, dict(check, status="pass"), dict(check, status="fail", message="tokens differ at row 3")]
    (tmp_path / "cuda_ops.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"op": "cut off mid-li')
    (tmp_path / "pytest_gpu.log").write_text(
        "tests/test_gpu_a.py::test_one PASSED [ 1%]\ntests/test_gpu_a.py::test_two FAILED [ 2%]\n"
        "tests/test_gpu_b.py::test_three PASSED [ 3%]\n")
    (tmp_path / "probe.jsonl").write_text(json.dumps(
        {"section": "verify", "op": "greedy_verify", "B": 1, "backend": "cuda", "us": 12.5, "pct_min_bytes": 40.1,
         "exact": True}) + "\n")
    assert first_look_summary.main([str(tmp_path)]) == 0
    digest = capsys.readouterr().out
    assert "cuda_ops (selftest, CUDA kernels): 1 passed, 1 failed, 0 skipped" in digest
    assert "FAIL greedy_verify [cuda] B=256 V=151936 bfloat16: tokens differ at row 3" in digest
    assert "cut off before its junit file; the log shows 2 passed, 1 failed" in digest
    assert "FAIL tests/test_gpu_a.py::test_two" in digest
    assert "op=greedy_verify backend=cuda B=1: us=12.5, pct_min_bytes=40.1, exact=True" in digest
    assert "engine (selftest, every strategy): no checks recorded (engine.jsonl missing)" in digest


@pytest.mark.parametrize("script", ["gpu_first_look.sh", "gpu_checks.sh"])
def test_the_gpu_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(ROOT / "bench" / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
