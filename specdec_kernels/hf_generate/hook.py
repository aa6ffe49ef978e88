"""The hook itself: HF's `custom_generate(model, input_ids, logits_processor=, stopping_criteria=,
generation_config=, **extra, **model_kwargs)` call translated into `specdec_kernels.generate`'s arguments.

HF's warpers become temperature / top_k / top_p / min_p (`_sampling`), its criteria max_new_tokens, EOS
ids and the per-token checks (`_stopping`), its length processors min_new_tokens and a forced EOS; anything
HF would apply that the engine does not is refused with a one-line error, never ignored. The assisted-
generation settings go through assisted.py, every other generation setting through settings.py; what HF
does not pass a callable (assistant_model, streamer) comes from hf_private.py. docs/hf.md is the guide.
"""

import inspect
import warnings

import torch

from ..decoding import api, strategies
from ..decoding.strategies import accepted_options
from . import settings
from .assisted import Assisted
from .hf_private import calling_generate

OP = "custom_generate"
# every strategy's options, plus the engine's own: HF passes a keyword through only if the signature names it
OPTIONS = tuple(dict.fromkeys(o for s in strategies.names() for o in accepted_options(s)))
ENGINE_KEYWORDS = ("strategy", "seed", "backend", "cuda_graphs")
# Named in the signature so that HF hands it to the hook: transformers drops `tokenizer=` before a callable
# custom_generate and would otherwise stop the call with advice that cannot work ("pass the tokenizer").
STOP_STRINGS = "stop_strings"
# model kwargs HF prepares itself (or we read): anything else non-None is refused
HF_MODEL_KWARGS = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", "cache", "past_key_values",
                   "encoder_outputs", "cache_position"}


def fail(message: str, kind=ValueError):
    raise kind(f"{OP}: {message}")


def _sampling(logits_processor, do_sample: bool) -> dict:
    """temperature / top_k / top_p / min_p from HF's warpers; any other processor is refused."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    order = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)  # HF's and the engine's
    found, last = {}, -1
    for processor in logits_processor or ():
        kind = type(processor)
        if kind.__name__ in LENGTH_PROCESSORS:  # applied by the engine or to the output (_length_rules)
            continue
        if kind not in order:
            fail(f"logits processor {kind.__name__} is not supported by the speculative engine (only temperature, "
                 "top_k, top_p and min_p, applied to target and draft alike); drop it or decode without "
                 "custom_generate")
        if kind in found or order.index(kind) < last:
            fail(f"logits processor {kind.__name__} appears twice or out of HF's order (temperature, top_k, top_p, "
                 "min_p)")
        last = order.index(kind)
        if kind is not TemperatureLogitsWarper and (processor.min_tokens_to_keep != 1
                                                    or processor.filter_value != -float("inf")):
            fail(f"{kind.__name__} with min_tokens_to_keep={processor.min_tokens_to_keep} / "
                 f"filter_value={processor.filter_value} is not supported (only 1 / -inf)")
        found[kind] = processor
    out = dict(do_sample=bool(do_sample), temperature=1.0, top_k=None, top_p=None, min_p=None)
    if TemperatureLogitsWarper in found:
        out["temperature"] = float(found[TemperatureLogitsWarper].temperature)
    if TopKLogitsWarper in found:
        out["top_k"] = int(found[TopKLogitsWarper].top_k)
    if TopPLogitsWarper in found:
        out["top_p"] = float(found[TopPLogitsWarper].top_p)
    if MinPLogitsWarper in found:
        out["min_p"] = float(found[MinPLogitsWarper].min_p)
    return out


LENGTH_PROCESSORS = ("ForcedEOSTokenLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "MinLengthLogitsProcessor")


def _min_new_tokens(logits_processor, prompt_width: int, eos: list) -> int:
    """HF's min_new_tokens / min_length as the engine's min_new_tokens (no EOS before that many new
    tokens). Their EOS ids must be the criteria's: the engine bans its own EOS ids."""
    from transformers import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    minimum = 0
    for processor in logits_processor or ():
        if type(processor) is MinNewTokensLengthLogitsProcessor:
            new = processor.min_new_tokens + processor.prompt_length_to_skip - prompt_width
        elif type(processor) is MinLengthLogitsProcessor:
            new = processor.min_length - prompt_width
        else:
            continue
        if sorted(set(int(e) for e in processor.eos_token_id.flatten().tolist())) != sorted(set(eos)):
            fail(f"{type(processor).__name__} bans EOS ids other than the stopping criteria's")
        minimum = max(minimum, new)
    return minimum


def _forced_eos(logits_processor, prompt_width: int, do_sample: bool) -> tuple[int, int] | None:
    """(new-token index, id) of HF's ForcedEOSTokenLogitsProcessor (BART's forced_eos_token_id): the
    token at length max_length - 1 is EOS whatever the model says. Only that one token changes and
    nothing is generated after it, so forcing it on the engine's output is exact."""
    from transformers import ForcedEOSTokenLogitsProcessor

    forced = [p for p in logits_processor or () if type(p) is ForcedEOSTokenLogitsProcessor]
    if not forced:
        return None
    ids = sorted(int(e) for e in forced[0].eos_token_id.flatten().tolist())
    if do_sample and len(ids) > 1:  # HF draws among them uniformly: not reproduced here
        fail(f"ForcedEOSTokenLogitsProcessor with several EOS ids {ids} is not supported when sampling")
    return forced[0].max_length - 1 - prompt_width, ids[0]  # greedy: argmax of tied zeros, the lowest id


