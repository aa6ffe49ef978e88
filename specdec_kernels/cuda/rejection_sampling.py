"""CUDA backends of `rejection_sample` (csrc/rejection_sampling.cu: one launch per call) and
`rejection_sample_logits` (softmax statistics, csrc/softmax_stats.cu, then the same kernel body: two).

The wrapper only makes the small per-row inputs contiguous (draft ids, counts, uniforms,
seeds, offsets), allocates the outputs and takes the per-stream zeroed workspace, which the
kernel leaves zeroed. The probability tensors are passed as they are (any strides for the
first two dims, last dim contiguous). Shapes the kernels cannot serve (2G + 1 > 65535 logits rows,
V >= 2^23) are refused by the launch plan's `limits`, so `auto` runs them elsewhere.
"""

import torch

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ._launch import DTYPE_CODES, as_int64, chain_launch, library, on_device, plan_limits, pointer, stream_handle


def _contiguous(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.contiguous()


def randomness_args(uniforms, seed) -> tuple:
    """(uniforms tensor or None, uniforms_float64, int seed, per-row seeds tensor or None)."""
    if uniforms is not None:
        return uniforms.contiguous(), uniforms.dtype == torch.float64, 0, None
    if isinstance(seed, torch.Tensor):
        return None, False, 0, seed.to(torch.int64).contiguous()
    return None, False, int(seed), None


def _row_inputs(draft_tokens, num_draft_tokens, uniforms, seed, offsets) -> tuple:
    """The small per-row inputs as both kernels read them: (draft_tokens, counts, uniforms,
    uniforms_float64, int seed, seeds, offsets), the index tensors int64 and contiguous, the
    offsets None when uniforms are given. The caller keeps them alive until the launch."""
    draft_tokens, num_draft_tokens, offsets = map(as_int64, (draft_tokens, num_draft_tokens, offsets))
    uniforms, uniforms_f64, seed_int, seeds = randomness_args(uniforms, seed)
    offsets = None if uniforms is not None else _contiguous(offsets)
    return draft_tokens.contiguous(), _contiguous(num_draft_tokens), uniforms, uniforms_f64, seed_int, seeds, offsets


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None, draft_passes=None):
    """CUDA `rejection_sample` on validated inputs (see specdec_kernels.ops.rejection_sample); the kernel
    writes `draft_passes` (bool [B, g] contiguous) when it is given."""
    lib = library()
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_probs, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    draft_tokens, counts, uniforms, uniforms_f64, seed_int, seeds, offsets = _row_inputs(
        draft_tokens, num_draft_tokens, uniforms, seed, offsets)
    with on_device(device):  # the launcher and the workspace use the current device and stream
        workspace = zeroed_workspace(device, lib.rejection_sample_workspace_bytes(batch, g, vocab))
        lib.rejection_sample(
            target_probs.data_ptr(), target_probs.stride(0), target_probs.stride(1),
            draft_probs.data_ptr() if g > 0 else 0, draft_probs.stride(0), draft_probs.stride(1),
            draft_tokens.data_ptr(), pointer(counts), pointer(uniforms), uniforms_f64, seed_int, pointer(seeds),
            pointer(offsets), out_tokens.data_ptr(), num_accepted.data_ptr(), pointer(draft_passes),
            workspace.data_ptr(), batch, g, vocab, DTYPE_CODES[target_probs.dtype], stream_handle(device))
    return out_tokens, num_accepted


register("rejection_sample", "cuda", rejection_sample,
         limits=plan_limits("rejection_sample", lambda s: dict(B=s["B"], G=s["G"], V=s["V"])))


def rejection_sample_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                            offsets=None, num_draft_tokens=None):
    """CUDA `rejection_sample_logits` on validated inputs (see specdec_kernels.ops.rejection_sample_logits).

    Equal to the torch reference except where a decision lies within the 1e-5 band of
    docs/ops.md "Numerics": the softmax sums are reduced in another order, and p is one exp2
    per element (csrc/logit_math.cuh), within ~3e-6 of torch's.
    """
    lib = library()
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    draft_tokens, counts, uniforms, uniforms_f64, seed_int, seeds, offsets = _row_inputs(
        draft_tokens, num_draft_tokens, uniforms, seed, offsets)
    if isinstance(temperature, torch.Tensor):
        temperatures, temperature = temperature.to(torch.float32).contiguous(), 1.0
    else:
        temperatures = None
    with on_device(device):
        workspace = zeroed_workspace(device, lib.rejection_sample_logits_workspace_bytes(batch, g, vocab))
        lib.rejection_sample_logits(
            target_logits.data_ptr(), target_logits.stride(0), target_logits.stride(1),
            draft_logits.data_ptr() if g > 0 else 0, draft_logits.stride(0), draft_logits.stride(1),
            draft_tokens.data_ptr(), pointer(counts), float(temperature), pointer(temperatures), pointer(uniforms),
            uniforms_f64, seed_int, pointer(seeds), pointer(offsets), out_tokens.data_ptr(), num_accepted.data_ptr(),
            workspace.data_ptr(), batch, g, vocab, DTYPE_CODES[target_logits.dtype], stream_handle(device))
    return out_tokens, num_accepted


register("rejection_sample_logits", "cuda", rejection_sample_logits,
         limits=plan_limits("rejection_sample_logits", lambda s: dict(B=s["B"], G=s["G"], V=s["V"])))
