"""Calls into the torch-free CUDA module: allocate outputs with torch, pass raw pointers."""

import torch

from .. import _cuda_module
from ._backend import register

# dtype codes shared with csrc/common.cuh
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def greedy_verify(target_logits, draft_tokens, *, num_draft_tokens=None):
    lib = _cuda_module.load()
    batch, g = draft_tokens.shape
    vocab = target_logits.shape[-1]
    draft_tokens = draft_tokens.contiguous()
    out_tokens = torch.empty(batch, g + 1, dtype=torch.int64, device=draft_tokens.device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=draft_tokens.device)
    workspace = torch.zeros(lib.greedy_verify_workspace_bytes(batch, g), dtype=torch.uint8, device=draft_tokens.device)
    counts = 0 if num_draft_tokens is None else num_draft_tokens.contiguous()
    with torch.cuda.device(draft_tokens.device):
        lib.greedy_verify(
            target_logits.data_ptr(), target_logits.stride(0), target_logits.stride(1), draft_tokens.data_ptr(),
            0 if num_draft_tokens is None else counts.data_ptr(), out_tokens.data_ptr(), num_accepted.data_ptr(),
            workspace.data_ptr(), batch, g, vocab, DTYPE_CODES[target_logits.dtype], _stream(draft_tokens.device))
    return out_tokens, num_accepted


register("greedy_verify", "cuda", greedy_verify)
