"""Reference verification of chain drafts on the target's logits: greedy, SpecDec's relaxed rule, BiLD's
rollback and fallback (and max_prob). The executable specification (reference/_chain.py: outputs)."""

import torch

from ..common.sampling import as_int64, gather_token_values, nan_to_neg_inf, safe_argmax
from ._chain import draft_mask, emit


def greedy_verify(target_logits, draft_tokens, *, num_draft_tokens=None):
    """Accept while the draft equals the target argmax; emit the argmax at the first mismatch."""
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)
    top1 = safe_argmax(target_logits)  # [B, g+1]
    g = draft_tokens.shape[1]
    accept = (draft_tokens == top1[:, :g]) & draft_mask(draft_tokens, num_draft_tokens)
    return emit(accept, draft_tokens, lambda n: top1.gather(1, n.unsqueeze(1)).squeeze(1))


def relaxed_verify(target_logits, draft_tokens, *, top_beta: int, tau: float, num_draft_tokens=None):
    """SpecDec Eq. 8 and 9 with argmax tie-breaking (so beta=1 or tau=0 equals greedy_verify)."""
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)
    logits = nan_to_neg_inf(target_logits)
    g = draft_tokens.shape[1]
    top1 = torch.argmax(logits, dim=-1)
    body = logits[:, :g]
    draft_logit, in_range = gather_token_values(body, draft_tokens)
    vocab_ids = torch.arange(logits.shape[-1], device=logits.device)
    # rank of the draft in (logit desc, index asc) order: the number of tokens ahead of it
    ahead = (body > draft_logit.unsqueeze(-1)) | ((body == draft_logit.unsqueeze(-1)) & (vocab_ids < draft_tokens.unsqueeze(-1)))
    in_top_beta = ahead.sum(dim=-1) < top_beta
    is_top1 = draft_tokens == top1[:, :g]
    within_tau = (body.amax(dim=-1) - draft_logit) < tau
    accept = in_range & in_top_beta & (is_top1 | within_tau) & draft_mask(draft_tokens, num_draft_tokens)
    return emit(accept, draft_tokens, lambda n: top1.gather(1, n.unsqueeze(1)).squeeze(1))


def bild_verify(target_logits, draft_tokens, *, rollback_threshold: float, num_draft_tokens=None):
    """BiLD rollback: reject the first draft with -log p_target(draft) > threshold."""
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)
    logits = nan_to_neg_inf(target_logits)
    g = draft_tokens.shape[1]
    top1 = torch.argmax(logits, dim=-1)
    lse = torch.logsumexp(logits[:, :g], dim=-1)
    draft_logit, in_range = gather_token_values(logits[:, :g], draft_tokens)
    nll = lse - draft_logit
    accept = in_range & (nll <= rollback_threshold) & draft_mask(draft_tokens, num_draft_tokens)
    return emit(accept, draft_tokens, lambda n: top1.gather(1, n.unsqueeze(1)).squeeze(1))


def max_prob(logits):
    """Largest softmax probability along the last dim, float32 (0 for a row with no finite logit)."""
    x = nan_to_neg_inf(logits)
    top = x.amax(dim=-1)
    prob = torch.exp(top - torch.logsumexp(x, dim=-1))
    prob = torch.where(top == float("inf"), torch.ones_like(prob), prob)
    return torch.where(top == float("-inf"), torch.zeros_like(prob), prob)


def fallback_check(draft_logits, threshold: float):
    """BiLD fallback: True where the draft model's max softmax probability < threshold."""
    return max_prob(draft_logits) < threshold
