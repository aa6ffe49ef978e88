"""Host-side pieces every Triton launcher shares."""

import contextlib

import torch


def device_scope(device: torch.device):
    """Launch on the tensors' GPU (Triton uses the current device); nothing on the CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def chain_outputs(draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (output_tokens [B, g+1], num_accepted [B]) int64 tensors for a chain verify op."""
    batch, g = draft_tokens.shape
    device = draft_tokens.device
    return (torch.empty(batch, g + 1, dtype=torch.int64, device=device),
            torch.empty(batch, dtype=torch.int64, device=device))
