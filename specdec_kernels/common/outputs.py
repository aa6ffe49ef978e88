"""Output tensors of the verify ops, allocated by every GPU backend the same way."""

import torch


def chain_outputs(draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (output_tokens [B, g+1], num_accepted [B]) int64 tensors for a chain verify op."""
    batch, g = draft_tokens.shape
    device = draft_tokens.device
    return (torch.empty(batch, g + 1, dtype=torch.int64, device=device),
            torch.empty(batch, dtype=torch.int64, device=device))


def topk_outputs(hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (values [B, k] float32, indices [B, k] int64) tensors for `early_exit_topk` on hidden [B, H]."""
    batch, device = hidden.shape[0], hidden.device
    return (torch.empty(batch, k, dtype=torch.float32, device=device),
            torch.empty(batch, k, dtype=torch.int64, device=device))


def tree_outputs(tree_tokens: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty (output_tokens [B, D+1], num_accepted [B], accepted_nodes [B, D+1]) int64 tensors."""
    batch = tree_tokens.shape[0]
    device = tree_tokens.device
    return (torch.empty(batch, max_depth + 1, dtype=torch.int64, device=device),
            torch.empty(batch, dtype=torch.int64, device=device),
            torch.empty(batch, max_depth + 1, dtype=torch.int64, device=device))
