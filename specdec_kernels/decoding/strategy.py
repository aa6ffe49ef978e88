"""The interface between the engine and a decoding strategy: the Strategy's eight hooks and what a step's
hooks hand each other (StepPlan, Proposal, Accepted). docs/design.md says how a strategy is written."""

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from . import engine


@dataclass
class Proposal:
    """A strategy's drafts for one step. tokens [B, g] int64; probs [B, g, V] float32 (the
    standardised q each token was drawn from; sampling only) or None; num_draft [B] int64 (ragged
    rows, e.g. BiLD) or None (every row has g); extra: strategy tensors the accept rule needs;
    parents [B, g+1]: when the verified tokens [root, drafts] form a tree, its parents (node 0 the
    root), else None (a chain)."""

    tokens: Tensor
    probs: Tensor | None = None
    num_draft: Tensor | None = None
    extra: Tensor | None = None
    parents: Tensor | None = None


@dataclass
class StepPlan:
    """What a strategy's `plan` fixes on the host before a step: its width g (the drafts' count, static
    within the step: its draws sit at cursor .. cursor + g), a tree's depth when it is narrower than
    the configured one, and the proposal when planning already drafted it (eager steps; propose hands it on)."""

    width: int
    depth: int | None = None
    proposal: Proposal | None = None


@dataclass
class Accepted:
    """What `accept` returns and the commit step takes: tokens [B, g+1] (the accepted drafts, then
    the correction or bonus token, padded with -1), num_accepted [B], and for a tree the accepted
    nodes [B, D+1] (root first, -1 padded) that the caches keep, else None (a chain keeps its prefix)."""

    tokens: Tensor
    num_accepted: Tensor
    nodes: Tensor | None = None


class Strategy(abc.ABC):
    """What a decoding strategy supplies to the engine (it owns the draft model and its cache). A step's
    hooks hand each other what they compute (StepPlan, Proposal, Accepted), never through `self`; what
    a strategy keeps on `self` lives for the whole call (caches, kept buffers, an adaptive length)."""

    name = "strategy"
    # True: greedy decoding of a decoder-only target takes the first token from the prefill's logits
    # (accept() with zero drafts on them) instead of a first step that re-feeds the last prompt token
    first_token_from_prefill = False
    max_width = 0  # the widest step it drafts (the caches keep room for it)

    def start(self, engine: "engine.Engine") -> None:
        """Prepare the draft side for engine's batch (adapters, caches, prefill)."""

    def plan(self, engine: "engine.Engine", first: bool) -> StepPlan:
        """Host-side, before each step and outside any captured graph: the step's width (a strategy
        whose width depends on the data may read the device here: lookup, eager only)."""
        return StepPlan(self.max_width)

    @abc.abstractmethod
    def propose(self, engine: "engine.Engine", first: bool) -> Proposal:
        """The next step's drafts (and their distributions when the accept rule needs them)."""

    @abc.abstractmethod
    def accept(self, engine: "engine.Engine", proposal: Proposal, logits: Tensor) -> Accepted:
        """The step's verdict from the target's logits [B, g+1, V] (a tree: one row per node)."""

    def commit(self, engine: "engine.Engine", proposal: Proposal, accepted: Accepted) -> None:
        """Keep what the step accepted in the strategy's own caches (the engine keeps the target's)."""

    def end_step(self, engine: "engine.Engine", all_accepted: bool, kept_rows: Tensor | None) -> None:
        """Host-side, after each step: adapt the draft length; kept_rows (eager mode) are the rows that
        stay after finished ones were dropped, for the strategy's per-row state."""

    def finish(self, engine: "engine.Engine") -> dict:
        """After the last step (every row's tokens in engine.final): the strategy's statistics for
        stats.extra (lookup also feeds its LookupCache here)."""
        return {}

    def graph_key(self):
        """Hashable configuration of everything the strategy bakes into captured graphs (Python numbers,
        module identities), or None: graphs are then not kept between calls. Tensors the steps use
        must come from engine.keep / engine.reuse in start() for kept graphs to stay valid."""
        return None
