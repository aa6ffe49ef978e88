"""The digest at the end of summary.txt: what bench/gpu_first_look.sh found, stage by stage.

    python bench/first_look_summary.py [--call first|second|grids] OUT

Reads what the stages left in OUT, finished or cut off. First call: what changed since the last GPU run
(facts.json), the selftest's JSON lines (selftest.jsonl), pytest's junit file (or, when pytest was killed
before writing it, its -v log), the probe's rows, the e2e rows side by side. --second: pytest. --grids: the
benchmark grids' rows and the e2e sweep. Prints pass/fail/skip counts per op and backend, every failure (the
CPU-side work list), the probe's rows as one line each (microseconds and % of bench/_bound.py's bound), and per
e2e setting tokens/s with the measured speed-up beside Leviathan's prediction.
"""

import argparse
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
BOUNDS = ("pct_bound", "pct_nominal", "pct_tc")
CHECKS = ("exact", "ok", "id_agreement")


def probe_digest(path: Path) -> list[str]:
    rows = json_lines(path)
    if not rows:
        return [f"probe: no rows ({path.name} {'empty' if path.is_file() else 'missing'})"]
    lines = ["probe (microseconds; % of the row's bound; exact/ok = equal to the reference):"]
    for row in rows:
        section = row.get("section")
        if section == "facts":
            lines.append(f"  {row.get('device')}: copy bandwidth {row.get('copy_bandwidth_GBps')} GB/s (read + write; "
                         "pct_bound = bytes the op must move / time / this)")
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


def changes_digest(path: Path) -> list[str]:
    """What facts.json says changed since the newest committed GPU results."""
    try:
        changes = json.loads(path.read_text()).get("changes") or {}
    except (OSError, json.JSONDecodeError):
        return [f"changes: {path.name} missing or unreadable"]
    lines = [f"changes since {changes.get('since') or 'no committed GPU results (every kernel counts as changed)'}:"]
    new = changes.get("new") or []
    for key, keys in (("new (never on a GPU)", new), ("changed", [k for k in changes.get("changed") or [] if k not in new]),
                      ("unchanged (a control sample)", changes.get("unchanged") or []),
                      ("shared sources changed", changes.get("shared_changed") or [])):
        lines.append(f"  {key}: {', '.join(keys) or '-'}")
    return lines


E2E_KEY = ("pair", "noise", "batch", "mode")


def e2e_digest(path: Path) -> list[str]:
    """Per (pair, noise, batch, mode): tokens/s of every method, ours_spec's measured speed-up over ours_plain
    beside Leviathan's prediction, and over HF's greedy, dynamic and static-cache compiled (HF's cost does not
    depend on the noise, so a pair's HF rows at another level stand in where a level has none); failed and
    timed-out rows after."""
    rows = json_lines(path)
    if not rows:
        return [f"e2e: no rows ({path.name} {'empty' if path.is_file() else 'missing'})"]
    ok = [r for r in rows if r.get("status") == "ok" and "method" in r]

    def hf(method, pair, noise, batch):
        same = [r for r in ok if (r["method"], r.get("pair"), r.get("batch"), r.get("mode")) ==
                (method, pair, batch, "greedy")]
        return next((r for r in same if r.get("noise") == noise), same[0] if same else None)

    lines = ["e2e (tokens/s; ours_spec: measured speed-up over ours_plain vs Leviathan's prediction, then over HF):"]
    for pair, noise, batch, mode in dict.fromkeys(tuple(r.get(k) for k in E2E_KEY) for r in ok
                                                  if not r["method"].startswith("hf_")):
        mine = {r["method"]: r for r in ok if tuple(r.get(k) for k in E2E_KEY) == (pair, noise, batch, mode)}
        parts = [f"{method.replace('ours_', '')} {mine[method]['tok_s']}" for method in ("ours_plain", "ours_spec")
                 if method in mine]
        spec = mine.get("ours_spec", {})
        if "speedup_vs_plain" in spec:
            parts.append(f"spec/plain {spec['speedup_vs_plain']}x vs theory {spec.get('theory_speedup')}x "
                         f"(alpha {spec.get('alpha')}, c {spec.get('c')})")
        if "ours_spec_tree" in mine:
            tree = mine["ours_spec_tree"]
            parts.append(f"tree {tree.get('tree')} {tree['tok_s']} ({tree.get('mean_accepted')} tokens/forward, "
                         f"{tree.get('vs_chain')}x the chain's)")
        for method in ("hf_dynamic", "hf_static"):
            other = hf(method, pair, noise, batch)
            if other:
                ratio = f", spec {spec['tok_s'] / other['tok_s']:.2f}x" if spec.get("tok_s") else ""
                parts.append(f"{method} greedy {other['tok_s']}{ratio}")
        if "matches_hf_greedy" in spec:
            parts.append(f"greedy == HF greedy: {spec['matches_hf_greedy']}")
        lines.append(f"  {pair} noise={noise} B={batch} {mode}: " + "; ".join(parts))
    for row in rows:
        if row.get("status") != "ok":
            label = " ".join(f"{k}={row[k]}" for k in ("method", "pair", "noise", "batch", "mode", "tree") if k in row)
            lines.append(f"  {str(row.get('status')).upper()} {label}: {str(row.get('error', ''))[:200]}")
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--call", choices=("first", "second", "grids"), default=None,
                        help="which call left OUT (default: told by the files in it)")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out
    call = args.call or ("grids" if any((out / f"{name}.jsonl").is_file() for name in GRIDS) else
                         "first" if (out / "selftest.jsonl").is_file() or (out / "probe.jsonl").is_file() else "second")
    lines = ["", "== digest"]
    if call == "grids":
        for name in GRIDS:
            lines += grid_digest(name, out / f"{name}.jsonl")
        lines += e2e_digest(out / "e2e.jsonl")
    elif call == "second":
        lines += pytest_digest(out / "pytest_gpu.xml", out / "pytest_gpu.log")
    else:
        lines += changes_digest(out / "facts.json")
        lines += selftest_digest("selftest (changed ops, then the control sample and the engine)",
                                 out / "selftest.jsonl")
        lines += pytest_digest(out / "pytest_gpu.xml", out / "pytest_gpu.log")
        lines += probe_digest(out / "probe.jsonl")
        lines += e2e_digest(out / "e2e.jsonl")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
