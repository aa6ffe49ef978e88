"""tests/interpreter_speedup.py: kernels give the same results with it as without it, and it skips what it says."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")

import interpreter_speedup  # noqa: E402
from specdec_kernels import ops  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter is not in use")
CLAIMED = ((3, 6), (3, 9))  # pyproject.toml's triton floor, and the newest release this structure was read in


def version() -> tuple:
    return tuple(int(part) for part in triton.__version__.split(".")[:2])


@pytest.fixture
def counted_patching(monkeypatch):
    """The number of times triton's own _patch_lang runs, with the speedup in place."""
    from triton.runtime import interpreter

    assert interpreter_speedup.install()
    original_patch, original_launch = interpreter._patch_lang.originals
    calls = []
    interpreter_speedup.uninstall()

    def counting(fn):
        calls.append(fn.__name__)
        return original_patch(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    assert interpreter_speedup.install()
    yield calls
    interpreter_speedup.uninstall()
    monkeypatch.undo()
    interpreter_speedup.install()


def run_kernels() -> list[torch.Tensor]:
    """A kernel whose helpers call helpers (tree attention's tiles) and one that calls triton's own (cdiv, max)."""
    gen = torch.Generator().manual_seed(3)
    batch, width, heads, kv_heads, dim, span = 2, 4, 4, 2, 16, 64
    q = torch.randn(batch, width, heads, dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, span, dim, generator=gen) for _ in range(2))
    seq_lens = torch.tensor([37, 32])
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]])
    out = list(ops.tree_attention(q, k, v, seq_lens, parents, backend="triton"))
    logits = torch.randn(3, 4, 300, generator=gen)
    drafts = torch.randint(0, 300, (3, 3), generator=gen)
    return out + list(ops.greedy_verify(logits, drafts, backend="triton"))


def test_the_claimed_releases_have_the_structure_it_relies_on():
    if not CLAIMED[0] <= version() <= CLAIMED[1]:
        pytest.skip(f"triton {triton.__version__}: not read for this structure (a newer one may only be slower)")
    assert interpreter_speedup.install()


def test_kernels_give_the_same_results_with_and_without_it():
    if not interpreter_speedup.install():
        pytest.skip(f"triton {triton.__version__}'s interpreter has another structure: the speedup is off")
    fast = run_kernels()
    interpreter_speedup.uninstall()
    try:
        slow = run_kernels()
    finally:
        interpreter_speedup.install()
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


def test_a_launch_patches_once_for_each_module_its_helpers_see(counted_patching):
    if version() > CLAIMED[1]:
        pytest.skip(f"triton {triton.__version__}: not read for this structure")
    run_kernels()
    kernels = [name for name in counted_patching if name.endswith("_kernel")]
    # the launch's own patching, and at most one helper's for triton.language.core (cdiv, max: triton's helpers)
    assert kernels and len(counted_patching) <= 2 * len(kernels), counted_patching
