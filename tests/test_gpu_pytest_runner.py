"""bench/gpu_pytest.py: a test stuck the way a CUDA call behind a deadlocked kernel is (deaf to SIGALRM, SIGTERM
and SIGINT: only a kill ends it) costs that one test. pytest is killed and started again without it; the tests
after it run, the junit files merge, and the hang is a failure with its cause."""

import importlib.util
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUCK = '''
import signal, time

def test_a():
    pass

def test_b_stuck():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGTERM, signal.SIGINT})
    while True:
        time.sleep(3600)

def test_c():
    pass

def test_d_fails():
    assert 1 == 2
'''


def run(tmp_path, *pytest_args):
    tests = tmp_path / "stuck_suite.py"
    tests.write_text(textwrap.dedent(STUCK))
    log, junit = tmp_path / "log.txt", tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_pytest.py"), "--per-test", "4", "--log", str(log),
                           "--junitxml", str(junit), "--", "-v", "-p", "no:cacheprovider", *pytest_args, str(tests)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    return done, log.read_text(), cases


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stuck_test_costs_that_test_alone(tmp_path, workers):
    if workers and importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    done, log, cases = run(tmp_path, *(["-n", str(workers)] if workers else []))
    assert done.returncode == 1, done.stderr
    assert set(cases) == {"test_a", "test_b_stuck", "test_c", "test_d_fails"}
    hang = cases["test_b_stuck"].find("failure")
    assert hang is not None and "hang: no result after 4 s" in hang.get("message")
    assert cases["test_a"].find("failure") is None and cases["test_c"].find("failure") is None
    assert cases["test_d_fails"].find("failure") is not None  # a plain failure is still one
    assert "== gpu_pytest run 2" in log and "test_b_stuck FAILED (hang" in log
    assert log.strip().splitlines()[-1].startswith("gpu_pytest: 4 tests in 2 run(s), 2 failed, 1 hung")


def test_a_suite_without_hangs_is_one_run(tmp_path):
    tests = tmp_path / "fine_suite.py"
    tests.write_text("def test_a():\n    pass\n")
    log, junit = tmp_path / "log.txt", tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_pytest.py"), "--per-test", "30", "--log", str(log),
                           "--junitxml", str(junit), "--", "-p", "no:cacheprovider", str(tests)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and "gpu_pytest: 1 tests in 1 run(s), 0 failed, 0 hung" in log.read_text()
