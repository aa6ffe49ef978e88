"""Strategy `eagle`: an EAGLE-3 head (specdec_kernels.models.Eagle3Drafter) drafts from the target's own hidden
states at three layers (engine.hidden: no extra target forward), as a chain or as EAGLE-2's dynamic tree.

The head's cache (a SpecCache, one layer) holds an entry for every committed position t: the pair (state
s_t = fc(the target's aux states at t), token x_{t+1}) at position t, as vLLM places it. After each step the
rows' newly committed states (the prompt's after the prefill; then the root and the accepted drafts) are fed
with the tokens one place to their right (the accepted drafts and the correction or bonus token).
  chain   the last of them gives the first draft; each further draft feeds the head its own output state and
          the previous draft, written past the committed entries and forgotten before the next step.
  tree    (tree_topk K > 1 or tree_nodes != num_draft_tokens) the last committed pair is held back as the
          tree's node 0; draft_tree.grow_tree grows the K best children of the K most probable nodes level by
          level (cumulative draft log-probability, EAGLE-2) and keeps the best tree_nodes; each tree forward
          feeds every node with its parent's output state. The held-back pair is committed after the verdict.
Verification is the engine's: exact match when greedy; sampling: chain rejection sampling (block or token)
with the drafts' q, or tree rejection sampling (sampled or top siblings; token-level or traversal), so the
output is the target's.
"""

import torch
from torch import Tensor

from ..common import validate as check
from . import draft_tree
from .drafter import Drafter
from .engine import OP, weight_addresses
from .hidden_states import FINAL_NORM
from .standardize import draft_token
from .step import Proposal, StepPlan
from .verifier import DEFAULT_SIBLINGS, SIBLINGS, Verification, chain_rule, tree_rule


def _head(draft_model):
    from ..models.eagle3 import Eagle3Drafter

    if not isinstance(draft_model, Eagle3Drafter):
        check.fail(OP, "strategy 'eagle' needs an EAGLE-3 head as draft_model "
                       "(specdec_kernels.models.Eagle3Drafter.from_pretrained(folder, target); got "
                       f"{type(draft_model).__name__})")
    return draft_model


