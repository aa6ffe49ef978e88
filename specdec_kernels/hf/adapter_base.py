"""What every model adapter offers the decoding strategies: the model's parts and forwards on a SpecCache.

A forward runs in three pieces so early-exit strategies can stop in the middle:
  start(tokens, cache, parents)   embeddings of the N new tokens at positions seq_lens[b] + depth
  run_layers(state, stop)         decoder layers [state.layer, stop), writing their K/V into the cache
  logits(hidden)                  final norm + LM head
A family adapter supplies only its embeddings, the keywords its decoder layers take, and the cache
shape; the decoder layers themselves are the model's own modules, whose attention runs
ops.tree_attention through the `specdec_tree` attention implementation.
"""

import abc
from dataclasses import dataclass

import torch
from torch import Tensor

from ..common import validate as check
from .attention import register
from .cache import SpecCache
from .cache_keyword import cache_keyword


@dataclass
class DecoderState:
    """A forward in flight: `hidden` [B, N, H] after the first `layer` decoder layers (HF's
    `output_hidden_states[layer]` numbering: 0 is the embeddings), and what the remaining
    layers need (the cache, positions, rotary tables, the tree)."""

    hidden: Tensor
    layer: int
    cache: SpecCache
    layer_kwargs: dict


class ModelAdapter(abc.ABC):
    """Base of the per-family adapters. Attributes every adapter sets:

    model: the HF model (its attention implementation is switched to `specdec_tree`).
    embeddings: the token embedding module; layers: the decoder layers (nn.ModuleList);
    final_norm: the norm before the LM head (nn.Identity where there is none); lm_head.
    """

    model_types: tuple[str, ...] = ()

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.config = model.config
        model.set_attn_implementation(register())

    # ---- what a family supplies --------------------------------------------------------------

    @abc.abstractmethod
    def cache_shape(self) -> tuple[int, int, int]:
        """(num_layers, num_kv_heads, head_dim) of the decoder's self-attention."""

    def max_positions(self) -> int | None:
        """Longest sequence the model can place (a learned position table), or None."""
        return None

    @abc.abstractmethod
    def embed(self, tokens: Tensor, positions: Tensor, cache: SpecCache) -> Tensor:
        """[B, N, H] input of the first decoder layer."""

    @abc.abstractmethod
    def layer_kwargs(self, hidden: Tensor, positions: Tensor, cache: SpecCache, parents: Tensor | None) -> dict:
        """Keywords of every decoder-layer call of this forward (cache, positions, tree step)."""

    def logits(self, hidden: Tensor) -> Tensor:
        """[..., V] logits of hidden states [..., H]: final norm, then LM head."""
        return self.lm_head(self.final_norm(hidden))

    # ---- shared ------------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def cache_keyword(self) -> str:
        """The decoder layers' name for the cache (hf/cache_keyword.py), read once per adapter."""
        keyword = self.__dict__.get("_cache_keyword")
        if keyword is None:
            keyword = cache_keyword(self.layers[0].forward) if len(self.layers) else "past_key_values"
            self.__dict__["_cache_keyword"] = keyword
        return keyword

    def new_cache(self, batch_size: int, max_length: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, backend: str = "auto") -> SpecCache:
        """An empty SpecCache for this model: `batch_size` rows of up to `max_length` tokens, in the
        model's dtype and on its device unless given; `backend` runs every op on it (its attention,
        kv_compact, kv_rollback: see SpecCache)."""
        limit = self.max_positions()
        if limit is not None and max_length > limit:
            check.fail("new_cache", f"max_length={max_length} exceeds the model's {limit} learned positions")
        window = getattr(self.config, "sliding_window", None)
        if window is not None and max_length > window:
            check.fail("new_cache", f"max_length={max_length} exceeds the model's sliding window of {window} tokens, "
                                    "which tree_attention does not apply")
        num_layers, num_kv_heads, head_dim = self.cache_shape()
        weight = self.lm_head.weight
        return SpecCache(num_layers, batch_size, num_kv_heads, head_dim, max_length,
                         dtype=dtype or weight.dtype, device=device or weight.device, backend=backend)

    @torch.no_grad()
    def start(self, tokens: Tensor, cache: SpecCache, parents: Tensor | None = None) -> DecoderState:
        """Embed N new tokens per row (int64 [B, N]; a chain, or a tree with parents [B, N])."""
        op = f"{type(self).__name__}.start"
        if not isinstance(cache, SpecCache):
            check.fail(op, f"`cache` must be a SpecCache (got {type(cache).__name__}); make one with new_cache()", TypeError)
        check.tensor(op, "tokens", tokens, shape=("B", "N"), dtypes=check.INDEX_DTYPES, device=cache.seq_lens.device,
                     last_dim_contiguous=False)
        if tokens.shape[0] != cache.batch_size:
            check.fail(op, f"`tokens` has {tokens.shape[0]} rows but the cache holds {cache.batch_size}")
        if tokens.shape[1] == 0:
            check.fail(op, "`tokens` must hold at least one token per row")
        if parents is not None:
            check.tensor(op, "parents", parents, shape=tuple(tokens.shape), dtypes=check.INDEX_DTYPES,
                         device=tokens.device, last_dim_contiguous=False)
            check.tree_parents(op, parents)
        positions = cache.positions(tokens.shape[1], parents)
        hidden = self.embed(tokens, positions, cache)
        return DecoderState(hidden, 0, cache, self.layer_kwargs(hidden, positions, cache, parents))

    @torch.no_grad()
    def run_layers(self, state: DecoderState, stop: int | None = None) -> DecoderState:
        """Run decoder layers [state.layer, stop) (default: to the last); returns the new state."""
        stop = self.num_layers if stop is None else stop
        if not state.layer <= stop <= self.num_layers:
            check.fail("run_layers", f"`stop` must be in [{state.layer}, {self.num_layers}] (got {stop})")
        hidden = state.hidden
        for layer in self.layers[state.layer:stop]:
            hidden = layer(hidden, **state.layer_kwargs)
        return DecoderState(hidden, stop, state.cache, state.layer_kwargs)

    def forward_to_layer(self, tokens: Tensor, cache: SpecCache, layer: int,
                         parents: Tensor | None = None) -> DecoderState:
        """Early exit: the hidden state after the first `layer` decoder layers (state.hidden,
        [B, N, H]); those layers' K/V are in the cache. Finish with continue_from(state)."""
        return self.run_layers(self.start(tokens, cache, parents), layer)

    @torch.no_grad()
    def continue_from(self, state: DecoderState) -> Tensor:
        """Run the remaining layers of an early-exited forward; [B, N, V] logits."""
        return self.logits(self.run_layers(state).hidden)

    def verify(self, tokens: Tensor, cache: SpecCache, parents: Tensor | None = None) -> Tensor:
        """One forward of a chain (parents=None) or a tree of N tokens per row through the cache:
        [B, N, V] logits. Node i's K/V land at seq_lens[b] + i; the lengths do not move until
        cache.commit / rollback / compact says what stays."""
        return self.continue_from(self.start(tokens, cache, parents))

    def prefill(self, input_ids: Tensor, cache: SpecCache, lengths: Tensor | None = None, *,
                logits: bool | str = True, norm_all: bool = False) -> Tensor | None:
        """Prompts, right-padded to [B, P], as one chain after each row's cached tokens; then
        each row keeps its true length (`lengths` [B] int64, default P). [B, P, V] logits:
        row b's next-token logits are at lengths[b] - 1. logits="last": [B, 1, V], only those
        (the LM head on B positions: what a decode loop reads). logits=False fills the cache only
        and returns None (the decoding engine's prefill feeds every prompt token but the last,
        whose logits it never reads). norm_all: the final norm runs on every position whatever
        logits says (a drafter reads its output through a hook; HF's model norms every position too)."""
        hidden = self.run_layers(self.start(input_ids, cache)).hidden
        if lengths is not None and not isinstance(lengths, Tensor):
            lengths = torch.as_tensor(lengths, dtype=torch.int64, device=cache.seq_lens.device)
        head = self.logits
        if norm_all:
            hidden, head = self.final_norm(hidden), self.lm_head
        if logits == "last":
            if lengths is not None:
                last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
                hidden = hidden.gather(1, last)
            else:
                hidden = hidden[:, -1:]
        out = head(hidden) if logits else None
        cache.commit(input_ids.shape[1] if lengths is None else lengths)
        return out
