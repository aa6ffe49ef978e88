"""How long `pytest -m gpu` should take on an H100 machine with 12 xdist workers: an estimate made without a GPU.

Basis: the one measured run, bench/results/gpu_checks_h100_2026-11-27/call1_selftest_pytest/pytest_gpu.xml
(`pytest -m gpu -n 12` on an H100 with 16 cores, beside the selftest: 982 tests, 978 passed, 131 s of wall;
the junit file holds every test's seconds). For each test file, the mean seconds per test of that run (a file
that did not exist then: the mean over every test of the run); the selection `pytest --collect-only` gives now
costs the sum of count x mean over its files, and runs at the rate of that run: 1061 test-seconds in 131 s of
wall is 8.1 of the 12 workers busy on average (xdist's start, the uneven tail, Triton compiles). That estimate
is high where a file now has more tests than then: most of a file's seconds then were the Triton JIT of its
first calls, which more tests share. A second, "amortised" estimate reads each file's seconds then as a fixed
part (its sum minus count x its median: the compiles) plus its median per test. The default tier
(tests/catalog_support.py) is sized by the first; neither says anything a GPU run does not say better.

    python bench/gpu_test_budget.py                         # the default tier (quick)
    python bench/gpu_test_budget.py --gpu-tier full         # the whole catalog
    python bench/gpu_test_budget.py --gpu-focus block_verify,tree_rejection_sample/triton --json
"""

import argparse
import json
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "bench/results/gpu_checks_h100_2026-11-27/call1_selftest_pytest/pytest_gpu.xml"
REFERENCE_WORKERS = 12  # `pytest -m gpu -n 12` (its README and pytest_gpu.log: "created: 12/12 workers")


def reference_rates(path: Path = REFERENCE, *, amortised: bool = False) -> tuple[dict, float, float]:
    """({test file: mean seconds per test}, mean seconds over every test, busy workers = test-seconds / wall)
    of a junit file written by `pytest -n REFERENCE_WORKERS`; amortised: {test file: (fixed seconds, median
    seconds per test)} in place of the means."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else next(root.iter("testsuite"))
    seconds: dict[str, list[float]] = {}
    for case in suite.iter("testcase"):
        module = case.get("classname") or ""
        if module.startswith("tests."):  # "" is a module skipped at collection
            seconds.setdefault(module.replace(".", "/") + ".py", []).append(float(case.get("time", 0)))
    total = sum(sum(times) for times in seconds.values())
    count = sum(len(times) for times in seconds.values())
    if amortised:
        rates = {name: (sum(times) - len(times) * statistics.median(times), statistics.median(times))
                 for name, times in seconds.items()}
    else:
        rates = {name: sum(times) / len(times) for name, times in seconds.items()}
    return rates, total / count, total / float(suite.get("time"))


def collected(tier: str | None, focus: str | None) -> Counter:
    """Tests per file that `pytest -m gpu` selects now (collected, not run)."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"]
    command += ["--gpu-tier", tier] if tier else []
    command += ["--gpu-focus", focus] if focus is not None else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"gpu_test_budget: collection failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return Counter(line.split("::")[0] for line in done.stdout.splitlines() if "::" in line)


def estimate(counts: Counter, per_file: dict, mean: float, busy: float, workers: int) -> dict:
    """The selection's test-seconds at the reference's rates and its wall on `workers` workers. per_file: {file:
    mean seconds per test} or {file: (fixed seconds, seconds per test)}; a file not in it costs `mean` per test."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1 (got {workers})")
    rates = {name: rate if isinstance(rate, tuple) else (0.0, rate) for name, rate in per_file.items()}
    files = {name: {"tests": n, "s_per_test": round(rates.get(name, (0.0, mean))[1], 3),
                    "test_s": round(rates.get(name, (0.0, 0.0))[0] + n * rates.get(name, (0.0, mean))[1], 1),
                    "measured_then": name in rates}
             for name, n in sorted(counts.items())}
    test_seconds = sum(row["test_s"] for row in files.values())
    busy_here = busy * workers / REFERENCE_WORKERS  # the same share of the workers busy
    return {"tests": sum(counts.values()), "test_seconds": round(test_seconds, 1), "workers": workers,
            "busy_workers": round(busy_here, 2), "wall_s": round(test_seconds / busy_here, 1), "files": files}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-tier", choices=("quick", "full"), default=None, help="default: pytest's (quick)")
    parser.add_argument("--gpu-focus", default=None, help="as pytest's --gpu-focus")
    parser.add_argument("--workers", type=int, default=REFERENCE_WORKERS, help="xdist workers (default 12)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1 (got {args.workers})")
    per_file, mean, busy = reference_rates()
    counts = collected(args.gpu_tier, args.gpu_focus)
    result = estimate(counts, per_file, mean, busy, args.workers)
    amortised = estimate(counts, reference_rates(amortised=True)[0], mean, busy, args.workers)
    result["wall_s_amortised"] = amortised["wall_s"]
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for name, row in result["files"].items():
        basis = "its mean then" if row["measured_then"] else "new file: the run's mean"
        print(f"{name:45s} {row['tests']:5d} tests x {row['s_per_test']:.3f} s ({basis}) = {row['test_s']:7.1f} s")
    print(f"{result['tests']} tests, {result['test_seconds']} test-seconds / {result['busy_workers']} busy workers "
          f"(of {result['workers']}) = ~{result['wall_s']:.0f} s of wall; amortised: ~{amortised['wall_s']:.0f} s "
          f"(estimates, basis: {REFERENCE.name} of 2026-11-27)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
