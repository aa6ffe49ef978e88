"""Every Triton launcher keeps its grid within CUDA's limits (x <= 2^31 - 1, y and z <= 65535)
for any shape its public op accepts, or its registered `limits` refuse the shape (so `auto`
runs it on another backend). Nothing runs: inputs live on the meta device (no memory), the
launches are planned for an H100 (132 SMs) and every `*_kernel` is swapped for a recorder of
its grid. Shared memory and registers of the compiled kernels: tests/test_triton_compile_targets.py.
"""

import importlib

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.common import registry
from specdec_kernels.ops import (attention, block_verification, early_exit, kv_cache, logit_verify, rejection_sampling,
                                 tree_verify)
from specdec_kernels.triton import _launch

GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA: grid x, y, z
H100_SMS = 132
MODULES = ("early_exit", "kv_cache", "logit_verify", "rejection_sampling", "rejection_sampling_logits",
           "attention", "tree_verify", "tree_verify_sampling", "block_verification", "block_verification_logits",
           "_softmax_stats")
META = torch.device("meta")
BIG_B = 10**6  # a serving batch far past 65535 rows


class Recorder:
    """Stands in for a JIT kernel: `kernel[grid](...)` records the grid and runs nothing."""

    def __init__(self, name: str, launches: list):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        def launch(*args, **meta):
            resolved = grid(meta) if callable(grid) else grid
            self.launches.append((self.name, tuple(resolved)))
        return launch


@pytest.fixture
def launches(monkeypatch) -> list:
    """(kernel, grid) of every launch, with the launchers planning for a GPU."""
    recorded: list = []
    for module_name in MODULES:
        module = importlib.import_module(f"specdec_kernels.triton.{module_name}")
        for name, value in list(vars(module).items()):
            if name.endswith("_kernel") and hasattr(value, "arg_names"):
                monkeypatch.setattr(module, name, Recorder(f"{module_name}.{name}", recorded))
    monkeypatch.setattr(_launch, "plans_for_gpu", lambda device: True)
    monkeypatch.setattr(_launch, "sm_count", lambda device: H100_SMS)
    monkeypatch.setattr(registry, "triton_interpreting", lambda: True)  # meta tensors pass resolve()
    return recorded


def triton_refusal(monkeypatch, call) -> str | None:
    """Run a public op on meta tensors (its fake implementation) and return the triton
    backend's refusal for the sizes the op passed to resolve(), or None."""
    seen = {}

    def spy(op, backend, device, *, runs_as=None, sizes=None):
        seen.update(op=runs_as or op, sizes=sizes)
        return "torch"  # meta tensors: the custom op runs its fake implementation whatever this says

    for module in (attention, rejection_sampling, logit_verify, early_exit, kv_cache, tree_verify, block_verification):
        monkeypatch.setattr(module, "resolve", spy)
    call()
    return registry.refusal(seen["op"], "triton", seen["sizes"])


def check_grids(launches: list, expect_launches: bool = True) -> None:
    assert launches or not expect_launches
    for name, grid in launches:
        assert 1 <= len(grid) <= 3, (name, grid)
        for axis, (size, limit) in enumerate(zip(grid, GRID_LIMITS)):
            assert 0 < size <= limit, f"{name}: grid {grid}, axis {'xyz'[axis]} past {limit}"


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device=META)


def index(*shape):
    return torch.empty(*shape, dtype=torch.int64, device=META)


# ------------------------------------------------------------------------------- shapes
# Each: ordinary serving shapes, a batch far past 65535, and shapes past the 2^31 x limit
# (which the launcher must refuse through its limits, never launch).

CHAIN_SHAPES = [(1, 1, 2), (8, 4, 32000), (BIG_B, 4, 32000), (70000, 8, 128256), (2**20, 2047, 16),
                (1, 0, 3), (4, 3, 2**24)]


@pytest.mark.parametrize("batch, g, vocab", CHAIN_SHAPES)
@pytest.mark.parametrize("op", ["greedy_verify", "relaxed_verify", "bild_verify", "rejection_sample",
                                "rejection_sample_logits"])
