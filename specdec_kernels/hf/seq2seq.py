"""Encoder-decoder adapter (BART): the decoder's self-attention cache is a SpecCache; cross-attention
is HF's own (SDPA over the encoder states, its K/V kept in a DynamicCache as HF keeps them)."""

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask

from ..common import validate as check
from .adapter_base import ModelAdapter
from .cache import SpecCache


@dataclass
class EncoderState:
    """The encoder side of a batch, attached to the decoder's SpecCache (`cache.encoder`) so rows
    are dropped and reordered together. hidden [B, S_enc, H]; attention_mask [B, S_enc] (1 = token)
    or None; cross_cache holds each decoder layer's cross-attention K/V once computed."""

    hidden: Tensor
    attention_mask: Tensor | None
    cross_cache: DynamicCache

    def select_rows(self, indices: Tensor) -> None:
        self.hidden = self.hidden.index_select(0, indices)
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask.index_select(0, indices)
        self.cross_cache.batch_select_indices(indices)


class BartAdapter(ModelAdapter):
    """BartForConditionalGeneration. Call encode(...) once per batch, then the decoder forwards
    (prefill / verify / forward_to_layer) run on the SpecCache as for decoder-only models."""

    model_types = ("bart",)

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        decoder = model.get_decoder()
        self.embeddings, self.position_table = decoder.embed_tokens, decoder.embed_positions
        self.embedding_norm, self.layers = decoder.layernorm_embedding, decoder.layers
        self.final_norm, self.lm_head = torch.nn.Identity(), model.lm_head  # BART has no norm after the last layer

    def cache_shape(self) -> tuple[int, int, int]:
        config = self.config
        return config.decoder_layers, config.decoder_attention_heads, config.d_model // config.decoder_attention_heads

    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    @torch.no_grad()
    def encode(self, input_ids: Tensor, cache: SpecCache, attention_mask: Tensor | None = None) -> EncoderState:
        """Run the encoder over [B, S_enc] source tokens (attention_mask marks padding) and attach
        the result to `cache`; returns it."""
        if input_ids.shape[0] != cache.batch_size:
            check.fail("BartAdapter.encode", f"`input_ids` has {input_ids.shape[0]} rows but the cache holds "
                                             f"{cache.batch_size}")
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        cache.encoder = EncoderState(hidden, attention_mask, DynamicCache())
        return cache.encoder

    def embed(self, tokens: Tensor, positions: Tensor, cache: SpecCache) -> Tensor:
        # BART's learned positions are offset by 2; the module itself only takes one shared
        # position range, so look the rows' own positions up in its table.
        placed = torch.nn.functional.embedding(positions + self.position_table.offset, self.position_table.weight)
        return self.embedding_norm(self.embeddings(tokens) + placed)  # (inference: no dropout)

    def layer_kwargs(self, hidden: Tensor, positions: Tensor, cache: SpecCache, parents: Tensor | None) -> dict:
        encoder = cache.encoder
        if encoder is None:
            check.fail(type(self).__name__, "the cache has no encoder states: call encode(input_ids, cache) first")
        cross_mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden,
                                               attention_mask=encoder.attention_mask,
                                               encoder_hidden_states=encoder.hidden)
        return {"attention_mask": None, "encoder_hidden_states": encoder.hidden, "encoder_attention_mask": cross_mask,
                self.cache_keyword: EncoderDecoderCache(cache, encoder.cross_cache), "use_cache": True,
                "specdec_step": cache.step(parents)}

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden) + self.model.final_logits_bias.to(hidden.device)
