"""Strategy `speculative` (Leviathan et al. 2023): a small causal LM drafts, the target verifies the drafts
in one forward. Two drafters behind one name, picked by the tree options in SpeculativeDecoder.__new__:

  ChainSpeculative  g drafts in a row, verified as a chain: greedy match, block verification (sampling, the
                    default; verification="traversal" is the same rule on a chain) or token-wise rejection
                    sampling (verification="token"); lenience < 1 is the paper's lossy Appendix A.5.
  TreeSpeculative   tree_topk > 1 or tree_nodes != num_draft_tokens: a token tree of N nodes (draft_tree.py),
                    verified node by node (sampling: top-down, or leaves first with verification="traversal");
                    both caches keep the accepted path.

Every setting with lenience 1 is lossless: greedy output is the target's greedy decoding, sampled output
follows the target's (standardised) distribution. The options, and why the defaults are what they are:
docs/strategies/speculative.md.
"""

import abc

import torch
from torch import Tensor

from ..common import validate as check
from . import draft_tree
from .draft_model import TwoModelDrafter
from .engine import OP, Engine, weight_addresses
from .step import Accepted, Proposal, StepPlan
from .verifier import DEFAULT_SIBLINGS, SIBLINGS, Verification, chain_rule, tree_rule


class SpeculativeDecoder(TwoModelDrafter):
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
        """The options of one form only, checked against the others; sets verification and max_width."""

    def start(self, engine: Engine) -> None:
        self.g = self.initial_g
        if self.tree.topk > engine.vocab:
            check.fail(OP, f"`tree_topk`={self.tree.topk} exceeds the vocabulary ({engine.vocab})")
        super().start(engine)

    def graph_key(self):
        return (self.name, id(self.draft_model), weight_addresses(self.draft_model), self.initial_g, self.schedule,
                self.g_max, self.tree.topk, self.tree.nodes)


class ChainSpeculative(SpeculativeDecoder):
    """g drafts in a chain, each drawn from the draft's standardised q (greedy: its argmax)."""

    def check_options(self, verification: str | None, tree_siblings: str | None) -> None:
        if not self.tree.chain:
            check.fail(OP, "tree_topk > 1 or tree_nodes != num_draft_tokens is a token tree: use SpeculativeDecoder")
        if verification is None and self.lenience != 1:  # lenience < 1 is defined for the token-wise rule only
            verification = "token"
        chain = chain_rule(verification)
        if chain == "block" and self.lenience != 1:
            check.fail(OP, f"`lenience` < 1 needs verification='token' (block verification is exact; got "
                           f"{self.lenience})")
        if tree_siblings is not None:
            check.fail(OP, "`tree_siblings` applies to token trees (tree_topk > 1 or tree_nodes != num_draft_tokens)")
        self.verification, self.max_width = Verification(chain=chain, lenience=self.lenience), self.g_max

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
        rule = tree_rule(verification)
        if self.schedule != "constant":
            check.fail(OP, "`schedule` must be 'constant' with a token tree (tree_topk > 1 or tree_nodes != "
                           f"num_draft_tokens; got {self.schedule!r})")
        if tree_siblings is not None and tree_siblings not in SIBLINGS:
            check.fail(OP, f"`tree_siblings` must be one of {', '.join(map(repr, SIBLINGS))} "
                           f"(got {tree_siblings!r})")
        if self.lenience != 1:
            check.fail(OP, f"`lenience` must be 1 with a token tree (tree verification is exact; got {self.lenience})")
        self.verification = Verification(tree=rule, siblings=tree_siblings or DEFAULT_SIBLINGS)
        # a step writes N + 1 target and up to 1 + (DEPTH - 1) * K draft entries past the committed ones
        self.max_width = max(self.tree.nodes, self.tree.draft_nodes)

    def plan(self, engine: Engine, first: bool) -> StepPlan:
        return StepPlan(self.tree.nodes, self.tree.depth)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        """Proposal(tokens [B, N], num_draft = DEPTH (accepted positions are path depths), parents [B, N + 1],
        extra = each node's index in the draft's last tree forward [B, N + 1])."""
        draft, sampling = self.draft, engine.sampling
        root_logprobs = draft_tree.draft_log_probs(draft.root_logits(draft.begin(engine, first)), sampling)
        tree = draft_tree.grow_tree(self.tree, engine.root, root_logprobs, draft.tree_logits,
                                    lambda logits: draft_tree.draft_log_probs(logits, sampling),
                                    siblings=self.verification.tree_siblings(sampling), seeds=engine.seeds,
                                    cursors=engine.cursor)
        return Proposal(tree.tokens, tree.draft_probs, num_draft=torch.full_like(engine.root, self.tree.depth),
                        extra=tree.draft_node, parents=tree.parents)

    def commit(self, engine: Engine, proposal: Proposal, accepted: Accepted) -> None:
        """The draft cache keeps the accepted path's nodes of its last tree forward."""
        keep = draft_tree.draft_keep(accepted.nodes, accepted.num_accepted, proposal.extra)
        self.draft.compact(engine, keep, accepted.num_accepted == 0)

    def finish(self, engine: Engine) -> dict:
        return {"tree_topk": self.tree.topk, "tree_nodes": self.tree.nodes}
