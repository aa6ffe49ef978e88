"""bench/gpu_changes.py: which kernels changed since the newest committed GPU results, so that the next GPU call
checks them first. Its closures on a made-up tree, its comparison and order, the newest record winning, the
committed record of the 2026-11-27 run reproduced from git, and the command line the first look evals."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_changes  # noqa: E402

H100_RUN = ROOT / "bench/results/gpu_checks_h100_2026-11-27/kernels.json"


def reader(files: dict):
    return lambda path: files.get(path)


def test_closures_follow_relative_imports_and_includes():
    files = {"pkg/triton/a.py": "from ._launch import x\nfrom .b import (y,\n  z)\nfrom ..common import w\n",
             "pkg/triton/b.py": "from . import c, _philox  # helpers\nimport torch\n",
             "pkg/triton/c.py": "", "pkg/triton/_launch.py": "", "pkg/triton/_philox.py": "",
             "csrc/a.cu": '#include "a.h"\n#include "common.cuh"\n#include <cuda.h>\n', "csrc/a.h": "",
             "csrc/common.cuh": '#include "ordered_key.cuh"\n', "csrc/ordered_key.cuh": ""}
    read = reader(files)
    assert gpu_changes.python_closure("pkg/triton/a.py", read) == {
        "pkg/triton/a.py", "pkg/triton/_launch.py", "pkg/triton/b.py", "pkg/triton/c.py", "pkg/triton/_philox.py"}
    assert gpu_changes.include_closure(["csrc/a.cu"], read) == {"csrc/a.cu", "csrc/a.h", "csrc/common.cuh",
                                                                 "csrc/ordered_key.cuh"}


def test_every_kernel_has_its_own_sources_and_the_backends_share_theirs():
    now = gpu_changes.record()
    assert {key.split("/")[1] for key in now["kernels"]} == {"cuda", "triton"}
    assert "csrc/block_verification.cu" in now["sources"]["block_verify/cuda"]
    assert "csrc/split_v_sampling.cuh" in now["sources"]["rejection_sample/cuda"]  # reached through the .cu
    assert "specdec_kernels/triton/tree_verify_sampling.py" in now["sources"]["tree_rejection_sample/triton"]  # the kernel
    assert "specdec_kernels/triton/_launch.py" in now["shared"]["triton"]  # every Triton kernel reads it
    assert not any(path in paths for key, paths in now["sources"].items() for path in now["shared"][key.split("/")[1]])


def fake(kernels: dict, sources: dict | None = None, files: dict | None = None, shared=()) -> dict:
    return {"kernels": kernels, "sources": sources or {key: [] for key in kernels}, "files": files or {},
            "shared": {"cuda": list(shared), "triton": []}, "commit": "abc", "date": "2026-01-01"}


def test_the_comparison_lists_new_kernels_first_then_those_changed_on_both_backends():
    old = fake({"a/cuda": "1", "a/triton": "1", "b/cuda": "1", "b/triton": "1", "c/cuda": "1", "c/triton": "1"},
               files={"shared.h": "1", "x": "1"})
    now = fake({"a/cuda": "1", "a/triton": "2", "b/cuda": "2", "b/triton": "2", "c/cuda": "1", "c/triton": "1",
                "d/cuda": "1", "d/triton": "1"}, files={"shared.h": "2", "x": "1"}, shared=["shared.h"])
    diff = gpu_changes.compare(now, old)
    assert diff["new"] == ["d/cuda", "d/triton"]
    assert diff["changed"] == ["d/cuda", "d/triton", "b/cuda", "b/triton", "a/triton"]
    assert diff["unchanged"] == ["a/cuda", "c/cuda", "c/triton"] and diff["shared_changed"] == ["shared.h"]
    assert gpu_changes.ops_of(diff["changed"]) == ["d", "b", "a"] and gpu_changes.ops_of(diff["changed"], "cuda") == [
        "d", "b"]
    everything = gpu_changes.compare(now, None)  # no committed GPU result: every kernel counts as changed
    assert everything["changed"] == sorted(now["kernels"]) and everything["unchanged"] == []


def test_the_newest_record_is_the_baseline(tmp_path):
    for folder in ("gpu_checks_h100_2026-11-27", "gpu_first_look_h200_2026-12-03"):
        (tmp_path / folder).mkdir()
    undated = {**fake({"a/cuda": "old"}), "date": None}  # the folder's name dates it
    (tmp_path / "gpu_checks_h100_2026-11-27" / "kernels.json").write_text(json.dumps(undated))
    first_look = {"cuda_available": True, "kernels_record": {**fake({"a/cuda": "new"}), "date": "2026-12-03"}}
    (tmp_path / "gpu_first_look_h200_2026-12-03" / "facts.json").write_text(json.dumps(first_look))
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "facts.json").write_text(json.dumps({"cuda_available": False}))  # no record: ignored
    found = gpu_changes.records(tmp_path)
    assert [day for day, _, _ in found] == ["2026-11-27", "2026-12-03"]
    assert found[-1][2]["kernels"] == {"a/cuda": "new"}


def test_the_committed_h100_record_is_what_git_holds_at_its_commit():
    committed = json.loads(H100_RUN.read_text())
    has_commit = subprocess.run(["git", "cat-file", "-e", f"{committed['commit']}^{{commit}}"], cwd=ROOT,
                                capture_output=True).returncode == 0 if (ROOT / ".git").exists() else False
    if not has_commit:
        pytest.skip("no git history here (a copy of the tree)")
    again = gpu_changes.record(gpu_changes.at_commit(committed["commit"]), commit=committed["commit"],
                               day=committed["date"])
    assert again["kernels"] == committed["kernels"]
    assert "block_verify/cuda" not in committed["kernels"]  # block verification came after that run


def run_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/gpu_changes.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_the_shell_lines_are_what_the_first_look_evals(tmp_path):
    done = run_command("--shell", "--since", str(H100_RUN))
    assert done.returncode == 0, done.stderr
    values = dict(shlex.split(line)[0].split("=", 1) for line in done.stdout.splitlines())
    assert set(values) == {"changed_ops", "control_ops", "focus"}
    focus = values["focus"].split(",")
    assert all(item.count("/") == 1 and item.split("/")[1] in ("cuda", "triton") for item in focus if item)
    assert values["changed_ops"].split(",") == list(dict.fromkeys(item.split("/")[0] for item in focus))
    assert not set(values["control_ops"].split(",")) & set(values["changed_ops"].split(",")) - {""}
    missing = run_command("--ops", "--since", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "--since" in missing.stderr.strip().splitlines()[-1]


def test_record_writes_the_working_trees_fingerprint(tmp_path):
    done = run_command("--record", str(tmp_path), "--date", "2026-12-01")
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "kernels.json").read_text())
    assert written["date"] == "2026-12-01" and written["kernels"] == gpu_changes.record()["kernels"]
    again = run_command("--shell", "--since", str(tmp_path / "kernels.json"))
    assert "focus=''" in again.stdout  # nothing changed since a record of this very tree


def test_the_docs_lists_are_the_generated_ones():
    """docs/gpu.md's lists of changed and verified kernels are `gpu_changes.py --markdown`'s output, so they
    cannot go stale (rerun it and paste after a kernel change or a committed GPU run)."""
    done = run_command("--markdown")
    assert done.returncode == 0, done.stderr
    in_docs = gpu_changes.docs_block(gpu_changes.DOCS.read_text())
    assert in_docs == done.stdout.strip(), "docs/gpu.md is stale: paste `python bench/gpu_changes.py --markdown`"
    assert "unchanged: none" in in_docs  # every kernel changed since the 2026-11-27 run
