"""Where a row's text repeats its own end: the suffix scan behind strategy `lookup` (lookup.py), and the
chain draft it gives.

`scan` answers, for every position of a row's [B, W] text buffer, how many of the text's last
max_ngram tokens the text ending there repeats: what a suffix tree would answer, from max_ngram
vectorised comparisons. Static shapes, no host sync (a CUDA graph captures it); O(B * W * max_ngram)
element operations per step, microseconds on a GPU for W in the tens of thousands.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

NO_TOKEN = -2  # a suffix token the row does not have (its text is shorter than max_ngram): matches nothing


@dataclass
class Scan:
    """agree [B, W] int64: at each position t that has a continuation inside the text (t <= end - 2),
    the number of the text's last tokens that the text ending at t repeats (min_ngram..max_ngram), else 0.
    best [B] int64: the longest match n over the row (0 when no position agrees on min_ngram tokens)."""

    agree: Tensor
    best: Tensor


def scan(text: Tensor, end: Tensor, start: int, max_ngram: int, min_ngram: int) -> Scan:
    """The suffix scan of every row.

    Args:
        text: [B, W] int64 token ids, -1 where nothing matches.
        end: [B] int64, each row's text ends before end[b] (its last token, the root, at end[b] - 1).
        start: where every row's own text begins in the buffer (the width of a LookupCache in front of
            it): the current suffix is read from the row's own text only.
        max_ngram, min_ngram: the longest suffix compared, and the shortest match that counts.
    """
    batch, width = text.shape
    agree = torch.zeros(batch, width, dtype=torch.int64, device=text.device)
    run = torch.ones(batch, width, dtype=torch.bool, device=text.device)
    for k in range(max_ngram):
        where = end - 1 - k  # the suffix's k-th token from the end
        token = text.gather(1, where.clamp(min=0).unsqueeze(1)).squeeze(1)
        token = torch.where((where >= start) & (token >= 0), token, NO_TOKEN)
        earlier = text if k == 0 else torch.cat([text.new_full((batch, k), -1), text[:, :width - k]], dim=1)
        run = run & (earlier == token.unsqueeze(1))  # earlier[t] = text[t - k]
        agree += run
    positions = torch.arange(width, device=text.device)
    agree = agree * (positions.unsqueeze(0) <= (end - 2).unsqueeze(1))  # a continuation token must follow
    agree = torch.where(agree >= min_ngram, agree, 0)
    return Scan(agree, agree.amax(dim=1))


def continuation(text: Tensor, end: Tensor, after: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """The tokens after positions `after` [...] (leading dims of B), `length` deep: (tokens [..., length]
    int64, valid [..., length] bool: inside the text, before any -1, and after a valid token)."""
    width = text.shape[1]
    source = after.unsqueeze(-1) + 1 + torch.arange(length, device=text.device)
    flat = source.reshape(text.shape[0], -1).clamp(min=0, max=max(width - 1, 0))
    tokens = text.gather(1, flat).reshape(source.shape)
    inside = source < end.view(-1, *([1] * (source.dim() - 1)))
    valid = torch.cumprod((inside & (tokens >= 0) & (after >= 0).unsqueeze(-1)).to(torch.int8), dim=-1).bool()
    return torch.where(valid, tokens, 0), valid


def chain(text: Tensor, end: Tensor, found: Scan, length: int, limit: Tensor, *, recent: bool) -> tuple[Tensor, Tensor]:
    """The chain draft of every row: (tokens [B, length] int64, 0 past each row's count; count [B] int64).

    The continuation of the earliest position where the longest match occurs (`recent=False`: HF's
    prompt lookup, which takes the first match left to right) or of the latest (`recent=True`), cut at
    the end of the text, at a separator and at `limit` [B] (the row's remaining budget less the token
    the target adds); 0 tokens for a row without a match.
    """
    width = text.shape[1]
    positions = torch.arange(width, device=text.device).unsqueeze(0)
    hit = (found.agree >= found.best.unsqueeze(1)) & (found.best > 0).unsqueeze(1)
    if recent:
        at = torch.where(hit, positions, -1).amax(dim=1)
    else:
        at = torch.where(hit, positions, width).amin(dim=1)
        at = torch.where(at < width, at, -1)
    tokens, valid = continuation(text, end, at, length)
    count = torch.minimum(valid.sum(dim=1), limit.clamp(min=0))
    tokens = torch.where(torch.arange(length, device=text.device) < count.unsqueeze(1), tokens, 0)
    return tokens, count
