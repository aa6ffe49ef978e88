"""What one kernel is, for the record of what a GPU verified: its source files and their fingerprint.

A kernel is one op on one GPU backend (triton, cuda). Its sources are the module that registers it and the
modules of its own package that module imports (relative imports, followed, also inside functions); for cuda
also csrc/<launcher>.cu and csrc/bind_<launcher>.cpp of each launcher module it reaches, with their
`#include "..."` closure, where a reached header brings the file that implements it (launch_plan.h brings
launch_plans.cpp: the plan decides what a launch runs).

The fingerprint hashes each file's code, not its text: comments, docstrings, blank lines, trailing spaces
(and, in C++, indentation) are dropped, and so are the names of our own imported modules and included files,
since their code is in the closure too. The file hashes are sorted, paths left out. So renaming a file or
editing a comment leaves a fingerprint alone, and any code change moves it. Standard library only: setup.py
runs this file to bake the csrc hashes into `_C` (`_C.source_identity()`), and bench/ runs it on git's files.
"""

import ast
import hashlib
import io
import re
import tokenize
from pathlib import PurePosixPath
from typing import Callable, Iterable

# read(path) -> the file's text, or None where it does not exist; paths are relative to the checkout
Reader = Callable[[str], "str | None"]

C_LIKE = (".cu", ".cuh", ".cpp", ".h", ".hpp", ".cc")
_RELATIVE_IMPORT = re.compile(r"^(\s*from \.)\w+(\s+import\b)")
_OWN_INCLUDE = re.compile(r'^#\s*include\s*"[^"]*"')
_INCLUDED = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


# ------------------------------------------------------------------ a file's code

def _docstring_lines(tree: ast.AST, lines: list[str]) -> set[int]:
    """1-based numbers of the lines that hold nothing but a module, class or function docstring."""
    drop = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            continue
        before = lines[first.lineno - 1][:first.col_offset]
        after = lines[first.end_lineno - 1][first.end_col_offset:]
        if not before.strip() and (not after.strip() or after.strip().startswith("#")):  # alone on its lines
            drop.update(range(first.lineno, first.end_lineno + 1))
    return drop


def python_code(text: str) -> str:
    """The Python file's code: no comments, docstrings, blank lines or trailing spaces; `from .name import`
    without the module's name (its code is in the closure)."""
    lines = text.splitlines()
    drop = _docstring_lines(ast.parse(text), lines)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    kept = (_RELATIVE_IMPORT.sub(r"\1\2", line.rstrip()) for number, line in enumerate(lines, 1)
            if number not in drop)
    return "\n".join(line for line in kept if line.strip())


def _strip_c_comments(text: str) -> str:
    """C/C++/CUDA text without // and /* */ comments (string and character literals kept as they are)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 2 if text.startswith("\\\n", i) else 1  # a line comment continued by a backslash
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end) or " ")  # keeps tokens apart and lines where they were
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def c_code(text: str) -> str:
    """The C++/CUDA file's code: no comments, blank lines or surrounding spaces; `#include "file"` without
    the file's name (its code is in the closure)."""
    lines = (line.strip() for line in _strip_c_comments(text).splitlines())
    return "\n".join(_OWN_INCLUDE.sub('#include ""', line) for line in lines if line)


def code_of(path: str, text: str) -> str:
    return c_code(text) if PurePosixPath(path).suffix in C_LIKE else python_code(text)


def file_hash(path: str, text: str) -> str:
    """sha256 of the file's code (its path only picks the language)."""
    return hashlib.sha256(code_of(path, text).encode()).hexdigest()


def fingerprint(file_hashes: Iterable[str]) -> str:
    """A kernel's fingerprint: its files' code hashes, sorted (no paths), hashed; 16 hex digits."""
    return hashlib.sha256("\n".join(sorted(file_hashes)).encode()).hexdigest()[:16]


# ------------------------------------------------------------------ a kernel's files

def relative_imports(text: str) -> list[str]:
    """The modules of its own package a Python file imports: `from .x import`, `from . import x, y`."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found += [node.module] if node.module else [alias.name for alias in node.names]
    return found


def python_closure(path: str, read: Reader) -> set[str]:
    """path and every module of its package it imports, followed (relative imports only)."""
    folder = path.rsplit("/", 1)[0]
    seen, todo = set(), [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        text = read(current)
        if text is None:  # `from . import name` of a name that is no module
            continue
        seen.add(current)
        todo += [f"{folder}/{name.split('.')[0]}.py" for name in relative_imports(text)]
    return seen


def includes_of(read: Reader) -> Callable[[str], "list[str] | None"]:
    """includes(path) -> the csrc files that file's `#include "..."` lines name (None: no such file)."""
    def includes(path: str) -> list[str] | None:
        text = read(path)
        return None if text is None else [f"csrc/{name}" for name in _INCLUDED.findall(text)]
    return includes


def implementations(header: str) -> tuple[str, ...]:
    """The files that may implement a header: csrc/x.h -> csrc/x.cu, csrc/x.cpp, csrc/xs.cpp."""
    stem = header.rsplit(".", 1)[0]
    return (f"{stem}.cu", f"{stem}.cpp", f"{stem}s.cpp")


def include_closure(paths: Iterable[str], includes: Callable[[str], "list[str] | None"]) -> set[str]:
    """The existing ones of `paths`, every csrc file their includes reach, and each reached header's
    implementation file with its own includes."""
    seen, todo = set(), list(paths)
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        named = includes(current)
        if named is None:
            continue
        seen.add(current)
        todo += named
        if current.endswith((".h", ".cuh", ".hpp")):
            todo += [path for path in implementations(current) if includes(path) is not None]
    return seen


def launcher_entries(python_files: Iterable[str]) -> list[str]:
    """csrc/<stem>.cu and csrc/bind_<stem>.cpp of each launcher module (cuda/<stem>.py, not _private)."""
    stems = sorted({PurePosixPath(path).stem for path in python_files} - {"__init__"})
    return [f"csrc/{name}" for stem in stems if not stem.startswith("_") for name in (f"{stem}.cu", f"bind_{stem}.cpp")]


def kernel_files(module_path: str, backend: str, read: Reader,
                 includes: "Callable[[str], list[str] | None] | None" = None) -> set[str]:
    """Every source file of the kernel registered by `module_path` on `backend`; `includes` answers for the
    csrc files (default: parse them with `read`)."""
    found = python_closure(module_path, read)
    if backend == "cuda":
        found |= include_closure(launcher_entries(found), includes or includes_of(read))
    return found
