"""bench/gpu_first_look.sh on the CPU (--dry-run): the GPU calls must not die of a typo.

The dry run takes every stage's code path with CPU stand-ins (the selftest's dev mode under its watchdog,
pytest -m gpu collecting and skipping through bench/gpu_pytest.py, after a stand-in test that hangs and costs
that one test, memcheck's driver on the torch backend, the probe's and e2e's tiny shapes) and must leave the
same <= 8 files the GPU call returns, each readable, and a summary with the plan (budgets that fit 540 s), a
line per stage with its budget and rows, a digest and the next call. Both CUDA tree forms are in the first
call's tests and its memcheck. The digest itself is checked on made-up stage files: failures must be listed,
and a pytest cut off before its junit file still counted from its log.
"""

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specdec_kernels.demo import rows as demo_rows

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import first_look_summary  # noqa: E402

MAX_FILES = 8  # what one device call brings back
MAX_WALL_S = 540  # one device call: <= 9 minutes
FIRST_FILES = {"summary.txt", "facts.json", "log.txt", "selftest.jsonl", "pytest_gpu.log", "pytest_gpu.xml",
               "probe.jsonl", "e2e.jsonl"}
SECOND_FILES = {"summary.txt", "facts.json", "log.txt", "pytest_gpu.log", "pytest_gpu.xml"}
GRIDS_FILES = {"summary.txt", "facts.json", "log.txt", "verify.jsonl", "tree_attention.jsonl", "kv_compact.jsonl",
               "early_exit_topk.jsonl", "e2e.jsonl"}


def dry_run(out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    env["PYTHON"] = sys.executable
    # the stages the script runs under Triton's interpreter get the tests' interpreter speedup (same results)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests" / "subprocess_site"), env.get("PYTHONPATH")]))
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_first_look.sh"), "--dry-run", *flags, str(out)],
                          capture_output=True, text=True, env=env, timeout=900)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def plan_of(summary: str) -> dict[str, int]:
    """The plan line's stages and budgets; checks that its stated wall is the budgets' wall and fits a call."""
    line, = [x for x in summary.splitlines() if x.startswith("plan (stage budget): ")]
    stages, total = line.removeprefix("plan (stage budget): ").split(" = ")
    budgets, wall = {}, 0
    for group in stages.split(", "):  # "a 10 s | b 20 s + c 5 s": side by side, the longest branch counts
        branches = [{name: int(s) for name, s in re.findall(r"(\w+) (\d+) s", branch)} for branch in group.split(" | ")]
        wall += max(sum(branch.values()) for branch in branches)
        for branch in branches:
            budgets.update(branch)
    assert total == f"{wall} s of wall (deadline {MAX_WALL_S} s)" and wall <= MAX_WALL_S, line
    return budgets


def check_stage_lines(summary: str, budgets: dict[str, int], rows: dict[str, str]) -> None:
    """Every stage of the plan ended with a line naming its budget; `rows`: stage -> the file its rows are in."""
    for name, seconds in budgets.items():
        lines = [x for x in summary.splitlines() if x.startswith(f"{name}: ") and f"(budget {seconds} s)" in x]
        assert lines, f"no line for stage {name} with its budget {seconds} s"
        if name in rows:
            found = re.search(rf"(\d+) rows in {re.escape(rows[name])}", lines[-1])
            assert found and int(found.group(1)) > 0, lines[-1]


