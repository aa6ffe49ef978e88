"""`adapt(model)`: the adapter of a loaded HF model, chosen by `config.model_type`."""

import torch

from .adapter_base import ModelAdapter
from .decoder_only import GPT2Adapter, RotaryDecoderAdapter
from .seq2seq import BartAdapter

ADAPTERS: dict[str, type[ModelAdapter]] = {
    model_type: adapter for adapter in (RotaryDecoderAdapter, GPT2Adapter, BartAdapter)
    for model_type in adapter.model_types
}
SUPPORTED_MODEL_TYPES = tuple(sorted(ADAPTERS))
# what a DFlash assistant's config has (transformers' muse_glimmer_assistant): refused by name in adapt
DFLASH_CONFIG = ("target_layer_ids", "block_size", "mask_token_id")


def is_dflash_assistant(model) -> bool:
    """Whether `model`'s config is a DFlash assistant's (every key of DFLASH_CONFIG set)."""
    config = getattr(model, "config", None)
    return all(getattr(config, name, None) is not None for name in DFLASH_CONFIG)


def adapt(model: torch.nn.Module) -> ModelAdapter:
    """Wrap a model loaded with transformers (e.g. `AutoModelForCausalLM.from_pretrained(path)`, or
    `AutoModelForSeq2SeqLM` for BART) for speculative decoding on a SpecCache.

    Switches the model's attention implementation to `specdec_tree` (ops.tree_attention on a
    SpecCache; SDPA for encoder and cross-attention). Switch back with
    `model.set_attn_implementation("sdpa")`.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if is_dflash_assistant(model):
        raise ValueError(f"specdec_kernels.hf.adapt: model type {model_type!r} is a DFlash assistant: it drafts in "
                         "strategy 'dflash' (custom_generate: speculation_type='dflash'), not as a causal LM")
    if model_type not in ADAPTERS:
        raise ValueError(f"specdec_kernels.hf.adapt: model type {model_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return ADAPTERS[model_type](model)
