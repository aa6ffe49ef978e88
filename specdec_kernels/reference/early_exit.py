"""Reference fused norm + LM head + top-k for early-exit heads."""

import torch

from ..common.sampling import nan_to_neg_inf


def normalize(hidden, weight, bias, *, eps: float, norm: str):
    h = hidden.float()
    if norm == "rms":
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    elif norm == "layer":
        mean = h.mean(dim=-1, keepdim=True)
        var = (h - mean).pow(2).mean(dim=-1, keepdim=True)
        h = (h - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        h = h * weight.float()
    if bias is not None:
        h = h + bias.float()
    return h


def early_exit_topk(hidden, norm_weight, lm_head_weight, k: int, *, eps: float = 1e-6, norm: str = "rms",
                    norm_bias=None):
    """Top-k logits of lm_head(norm(hidden)) in float32; ties go to the lower token id."""
    h = normalize(hidden, norm_weight, norm_bias, eps=eps, norm=norm)
    logits = nan_to_neg_inf(h @ lm_head_weight.float().t())
    values, indices = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[:, :k].contiguous(), indices[:, :k].contiguous()