def test_the_first_call_dry_run_leaves_its_eight_files(tmp_path):
    done = dry_run(tmp_path)
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + (tmp_path / "log.txt").read_text()[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == FIRST_FILES and len(files) <= MAX_FILES
    budgets = plan_of(summary)
    assert list(budgets) == ["facts", "build", "selftest", "tests", "memcheck", "probe", "e2e", "digest"]
    check_stage_lines(summary, budgets, {"selftest": "selftest.jsonl", "tests": "pytest_gpu.xml",
                                         "probe": "probe.jsonl", "e2e": "e2e.jsonl"})
    for verdict in ("selftest: ok", "tests: ok", "memcheck: ok", "probe: ok", "e2e: ok", "== digest", "== exit 0"):
        assert verdict in summary, verdict
    # the stand-in test hung first, was killed after its 15 s, and cost that test alone: pytest ran again on the
    # rest (bench/gpu_pytest.py); its hang was expected, so the stage is ok
    pytest_log = (tmp_path / "pytest_gpu.log").read_text()
    assert "== gpu_pytest run 2" in pytest_log and "stand_in_hang.py::test_a_stuck_gpu_call HUNG" in pytest_log
    assert "the stand-in hang ended as planned" in summary
    cases = {case.get("name"): case for case in ET.parse(tmp_path / "pytest_gpu.xml").getroot().iter("testcase")}
    stand_in = cases["test_a_stuck_gpu_call"].find("skipped")
    assert stand_in is not None and "ended as planned after 15 s" in stand_in.get("message")
    # both forms of the CUDA tree sampler: in the GPU tests (collected here) and in the memcheck stage
    for form in ("split form", "cluster form"):
        assert any("tree_rejection_sample" in name and name.endswith(f"-cuda-{form}]") for name in cases), form
        assert re.search(rf"tree_rejection_sample \[torch\] .*\[{form}\]: ran", (tmp_path / "log.txt").read_text())
    assert "next: bash bench/gpu_first_look.sh --second" in summary
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["cuda_available"] is False and facts["kernels_record"]["kernels"]
    changes = facts["changes"]  # against the newest committed record (bench/results/*/kernels.json)
    assert changes["since"].startswith("bench/results/")
    assert sorted(changes["changed"] + changes["unchanged"]) == sorted(facts["kernels_record"]["kernels"])
    assert changes["changed"][:len(changes["new"])] == changes["new"]  # new kernels first
    checks = records(tmp_path / "selftest.jsonl")
    assert "header" in checks[0] and all(row["status"] in ("pass", "skip") for row in checks[1:])
    ops_run = list(dict.fromkeys(row["op"] for row in checks[1:]))
    assert ops_run[-1] == "engine"
    if changes["changed"]:  # the changed ops first, in gpu_changes.py's order
        assert ops_run[0] == changes["changed"][0].split("/")[0]
    # every row of the demo (each strategy of the table, its tree form too) vs HF
    assert sum(row["status"] == "pass" for row in checks if row.get("op") == "engine") == len(demo_rows())
    probe = records(tmp_path / "probe.jsonl")
    assert {row["section"] for row in probe} == {"facts", "verify", "attention", "kv", "exit", "targets", "questions",
                                                 "done"}
    assert not [row for row in probe if "error" in row or row.get("exact") is False or row.get("ok") is False]
    assert [row for row in probe if row["section"] == "verify"][0]["op"] == "block_verify"  # never timed on a GPU
    attention = {(row["B"], row["P"], row["impl"]) for row in probe if row["section"] == "attention"}
    assert len({(b, p) for b, p, _ in attention}) == 2 and {impl for _, _, impl in attention} >= {"sdpa", "triton"}
    targets = [row for row in probe if row["section"] == "targets"]  # bench/_probe_targets.py, run or skipped
    assert {row["target"].split(" ")[0] for row in targets} >= {"host", "rejection_sample_logits",
                                                               "tree_rejection_sample", "early_exit_topk",
                                                               "tree_attention"} or any("skipped" in r for r in targets)
    suite = ET.parse(tmp_path / "pytest_gpu.xml").getroot()
    assert sum(int(s.get("tests", 0)) for s in suite.iter("testsuite")) > 100  # collected, skipped without a GPU
    e2e = records(tmp_path / "e2e.jsonl")
    assert all(row["status"] == "ok" for row in e2e), [row for row in e2e if row["status"] != "ok"]
    assert {row["method"] for row in e2e} == {"ours_plain", "ours_plain_draft", "hf_dynamic", "ours_spec",
                                              "ours_spec_tree", "hf_static"}
    assert {row["batch"] for row in e2e} == {1, 2} and {row["noise"] for row in e2e} == {0.0, 0.3}
    assert {row["mode"] for row in e2e if row["method"] == "ours_spec"} == {"greedy", "sampling"}
    assert {row["mode"] for row in e2e if row["method"].startswith("hf_")} == {"greedy"}
    assert all("theory_speedup" in row and "speedup_vs_plain" in row for row in e2e if row["method"] == "ours_spec")
    assert "e2e (tokens/s" in summary and "vs theory" in summary


def test_the_second_call_dry_run_runs_the_full_tier_beside_the_sanitizers(tmp_path):
    done = dry_run(tmp_path, "--second")
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + (tmp_path / "log.txt").read_text()[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == SECOND_FILES and len(files) <= MAX_FILES
    budgets = plan_of(summary)
    check_stage_lines(summary, budgets, {"tests": "pytest_gpu.xml"})
    for verdict in ("memcheck: ok", "racecheck: ok", "tests: ok", "== digest", "next: bash bench/gpu_first_look.sh "
                    "--grids"):
        assert verdict in summary, verdict
    assert "--gpu-tier full" in (tmp_path / "pytest_gpu.log").read_text() or "--gpu-tier full" in summary
    suite = ET.parse(tmp_path / "pytest_gpu.xml").getroot()
    assert sum(int(s.get("tests", 0)) for s in suite.iter("testsuite")) > 3000  # the whole catalog


def test_the_grids_call_dry_run_leaves_its_grids(tmp_path):
    done = dry_run(tmp_path, "--grids")
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + (tmp_path / "log.txt").read_text()[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == GRIDS_FILES and len(files) <= MAX_FILES
    budgets = plan_of(summary)
    grids = ("verify", "tree_attention", "kv_compact", "early_exit_topk", "e2e")
    check_stage_lines(summary, budgets, {name: f"{name}.jsonl" for name in grids})
    for name in grids:
        assert f"{name}: ok" in summary and records(tmp_path / f"{name}.jsonl"), name
    # the verification bench's Triton rows: here, through the interpreter (its smoke test runs without it)
    verify = records(tmp_path / "verify.jsonl")
    assert {row["backend"] for row in verify} >= {"naive", "torch", "triton"}
    assert all(row.get("exact", True) for row in verify)
    assert "== digest" in summary and "next: none planned" in summary


def test_an_unknown_flag_is_refused(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_first_look.sh"), "--dryrun", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown option --dryrun" in done.stderr


def test_the_digest_lists_failures_and_counts_a_cut_off_pytest(tmp_path, capsys):
    check = dict(op="greedy_verify", backend="cuda", case="B=256 V=151936", dtype="bfloat16", error=None,
                 message="", seconds=0.1)
    lines = [{"header": {}}, dict(check, status="pass"), dict(check, status="fail", message="tokens differ at row 3")]
    (tmp_path / "selftest.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"op": "cut off mid-li')
    (tmp_path / "pytest_gpu.log").write_text(
        "tests/test_gpu_a.py::test_one PASSED [ 1%]\ntests/test_gpu_a.py::test_two FAILED [ 2%]\n"
        "tests/test_gpu_b.py::test_three PASSED [ 3%]\n")
    (tmp_path / "probe.jsonl").write_text(json.dumps(
        {"section": "verify", "op": "greedy_verify", "B": 1, "backend": "cuda", "us": 12.5, "pct_bound": 40.1,
         "exact": True}) + "\n")
    e2e = dict(pair="synthetic", noise=0.0, batch=1, mode="greedy", graphs=True, status="ok")
    (tmp_path / "e2e.jsonl").write_text("\n".join(json.dumps(x) for x in (
        dict(e2e, method="ours_plain", tok_s=500.0), dict(e2e, method="hf_dynamic", tok_s=100.0),
        dict(e2e, method="ours_spec", tok_s=1500.0, speedup_vs_plain=3.0, theory_speedup=3.5, alpha=1.0, c=0.1,
             matches_hf_greedy=True),
        dict(e2e, method="hf_static", status="timeout", error="still running after 40 s (--method-timeout)"))) + "\n")
    assert first_look_summary.main(["--call", "first", str(tmp_path)]) == 0
    digest = capsys.readouterr().out
    assert "selftest (changed ops, then the control sample and the engine): 1 passed, 1 failed, 0 skipped" in digest
    assert "FAIL greedy_verify [cuda] B=256 V=151936 bfloat16: tokens differ at row 3" in digest
    assert "cut off before its junit file; the log shows 2 passed, 1 failed" in digest
    assert "FAIL tests/test_gpu_a.py::test_two" in digest
    assert "op=greedy_verify backend=cuda B=1: us=12.5, pct_bound=40.1, exact=True" in digest
    assert ("synthetic noise=0.0 B=1 greedy: plain 500.0; spec 1500.0; spec/plain 3.0x vs theory 3.5x (alpha 1.0, "
            "c 0.1); hf_dynamic greedy 100.0, spec 15.00x; greedy == HF greedy: True") in digest
    assert "TIMEOUT method=hf_static pair=synthetic noise=0.0 batch=1 mode=greedy: still running after 40 s" in digest
    assert "changes: facts.json missing or unreadable" in digest


@pytest.mark.parametrize("script", ["gpu_first_look.sh", "gpu_checks.sh"])
def test_the_gpu_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(ROOT / "bench" / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_failed_or_timed_out_stage_sets_the_exit_status(tmp_path):
    """stage() and wait_tests() report through verdict_of, which runs in $(...): the status must be set by the
    callers, or a timed-out stage still ends the call with exit 0 (the bug this checks)."""
    functions = subprocess.run(["sed", "-n", "/^verdict_of()/,/^}/p;/^stage()/,/^}/p;/^wait_tests()/,/^}/p",
                                str(ROOT / "bench" / "gpu_first_look.sh")], capture_output=True, text=True).stdout
    script = functions + """
say() { echo "$*"; }; cap() { echo "$1"; }; budget() { echo 9; }; rows_in() { :; }; tests_line() { :; }
log=/dev/null; out=%s; : >"$out/pytest_gpu.log"
for command in true false "sleep 5"; do
  status=0
  stage demo 1 "" $command
  echo "status $status"
done
status=0; (exit 3) & tests_pid=$!; tests_started=$SECONDS; wait_tests; echo "status $status"
""" % tmp_path
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    statuses = [line for line in done.stdout.splitlines() if line.startswith("status ")]
    assert statuses == ["status 0", "status 1", "status 1", "status 1"], done.stdout + done.stderr
    assert "demo: TIMED OUT after 1 s" in done.stdout and "demo: exit 1" in done.stdout
