"""Strategy `speculative` (Leviathan et al. 2023): a small causal LM drafts, the target verifies the drafts
in one forward. Two strategies behind one name, picked by the tree options in SpeculativeDecoder.__new__:

  ChainSpeculative  g drafts in a row: greedy_verify (greedy), block_verify (sampling, the default) or
                    rejection_sample (verification="token"); lenience < 1 is the paper's lossy Appendix A.5.
  TreeSpeculative   tree_topk > 1 or tree_nodes != num_draft_tokens: a token tree of N nodes (draft_tree.py),
                    tree_greedy_verify or tree_rejection_sample; both caches keep the accepted path.

Every setting with lenience 1 is lossless: greedy output is the target's greedy decoding, sampled output
follows the target's (standardised) distribution. The options, and why the defaults are what they are:
docs/strategies/speculative.md.
"""

import abc
import math

import torch
from torch import Tensor

from .. import ops
from ..common import validate as check
from . import draft_tree
from .draft_model import TwoModelStrategy
from .engine import OP, Engine, weight_addresses
from .strategy import Accepted, Proposal, StepPlan
from .standardize import standardize

VERIFICATIONS = ("block", "token")
DEFAULT_VERIFICATION = "block"  # why: docs/strategies/speculative.md "Verification rules"; bench/results/verification_chains_cpu.md
DEFAULT_TREE_SIBLINGS = "sampled"  # likewise: bench/results/verification_trees_cpu.md, verification_rules_cpu.md


class SpeculativeDecoder(TwoModelStrategy):
    """`SpeculativeDecoder(target, draft, num_draft_tokens=5).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft, ...)`; an object
    of ChainSpeculative or TreeSpeculative, as the tree options say."""

    name = "speculative"

    def __new__(cls, target=None, draft_model=None, *, num_draft_tokens: int = 5, schedule: str = "constant",
                max_draft_tokens: int | None = None, lenience: float = 1.0, tree_topk: int = 1,
                tree_nodes: int | None = None, verification: str | None = None, tree_siblings: str | None = None):
        if cls is SpeculativeDecoder:  # the one place the options pick the strategy
            tree = tree_topk != 1 or (tree_nodes is not None and tree_nodes != num_draft_tokens)
            cls = TreeSpeculative if tree else ChainSpeculative
        return super().__new__(cls)

    def __init__(self, target=None, draft_model=None, *, num_draft_tokens: int = 5, schedule: str = "constant",
                 max_draft_tokens: int | None = None, lenience: float = 1.0, tree_topk: int = 1,
                 tree_nodes: int | None = None, verification: str | None = None, tree_siblings: str | None = None):
        super().__init__(target, draft_model)
        self.g = self.initial_g = check.positive_int(OP, "num_draft_tokens", num_draft_tokens)
        if schedule not in ("constant", "heuristic"):
            check.fail(OP, f"`schedule` must be 'constant' or 'heuristic' (got {schedule!r})")
        self.schedule = schedule
        self.g_max = self.g if schedule == "constant" else check.positive_int(
            OP, "max_draft_tokens", max_draft_tokens or 2 * self.g)
        self.g_max = max(self.g_max, self.g)
        self.lenience = check.real_number(OP, "lenience", lenience)
        if not 0 < self.lenience <= 1:
            check.fail(OP, f"`lenience` must be in (0, 1] (1 = exact; got {lenience})")
        self.tree = draft_tree.tree_shape(self.g, tree_topk, tree_nodes)
        self.check_options(verification, tree_siblings)

    @abc.abstractmethod
    def check_options(self, verification: str | None, tree_siblings: str | None) -> None:
        """The options of one form only, checked against the others; sets verification, tree_siblings
        and max_width."""

    def start(self, engine: Engine) -> None:
        self.g = self.initial_g
        if self.tree.topk > engine.vocab:
            check.fail(OP, f"`tree_topk`={self.tree.topk} exceeds the vocabulary ({engine.vocab})")
        super().start(engine)

    def graph_key(self):
        return (self.name, id(self.draft_model), weight_addresses(self.draft_model), self.initial_g, self.schedule,
                self.g_max, self.lenience, self.tree.topk, self.tree.nodes, self.verification, self.tree_siblings)


