"""Strategy `speculative` (Leviathan et al. 2023): a small causal LM drafts g tokens, the target
verifies them in one forward; greedy (ops.greedy_verify) and sampling (ops.rejection_sample) are
both lossless: greedy output is token-identical to the target's greedy decoding, sampled output
follows the target's (standardised) distribution.

Options:
  num_draft_tokens (g, default 5).
  schedule: "constant" or "heuristic" (HF's num_assistant_tokens_schedule="heuristic", made
      batch-wide so shapes stay static: g += 2 when every unfinished row accepted all g drafts,
      else g -= 1, within [1, max_draft_tokens]). Each new g is one more CUDA-graph capture.
  max_draft_tokens: the heuristic's ceiling (default 2 * num_draft_tokens).
  tree_topk (K, default 1), tree_nodes (N, default num_draft_tokens): token trees
      (draft_tree.py). Each of the num_draft_tokens levels expands the K most probable children of
      the K best nodes so far; the N nodes of highest cumulative draft probability form each row's
      tree, verified by the target in one forward (ops.tree_greedy_verify, or
      ops.tree_rejection_sample: lossless in both modes); both caches keep the accepted path
      (kv_compact). K = 1, N = num_draft_tokens is
      the chain above. Trees need schedule="constant" and lenience=1.
  tree_siblings: how a sampling tree picks a node's K children: "sampled" (the default: K draws from
      the draft's q without replacement, verified by recursive rejection sampling without
      replacement, ops.tree_rejection_sample(..., siblings="without_replacement"), Jeon et al.
      2024) or "top" (the K most probable, verified as one-hot drafts). Both lossless; greedy
      always takes the top K.
  verification: how sampled chain drafts are verified (greedy is exact match either way): "block"
      (the default; Sun et al. 2025, ops.block_verify: the longest draft prefix whose joint test
      passes is kept, so a later draft can rescue an earlier one; the same target law, never fewer
      accepted tokens in expectation) or "token" (Leviathan's Algorithm 1, ops.rejection_sample,
      draft by draft; the default when lenience < 1). Block reads every draft position's rows
      over V, token-wise one. Chains only.
  lenience: l in (0, 1], Appendix A.5 of the paper, LOSSY for l < 1. Sampling: q is scaled by l
      before the comparison (accept with min(1, p / (l q))), and the residual is
      norm(max(0, p - l q)); no token is emitted with probability above p(x) / l. Greedy: the
      pre-standardisation rule, accept x when p(x) >= l * max(p) (the paper prints "<=", a typo:
      with l = 1 it must reduce to exact match), i.e. logit gap <= -log(l), by ops.relaxed_verify.
Vocabularies: a draft LM head padded past the tokenizer is truncated to the target's V, a
smaller one padded with zero probability (standardize.fit_vocab); target ids past a smaller draft's
embedding table are fed to the draft as its last id (what the draft conditions on never affects
exactness, only the acceptance rate).
"""

import math

import torch
from torch import Tensor

from .. import ops
from ..ops import _validate as check
from . import draft_tree
from .draft_model import TwoModelStrategy
from .engine import OP, Engine, Proposal, weight_addresses
from .standardize import standardize

VERIFICATIONS = ("block", "token")
DEFAULT_VERIFICATION = "block"  # why: docs/strategies/speculative.md "Verification rules"; bench/results/verification_chains_cpu.md
DEFAULT_TREE_SIBLINGS = "sampled"  # likewise: bench/results/verification_trees_cpu.md, verification_rules_cpu.md