def test_chain_ops(launches, monkeypatch, op, batch, g, vocab):
    scores, draft, tokens = meta(batch, g + 1, vocab), meta(batch, g, vocab), index(batch, g)
    counts = index(batch)
    kwargs = dict(greedy_verify=dict(), relaxed_verify=dict(top_beta=2, tau=1.0), bild_verify=dict(rollback_threshold=1.0),
                  rejection_sample=dict(seed=1), rejection_sample_logits=dict(seed=1))[op]
    args = (scores, draft, tokens) if op.startswith("rejection") else (scores, tokens)
    reason = triton_refusal(monkeypatch, lambda: getattr(ops, op)(*args, num_draft_tokens=counts, **kwargs))
    if reason is None:
        registry.implementation(op, "triton")(*args, num_draft_tokens=counts, **kwargs)
    check_grids(launches, expect_launches=reason is None)
    # grid x: one program per batch row (rejection_sample), per scored row (verify), or per
    # target and draft row (rejection_sample_logits)
    rows = dict(rejection_sample=batch, rejection_sample_logits=batch * (2 * g + 1)).get(op, batch * (g + 1))
    assert (reason is None) == (rows <= GRID_LIMITS[0]), reason  # refused exactly where x would overflow


@pytest.mark.parametrize("batch, g, vocab", CHAIN_SHAPES)
@pytest.mark.parametrize("op", ["block_verify", "block_verify_logits"])
def test_block_verify_ops(launches, monkeypatch, op, batch, g, vocab):
    scores, draft, tokens, counts = meta(batch, g + 1, vocab), meta(batch, g, vocab), index(batch, g), index(batch)
    reason = triton_refusal(monkeypatch, lambda: getattr(ops, op)(scores, draft, tokens, num_draft_tokens=counts,
                                                                  seed=1))
    if reason is None:
        registry.implementation(op, "triton")(scores, draft, tokens, num_draft_tokens=counts, seed=1)
    check_grids(launches, expect_launches=reason is None)
    # grid x: a program per position of every row (the block kernel), and per target and draft
    # row (the logits op's statistics launch); the block kernel's V-splits stay on grid y
    rows = batch * (2 * g + 1) if op == "block_verify_logits" else batch * (g + 1)
    assert (reason is None) == (rows <= GRID_LIMITS[0]), reason
    if reason is None:
        kernels = ["_softmax_stats_kernel"] if op == "block_verify_logits" else []  # statistics first
        assert [name.split(".")[-1] for name, _ in launches] == kernels + ["_block_verify_kernel"]
        assert launches[-1][1][0] == batch * (g + 1)


@pytest.mark.parametrize("rows, vocab", [(1, 2), (BIG_B, 32000), (4, 2**24)])
def test_max_prob(launches, monkeypatch, rows, vocab):
    logits = meta(rows, vocab)
    assert triton_refusal(monkeypatch, lambda: ops.max_prob(logits)) is None
    registry.implementation("max_prob", "triton")(logits)
    check_grids(launches)


@pytest.mark.parametrize("batch, n, vocab", [(2, 16, 32000), (BIG_B, 8, 32000), (1, 64, 128256), (70000, 1, 2)])
def test_tree_ops(launches, monkeypatch, batch, n, vocab):
    scores, tokens, parents = meta(batch, n, vocab), index(batch, n), index(batch, n)
    for depth in (0, n - 1):
        assert triton_refusal(monkeypatch, lambda: ops.tree_greedy_verify(scores, tokens, parents, max_depth=depth)) is None
        registry.implementation("tree_greedy_verify", "triton")(scores, tokens, parents, max_depth=depth)
        assert triton_refusal(monkeypatch, lambda: ops.tree_rejection_sample(
            scores, scores, tokens, parents, seed=1, max_depth=depth)) is None
        registry.implementation("tree_rejection_sample", "triton")(scores, scores, tokens, parents, max_depth=depth,
                                                                   seed=1)
    check_grids(launches)


