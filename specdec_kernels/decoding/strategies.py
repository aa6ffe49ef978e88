"""The one table of strategies: each name with its drafter, its options (the drafter constructor's keywords,
with their defaults; the constructor checks their values, `make` their names), its docs page and the
docs' columns, and what the demo and the selftest run it with. Every entry point reads it: `generate`,
the CLI and the demo, `custom_generate`, the selftest's engine check, and the docs' tables
(tests/test_strategy_table.py holds docs/index.md, docs/generate.md and each page to it, and looks for
lists of strategy names anywhere else).

Adding a strategy: its drafter's module, one entry here, its docs page, its tests (docs/design.md).
"""

import inspect
from dataclasses import dataclass, field
from typing import Callable

from ..common import validate as check
from .bild import BildDecoder
from .dflash import DFlashDrafter, default_models_lack_it
from .drafter import Drafter
from .eagle import EagleDecoder
from .engine import OP
from .lookup import LookupDecoder
from .mtp import MtpDrafter, has_mtp_layers
from .plain import PlainDecoder
from .ppd import PPDDecoder, head_options
from .specdec import SpecDecDecoder
from .speculative import SpeculativeDecoder


@dataclass(frozen=True)
class Partner:
    """A second model a strategy takes: its keyword, the part of a default-models set that fills it
    (defaults.PARTS), whether the strategy runs without it, and the options it brings (default:
    {keyword: the model}; a PPD head set also picks its exit layer)."""

    keyword: str
    part: str
    required: bool = True
    options: Callable | None = None  # (model, target) -> options

    def options_for(self, model, target) -> dict:
        return self.options(model, target) if self.options is not None else {self.keyword: model}


