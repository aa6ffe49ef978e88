"""A kernel's fingerprint (specdec_kernels/common/kernel_identity.py) is the identity the record of GPU-verified
kernels keys on: editing a comment, a docstring or blank lines, or renaming a file (its importers following)
leaves it alone; any code change moves it. Checked on today's real kernels: the Triton tree sampler and the CUDA
tree kernels with their launch plans. The installed fingerprint (the Python files here, the csrc hashes baked
into `_C`) is the one bench/gpu_changes.py computes from the sources."""

import sys
from pathlib import Path

import pytest

from specdec_kernels.common import installed_kernels, kernel_identity

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_changes  # noqa: E402

TRITON_MODULE = "specdec_kernels/triton/tree_verify.py"
CUDA_MODULE = "specdec_kernels/cuda/tree_verify.py"


def tree_of(module: str, backend: str) -> dict[str, str]:
    """{path: text} of every source file of the kernel `module` registers (today's checkout)."""
    read = gpu_changes.working_tree
    return {path: read(path) for path in kernel_identity.kernel_files(module, backend, read)}


def fingerprint(files: dict[str, str], module: str, backend: str) -> str:
    read = files.get
    paths = kernel_identity.kernel_files(module, backend, read)
    assert paths <= set(files), sorted(set(paths) - set(files))
    return kernel_identity.fingerprint(kernel_identity.file_hash(path, read(path)) for path in paths)


def edited(files: dict, path: str, old: str, new: str, count: int = 1) -> dict:
    assert files[path].count(old) >= count, (path, old)
    return {**files, path: files[path].replace(old, new, count)}


def renamed(files: dict, old: str, new: str, importers: dict[str, tuple[str, str]]) -> dict:
    """`old` moved to `new`, each importer's line rewritten (importer path -> (old text, new text))."""
    moved = {new if path == old else path: text for path, text in files.items()}
    for path, (before, after) in importers.items():
        moved = edited(moved, new if path == old else path, before, after)
    return moved


def test_the_closures_reach_the_files_that_decide_what_runs():
    triton = tree_of(TRITON_MODULE, "triton")
    assert {"specdec_kernels/triton/tree_verify_sampling.py", "specdec_kernels/triton/_tree_walk.py",
            "specdec_kernels/triton/_launch.py"} <= set(triton)
    cuda = tree_of(CUDA_MODULE, "cuda")
    # the kernels, their walk, the header's implementation (the plan picks the form) and the launch helpers
    assert {"csrc/tree_verify.cu", "csrc/tree_walk.cuh", "csrc/launch_plan.h", "csrc/launch_plans.cpp",
            "csrc/launch_utils.cu", "specdec_kernels/cuda/_launch.py"} <= set(cuda)


def test_comments_docstrings_and_blank_lines_leave_the_fingerprint_alone():
    files = tree_of(TRITON_MODULE, "triton")
    base = fingerprint(files, TRITON_MODULE, "triton")
    sampler = "specdec_kernels/triton/tree_verify_sampling.py"
    for change in (("    lanes = tl.arange(0, BLOCK_V).to(tl.int64)\n",
                    "    # a new comment line\n\n    lanes = tl.arange(0, BLOCK_V).to(tl.int64)  # and one at the end\n"),
                   ('"""The Triton kernel of `tree_rejection_sample`', '"""Reworded: the Triton kernel'),
                   ('    """Store chunk c\'s sums', '    """Stores chunk c\'s sums'),
                   ("def _chunk_sums(parts, word, num_chunks, BLOCK_C: tl.constexpr):\n",
                    "def _chunk_sums(parts, word, num_chunks, BLOCK_C: tl.constexpr):   \n")):
        assert fingerprint(edited(files, sampler, *change), TRITON_MODULE, "triton") == base, change
    cuda = tree_of(CUDA_MODULE, "cuda")
    cuda_base = fingerprint(cuda, CUDA_MODULE, "cuda")
    for path, change in (("csrc/tree_verify.cu", ("// Verification of token trees", "/* Verification\n of trees */ // of token trees")),
                         ("csrc/tree_walk.cuh", ("constexpr int kMaxCluster = 16;",
                                                 "  constexpr int kMaxCluster = 16;  // why: reworded")),
                         ("csrc/launch_plans.cpp", ("constexpr int64_t kInt32Max", "\n\nconstexpr int64_t kInt32Max"))):
        assert fingerprint(edited(cuda, path, *change), CUDA_MODULE, "cuda") == cuda_base, (path, change)


