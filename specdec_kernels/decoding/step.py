"""What one step's parts hand each other: the drafter's StepPlan and Proposal, the verifier's Accepted."""

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Proposal:
    """A drafter's drafts for one step. tokens [B, g] int64; probs: the q the drafts were drawn from
    (sampling only; a chain [B, g, V], a tree with sampled siblings [B, g+1, V], one row per node
    whose children were drawn from it), or None: one-hot drafts (argmax, copied text, top-K
    siblings); num_draft [B] int64 (ragged rows, e.g. BiLD, lookup; a tree: its depth) or None
    (every row has g); extra: drafter tensors its commit needs; parents [B, g+1]: when the verified
    tokens [root, drafts] form a tree, its parents (node 0 the root), else None (a chain)."""

    tokens: Tensor
    probs: Tensor | None = None
    num_draft: Tensor | None = None
    extra: Tensor | None = None
    parents: Tensor | None = None


@dataclass
class StepPlan:
    """What a drafter's `plan` fixes on the host before a step: its width g (the drafts' count, static
    within the step: its draws sit at cursor .. cursor + g), a tree's depth (how deep the verifier
    walks it), and the proposal when planning already drafted it (eager steps; propose hands it on)."""

    width: int
    depth: int | None = None
    proposal: Proposal | None = None


@dataclass
class Accepted:
    """The verifier's verdict, which the commit step takes: tokens [B, g+1] (the accepted drafts, then
    the correction or bonus token, padded with -1), num_accepted [B], and for a tree the accepted
    nodes [B, D+1] (root first, -1 padded) that the caches keep, else None (a chain keeps its prefix)."""

    tokens: Tensor
    num_accepted: Tensor
    nodes: Tensor | None = None
