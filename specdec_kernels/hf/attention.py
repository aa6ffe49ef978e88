"""The `specdec_tree` attention implementation: HF attention layers on a SpecCache run ops.tree_attention.

Registered with transformers' public `AttentionInterface` (and `AttentionMaskInterface`), so any
model whose attention modules call `ALL_ATTENTION_FUNCTIONS.get_interface(...)` (Llama, Qwen2,
Mistral, GPT-2, BART, ...) verifies chains and trees with our kernel after
`model.set_attn_implementation(ATTENTION_NAME)`; no model code is copied.

A forward on a SpecCache passes one extra keyword, `specdec_step=TreeStep(cache, parents)`: HF
forwards unknown keywords from the model's forward down to the attention function. The new
tokens' K/V were written by `SpecCache.update` at seq_lens[b] + i just before the call.

The cache's `backend` picks the kernel. Eager chains on the CPU with backend "auto" or "torch" take a
lean path instead (`lean_chain`: torch SDPA with one mask per forward, shared by every layer): the
same attention as the op's torch reference, without its checks, dispatch and lse.
"""

from dataclasses import dataclass, field

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
    # the lean chain path's plan, made by the forward's first attention layer, used by all of them
    plans: dict = field(default_factory=dict, compare=False, repr=False)

    def chain_plan(self, num_tokens: int) -> "ChainPlan":
        plan = self.plans.get(num_tokens)
        if plan is None:
            plan = self.plans[num_tokens] = ChainPlan.of(self.cache.seq_lens, num_tokens)
        return plan


@dataclass(frozen=True)
class ChainPlan:
    """What every layer of one chain forward shares: `span` = max(seq_lens) + N cache slots to read
    and the bool mask [B, 1, N, span] (True = visible: slot s for new token i of row b when
    s <= seq_lens[b] + i), or None where every row sees all `span` slots causally without one
    (one row and one new token: the decode step)."""

    span: int
    mask: Tensor | None

    @staticmethod
    def of(seq_lens: Tensor, num_tokens: int) -> "ChainPlan":
        lengths = seq_lens.tolist()  # CPU only: free
        span = max(lengths, default=0) + num_tokens
        if num_tokens == 1 and len(set(lengths)) <= 1:
            return ChainPlan(span, None)
        slots = torch.arange(span, device=seq_lens.device)
        last = seq_lens.view(-1, 1, 1, 1) + torch.arange(num_tokens, device=seq_lens.device).view(1, 1, -1, 1)
        return ChainPlan(span, slots.view(1, 1, 1, -1) <= last)


LEAN_BACKENDS = ("auto", "torch")  # the cache backends the lean path stands in for (on the CPU, both are torch)


def lean_chain(step: TreeStep, query: Tensor) -> bool:
    """Whether a forward takes the lean chain path: a chain on CPU tensors, eager (a compiled or
    traced forward keeps the custom op, which torch.compile needs), on a cache whose backend is
    the torch one (another named backend must run its own kernel: that is what naming it tests)."""
    return (step.parents is None and query.device.type == "cpu" and not torch.compiler.is_compiling()
            and type(query) is Tensor and step.cache.backend in LEAN_BACKENDS)


def chain_attention(query: Tensor, key: Tensor, value: Tensor, plan: ChainPlan, scaling: float | None) -> Tensor:
    """query [B, Hq, N, D], the cache's key/value [B, Hkv, S_max, D] -> [B, N, Hq, D]. Slots past a
    row's own are masked out; they hold that row's older K/V or zeros (SpecCache storage starts
    zeroed and only ever receives K/V), never NaN, so masked weights of exactly 0 stay 0."""
    key, value = key[:, :, :plan.span], value[:, :, :plan.span]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=plan.mask, scale=scaling,
                                                           enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2)


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
    runs ops.tree_attention with the cache's lengths, backend and the step's tree; the mask HF passes is
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
        if lean_chain(specdec_step, query):
            return chain_attention(query, key, value, specdec_step.chain_plan(query.shape[2]), scaling), None
        out, _ = ops.tree_attention(query.transpose(1, 2), key, value, cache.seq_lens, specdec_step.parents,
                                    sm_scale=scaling, backend=cache.backend)
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
