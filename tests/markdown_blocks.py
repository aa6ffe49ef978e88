"""Running the code blocks of markdown files as pasted, on a CPU machine (tests/test_readme.py, tests/test_docs.py).

- Each ```python block runs in its own fresh interpreter, in an empty temporary folder: it must be
  self-contained (its own imports, tiny models or the embedded defaults, the device picked by itself).
- Each command of a ```bash block runs through bash, with `python` and `specdec-kernels` meaning this
  checkout's, in a temporary folder holding copies of bench/ and python/ (a command written for the
  checkout's root, `python bench/NAME.py --smoke`, runs as pasted and writes nothing into the checkout),
  except the commands a test lists as skipped (each with why) and the few it runs with smaller settings
  (each with why).
- A block that is not meant to run is fenced ```text (or a bare ```); any other fence language is an
  error, so a block cannot slip past by being fenced ```py or ```sh.

A test module gives its files and its lists (SKIPPED, SMALLER, EXPECTED_EXIT; keys are the commands as the
file has them, without a trailing comment) to `Checks` and turns its methods into tests; an entry that
matches no command of its files fails, so the lists cannot go stale.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RUN_LANGS = {"python", "bash"}
NOT_RUN_LANGS = {"text", ""}
TIMEOUT_S = 180


def without_comment(command: str) -> str:
    """The command without a trailing `# ...` comment (on its first line), the key of the lists."""
    first, *rest = command.split("\n")
    for match in re.finditer(r"\s#", first):
        before = first[:match.start()]
        if before.count("'") % 2 == 0 and before.count('"') % 2 == 0:  # the # is outside quotes
            first = before.rstrip()
            break
    return "\n".join([first, *rest])


def blocks(path: Path) -> list[tuple[str, int, str]]:
    """(fence language, line number, text) of every fenced block in a markdown file."""
    text = path.read_text()
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


def run_python(code: str, tmp_path: Path) -> None:
    script = tmp_path / "markdown_block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, report(done)


@dataclass
class Checks:
    """The code blocks of `files` and how their commands are run (see the module's docstring)."""
    files: list
    skipped: dict = field(default_factory=dict)        # command -> why it is not run here
    smaller: dict = field(default_factory=dict)        # command -> (the command run instead, why)
    expected_exit: dict = field(default_factory=dict)  # command -> its exit status on a machine without a GPU

    def name(self, path: Path) -> str:
        return str(path.relative_to(ROOT))

    def all_blocks(self):
        return [(path, lang, line, code) for path in self.files for lang, line, code in blocks(path)]

    def python_params(self):
        return [pytest.param(code, id=f"{self.name(path)}:{line}")
                for path, lang, line, code in self.all_blocks() if lang == "python"]

    def command_params(self):
        return [pytest.param(cmd, id=f"{self.name(path)}:{line}:{cmd.split('#')[0].strip()[:50]}")
                for path, lang, line, code in self.all_blocks() if lang == "bash" for cmd in bash_commands(code)]

    def check_fences(self):
        for path, lang, line, _ in self.all_blocks():
            assert lang in RUN_LANGS | NOT_RUN_LANGS, (
                f"{self.name(path)} line {line}: a ```{lang} block; fence code ```python or ```bash (run by the "
                "tests) or ```text (not run)")

    def check_lists(self, test_file: str):
        commands = {without_comment(param.values[0]) for param in self.command_params()}
        stale = [cmd for cmd in [*self.skipped, *self.smaller, *self.expected_exit] if cmd not in commands]
        assert not stale, f"no longer in {[self.name(p) for p in self.files]} (update the lists in {test_file}): {stale}"

    def run_command(self, command: str, tmp_path: Path) -> None:
        key = without_comment(command)
        if key in self.skipped:
            pytest.skip(f"not run here: {self.skipped[key]}")
        expected = self.expected_exit.get(key, 0)
        if expected and torch.cuda.is_available():
            pytest.skip("exits with an error only on a machine without a GPU; on a GPU the gpu checks run it")
        run = self.smaller[key][0] if key in self.smaller else command
        for folder in ("bench", "python"):
            shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
        py = shlex.quote(sys.executable)
        prelude = (f'python() {{ {py} "$@"; }}\npython3() {{ {py} "$@"; }}\n'
                   f'specdec-kernels() {{ {py} -m specdec_kernels "$@"; }}\nset -o pipefail\n')
        done = subprocess.run(["bash", "-c", prelude + run], cwd=tmp_path, env=environment(), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        assert done.returncode == expected, report(done)
