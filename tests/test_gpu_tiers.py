"""The GPU tests' tiers (tests/catalog_support.py): `pytest -m gpu` collects the quick tier unless told
`--gpu-tier full`; the quick tier's estimated wall on an H100 machine with 12 workers stays within ~3 minutes
(bench/gpu_test_budget.py, from the 2026-11-27 run's per-test seconds); a focus gives the changed kernels the
tier's cases and every other kernel a control sample. Collected here, never run (no GPU)."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import catalog_support
from specdec_kernels.selftest.tiers import CONTROL, SELFTEST_QUICK, spread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_test_budget  # noqa: E402

QUICK_WALL_S = 180  # "fits ~3 minutes on 12 workers"


def collect(*options: str) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"]
    env = {k: v for k, v in os.environ.items()  # what this run was given must not choose the collected tier
           if k not in (catalog_support.TIER_VARIABLE, catalog_support.FOCUS_VARIABLE, "PYTEST_ADDOPTS")}
    done = subprocess.run([*command, *options], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def tiers():
    return {"default": collect(), "full": collect("--gpu-tier", "full")}


def catalog_counts(ids: list[str]) -> Counter:
    """(op, backend) -> catalog tests, from ids like tests/x.py::test_catalog_case[op[case]-dtype-backend]."""
    counts = Counter()
    for node in ids:
        if "::test_catalog_case[" in node:
            inner = node.split("::test_catalog_case[", 1)[1]
            counts[(inner.split("[", 1)[0], inner.rsplit("-", 1)[1].rstrip("]"))] += 1
    return counts


def test_the_default_is_the_quick_tier_and_the_full_catalog_needs_the_switch(tiers):
    default, full = catalog_counts(tiers["default"]), catalog_counts(tiers["full"])
    assert set(default) == set(full) and len(full) >= 20  # every op on each of its GPU backends, in both tiers
    assert all(n <= catalog_support.QUICK_CASES_PER_OP for n in default.values())
    assert sum(full.values()) > 3 * sum(default.values())
    every = [case for family in catalog_support.selftest.CASE_FAMILIES for case in family("full", torch.device("cpu"))]
    per_op = Counter(case.op for case in every)
    assert all(full[(op, backend)] == per_op[op] for op, backend in full)  # full: every case of "full"
    non_catalog = [node for node in tiers["default"] if "::test_catalog_case[" not in node]
    assert non_catalog == [node for node in tiers["full"] if "::test_catalog_case[" not in node]


def test_the_quick_tier_fits_three_minutes_on_twelve_workers(tiers):
    """The estimate of bench/gpu_test_budget.py (per-file seconds per test of the 978-tests-in-131-s H100 run)."""
    per_file, mean, busy = gpu_test_budget.reference_rates()
    assert 7 < busy < 12 and 0.5 < mean < 2  # 1061 test-seconds in 131 s on 12 workers; ~1.08 s per test
    amortised = gpu_test_budget.reference_rates(amortised=True)[0]
    files = Counter(node.split("::")[0] for node in tiers["default"])
    full_files = Counter(node.split("::")[0] for node in tiers["full"])
    for rates in (per_file, amortised):  # mean seconds per test; or compiles once per file + the median per test
        quick = gpu_test_budget.estimate(files, rates, mean, busy, 12)
        assert quick["wall_s"] <= QUICK_WALL_S, quick
        assert gpu_test_budget.estimate(full_files, rates, mean, busy, 12)["wall_s"] > 2 * quick["wall_s"]


def test_the_estimate_is_count_times_rate_over_the_busy_workers():
    counts = Counter({"tests/a.py": 10, "tests/new.py": 4})
    result = gpu_test_budget.estimate(counts, {"tests/a.py": 2.0}, 0.5, 6.0, 12)  # new.py: the run's mean
    assert result["test_seconds"] == 22.0 and result["busy_workers"] == 6.0
    assert result["wall_s"] == pytest.approx(3.7, abs=0.05)
    assert gpu_test_budget.estimate(counts, {"tests/a.py": 2.0}, 0.5, 6.0, 6)["wall_s"] == pytest.approx(7.3, abs=0.05)
    amortised = gpu_test_budget.estimate(counts, {"tests/a.py": (5.0, 1.0)}, 0.5, 6.0, 12)  # 5 s of compiles + 1/test
    assert amortised["test_seconds"] == 17.0
    with pytest.raises(ValueError, match="^workers must be"):
        gpu_test_budget.estimate(counts, {}, 0.5, 6.0, 0)


def test_a_focus_gives_the_other_kernels_a_control_sample(monkeypatch):
    monkeypatch.setenv(catalog_support.FOCUS_VARIABLE, "block_verify/triton,kv_compact")
    monkeypatch.delenv(catalog_support.TIER_VARIABLE, raising=False)
    picked = Counter((param.values[0].op, param.values[1]) for param in catalog_support.gpu_catalog(
        "cpu", ("block_verify", "kv_compact")))
    assert picked[("block_verify", "triton")] == catalog_support.QUICK_CASES_PER_OP
    assert picked[("block_verify", "cuda")] == CONTROL
    assert picked[("kv_compact", "triton")] == picked[("kv_compact", "cuda")] > CONTROL  # an op alone: both backends
    monkeypatch.setenv(catalog_support.FOCUS_VARIABLE, "")  # nothing changed: a control sample of everything
    assert len(catalog_support.gpu_catalog("cpu", ("block_verify",))) == 2 * CONTROL


def test_an_unknown_tier_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(catalog_support.TIER_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"^SPECDEC_GPU_TIER \(--gpu-tier\) must be one of quick, full \(got 'fast'\)"):
        catalog_support.gpu_catalog("cpu", ("kv_compact",))


def test_spread_takes_evenly_spaced_cases_first_and_last_included():
    cases = list(range(10))
    assert spread(cases, 4) == [0, 3, 6, 9]
    assert spread(cases, 2) == [0, 9] and spread(cases, 1) == [0]
    assert spread(cases, 10) == cases and spread(cases, 50) == cases and spread(cases, None) == cases
    assert len(spread(list(range(322)), SELFTEST_QUICK)) == SELFTEST_QUICK
    with pytest.raises(ValueError, match="^limit must be at least 1"):
        spread(cases, 0)
