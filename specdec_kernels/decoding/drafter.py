"""The interface between the engine and a drafter: what a drafter supplies (its model and caches, its
proposals, the target layers it reads) and what it leaves to the engine (the target's forward and
cache, the one Verifier, batching, stopping, statistics). docs/design.md says how a drafter is written.
"""

import abc

import torch
from torch import Tensor

from .decode import decode
from .step import Accepted, Proposal, StepPlan
from .verifier import Verification


class Drafter(abc.ABC):
    """What a drafter supplies to the engine; it owns its draft model and that model's cache. A step's
    hooks hand each other what they compute (StepPlan, Proposal, Accepted), never through `self`;
    what a drafter keeps on `self` lives for the whole call (caches, kept buffers, an adaptive length).

    Attributes a drafter sets: `verification`, how the engine's Verifier judges its proposals (the
    rule, chain and sibling forms: verifier.py); `max_width`, the widest step it drafts (the caches
    keep room for it); `first_token_from_prefill`, True when greedy decoding of a decoder-only target
    may take the first token from the prefill's logits (plain) instead of a first step that re-feeds
    the last prompt token; `target_model`, the target `generate(input_ids, ...)` decodes with.
    """

    name = "drafter"
    first_token_from_prefill = False
    max_width = 0
    verification = Verification()
    target_model = None

    def generate(self, input_ids, **kwargs):
        """specdec_kernels.generate(target, input_ids, strategy=self, **kwargs)."""
        return decode(self.target_model, self, input_ids, **kwargs)

    def adapted_models(self) -> tuple:
        """The drafter's own models whose attention it switches to ours (hf.adapt, set_attn_implementation):
        `decode` gives them back as they were passed. Default: draft_model, where the drafter has one."""
        model = getattr(self, "draft_model", None)
        return (model,) if isinstance(model, torch.nn.Module) else ()

    def target_layers(self) -> tuple:
        """The target's hidden states this drafter reads (engine.hidden, hidden_states.py): decoder-layer
        indices (0-based: the output of layers[i], HF's hidden_states[i + 1]) and/or
        hidden_states.FINAL_NORM (the final norm's output, what the LM head reads). Asked once, before
        the prefill."""
        return ()

    def start(self, engine) -> None:
        """Prepare the draft side for engine's batch (adapters, caches, prefill)."""

    def plan(self, engine, first: bool) -> StepPlan:
        """Host-side, before each step and outside any captured graph: the step's width (a drafter
        whose width depends on the data may read the device here: lookup, eager only) and a tree's depth."""
        return StepPlan(self.max_width)

    @abc.abstractmethod
    def propose(self, engine, first: bool) -> Proposal:
        """The next step's drafts (and the q they were drawn from when sampling needs it)."""

    def commit(self, engine, proposal: Proposal, accepted: Accepted) -> None:
        """Keep what the step accepted in the drafter's own caches (the engine keeps the target's, and
        the target's hidden states of the accepted positions, before this is called)."""

    def end_step(self, engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        """Host-side, after each step: adapt the draft length; kept_rows (eager mode) are the rows that
        stay after finished ones were dropped, for the drafter's per-row state."""

    def finish(self, engine) -> dict:
        """After the last step (every row's tokens in engine.final): the drafter's statistics for
        stats.extra (lookup also feeds its LookupCache here)."""
        return {}

    def graph_key(self):
        """Hashable configuration of everything the drafter bakes into captured graphs (Python numbers,
        module identities), or None: graphs are then not kept between calls. Tensors the steps use
        must come from engine.keep / engine.reuse in start() for kept graphs to stay valid."""
        return None
