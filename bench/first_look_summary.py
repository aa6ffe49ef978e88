"""The digest at the end of summary.txt: what bench/gpu_first_look.sh found, stage by stage.

    python bench/first_look_summary.py OUT

Reads what the stages left in OUT, finished or cut off: the selftest's JSON lines (cuda_ops.jsonl,
engine.jsonl), pytest's junit file (or, when pytest was killed before writing it, its -v log), the
probe's rows; after --second, the benchmark grids' rows. Prints pass/fail/skip counts per op and backend, every failure (the CPU-side work
list), and the probe's rows as one line each: microseconds and % of the row's bound.
"""

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

MAX_LISTED = 25  # failures listed per stage; the files have the rest


def json_lines(path: Path) -> list[dict]:
    """The file's complete JSON lines (a line cut off mid-write by a kill is dropped)."""
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def selftest_digest(name: str, path: Path) -> list[str]:
    checks = [row for row in json_lines(path) if "status" in row]
    if not checks:
        return [f"{name}: no checks recorded ({path.name} {'empty' if path.is_file() else 'missing'})"]
    cells = Counter((row["op"], row["backend"], row["status"]) for row in checks)
    keys = sorted({(op, backend) for op, backend, _ in cells})
    total = Counter(row["status"] for row in checks)
    lines = [f"{name}: {total['pass']} passed, {total['fail']} failed, {total['skip']} skipped"]
    for op, backend in keys:
        lines.append(f"  {op} [{backend}]: {cells[(op, backend, 'pass')]} pass, {cells[(op, backend, 'fail')]} fail, "
                     f"{cells[(op, backend, 'skip')]} skip")
    failures = [row for row in checks if row["status"] == "fail"]
    for row in failures[:MAX_LISTED]:
        lines.append(f"  FAIL {row['op']} [{row['backend']}] {row['case']} {row['dtype']}: {row['message'][:300]}")
    if len(failures) > MAX_LISTED:
        lines.append(f"  ... {len(failures) - MAX_LISTED} more failures in {path.name}")
    return lines


def pytest_digest(xml_path: Path, log_path: Path) -> list[str]:
    if xml_path.is_file():
        try:
            root = ET.parse(xml_path).getroot()
        except ET.ParseError as error:
            return [f"pytest: {xml_path.name} unreadable ({error})"]
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        count = Counter()
        failed = []
        for suite in suites:
            for key in ("tests", "failures", "errors", "skipped"):
                count[key] += int(suite.get(key, 0))
            for case in suite.iter("testcase"):
                problem = case.find("failure")
                if problem is None:
                    problem = case.find("error")
                if problem is not None:
                    message = (problem.get("message") or "").splitlines()[0][:240] if problem.get("message") else ""
                    failed.append(f"  FAIL {case.get('classname')}::{case.get('name')}: {message}")
        passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
        lines = [f"pytest -m gpu: {passed} passed, {count['failures']} failed, {count['errors']} errors, "
                 f"{count['skipped']} skipped (junit)"]
        lines += failed[:MAX_LISTED]
        if len(failed) > MAX_LISTED:
            lines.append(f"  ... {len(failed) - MAX_LISTED} more in {xml_path.name}")
        return lines
    if not log_path.is_file():
        return ["pytest -m gpu: no log (the stage did not start)"]
    # killed before the junit file: count the -v lines it printed
    text = log_path.read_text(errors="replace")
    outcomes = Counter(re.findall(r" (PASSED|FAILED|SKIPPED|ERROR)\b", text))
    lines = [f"pytest -m gpu: cut off before its junit file; the log shows {outcomes['PASSED']} passed, "
             f"{outcomes['FAILED']} failed, {outcomes['ERROR']} errors, {outcomes['SKIPPED']} skipped"]
    failed = sorted(set(re.findall(r"(\S+::\S+) FAILED", text)))
    lines += [f"  FAIL {name}" for name in failed[:MAX_LISTED]]
    return lines


LABELS = ("op", "impl", "method", "backend", "B", "g", "V", "P", "N", "L", "H", "graphs")
TIMES = ("us", "us_per_step")
BOUNDS = ("pct_min_bytes", "pct_hbm", "pct_copy", "pct_copy_bw", "pct_tc")
CHECKS = ("exact", "ok", "id_agreement")


def probe_digest(path: Path) -> list[str]:
    rows = json_lines(path)
    if not rows:
        return [f"probe: no rows ({path.name} {'empty' if path.is_file() else 'missing'})"]
    lines = ["probe (microseconds; % of the row's bound; exact/ok = equal to the reference):"]
    for row in rows:
        section = row.get("section")
        if section == "facts":
            lines.append(f"  {row.get('device')}: copy bandwidth {row.get('copy_bandwidth_GBps')} GB/s")
            continue
        if section == "done":
            lines.append(f"  done in {row.get('seconds')} s")
            continue
        label = " ".join(f"{key}={row[key]}" for key in LABELS if key in row)
        parts = [f"{key}={row[key]}" for key in (*TIMES, *BOUNDS, *CHECKS) if row.get(key) is not None]
        for key in ("error", "skipped"):
            if key in row:
                parts.append(f"{key.upper()}: {row[key]}")
        lines.append(f"  {section}: {label}: {', '.join(parts)}")
    return lines


GRIDS = ("verify", "tree_attention", "kv_compact", "early_exit_topk")  # --second's benchmark grids


def grid_digest(name: str, path: Path) -> list[str]:
    """A grid's row count and every row that disagreed with the reference or failed."""
    rows = json_lines(path)
    bad = [row for row in rows if row.get("exact") is False or row.get("ok") is False or "error" in row]
    lines = [f"{name}: {len(rows)} rows, {len(bad)} not equal to the reference or failed"]
    for row in bad[:MAX_LISTED]:
        label = " ".join(f"{key}={row[key]}" for key in (*LABELS, "regime", "tree", "layout", "dtype") if key in row)
        lines.append(f"  BAD {label}: {row.get('error') or row.get('max_err') or 'not exact'}")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python bench/first_look_summary.py OUT")
    out = Path(argv[0])
    lines = ["", "== digest"]
    if any((out / f"{name}.jsonl").is_file() for name in GRIDS):  # --second
        for name in GRIDS:
            lines += grid_digest(name, out / f"{name}.jsonl")
    else:
        lines += selftest_digest("cuda_ops (selftest, CUDA kernels)", out / "cuda_ops.jsonl")
        lines += selftest_digest("engine (selftest, every strategy)", out / "engine.jsonl")
        lines += pytest_digest(out / "pytest_gpu.xml", out / "pytest_gpu.log")
        lines += probe_digest(out / "probe.jsonl")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
