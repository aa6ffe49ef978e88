"""bench/e2e.py --smoke (CI): the end-to-end comparison runs on the CPU, records HF's failures as rows,
and its derived columns follow from its measured ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from default_models_support import save_tiny_default_models

ROOT = Path(__file__).resolve().parents[1]


def leviathan(alpha: float, gamma: int, c: float) -> float:
    """Theorem 8 of Leviathan et al., written out again here (not imported from the bench)."""
    expected_tokens = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens / (gamma * c + 1)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    models = save_tiny_default_models(root / "models")
    done = subprocess.run([sys.executable, str(ROOT / "bench/e2e.py"), "--smoke", "--models", str(models),
                           "--out", str(root / "out")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / "out"


def test_writes_json_markdown_and_plots(smoke):
    result = json.loads((smoke / "e2e.json").read_text())
    assert {"date", "device", "command", "torch", "max_new_tokens"} <= set(result["meta"])
    assert result["meta"]["command"].startswith("python ") and "--smoke" in result["meta"]["command"]
    assert "| pair | noise | batch | mode | method |" in (smoke / "e2e.md").read_text()
    for name in ("e2e_speedup.png", "e2e_tokens.png"):
        assert (smoke / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_method_on_every_pair_and_batch(smoke):
    rows = json.loads((smoke / "e2e.json").read_text())["rows"]
    methods = {"hf_dynamic", "hf_static", "hf_assisted", "ours_spec", "ours_hf_hook", "ours_plain", "ours_plain_draft"}
    for pair in ("synthetic", "default"):
        for batch in (1, 2):
            assert {r["method"] for r in rows if r["pair"] == pair and r["batch"] == batch} == methods
    assert {r["noise"] for r in rows if r["pair"] == "synthetic"} == {0.0, 0.3}
    assert {r["mode"] for r in rows if r["method"] == "ours_spec"} == {"greedy", "sampling"}
    # everything but HF assisted generation at batch > 1 runs; each ok row has a positive speed
    for row in rows:
        if row["method"] == "hf_assisted" and row["batch"] > 1:
            continue
        assert row["status"] == "ok", row
        assert row["tok_s"] > 0 and row["first_call_s"] > 0 and row["second_call_s"] > 0


def test_the_hf_hook_rows_equal_ours_and_report_their_overhead(smoke):
    """target.generate(custom_generate=...) beside the direct call: HF's greedy output, the same
    tokens per forward, and its overhead from paired rounds."""
    rows = json.loads((smoke / "e2e.json").read_text())["rows"]
    hooks = [r for r in rows if r["method"] == "ours_hf_hook"]
    assert len(hooks) == 12  # every ours_spec row: 3 pairs x batch {1, 2} x {greedy, sampling}
    for hook in hooks:
        key = {k: hook.get(k) for k in ("pair", "noise", "batch", "mode", "gamma", "graphs")}
        spec, = [r for r in rows if r["method"] == "ours_spec" and all(r.get(k) == v for k, v in key.items())]
        assert hook["status"] == "ok" and hook["mean_accepted"] == spec["mean_accepted"]
        assert hook["hook_overhead"] > -1 and ".." in hook["hook_overhead_range"]
        if hook["mode"] == "greedy":
            assert hook["matches_hf_greedy"] is True


def test_hf_assisted_generation_above_batch_1_is_a_recorded_failure(smoke):
    rows = json.loads((smoke / "e2e.json").read_text())["rows"]
    assisted = [r for r in rows if r["method"] == "hf_assisted"]
    assert {r["status"] for r in assisted if r["batch"] == 1} == {"ok"}
    above = [r for r in assisted if r["batch"] > 1]
    assert above and all(r["status"] == "failed" and "batch" in r["error"] for r in above)
    assert all("tok_s" not in r for r in above)


def test_our_greedy_equals_hf_greedy(smoke):
    rows = json.loads((smoke / "e2e.json").read_text())["rows"]
    greedy = [r for r in rows if r["method"] == "ours_spec" and r["mode"] == "greedy"]
    assert len(greedy) == 6  # (synthetic at 2 noise levels + default) x batch {1, 2}
    assert all(r["matches_hf_greedy"] is True for r in greedy)
    assert not any("matches_hf_greedy" in r for r in rows if r["mode"] == "sampling")


def test_noise_controls_acceptance(smoke):
    rows = json.loads((smoke / "e2e.json").read_text())["rows"]
    alpha = {(r["noise"], r["batch"]): r["alpha"] for r in rows
             if r["pair"] == "synthetic" and r["method"] == "ours_spec" and r["mode"] == "greedy"}
    for batch in (1, 2):
        assert alpha[(0.0, batch)] == 1.0  # the extra layers add exact zeros: the target is the draft
        assert alpha[(0.3, batch)] < 0.95


def test_theory_columns_follow_the_formula(smoke):
    rows = json.loads((smoke / "e2e.json").read_text())["rows"]
    spec = [r for r in rows if r["method"] == "ours_spec"]
    assert spec and all("theory_speedup" in r for r in spec)
    for row in spec:
        # alpha and c are stored rounded to 4 digits, the theory from the unrounded values
        assert row["theory_speedup"] == pytest.approx(leviathan(row["alpha"], row["gamma"], row["c"]), rel=2e-3)
        assert row["measured_over_theory"] == pytest.approx(row["speedup_vs_plain"] / row["theory_speedup"],
                                                            rel=5e-3)
        assert 0 <= row["acceptance_rate"] <= row["alpha"] <= 1
        assert 1 <= row["mean_accepted"] <= row["gamma"] + 1
    plain = {(r["pair"], r.get("noise"), r["batch"], r["method"]): r["tok_s"] for r in rows
             if r["method"] in ("ours_plain", "ours_plain_draft")}
    for row in spec:  # c = draft time per token / target time per token of the same plain loop
        key = (row["pair"], row.get("noise"), row["batch"])
        assert row["c"] == pytest.approx(plain[(*key, "ours_plain")] / plain[(*key, "ours_plain_draft")], rel=2e-2)
