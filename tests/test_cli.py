"""`specdec-kernels generate` and `specdec-kernels bench`, in process on the tiny untrained default set:
text and statistics for every strategy, --check against the target's own greedy generate, --option,
reproducible seeded sampling, JSON, and clear errors."""

import json
import os
import subprocess
import sys

import pytest

from default_models_support import save_tiny_default_models
from specdec_kernels import cli
from test_demo import user_checkpoint

STRATEGIES = ("plain", "speculative", "specdec", "bild", "ppd")


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
    assert f"strategy={strategy} " in printed and "identical_to_target_generate=True" in printed


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


def test_target_alone_runs_plain_and_refuses_draft_strategies(tiny_set, tmp_path):
    target = user_checkpoint(tiny_set, tmp_path)
    assert cli.main(["generate", "--target", str(target), "--strategy", "plain", "--prompt", "x", "--max-new-tokens",
                     "3", "--check"]) == 0
    with pytest.raises(SystemExit, match="strategy speculative needs a draft model \\(--draft PATH\\)"):
        cli.main(["generate", "--target", str(target), "--prompt", "x"])


@pytest.mark.parametrize("args, message", [
    (["--option", "nonsense"], "--option 'nonsense': expected NAME=VALUE"),
    (["--option", "bogus=1"], "unexpected keyword argument 'bogus'"),
    (["--strategy", "ppd", "--do-sample"], "do_sample=True is not supported"),
    (["--check", "--do-sample"], "--check compares with greedy decoding"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
])
def test_bad_generate_arguments_fail_clearly(tiny_set, args, message):
    with pytest.raises(SystemExit, match="^specdec-kernels generate: .*" + message.replace("(", "\\(").replace(")", "\\)")):
        cli.main(["generate", "--models", str(tiny_set), "--prompt", "x", *args])


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
    assert done.stdout.startswith("while True:") and "strategy=plain tokens=3" in done.stdout
