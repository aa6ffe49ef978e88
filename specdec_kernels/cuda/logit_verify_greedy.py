"""CUDA backend of `greedy_verify` (csrc/logit_verify_greedy.cu): one launch per call."""

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ._launch import DTYPE_CODES, as_int64, chain_outputs, library, on_device, plan_limits, pointer, stream_handle


def greedy_verify(target_logits, draft_tokens, *, num_draft_tokens=None):
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)  # the kernel reads int64
    lib = library()
    batch, g = draft_tokens.shape
    vocab = target_logits.shape[-1]
    device = draft_tokens.device
    draft_tokens = draft_tokens.contiguous()
    counts = None if num_draft_tokens is None else num_draft_tokens.contiguous()
    out_tokens, num_accepted = chain_outputs(draft_tokens)
    workspace = zeroed_workspace(device, lib.greedy_verify_workspace_bytes(batch, g))
    with on_device(device):  # the launcher queries the current device's SM count
        lib.greedy_verify(
            target_logits.data_ptr(), target_logits.stride(0), target_logits.stride(1), draft_tokens.data_ptr(),
            pointer(counts), out_tokens.data_ptr(), num_accepted.data_ptr(), workspace.data_ptr(), batch, g, vocab,
            DTYPE_CODES[target_logits.dtype], stream_handle(device))
    return out_tokens, num_accepted


register("greedy_verify", "cuda", greedy_verify,
         limits=plan_limits("greedy_verify", lambda s: dict(B=s["B"], G=s["G"], V=s["V"])))