def _stopping(stopping_criteria, prompt_width: int) -> tuple[int, list, list]:
    """max_new_tokens, the EOS ids and the criteria checked after every token (stop strings, max
    time) from HF's criteria; any other criterion is refused."""
    from transformers import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria, StopStringCriteria

    max_length, eos, per_token = None, [], []
    for criterion in stopping_criteria or ():
        if type(criterion) in (StopStringCriteria, MaxTimeCriteria):  # read token ids only, never the scores
            per_token.append(criterion)
            continue
        if type(criterion) is MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif type(criterion) is EosTokenCriteria:
            ids = criterion.eos_token_id
            eos += [int(e) for e in (ids.flatten().tolist() if isinstance(ids, torch.Tensor) else
                                     (ids if isinstance(ids, (list, tuple)) else [ids]))]
        else:
            fail(f"stopping criterion {type(criterion).__name__} is not supported by the speculative engine "
                 "(only max length, EOS, stop strings and max time)")
    if max_length is None:
        fail("no MaxLengthCriteria: pass max_new_tokens or max_length")
    max_new_tokens = max_length - prompt_width
    if max_new_tokens < 1:
        fail(f"max_length ({max_length}) leaves no room after the {prompt_width}-token prompt: pass max_new_tokens")
    return max_new_tokens, list(dict.fromkeys(eos)), per_token


class _StepObserver:
    """The engine's on_step: checks each new token against the per-token criteria (a stop string
    ends the row right after the token that completes it, as HF's loop does), then streams the
    tokens kept. HF's view of a row is its padded prompt (`input_ids`) plus the tokens so far."""

    def __init__(self, input_ids: torch.Tensor, criteria: list, streamer, forced_eos: tuple[int, int] | None):
        self.prompts = input_ids.cpu()
        self.criteria, self.streamer, self.forced_eos = criteria, streamer, forced_eos
        self.so_far = {}

    def __call__(self, rows: list[int], tokens: list[list[int]]) -> dict:
        cuts = {}
        for row, new in zip(rows, tokens):
            previous = self.so_far.get(row, [])
            keep = len(new)
            if self.forced_eos is not None and len(previous) <= self.forced_eos[0] < len(previous) + keep:
                index = self.forced_eos[0] - len(previous)  # the engine's token there becomes EOS (_force_eos)
                new = new[:index] + [self.forced_eos[1]]
                keep = cuts[row] = len(new)
            for k in range(1, len(new) + 1) if self.criteria else ():
                sequence = torch.cat([self.prompts[row], torch.tensor(previous + new[:k])]).unsqueeze(0)
                if any(bool(criterion(sequence, None).any()) for criterion in self.criteria):
                    keep = cuts[row] = min(k, cuts.get(row, k))
                    break
            self.so_far[row] = previous + new[:keep]
            if self.streamer is not None:
                self.streamer.put(torch.tensor(new[:keep]))
        return cuts


def _force_eos(sequences: torch.Tensor, width: int, observer: _StepObserver) -> torch.Tensor:
    """The engine's token at the forced index becomes EOS in every row that reached it (the observer
    cut those rows right after it, and streamed EOS there)."""
    index, eos = observer.forced_eos
    reached = [row for row, tokens in observer.so_far.items() if len(tokens) > index]
    if reached:
        sequences = sequences.clone()
        sequences[reached, width + index] = eos
    return sequences


def custom_generate(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                    synced_gpus=False, streamer=None, **model_kwargs):
    """HF's custom_generate contract (transformers 5.x; guide: docs/hf.md). Keywords of the
    signature beyond HF's: strategy (default "speculative" with a draft, "lookup" with HF's
    prompt_lookup_num_tokens, else "plain"), draft_model,
    seed, backend, cuda_graphs, inputs_tensor, and every strategy option of specdec_kernels.generate."""
    ours = {name: model_kwargs.pop(name) for name in (*OPTIONS, *ENGINE_KEYWORDS) if name in model_kwargs}
    inputs_tensor = model_kwargs.pop("inputs_tensor", None)
    caller = calling_generate()
    if caller is None:  # not called by HF's generate(), or a transformers whose generate() we cannot read
        warnings.warn(f"{OP}: could not read assistant_model / streamer from the calling generate(); an "
                      "assistant_model passed there is not used: pass the draft as draft_model= instead",
                      RuntimeWarning, stacklevel=2)
        caller = {}
    streamer = streamer if streamer is not None else caller.get("streamer")
    try:
        return _generate(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                         streamer, caller, ours, inputs_tensor, model_kwargs)
    finally:
        if streamer is not None:
            streamer.end()  # also after an error: a consumer waiting on the streamer is released