class ChainSpeculative(SpeculativeDecoder):
    """g drafts in a chain, each drawn from the draft's standardised q (greedy: its argmax)."""

    def check_options(self, verification: str | None, tree_siblings: str | None) -> None:
        if not self.tree.chain:
            check.fail(OP, "tree_topk > 1 or tree_nodes != num_draft_tokens is a token tree: use SpeculativeDecoder")
        if verification is None:  # lenience < 1 is defined for the token-wise rule only
            verification = "token" if self.lenience != 1 else DEFAULT_VERIFICATION
        if verification not in VERIFICATIONS:
            check.fail(OP, f"`verification` must be one of {', '.join(map(repr, VERIFICATIONS))} (got {verification!r})")
        if verification == "block" and self.lenience != 1:
            check.fail(OP, f"`lenience` < 1 needs verification='token' (block verification is exact; got "
                           f"{self.lenience})")
        if tree_siblings is not None:
            check.fail(OP, "`tree_siblings` applies to token trees (tree_topk > 1 or tree_nodes != num_draft_tokens)")
        self.verification, self.tree_siblings, self.max_width = verification, DEFAULT_TREE_SIBLINGS, self.g_max

    def plan(self, engine: Engine, first: bool) -> StepPlan:
        return StepPlan(self.g)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        feed = self.draft.begin(engine, first)
        tokens, probs = [], []
        for i in range(self.g):
            token, q = self.draft_token(engine, self.draft.next_logits(feed), engine.cursor + i)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            feed = token.unsqueeze(1)
        return Proposal(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def accept(self, engine: Engine, proposal: Proposal, logits: Tensor) -> Accepted:
        if not engine.sampling.do_sample:
            if self.lenience < 1:  # accept x when p(x) >= l * max(p): a logit gap <= -log(l)
                return Accepted(*ops.relaxed_verify(logits, proposal.tokens, top_beta=logits.shape[-1],
                                                    tau=math.nextafter(-math.log(self.lenience), math.inf),
                                                    backend=engine.backend))
            return Accepted(*ops.greedy_verify(logits, proposal.tokens, backend=engine.backend))
        target_probs = standardize(logits, engine.sampling)
        if self.verification == "block":
            return Accepted(*ops.block_verify(target_probs, proposal.probs, proposal.tokens, seed=engine.seeds,
                                              offsets=engine.cursor, backend=engine.backend))
        draft_probs = proposal.probs if self.lenience == 1 else proposal.probs * self.lenience
        return Accepted(*ops.rejection_sample(target_probs, draft_probs, proposal.tokens, seed=engine.seeds,
                                              offsets=engine.cursor, backend=engine.backend))

    def end_step(self, engine: Engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        super().end_step(engine, all_accepted, kept_rows)
        if self.schedule == "heuristic":
            self.g = min(self.g + 2, self.g_max) if all_accepted else max(self.g - 1, 1)

    def finish(self, engine: Engine) -> dict:
        # the heuristic schedule's last length (custom_generate writes it back to HF's assistant, as HF does)
        return {"num_draft_tokens_final": self.g} if self.schedule == "heuristic" else {}


class TreeSpeculative(SpeculativeDecoder):
    """A token tree: each of DEPTH levels expands the K most probable children of the K best nodes so far,
    and the N nodes of highest cumulative draft probability are verified in one forward."""

    def check_options(self, verification: str | None, tree_siblings: str | None) -> None:
        if verification is not None:
            check.fail(OP, "`verification` applies to chains (a token tree verifies node by node: see tree_siblings)")
        if self.schedule != "constant":
            check.fail(OP, "`schedule` must be 'constant' with a token tree (tree_topk > 1 or tree_nodes != "
                           f"num_draft_tokens; got {self.schedule!r})")
        if tree_siblings is not None and tree_siblings not in draft_tree.SIBLINGS:
            check.fail(OP, f"`tree_siblings` must be one of {', '.join(map(repr, draft_tree.SIBLINGS))} "
                           f"(got {tree_siblings!r})")
        if self.lenience != 1:
            check.fail(OP, f"`lenience` must be 1 with a token tree (tree verification is exact; got {self.lenience})")
        self.verification, self.tree_siblings = DEFAULT_VERIFICATION, tree_siblings or DEFAULT_TREE_SIBLINGS
        # a step writes N + 1 target and up to 1 + (DEPTH - 1) * K draft entries past the committed ones
        self.max_width = max(self.tree.nodes, self.tree.draft_nodes)

    def plan(self, engine: Engine, first: bool) -> StepPlan:
        return StepPlan(self.tree.nodes)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        """Proposal(tokens [B, N], num_draft = DEPTH (accepted positions are path depths), parents [B, N + 1],
        extra = each node's index in the draft's last tree forward [B, N + 1])."""
        draft, sampling = self.draft, engine.sampling
        root_logprobs = draft_tree.draft_log_probs(draft.root_logits(draft.begin(engine, first)), sampling)
        tree = draft_tree.grow_tree(self.tree, engine.root, root_logprobs, draft.tree_logits,
                                    lambda logits: draft_tree.draft_log_probs(logits, sampling),
                                    siblings=self.siblings(engine), seeds=engine.seeds, cursors=engine.cursor)
        return Proposal(tree.tokens, tree.draft_probs, num_draft=torch.full_like(engine.root, self.tree.depth),
                        extra=tree.draft_node, parents=tree.parents)

    def siblings(self, engine: Engine) -> str:
        return "sampled" if self.tree_siblings == "sampled" and engine.sampling.do_sample else "top"

    def accept(self, engine: Engine, proposal: Proposal, logits: Tensor) -> Accepted:
        """Greedy: the longest path matching the target's argmax. Sampling: top-K siblings are deterministic,
        so each is verified as a one-hot draft; sampled siblings against the q they were drawn from, less the
        siblings already rejected. Either way the residual after each rejected sibling keeps the target's law."""
        tokens = torch.cat([engine.root.unsqueeze(1), proposal.tokens], dim=1)
        parents, depth = proposal.parents, self.tree.depth
        if not engine.sampling.do_sample:
            return Accepted(*ops.tree_greedy_verify(logits, tokens, parents, max_depth=depth, backend=engine.backend))
        target_probs = standardize(logits, engine.sampling)
        if self.siblings(engine) == "sampled":
            return Accepted(*ops.tree_rejection_sample(
                target_probs, proposal.probs, tokens, parents, seed=engine.seeds, offsets=engine.cursor,
                max_depth=depth, siblings="without_replacement", backend=engine.backend))
        one_hot = torch.nn.functional.one_hot(tokens, target_probs.shape[-1]).to(target_probs.dtype)
        return Accepted(*ops.tree_rejection_sample(target_probs, one_hot, tokens, parents, seed=engine.seeds,
                                                   offsets=engine.cursor, max_depth=depth, backend=engine.backend))

    def commit(self, engine: Engine, proposal: Proposal, accepted: Accepted) -> None:
        """The draft cache keeps the accepted path's nodes of its last tree forward."""
        keep = draft_tree.draft_keep(accepted.nodes, accepted.num_accepted, proposal.extra)
        self.draft.compact(engine, keep, accepted.num_accepted == 0)

    def finish(self, engine: Engine) -> dict:
        return {"tree_topk": self.tree.topk, "tree_nodes": self.tree.nodes}
