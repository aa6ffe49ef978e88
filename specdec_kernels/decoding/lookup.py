"""Strategy `lookup`: drafts without a draft model, copied from where each row's own text repeats its end
(prompt lookup, as HF's `prompt_lookup_num_tokens` and vLLM's and SGLang's `ngram` methods do), as a chain
or as a token tree of every earlier continuation ranked by frequency (SuffixDecoding); verified by the
target in one forward with the chain and tree ops, so greedy output is the target's greedy output and
sampled output follows the target's distribution.

A step, every row at once (lookup_match.py, lookup_tree.py: tensor ops, static shapes, no host sync):
  text    the row's prompt (for an encoder-decoder, its encoder input first) and the tokens generated so
          far; with `lookup_cache`, the caller's earlier outputs in front of it;
  match   the longest suffix of the text, max_ngram down to min_ngram tokens, that occurred before;
  chain   (tree_nodes=0) the up to num_draft_tokens tokens that followed its first occurrence
          (match="first", the default: HF's prompt lookup takes the first match left to right) or its most
          recent one (match="recent");
  tree    (tree_nodes=N) the N most frequent nodes of the trie of every occurrence's continuation, at most
          ceil(num_draft_tokens * n / max_ngram) levels deep for a match of n tokens (longer matches draft
          deeper, as SuffixDecoding's alpha * n).
Rows with no match draft nothing (num_draft = 0: the verify ops emit the target's own token, a plain step).
Width: on the CPU, or on a GPU without CUDA graphs, the step is as wide as the longest draft of the batch
(one host read per step, `plan`), so a batch with no match runs a one-token forward; under CUDA graphs the
width is static (num_draft_tokens, or tree_nodes), the match runs inside the captured draft step, and rows
with shorter drafts are ragged (num_draft), which costs a GPU little at decode batch sizes.

Verification: drafts are deterministic, so q is one-hot. Greedy: ops.greedy_verify (ragged) and
ops.tree_greedy_verify. Sampling: chains with ops.block_verify (the default) or ops.rejection_sample
(`verification="token"`); trees with ops.tree_rejection_sample over one-hot siblings, where each rejected
sibling is removed from the target's residual (recursive rejection sampling without replacement for
distinct deterministic drafts). Every draw is keyed by the row's cursor (engine.cursor; the step reads
counters cursor .. cursor + g, g = num_draft_tokens() the step's width); the strategy draws nothing itself.
"""

import torch
from torch import Tensor

from .. import ops
from ..ops import _validate as check
from .engine import OP, Engine, Proposal, Strategy, right_aligned
from .lookup_cache import LookupCache
from .lookup_match import chain, scan
from .lookup_tree import tree
from .plain import accept_plain
from .speculative import DEFAULT_VERIFICATION, VERIFICATIONS
from .standardize import standardize

MATCHES = ("first", "recent")


