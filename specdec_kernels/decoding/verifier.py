"""The one verifier the engine owns: every call of a verification op in decoding/ is in this file.

A drafter only proposes (a chain or a tree, with the q its drafts were drawn from, or one-hot drafts)
and says with a `Verification` how its proposals are judged; the engine makes one `Verifier` of it
per call and hands it each step's proposal and the target's logits (vLLM's split: one rejection
sampler serves every proposer). What decides which op runs:

  no drafts                 argmax, or one draw from the target's row (plain steps)
  a tree (parents given)    greedy: tree_greedy_verify; sampling: tree_rejection_sample, against
                            the q of sampled siblings or one-hot for deterministic ones, token-level
                            or by traversal (tree="token" | "traversal")
  a chain, rule "exact"     greedy: greedy_verify (relaxed_verify for lenience < 1); sampling:
                            block_verify or rejection_sample (chain="block" | "token"), one-hot
                            where the drafter gives no q
  a chain, rule "relaxed"   SpecDec's top-beta / tau rule (relaxed_verify; greedy only)
  a chain, rule "bild"      BiLD's rollback rule (bild_verify, or greedy_verify for rollback_rule
                            "exact"), the large model's token sampled where it takes over

Every rule but "relaxed" with top_beta > 1 and tau > 0, "bild", and lenience < 1 is lossless: greedy
output is the target's greedy output, sampled output follows the target's standardised distribution.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import ops
from ..common import rng
from ..common import validate as check
from .standardize import Sampling, draw, standardize
from .step import Accepted, Proposal

OP = "generate"
RULES = ("exact", "relaxed", "bild")
CHAIN_RULES = ("block", "token")  # how a sampled chain is verified
TREE_RULES = ("token", "traversal")  # how a sampled tree is verified: top-down per node, or leaves first
TRAVERSAL = "traversal"  # a drafter's `verification` for trees; on a chain it is block verification
SIBLINGS = ("top", "sampled")  # how a sampled tree's siblings were drawn: deterministic top-K, or from q
ROLLBACK_RULES = ("nll", "exact")  # BiLD: -log p past the threshold, or any draft that is not the argmax
DEFAULT_CHAIN_RULE = "block"  # why: docs/strategies/speculative.md "Verification rules"; bench/results/verification_chains_cpu.md
DEFAULT_SIBLINGS = "sampled"  # likewise: bench/results/verification_trees_cpu.md, verification_rules_cpu.md
ACCEPT_ALL = 3.0e38  # a BiLD rollback threshold no -log p exceeds: keep every draft, take the bonus top-1


def chain_rule(value: str | None, *, option: str = "verification") -> str:
    """A drafter's sampled-chain option checked: "block" (the default, for None) or "token"; "traversal"
    is block verification on a chain (the same outputs on the same coins), so it maps to "block"."""
    if value is None or value == TRAVERSAL:
        return DEFAULT_CHAIN_RULE
    if value not in CHAIN_RULES:
        check.fail(OP, f"`{option}` must be one of {', '.join(map(repr, (*CHAIN_RULES, TRAVERSAL)))} "
                       f"(got {value!r})")
    return value


def tree_rule(value: str | None, *, option: str = "verification") -> str:
    """A tree drafter's sampled-tree option checked: "token" (the default, for None) or "traversal"."""
    if value is None:
        return TREE_RULES[0]
    if value not in TREE_RULES:
        chains_only = " (block verification is for chains)" if value == "block" else ""
        check.fail(OP, f"`{option}` of a token tree must be one of {', '.join(map(repr, TREE_RULES))}{chains_only} "
                       f"(got {value!r})")
    return value


@dataclass(frozen=True)
class Verification:
    """How the verifier judges a drafter's proposals (the drafter's options, checked by the drafter).

    rule: "exact" (lossless), "relaxed" (SpecDec: top_beta, tau) or "bild" (rollback_threshold,
        rollback_rule, keep_matching_run, trust_draft_eos).
    chain: sampled chains, "block" (block verification) or "token" (token-wise rejection sampling).
    tree: sampled trees, "token" (token-level, top-down) or "traversal" (Weng et al. 2025, leaves first;
        the torch backend only for now, a host-side loop per row: no CUDA graphs).
    siblings: sampled trees, "sampled" (children drawn without replacement from the q the proposal
        carries) or "top" (deterministic children: verified as one-hot drafts).
    lenience: rule "exact", chains: accept x when p(x) >= lenience * max p (greedy), or against
        lenience * q (token-wise sampling): Leviathan et al.'s lossy Appendix A.5; 1 is exact.
    keep_matching_run: BiLD's official code: a rollback whose replacement equals the small model's
        token keeps the whole run. trust_draft_eos: a drafted EOS ends the row unverified (BiLD's
        Algorithm 1).
    """

    rule: str = "exact"
    chain: str = DEFAULT_CHAIN_RULE
    tree: str = TREE_RULES[0]
    siblings: str = DEFAULT_SIBLINGS
    lenience: float = 1.0
    top_beta: int = 1
    tau: float = 0.0
    rollback_threshold: float = 0.0
    rollback_rule: str = "nll"
    keep_matching_run: bool = False
    trust_draft_eos: bool = False

    def __post_init__(self):
        for name, value, allowed in (("rule", self.rule, RULES), ("chain", self.chain, CHAIN_RULES),
                                     ("tree", self.tree, TREE_RULES), ("siblings", self.siblings, SIBLINGS),
                                     ("rollback_rule", self.rollback_rule, ROLLBACK_RULES)):
            if value not in allowed:
                raise ValueError(f"Verification: `{name}` must be one of {allowed} (got {value!r})")

    def tree_siblings(self, sampling: Sampling) -> str:
        """How a tree's children are drawn in this call: "sampled" only when sampling asks for draws."""
        return "sampled" if self.siblings == "sampled" and sampling.do_sample else "top"

    @property
    def capturable(self) -> bool:
        """Whether a CUDA graph can capture a sampled verify step: not with traversal's per-row host loop
        (greedy steps do not use it)."""
        return self.tree != TRAVERSAL

    @property
    def lossless(self) -> bool:
        if self.rule == "relaxed":
            return self.top_beta == 1 or self.tau == 0
        return self.rule == "exact" and self.lenience == 1