class EagleDecoder(Drafter):
    """`EagleDecoder(target, head).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="eagle", draft_model=head, ...)`.

    Args:
        draft_model: the Eagle3Drafter (loaded for this target).
        num_draft_tokens: drafts per step (a chain), or the tree's depth.
        tree_topk, tree_nodes: a dynamic tree of tree_nodes nodes, tree_topk children per expanded node
            (defaults 1 and num_draft_tokens: the chain).
        verification: sampled chains: "block" (default) or "token"; sampled trees: "token" (default) or
            "traversal" (on a chain, "traversal" is "block"; see strategy speculative).
        tree_siblings: sampled trees: "sampled" (default) or "top".
    """

    name = "eagle"

    def __init__(self, target=None, draft_model=None, *, num_draft_tokens: int = 5, tree_topk: int = 1,
                 tree_nodes: int | None = None, verification: str | None = None, tree_siblings: str | None = None):
        self.target_model, self.head = target, _head(draft_model)
        depth = check.positive_int(OP, "num_draft_tokens", num_draft_tokens)
        self.tree = draft_tree.tree_shape(depth, tree_topk, tree_nodes)
        layers = int(target.config.get_text_config().num_hidden_layers)
        if any(layer > layers for layer in self.head.aux_layers):
            check.fail(OP, f"the EAGLE-3 head reads target layers {list(self.head.aux_layers)}, past this target's "
                           f"{layers}: it was made for another target")
        if self.tree.chain:
            if tree_siblings is not None:
                check.fail(OP, "`tree_siblings` applies to trees (tree_topk > 1 or tree_nodes != num_draft_tokens)")
            self.verification = Verification(chain=chain_rule(verification))
            self.max_width = depth
        else:
            rule = tree_rule(verification)
            if tree_siblings is not None and tree_siblings not in SIBLINGS:
                check.fail(OP, f"`tree_siblings` must be one of {', '.join(map(repr, SIBLINGS))} "
                               f"(got {tree_siblings!r})")
            self.verification = Verification(tree=rule, siblings=tree_siblings or DEFAULT_SIBLINGS)
            # the step feeds up to max_width + 1 committed pairs, then up to draft_nodes tree nodes
            self.max_width = max(self.tree.nodes, self.tree.draft_nodes)

    @property
    def draft_model(self):
        return self.head

    def target_layers(self) -> tuple:
        # aux id i: the state entering layer i, the output of layer i - 1
        return tuple(i - 1 for i in self.head.aux_layers) or (FINAL_NORM,)

    def graph_key(self):
        return (self.name, id(self.head), weight_addresses(self.head), self.tree)

    def start(self, engine) -> None:
        from .. import hf

        if self.tree.topk > engine.vocab:
            check.fail(OP, f"`tree_topk`={self.tree.topk} exceeds the vocabulary ({engine.vocab})")
        self.head.set_attn_implementation(hf.register())  # given back as it was after the call (decode)
        batch, weight = engine.prompts.shape[0], self.head.lm_head.weight
        attention = self.head.self_attn
        heads, head_dim = attention.k_proj.out_features // attention.head_dim, attention.head_dim
        self.cache, reused = engine.reuse("eagle.cache", lambda: hf.SpecCache(
            1, batch, heads, head_dim, engine.cache_length(engine.target, "target"), dtype=weight.dtype,
            device=weight.device, backend=engine.backend))
        if reused:
            self.cache.reset()
        # the tokens right of the last step's committed states: its accepted drafts, then the new root
        self.fed = engine.keep("eagle.fed", torch.zeros(batch, self.max_width + 1, dtype=torch.int64,
                                                        device=engine.device))
        # a tree's rows that held a committed pair back as node 0 this step (not a row without one yet)
        self.held = engine.keep("eagle.held", torch.zeros(batch, dtype=torch.int64, device=engine.device))

    def plan(self, engine, first: bool) -> StepPlan:
        # one-token prompts: no committed state to draft from yet, so the first step has no drafts
        if first and engine.prompts.shape[1] == 1:
            return StepPlan(0)
        return StepPlan(self.tree.depth) if self.tree.chain else StepPlan(self.tree.nodes, self.tree.depth)

    def propose(self, engine, first: bool) -> Proposal:
        if engine.step.width == 0:
            return Proposal(engine.root.new_zeros(engine.root.shape[0], 0))
        count = engine.hidden.count
        states = self.head.combine([engine.hidden.states(layer) for layer in self.target_layers()])
        tokens = engine.prompts[:, 1:states.shape[1] + 1] if first else self.fed  # [B, max_width + 1] as states
        out = self.forward(states, tokens)  # the committed pairs; the tree holds the last one back
        before_last = (count - 1).clamp(min=0)
        at_last = before_last.view(-1, 1, 1).expand(-1, 1, out.shape[-1])
        last = out.gather(1, at_last)
        if self.tree.chain:
            self.cache.commit(count)
            return self.chain(engine, last)
        self.cache.commit(before_last)
        self.held.copy_((count > 0).to(torch.int64))
        return self.grow(engine, states.gather(1, at_last), last)

    def forward(self, states: Tensor, tokens: Tensor, parents: Tensor | None = None) -> Tensor:
        """The head over states [B, N, h] and tokens [B, N] written at the cache's seq_lens (a chain, or the
        tree `parents` [B, N]); out [B, N, h]."""
        return self.head(states, tokens, self.cache.positions(tokens.shape[1], parents), cache=self.cache,
                         specdec_step=self.cache.step(parents))

    def chain(self, engine, last: Tensor) -> Proposal:
        drafts, probs = [], []
        for i in range(self.tree.depth):
            if i:  # a draft's entry, forgotten below
                last = self.forward(last, drafts[-1].unsqueeze(1))
                self.cache.commit(1)
            token, q = draft_token(self.head.logits(last[:, -1]), engine.sampling, engine.seeds, engine.cursor + i)
            drafts.append(token)
            if q is not None:
                probs.append(q)
        self.cache.seq_lens.sub_(self.tree.depth - 1)
        return Proposal(torch.stack(drafts, dim=1), torch.stack(probs, dim=1) if probs else None)

    def grow(self, engine, root_state: Tensor, root_out: Tensor) -> Proposal:
        """EAGLE-2's dynamic tree from the held-back pair (root_state [B, 1, h] with the root token)."""
        sampling = engine.sampling
        outs = [root_out]  # the last tree forward's output states, by node (node 0: the root)

        def tree_logits(tokens: Tensor, parents: Tensor) -> Tensor:
            parent_out = outs[-1].gather(1, parents[:, 1:].unsqueeze(-1).expand(-1, -1, root_out.shape[-1]))
            out = self.forward(torch.cat([root_state, parent_out], dim=1), tokens, parents)
            outs.append(out)
            return self.head.logits(out)

        root_logprobs = draft_tree.draft_log_probs(self.head.logits(root_out[:, 0]), sampling)
        tree = draft_tree.grow_tree(self.tree, engine.root, root_logprobs, tree_logits,
                                    lambda logits: draft_tree.draft_log_probs(logits, sampling),
                                    siblings=self.verification.tree_siblings(sampling), seeds=engine.seeds,
                                    cursors=engine.cursor)
        return Proposal(tree.tokens, tree.draft_probs, num_draft=torch.full_like(engine.root, self.tree.depth),
                        parents=tree.parents)

    def commit(self, engine, proposal, accepted) -> None:
        self.fed[:, :accepted.tokens.shape[1]].copy_(accepted.tokens.clamp(min=0))
        if not self.tree.chain and proposal.tokens.shape[1]:  # the held-back pair, intact at seq_lens (node 0)
            self.cache.commit(self.held)

    def end_step(self, engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        if kept_rows is not None:
            self.cache.select_rows(kept_rows)
            self.fed = self.fed.index_select(0, kept_rows)
            self.held = self.held.index_select(0, kept_rows)

    def finish(self, engine) -> dict:
        return {} if self.tree.chain else {"tree_topk": self.tree.topk, "tree_nodes": self.tree.nodes}
