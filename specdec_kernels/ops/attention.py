"""Tree / chain verification attention: N new tokens per row against a KV cache."""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from . import _validate as check
from ._backend import implementation, register, resolve

HALF_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@torch.library.custom_op("specdec::tree_attention", mutates_args=())
def _tree_attention_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, parents: Optional[Tensor],
                       sm_scale: float, backend: str) -> tuple[Tensor, Tensor]:
    return implementation("tree_attention", backend)(q, k_cache, v_cache, seq_lens, parents, sm_scale=sm_scale)


@_tree_attention_op.register_fake
def _(q, k_cache, v_cache, seq_lens, parents, sm_scale, backend):
    batch, n, hq, _ = q.shape
    return torch.empty_like(q), q.new_empty(batch, n, hq, dtype=torch.float32)


def tree_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor, parents: Tensor | None = None, *,
                   sm_scale: float | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Attention of N draft tokens (a chain or a tree) per row over the row's KV cache.

    The N tokens' own K/V must already be written at positions seq_lens[b] .. seq_lens[b]+N-1
    (node i at seq_lens[b] + i). Node i attends to the whole prefix [0, seq_lens[b]) and to
    itself and its ancestors among the N nodes; `parents=None` is a causal chain. An unused
    slot (parent -1, i > 0) attends to the prefix and itself.

    Args:
        q: [B, N, Hq, D] float16/bfloat16/float32 queries (RoPE already applied).
        k_cache, v_cache: [B, Hkv, S_max, D], q's dtype; Hq must be a multiple of Hkv (GQA).
        seq_lens: [B] int64/int32, prefix lengths; seq_lens[b] + N <= S_max.
        parents: [B, N] int64 tree (see ops.tree_verify) or None for a chain.
        sm_scale: softmax scale (default 1/sqrt(D)).
        backend: "auto" | "torch" | "triton" | "cuda".

    Returns:
        out [B, N, Hq, D] in q's dtype, lse [B, N, Hq] float32 (natural-log
        log-sum-exp of the scaled scores, for merging partial attentions).
    """
    op = "tree_attention"
    check.tensor(op, "q", q, shape=("B", "N", "Hq", "D"), dtypes=HALF_DTYPES)
    batch, n, hq, d = q.shape
    check.tensor(op, "k_cache", k_cache, shape=(batch, "Hkv", "S_max", d), dtypes=(q.dtype,), device=q.device)
    hkv, s_max = k_cache.shape[1], k_cache.shape[2]
    check.tensor(op, "v_cache", v_cache, shape=(batch, hkv, s_max, d), dtypes=(q.dtype,), device=q.device)
    if hkv == 0 or hq % hkv:
        check.fail(op, f"query heads Hq={hq} must be a multiple of KV heads Hkv={hkv}")
    check.tensor(op, "seq_lens", seq_lens, shape=(batch,), dtypes=(torch.int64, torch.int32), device=q.device,
                 last_dim_contiguous=False)
    if check.can_inspect(seq_lens) and batch and (int(seq_lens.min()) < 0 or int(seq_lens.max()) + n > s_max):
        check.fail(op, f"need 0 <= seq_lens[b] and seq_lens[b] + N <= S_max={s_max} (N={n}, "
                       f"seq_lens in [{int(seq_lens.min())}, {int(seq_lens.max())}])")
    if parents is not None:
        check.tensor(op, "parents", parents, shape=(batch, n), dtypes=check.INDEX_DTYPES, device=q.device,
                     last_dim_contiguous=False)
        check.tree_parents(op, parents)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else check.real_number(op, "sm_scale", sm_scale)
    return _tree_attention_op(q, k_cache, v_cache, seq_lens, parents, scale, resolve(op, backend, q.device))


register("tree_attention", "torch", reference.tree_attention)
