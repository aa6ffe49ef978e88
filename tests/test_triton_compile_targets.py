"""Every Triton kernel compiles for sm_80 and sm_90 on this GPU-less machine, through Triton's
own launch path, at the benchmarks' shapes (tests/triton_compile_targets.py): no kernel that
only the interpreter accepts, no register spills in the 16-bit paths on the H100 target, shared
memory within an SM's, and the tree-attention KV loop pipelined with cp.async and on Hopper's
warp-group MMAs. Compilation only: what it cannot show (speed, results on a GPU) is
`pytest -m gpu` and the benchmarks."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parents[1]
CAPABILITIES = (80, 90)
SHARED_BYTES = {80: 163 * 1024, 90: 227 * 1024}  # opt-in dynamic shared memory per block
MODULES = ("early_exit", "kv_cache", "logit_verify", "rejection_sampling", "rejection_sampling_logits",
           "attention", "tree_verify", "tree_verify_sampling", "block_verification", "block_verification_logits",
           "_softmax_stats")


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    """One row per compiled kernel variant, both targets (compiled in two processes at once)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    runs = [subprocess.Popen([sys.executable, str(ROOT / "tests/triton_compile_targets.py"), "--capability", str(cap)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            for cap in CAPABILITIES]
    rows = []
    for run in runs:
        out, err = run.communicate()
        if run.returncode and "ptxas" in err.lower() and "error" not in out.lower():
            pytest.skip(f"no usable ptxas here: {err[-300:]}")
        assert run.returncode == 0, out[-2000:] + err[-4000:]
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def launched_kernels() -> set[str]:
    """module.kernel of every @triton.jit kernel the launchers start (helpers are not `*_kernel`)."""
    names = set()
    for module_name in MODULES:
        module = importlib.import_module(f"specdec_kernels.triton.{module_name}")
        names |= {f"{module_name}.{name}" for name, value in vars(module).items()
                  if name.endswith("_kernel") and hasattr(value, "arg_names")}
    return names


def test_every_kernel_compiles_for_both_targets(compiled):
    expected = launched_kernels()
    assert len(expected) >= 12
    for cap in CAPABILITIES:
        assert {row["kernel"] for row in compiled if row["capability"] == cap} == expected, cap


# Stack bytes a kernel may use on sm_90. The tree sampling walk keeps its completer's serial state
# (the node, rank, totals, pointers) through the claim loop: ptxas spills a few of those scalars
# once per call and reloads them outside the passes' tile loops (the SASS shows the loads on the
# exit path and at the walk's start), so they cost nothing per vocabulary tile.
STACK_LIMIT = {"tree_verify_sampling._tree_rejection_kernel": 32}


def test_no_spills_on_the_h100_target(compiled):
    """sm_90: nothing in local memory; in the bandwidth-bound 16-bit attention and early-exit kernels no spill
    inside a loop (Triton 3.9 spills two scalars of the 16-bit early-exit kernel around its loop: 8 bytes
    stored once and read once per thread), at most a few spilled scalars (16 bytes; STACK_LIMIT) anywhere. The
    fp32 tree-attention path (IEEE fp32 dots on the FMA units, a correctness path) may spill."""
    for row in compiled:
        if "stack" not in row or row["capability"] != 90:  # cuobjdump ships with triton; else compile only
            continue
        sixteen_bit = "bfloat16" in row["case"] or "float16" in row["case"]
        if row["op"] == "tree_attention" and not sixteen_bit:
            continue
        assert row["local"] == 0 and row["stack"] <= STACK_LIMIT.get(row["kernel"], 16), row
        if sixteen_bit and row["op"] in ("tree_attention", "early_exit_topk"):
            assert row["local_in_loops"] == 0, row


def test_local_in_loops_counts_spills_between_a_backward_branch_and_its_target():
    """The measure the spill rule above relies on, on SASS shaped as cuobjdump prints it."""
    from sass_loops import local_in_loops

    def sass(*lines):
        return "\n".join(f"        /*{address:04x}*/   {text} ;   /* 0x0 */" for address, text in lines)

    prologue_and_epilogue = sass((0x10, "STL [R1], R16"), (0x20, "IADD3 R2, R2, 0x1, RZ"), (0x30, "@P0 BRA 0x20"),
                                 (0x40, "LDL.LU R16, [R1]"), (0x50, "EXIT"), (0x60, "BRA 0x60"))
    assert local_in_loops(prologue_and_epilogue) == 0
    in_the_loop = sass((0x10, "IADD3 R2, R2, 0x1, RZ"), (0x20, "STL [R1], R16"), (0x30, "@!P0 BRA 0x10"),
                       (0x40, "@P1 BRA 0x80"), (0x50, "LDL R3, [R1+0x4]"), (0x80, "EXIT"))
    assert local_in_loops(in_the_loop) == 1  # the forward branch over the LDL makes no loop


def test_shared_memory_fits(compiled):
    for row in compiled:
        assert row["dynamic_shared"] <= SHARED_BYTES[row["capability"]], row


def test_tree_attention_kv_loop_is_pipelined_and_uses_hopper_mma(compiled):
    split = [row for row in compiled if row["kernel"] == "attention._split_kernel"]
    assert {row["capability"] for row in split} == set(CAPABILITIES)
    for row in split:
        assert row["async_copies"] > 0, row  # K/V tiles prefetched with cp.async (num_stages)
        if row["capability"] == 90 and row["constexprs"]["BLOCK_M"] >= 64 and "float32" not in row["case"]:
            assert row["warp_group_dots"] > 0, row
