"""`specdec-kernels generate`, `info`, `bench` and `--version`, in process on the tiny untrained default set:
text and readable statistics for every strategy, --check against the target's own greedy generate, --option,
reproducible seeded sampling, JSON, no transformers deprecation warnings, and every bad input answered by
one line naming the argument, exit status 1, no traceback."""

import io
import json
import os
import pathlib
import subprocess
import sys
import time
import warnings

import pytest
import torch

from default_models_support import save_tiny_default_models
import specdec_kernels
from specdec_kernels import cli
from specdec_kernels.cli_progress import Progress
from specdec_kernels import demo
from test_demo import user_checkpoint

# every strategy of the table that runs on the default models (mtp needs a target with MTP layers: test_decoding_mtp)
STRATEGIES = tuple(s.name for s in demo.strategies())


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    return save_tiny_default_models(tmp_path_factory.mktemp("tiny_default_models"))


def generate(tiny_set, tmp_path, *args) -> dict:
    out = tmp_path / "generate.json"
    status = cli.main(["generate", "--models", str(tiny_set), "--max-new-tokens", "6", "--json", str(out),
                       *map(str, args)])
    result = json.loads(out.read_text())
    result["status"] = status
    return result


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_prints_text_and_statistics_identical_to_greedy(tiny_set, tmp_path, capsys, strategy):
    result = generate(tiny_set, tmp_path, "--strategy", strategy, "--prompt", "def f(a, b):\n    return",
                      "--prompt", "x = 1\n", "--check")
    assert result["status"] == 0 and result["stats"]["identical_to_target_generate"] is True
    assert result["prompts"] == ["def f(a, b):\n    return", "x = 1\n"] and len(result["completions"]) == 2
    stats = result["stats"]
    assert stats["strategy"] == strategy and 0 < stats["tokens"] <= 12 and stats["target_forwards"] > 0
    printed = capsys.readouterr().out
    assert printed.startswith("def f(a, b):\n    return" + result["completions"][0])
    assert f"\nstrategy {strategy}" in printed and "identical to the target's greedy generate: yes" in printed
    assert "{" not in printed.split("-" * 40)[-1]  # statistics as labelled lines, no raw dict (PPD's theory)


def test_option_overrides_the_strategy_keyword(tiny_set, tmp_path):
    result = generate(tiny_set, tmp_path, "--prompt", "import os", "--option", "num_draft_tokens=2")
    assert result["stats"]["options"] == {"draft_model": "LlamaForCausalLM", "num_draft_tokens": 2}
    lossy = generate(tiny_set, tmp_path, "--strategy", "bild", "--prompt", "import os", "--option", "rollback_rule=nll",
                     "--option", "fallback_threshold=0.9")
    assert lossy["stats"]["options"]["rollback_rule"] == "nll" and lossy["stats"]["options"]["fallback_threshold"] == 0.9


def test_seeded_sampling_is_reproducible(tiny_set, tmp_path):
    args = ("--prompt", "class A:", "--do-sample", "--temperature", "0.9", "--top-p", "0.95")
    first = generate(tiny_set, tmp_path, *args, "--seed", 7)
    assert generate(tiny_set, tmp_path, *args, "--seed", 7)["completions"] == first["completions"]


@pytest.mark.parametrize("flags, named", [(["--temperature", "0.5"], "--temperature applies"),
                                          (["--top-k", "5", "--top-p", "0.9"], "--top-k, --top-p apply"),
                                          (["--seed", "3"], "--seed applies")])
def test_sampling_flags_without_do_sample_warn_and_decode_greedily(tiny_set, tmp_path, capsys, flags, named):
    """As `generate` and HF's GenerationConfig: one warning line, and the greedy tokens."""
    greedy = generate(tiny_set, tmp_path, "--prompt", "import os", "--check")
    capsys.readouterr()
    result = generate(tiny_set, tmp_path, "--prompt", "import os", "--check", *flags)
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == [f"specdec-kernels generate: warning: {named} to sampling and greedy decoding ignores it: "
                      "add --do-sample"]
    assert result["status"] == 0 and result["completions"] == greedy["completions"]
    assert result["stats"]["identical_to_target_generate"] is True


