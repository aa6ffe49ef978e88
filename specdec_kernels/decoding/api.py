"""`specdec_kernels.generate`: the public entry of every decoding strategy."""

import inspect
import warnings

import torch

from ..common import validate as check
from .engine import OP, Engine, eos_list, restored_attention
from .padding import attention_mask_for
from .strategy import Strategy
from .output import GenerateOutput
from .standardize import Sampling, unused_sampling_settings


def _strategies() -> dict:
    from .bild import BildDecoder
    from .lookup import LookupDecoder
    from .plain import PlainDecoder
    from .ppd import PPDDecoder
    from .specdec import SpecDecDecoder
    from .speculative import SpeculativeDecoder
    return {"speculative": SpeculativeDecoder, "bild": BildDecoder, "specdec": SpecDecDecoder, "ppd": PPDDecoder,
            "lookup": LookupDecoder, "plain": PlainDecoder}


def accepted_options(name: str) -> list[str]:
    """The keywords strategy `name` accepts (its constructor's, less the target)."""
    return [option for option in inspect.signature(_strategies()[name]).parameters if option != "target"]


def _check_options(name: str, options: dict) -> None:
    accepted = accepted_options(name)
    unknown = [option for option in options if option not in accepted]
    if unknown:
        check.fail(OP, f"strategy {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                       f"{', '.join(accepted) or 'none'}", TypeError)


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
def generate(target, input_ids: torch.Tensor, *, strategy, attention_mask: torch.Tensor | None = None,
             max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, eos_token_id=None, pad_token_id: int | None = None, seed: int | None = None,
             backend: str = "auto", cuda_graphs: bool | None = None, min_p: float | None = None, min_new_tokens: int = 0, on_step=None,
             **strategy_options) -> GenerateOutput:
    """Generate with a speculative-decoding strategy; HF-style arguments and output layout.

    Args:
        target: the HF model whose output this reproduces (`AutoModelForCausalLM`, or
            `AutoModelForSeq2SeqLM` for encoder-decoder pairs); see hf.SUPPORTED_MODEL_TYPES.
        input_ids: int64 [B, P] prompts (encoder inputs for encoder-decoder models), left- or
            right-padded as marked by `attention_mask` [B, P] (1 = token). Without attention_mask, as HF:
            where the pad id (pad_token_id, else the generation_config's) occurs in input_ids and is no
            EOS id, the mask is input_ids != pad; a batch padded with an id that is also an EOS id is
            refused (padding could not be told from text).
        strategy: "speculative" | "bild" | "specdec" | "ppd", or "plain" (no draft: one target forward per
            token on the same engine, the baseline), or a strategy object (SpeculativeDecoder,
            BildDecoder, SpecDecDecoder, PPDDecoder, PlainDecoder).
        max_new_tokens: new tokens per row at most.
        do_sample, temperature, top_k, top_p, min_p: sampling; the same standardisation (HF's
            warpers, in HF's order) is applied to target and draft. do_sample=False or temperature 0
            is argmax decoding; with do_sample=False the other settings (and seed) change nothing and,
            as in HF, a warning says so. Unlike HF, top_k defaults to None (no filter), not 50.
        eos_token_id: int or list; None takes the target's generation_config, like HF. A row
            stops after its EOS. pad_token_id: fills rows after they stop (default: the
            generation_config's, else the first EOS, else 0).
        seed: makes sampling reproducible; each row draws from its own Philox stream, so its
            tokens do not depend on the rest of the batch.
        backend: the backend of every op a step runs ("auto", "torch", "triton", "cuda"): the verify
            ops, tree attention, kv_compact / kv_rollback and the early-exit top-k (kv_rollback, one
            add with only a torch form, stays torch).
        cuda_graphs: capture the draft and verify steps as CUDA graphs (default: on a GPU). The graphs
            are kept for later calls with the same models, strategy options, batch size, length bucket
            and sampling (decoding.clear_graph_cache() frees them; graphs.MAX_SESSIONS bounds them).
        min_new_tokens: no EOS before this many new tokens (HF's min_new_tokens: the target's EOS
            probability is 0 there; lossless, drafts of EOS are rejected).
        on_step: called after every step as on_step(rows, tokens) with the output row ids that
            emitted tokens and each one's new token ids (several per step, in order; cut at EOS and
            max_new_tokens); return None, or {row: n} to keep only the first n of that row's new
            tokens and stop the row (e.g. a stop string ended there). Costs one host read per step.
        strategy_options: the strategy's own (e.g. draft_model=, num_draft_tokens= for
            "speculative"; draft_model=, fallback_threshold=, rollback_threshold= for "bild"; drafter=, block_size=, top_beta=, tau= for "specdec"; exit_layer=, k=, head= for "ppd").

    Returns:
        GenerateOutput(sequences [B, P + T] int64 like HF's generate, stats).
    """
    named = isinstance(strategy, str)
    if named:
        table = _strategies()
        if strategy not in table:
            check.fail(OP, f"unknown strategy {strategy!r}; available: {', '.join(sorted(table))}")
        _check_options(strategy, strategy_options)
        strategy = table[strategy](target, **strategy_options)
    elif not isinstance(strategy, Strategy):
        check.fail(OP, f"`strategy` must be a name or a Strategy object (got {type(strategy).__name__})", TypeError)
    elif strategy_options:
        check.fail(OP, f"options {sorted(strategy_options)} go to the strategy's constructor, not to generate()")
    if pad_token_id is None:
        pad_token_id = getattr(getattr(target, "generation_config", None), "pad_token_id", None)
    attention_mask = attention_mask_for(OP, input_ids, attention_mask, pad_token_id, eos_list(target, eos_token_id))
    _check_positions(target, "target", input_ids, attention_mask, max_new_tokens)
    draft = getattr(strategy, "draft_model", None)
    if isinstance(draft, torch.nn.Module):
        _check_positions(draft, "draft", input_ids, attention_mask, max_new_tokens)
    unused = unused_sampling_settings(bool(do_sample), temperature=temperature, top_k=top_k, top_p=top_p,
                                      min_p=min_p, seed=seed)
    if unused:  # as HF's GenerationConfig: a warning, and the call decodes greedily
        warnings.warn(f"{OP}: {', '.join(unused)} {'applies' if len(unused) == 1 else 'apply'} to sampling and "
                      "greedy decoding ignores it: pass do_sample=True", UserWarning, stacklevel=3)
    sampling = Sampling(bool(do_sample), float(temperature), top_k, top_p, min_p)
    if on_step is not None and not callable(on_step):
        check.fail(OP, f"`on_step` must be callable (got {type(on_step).__name__})", TypeError)
    with restored_attention(target, draft):
        engine = Engine(target, strategy, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                        sampling=sampling, eos_token_id=eos_token_id, pad_token_id=pad_token_id, seed=seed,
                        backend=backend, cuda_graphs=cuda_graphs, named_strategy=named, on_step=on_step,
                        min_new_tokens=min_new_tokens)
        return engine.run()