def _generate(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
              caller, ours, inputs_tensor, model_kwargs):
    if streamer is not None and input_ids.shape[0] != 1:
        fail(f"a streamer needs batch size 1, as HF's streamers do (got {input_ids.shape[0]} rows)")
    if synced_gpus:
        fail("synced_gpus is not supported")
    if model_kwargs.pop(STOP_STRINGS, None) is not None:
        fail("stop_strings= cannot work here: transformers drops tokenizer= before a custom_generate callable; pass "
             "stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, stop_strings)]) instead")
    config = generation_config if generation_config is not None else model.generation_config
    settings.refuse(config, fail)
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in HF_MODEL_KWARGS)
    if extra:
        fail(f"model kwargs {', '.join(extra)} are not supported")
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        fail("a filled past_key_values cache is not supported: the engine keeps its own")

    assistant = caller.get("assistant_model")
    draft = ours.pop("draft_model", None)
    if assistant is not None and draft is not None and assistant is not draft:
        fail("pass the draft once: assistant_model= or draft_model=")
    draft = draft if draft is not None else assistant
    strategy = ours.pop("strategy", None)
    if strategy is not None and not isinstance(strategy, str):
        fail("strategy= names a strategy here (" + ", ".join(strategies.names()) + ")", TypeError)
    if strategy is not None and strategy not in strategies.STRATEGIES:
        fail(f"unknown strategy {strategy!r}; available: {', '.join(strategies.names())}")
    engine = {k: ours.pop(k) for k in ("seed", "backend", "cuda_graphs") if k in ours}
    options = dict(ours)
    assisted = Assisted(model, config, caller.get("kwargs", {}), draft, strategy, options, fail)
    strategy = assisted.strategy  # HF's assisted-generation settings mapped (assisted.py)
    if draft is not None:
        if "draft_model" not in accepted_options(strategy):
            fail(f"strategy {strategy!r} takes no draft model (assistant_model / draft_model); its options: "
                 f"{', '.join(accepted_options(strategy)) or 'none'}")
        options["draft_model"] = draft
    unknown = [o for o in options if o not in accepted_options(strategy)]
    if unknown:
        fail(f"strategy {strategy!r} has no option {', '.join(map(repr, unknown))}; its options: "
             f"{', '.join(accepted_options(strategy)) or 'none'}", TypeError)

    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    prompts = inputs_tensor if encoder_decoder else input_ids
    if encoder_decoder and (prompts is None or input_ids.shape[1] != 1):
        fail("encoder-decoder models need encoder input_ids and no decoder_input_ids")
    start = getattr(model.config, "decoder_start_token_id", None)
    if encoder_decoder and start is not None and bool((input_ids != start).any()):
        fail(f"decoder_start_token_id must be the model's config.decoder_start_token_id ({start})")
    mask = model_kwargs.get("attention_mask")  # HF drops an all-ones mask (no padding)
    passed = caller.get("kwargs")  # the keywords the user gave generate() (None: the caller could not be read)
    if passed is not None and passed.get("attention_mask") is None:
        # the user passed none and HF made one up (transformers 5.17 passes all ones where pad == EOS hides the
        # padding): let generate infer it or refuse the batch, as it does when HF passes none (5.25)
        mask = None
    sampling = _sampling(logits_processor, getattr(config, "do_sample", False))
    max_new_tokens, eos, per_token = _stopping(stopping_criteria, input_ids.shape[1])
    forced = _forced_eos(logits_processor, input_ids.shape[1], sampling["do_sample"])
    observer = (_StepObserver(input_ids, per_token, streamer, forced)
                if per_token or streamer is not None or forced is not None else None)
    result = api.generate(model, prompts, strategy=strategy, attention_mask=mask, max_new_tokens=max_new_tokens,
                          eos_token_id=eos, pad_token_id=getattr(config, "pad_token_id", None), on_step=observer,
                          min_new_tokens=_min_new_tokens(logits_processor, input_ids.shape[1], eos),
                          **sampling, **engine, **options)
    assisted.write_back(result.stats)
    sequences = result.sequences
    if forced is not None:
        sequences = _force_eos(sequences, input_ids.shape[1], observer)
    if not getattr(config, "return_dict_in_generate", False):
        return sequences
    from transformers.generation import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput

    out = (GenerateEncoderDecoderOutput if encoder_decoder else GenerateDecoderOnlyOutput)(sequences=sequences)
    out.stats = result.stats  # our statistics (not a ModelOutput field: kept out of to_tuple())
    return out


def _signature() -> inspect.Signature:
    """HF's `_sample` parameters, then every keyword this module takes (HF passes only those named)."""
    base = inspect.signature(custom_generate)
    params = [p for p in base.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for name in (*ENGINE_KEYWORDS, *OPTIONS, "inputs_tensor", STOP_STRINGS):
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    params.append(base.parameters["model_kwargs"])
    return base.replace(parameters=params)


custom_generate.__signature__ = _signature()
