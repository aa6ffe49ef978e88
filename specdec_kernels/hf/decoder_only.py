"""Adapters of decoder-only families: rotary models (Llama, Mistral, Qwen2, Qwen3) and GPT-2."""

import torch
from torch import Tensor

from .adapter_base import ModelAdapter
from .cache import SpecCache


class RotaryDecoderAdapter(ModelAdapter):
    """`*ForCausalLM` with `model.embed_tokens`, `model.layers`, `model.norm`, `model.rotary_emb`:
    each layer takes the rotary (cos, sin) of the rows' own position ids."""

    model_types = ("llama", "mistral", "qwen2", "qwen3", "glm4_moe", "ernie4_5_moe")  # the last two: strategy mtp

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        body = model.model
        self.embeddings, self.layers, self.final_norm = body.embed_tokens, body.layers, body.norm
        self.rotary = body.rotary_emb
        self.lm_head = model.lm_head

    def cache_shape(self) -> tuple[int, int, int]:
        config = self.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return config.num_hidden_layers, config.num_key_value_heads, head_dim

    def embed(self, tokens: Tensor, positions: Tensor, cache: SpecCache) -> Tensor:
        return self.embeddings(tokens)

    def layer_kwargs(self, hidden: Tensor, positions: Tensor, cache: SpecCache, parents: Tensor | None) -> dict:
        return {"attention_mask": None, "position_ids": positions, self.cache_keyword: cache, "use_cache": True,
                "position_embeddings": self.rotary(hidden, positions), "specdec_step": cache.step(parents)}


class GPT2Adapter(ModelAdapter):
    """GPT2LMHeadModel: learned absolute positions (wpe) added to the token embeddings (wte)."""

    model_types = ("gpt2",)

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        body = model.transformer
        self.embeddings, self.position_embeddings = body.wte, body.wpe
        self.layers, self.final_norm, self.lm_head = body.h, body.ln_f, model.lm_head
        self.dropout = body.drop

    def cache_shape(self) -> tuple[int, int, int]:
        config = self.config
        return config.n_layer, config.n_head, config.n_embd // config.n_head

    def max_positions(self) -> int:
        return self.config.n_positions

    def embed(self, tokens: Tensor, positions: Tensor, cache: SpecCache) -> Tensor:
        return self.dropout(self.embeddings(tokens) + self.position_embeddings(positions))

    def layer_kwargs(self, hidden: Tensor, positions: Tensor, cache: SpecCache, parents: Tensor | None) -> dict:
        return {"attention_mask": None, self.cache_keyword: cache, "use_cache": True, "specdec_step": cache.step(parents)}
