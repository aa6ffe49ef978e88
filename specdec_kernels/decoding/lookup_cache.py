"""`specdec_kernels.LookupCache`: earlier outputs that strategy `lookup` drafts from, kept by the caller
across `generate` calls (agent loops, repeated requests: SuffixDecoding's global cache).

    cache = specdec_kernels.LookupCache(max_tokens=65536)
    for request in requests:
        out = specdec_kernels.generate(target, ids, strategy="lookup", lookup_cache=cache, ...)

Memory and eviction (one int64 slot per token, first in first out, updated in place so kept CUDA
graphs replay on the new contents; one cache per tokenizer, not thread-safe): docs/strategies/lookup.md.
"""

import torch
from torch import Tensor

from ..common import validate as check

OP = "LookupCache"


class LookupCache:
    """A bounded first-in-first-out store of earlier outputs for `strategy="lookup"` (see the module doc)."""

    def __init__(self, max_tokens: int = 65536, *, device=None):
        self.max_tokens = check.positive_int(OP, "max_tokens", max_tokens, minimum=2)
        self.tokens = torch.full((self.max_tokens + 1,), -1, dtype=torch.int64, device=device)
        self.used = 0  # slots holding tokens or separators, at the end of self.tokens
        self.documents = 0

    def __repr__(self) -> str:
        return f"LookupCache(max_tokens={self.max_tokens}, used={self.used}, documents={self.documents})"

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to(self, device) -> "LookupCache":
        """Move the store to `device` (a new tensor: graphs kept for the old one are not replayed with it)."""
        self.tokens = self.tokens.to(device)
        return self

    def add(self, ids) -> None:
        """Append one document (a 1-D sequence of token ids) or several (a list of them / a 2-D tensor,
        one per row; -1 entries in a row end it: padding)."""
        if isinstance(ids, Tensor) and ids.dim() == 1 or (isinstance(ids, (list, tuple)) and ids
                                                          and isinstance(ids[0], int)):
            ids = [ids]
        pieces = []
        for document in ids:
            document = torch.as_tensor(document, dtype=torch.int64).flatten().to(self.device)
            if document.numel() and int(document.min()) < -1:
                check.fail(OP, "token ids must be >= 0 (-1 ends a padded row)")
            stop = (document < 0).nonzero()
            if stop.numel():
                document = document[:int(stop[0])]
            if document.numel():
                pieces.append(torch.cat([document[-(self.max_tokens - 1):], document.new_full((1,), -1)]))
        if not pieces:
            return
        new = torch.cat(pieces)[-self.max_tokens:]
        self._append(new)
        self.documents += len(pieces)

    def _append(self, new: Tensor) -> None:
        """Shift the store left by len(new) and write `new` at its end, in place (the last slot stays -1)."""
        n, store = new.numel(), self.tokens[:-1]
        store.copy_(torch.cat([store[n:], new]))
        self.used = min(self.used + n, self.max_tokens)

    def clear(self) -> None:
        self.tokens.fill_(-1)
        self.used = self.documents = 0

    def contents(self) -> list[list[int]]:
        """The stored documents, oldest first (the oldest may be cut at its start by eviction)."""
        flat = self.tokens[self.max_tokens - self.used:-1].tolist()
        out, current = [], []
        for token in flat:
            if token < 0:
                if current:
                    out.append(current)
                current = []
            else:
                current.append(token)
        return out
