"""No undefined name anywhere in the package, the tests, the benchmarks or the examples.

Most GPU code paths (tests marked gpu, the selftest's GPU branches, launchers only a GPU reaches)
never run in CPU CI, so a typo or a lost import there would first fail on a scarce GPU. pyflakes
reads every file statically; this fails on any undefined name it finds (a mutation that deletes an
import a GPU-only test uses makes it fail)."""

from pathlib import Path

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api")
from pyflakes import messages  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("specdec_kernels", "tests", "bench", "python")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class Collector:
    """The pyflakes reporter interface, keeping the messages instead of printing them."""

    def __init__(self):
        self.found = []

    def flake(self, message):
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")


def undefined_names(paths) -> list[str]:
    collector = Collector()
    for path in paths:
        pyflakes_api.checkPath(str(path), collector)
    return collector.found


def test_no_undefined_names():
    paths = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))
    assert len(paths) > 100
    found = undefined_names(paths)
    assert not found, "\n".join(found)


def test_a_lost_import_is_caught(tmp_path):
    source = tmp_path / "gpu_only.py"
    source.write_text("def check():\n    return nan_to_neg_inf(1.0)\n")
    assert any("nan_to_neg_inf" in line for line in undefined_names([source]))
