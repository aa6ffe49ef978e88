"""`selftest --watchdog SECONDS`: the checks run in a child process that this one watches.

A check that gives no result for SECONDS is a hang, a deadlocked kernel most likely: the CUDA call waiting on it
cannot be interrupted inside its own process (a signal handler never runs while it blocks, and the context is
lost anyway). So the child is killed, the hang is reported as that check's failure, and a fresh child goes on
with the ops after the hung one: a hang costs the rest of one op, never the run. A child that dies otherwise (a
crash) is reported the same way. The child writes every check to a JSON-lines file the moment it finishes, and
a {"running": ...} line before each check starts, which is how this process knows what hung.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Callable

from .model import FAIL, Result

RUNNING = "running"
POLL_S = 0.2
_FIELDS = {f.name for f in fields(Result)}


def marker(log) -> Callable[[str, str, str], None]:
    """plan.on_check for a child: a {"running": {op, backend, check}} line in its log before each check."""
    def on_check(op: str, backend: str, check: str) -> None:
        log.note({RUNNING: {"op": op, "backend": backend, "check": check}})
    return on_check


class _Follower:
    """Reads the complete lines a child appends to its log, as they come."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""

    def lines(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with open(self.path, encoding="utf-8") as file:
            file.seek(self.offset)
            text = file.read()
            self.offset = file.tell()
        text = self.partial + text
        *complete, self.partial = text.split("\n")
        return [json.loads(line) for line in complete if line.strip()]


def _watch(child: subprocess.Popen, log: Path, seconds: float, on_header, on_result) -> dict | None:
    """Relay the child's lines until it exits (None) or stays silent `seconds` (then it is killed, and the check
    it was running comes back; between checks, the op of its last line: a check of it or of a later op was
    being built, and the ops after it run again)."""
    follower, running, last = _Follower(log), {}, time.monotonic()
    while True:
        exited = child.poll() is not None
        for record in follower.lines():
            last = time.monotonic()
            if "header" in record:
                on_header(record["header"])
            elif RUNNING in record:
                running = record[RUNNING]
            else:
                on_result(Result(**{k: v for k, v in record.items() if k in _FIELDS}))
                running = {"op": record.get("op")}
        if exited:
            return None if child.returncode in (0, 1) else {**running, "died": child.returncode}
        if time.monotonic() - last > seconds:
            child.kill()
            child.wait()
            return {**running, "hung": seconds}
        time.sleep(POLL_S)


def _failure(stop: dict, op: str) -> Result:
    check = stop.get("check") or "(between checks)"
    if "hung" in stop:
        why = f"hang: no result for {stop['hung']:g} s, so the selftest process was killed"
    else:
        why = f"the selftest process died (exit status {stop['died']})"
    return Result(op, stop.get("backend") or "-", check, "-", FAIL,
                  message=f"{why}; the remaining checks of {op} are not run, the ops after it are")


def supervise(ops: list[str], child_command: Callable[[list[str], Path], list[str]], env: dict, seconds: float,
              on_header: Callable[[dict], None], on_result: Callable[[Result], None]) -> None:
    """Run `ops` (in order) in children, `child_command(remaining ops, log path)` each, under the watchdog."""
    remaining = list(ops)
    while remaining:
        with tempfile.TemporaryDirectory(prefix="specdec-selftest-") as folder:
            log = Path(folder) / "checks.jsonl"
            child = subprocess.Popen(child_command(remaining, log), env=env)
            stop = _watch(child, log, seconds, on_header, on_result)
        if stop is None:
            return
        op = stop.get("op") if stop.get("op") in remaining else remaining[0]
        failure = _failure(stop, op)
        print(f"  {op}: FAIL [{failure.backend}] {failure.case}: {failure.message}", file=sys.stderr, flush=True)
        on_result(failure)
        remaining = remaining[remaining.index(op) + 1:]


def child_environment(device_type: str) -> dict:
    """The child's environment: the CPU dev mode's Triton kernels run interpreted."""
    return dict(os.environ, TRITON_INTERPRET="1") if device_type == "cpu" else dict(os.environ)
