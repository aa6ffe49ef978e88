"""`selftest --watchdog`: a hang costs the rest of one op, never the run. The checks run in a child process; a
check with no result for the watchdog's seconds is killed, reported as that check's failure, and a fresh child
goes on with the next op. Shown end to end with the stand-in hang (SPECDEC_SELFTEST_STAND_IN_HANG: every check
of the op blocks, as a synchronize behind a deadlocked kernel would), and on the protocol alone with scripted
children (a hang between checks, a crash)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from specdec_kernels import selftest
from specdec_kernels.selftest import runner, watchdog

ROOT = Path(__file__).resolve().parents[1]


def test_a_hung_op_fails_and_the_ops_after_it_still_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", **{runner.STAND_IN_HANG: "greedy_verify"})
    lines, report = tmp_path / "selftest.jsonl", tmp_path / "selftest.json"
    done = subprocess.run([sys.executable, "-m", "specdec_kernels", "selftest", "--device", "cpu", "--no-engine",
                           "--ops", "greedy_verify,kv_rollback", "--watchdog", "10", "--jsonl", str(lines),
                           "--json", str(report)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == selftest.EXIT_FAILED, done.stdout + done.stderr
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert "header" in rows[0] and not any(watchdog.RUNNING in row for row in rows)  # the markers stay internal
    hung, after = rows[1], rows[2:]
    assert hung["op"] == "greedy_verify" and hung["status"] == "fail" and "hang: no result for 10 s" in hung["message"]
    assert hung["case"] and hung["backend"] == "triton"  # the check that was running, by name
    assert [(row["op"], row["status"]) for row in after] == [("kv_rollback", "pass")]
    summary = json.loads(report.read_text())["summary"]
    assert summary["failed"] == 1 and summary["passed"] == 1
    assert "FAIL greedy_verify [triton]" in done.stdout and "hang" in done.stdout


def scripted(tmp_path, script: str):
    """child_command(remaining, log): a Python child running `script` with `ops` and `log` defined."""
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent('''
        import json, sys, time
        ops, log = sys.argv[1].split(","), open(sys.argv[2], "a")
        def line(record):
            log.write(json.dumps(record) + "\\n"); log.flush()
        def check(op, status="pass"):
            line({"op": op, "backend": "triton", "case": "c", "dtype": "-", "status": status, "error": None,
                  "message": "", "seconds": 0.0})
    ''') + textwrap.dedent(script))
    calls = []

    def command(remaining, log):
        calls.append(list(remaining))
        return [sys.executable, str(path), ",".join(remaining), str(log)]
    return command, calls


def supervise(command, ops, seconds=3):
    headers, results = [], []
    watchdog.supervise(ops, command, dict(os.environ), seconds, headers.append, results.append)
    return headers, results


def test_a_hang_between_checks_and_a_crash_cost_one_op_each(tmp_path):
    command, calls = scripted(tmp_path, '''
        line({"header": {"device": "cpu"}})
        for op in ops:
            if op == "b":  # finishes one check, then hangs building the next one (no marker)
                line({"running": {"op": "b", "backend": "triton", "check": "c"}}); check("b")
                time.sleep(600)
            if op == "d":
                line({"running": {"op": "d", "backend": "cuda", "check": "big"}}); sys.exit(3)  # dies
            line({"running": {"op": op, "backend": "triton", "check": "c"}}); check(op)
    ''')
    headers, results = supervise(command, ["a", "b", "c", "d", "e"])
    assert calls == [["a", "b", "c", "d", "e"], ["c", "d", "e"], ["e"]]
    assert len(headers) == 3 and [(r.op, r.status) for r in results] == [
        ("a", "pass"), ("b", "pass"), ("b", "fail"), ("c", "pass"), ("d", "fail"), ("e", "pass")]
    hang, crash = results[2], results[4]
    assert "hang: no result for 3 s" in hang.message and hang.case == "(between checks)"
    assert "died (exit status 3)" in crash.message and crash.case == "big" and crash.backend == "cuda"


def test_a_child_that_finishes_is_watched_once(tmp_path):
    command, calls = scripted(tmp_path, '''
        line({"header": {"device": "cpu"}})
        for op in ops:
            check(op, "fail" if op == "b" else "pass")
        sys.exit(1)  # a failed check is the selftest's exit 1: no restart
    ''')
    _, results = supervise(command, ["a", "b"])
    assert calls == [["a", "b"]] and [r.status for r in results] == ["pass", "fail"]
