"""`decode(target, drafter, input_ids, ...)`: one engine call with a drafter object, `generate`'s arguments
checked and standardised. `generate` is this once the strategy table has made the drafter of a name;
a drafter's own `.generate(input_ids, ...)` is this with its target."""

import warnings

import torch

from ..common import validate as check
from .engine import OP, Engine, eos_list, restored_attention
from .output import GenerateOutput
from .padding import attention_mask_for
from .standardize import Sampling, unused_sampling_settings


def _check_positions(model, role: str, input_ids, attention_mask, max_new_tokens) -> None:
    """A rotary model places any position, so nothing stops a decode past the positions it was trained
    for: refuse prompt + max_new_tokens beyond config.max_position_embeddings, as HF's learned
    position tables (checked by the engine) would."""
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if (not isinstance(limit, int) or getattr(config, "is_encoder_decoder", False)
            or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2
            or not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool)):
        return  # encoder-decoders place only generated tokens (the engine checks those); bad input: the engine says
    longest = input_ids.shape[1]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.shape == input_ids.shape and longest:
        longest = int(attention_mask.sum(-1).max())
    if longest + max_new_tokens > limit:
        check.fail(OP, f"the longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = "
                       f"{longest + max_new_tokens} positions exceeds the {role} model's {limit} "
                       "(config.max_position_embeddings): shorten the prompt or lower max_new_tokens")


@torch.no_grad()
def decode(target, drafter, input_ids: torch.Tensor, *, named: bool = False, attention_mask: torch.Tensor | None = None,
           max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, eos_token_id=None, pad_token_id: int | None = None, seed: int | None = None,
           backend: str = "auto", cuda_graphs: bool | None = None, min_p: float | None = None, min_new_tokens: int = 0,
           on_step=None, **strategy_options) -> GenerateOutput:
    """`specdec_kernels.generate`'s call with `drafter` (a Drafter object: generate checks what it is given) as
    its strategy; the keywords are generate's. named: the drafter was made from a strategy name for this call (kept CUDA graphs are then
    matched by its configuration, not by the object)."""
    if strategy_options:
        check.fail(OP, f"options {sorted(strategy_options)} go to the strategy's constructor, not to generate()")
    if pad_token_id is None:
        pad_token_id = getattr(getattr(target, "generation_config", None), "pad_token_id", None)
    attention_mask = attention_mask_for(OP, input_ids, attention_mask, pad_token_id, eos_list(target, eos_token_id))
    _check_positions(target, "target", input_ids, attention_mask, max_new_tokens)
    draft = getattr(drafter, "draft_model", None)
    if isinstance(draft, torch.nn.Module):
        _check_positions(draft, "draft", input_ids, attention_mask, max_new_tokens)
    unused = unused_sampling_settings(bool(do_sample), temperature=temperature, top_k=top_k, top_p=top_p,
                                      min_p=min_p, seed=seed)
    if unused:  # as HF's GenerationConfig: a warning, and the call decodes greedily
        warnings.warn(f"{OP}: {', '.join(unused)} {'applies' if len(unused) == 1 else 'apply'} to sampling and "
                      "greedy decoding ignores it: pass do_sample=True", UserWarning, stacklevel=4)
    sampling = Sampling(bool(do_sample), float(temperature), top_k, top_p, min_p)
    if on_step is not None and not callable(on_step):
        check.fail(OP, f"`on_step` must be callable (got {type(on_step).__name__})", TypeError)
    with restored_attention(target, *drafter.adapted_models()):
        engine = Engine(target, drafter, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                        sampling=sampling, eos_token_id=eos_token_id, pad_token_id=pad_token_id, seed=seed,
                        backend=backend, cuda_graphs=cuda_graphs, named=named, on_step=on_step,
                        min_new_tokens=min_new_tokens)
        return engine.run()