# (the kernel's module, backend, a file of it, its new name, {importer: (its line before, after)})
RENAMES = (
    (TRITON_MODULE, "triton", "specdec_kernels/triton/_tree_walk.py", "specdec_kernels/triton/_walk_helpers.py",
     {"specdec_kernels/triton/tree_verify_sampling.py": ("from ._tree_walk import", "from ._walk_helpers import"),
      "specdec_kernels/triton/tree_verify.py": ("from ._tree_walk import", "from ._walk_helpers import")}),
    (CUDA_MODULE, "cuda", "csrc/tree_walk.cuh", "csrc/walk.cuh",
     {"csrc/tree_verify.cu": ('#include "tree_walk.cuh"', '#include "walk.cuh"'),
      "csrc/bind_tree_verify.cpp": ('#include "tree_walk.cuh"', '#include "walk.cuh"')}),
)


@pytest.mark.parametrize("module, backend, old, new, importers", RENAMES, ids=("triton helper", "cuda header"))
def test_renaming_a_file_leaves_the_fingerprint_alone(module, backend, old, new, importers):
    files = tree_of(module, backend)
    assert fingerprint(renamed(files, old, new, importers), module, backend) == fingerprint(files, module, backend)
    if backend == "triton":  # the registering module itself (a CUDA one names its .cu: a rename moves both)
        moved = module.replace("tree_verify.py", "trees.py")
        assert fingerprint(renamed(files, module, moved, {}), moved, backend) == fingerprint(files, module, backend)


def test_a_code_change_moves_the_fingerprint():
    files = tree_of(TRITON_MODULE, "triton")
    base = fingerprint(files, TRITON_MODULE, "triton")
    sampler = "specdec_kernels/triton/tree_verify_sampling.py"
    for change in (("sum_q += tl.sum(q_weight, axis=0)", "sum_q += tl.sum(q_weight, axis=0) + 1"),
                   ("STATE_WORDS: tl.constexpr = tl.constexpr(8)", "STATE_WORDS: tl.constexpr = tl.constexpr(16)"),
                   ("if kind == RESID:\n            r, q_weight", "if kind != NO_PASS:\n            r, q_weight")):
        assert fingerprint(edited(files, sampler, *change), TRITON_MODULE, "triton") != base, change
    # a shared helper counts too: its code runs in the kernel
    assert fingerprint(edited(files, "specdec_kernels/triton/_launch.py", "def ", "def _unused(): pass\ndef "),
                       TRITON_MODULE, "triton") != base
    cuda = tree_of(CUDA_MODULE, "cuda")
    cuda_base = fingerprint(cuda, CUDA_MODULE, "cuda")
    for path, change in (("csrc/tree_verify.cu", ("constexpr int kSplitBlocksPerSM = 3;", "constexpr int kSplitBlocksPerSM = 2;")),
                         ("csrc/launch_plans.cpp", ("kMinChunk = 4096", "kMinChunk = 2048")),
                         ("csrc/tree_walk.cuh", ("constexpr int kMaxCluster = 16;", "constexpr int kMaxCluster = 8;"))):
        assert fingerprint(edited(cuda, path, *change), CUDA_MODULE, "cuda") != cuda_base, (path, change)


def test_strings_that_look_like_comments_are_code():
    assert kernel_identity.c_code('const char* a = "// not a comment"; // a comment') == 'const char* a = "// not a comment";'
    assert kernel_identity.c_code("int a = '/'; /* gone */ int b;") == "int a = '/';   int b;"
    assert kernel_identity.python_code('x = "# kept"  # dropped\n') == 'x = "# kept"'
    assert kernel_identity.python_code('def f():\n    """doc"""\n    return "doc"\n') == 'def f():\n    return "doc"'


def test_the_installed_fingerprints_are_the_sources_fingerprints():
    """Python kernels from the package's files, CUDA ones from the csrc hashes `_C` was built with: the very
    fingerprints bench/gpu_changes.py (and so the shipped record) computes from the sources."""
    from specdec_kernels.common import registry

    expected = gpu_changes.record()["fingerprints"]
    baked = installed_kernels.csrc_identity()
    checked = 0
    for key, want in expected.items():
        op, backend = key.split("/")
        if backend == "cuda" and baked is None:
            continue  # no `_C` here (or one built before it carried its sources' hashes)
        got = installed_kernels.fingerprint(registry.implementation(op, backend).__module__, backend)
        assert got == want, key
        checked += 1
    assert checked >= len([k for k in expected if k.endswith("/triton")])
    if baked is None:
        pytest.skip("no `_C` with source_identity(): only the Triton kernels were compared")
