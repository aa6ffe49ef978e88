"""`specdec-kernels demo` runs end to end (in a subprocess, on the tiny untrained default set) and says
what it promises: every strategy, the table, exactness against greedy, JSON, clear errors."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from default_models_support import save_tiny_default_models
from specdec_kernels import cli
from specdec_kernels import demo as demo_module
from specdec_kernels.defaults import default_models_available

# every row but plain's (its label differs): each strategy of the table, its tree form after its chain
STRATEGIES = tuple(label for label in demo_module.rows() if label != "plain")
PLAIN = "plain (our engine, no draft)"  # the demo's label of strategy "plain"
TABLE_HEADER = "| strategy | tokens/s | speedup vs greedy | mean accepted tokens per target forward | acceptance rate"


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    return save_tiny_default_models(tmp_path_factory.mktemp("tiny_default_models"))


def demo(*args, check=True):
    # one thread: tiny models gain nothing from more, and a shared CI machine's spinning threads cost seconds
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "specdec_kernels", "demo", *map(str, args)],
                          capture_output=True, text=True, env=env)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def table_rows(stdout: str) -> dict:
    """strategy label -> its table cells."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and not line.startswith("| strategy"):
            rows[cells[0]] = cells
    return rows


def test_demo_on_a_models_folder_prints_every_strategy_identical_to_greedy(tiny_set, tmp_path):
    out = tmp_path / "demo.json"
    done = demo("--models", tiny_set, "--max-new-tokens", 8, "--repeats", 2, "--json", out)
    assert done.stdout.startswith("device: CPU") and "(1 thread, OMP_NUM_THREADS;" in done.stdout.splitlines()[0]
    assert "2 timed pass(es)" in done.stdout and "spread of tokens/s over 2 passes" in done.stdout
    assert TABLE_HEADER in done.stdout
    for name in STRATEGIES:
        assert f"== {name}  identical to greedy: yes" in done.stdout
    rows = table_rows(done.stdout)
    assert f"== {PLAIN}  identical to greedy: yes" in done.stdout
    assert set(rows) == {"greedy (HF generate)", PLAIN, *STRATEGIES}
    assert all(cells[5] == "yes" for cells in rows.values())

    result = json.loads(out.read_text())
    assert result["meta"]["max_new_tokens"] == 8 and result["meta"]["batch_size"] == 1
    assert result["meta"]["repeats"] == 2 and result["meta"]["threads"] == 1
    by_name = {row["strategy"]: row for row in result["rows"]}
    assert list(by_name) == ["greedy", "plain", *STRATEGIES]
    for row in by_name.values():
        assert {"tokens_per_s", "speedup", "mean_accepted_tokens", "acceptance_rate", "identical_to_greedy",
                "first_call_s", "sample"} <= set(row)
        assert row["identical_to_greedy"] is True and row["tokens"] == 8 * 3  # three built-in prompts
        assert row["tokens_per_s"] > 0 and row["first_call_s"] > 0
        assert len(row["tokens_per_s_passes"]) == len(row["speedup_passes"]) == 2  # one per timed pass
        assert min(row["tokens_per_s_passes"]) <= row["tokens_per_s"] <= max(row["tokens_per_s_passes"])
        assert row["noisy"] == (row["spread"] > demo_module.NOISY)
    assert by_name["greedy"]["speedup_passes"] == [1.0, 1.0]
    assert by_name["greedy"]["speedup"] == 1.0 and by_name["greedy"]["acceptance_rate"] is None
    assert by_name["plain"]["mean_accepted_tokens"] == 1.0 and by_name["plain"]["acceptance_rate"] is None
    for name in STRATEGIES:
        assert 1.0 <= by_name[name]["mean_accepted_tokens"] and 0.0 <= by_name[name]["acceptance_rate"] <= 1.0
    assert by_name["ppd"]["options"]["exit_layer"] == 2  # the tiny set has trained-layout heads at 2 and 3


def user_checkpoint(tiny_set, tmp_path):
    """The tiny target as a user's own checkpoint: the tokenizer lives beside the weights."""
    target = shutil.copytree(tiny_set / "target", tmp_path / "target")
    shutil.copytree(tiny_set / "tokenizer", target, dirs_exist_ok=True)
    return target


