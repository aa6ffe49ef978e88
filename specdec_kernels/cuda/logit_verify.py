"""CUDA backends of `relaxed_verify`, `bild_verify` and `max_prob` (csrc/logit_verify.cu):
one launch per call, no host sync, workspaces from the per-stream zeroed cache."""

import math
import struct

import torch

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ._launch import DTYPE_CODES, as_int64, chain_launch, library, on_device, plan_limits, pointer, stream_handle


def _float32(value: float) -> float:
    """`value` rounded to the nearest float32 (+inf past the float32 range).

    The reference compares a float32 tensor with a Python float, which torch does in
    float32 (the scalar is cast to the tensor's dtype), so `gap < tau` and
    `nll <= threshold` must use the float32-rounded threshold to agree bit for bit
    near it. The kernels take the rounded value.
    """
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # rounds past FLT_MAX; thresholds are >= 0
        return math.inf


def _launch_chain(launch, target_logits, draft_tokens, num_draft_tokens, *rule_args):
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)  # the kernel reads int64
    lib = library()
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    draft_tokens = draft_tokens.contiguous()
    counts = None if num_draft_tokens is None else num_draft_tokens.contiguous()
    with on_device(device):  # the workspace size and the launch use the current device's SM count
        nbytes = lib.logit_verify_workspace_bytes(batch, g, vocab)
        workspace = zeroed_workspace(device, nbytes)
        launch(target_logits.data_ptr(), target_logits.stride(0), target_logits.stride(1), draft_tokens.data_ptr(),
               pointer(counts), out_tokens.data_ptr(), num_accepted.data_ptr(), workspace.data_ptr(),
               workspace.numel(), batch, g, vocab, DTYPE_CODES[target_logits.dtype], *rule_args,
               stream_handle(device))
    return out_tokens, num_accepted


def relaxed_verify(target_logits, draft_tokens, *, top_beta: int, tau: float, num_draft_tokens=None):
    # a rank is at most V - 1, so any top_beta > V behaves like V + 1 (and fits in int64)
    top_beta = min(int(top_beta), target_logits.shape[-1] + 1)
    return _launch_chain(library().relaxed_verify, target_logits, draft_tokens, num_draft_tokens, top_beta,
                         _float32(tau))


def bild_verify(target_logits, draft_tokens, *, rollback_threshold: float, num_draft_tokens=None):
    return _launch_chain(library().bild_verify, target_logits, draft_tokens, num_draft_tokens,
                         _float32(rollback_threshold))


def max_prob(logits):
    lib = library()
    vocab = logits.shape[-1]
    device = logits.device
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=device)
    rows = out.numel()
    if rows == 0:
        return out
    # [R, V] rows with one row stride: a view when the leading dims collapse, else a copy
    flat = logits.reshape(rows, vocab)
    if vocab > 1 and flat.stride(1) != 1:  # cannot happen for validated inputs; never read strided
        flat = flat.contiguous()
    with on_device(device):
        nbytes = lib.max_prob_workspace_bytes(rows, vocab)
        workspace = zeroed_workspace(device, nbytes)
        lib.max_prob(flat.data_ptr(), flat.stride(0), out.data_ptr(), workspace.data_ptr(), workspace.numel(), rows,
                     vocab, DTYPE_CODES[flat.dtype], stream_handle(device))
    return out


_chain_limits = plan_limits("logit_verify", lambda s: dict(B=s["B"], G=s["G"], V=s["V"]))
register("relaxed_verify", "cuda", relaxed_verify, limits=_chain_limits)
register("bild_verify", "cuda", bild_verify, limits=_chain_limits)
register("max_prob", "cuda", max_prob, limits=plan_limits("max_prob", lambda s: dict(R=s["R"], V=s["V"])))
