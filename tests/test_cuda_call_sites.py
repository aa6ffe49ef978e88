"""Every call into `_C` from Python names a function the built module has, with the number of
arguments (and the keyword names) its binding takes.

The CUDA launchers (specdec_kernels/cuda/), the GPU tests and the selftest reach most `_C` functions
only on a GPU, so a renamed binding or an argument added on one side only would first fail there.
This reads each call site (`_C.f(...)`, `lib.f(...)`, `library().f(...)`) with `ast` and checks it
against the pybind11 signature of the built module, on the CPU."""

import ast
from pathlib import Path

import pytest

from specdec_kernels.common import cuda_module

_C = cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None, reason="specdec_kernels._C is not built here")

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("specdec_kernels", "tests", "bench", "python")
MODULE_NAMES = {"_C", "lib"}  # how the code names the loaded module (plus library())


def _split_top_level(text: str) -> list[str]:
    """Split a pybind11 parameter list on the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def signature(name: str) -> list[str] | None:
    """Parameter names of `_C.name` from its pybind11 docstring; None for overloaded functions."""
    first = (getattr(_C, name).__doc__ or "").splitlines()[0]
    if not first.startswith(name + "("):
        return None
    inside = first[len(name) + 1:first.rindex(") ->")]
    return [part.split(":")[0].strip() for part in _split_top_level(inside)]


def _is_module(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in MODULE_NAMES
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "library"


def call_sites(path: Path):
    """(line, function name, positional count or None when *args, keyword names) per `_C` call."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_module(node.func.value):
            name = node.func.attr
            if name.startswith("_"):
                continue
            starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
            yield node.lineno, name, None if starred else len(node.args), [k.arg for k in node.keywords if k.arg]


def mismatches(paths) -> list[str]:
    found = []
    for path in paths:
        for line, name, positional, keywords in call_sites(path):
            where = f"{path.relative_to(ROOT)}:{line}: _C.{name}"
            if not hasattr(_C, name):
                found.append(f"{where}: no such function in the built module")
                continue
            params = signature(name)
            if params is None or positional is None:
                continue
            if positional + len(keywords) != len(params):
                found.append(f"{where}: {positional + len(keywords)} arguments, the binding takes {len(params)}")
            unknown = [k for k in keywords if k not in params[positional:]]
            if unknown:
                found.append(f"{where}: keyword(s) {unknown} not among {params[positional:]}")
    return found


def test_every_call_matches_a_binding():
    paths = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))
    sites = [s for p in paths for s in call_sites(p)]
    assert len({name for _, name, _, _ in sites}) > 20  # the launchers, plans and host builds are all seen
    found = mismatches(paths)
    assert not found, "\n".join(found)


def test_a_wrong_call_is_caught(tmp_path):
    source = tmp_path / "launcher.py"
    source.write_text("def f(lib):\n    lib.greedy_verify(1, 2)\n    lib.greedy_verify_bytes(1)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = mismatches([source])
    finally:
        ROOT = saved
    assert any("greedy_verify: 2 arguments" in line for line in found), found
    assert any("greedy_verify_bytes: no such function" in line for line in found), found
