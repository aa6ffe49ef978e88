"""CUDA backends of `tree_greedy_verify` and `tree_rejection_sample` (csrc/tree_verify.cu):
one kernel launch per call, no host sync, buffers sized by (B, N) only; and the host emulations of
the two forms of the sampling kernel (`emulate_rejection_on_host`: the split-V work-stealing kernel;
`emulate_cluster_on_host`: the sm_90 thread-block-cluster kernel; CPU tests).

tree_rejection_sample's form: the plan picks the cluster form on sm_90 where the device runs `_C`'s
sm_90 code, a cluster the device schedules holds a row's slices and every row's cluster fits on the
device at once (the launcher asks the runtime once per device: csrc/tree_verify.cu, ClusterFacts); the
split form elsewhere. SPECDEC_TREE_FORM=split|cluster (read at every call, so a benchmark or a GPU test
can time and check both on one device) forces one; forcing "cluster" where it cannot run raises
ValueError from the plan."""

import contextlib
import os

import torch

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ._launch import DTYPE_CODES, as_int64, library, on_device, plan_limits, pointer, stream_handle, tree_outputs


def tree_greedy_verify(target_logits, tree_tokens, parents, *, max_depth: int):
    tree_tokens, parents = as_int64(tree_tokens), as_int64(parents)  # the kernel reads int64 (any strides)
    lib = library()
    batch, n, vocab = target_logits.shape
    device = tree_tokens.device
    out_tokens, num_accepted, accepted_nodes = tree_outputs(tree_tokens, max_depth)
    workspace = zeroed_workspace(device, lib.tree_greedy_verify_workspace_bytes(batch, n))
    with on_device(device):  # the launcher queries the current device's SM count
        lib.tree_greedy_verify(
            target_logits.data_ptr(), target_logits.stride(0), target_logits.stride(1),
            tree_tokens.data_ptr(), tree_tokens.stride(0), tree_tokens.stride(1),
            parents.data_ptr(), parents.stride(0), parents.stride(1),
            out_tokens.data_ptr(), num_accepted.data_ptr(), accepted_nodes.data_ptr(), workspace.data_ptr(),
            batch, n, vocab, max_depth, DTYPE_CODES[target_logits.dtype], stream_handle(device))
    return out_tokens, num_accepted, accepted_nodes


def _rejection_args(target_probs, draft_probs, tree_tokens, parents, uniforms, seed, offsets):
    """The launcher's arguments after the inputs (rows, tree and randomness as addresses and element
    strides) and the tensors that must stay alive until the launch: shared by the launch and by
    `emulate_rejection_on_host`, so the host emulation reads exactly what the kernel would."""
    # the kernel reads int64 (any strides) tokens, parents, seeds and offsets
    tree_tokens, parents, offsets = as_int64(tree_tokens), as_int64(parents), as_int64(offsets)
    seed = as_int64(seed) if isinstance(seed, torch.Tensor) else seed
    seeds = seed if isinstance(seed, torch.Tensor) else None
    seed_int = 0 if seeds is not None or seed is None else int(seed)
    args = (target_probs.data_ptr(), target_probs.stride(0), target_probs.stride(1),
            draft_probs.data_ptr(), draft_probs.stride(0), draft_probs.stride(1),
            tree_tokens.data_ptr(), tree_tokens.stride(0), tree_tokens.stride(1),
            parents.data_ptr(), parents.stride(0), parents.stride(1),
            pointer(uniforms), uniforms is not None and uniforms.dtype == torch.float64,
            0 if uniforms is None else uniforms.stride(0), 0 if uniforms is None else uniforms.stride(1),
            seed_int, pointer(seeds), 0 if seeds is None else seeds.stride(0),
            pointer(offsets), 0 if offsets is None else offsets.stride(0))
    return args, (tree_tokens, parents, offsets, seeds)


FORMS = {"": 0, "auto": 0, "split": 1, "cluster": 2}


def tree_form() -> int:
    """The plan's form argument from SPECDEC_TREE_FORM (unset/auto: the plan's choice)."""
    name = os.environ.get("SPECDEC_TREE_FORM", "").strip().lower()
    if name not in FORMS:
        raise ValueError(f"SPECDEC_TREE_FORM must be one of split, cluster, auto (got {name!r})")
    return FORMS[name]


@contextlib.contextmanager
def forced_tree_form(form: str | None):
    """SPECDEC_TREE_FORM=form for the calls inside (the launcher reads it at every call), restored after;
    None leaves it as it is. For the GPU checks and benchmarks that run each form."""
    if form is None:
        yield
        return
    before = os.environ.get("SPECDEC_TREE_FORM")
    os.environ["SPECDEC_TREE_FORM"] = form
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPECDEC_TREE_FORM", None)
        else:
            os.environ["SPECDEC_TREE_FORM"] = before


