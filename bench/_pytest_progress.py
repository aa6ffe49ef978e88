"""A pytest plugin for bench/gpu_pytest.py: which test starts and ends when, how it ended, which to leave out.

Loaded with `-p _pytest_progress` (bench/ on sys.path). GPU_PYTEST_PROGRESS names a file that gets a JSON line
{"start": nodeid} / {"end": nodeid, "outcome": passed|failed|error|skipped, "message": ...} per test, flushed
at once, written by the process that reports (the xdist controller, which hears of every worker's tests): a
run that is killed writes no junit file, and these lines are what it finished. GPU_PYTEST_SKIP names a file of
node ids (one a line) that are deselected: the tests a run before this one finished, or left hanging.
"""

import json
import os


_state: dict = {"outcomes": {}}


def _write(record: dict) -> None:
    path = os.environ.get("GPU_PYTEST_PROGRESS")
    if path and not hasattr(_state["config"], "workerinput"):  # the controller only: a worker's would repeat
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")


def pytest_configure(config):
    _state["config"] = config


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("GPU_PYTEST_SKIP")
    if not path or not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as file:
        done = {line.strip() for line in file if line.strip()}
    kept = [item for item in items if item.nodeid not in done]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = kept


def pytest_runtest_logstart(nodeid, location):
    _write({"start": nodeid})


def pytest_runtest_logreport(report):
    """The test's outcome so far: a failure in setup or teardown is an error, in the call a failure."""
    outcome, _ = _state["outcomes"].get(report.nodeid, ("passed", ""))
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped and outcome == "passed":
        outcome = "skipped"
    message = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
    _state["outcomes"][report.nodeid] = (outcome, message or _state["outcomes"].get(report.nodeid, ("", ""))[1])


def pytest_runtest_logfinish(nodeid, location):
    outcome, message = _state["outcomes"].pop(nodeid, ("passed", ""))
    _write({"end": nodeid, "outcome": outcome, "message": message})
