"""One standardisation for target and draft (Leviathan et al. section 2.2): logits -> the distribution
actually sampled from, with temperature, then top-k, then top-p, then min-p, in that order (HF's
warper order).

Both models go through the SAME function with the same settings, so q is exactly the distribution
each draft token was drawn from and p is the distribution the output must follow. Everything is
float32, sync-free and shape-static (CUDA-graph capturable).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ..common import rng
from ..common.sampling import sample_with_fallback, to_weights

SALT_DRAFT = 2  # Philox purpose of a draft-model draw (the verify ops use rng.SALT_ACCEPT and SALT_FINAL)


@dataclass(frozen=True)
class Sampling:
    """do_sample=False (or temperature 0) is argmax decoding; otherwise temperature > 0, top_k >= 1
    or None, top_p in (0, 1] or None, min_p in [0, 1] or None."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self):
        if self.do_sample and self.temperature == 0:
            object.__setattr__(self, "do_sample", False)  # temperature 0 is argmax
        if self.temperature < 0:
            raise ValueError(f"generate: `temperature` must be >= 0 (got {self.temperature})")
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 1):
            raise ValueError(f"generate: `top_k` must be an int >= 1 or None (got {self.top_k})")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"generate: `top_p` must be in (0, 1] or None (got {self.top_p})")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ValueError(f"generate: `min_p` must be in [0, 1] or None (got {self.min_p})")


def unused_sampling_settings(do_sample: bool, **settings) -> list[str]:
    """The sampling settings given away from their defaults (temperature 1.0, the rest None) in a greedy
    call, where they change nothing: HF's GenerationConfig warns about the same."""
    if do_sample:
        return []
    defaults = {"temperature": 1.0}
    return [name for name, value in settings.items() if value is not None and value != defaults.get(name)]


def standardize(logits: Tensor, sampling: Sampling) -> Tensor:
    """float32 probabilities [..., V] of logits [..., V] after temperature, top-k, top-p and min-p.

    top-k keeps every token tied with the k-th logit, top-p removes the low tail whose
    cumulative probability is <= 1 - top_p (at least one token stays) and min-p the tokens
    whose probability is below min_p times the largest, as HF's warpers do.
    """
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1)  # ascending
        tail = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - sampling.top_p
        tail[..., -1] = False
        scores = scores.masked_fill(tail.scatter(-1, order, tail), float("-inf"))
    if sampling.min_p is not None and sampling.min_p > 0:
        probs = scores.softmax(dim=-1)
        low = probs < sampling.min_p * probs.amax(dim=-1, keepdim=True)  # the top token always stays
        scores = scores.masked_fill(low, float("-inf"))
    return scores.softmax(dim=-1)


def draw(probs: Tensor, seeds: Tensor, counters: Tensor, salt: int = SALT_DRAFT) -> Tensor:
    """One token per row from probs [B, V]: an inverse-CDF draw with the uniform
    Philox(seeds[b], counters[b], 0, salt) (rng's counter layout, per-request seeds; counters come
    from the engine's draw cursor), so a row's draws do not depend on the batch around it and a
    CUDA graph can replay them."""
    u = rng.philox_uniform(seeds, counters, torch.zeros_like(counters), salt)
    weights = to_weights(probs)
    return sample_with_fallback(weights, weights, u)


def draft_token(logits: Tensor, sampling: Sampling, seeds: Tensor, counters: Tensor) -> tuple[Tensor, Tensor | None]:
    """A drafter's token from its logits [B, V]: the argmax (greedy), or a draw from the standardised q at the
    Philox counters [B], with q (the accept rule needs exactly the q the token came from)."""
    if not sampling.do_sample:
        return torch.argmax(logits, dim=-1), None
    q = standardize(logits, sampling)
    return draw(q, seeds, counters), q


def fit_vocab(logits: Tensor, vocab: int) -> Tensor:
    """Draft logits [..., V_draft] on the target's vocabulary [..., vocab]: an LM head padded past
    the tokenizer is truncated, a smaller one padded with -inf (zero draft probability; a draft
    never proposes those ids, which stays exact: q may be any distribution)."""
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - width), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