@dataclass(frozen=True)
class Strategy:
    """One row of the table. The docs' columns: paper, draft_source, rule, lossless_when (docs/index.md),
    example (docs/generate.md), page (the strategy's page, under docs/) and title (its links' text). What runs it without a user's
    settings: partner (the second model it needs, if any), lossless (options that make it lossless:
    the demo's and the selftest's), tree (options of its token-tree form, a second demo row), and
    draft_length (the option HF's num_assistant_tokens sets, if any); target and runs_on: what the target
    itself must have and its test (target -> bool), for a strategy that drafts with the target's own modules
    (mtp), or None: any target (only those are demo and selftest rows, which run the default models)."""

    name: str
    drafter: type
    page: str
    title: str
    paper: str
    draft_source: str
    rule: str
    lossless_when: str
    example: str
    partner: Partner | None = None
    lossless: dict = field(default_factory=dict)
    tree: dict | None = None
    draft_length: str | None = None
    target: str | None = None
    runs_on: Callable | None = None

    @property
    def options(self) -> dict:
        """option -> default (inspect.Parameter.empty where there is none), in the constructor's order."""
        parameters = inspect.signature(self.drafter).parameters
        return {name: p.default for name, p in parameters.items() if name != "target"}

    def make(self, target, **options) -> Drafter:
        """The drafter of this strategy for `target`; an option it does not take is refused by name."""
        unknown = [option for option in options if option not in self.options]
        if unknown:
            check.fail(OP, f"strategy {self.name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                           f"{', '.join(self.options) or 'none'}", TypeError)
        return self.drafter(target, **options)


DRAFT = Partner("draft_model", "draft")
TABLE = (
    Strategy("plain", PlainDecoder, "generate.md#plain", title="plain", paper="-", draft_source="none",
             rule="one target forward per token", lossless_when="yes (the baseline)",
             example="`PlainDecoder(target)`"),
    Strategy("speculative", SpeculativeDecoder, "strategies/speculative.md", title="speculative",
             paper="Leviathan et al., speculative sampling", draft_source="a small draft model (chain or token tree)",
             rule="rejection sampling with residual `norm(max(0, p - q))` (or block verification); greedy: exact match",
             lossless_when="yes (`lenience < 1` is the paper's lossy variant)",
             example="`SpeculativeDecoder(target, draft, num_draft_tokens=5)`", partner=DRAFT,
             lossless=dict(num_draft_tokens=4), tree=dict(tree_topk=3, tree_nodes=12), draft_length="num_draft_tokens"),
    Strategy("specdec", SpecDecDecoder, "strategies/specdec.md", title="SpecDec", paper="Xia et al., SpecDec",
             draft_source="a block-parallel `[MASK]` drafter", rule="top-beta / tolerance-tau relaxed verification",
             lossless_when="at `top_beta=1` or `tau=0`",
             example="`SpecDecDecoder(target, drafter, block_size=10, top_beta=3, tau=1.0)`",
             partner=Partner("drafter", "specdec_drafter"), lossless=dict(top_beta=1, tau=0.0), draft_length="block_size"),
    Strategy("bild", BildDecoder, "strategies/bild.md", title="BiLD", paper="Kim et al., Big Little Decoder",
             draft_source="the small model, until its confidence falls under a threshold",
             rule="rollback when `-log p_large(token) > rollback_threshold`",
             lossless_when="no; greedy with `rollback_rule=\"exact\"` gives the large model's greedy output",
             example="`BildDecoder(target, draft, ...)`", partner=DRAFT, lossless=dict(rollback_rule="exact"),
             draft_length="max_small_run"),
    Strategy("ppd", PPDDecoder, "strategies/ppd.md", title="PPD", paper="Yang et al., Predictive Pipelined Decoding",
             draft_source="top-k of an early-exit head at an intermediate layer",
             rule="exact match with the final layer", lossless_when="yes",
             example="`PPDDecoder(target, exit_layer=d // 2, k=3, head=None)`",
             partner=Partner("head", "early_exit_heads", required=False, options=head_options),
             lossless=dict(k=3, head="N")),
    Strategy("lookup", LookupDecoder, "strategies/lookup.md", title="lookup",
             paper="prompt lookup (HF, vLLM, SGLang); SuffixDecoding",
             draft_source="the row's own text (and earlier outputs): a chain, or a token tree ranked by frequency",
             rule="greedy: exact match; sampling: one-hot drafts, chain or tree rejection sampling",
             lossless_when="yes", example="`LookupDecoder(target, num_draft_tokens=10, max_ngram=3)` (no draft model)",
             tree=dict(tree_nodes=16)),
    Strategy("mtp", MtpDrafter, "strategies/mtp.md", title="MTP",
             paper="DeepSeek-V3 multi-token prediction (HF's `use_mtp`)",
             draft_source="the target's own MTP layers (transformers' `MtpModel`), reading its final hidden states",
             rule="greedy: exact match; sampling: chain rejection sampling", lossless_when="yes",
             example="`MtpDrafter(target)` (a target whose config has `num_mtp_layers`)",
             draft_length="num_draft_tokens",
             target="a target whose config has num_mtp_layers (GLM-4-MoE, ERNIE 4.5 MoE)", runs_on=has_mtp_layers),
    Strategy("dflash", DFlashDrafter, "strategies/dflash.md", title="DFlash",
             paper="DFlash block drafting (HF's `speculation_type=\"dflash\"`)",
             draft_source="a DFlash assistant: one forward drafts a block from the target's layer states",
             rule="greedy: exact match; sampling: chain rejection sampling", lossless_when="yes",
             example="`DFlashDrafter(target, assistant)` (a `muse_glimmer_assistant`)",
             target="a DFlash assistant passed as draft_model (none in the default models)",
             runs_on=default_models_lack_it),
    Strategy("eagle", EagleDecoder, "strategies/eagle.md", title="EAGLE-3",
             paper="Li et al., EAGLE-3 (with EAGLE-2's dynamic trees)",
             draft_source="an EAGLE-3 head reading the target's low, middle and high layer states "
                          "(chain or dynamic tree)",
             rule="greedy: exact match; sampling: chain or tree rejection sampling", lossless_when="yes",
             example="`EagleDecoder(target, Eagle3Drafter.from_pretrained(folder, target))`",
             partner=Partner("draft_model", "eagle3"), lossless=dict(num_draft_tokens=4),
             tree=dict(tree_topk=3, tree_nodes=12), draft_length="num_draft_tokens"),
)
STRATEGIES: dict[str, Strategy] = {strategy.name: strategy for strategy in TABLE}


def names() -> tuple[str, ...]:
    """Every strategy's name, in the table's order."""
    return tuple(STRATEGIES)


def strategy(name: str) -> Strategy:
    """The table's row of `name`, or the error listing the names there are."""
    if name not in STRATEGIES:
        check.fail(OP, f"unknown strategy {name!r}; available: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name]


def accepted_options(name: str) -> list[str]:
    """The keywords strategy `name` accepts (its drafter constructor's, less the target)."""
    return list(strategy(name).options)