def test_target_alone_runs_plain_and_refuses_draft_strategies(tiny_set, tmp_path):
    target = user_checkpoint(tiny_set, tmp_path)
    assert cli.main(["generate", "--target", str(target), "--strategy", "plain", "--prompt", "x", "--max-new-tokens",
                     "3", "--check"]) == 0
    with pytest.raises(SystemExit, match="strategy speculative needs a draft model \\(--draft PATH\\)"):
        cli.main(["generate", "--target", str(target), "--prompt", "x"])


def cli_error(args: list[str]) -> str:
    """Run the CLI in process as the interpreter would: a SystemExit carrying a message prints it to stderr
    and exits with status 1; anything else escaping main() would be a traceback, failing the test."""
    with pytest.raises(SystemExit) as error:
        cli.main(args)
    message = error.value.code
    assert isinstance(message, str), f"exit status {message!r}, expected a message (status 1)"
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("args, message", [
    (["--option", "nonsense"], "--option 'nonsense': expected NAME=VALUE"),
    (["--option", "nonsense=1"], "--option nonsense=1: strategy speculative has no option 'nonsense'; its options: "
                                 "draft_model, num_draft_tokens, schedule, max_draft_tokens, lenience"),
    (["--strategy", "ppd", "--option", "num_draft_tokens=2"], "--option num_draft_tokens=2: strategy ppd has no "
                                                              "option 'num_draft_tokens'; its options: exit_layer, k"),
    (["--option", "num_draft_tokens=0"], "`num_draft_tokens` must be"),  # the library's message, prefixed once
    (["--strategy", "ppd", "--do-sample"], "do_sample=True is not supported"),
    (["--check", "--do-sample"], "--check compares with greedy decoding"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--device", "banana"], "--device banana: expected cpu, cuda or cuda:N"),
    (["--device", "cpu:1"], "--device cpu:1: the CPU takes no index"),
    (["--device", "mps"], "--device mps: expected cpu, cuda or cuda:N"),
    (["--threads", "0"], "--threads 0: expected a positive number"),
    (["--strategy", "mtp"], "strategy mtp needs a target whose config has num_mtp_layers"),
    # the tiny target has 1,024 positions; a rotary model would decode past them without a word
    (["--max-new-tokens", "1024"], "the longest prompt (1 tokens) + max_new_tokens (1024) = 1025 positions exceeds "
                                   "the target model's 1024 (config.max_position_embeddings)"),
])
def test_bad_generate_arguments_fail_with_one_line(tiny_set, args, message):
    text = cli_error(["generate", "--models", str(tiny_set), "--prompt", "x", *args])
    assert text.startswith("specdec-kernels generate: ") and message in text
    assert not text.startswith("specdec-kernels generate: generate:")  # one prefix, not the library's too


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_device_without_cuda_fails_with_one_line(tiny_set):
    assert "--device cuda:1: CUDA is not available here" in cli_error(
        ["generate", "--models", str(tiny_set), "--prompt", "x", "--device", "cuda:1"])


def test_user_folders_that_cannot_load_fail_with_one_line(tiny_set, tmp_path):
    no_tokenizer = cli_error(["generate", "--target", str(tiny_set / "target"), "--strategy", "plain",
                              "--prompt", "x"])  # weights only: the tokenizer lives in the set's own folder
    assert no_tokenizer.startswith(f"specdec-kernels generate: --target {tiny_set / 'target'}: no tokenizer in it")
    no_model = cli_error(["generate", "--target", str(tiny_set / "tokenizer"), "--strategy", "plain", "--prompt", "x"])
    assert "not an HF model folder (no config.json" in no_model
    target = user_checkpoint(tiny_set, tmp_path)
    assert "--draft /nonexistent: no such folder" in cli_error(
        ["generate", "--target", str(target), "--draft", "/nonexistent", "--prompt", "x"])


def test_a_bad_argument_exits_with_status_1_and_no_traceback(tiny_set):
    done = subprocess.run([sys.executable, "-m", "specdec_kernels", "generate", "--models", str(tiny_set),
                           "--prompt", "x", "--device", "banana"], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 1 and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last == "specdec-kernels generate: --device banana: expected cpu, cuda or cuda:N"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_deprecation_warnings_from_our_use_of_transformers(tiny_set, tmp_path, strategy):
    """transformers renamed the cache keyword (past_key_values -> cache): passing the old one printed a
    FutureWarning on every run. --check runs HF's own generate too."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate(tiny_set, tmp_path, "--strategy", strategy, "--prompt", "import os", "--check")
    deprecations = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
                    if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert deprecations == []


def test_threads_are_set_and_reported(tiny_set, tmp_path, capsys):
    before = torch.get_num_threads()
    try:
        result = generate(tiny_set, tmp_path, "--strategy", "plain", "--prompt", "x", "--threads", "1")
        assert result["meta"]["threads"] == torch.get_num_threads() == 1
        assert "(1 thread, --threads;" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_default_threads_leave_half_the_cores_free():
    from specdec_kernels.cli_machine import default_threads
    assert [default_threads(cores) for cores in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 4, 4]


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_only_after_the_delay_and_erases_itself():
    terminal = FakeTerminal()
    with Progress("decoding", stream=terminal, delay=0.0, interval=0.01):
        time.sleep(0.1)
    text = terminal.getvalue()
    assert text.startswith("\rdecoding: 0 s") and text.endswith("\r\033[K")
    quick = FakeTerminal()
    with Progress("decoding", stream=quick, delay=5.0):
        pass
    assert quick.getvalue() == ""  # a short call shows nothing


def test_progress_in_a_log_is_one_line():
    log = io.StringIO()
    with Progress("decoding", stream=log, delay=0.0, interval=0.01):
        time.sleep(0.05)
    assert log.getvalue() == "decoding: still running after 0 s ...\n"


def test_version_and_info(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"specdec-kernels {specdec_kernels.__version__}"
    assert cli.main(["info"]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert summary[0].startswith(f"specdec-kernels {specdec_kernels.__version__} (torch ") and len(summary) <= 6
    import transformers
    assert f"transformers {transformers.__version__})" in summary[0]  # what docs/install.md says it names
    assert any(line.startswith('backend="auto" picks: ') for line in summary)
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(specdec_kernels.build_info()))


FAKE_BENCH = """import argparse, pathlib
parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--smoke", action="store_true")
out = pathlib.Path(parser.parse_args().out)
out.mkdir(parents=True, exist_ok=True)
(out / "fake.json").write_text("{}")
(out / "fake.md").write_text("# fake")
"""


@pytest.mark.parametrize("where", ["bench option", "script option", "default", "smoke default"])
def test_bench_says_where_it_wrote_its_files(tmp_path, capfd, monkeypatch, where):
    """Results go where --out says, else to bench/results; a --smoke run without --out goes to a new temporary
    folder, never into the checkout's results."""
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    (bench_dir / "bench_fake.py").write_text(FAKE_BENCH)
    out = tmp_path / "chosen"
    args = {"bench option": ["--out", str(out), "fake", "--smoke"],
            "script option": ["fake", "--smoke", "--out", str(out)], "default": ["fake"],
            "smoke default": ["fake", "--smoke"]}[where]
    monkeypatch.chdir(tmp_path)
    if where == "default":
        out = tmp_path / "bench" / "results"
    assert cli.main(["bench", "--bench-dir", str(bench_dir), *args]) == 0
    said = capfd.readouterr().err
    if where == "smoke default":
        assert not (tmp_path / "bench" / "results").exists()
        out = pathlib.Path(said.split(" in ")[-1].strip())
        assert out.name.startswith("specdec-bench-smoke-") and not out.is_relative_to(tmp_path)
    assert sorted(path.name for path in out.iterdir()) == ["fake.json", "fake.md"]
    assert f"specdec-kernels bench: wrote fake.json, fake.md in {out.resolve()}" in said


def test_bench_runs_a_source_checkout_script_and_names_the_choices(capfd, tmp_path):
    assert cli.main(["bench", "verify", "--help"]) == 0
    assert "usage: bench_verify.py" in capfd.readouterr().out
    with pytest.raises(SystemExit, match="unknown benchmark 'nothing'; available: .*tree_attention.*e2e"):
        cli.main(["bench", "nothing"])
    with pytest.raises(SystemExit, match="no benchmark scripts in .*: they ship with the source tree"):
        cli.main(["bench", "--bench-dir", str(tmp_path), "verify"])


def test_prompt_from_standard_input(tiny_set):
    done = subprocess.run([sys.executable, "-m", "specdec_kernels", "generate", "--models", str(tiny_set), "--strategy",
                           "plain", "--max-new-tokens", "3"], input="while True:", capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("while True:") and "\nstrategy plain: 3 new tokens in " in done.stdout
    assert "still running" not in done.stdout  # progress, if any, goes to stderr
