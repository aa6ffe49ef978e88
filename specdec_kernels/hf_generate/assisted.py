"""HF's assisted-generation settings as `custom_generate`'s strategy and options, or a one-line refusal.

HF reads them from two places: the generation config of the call (generate's keywords on top of the target's
generation_config) and the assistant's own generation_config (transformers 5.x drafts with the assistant's
num_assistant_tokens and schedule and ignores the call's). The hook reads both; a setting given in both with
different values is refused. HF fills its defaults (num_assistant_tokens 20, schedule "constant",
assistant_confidence_threshold 0.4, look-behinds 10) into the call's config before the hook sees it, so a
value of the call's config counts as asked for when generate() was passed it, when the target's own
generation_config sets it, or when it differs from HF's default; the assistant's counts when it is set.

Which setting maps to which strategy option: docs/hf.md, "HF's assisted-generation settings".
"""

from ..decoding.strategies import STRATEGIES
from ..hf.adapters import is_dflash_assistant
from ..models.eagle3 import Eagle3Drafter
from .hf_private import assisted_defaults

SCHEDULES = ("constant", "heuristic", "heuristic_transient")
REFUSED = {"assistant_confidence_threshold": "HF's confidence stop for the assistant (re-fitted online) is not "
                                             "supported: use schedule='heuristic', or strategy 'bild' "
                                             "(fallback_threshold, lossy)",
           "assistant_lookbehind": "assistants with another tokenizer are not supported",
           "target_lookbehind": "assistants with another tokenizer are not supported"}
# refused settings at a value that turns them off, which is what our strategies do anyway: accepted
OFF = {"assistant_confidence_threshold": 0}
# HF settings that become a count of ours: checked under HF's name, so an error names what the user passed
COUNTS = ("prompt_lookup_num_tokens", "max_matching_ngram_size", "num_assistant_tokens")


def asked(name: str, config, model, passed: dict):
    """The call's value of HF setting `name` if the user asked for it (see the module doc), else None."""
    value = getattr(config, name, None)
    if value is None:
        return None
    if name in passed or getattr(getattr(model, "generation_config", None), name, None) is not None:
        return value
    return None if value == assisted_defaults().get(name, object()) else value


class Assisted:
    """The translation of one call: `strategy` and `options` after it, and `write_back(stats)` to run after it."""

    def __init__(self, model, config, passed: dict, draft, strategy: str | None, options: dict, fail):
        self.fail, self.options, self.draft = fail, options, draft
        self.persist = False
        side = getattr(draft, "generation_config", None) if draft is not None else None

        def read(name):
            ours, theirs = asked(name, config, model, passed), getattr(side, name, None)
            if ours is not None and theirs is not None and ours != theirs:
                fail(f"{name} is {ours!r} for this call and {theirs!r} in the assistant's generation_config: set one")
            return ours if ours is not None else theirs

        for name, why in REFUSED.items():
            value = read(name)
            if value is not None and value != OFF.get(name):
                fail(f"{name}={value!r}: {why}")
        lookup = asked("prompt_lookup_num_tokens", config, model, passed)
        ngram = asked("max_matching_ngram_size", config, model, passed)
        if lookup is not None:
            if draft is not None:
                fail("prompt_lookup_num_tokens drafts from the text, without a model: drop assistant_model / "
                     "draft_model")
            if strategy not in (None, "lookup"):
                fail(f"prompt_lookup_num_tokens runs strategy 'lookup', not {strategy!r}")
            strategy = "lookup"
            self.set("num_draft_tokens", lookup, "prompt_lookup_num_tokens")
            self.set("max_ngram", ngram if ngram is not None else 2, "max_matching_ngram_size")
        elif ngram is not None:
            if strategy != "lookup":
                fail("max_matching_ngram_size applies to prompt lookup: pass prompt_lookup_num_tokens (or "
                     "strategy='lookup')")
            self.set("max_ngram", ngram, "max_matching_ngram_size")
        if getattr(config, "use_mtp", False):  # HF's MTP drafting: strategy mtp, at any batch size
            if draft is not None or strategy not in (None, "mtp"):
                fail("use_mtp runs strategy 'mtp', whose drafts are the target's own MTP layers: pass no "
                     f"assistant_model / draft_model and no other strategy (got strategy={strategy!r})")
            text = model.config.get_text_config()
            if not getattr(text, "num_mtp_layers", None):
                fail(f"use_mtp=True needs a model whose config has num_mtp_layers (got model type "
                     f"{model.config.model_type!r} without them)")
            strategy = "mtp"
        kind = getattr(config, "speculation_type", None)
        if kind is not None:  # HF's DFlash drafting: strategy dflash, at any batch size
            if kind != "dflash":
                fail(f"speculation_type={kind!r} is not supported (HF's only type is 'dflash')")
            if not is_dflash_assistant(draft) or strategy not in (None, "dflash"):
                fail("speculation_type='dflash' runs strategy 'dflash': pass a DFlash assistant (a "
                     "muse_glimmer_assistant) as assistant_model and no other strategy (got "
                     f"{type(draft).__name__ if draft is not None else 'no assistant'}, strategy={strategy!r})")
            strategy = "dflash"
        if strategy is None and isinstance(draft, Eagle3Drafter):  # a head drafts in strategy eagle only
            strategy = "eagle"
        self.strategy = strategy or ("speculative" if draft is not None else "plain")
        length, schedule = read("num_assistant_tokens"), read("num_assistant_tokens_schedule")
        if length is not None:
            option = STRATEGIES[self.strategy].draft_length
            if option is None:
                with_length = [s.name for s in STRATEGIES.values() if s.draft_length]
                fail(f"num_assistant_tokens={length} has no counterpart in strategy {self.strategy!r} (it sets "
                     f"the draft length of {', '.join(with_length[:-1])} and {with_length[-1]})")
            self.set(option, length, "num_assistant_tokens")
        if schedule is not None and schedule not in SCHEDULES:
            fail(f"num_assistant_tokens_schedule must be one of {', '.join(map(repr, SCHEDULES))} (got {schedule!r})")
        if schedule not in (None, "constant"):
            scheduled = [s.name for s in STRATEGIES.values() if "schedule" in s.options]  # HF's schedule, ours
            if self.strategy not in scheduled:
                fail(f"num_assistant_tokens_schedule={schedule!r} applies to strategy "
                     f"{', '.join(map(repr, scheduled))} (not {self.strategy!r})")
            self.set("schedule", "heuristic", "num_assistant_tokens_schedule")
            self.persist = schedule == "heuristic" and draft is not None

    def set(self, option: str, value, setting: str) -> None:
        if setting in COUNTS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            self.fail(f"{setting} must be an int >= 1 (got {value!r})")
        if option in self.options and self.options[option] != value:
            self.fail(f"{setting}={value!r} and {option}={self.options[option]!r} disagree: pass one")
        self.options[option] = value

    def write_back(self, stats) -> None:
        """HF's "heuristic" schedule keeps the length it reached on the assistant for the next call."""
        if self.persist and "num_draft_tokens_final" in stats.extra:
            self.draft.generation_config.num_assistant_tokens = stats.extra["num_draft_tokens_final"]
