"""The fingerprint (kernel_identity.py) of each kernel as installed here, computed once per process when first
asked for: the Python files from the package itself, the csrc files from the hashes setup.py baked into `_C`
when it compiled them (`_C.source_identity()`), since the binary is what runs and csrc/ is not installed."""

import functools
import json
from pathlib import Path

from . import cuda_module, kernel_identity

# the checkout or site-packages folder that holds specdec_kernels/: kernel paths are relative to it
_ROOT = Path(__file__).resolve().parents[2]


def _read(path: str) -> str | None:
    file = _ROOT / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


@functools.cache
def _file_hash(path: str) -> str:
    return kernel_identity.file_hash(path, _read(path))


@functools.cache
def csrc_identity() -> dict[str, list] | None:
    """{"csrc/<file>": [code hash, [the csrc files it includes]]} of the sources `_C` was built from, or None
    (no `_C`, or one built before it carried them)."""
    lib = cuda_module.load()
    baked = getattr(lib, "source_identity", None)
    return None if baked is None else json.loads(baked())


@functools.cache
def fingerprint(module: str, backend: str) -> str | None:
    """The fingerprint of the kernel that module `module` (a dotted name) registers on `backend`; None where it
    cannot be known (a cuda kernel without a `_C` that carries its sources' hashes)."""
    path = module.replace(".", "/") + ".py"
    if backend != "cuda":
        return kernel_identity.fingerprint(_file_hash(p) for p in kernel_identity.python_closure(path, _read))
    baked = csrc_identity()
    if baked is None:
        return None
    files = kernel_identity.kernel_files(path, backend, _read, includes=lambda p: baked[p][1] if p in baked else None)
    return kernel_identity.fingerprint(baked[p][0] if p.startswith("csrc/") else _file_hash(p) for p in files)
