"""The install's own lines reach the user's terminal under plain `pip install` (pip shows a build's output only
with -v): setup.py's log() also writes to the terminal device when its stderr is not one."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_setup():
    spec = importlib.util.spec_from_file_location("specdec_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # `setup(...)` runs only under __main__
    return module


def test_a_build_line_reaches_the_terminal_when_stderr_is_captured(tmp_path, capsys):
    setup = load_setup()
    terminal = tmp_path / "tty"
    terminal.write_text("")
    setup.TTY = str(terminal)
    assert not sys.stderr.isatty()  # pytest captures it, as pip does
    setup.log("nvcc not found: installing the Python-only package.")
    line = "[specdec-kernels] nvcc not found: installing the Python-only package.\n"
    assert terminal.read_text() == line and capsys.readouterr().err == line


def test_no_terminal_is_no_error(tmp_path):
    setup = load_setup()
    setup.TTY = str(tmp_path / "missing" / "tty")  # opening it fails, as /dev/tty does without a terminal
    setup.log("a line")
