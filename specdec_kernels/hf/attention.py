"""The `specdec_tree` attention implementation: HF attention layers on a SpecCache run ops.tree_attention.

Registered with transformers' public `AttentionInterface` (and `AttentionMaskInterface`), so any
model whose attention modules call `ALL_ATTENTION_FUNCTIONS.get_interface(...)` (Llama, Qwen2,
Mistral, GPT-2, BART, ...) verifies chains and trees with our kernel after
`model.set_attn_implementation(ATTENTION_NAME)`; no model code is copied.

A forward on a SpecCache passes one extra keyword, `specdec_step=TreeStep(cache, parents)`: HF
forwards unknown keywords from the model's forward down to the attention function. The new
tokens' K/V were written by `SpecCache.update` at seq_lens[b] + i just before the call.
"""

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .. import ops
from ..reference.tree import tree_depths

ATTENTION_NAME = "specdec_tree"


@dataclass(frozen=True)
class TreeStep:
    """One forward of N new tokens per row on `cache`: a chain (parents=None) or a tree
    (`parents [B, N]` int64, node 0 the root, see ops.tree_attention)."""

    cache: object  # a SpecCache (not imported here: cache.py builds TreeSteps)
    parents: Tensor | None = None


def tree_positions(seq_lens: Tensor, num_tokens: int, parents: Tensor | None) -> Tensor:
    """int64 [B, N] position ids of N new tokens: seq_lens[b] + depth(node), so siblings share
    a position and a chain gets seq_lens[b] + i (what HF would use for the row on its own)."""
    if parents is None:
        depth = torch.arange(num_tokens, device=seq_lens.device).unsqueeze(0)
    else:
        depth = tree_depths(parents)
    return seq_lens.to(torch.int64).unsqueeze(1) + depth


def tree_attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                           specdec_step: TreeStep | None = None, sliding_window: int | None = None,
                           **kwargs) -> tuple[Tensor, None]:
    """HF attention-interface function: query [B, Hq, N, D], key/value [B, Hkv, S, D] as the
    attention module hands them over; returns ([B, N, Hq, D], None).

    Self-attention on a SpecCache (its update returned the cache's own [B, Hkv, S_max, D] view)
    runs ops.tree_attention with the cache's lengths and the step's tree; the mask HF passes is
    ignored (the kernel derives the causal/tree structure itself). Attention over anything else
    (an encoder's self-attention, a decoder's cross-attention) is HF's SDPA with HF's mask.
    """
    if specdec_step is not None and specdec_step.cache.holds(key):
        cache = specdec_step.cache
        if sliding_window is not None and cache.max_length > sliding_window:
            raise ValueError(f"{ATTENTION_NAME}: this layer uses a sliding window of {sliding_window} tokens, which "
                             f"tree_attention does not apply; use a SpecCache with max_length <= {sliding_window}")
        if dropout:
            raise ValueError(f"{ATTENTION_NAME}: attention dropout is not supported (call model.eval())")
        out, _ = ops.tree_attention(query.transpose(1, 2), key, value, cache.seq_lens, specdec_step.parents,
                                    sm_scale=scaling)
        return out, None
    if getattr(module, "is_causal", False):
        raise ValueError(f"{ATTENTION_NAME}: decoder self-attention runs only on a SpecCache: pass "
                         "past_key_values=SpecCache(...) with **cache.forward_kwargs(...) (or use specdec_kernels.hf.adapt), "
                         "or switch the model back with model.set_attn_implementation('sdpa')")
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    return sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                sliding_window=sliding_window, **kwargs)


def _is_causal(mask_function) -> bool:
    """Whether an HF mask function hides later keys (causal, sliding-window or chunked causal):
    probe query 0 against key 1 with 0-d index tensors, as HF's mask builders call them."""
    zero, one = torch.zeros((), dtype=torch.int64), torch.ones((), dtype=torch.int64)
    return not bool(mask_function(zero, zero, zero, one))


def tree_attention_mask(*, mask_function, **kwargs):
    """HF mask hook: no causal mask at all (the kernel masks by lengths and tree, so HF does not
    build a dense [B, 1, N, S_max] mask); encoder and cross-attention masks as SDPA builds them."""
    if _is_causal(mask_function):
        return None
    return sdpa_mask(mask_function=mask_function, **kwargs)


def register() -> str:
    """Register the attention function and its mask hook under ATTENTION_NAME (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, tree_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, tree_attention_mask)
    return ATTENTION_NAME
