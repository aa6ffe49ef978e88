"""What the reference chain ops share (rejection_sampling, logit_verify, block_verification).

Every chain op returns (output_tokens [B, g+1] int64 padded with -1, num_accepted [B] int64); a row emits
num_accepted + 1 tokens: its accepted drafts, then the correction at the first rejection or, when every
draft passed, the bonus token. `num_draft_tokens [B]` (optional) makes batches ragged: row b only has
drafts 0..n_b-1, and its bonus comes from position n_b.
"""

import torch


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


def tempered_softmax(logits, temperature):
    """float32 softmax(logits / temperature) over the last dim of [B, n, V]; temperature a float or
    a float32 [B] of per-row temperatures (the logits ops' definition of p and q)."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.float().view(-1, 1, 1)
    return torch.softmax(logits.float() / temperature, dim=-1)


def on_logits(verify, target_logits, draft_logits, draft_tokens, temperature, **options):
    """A probabilities op (rejection_sample, block_verify) on softmax(logits / temperature) in float32: the
    logits ops' definition of p and q."""
    return verify(tempered_softmax(target_logits, temperature), tempered_softmax(draft_logits, temperature),
                  draft_tokens, **options)
