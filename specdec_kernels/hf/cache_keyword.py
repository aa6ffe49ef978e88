"""The keyword under which an HF forward takes its KV cache: `cache` in recent transformers,
`past_key_values` before. Passing the old name to a model that has the new one works but prints
transformers' FutureWarning ("`past_key_values` is deprecated ... Use `cache` instead") on every run."""

import inspect

from transformers.generation.utils import GenerationMixin


def cache_keyword(forward) -> str:
    """"cache" if `forward` (a layer's or model's forward; decorators are seen through) takes it, else
    "past_key_values"."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


# for a model forward whose module is not at hand (SpecCache.forward_kwargs): the installed
# transformers' own name, read from the generation code every model shares
MODEL_CACHE_KEYWORD = cache_keyword(GenerationMixin.prepare_inputs_for_generation)
