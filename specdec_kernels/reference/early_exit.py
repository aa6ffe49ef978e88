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


# LM-head rows widened to float32 at a time: a 16-bit head (2.1 GB as float32 at 128256 x 4096) is
# never copied whole; 8192 rows of H 4096 are 134 MB
LOGIT_ROWS = 8192


def head_logits(h, lm_head_weight):
    """float32 h @ lm_head_weight^T: a float32 head as it is, a 16-bit one widened LOGIT_ROWS rows at a time."""
    if lm_head_weight.dtype == torch.float32:
        return h @ lm_head_weight.t()
    vocab = lm_head_weight.shape[0]
    out = torch.empty(h.shape[0], vocab, dtype=torch.float32, device=h.device)
    for start in range(0, vocab, LOGIT_ROWS):
        out[:, start:start + LOGIT_ROWS] = h @ lm_head_weight[start:start + LOGIT_ROWS].float().t()
    return out


def early_exit_topk(hidden, norm_weight, lm_head_weight, k: int, *, eps: float = 1e-6, norm: str = "rms",
                    norm_bias=None):
    """Top-k logits of lm_head(norm(hidden)) in float32; ties go to the lower token id."""
    h = normalize(hidden, norm_weight, norm_bias, eps=eps, norm=norm)
    logits = nan_to_neg_inf(head_logits(h, lm_head_weight))
    values, indices = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[:, :k].contiguous(), indices[:, :k].contiguous()
