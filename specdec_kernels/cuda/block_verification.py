"""CUDA backends of `block_verify` and `block_verify_logits` (csrc/block_verification.cu).

block_verify is one launch per call, block_verify_logits two (softmax statistics, then the
verification); no host sync. The wrapper allocates only the outputs and takes the per-stream
zeroed workspace (its size depends on B and G only, never on V), which the kernels leave
zeroed. Every input is passed as it is: probability / logit tensors with any strides for the
first two dims (last dim contiguous), index tensors (draft ids, counts, seeds, offsets) int32 or
int64 with any strides, uniforms float32 / float64 and temperatures float32 with any strides.
Shapes the kernels cannot serve (V >= 2^23, more than 65535 rows per batch row in grid y) are
refused by the launch plan's `limits`, so `auto` runs them elsewhere.
"""

import torch

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ._launch import DTYPE_CODES, chain_launch, library, on_device, plan_limits, stream_handle

_INDEX_DTYPES = (torch.int32, torch.int64)


def _index(x: torch.Tensor | None) -> tuple:
    """(address, is_int64, stride 0, stride 1) of an int32 / int64 index tensor; zeros when absent."""
    if x is None:
        return 0, True, 0, 0
    if x.dtype not in _INDEX_DTYPES:
        x = x.to(torch.int64)
    strides = tuple(x.stride()) + (0, 0)
    return x.data_ptr(), x.dtype == torch.int64, strides[0], strides[1]


def _randomness(uniforms, seed, offsets) -> tuple:
    """The randomness arguments of the `_C` launchers, in their order; also returns the
    tensors they point into (kept alive until the launch is enqueued)."""
    keep = []
    if uniforms is not None:
        if uniforms.dtype not in (torch.float32, torch.float64):
            uniforms = uniforms.to(torch.float64)
        keep.append(uniforms)
        return (uniforms.data_ptr(), uniforms.dtype == torch.float64, uniforms.stride(0), uniforms.stride(1), 0,
                0, True, 0, 0, True, 0), keep
    seeds = seed if isinstance(seed, torch.Tensor) else None
    seed_int = 0 if seeds is not None or seed is None else int(seed)
    if seeds is not None and seeds.dtype not in _INDEX_DTYPES:
        seeds = seeds.to(torch.int64)
    if offsets is not None and offsets.dtype not in _INDEX_DTYPES:
        offsets = offsets.to(torch.int64)
    keep += [seeds, offsets]
    s_ptr, s_64, s_stride, _ = _index(seeds)
    o_ptr, o_64, o_stride, _ = _index(offsets)
    return (0, False, 0, 0, seed_int, s_ptr, s_64, s_stride, o_ptr, o_64, o_stride), keep


def _prepare(draft_tokens, num_draft_tokens):
    if draft_tokens.dtype not in _INDEX_DTYPES:
        draft_tokens = draft_tokens.to(torch.int64)
    if num_draft_tokens is not None and num_draft_tokens.dtype not in _INDEX_DTYPES:
        num_draft_tokens = num_draft_tokens.to(torch.int64)
    tokens = _index(draft_tokens)
    c_ptr, c_64, c_stride, _ = _index(num_draft_tokens)
    return draft_tokens, num_draft_tokens, tokens, (c_ptr, c_64, c_stride)


def block_verify_args(target_probs, draft_probs, draft_tokens, uniforms, seed, offsets, num_draft_tokens,
                      out_tokens, num_accepted, workspace, stream: int) -> tuple[tuple, list]:
    """The positional arguments of `_C.block_verify`, and the tensors they point into (kept
    alive until the launch is enqueued)."""
    batch, g = draft_tokens.shape
    draft_tokens, num_draft_tokens, tokens, counts = _prepare(draft_tokens, num_draft_tokens)
    rnd, keep = _randomness(uniforms, seed, None if uniforms is not None else offsets)
    args = (target_probs.data_ptr(), target_probs.stride(0), target_probs.stride(1),
            draft_probs.data_ptr() if g > 0 else 0, draft_probs.stride(0), draft_probs.stride(1),
            *tokens, *counts, *rnd, out_tokens.data_ptr(), num_accepted.data_ptr(), workspace.data_ptr(),
            batch, g, target_probs.shape[-1], DTYPE_CODES[target_probs.dtype], stream)
    return args, [draft_tokens, num_draft_tokens, *keep]


def block_verify(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                 num_draft_tokens=None):
    """CUDA `block_verify` on validated inputs (see specdec_kernels.ops.block_verify)."""
    lib = library()
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_probs, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    with on_device(device):  # the launcher and the workspace use the current device and stream
        workspace = zeroed_workspace(device, lib.block_verify_workspace_bytes(batch, g, vocab))
        args, _keep = block_verify_args(target_probs, draft_probs, draft_tokens, uniforms, seed, offsets,
                                        num_draft_tokens, out_tokens, num_accepted, workspace, stream_handle(device))
        lib.block_verify(*args)
    return out_tokens, num_accepted


register("block_verify", "cuda", block_verify,
         limits=plan_limits("block_verify", lambda s: dict(B=s["B"], G=s["G"], V=s["V"])))


def block_verify_logits_args(target_logits, draft_logits, draft_tokens, temperature, uniforms, seed, offsets,
                             num_draft_tokens, out_tokens, num_accepted, workspace, stream: int) -> tuple[tuple, list]:
    """The positional arguments of `_C.block_verify_logits`, and the tensors they point into."""
    batch, g = draft_tokens.shape
    draft_tokens, num_draft_tokens, tokens, counts = _prepare(draft_tokens, num_draft_tokens)
    if isinstance(temperature, torch.Tensor):
        temperatures = temperature.to(torch.float32)
        temp = (1.0, temperatures.data_ptr(), temperatures.stride(0))
    else:
        temperatures = None
        temp = (float(temperature), 0, 0)
    rnd, keep = _randomness(uniforms, seed, None if uniforms is not None else offsets)
    args = (target_logits.data_ptr(), target_logits.stride(0), target_logits.stride(1),
            draft_logits.data_ptr() if g > 0 else 0, draft_logits.stride(0), draft_logits.stride(1),
            *tokens, *counts, *temp, *rnd, out_tokens.data_ptr(), num_accepted.data_ptr(), workspace.data_ptr(),
            batch, g, target_logits.shape[-1], DTYPE_CODES[target_logits.dtype], stream)
    return args, [draft_tokens, num_draft_tokens, temperatures, *keep]


def block_verify_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                        offsets=None, num_draft_tokens=None):
    """CUDA `block_verify_logits` on validated inputs (see specdec_kernels.ops.block_verify_logits).

    Equal to the torch reference except where a decision lies within the 1e-5 band of
    docs/ops.md "Numerics" (as rejection_sample_logits).
    """
    lib = library()
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    with on_device(device):
        workspace = zeroed_workspace(device, lib.block_verify_logits_workspace_bytes(batch, g, vocab))
        args, _keep = block_verify_logits_args(target_logits, draft_logits, draft_tokens, temperature, uniforms, seed,
                                               offsets, num_draft_tokens, out_tokens, num_accepted, workspace,
                                               stream_handle(device))
        lib.block_verify_logits(*args)
    return out_tokens, num_accepted


register("block_verify_logits", "cuda", block_verify_logits,
         limits=plan_limits("block_verify_logits", lambda s: dict(B=s["B"], G=s["G"], V=s["V"])))