class LookupDecoder(Strategy):
    """`LookupDecoder(target, num_draft_tokens=10, max_ngram=3).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="lookup", ...)`.

    Args:
        num_draft_tokens: the chain's length (HF's prompt_lookup_num_tokens; default 10 as HF), and a tree's
            depth at the longest match.
        max_ngram, min_ngram: the longest and the shortest suffix matched (HF's max_matching_ngram_size,
            default 3 here, 2 in HF; HF's shortest is 1).
        tree_nodes: 0 (default): a chain; N > 0: a token tree of N nodes from every earlier occurrence.
        match: the chain's occurrence: "first" (default, as HF) or "recent".
        verification: sampled chains: "block" (default) or "token" (see strategy speculative).
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
        if verification is not None and verification not in VERIFICATIONS:
            check.fail(OP, f"`verification` must be one of {', '.join(map(repr, VERIFICATIONS))} "
                           f"(got {verification!r})")
        if verification is not None and self.nodes:
            check.fail(OP, "`verification` applies to chains (a token tree verifies node by node)")
        self.verification = verification or DEFAULT_VERIFICATION
        if lookup_cache is not None and not isinstance(lookup_cache, LookupCache):
            check.fail(OP, f"`lookup_cache` must be a specdec_kernels.LookupCache (got {type(lookup_cache).__name__})",
                       TypeError)
        self.cache = lookup_cache
        self.depth = min(self.k, self.nodes) if self.nodes else self.k  # a tree of N nodes is at most N deep
        self.width = self.step_depth = self.max_draft_tokens()
        self.planned = None

    def generate(self, input_ids, **kwargs):
        """specdec_kernels.generate(target, input_ids, strategy=self, **kwargs)."""
        from .api import generate
        return generate(self.target_model, input_ids, strategy=self, **kwargs)

    # ---- engine interface --------------------------------------------------------------------

    def max_draft_tokens(self) -> int:
        return self.nodes or self.k

    def num_draft_tokens(self) -> int:
        return self.width  # the step's static width g: its draws sit at cursor .. cursor + g

    def graph_key(self):
        cache = None if self.cache is None else (id(self.cache), self.cache.max_tokens)
        return (self.name, self.k, self.max_ngram, self.min_ngram, self.nodes, self.match, self.verification, cache)

    def start(self, engine: Engine) -> None:
        """The row texts' buffer: context (encoder input, then the decoder's prompt) at its start, the
        generated tokens written after it each step; one slot past any text (its last) absorbs the
        writes of generated slots beyond the budget."""
        self.width, self.step_depth, self.planned = self.max_draft_tokens(), self.depth, None
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

    def draft(self, engine: Engine) -> Proposal:
        """The step's drafts at full width: Proposal(tokens [B, g], num_draft [B]) for a chain,
        Proposal(tokens [B, N], num_draft = each tree's depth, extra = parents [B, N + 1]) for a tree."""
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
            return Proposal(tokens, num_draft=count)
        drafted = tree(text, end, found, nodes=self.nodes, depth=self.depth, max_ngram=self.max_ngram, limit=limit)
        self.tree_count = drafted.count
        return Proposal(drafted.tokens, num_draft=drafted.depth, extra=drafted.parents)

    def plan(self, engine: Engine, first: bool) -> None:
        """Eager steps only: draft now and make the step as wide as its longest draft (one host read). A tree
        that is a single path in every row (no occurrence branched) is verified as the chain it is."""
        if engine.graphs.enabled:
            return
        proposal = self.draft(engine)
        count = self.tree_count if self.nodes else proposal.num_draft
        width, depth, branched = torch.stack([count.max(), proposal.num_draft.max(),
                                              (count != proposal.num_draft).sum()]).tolist()
        self.width, self.step_depth = width, depth
        extra = None if proposal.extra is None or not branched else proposal.extra[:, :width + 1]
        self.planned = Proposal(proposal.tokens[:, :width], num_draft=proposal.num_draft, extra=extra)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        planned, self.planned = self.planned, None
        return planned if planned is not None else self.draft(engine)

    def tree_parents(self, engine: Engine, proposal: Proposal) -> Tensor | None:
        return proposal.extra if proposal.extra is not None and proposal.tokens.shape[1] else None

    def accept(self, engine: Engine, proposal: Proposal, logits: Tensor) -> tuple[Tensor, Tensor]:
        """A tree (parents in proposal.extra) node by node; a chain, or a tree of single paths (num_draft is
        each row's path length), with the chain ops."""
        self.accepted_nodes = None
        if not proposal.tokens.shape[1]:  # no row drafted: a plain step
            return accept_plain(engine, proposal, logits)
        if proposal.extra is not None:
            return self.accept_tree(engine, proposal, logits)
        drafts, count = proposal.tokens, proposal.num_draft
        if not engine.sampling.do_sample:
            return ops.greedy_verify(logits, drafts, num_draft_tokens=count, backend=engine.backend)
        target_probs = standardize(logits, engine.sampling)
        one_hot = torch.nn.functional.one_hot(drafts, target_probs.shape[-1]).to(target_probs.dtype)
        verify = ops.block_verify if self.verification == "block" else ops.rejection_sample
        return verify(target_probs, one_hot, drafts, seed=engine.seeds, offsets=engine.cursor, num_draft_tokens=count,
                      backend=engine.backend)

    def accept_tree(self, engine: Engine, proposal: Proposal, logits: Tensor) -> tuple[Tensor, Tensor]:
        tokens = torch.cat([engine.root.unsqueeze(1), proposal.tokens], dim=1)
        parents = proposal.extra
        if not engine.sampling.do_sample:
            out, num_accepted, self.accepted_nodes = ops.tree_greedy_verify(
                logits, tokens, parents, max_depth=self.step_depth, backend=engine.backend)
            return out, num_accepted
        target_probs = standardize(logits, engine.sampling)
        one_hot = torch.nn.functional.one_hot(tokens, target_probs.shape[-1]).to(target_probs.dtype)
        out, num_accepted, self.accepted_nodes = ops.tree_rejection_sample(
            target_probs, one_hot, tokens, parents, seed=engine.seeds, offsets=engine.cursor,
            max_depth=self.step_depth, backend=engine.backend)
        return out, num_accepted

    def commit_target(self, engine: Engine, proposal: Proposal, num_accepted: Tensor) -> None:
        if not proposal.tokens.shape[1]:
            engine.cache.commit(1)  # the root alone was fed: keep it (as plain does)
        elif self.accepted_nodes is None:
            engine.cache.rollback(num_accepted)
        else:
            engine.cache.compact(self.accepted_nodes)

    def select_rows(self, index: Tensor) -> None:
        self.text = self.text.index_select(0, index)
        self.context = self.context.index_select(0, index)

    def finish(self, engine: Engine) -> None:
        """Add every row's new tokens to the lookup cache, in row order."""
        if self.cache is not None:
            lengths = engine.final_lengths.tolist()
            self.cache.add([row[:n] for row, n in zip(engine.final, lengths)])

    def report(self, engine: Engine) -> dict:
        matched, steps = self.matched.tolist()
        out = {"match_rate": matched / steps if steps else 0.0}
        if self.nodes:
            out["tree_nodes"] = self.nodes
        if self.cache is not None:
            out["lookup_cache_tokens"] = self.cache.used
        return out
