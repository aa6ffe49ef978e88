"""The benchmark's smoke mode and the examples run and produce what they promise."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Without the interpreter a CPU has no Triton backend: the smoke grid then times the naive and torch rows in 3 s
# instead of 140 s of interpreted kernels whose exactness the Triton files test; the first look's grids dry run
# (tests/test_gpu_first_look.py) takes the bench's Triton rows through the interpreter.
NO_INTERPRETER = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def test_verify_bench_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/bench_verify.py"), "--smoke", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True, env=NO_INTERPRETER)
    result = json.loads((tmp_path / "verify.json").read_text())
    rows = result["rows"]
    assert {row["op"] for row in rows} == {"rejection_sample", "greedy_verify", "rejection_sample_logits",
                                           "relaxed_verify", "bild_verify", "max_prob", "tree_greedy_verify",
                                           "tree_rejection_sample", "block_verify", "block_verify_logits",
                                           "tree_rejection_sample_wr"}
    assert {row["backend"] for row in rows} >= {"naive", "torch"}
    assert all(row.get("exact", True) for row in rows)  # every non-reference backend matched the reference
    by_regime = {(row["op"], row["regime"]): row["mean_accepted"] for row in rows if row["backend"] == "torch"}
    assert by_regime[("rejection_sample", "reject0")] == 0
    assert by_regime[("tree_rejection_sample", "reject0")] == 0
    assert by_regime[("tree_rejection_sample_wr", "reject0")] == 0
    assert by_regime[("block_verify", "reject0")] == 0
    assert by_regime[("block_verify", "acceptall")] >= 1  # p == q: every draft kept
    assert by_regime[("greedy_verify", "acceptall")] >= 1
    assert "| op | B | g |" in (tmp_path / "verify.md").read_text()


def test_kv_compact_bench_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/bench_kv_compact.py"), "--smoke", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "kv_compact.json").read_text())
    rows = result["rows"]
    assert {row["backend"] for row in rows} >= {"index_select", "torch"}
    assert all(row.get("exact", True) for row in rows)  # every backend left the caches as the reference did
    assert any(row["moved_MB"] > 0 for row in rows) and {row["layout"] for row in rows} >= {"stacked"}
    assert result["meta"]["command"].startswith("python ") and result["meta"]["date"]
    assert "| B | N | layers |" in (tmp_path / "kv_compact.md").read_text()


def test_kv_compact_pytest_benchmark_suite_runs_one_case():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "bench/test_bench_kv_compact.py"), "--benchmark-disable", "-k",
                           "B3-N8 and stacked and index_select"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_pytest_benchmark_suite_collects_and_runs_one_case():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "bench"),
                           "--benchmark-disable", "-k", "rejection_sample-B1-g1-V50-natural and torch and not tree and not logits"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_tree_attention_bench_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/bench_tree_attention.py"), "--smoke", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "tree_attention.json").read_text())
    rows = result["rows"]
    assert {"date", "device", "command", "torch", "triton"} <= set(result["meta"])
    assert {row["impl"] for row in rows} >= {"torch", "sdpa", "flex"}
    assert {(row["tree"], row["layout"], row["prefix"]) for row in rows} == {
        (t, lay, p) for t in ("chain", "tree") for lay in ("contiguous", "paged") for p in ("uniform", "ragged")}
    assert all(row["ok"] and row["us"] > 0 for row in rows)  # every implementation passed the correctness gate
    assert not any(row["impl"] in ("sdpa", "flex") and row["layout"] == "paged" for row in rows)
    assert "| B | P | N |" in (tmp_path / "tree_attention.md").read_text()


def test_tree_attention_bench_writes_each_row_as_it_goes(tmp_path, monkeypatch):
    """Rows reach OUT/tree_attention.jsonl while the run goes on, and a run stopped part-way (Ctrl-C, or
    `timeout`'s SIGTERM) still writes its report of the rows so far."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_tree_attention as bta

    seen = []  # rows on disk when each case starts
    real = bta.measure

    def measure(case, impls, *args, **kwargs):
        path = tmp_path / "tree_attention.jsonl"
        seen.append(len(path.read_text().splitlines()))
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real(case, impls, *args, **kwargs)

    monkeypatch.setattr(bta, "measure", measure)
    assert bta.main(["--smoke", "--impls", "torch", "sdpa", "--out", str(tmp_path)]) == 130
    first_case_rows = 2  # torch and sdpa on the first (contiguous) case
    assert seen == [0, first_case_rows, first_case_rows + 1]  # the second case is paged: torch only
    rows = json.loads((tmp_path / "tree_attention.json").read_text())["rows"]
    assert len(rows) == seen[-1] and "| B | P | N |" in (tmp_path / "tree_attention.md").read_text()


def test_specdec_sweep_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/sweep_specdec.py"), "--smoke", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "sweep_specdec.json").read_text())
    rows = result["rows"]
    assert {(row["beta"], row["tau"]) for row in rows} == {(1, 0.0), (3, 1.0), (5, 3.0), (5, 5.0)}
    assert all(row["tok_per_iter"] >= 1 and row["speedup"] > 0 for row in rows)
    assert all(row["identical_to_greedy"] == 1.0 for row in rows if row["lossless"])  # beta=1 is exact
    assert all(len(row["per_position_acceptance"]) == row["k"] for row in rows)
    assert "| k | beta | tau |" in (tmp_path / "sweep_specdec.md").read_text()


def test_ops_example_runs():
    done = subprocess.run([sys.executable, str(ROOT / "python/ops_as_backend.py")], check=True, capture_output=True,
                          text=True)
    assert "greedy   accepted" in done.stdout and "sampling accepted" in done.stdout


def test_cli_info_prints_build_info():
    done = subprocess.run([sys.executable, "-m", "specdec_kernels", "info", "--json"], check=True,
                          capture_output=True, text=True)
    info = json.loads(done.stdout)
    assert info["version"] and "greedy_verify" in info["auto_backends"]


def test_hf_tree_verify_example_runs():
    done = subprocess.run([sys.executable, str(ROOT / "python/hf_tree_verify.py")], check=True, capture_output=True,
                          text=True)
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert lines["accepted drafts per row"].split("accepted nodes")[0].strip() == "[2, 2]"  # the oracle branch
    assert lines["emitted tokens"].strip() == lines["greedy tokens "].strip()  # tree verify == greedy decoding


def test_generate_speculative_example_runs():
    done = subprocess.run([sys.executable, str(ROOT / "python/generate_speculative.py"), "--max-new-tokens", "12"],
                          check=True, capture_output=True, text=True)
    assert "speculative == target greedy: True" in done.stdout
    assert "bild == target greedy: True" in done.stdout


def test_early_exit_topk_bench_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench/bench_early_exit_topk.py"), "--smoke", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "early_exit_topk.json").read_text())
    rows = result["rows"]
    assert {row["backend"] for row in rows} >= {"baseline"}
    assert all(row["id_agreement"] >= 0.9 for row in rows)  # near-ties may differ, nothing else
    assert all("speedup" in row for row in rows if row["backend"] != "baseline")
    assert result["meta"]["command"].startswith("python ") and result["meta"]["k"] == 8
    assert "| B | H | V |" in (tmp_path / "early_exit_topk.md").read_text()


def test_early_exit_topk_pytest_benchmark_suite_runs_one_case():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "bench/test_bench_early_exit_topk.py"), "--benchmark-disable", "-k",
                           "B3-H64-V200 and baseline"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_hf_hook_overhead_bench_runs(tmp_path):
    """bench/hf_hook_overhead.py: both ways give the same tokens (it asserts so) and the report is written."""
    subprocess.run([sys.executable, str(ROOT / "bench/hf_hook_overhead.py"), "--rounds", "2", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    rows = json.loads((tmp_path / "hf_hook_overhead_cpu.json").read_text())["rows"]
    assert [(r["batch"], r["max_new_tokens"]) for r in rows] == [(1, 1), (1, 48), (4, 1), (4, 48)]
    assert all(r["direct_ms"] > 0 and r["hook_ms"] > 0 for r in rows)


def test_drafters_bench_smoke(tmp_path):
    """bench/drafters.py: a row per method, batch size and mode (skipped ones with their reason), and every greedy
    row of ours that ran equals HF greedy of its prompt decoded alone."""
    done = subprocess.run([sys.executable, str(ROOT / "bench/drafters.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "drafters_cpu.json").read_text())
    rows = result["rows"]
    methods = {"hf greedy", "draft model chain", "draft model tree", "specdec", "lookup", "eagle chain", "eagle tree",
               "hf assisted"}
    assert {(row["batch"], row["mode"], row["method"]) for row in rows} == {
        (b, mode, m) for b in (1, 2) for mode in ("greedy", "sample") for m in methods}
    ran = [row for row in rows if row["status"] == "ok"]
    assert {row["method"] for row in ran} >= methods - {"eagle chain", "eagle tree"}  # eagle: only with a head
    ours = [row for row in ran if row["mode"] == "greedy" and not row["method"].startswith("hf ")]
    assert ours and all(row["identical_to_greedy"] is True for row in ours)
    assert all(row["status"] == "greedy only" for row in rows if row["method"] == "specdec" and row["mode"] == "sample")
    assert all(row["status"] == "batch 1 only" for row in rows if row["method"] == "hf assisted" and row["batch"] > 1)
    assert len(result["meta"]["targets"]) == 3 and "## Targets" in (tmp_path / "drafters_cpu.md").read_text()
