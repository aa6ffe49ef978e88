"""The draft side shared by the two-model drafters (speculative, BiLD): a second HF model on its own SpecCache.

Draft-cache invariant: it holds every committed token but the last TWO, so each step's first
draft forward feeds the same two tokens per row [prev, root] whatever each row accepted (the
very first step feeds only the root: its cache holds the prompt minus the root, which also
serves prompts of one token). After the target's verdict, `rollback` keeps exactly the
committed tokens minus two: the step wrote (fed tokens + g - 1) entries; the row committed
num_accepted + 1 new tokens.
"""

import torch
from torch import Tensor

from ..common import validate as check
from .drafter import Drafter
from .engine import OP, adapt_model
from .standardize import draft_token, fit_vocab


def check_pair(target, draft) -> None:
    """Clear errors for draft/target pairs that cannot share token ids."""
    target_kind = hasattr(target, "get_encoder")
    if hasattr(draft, "get_encoder") != target_kind:
        check.fail(OP, "the draft and the target must both be decoder-only or both be encoder-decoder models "
                       f"(got target {target.config.model_type!r}, draft {draft.config.model_type!r})")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        ours, theirs = getattr(target.config, name, None), getattr(draft.config, name, None)
        if ours is not None and theirs is not None and ours != theirs:
            check.fail(OP, f"the draft and the target use different tokenizers: config.{name} is {theirs} in the "
                           f"draft and {ours} in the target (both models must share one vocabulary)")


def check_vocab(target_vocab: int, draft_vocab: int) -> None:
    """LM heads padded for speed differ by a few hundred ids at most (32000 vs 32016, 151936 vs
    152064); sizes further apart than 1/8 mean different tokenizers (e.g. GPT-2's 50257 vs 32000)."""
    if abs(target_vocab - draft_vocab) > max(target_vocab, draft_vocab) // 8:
        check.fail(OP, f"the draft's vocabulary ({draft_vocab} ids) and the target's ({target_vocab}) differ by "
                       "more than LM-head padding: the models must share one tokenizer")


class DraftModel:
    """A draft adapter + SpecCache + the step's start lengths (to roll back / freeze rows)."""

    def __init__(self, model, engine):
        check_pair(engine.target.model, model)
        self.adapter = adapt_model(model, "draft")
        self.vocab = engine.vocab
        # a draft with fewer ids than the target is fed its last id for the target's extra ids
        # (padding ids, in practice): what the draft conditions on never affects exactness
        self.max_id = self.adapter.embeddings.weight.shape[0] - 1
        check_vocab(self.vocab, self.max_id + 1)
        self.cache = engine.new_cache(self.adapter, "draft", self.max_id)
        self.start = engine.keep("draft.start", self.cache.seq_lens.clone())

    def begin(self, engine, first: bool) -> Tensor:
        """Remember where the step starts; the tokens the first forward feeds ([B, 1] or [B, 2])."""
        self.start.copy_(self.cache.seq_lens)
        if first:
            return engine.root.unsqueeze(1)
        return torch.stack([engine.prev, engine.root], dim=1)

    def next_logits(self, tokens: Tensor) -> Tensor:
        """[B, V_target] draft logits after feeding tokens [B, N] (committed to the draft cache)."""
        logits = self._last_logits(tokens)
        self.cache.commit()
        return logits

    def root_logits(self, tokens: Tensor) -> Tensor:
        """Tree drafting: [B, V_target] logits after feeding tokens [B, N] ([prev, root] or [root]),
        committing all but the root, which every tree forward feeds again as its node 0."""
        logits = self._last_logits(tokens)
        self.cache.commit(tokens.shape[1] - 1)
        return logits

    def _last_logits(self, tokens: Tensor) -> Tensor:
        """The forward of tokens [B, N] (written, not committed) and the logits of its last position
        only: the LM head on the others would not be read."""
        adapter = self.adapter
        hidden = adapter.run_layers(adapter.start(tokens.clamp(max=self.max_id), self.cache)).hidden
        return fit_vocab(adapter.logits(hidden[:, -1]), self.vocab)

    def tree_logits(self, tokens: Tensor, parents: Tensor) -> Tensor:
        """[B, M, V_target] logits of a tree forward (node i written at seq_lens + i, not committed)."""
        return fit_vocab(self.adapter.verify(tokens.clamp(max=self.max_id), self.cache, parents), self.vocab)

    def compact(self, engine, keep: Tensor, nothing: Tensor) -> None:
        """After a tree step: keep the nodes `keep` [B, M] of the last tree forward (root first, -1
        padded; rows in `nothing` drop even the root); finished rows keep their lengths."""
        self.cache.compact(keep)
        lengths = self.cache.seq_lens
        lengths.copy_(torch.where(engine.finished, self.start, lengths - nothing.to(lengths.dtype)))

    def rollback(self, engine, num_accepted: Tensor, num_forwards: int) -> None:
        """Keep committed-minus-two; finished rows keep their lengths (static shapes, no overflow)."""
        self.cache.crop(num_forwards - num_accepted)
        self.cache.seq_lens.copy_(torch.where(engine.finished, self.start, self.cache.seq_lens))

    def select_rows(self, index: Tensor) -> None:
        self.cache.select_rows(index)
        self.start = self.start.index_select(0, index)


class TwoModelDrafter(Drafter):
    """A drafter whose drafts come from a second HF model (speculative, BiLD)."""

    needs = "a causal LM sharing the target's vocabulary"

    def __init__(self, target, draft_model):
        if draft_model is None:
            check.fail(OP, f"strategy {self.name!r} needs draft_model= ({self.needs})")
        from ..models.eagle3 import Eagle3Drafter

        if isinstance(draft_model, Eagle3Drafter):  # no causal LM: it reads the target's states
            check.fail(OP, f"an EAGLE-3 head drafts in strategy 'eagle', not {self.name!r}")
        self.target_model, self.draft_model = target, draft_model

    def start(self, engine) -> None:
        self.draft = DraftModel(self.draft_model, engine)

    def draft_token(self, engine, logits: Tensor, counter: Tensor) -> tuple[Tensor, Tensor | None]:
        """standardize.draft_token with the call's sampling and seeds, at the Philox counter `counter` [B]."""
        return draft_token(logits, engine.sampling, engine.seeds, counter)

    def commit(self, engine, proposal, accepted) -> None:
        """The draft cache keeps the committed tokens but the last two (a chain's step)."""
        self.draft.rollback(engine, accepted.num_accepted, proposal.tokens.shape[1])

    def end_step(self, engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        if kept_rows is not None:
            self.draft.select_rows(kept_rows)
