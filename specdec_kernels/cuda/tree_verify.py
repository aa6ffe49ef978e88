"""CUDA backends of `tree_greedy_verify` and `tree_rejection_sample` (csrc/tree_verify.cu):
one kernel launch per call, no host sync, buffers sized by (B, N) only."""

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


def tree_rejection_sample(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                          seed=None, offsets=None, siblings: str = "independent"):
    # the kernel reads int64 (any strides) tokens, parents, seeds and offsets
    tree_tokens, parents, offsets = as_int64(tree_tokens), as_int64(parents), as_int64(offsets)
    seed = as_int64(seed) if isinstance(seed, torch.Tensor) else seed
    lib = library()
    batch, n, vocab = target_probs.shape
    device = tree_tokens.device
    seeds = seed if isinstance(seed, torch.Tensor) else None
    seed_int = 0 if seeds is not None or seed is None else int(seed)
    out_tokens, num_accepted, accepted_nodes = tree_outputs(tree_tokens, max_depth)
    # The rank tables (B * N * 2 int64, whatever V): every entry is written before it is read,
    # so no zeroing. The residual itself is recomputed in the kernel, never stored.
    plan = lib.tree_rejection_sample_plan(batch, n, vocab)
    workspace = torch.empty(max(plan["workspace_bytes"] // 8, 1), dtype=torch.int64, device=device)
    with on_device(device):
        lib.tree_rejection_sample(
            target_probs.data_ptr(), target_probs.stride(0), target_probs.stride(1),
            draft_probs.data_ptr(), draft_probs.stride(0), draft_probs.stride(1),
            tree_tokens.data_ptr(), tree_tokens.stride(0), tree_tokens.stride(1),
            parents.data_ptr(), parents.stride(0), parents.stride(1),
            pointer(uniforms), uniforms is not None and uniforms.dtype == torch.float64,
            0 if uniforms is None else uniforms.stride(0), 0 if uniforms is None else uniforms.stride(1),
            seed_int, pointer(seeds), 0 if seeds is None else seeds.stride(0),
            pointer(offsets), 0 if offsets is None else offsets.stride(0),
            out_tokens.data_ptr(), num_accepted.data_ptr(), accepted_nodes.data_ptr(), workspace.data_ptr(),
            batch, n, vocab, max_depth, DTYPE_CODES[target_probs.dtype], stream_handle(device),
            siblings == "without_replacement")
    return out_tokens, num_accepted, accepted_nodes


register("tree_greedy_verify", "cuda", tree_greedy_verify,
         limits=plan_limits("tree_greedy_verify", lambda s: dict(B=s["B"], N=s["N"], V=s["V"])))
# One CTA per batch row (grid x); the fixed-point totals stay exact only below 2^23 tokens.
register("tree_rejection_sample", "cuda", tree_rejection_sample,
         limits=lambda s: "V >= 2^23 (fixed-point totals stay exact below)" if s["V"] >= 2**23 else None)
