"""Reference verification of chain drafts: the executable specification.

Every function returns (output_tokens [B, g+1] int64 padded with -1, num_accepted [B]
int64); a row emits num_accepted + 1 tokens: its accepted drafts, then the correction at
the first rejection or, when every draft passed, the bonus token.

`num_draft_tokens [B]` (optional) makes batches ragged: row b only has drafts
0..n_b-1, and its bonus comes from position n_b.
"""

import torch

from . import rng
from ._sampling import as_int64, gather_token_values, nan_to_neg_inf, safe_argmax, sample_with_fallback, to_weights


def draft_mask(draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor | None) -> torch.Tensor:
    """bool [B, g]: which draft slots exist in each row."""
    batch, g = draft_tokens.shape
    if num_draft_tokens is None:
        return torch.ones(batch, g, dtype=torch.bool, device=draft_tokens.device)
    positions = torch.arange(g, device=draft_tokens.device)
    return positions.unsqueeze(0) < num_draft_tokens.clamp(0, g).unsqueeze(1)


def emit(accept: torch.Tensor, draft_tokens: torch.Tensor, final_token_at) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn per-position accept flags [B, g] into the op outputs.

    final_token_at(num_accepted [B]) -> [B] gives the token emitted after the accepted drafts.
    """
    batch, g = draft_tokens.shape
    num_accepted = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)
    out = torch.full((batch, g + 1), -1, dtype=torch.int64, device=draft_tokens.device)
    positions = torch.arange(g + 1, device=draft_tokens.device).unsqueeze(0)
    padded_drafts = torch.cat([draft_tokens, out[:, :1]], dim=1)
    out = torch.where(positions < num_accepted.unsqueeze(1), padded_drafts, out)
    out.scatter_(1, num_accepted.unsqueeze(1), final_token_at(num_accepted).unsqueeze(1))
    return out, num_accepted


def row_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, n, V], index [B] -> x[b, index[b]] as [B, V]."""
    return x[torch.arange(x.shape[0], device=x.device), index]


def seed_and_row_key(seed, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """An int seed keys rows by batch index; a tensor holds one seed per request (row key 0)."""
    if isinstance(seed, torch.Tensor):
        return seed.to(device=device, dtype=torch.int64).reshape(batch), torch.zeros(batch, dtype=torch.int64, device=device)
    seeds = torch.full((batch,), int(seed), dtype=torch.int64, device=device)
    return seeds, torch.arange(batch, dtype=torch.int64, device=device)


class Coins:
    """A chain call's randomness: `accept` [B, g] float64, the coin of each draft position, and
    final(num_accepted) [B], the uniform of the token drawn after the accepted prefix; from caller
    uniforms [B, g+1] (coins for drafts 0..g-1, then the final draw), or the counter-based draws
    (seed, offsets[b] + position, row key) of `rng`, the final one keyed by the drawn token's position."""

    def __init__(self, uniforms, seed, offsets, batch: int, g: int, device):
        if uniforms is not None:
            self.accept, self.final_u = uniforms[:, :g].to(torch.float64), uniforms[:, g].to(torch.float64)
            return
        self.offsets = torch.zeros(batch, dtype=torch.int64, device=device) if offsets is None else offsets.to(torch.int64)
        self.seeds, self.row_key = seed_and_row_key(seed, batch, device)
        positions = self.offsets.unsqueeze(1) + torch.arange(g, device=device).unsqueeze(0)
        self.accept = rng.philox_uniform(self.seeds.unsqueeze(1), positions, self.row_key.unsqueeze(1), rng.SALT_ACCEPT)
        self.final_u = None

    def final(self, num_accepted: torch.Tensor) -> torch.Tensor:
        if self.final_u is not None:
            return self.final_u
        return rng.philox_uniform(self.seeds, self.offsets + num_accepted, self.row_key, rng.SALT_FINAL)


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None):
    """Leviathan et al. Algorithm 1 (speculative sampling), see ops.rejection_sample.

    Randomness: uniforms [B, g+1] (coins for drafts 0..g-1, then the final draw), or the
    counter-based draws (seed, offsets[b] + position, row key) of `rng`.
    """
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)
    batch, g = draft_tokens.shape
    device = draft_tokens.device
    exists = draft_mask(draft_tokens, num_draft_tokens)
    coins = Coins(uniforms, seed, offsets, batch, g, device)
    p_tok, in_range = gather_token_values(target_probs[:, :g], draft_tokens)
    q_tok, _ = gather_token_values(draft_probs, draft_tokens)
    # u * q < p  <=>  u < p / q without dividing; q == 0 < p accepts (the limit of min(1, p/q)),
    # p == 0 never accepts, NaN never accepts.
    accept = (coins.accept * q_tok.double() < p_tok.double()) & in_range & exists

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


def tempered_softmax(logits, temperature):
    """float32 softmax(logits / temperature) over the last dim of [B, n, V]; temperature a float or
    a float32 [B] of per-row temperatures (the logits ops' definition of p and q)."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.float().view(-1, 1, 1)
    return torch.softmax(logits.float() / temperature, dim=-1)


def rejection_sample_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                            offsets=None, num_draft_tokens=None):
    """rejection_sample on softmax(logits / temperature) computed in float32.

    temperature: a float, or a float32 tensor [B] of per-row temperatures.
    """
    target_probs, draft_probs = tempered_softmax(target_logits, temperature), tempered_softmax(draft_logits, temperature)
    return rejection_sample(target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed, offsets=offsets,
                            num_draft_tokens=num_draft_tokens)
