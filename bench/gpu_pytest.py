"""`pytest -m gpu` where a hang costs one test: pytest runs in its own process group, watched from here.

A test stuck in a CUDA call (a deadlocked kernel) cannot be ended inside its process: pytest-timeout's signal
method never gets to run its handler while the call blocks, and its thread method ends the whole run. So this
runner follows each test's start and end (bench/_pytest_progress.py), and when one runs past --per-test
seconds it kills pytest's process group, records that test as failed (a hang), and starts pytest again on the
tests that have not finished, without the hung one. The junit files of the runs are merged into one
(--junitxml), and every run's output goes to --log; its last line sums up the runs.

    python bench/gpu_pytest.py --per-test 150 --log OUT/pytest_gpu.log --junitxml OUT/pytest_gpu.xml -- \\
        -m gpu -v -n 12 tests
    ... --stand-in-hang ...   # the dry run: bench/stand_in_hang.py first, a test that hangs, its hang expected

Exit status: 0 when every test passed or skipped (an expected stand-in hang included), 1 otherwise; 124 when
the runner itself is stopped (SIGTERM from `timeout`) after writing what it has.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
STAND_IN = "bench/stand_in_hang.py::test_a_stuck_gpu_call"
POLL_S = 0.5


class Stopped(Exception):
    """The runner got SIGTERM (its stage's timeout): write what is done and leave."""


def _stop(signum, frame):
    raise Stopped()


def progress(path: Path) -> tuple[list[str], dict[str, dict]]:
    """([tests started, in order], {test ended: its "end" record}) from the plugin's lines."""
    started, ended = [], {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut off by the kill
            if "start" in record:
                started.append(record["start"])
            elif "end" in record:
                ended[record["end"]] = record
    return started, ended


def watch(child: subprocess.Popen, progress_file: Path, per_test: float) -> str | None:
    """Wait for pytest to exit (None), or kill its process group once a test runs past `per_test`: that test."""
    first_seen: dict[str, float] = {}
    while child.poll() is None:
        started, ended = progress(progress_file)
        now = time.monotonic()
        for nodeid in started:
            first_seen.setdefault(nodeid, now)
        running = [nodeid for nodeid in first_seen if nodeid not in ended]
        stuck = [nodeid for nodeid in running if now - first_seen[nodeid] > per_test]
        if stuck:
            os.killpg(child.pid, signal.SIGKILL)  # the only signal a process stuck in a CUDA call obeys
            child.wait()
            return stuck[0]
        time.sleep(POLL_S)
    return None


def _case(nodeid: str, tag: str | None = None, message: str = "") -> ET.Element:
    path, _, name = nodeid.partition("::")
    case = ET.Element("testcase", classname=path.removesuffix(".py").replace("/", "."), name=name, time="0")
    if tag is not None:
        ET.SubElement(case, tag, message=message)
    return case


OUTCOME_TAGS = {"failed": "failure", "error": "error", "skipped": "skipped", "passed": None}


def merge(runs: list[tuple[Path, Path, bool]], hung: list[tuple[str, str]]) -> ET.Element:
    """One <testsuite> of every run's test cases: a finished run's junit file, a killed run's ended tests (from
    its progress lines); a case per hung test: a failure, or, for the expected stand-in, a skip that says so."""
    cases: dict[tuple, ET.Element] = {}
    seconds = 0.0
    for junit, progress_file, finished in runs:
        found = []
        if finished:
            try:
                root = ET.parse(junit).getroot()
                for suite in [root] if root.tag == "testsuite" else root.iter("testsuite"):
                    seconds += float(suite.get("time", 0) or 0)
                    found += list(suite.iter("testcase"))
            except (OSError, ET.ParseError):
                finished = False  # no junit after all: its progress lines say what it did
        if not finished:
            found = [_case(nodeid, OUTCOME_TAGS[end["outcome"]], end["message"])
                     for nodeid, end in progress(progress_file)[1].items()]
        for case in found:
            cases[(case.get("classname"), case.get("name"))] = case
    for nodeid, message in hung:
        case = _case(nodeid, "skipped" if nodeid == STAND_IN else "failure", message)
        cases[(case.get("classname"), case.get("name"))] = case
    suite = ET.Element("testsuite", name="pytest", time=f"{seconds:.3f}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for case in cases.values():
        suite.append(case)
        counts["tests"] += 1
        for tag, key in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            counts[key] += case.find(tag) is not None
    for key, value in counts.items():
        suite.set(key, str(value))
    root = ET.Element("testsuites")
    root.append(suite)
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-test", type=float, default=150.0, help="seconds a test may run (default 150)")
    parser.add_argument("--log", type=Path, required=True, help="every run's output, appended")
    parser.add_argument("--junitxml", type=Path, required=True, help="the merged junit file")
    parser.add_argument("--stand-in-hang", action="store_true",
                        help=f"run {STAND_IN} first: it hangs, and its hang is expected (the dry run)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments")
    args = parser.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if args.stand_in_hang:
        pytest_args = [STAND_IN, *pytest_args]
    signal.signal(signal.SIGTERM, _stop)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])))
    if args.stand_in_hang:
        env["GPU_PYTEST_STAND_IN"] = "1"
    hung: list[tuple[str, str]] = []
    runs: list[tuple[Path, Path, bool]] = []  # (junit file, progress file, finished)
    status = 0
    with tempfile.TemporaryDirectory(prefix="gpu-pytest-") as folder, open(args.log, "a", encoding="utf-8") as log:
        skip = Path(folder) / "skip.txt"
        skip.write_text("")
        env["GPU_PYTEST_SKIP"] = str(skip)
        try:
            for run in range(1, 1000):
                progress_file, junit = Path(folder) / f"progress{run}.txt", Path(folder) / f"junit{run}.xml"
                runs.append((junit, progress_file, False))
                env["GPU_PYTEST_PROGRESS"] = str(progress_file)
                command = [sys.executable, "-m", "pytest", "-p", "_pytest_progress", "--junitxml", str(junit),
                           *pytest_args]
                log.write(f"== gpu_pytest run {run}: {' '.join(command[1:])}\n")
                log.flush()
                child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                         start_new_session=True)
                try:
                    stuck = watch(child, progress_file, args.per_test)
                except Stopped:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                    raise
                if stuck is None:
                    runs[-1] = (junit, progress_file, True)
                    status = 0 if child.returncode in (0, 1, 5) else 1  # 1: failures (counted below); 5: none
                    break
                message = f"hang: no result after {args.per_test:g} s; pytest was killed and restarted without it"
                if stuck == STAND_IN:
                    message = f"the stand-in hang, ended as planned after {args.per_test:g} s (expected)"
                hung.append((stuck, message))
                log.write(f"\n{stuck} FAILED ({message})\n" if stuck != STAND_IN else f"\n{stuck} HUNG ({message})\n")
                log.flush()
                _, ended = progress(progress_file)
                with open(skip, "a", encoding="utf-8") as file:
                    file.writelines(f"{nodeid}\n" for nodeid in sorted({*ended, stuck}))
        except Stopped:
            status = 124
        merged = merge(runs, hung)
        ET.ElementTree(merged).write(args.junitxml, encoding="utf-8", xml_declaration=True)
        real = [nodeid for nodeid, _ in hung if nodeid != STAND_IN]
        suite = merged.find("testsuite")
        if int(suite.get("failures")) + int(suite.get("errors")):
            status = status or 1  # a failed test, a real hang among them
        if args.stand_in_hang and STAND_IN not in [nodeid for nodeid, _ in hung]:
            status = status or 1  # the stand-in did not hang: the watch did not work
            log.write(f"gpu_pytest: the stand-in {STAND_IN} did not hang\n")
        log.write(f"gpu_pytest: {suite.get('tests')} tests in {len(runs)} run(s), {suite.get('failures')} failed, "
                  f"{len(real)} hung{': ' + ', '.join(real) if real else ''}"
                  f"{'; the stand-in hang ended as planned' if STAND_IN in [n for n, _ in hung] else ''}\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