class SpeculativeDecoder(TwoModelStrategy):
    """`SpeculativeDecoder(target, draft, num_draft_tokens=5).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft, ...)`."""

    name = "speculative"

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
        if verification is not None and not self.tree.chain:
            check.fail(OP, "`verification` applies to chains (a token tree verifies node by node: see tree_siblings)")
        if verification is None:  # lenience < 1 is defined for the token-wise rule only
            verification = "token" if self.lenience != 1 else DEFAULT_VERIFICATION
        if verification not in VERIFICATIONS:
            check.fail(OP, f"`verification` must be one of {', '.join(map(repr, VERIFICATIONS))} (got {verification!r})")
        self.verification = verification
        if verification == "block" and self.lenience != 1:
            check.fail(OP, f"`lenience` < 1 needs verification='token' (block verification is exact; got {lenience})")
        if not self.tree.chain and schedule != "constant":
            check.fail(OP, "`schedule` must be 'constant' with a token tree (tree_topk > 1 or tree_nodes != "
                           f"num_draft_tokens; got {schedule!r})")
        if tree_siblings is not None and tree_siblings not in draft_tree.SIBLINGS:
            check.fail(OP, f"`tree_siblings` must be one of {', '.join(map(repr, draft_tree.SIBLINGS))} "
                           f"(got {tree_siblings!r})")
        if tree_siblings is not None and self.tree.chain:
            check.fail(OP, "`tree_siblings` applies to token trees (tree_topk > 1 or tree_nodes != num_draft_tokens)")
        self.tree_siblings = tree_siblings or DEFAULT_TREE_SIBLINGS
        if not self.tree.chain and self.lenience != 1:
            check.fail(OP, f"`lenience` must be 1 with a token tree (tree verification is exact; got {lenience})")

    # ---- engine interface --------------------------------------------------------------------

    def start(self, engine: Engine) -> None:
        self.g = self.initial_g
        if self.tree.topk > engine.vocab:
            check.fail(OP, f"`tree_topk`={self.tree.topk} exceeds the vocabulary ({engine.vocab})")
        super().start(engine)

    def num_draft_tokens(self) -> int:
        return self.g if self.tree.chain else self.tree.nodes

    def graph_key(self):
        return (self.name, id(self.draft_model), weight_addresses(self.draft_model), self.initial_g, self.schedule,
                self.g_max, self.lenience, self.tree.topk, self.tree.nodes, self.verification, self.tree_siblings)

    def max_draft_tokens(self) -> int:
        # a tree step writes N + 1 target and up to 1 + (DEPTH - 1) * K draft entries past the committed ones
        return self.g_max if self.tree.chain else max(self.tree.nodes, self.tree.draft_nodes)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        if not self.tree.chain:
            return self.propose_tree(engine, first)
        feed = self.draft.begin(engine, first)
        tokens, probs = [], []
        for i in range(self.g):
            token, q = self.draft_token(engine, self.draft.next_logits(feed), engine.cursor + i)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            feed = token.unsqueeze(1)
        return Proposal(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def accept(self, engine: Engine, proposal: Proposal, logits: Tensor) -> tuple[Tensor, Tensor]:
        if not self.tree.chain:
            return self.accept_tree(engine, proposal, logits)
        if not engine.sampling.do_sample:
            if self.lenience < 1:
                return ops.relaxed_verify(logits, proposal.tokens, top_beta=logits.shape[-1],
                                          tau=math.nextafter(-math.log(self.lenience), math.inf),
                                          backend=engine.backend)
            return ops.greedy_verify(logits, proposal.tokens, backend=engine.backend)
        target_probs = standardize(logits, engine.sampling)
        if self.verification == "block":
            return ops.block_verify(target_probs, proposal.probs, proposal.tokens, seed=engine.seeds,
                                    offsets=engine.cursor, backend=engine.backend)
        draft_probs = proposal.probs if self.lenience == 1 else proposal.probs * self.lenience
        return ops.rejection_sample(target_probs, draft_probs, proposal.tokens, seed=engine.seeds,
                                    offsets=engine.cursor, backend=engine.backend)

    def end_step(self, all_accepted: bool) -> None:
        if self.schedule == "heuristic":
            self.g = min(self.g + 2, self.g_max) if all_accepted else max(self.g - 1, 1)

    # ---- token trees (tree_topk, tree_nodes) ----------------------------------------------------

    def propose_tree(self, engine: Engine, first: bool) -> Proposal:
        """Proposal(tokens [B, N], num_draft = DEPTH (accepted positions are path depths),
        extra [B, 2, N + 1] = (parents, each node's index in the draft's last tree forward))."""
        draft, sampling = self.draft, engine.sampling
        root_logprobs = draft_tree.draft_log_probs(draft.root_logits(draft.begin(engine, first)), sampling)
        tree = draft_tree.grow_tree(self.tree, engine.root, root_logprobs, draft.tree_logits,
                                    lambda logits: draft_tree.draft_log_probs(logits, sampling),
                                    siblings=self.siblings(engine), seeds=engine.seeds, cursors=engine.cursor)
        return Proposal(tree.tokens, tree.draft_probs, num_draft=torch.full_like(engine.root, self.tree.depth),
                        extra=torch.stack([tree.parents, tree.draft_node], dim=1))

    def siblings(self, engine: Engine) -> str:
        return "sampled" if self.tree_siblings == "sampled" and engine.sampling.do_sample else "top"

    def tree_parents(self, engine: Engine, proposal: Proposal) -> Tensor | None:
        return None if self.tree.chain else proposal.extra[:, 0]

    def accept_tree(self, engine: Engine, proposal: Proposal, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Greedy: the longest path matching the target's argmax. Sampling: the top-K siblings are
        deterministic, so each is verified as a one-hot draft (the op's residual update after each
        rejected sibling keeps the output exactly the target's distribution); sampled siblings are
        verified against the q they were drawn from, less the siblings already rejected."""
        tokens = torch.cat([engine.root.unsqueeze(1), proposal.tokens], dim=1)
        parents = proposal.extra[:, 0]
        if not engine.sampling.do_sample:
            out, num_accepted, self.accepted_nodes = ops.tree_greedy_verify(
                logits, tokens, parents, max_depth=self.tree.depth, backend=engine.backend)
            return out, num_accepted
        target_probs = standardize(logits, engine.sampling)
        if self.siblings(engine) == "sampled":
            out, num_accepted, self.accepted_nodes = ops.tree_rejection_sample(
                target_probs, proposal.probs, tokens, parents, seed=engine.seeds, offsets=engine.cursor,
                max_depth=self.tree.depth, siblings="without_replacement", backend=engine.backend)
            return out, num_accepted
        one_hot = torch.nn.functional.one_hot(tokens, target_probs.shape[-1]).to(target_probs.dtype)
        out, num_accepted, self.accepted_nodes = ops.tree_rejection_sample(
            target_probs, one_hot, tokens, parents, seed=engine.seeds, offsets=engine.cursor,
            max_depth=self.tree.depth, backend=engine.backend)
        return out, num_accepted

    def commit_target(self, engine: Engine, proposal: Proposal, num_accepted: Tensor) -> None:
        if self.tree.chain:
            return super().commit_target(engine, proposal, num_accepted)
        engine.cache.compact(self.accepted_nodes)

    def after_accept(self, engine: Engine, proposal: Proposal, num_accepted: Tensor) -> None:
        if self.tree.chain:
            return super().after_accept(engine, proposal, num_accepted)
        keep = draft_tree.draft_keep(self.accepted_nodes, num_accepted, proposal.extra[:, 1])
        self.draft.compact(engine, keep, num_accepted == 0)

    def report(self, engine: Engine) -> dict:
        if not self.tree.chain:
            return {"tree_topk": self.tree.topk, "tree_nodes": self.tree.nodes}
        # the heuristic schedule's last length (custom_generate writes it back to HF's assistant, as HF does)
        return {"num_draft_tokens_final": self.g} if self.schedule == "heuristic" else {}
