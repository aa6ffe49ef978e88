"""Training and evaluation text that exists on every machine: the Python standard library's own
top-level *.py source files (shared by the bench scripts and bench/train_default_models.py)."""

import os
from pathlib import Path

STDLIB = Path(os.__file__).parent
# never seen by the embedded default models (bench/train_default_models.py): their evaluation text
HELD_OUT = ("shlex.py", "fnmatch.py", "glob.py", "colorsys.py")


def stdlib_texts(limit_bytes: int, exclude=()) -> list[str]:
    """Source of the standard library's modules, largest first, up to limit_bytes; files named in
    `exclude` (e.g. "shlex.py") are skipped so they can serve as held-out text."""
    files = sorted((p for p in STDLIB.glob("*.py") if p.name not in set(exclude)), key=lambda p: -p.stat().st_size)
    texts, total = [], 0
    for path in files:
        text = path.read_text(errors="ignore")
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


def stdlib_files(names) -> dict[str, str]:
    """{name: source} for the named standard-library files that exist in this Python."""
    return {name: (STDLIB / name).read_text(errors="ignore") for name in names if (STDLIB / name).is_file()}
