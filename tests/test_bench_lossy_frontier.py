"""bench/lossy_frontier.py's smoke mode (what CI runs): it decodes its tiny grid on held-out text and writes
JSON, markdown and a plot whose numbers hold together, and the lossless points give greedy's tokens."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_writes_a_consistent_report(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/lossy_frontier.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "lossy_frontier_cpu.json").read_text())
    meta, rows = report["meta"], report["rows"]
    assert meta["command"] == f"python bench/lossy_frontier.py --smoke --out {tmp_path}" and meta["date"]
    assert meta["device"] and meta["threads"] == 1 and meta["prompts"] == 2 and meta["new_tokens"] == 12
    assert meta["held_out"]["files"] == ["shlex.py", "fnmatch.py", "glob.py", "colorsys.py"]
    by_name = {row["point"]: row for row in rows}
    # the smoke grid: plain, one speculative chain, SpecDec lossless + one lossy, BiLD exact + one NLL point per mode
    assert set(by_name) == {"plain", "speculative g=4", "specdec beta=1", "specdec beta=3 tau=1",
                            "bild paper fb=0.2 exact", "bild paper fb=0.2 rb=2",
                            "bild official fb=0.2 exact", "bild official fb=0.2 rb=2"}
    plain = by_name["plain"]
    assert plain["speedup"] == 1.0 and plain["forwards_per_token"] == 1.0 and plain["rouge_l_greedy"] == 1.0
    for row in rows:
        assert row["stable_outputs"]  # greedy fp32: every round gives the first round's tokens
        assert len(row["tokens_per_s_rounds"]) == 2 and row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
        assert 0 < row["forwards_per_token"] <= 1.0 and 0.0 <= row["rouge_l_greedy"] <= 1.0
        if row["lossless"]:  # speculative, SpecDec beta=1 and BiLD's exact rule reproduce greedy
            assert row["identical_to_greedy"] == 1.0 and row["rouge_l_greedy"] == 1.0
            assert row["nll"] == plain["nll"] and row["nll_minus_greedy"] == 0.0
    assert by_name["speculative g=4"]["forwards_per_token"] < 1.0  # drafts were accepted
    assert meta["targets"]["lossless_identical_to_greedy"]["met"] and meta["targets"]["bild_exact"]["met"]
    assert set(meta["frontiers"]) == {"bild", "specdec"}
    for family, fronts in meta["frontiers"].items():
        for names in fronts.values():
            assert names and all(by_name[n]["family"] == family for n in names)
    md = (tmp_path / "lossy_frontier_cpu.md").read_text()
    assert "## Targets (issue 41)" in md and "## bild: frontier of" in md and "| point | lossless |" in md
    assert (tmp_path / "lossy_frontier_cpu.png").stat().st_size > 10_000