TREE_ATTENTION_SHAPES = [  # (B, N, Hq, Hkv, D, paged, dtype)
    (8, 32, 32, 8, 128, False, torch.bfloat16), (1, 64, 32, 8, 128, True, torch.float16),
    (BIG_B, 8, 32, 8, 128, False, torch.bfloat16),  # B * Hkv = 8e6: past grid z before the fold
    (70000, 1, 1, 1, 64, True, torch.float32), (40000, 4, 8, 2, 64, False, torch.float32),
    (2**26, 64, 64, 64, 64, True, torch.bfloat16)]  # past 2^31 programs: refused


@pytest.mark.parametrize("batch, n, hq, hkv, d, paged, dtype", TREE_ATTENTION_SHAPES)
def test_tree_attention(launches, monkeypatch, batch, n, hq, hkv, d, paged, dtype):
    q = meta(batch, n, hq, d, dtype=dtype)
    if paged:
        cache, table = meta(4, 16, hkv, d, dtype=dtype), torch.empty(batch, 64, dtype=torch.int32, device=META)
    else:
        cache, table = meta(batch, hkv, 512, d, dtype=dtype), None
    lens, parents = index(batch), index(batch, n)
    reason = triton_refusal(monkeypatch, lambda: ops.tree_attention(q, cache, cache, lens, parents, block_table=table))
    if reason is None:
        for num_splits in (None, 1, 7):  # direct (one launch) and split + merge
            registry.implementation("tree_attention", "triton")(q, cache, cache, lens, parents, table, sm_scale=0.1,
                                                                num_splits=num_splits)
    check_grids(launches, expect_launches=reason is None)
    assert (reason is None) == (batch < 2**24), reason


@pytest.mark.parametrize("layers, batch, heads, d, m", [(4, 8, 8, 128, 4), (1, BIG_B, 8, 128, 9), (0, BIG_B, 8, 128, 4),
                                                      (40000, 1, 1, 16, 2), (2, 3, 64, 256, 64)])
def test_kv_compact(launches, monkeypatch, layers, batch, heads, d, m):
    stacked = meta(layers, 2, batch, heads, 64, d, dtype=torch.bfloat16)  # one allocation: distinct addresses
    k, v = list(stacked[:, 0]), list(stacked[:, 1])
    lens, accepted = index(batch), index(batch, m)
    reason = triton_refusal(monkeypatch, lambda: ops.kv_compact(k, v, lens, accepted))
    if reason is None:
        registry.implementation("kv_compact", "triton")(k, v, lens, accepted)
    check_grids(launches, expect_launches=reason is None)
    assert (reason is None) == (2 * layers <= GRID_LIMITS[1]), reason


@pytest.mark.parametrize("batch, hidden, vocab, k", [(1, 2048, 32000, 1), (64, 4096, 128256, 5),
                                                     (10**7, 64, 32000, 16), (BIG_B, 16, 2, 2)])
def test_early_exit_topk(launches, monkeypatch, batch, hidden, vocab, k):
    h, w, norm_w = meta(batch, hidden, dtype=torch.bfloat16), meta(vocab, hidden, dtype=torch.bfloat16), meta(hidden)
    assert triton_refusal(monkeypatch, lambda: ops.early_exit_topk(h, norm_w, w, k)) is None
    registry.implementation("early_exit_topk", "triton")(h, norm_w, w, k, eps=1e-6, norm="rms")
    check_grids(launches)


def test_every_launched_kernel_is_recorded(launches):
    """The fixture swaps every `*_kernel` of the launcher modules (a new one is covered too)."""
    kernels = {f"{m}.{name}": value for m in MODULES
               for name, value in vars(importlib.import_module(f"specdec_kernels.triton.{m}")).items()
               if name.endswith("_kernel")}
    assert len(kernels) >= 12 and all(isinstance(value, Recorder) for value in kernels.values()), kernels
