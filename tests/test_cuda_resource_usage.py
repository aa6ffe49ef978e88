"""Registers, stack and local memory of every CUDA kernel in the built `_C`, for each target
architecture (cuobjdump, shipped with Triton): runs in CPU-only CI whenever _C is built.

A kernel whose register use grows past its __launch_bounds__ spills to local memory and
loses bandwidth silently; this keeps that visible without a GPU. The D = 64, 8-warp
tree-attention MMA kernel is capped at 128 registers (two CTAs per SM) and spills a few
words: a trade of occupancy against spills that only a GPU benchmark can settle."""

import os
import re
import subprocess

import pytest

from specdec_kernels.common import cuda_module as _cuda_module

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None, reason="specdec_kernels._C is not built here")

ARCHS = {"sm_80", "sm_90"}
SMALL_STACK = 32  # bytes: a few spilled words at a register cap
# The tree sampler's serial walk reads the row's tree from a shared-memory copy when it fits (N <= 256): a
# second view of the tree in a kernel at its 80-register cap (3 CTAs an SM) spills up to 40 bytes where it
# spilled <= 24 without the copy (measured on this build, 2026-12-06). Whether the copy's saved L2 trips in
# the latency-bound walk pay for those spills is a GPU question (issue 47's note).
TREE_SAMPLER_STACK = 40


def stack_limit(name: str) -> int:
    return TREE_SAMPLER_STACK if "tree_rejection_" in name else SMALL_STACK


def cuobjdump() -> str:
    triton = pytest.importorskip("triton")
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("no cuobjdump in this triton install")
    return tool


@pytest.fixture(scope="module")
def kernels() -> list[dict]:
    """One row per (architecture, kernel): arch, name (demangled enough to read), reg, stack, local."""
    dump = subprocess.run([cuobjdump(), "--dump-resource-usage", _C.__file__], capture_output=True, text=True,
                          check=True).stdout
    rows, arch, name = [], None, None
    for line in dump.splitlines():
        if found := re.search(r"arch = (sm_\d+)", line):
            arch = found.group(1)
        elif found := re.search(r"Function (\S+):", line):
            name = found.group(1)
        elif (found := re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", line)) and name:
            reg, stack, local = (int(v) for v in found.groups())
            rows.append(dict(arch=arch, name=name, reg=reg, stack=stack, local=local))
    return rows


def test_every_kernel_family_is_built_for_both_archs(kernels):
    families = ("tree_attention_mma_kernel", "tree_attention_simt_kernel", "greedy_verify_kernel",
                "logit_verify_kernel", "max_prob_kernel", "rejection_sample_kernel",
                "rejection_sample_logits_kernel", "tree_greedy_verify_kernel", "tree_rejection_split_kernel",
                "tree_rejection_cluster_kernel",
                "kv_compact_kernel", "early_exit_split_kernel", "early_exit_merge_kernel",
                "early_exit_normalize_kernel", "early_exit_mma_kernel",
                "block_verify_kernel", "block_verify_logits_kernel", "softmax_stats_kernel")
    for family in families:
        assert {row["arch"] for row in kernels if family in row["name"]} >= ARCHS, family


def test_no_local_arrays_and_at_most_a_few_spilled_words(kernels):
    for row in kernels:
        assert row["local"] == 0 and row["stack"] <= stack_limit(row["name"]), row


def test_tree_rejection_cluster_kernel_is_built_for_sm90(kernels):
    """The thread-block-cluster form runs on sm_90 only: there it fits the split kernel's 3 CTAs per SM
    (<= 80 registers at 256 threads: 61440 of 65536) with at most a few spilled words; below sm_90 it is a
    stub that traps (the plan never launches it there)."""
    rows = [row for row in kernels if "tree_rejection_cluster_kernel" in row["name"]]
    assert {row["arch"] for row in rows} >= ARCHS and len(rows) == 6 * len({row["arch"] for row in rows})
    for row in rows:
        if row["arch"] == "sm_90":
            assert row["reg"] <= 80 and row["stack"] <= stack_limit(row["name"]), row
        else:
            assert row["reg"] <= 16 and row["stack"] == 0, row


def test_tree_attention_d128_mma_kernels_do_not_spill(kernels):
    """The benchmark's head dim: the whole accumulator and Q fragments stay in registers."""
    d128 = [row for row in kernels if "tree_attention_mma_kernel" in row["name"] and "Li128E" in row["name"]]
    assert {row["arch"] for row in d128} >= ARCHS
    for row in d128:
        assert row["stack"] == 0 and row["reg"] <= 255, row