def tree_rejection_sample(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                          seed=None, offsets=None, siblings: str = "independent"):
    lib = library()
    form = tree_form()
    batch, n, vocab = target_probs.shape
    device = tree_tokens.device
    out_tokens, num_accepted, accepted_nodes = tree_outputs(tree_tokens, max_depth)
    if batch == 0:
        return out_tokens, num_accepted, accepted_nodes
    args, _alive = _rejection_args(target_probs, draft_probs, tree_tokens, parents, uniforms, seed, offsets)
    with on_device(device):  # the plan, the zeroed buffer and the launch use the current device and stream
        # Split form: grid (B, V-chunks); cluster form (sm_90): grid (B * C) in clusters of C. Scratch
        # (walk state, rank table, the split form's chunk sums: nothing grows with V) is written before
        # it is read, so no zeroing; the split form's ticket words come from the stream's zeroed buffer,
        # which the kernel hands back zeroed (the cluster form has none). The residual is recomputed.
        plan = lib.tree_rejection_sample_plan(batch, n, vocab, 0, form)  # arch 0: the current device
        scratch = torch.empty(max(plan["workspace_bytes"] // 8, 1), dtype=torch.int64, device=device)
        zeroed = zeroed_workspace(device, plan["zeroed_bytes"]).data_ptr() if plan["zeroed_bytes"] else 0
        lib.tree_rejection_sample(
            *args, out_tokens.data_ptr(), num_accepted.data_ptr(), accepted_nodes.data_ptr(), scratch.data_ptr(),
            zeroed, batch, n, vocab, max_depth, DTYPE_CODES[target_probs.dtype], stream_handle(device),
            siblings == "without_replacement", form)
    return out_tokens, num_accepted, accepted_nodes


def _host_inputs(target_probs, draft_probs, tree_tokens, parents, max_depth, uniforms, seed, offsets):
    """What a host emulation takes: (outputs, the launcher's pointer arguments up to the outputs', tensors to
    keep alive). fp16/bf16 rows are widened to float32 first, exactly as the kernel widens each element."""
    target_probs = target_probs if target_probs.dtype == torch.float32 else target_probs.float()
    draft_probs = draft_probs if draft_probs.dtype == torch.float32 else draft_probs.float()
    outputs = tree_outputs(tree_tokens, max_depth)
    args, alive = _rejection_args(target_probs, draft_probs, tree_tokens, parents, uniforms, seed, offsets)
    return outputs, (*args, *(t.data_ptr() for t in outputs)), (target_probs, draft_probs, *alive)


def emulate_rejection_on_host(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                              seed=None, offsets=None, siblings: str = "independent", chunk: int = 2048,
                              resident: int = 4, schedule_seed: int = 0):
    """tree_rejection_sample's split-V kernel emulated on the CPU (`_C.host_tree_rejection_split`: the
    kernel's SPECDEC_HD walk, chunk arithmetic and claim protocol, CTAs interleaved by a seeded
    scheduler, at most `resident` at once). CPU tensors; fp16/bf16 rows are widened to float32 first,
    exactly as the kernel widens each element. Returns the outputs and the run's counters. Testing only."""
    batch, n, vocab = target_probs.shape
    outputs, pointers, _alive = _host_inputs(target_probs, draft_probs, tree_tokens, parents, max_depth, uniforms,
                                             seed, offsets)
    stats = library().host_tree_rejection_split(*pointers, batch, n, vocab, max_depth,
                                                siblings == "without_replacement", chunk, resident, schedule_seed)
    return outputs, stats


def emulate_cluster_on_host(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                            seed=None, offsets=None, siblings: str = "independent", chunk: int, cluster: int,
                            schedule_seed: int = 0, mutate: int = 0):
    """tree_rejection_sample's sm_90 cluster kernel emulated on the CPU (`_C.host_tree_rejection_cluster`:
    the kernel's SPECDEC_HD walk and slice arithmetic, `cluster` CTAs a row owning slices of `chunk` ids,
    in lockstep phases). CPU tensors, widened to float32 as the kernel widens each element. mutate 1/2
    plant protocol bugs (stale partials, a slice never summed). Returns the outputs and the counters."""
    batch, n, vocab = target_probs.shape
    outputs, pointers, _alive = _host_inputs(target_probs, draft_probs, tree_tokens, parents, max_depth, uniforms,
                                             seed, offsets)
    stats = library().host_tree_rejection_cluster(*pointers, batch, n, vocab, max_depth,
                                                  siblings == "without_replacement", chunk, cluster, schedule_seed,
                                                  mutate)
    return outputs, stats


register("tree_greedy_verify", "cuda", tree_greedy_verify,
         limits=plan_limits("tree_greedy_verify", lambda s: dict(B=s["B"], N=s["N"], V=s["V"])))
# grid (B, V-chunks) or (B * C) in clusters (sm_90); the fixed-point totals stay exact only below 2^23
# tokens (the plan refuses).
register("tree_rejection_sample", "cuda", tree_rejection_sample,
         limits=plan_limits("tree_rejection_sample", lambda s: dict(B=s["B"], N=s["N"], V=s["V"])))
