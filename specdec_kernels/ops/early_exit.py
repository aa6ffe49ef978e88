"""Fused final-norm + LM head + top-k for early-exit heads (PPD)."""

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..common import validate as check
from ..common.limits import FUSED_MAX_K
from ..common.registry import custom_op, implementation, register, resolve

NORMS = ("rms", "layer", "none")


@custom_op("specdec::early_exit_topk", mutates_args=())
def _early_exit_topk_op(hidden: Tensor, norm_weight: Optional[Tensor], norm_bias: Optional[Tensor],
                        lm_head_weight: Tensor, k: int, eps: float, norm: str, backend: str) -> tuple[Tensor, Tensor]:
    return implementation("early_exit_topk", backend)(hidden, norm_weight, lm_head_weight, k, eps=eps, norm=norm,
                                                      norm_bias=norm_bias)


@_early_exit_topk_op.register_fake
def _(hidden, norm_weight, norm_bias, lm_head_weight, k, eps, norm, backend):
    batch = hidden.shape[0]
    return hidden.new_empty(batch, k, dtype=torch.float32), hidden.new_empty(batch, k, dtype=torch.int64)


def early_exit_topk(hidden: Tensor, norm_weight: Tensor | None, lm_head_weight: Tensor, k: int, *, eps: float = 1e-6,
                    norm: str = "rms", norm_bias: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Top-k of lm_head(norm(hidden)) without materialising the [B, V] logits (GPU backends).

    norm="rms": h * rsqrt(mean(h^2) + eps) * norm_weight (pass 1 + w for Gemma-style norms);
    "layer": (h - mean) * rsqrt(var + eps) * norm_weight + norm_bias; "none": h (weights
    ignored). Accumulation in float32; ties go to the lower token id.

    Args:
        hidden: [B, H] float16/bfloat16/float32 hidden states at the exit layer.
        norm_weight: [H] or None; norm_bias: [H] or None (layer norm only).
        lm_head_weight: [V, H], hidden's dtype.
        k: int, 1 <= k <= V; k > FUSED_MAX_K (16) runs the materialised torch path on any backend.
        eps: norm epsilon.

    Returns:
        values [B, k] float32 (descending logits), indices [B, k] int64.
    """
    op = "early_exit_topk"
    check.tensor(op, "hidden", hidden, shape=("B", "H"), dtypes=check.FLOAT_DTYPES)
    hidden_size = hidden.shape[1]
    check.tensor(op, "lm_head_weight", lm_head_weight, shape=("V", hidden_size), dtypes=(hidden.dtype,),
                 device=hidden.device)
    for name, vec in (("norm_weight", norm_weight), ("norm_bias", norm_bias)):
        check.optional_tensor(op, name, vec, shape=(hidden_size,), dtypes=check.FLOAT_DTYPES, device=hidden.device)
    if norm not in NORMS:
        check.fail(op, f"`norm` must be one of {NORMS} (got {norm!r})")
    if norm_bias is not None and norm != "layer":
        check.fail(op, "`norm_bias` only applies to norm='layer'")
    if norm == "none":
        norm_weight = norm_bias = None
    k = check.positive_int(op, "k", k)
    if k > lm_head_weight.shape[0]:
        check.fail(op, f"`k`={k} exceeds the vocabulary size V={lm_head_weight.shape[0]}")
    eps = check.real_number(op, "eps", eps, minimum=0.0)
    chosen = resolve(op, backend, hidden.device, sizes=dict(B=hidden.shape[0], H=hidden_size, V=lm_head_weight.shape[0],
                                                              k=k, dtype=hidden.dtype))
    if k > FUSED_MAX_K:  # beyond the kernels' register budget: the materialised path, on the same device
        chosen = "torch"
    return _early_exit_topk_op(hidden, norm_weight, norm_bias, lm_head_weight, k, eps, norm, chosen)


register("early_exit_topk", "torch", reference.early_exit_topk)