def test_demo_on_user_target_and_draft_with_mixed_prompts_in_a_batch(tiny_set, tmp_path):
    out = tmp_path / "demo.json"
    done = demo("--target", user_checkpoint(tiny_set, tmp_path), "--draft", tiny_set / "draft", "--specdec-drafter",
                tiny_set / "specdec_drafter", "--eagle-head", tiny_set / "eagle3", "--max-new-tokens", 4,
                "--batch-size", 3,
                "--prompt", "x = 1\n", "--prompt", "def f(a, b):\n    return", "--repeats", 1, "--json", out)
    for name in STRATEGIES:
        assert f"== {name}  identical to greedy: yes" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 11 and all(row["tokens"] == 4 * 3 for row in rows)  # 2 prompts cycled to 3 rows, left-padded


def test_user_pair_without_drafter_skips_specdec_and_uses_head_n(tiny_set, tmp_path):
    args = argparse.Namespace(models=None, target=str(user_checkpoint(tiny_set, tmp_path)),
                              draft=str(tiny_set / "draft"), specdec_drafter=None)
    pair = demo_module.load_pair(args, torch.device("cpu"), torch.float32)
    # every row but those needing a drafter or a head
    assert set(pair.options) == set(demo_module.rows()) - {"specdec", "eagle", "eagle tree"}
    assert pair.options["ppd"]["head"] == "N"
    assert "--specdec-drafter" in pair.skipped["specdec"] and "--eagle-head" in pair.skipped["eagle"]


def test_demo_bad_path_exits_non_zero_with_a_clear_message():
    done = demo("--models", "/nonexistent/models", check=False)
    assert done.returncode != 0
    assert "specdec-kernels demo: --models /nonexistent/models: no such folder" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--target", "/nonexistent/target", "--draft", "/nonexistent/draft"], "--target /nonexistent/target: no such folder"),
    (["--target", "/nonexistent/target"], "--target and --draft go together"),
    (["--max-new-tokens", "0"], "--max-new-tokens and --batch-size must be at least 1"),
    (["--repeats", "0"], "--repeats 0: expected at least 1 timed pass"),
    (["--device", "banana"], "--device banana: expected cpu, cuda or cuda:N"),
    (["--device", "cpu:1"], "--device cpu:1: the CPU takes no index"),
    (["--threads", "-2"], "--threads -2: expected a positive number of threads"),
])
def test_demo_bad_arguments_fail_clearly(args, message):
    with pytest.raises(SystemExit) as error:
        cli.main(["demo", *args])
    assert str(error.value).startswith(f"specdec-kernels demo: {message}")  # SystemExit(str): printed, status 1


def test_table_shows_the_median_the_range_and_flags_a_noisy_method():
    def row(name, rates, speedups):
        return {"strategy": name, "tokens_per_s": sorted(rates)[1], "tokens_per_s_passes": rates,
                "speedup": sorted(speedups)[1], "speedup_passes": speedups, "spread": demo_module.spread(rates),
                "noisy": demo_module.spread(rates) > demo_module.NOISY, "mean_accepted_tokens": 1.0,
                "acceptance_rate": None, "identical_to_greedy": True, "first_call_s": 0.1}
    steady = row("greedy", [100.0, 104.0, 98.0], [1.0, 1.0, 1.0])
    noisy = row("ppd", [60.0, 150.0, 58.0], [0.6, 1.5, 0.59])
    assert steady["spread"] == pytest.approx(0.06) and noisy["spread"] == pytest.approx(1.53, abs=0.01)
    cells = table_rows(demo_module.format_table([steady, noisy]))
    assert cells["greedy (HF generate)"][1:3] == ["100.0", "1.00x (1.00-1.00)"] and cells["greedy (HF generate)"][7] == "6%"
    assert cells["ppd"][1:3] == ["60.0", "0.60x (0.59-1.50)"] and cells["ppd"][7] == "153% noisy"


def test_demo_on_a_folder_that_is_not_a_set_names_the_missing_parts(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path} lacks tokenizer, target, draft"):
        cli.main(["demo", "--models", str(tmp_path)])


def test_plain_demo_on_the_embedded_set():
    if not default_models_available():
        pytest.skip("the embedded default models (specdec_kernels/default_models/) are not in this checkout")
    script = shutil.which("specdec-kernels")  # the installed console script, as a new user runs it
    command = [script] if script else [sys.executable, "-m", "specdec_kernels"]
    done = subprocess.run([*command, "demo"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in STRATEGIES:
        assert f"== {name}  identical to greedy: yes" in done.stdout
    assert TABLE_HEADER in done.stdout
