"""Strategy `lookup`: drafts without a draft model, copied from where each row's own text repeats its end
(prompt lookup, as HF's `prompt_lookup_num_tokens` and vLLM's and SGLang's `ngram` methods do), as a chain
or as a token tree of every earlier continuation ranked by frequency (SuffixDecoding); verified by the
target in one forward with the chain and tree ops, so greedy output is the target's greedy output and
sampled output follows the target's distribution.

Options, matching and the cache: docs/strategies/lookup.md. Width: eagerly a step is as wide as the
batch's longest draft (one host read, `plan`); under CUDA graphs it is static and the match runs inside
the captured draft step, rows with shorter drafts ragged. Drafts are deterministic, so q is one-hot, and
every draw is keyed by the row's cursor (engine.cursor): the strategy draws nothing itself.
"""

import torch
from torch import Tensor

from ..common import validate as check
from .drafter import Drafter
from .engine import OP, Engine, right_aligned
from .lookup_cache import LookupCache
from .lookup_match import chain, scan
from .lookup_tree import tree
from .step import Proposal, StepPlan
from .verifier import Verification, chain_rule, tree_rule

MATCHES = ("first", "recent")


class LookupDecoder(Drafter):
    """`LookupDecoder(target, num_draft_tokens=10, max_ngram=3).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="lookup", ...)`.

    Args:
        num_draft_tokens: the chain's length (HF's prompt_lookup_num_tokens; default 10 as HF), and a tree's
            depth at the longest match.
        max_ngram, min_ngram: the longest and the shortest suffix matched (HF's max_matching_ngram_size,
            default 3 here, 2 in HF; HF's shortest is 1).
        tree_nodes: 0 (default): a chain; N > 0: a token tree of N nodes from every earlier occurrence.
        match: the chain's occurrence: "first" (default, as HF) or "recent".
        verification: sampled chains: "block" (default) or "token"; sampled trees: "token" (default) or
            "traversal" (on a chain, "traversal" is "block"; see strategy speculative).
        lookup_cache: a LookupCache of earlier outputs to draft from too; this call's outputs are added
            to it at the end.
    """

    name = "lookup"
    # no: the first step re-feeds the prompt's last token with drafts from the prompt, so the prompt is
    # looked up at once (HF's prompt lookup verifies its first candidates in the prefill's forward)
    first_token_from_prefill = False

    def __init__(self, target=None, *, num_draft_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1,
                 tree_nodes: int = 0, match: str | None = None, verification: str | None = None,
                 lookup_cache: LookupCache | None = None):
        self.target_model = target
        self.k = check.positive_int(OP, "num_draft_tokens", num_draft_tokens)
        self.max_ngram = check.positive_int(OP, "max_ngram", max_ngram)
        self.min_ngram = check.positive_int(OP, "min_ngram", min_ngram)
        if self.min_ngram > self.max_ngram:
            check.fail(OP, f"`min_ngram` must be <= max_ngram={self.max_ngram} (got {min_ngram})")
        self.nodes = check.positive_int(OP, "tree_nodes", tree_nodes, minimum=0)
        if match is not None and match not in MATCHES:
            check.fail(OP, f"`match` must be one of {', '.join(map(repr, MATCHES))} (got {match!r})")
        if match is not None and self.nodes:
            check.fail(OP, "`match` picks the chain's occurrence; a tree (tree_nodes > 0) uses all of them")
        self.match = match or "first"
        # copied drafts are one-hot (no q); a tree's copied siblings are deterministic
        rule = dict(tree=tree_rule(verification)) if self.nodes else dict(chain=chain_rule(verification))
        self.verification = Verification(**rule, siblings="top")
        if lookup_cache is not None and not isinstance(lookup_cache, LookupCache):
            check.fail(OP, f"`lookup_cache` must be a specdec_kernels.LookupCache (got {type(lookup_cache).__name__})",
                       TypeError)
        self.cache = lookup_cache
        self.depth = min(self.k, self.nodes) if self.nodes else self.k  # a tree of N nodes is at most N deep
        self.max_width = self.nodes or self.k

    # ---- engine interface --------------------------------------------------------------------

    def graph_key(self):
        cache = None if self.cache is None else (id(self.cache), self.cache.max_tokens)
        return (self.name, self.k, self.max_ngram, self.min_ngram, self.nodes, self.match, cache)

    def start(self, engine: Engine) -> None:
        """The row texts' buffer: context (encoder input, then the decoder's prompt) at its start, the
        generated tokens written after it each step; one slot past any text (its last) absorbs the
        writes of generated slots beyond the budget."""
        device, batch = engine.device, engine.prompts.shape[0]
        parts, lengths = [], []
        if engine.encoder_decoder:
            source, source_lengths = right_aligned(engine.input_ids.to(torch.int64), engine.source_mask)
            parts.append(source)
            lengths.append(source_lengths)
        parts.append(engine.prompts)
        lengths.append(engine.prompt_lengths)
        width = sum(p.shape[1] for p in parts[:-1]) + engine.span + 1
        text = torch.full((batch, width), -1, dtype=torch.int64, device=device)
        offset = torch.zeros(batch, dtype=torch.int64, device=device)
        for part, length in zip(parts, lengths):  # each row's tokens of each part, one after the other
            j = torch.arange(part.shape[1], device=device).unsqueeze(0)
            text.scatter_(1, torch.where(j < length.unsqueeze(1), offset.unsqueeze(1) + j, width - 1), part)
            offset = offset + length
        text[:, -1] = -1
        self.text = engine.keep("lookup.text", text)
        self.context = engine.keep("lookup.context", offset)
        self.matched = engine.keep("lookup.matched", torch.zeros(2, dtype=torch.int64, device=device))
        if self.cache is not None:
            if self.cache.device != device:
                self.cache.to(device)
            engine.session.state.setdefault("lookup.cache", self.cache)  # kept graphs read its tensor

    def draft(self, engine: Engine) -> tuple[Proposal, Tensor]:
        """The step's drafts at full width and each row's draft count: Proposal(tokens [B, g], num_draft [B])
        for a chain, Proposal(tokens [B, N], num_draft = each tree's depth, parents [B, N + 1]) and each
        tree's node count for a tree."""
        generated = engine.generated
        width = self.text.shape[1]
        where = self.context.unsqueeze(1) + torch.arange(generated.shape[1], device=engine.device)
        where = where.clamp(max=width - 1)
        self.text.scatter_(1, where, generated)  # slots past the text land in the last one, never read
        text, end, start = self.text, self.context + engine.num_generated, 0
        if self.cache is not None:
            start = self.cache.tokens.numel()
            text = torch.cat([self.cache.tokens.expand(text.shape[0], -1), text], dim=1)
            end = end + start
        found = scan(text, end, start, self.max_ngram, self.min_ngram)
        limit = engine.budget - engine.num_generated - 1  # the target adds one token after the drafts
        active = ~engine.finished
        self.matched += torch.stack([((found.best > 0) & active).sum(), active.sum()])
        if not self.nodes:
            tokens, count = chain(text, end, found, self.k, limit, recent=self.match == "recent")
            return Proposal(tokens, num_draft=count), count
        drafted = tree(text, end, found, nodes=self.nodes, depth=self.depth, max_ngram=self.max_ngram, limit=limit)
        return Proposal(drafted.tokens, num_draft=drafted.depth, parents=drafted.parents), drafted.count

    def plan(self, engine: Engine, first: bool) -> StepPlan:
        """Eager steps: draft now and make the step as wide as its longest draft (one host read). A tree that
        is a single path in every row (no occurrence branched) is verified as the chain it is. Under CUDA
        graphs the width is static and the captured draft step drafts."""
        if engine.graphs.enabled:
            return StepPlan(self.max_width, self.depth)
        proposal, count = self.draft(engine)
        width, depth, branched = torch.stack([count.max(), proposal.num_draft.max(),
                                              (count != proposal.num_draft).sum()]).tolist()
        parents = None if proposal.parents is None or not branched else proposal.parents[:, :width + 1]
        return StepPlan(width, depth, Proposal(proposal.tokens[:, :width], num_draft=proposal.num_draft,
                                               parents=parents))

    def propose(self, engine: Engine, first: bool) -> Proposal:
        planned = engine.step.proposal  # eager: drafted by plan
        return planned if planned is not None else self.draft(engine)[0]

    def end_step(self, engine: Engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        if kept_rows is not None:
            self.text = self.text.index_select(0, kept_rows)
            self.context = self.context.index_select(0, kept_rows)

    def finish(self, engine: Engine) -> dict:
        """Add every row's new tokens to the lookup cache, in row order; the call's statistics."""
        if self.cache is not None:
            lengths = engine.final_lengths.tolist()
            self.cache.add([row[:n] for row, n in zip(engine.final, lengths)])
        matched, steps = self.matched.tolist()
        out = {"match_rate": matched / steps if steps else 0.0}
        if self.nodes:
            out["tree_nodes"] = self.nodes
        if self.cache is not None:
            out["lookup_cache_tokens"] = self.cache.used
        return out