class Verifier:
    """One call's verifier: `verifier(proposal, logits, rows)` -> Accepted. Sync-free and shape-static
    (it runs inside the captured verify step), but for sampled trees verified by traversal (for now a
    host loop: the engine keeps CUDA graphs off for them)."""

    def __init__(self, verification: Verification, sampling: Sampling, backend: str, eos_ids: Tensor):
        if verification.tree == TRAVERSAL and sampling.do_sample and backend in ("triton", "cuda"):
            check.fail(OP, f"verification='traversal' has no kernel yet on the {backend!r} backend (the torch "
                           "backend runs it: backend='torch' or 'auto')")
        self.verification, self.sampling, self.backend, self.eos_ids = verification, sampling, backend, eos_ids

    def __call__(self, proposal: Proposal, logits: Tensor, rows: "Rows") -> Accepted:
        """The step's verdict from the target's logits [B, g+1, V] over [root, drafts] (a tree: one row
        per node)."""
        if proposal.tokens.shape[1] == 0:  # no row drafted: a plain step
            return self.no_drafts(logits, proposal.tokens, rows)
        if proposal.parents is not None:
            return self.tree(proposal, logits, rows)
        if self.verification.rule == "bild":
            return self.bild(proposal, logits, rows)
        if self.verification.rule == "relaxed":
            v = self.verification
            return Accepted(*ops.relaxed_verify(logits, proposal.tokens, top_beta=v.top_beta, tau=v.tau,
                                                num_draft_tokens=proposal.num_draft, backend=self.backend))
        return self.chain(proposal, logits, rows)

    # ---- the forms of a proposal -------------------------------------------------------------

    def no_drafts(self, logits: Tensor, tokens: Tensor, rows: "Rows") -> Accepted:
        """Argmax, or a draw from the target's row: the verification ops with zero drafts are exactly that."""
        if not self.sampling.do_sample:
            if self.backend == "auto":  # greedy_verify of no drafts, without the op's cost per token
                inf = float("inf")  # NaN never wins (as in greedy_verify); infinities stay as they are
                token = torch.argmax(torch.nan_to_num(logits[:, -1].float(), nan=-inf, posinf=inf, neginf=-inf),
                                     dim=-1)
                return Accepted(token.unsqueeze(1), torch.zeros_like(token))
            return Accepted(*ops.greedy_verify(logits, tokens, backend=self.backend))
        target_probs = standardize(logits, self.sampling)
        no_drafts = target_probs.new_zeros(target_probs.shape[0], 0, target_probs.shape[-1])
        return Accepted(*ops.rejection_sample(target_probs, no_drafts, tokens, seed=rows.seeds, offsets=rows.cursor,
                                             backend=self.backend))

    def chain(self, proposal: Proposal, logits: Tensor, rows: "Rows") -> Accepted:
        """Rule "exact" on a chain: match the argmax, or keep the target's law against q (or one-hot)."""
        drafts, count, lenience = proposal.tokens, proposal.num_draft, self.verification.lenience
        if not self.sampling.do_sample:
            if lenience < 1:  # accept x when p(x) >= l * max(p): a logit gap <= -log(l)
                return Accepted(*ops.relaxed_verify(logits, drafts, top_beta=logits.shape[-1],
                                                    tau=math.nextafter(-math.log(lenience), math.inf),
                                                    num_draft_tokens=count, backend=self.backend))
            return Accepted(*ops.greedy_verify(logits, drafts, num_draft_tokens=count, backend=self.backend))
        target_probs = standardize(logits, self.sampling)
        draft_probs = proposal.probs if proposal.probs is not None else one_hot(drafts, target_probs)
        if self.verification.chain == "block":
            return Accepted(*ops.block_verify(target_probs, draft_probs, drafts, seed=rows.seeds, offsets=rows.cursor,
                                              num_draft_tokens=count, backend=self.backend))
        if lenience != 1:
            draft_probs = draft_probs * lenience
        return Accepted(*ops.rejection_sample(target_probs, draft_probs, drafts, seed=rows.seeds, offsets=rows.cursor,
                                              num_draft_tokens=count, backend=self.backend))

    def tree(self, proposal: Proposal, logits: Tensor, rows: "Rows") -> Accepted:
        """A token tree node by node, `rows.depth` levels deep. Greedy: the longest path matching the
        target's argmax. Sampling: top-K (or copied) siblings are deterministic, so each is verified
        as a one-hot draft; sampled siblings against the q they were drawn from, less the siblings
        already rejected. Either way the residual after each rejected sibling keeps the target's law,
        top-down node by node (tree "token") or leaves first with sequence-level levels ("traversal")."""
        tokens = torch.cat([rows.root.unsqueeze(1), proposal.tokens], dim=1)
        parents, depth = proposal.parents, rows.depth
        if not self.sampling.do_sample:
            return Accepted(*ops.tree_greedy_verify(logits, tokens, parents, max_depth=depth, backend=self.backend))
        target_probs = standardize(logits, self.sampling)
        if self.verification.tree_siblings(self.sampling) == "sampled":
            if proposal.probs is None:
                check.fail(OP, "a tree of sampled siblings needs the q its children were drawn from (Proposal.probs)")
            return Accepted(*ops.tree_rejection_sample(
                target_probs, proposal.probs, tokens, parents, seed=rows.seeds, offsets=rows.cursor,
                max_depth=depth, siblings="without_replacement", verification=self.verification.tree,
                backend=self.backend))
        return Accepted(*ops.tree_rejection_sample(target_probs, one_hot(tokens, target_probs), tokens, parents,
                                                   seed=rows.seeds, offsets=rows.cursor, max_depth=depth,
                                                   verification=self.verification.tree, backend=self.backend))

    def bild(self, proposal: Proposal, logits: Tensor, rows: "Rows") -> Accepted:
        """BiLD's rules (LOSSY): roll back from the first draft the large model finds too unlikely
        (bild_verify; rollback_rule "exact": any draft that is not its argmax, greedy_verify) and take
        the large model's token there, drawn from its standardised row when sampling."""
        v = self.verification
        drafts, count = proposal.tokens, proposal.num_draft
        if v.rollback_rule == "exact":
            out, num_accepted = ops.greedy_verify(logits, drafts, num_draft_tokens=count, backend=self.backend)
        else:
            out, num_accepted = ops.bild_verify(logits, drafts, rollback_threshold=v.rollback_threshold,
                                                num_draft_tokens=count, backend=self.backend)
        at = torch.arange(drafts.shape[0], device=drafts.device)
        if v.keep_matching_run and v.rollback_rule == "nll":
            # the official code keeps the whole run when the replacement equals the small token
            padded = torch.cat([drafts, drafts[:, :1]], dim=1)
            same = (num_accepted < count) & (out[at, num_accepted] == padded[at, num_accepted])
            keep_all, all_accepted = ops.bild_verify(logits, drafts, rollback_threshold=ACCEPT_ALL,
                                                     num_draft_tokens=count, backend=self.backend)
            out = torch.where(same.unsqueeze(1), keep_all, out)
            num_accepted = torch.where(same, all_accepted, num_accepted)
        if self.sampling.do_sample:  # the large model's token is sampled, not its top-1
            probs = standardize(logits[at, num_accepted], self.sampling)
            token = draw(probs, rows.seeds, rows.cursor + num_accepted, salt=rng.SALT_FINAL)
            out = out.scatter(1, num_accepted.unsqueeze(1), token.unsqueeze(1))
        if v.trust_draft_eos:  # a drafted EOS ends the row unverified
            j = torch.arange(drafts.shape[1], device=drafts.device).unsqueeze(0)
            eos_run = (torch.isin(drafts, self.eos_ids) & (j < count.unsqueeze(1))).any(dim=1)
            out = torch.where(eos_run.unsqueeze(1), torch.cat([drafts, out[:, -1:]], dim=1), out)
            num_accepted = torch.where(eos_run, count, num_accepted)
        return Accepted(out, num_accepted)


@dataclass
class Rows:
    """The per-row state a verdict reads: root [B] (node 0 of a tree), seeds [B] and draw cursors [B]
    (sampling: common/rng.py's keys), and the depth a tree is walked to (StepPlan.depth)."""

    root: Tensor
    seeds: Tensor
    cursor: Tensor
    depth: int | None = None


def one_hot(tokens: Tensor, target_probs: Tensor) -> Tensor:
    """Deterministic drafts as the distributions they were "drawn" from: one-hot rows [..., V]."""
    return torch.nn.functional.one_hot(tokens, target_probs.shape[-1]).to(target_probs.dtype)
