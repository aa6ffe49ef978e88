"""Reference speculative sampling of chain drafts (Leviathan et al., Algorithm 1): the executable
specification of `ops.rejection_sample` and `ops.rejection_sample_logits` (reference/_chain.py: outputs)."""

import torch

from ..common import draws
from ..common.sampling import as_int64, sample_with_fallback, to_weights
from ._chain import draft_mask, emit, on_logits, row_at


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None, draft_passes=None):
    """Leviathan et al. Algorithm 1 (speculative sampling), see ops.rejection_sample.

    Randomness: uniforms [B, g+1] (coins for drafts 0..g-1, then the final draw), or the
    counter-based draws (seed, offsets[b] + position, row key) of `rng`. draft_passes: None, or
    bool [B, g] that receives every existing draft's own test (the `accept` below).
    """
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)
    batch, g = draft_tokens.shape
    device = draft_tokens.device
    exists = draft_mask(draft_tokens, num_draft_tokens)
    coins = draws.ChainCoins(uniforms, seed, offsets, batch, g, device)
    # u * q < p  <=>  u < p / q without dividing; q == 0 < p accepts (the limit of min(1, p/q))
    accept = draws.draft_passes(target_probs, draft_probs, draft_tokens, coins.accept) & exists
    if draft_passes is not None:
        draft_passes.copy_(accept)

    def final_token(num_accepted):
        u = coins.final(num_accepted)
        p_row = row_at(target_probs, num_accepted).float()
        rejected = (num_accepted < exists.sum(dim=1)).unsqueeze(1)
        if g > 0:
            q_row = row_at(draft_probs, num_accepted.clamp(max=g - 1)).float()
            residual = torch.where(rejected, p_row - q_row, p_row)  # bonus row: plain p
        else:
            residual = p_row
        return sample_with_fallback(to_weights(residual), to_weights(p_row), u)

    return emit(accept, draft_tokens, final_token)


def rejection_sample_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                            offsets=None, num_draft_tokens=None):
    """rejection_sample on softmax(logits / temperature) computed in float32.

    temperature: a float, or a float32 tensor [B] of per-row temperatures.
    """
    return on_logits(rejection_sample, target_logits, draft_logits, draft_tokens, temperature, uniforms=uniforms, seed=seed,
                     offsets=offsets, num_draft_tokens=num_draft_tokens)
