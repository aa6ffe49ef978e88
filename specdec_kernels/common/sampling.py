"""Exact, order-independent building blocks shared by the verification references.

Sampling from an unnormalised row is done in fixed point so that every backend (torch,
Triton, CUDA) can reproduce it bit for bit whatever its reduction order:
  weight_v = floor(clamp(x_v, 0, 1) * 2^40)   (NaN counts as 0, +inf as 1)
  total    = sum_v weight_v                    (exact in int64 for V < 2^23)
  token    = first v with cumsum(weight)_v > floor(u * total)   (u in [0, 1), float64)
A zero-weight token is never chosen, and the result is always in [0, V) when total > 0.
The quantisation changes each probability by less than 2^-40, far below what any
statistical test or model can see.
"""

import torch

WEIGHT_SCALE = 2.0**40


def as_int64(x: torch.Tensor | None) -> torch.Tensor | None:
    """An index tensor (int64 or int32, any strides) as int64: gather, indexing and the int64
    outputs need it, and the other backends read both widths natively."""
    return None if x is None else x.to(torch.int64)


def nan_to_neg_inf(x: torch.Tensor) -> torch.Tensor:
    """float32 copy of x with NaN replaced by -inf (NaN never wins an argmax)."""
    inf = float("inf")  # one op (the decode loop calls this per step); infinities are kept as they are
    return torch.nan_to_num(x.float(), nan=-inf, posinf=inf, neginf=-inf)


def safe_argmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """argmax with NaN treated as -inf and ties going to the lowest index (all -inf -> 0)."""
    return torch.argmax(nan_to_neg_inf(x), dim=dim)


def to_weights(x: torch.Tensor) -> torch.Tensor:
    """Fixed-point sampling weights (int64) of an unnormalised probability row."""
    x = torch.nan_to_num(x.float(), nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    return torch.floor(x * WEIGHT_SCALE).to(torch.int64)


def draw_threshold(u: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """floor(u * total) as int64, kept in [0, total - 1] (0 for total 0).

    For u in [0, 1) the clamp never acts. On a GPU the ops do not inspect caller uniforms
    (that would sync), so a 1.0 (a float64 near 1 rounded to float32), a value above 1 or
    a NaN can arrive: the clamp keeps the drawn id inside the row on every backend.
    """
    x = u.to(torch.float64) * total.to(torch.float64)
    x = torch.where(x >= 0, x.clamp(max=2.0**62), torch.zeros_like(x))  # NaN and negatives -> 0
    return torch.minimum(x.to(torch.int64), (total - 1).clamp(min=0))


def sample_weights(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draw per row of int64 weights [..., V] with float64 uniforms [...].

    Returns (token [...] int64, valid [...] bool); rows whose total weight is 0 are not
    valid and their token is 0 (callers substitute their own fallback).
    """
    cdf = torch.cumsum(weights, dim=-1)
    total = cdf[..., -1]
    threshold = draw_threshold(u, total)
    token = torch.searchsorted(cdf.contiguous(), threshold.unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    valid = total > 0
    return torch.where(valid, token, torch.zeros_like(token)), valid


def sample_with_fallback(primary: torch.Tensor, fallback: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw from `primary` weights; if empty, from `fallback` weights; if that is empty too,
    take the argmax of the fallback row's weights (0 for an all-zero or all-NaN row)."""
    token, valid = sample_weights(primary, u)
    token_fb, valid_fb = sample_weights(fallback, u)
    last_resort = torch.argmax(fallback, dim=-1)
    return torch.where(valid, token, torch.where(valid_fb, token_fb, last_resort))


def gather_token_values(rows: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [..., V] float, tokens [...] int64 -> (rows[..., token] as float32, in_range mask).

    Out-of-range ids (e.g. -1 padding) read index 0 and are flagged invalid.
    """
    vocab = rows.shape[-1]
    in_range = (tokens >= 0) & (tokens < vocab)
    safe = torch.where(in_range, tokens, torch.zeros_like(tokens))
    return rows.gather(-1, safe.unsqueeze(-1)).squeeze(-1).float(), in_range
