"""The random draws of a chain call, keyed as every backend keys them (see common/rng.py), and each
draft's own acceptance test: shared by the reference ops, the selftest's checks and FlashInfer's legacy
adapter (which needs the first rejection before the call, to lay out its uniforms)."""

import torch

from . import rng
from .sampling import gather_token_values


def seed_and_row_key(seed, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """An int seed keys rows by batch index; a tensor holds one seed per request (row key 0)."""
    if isinstance(seed, torch.Tensor):
        return seed.to(device=device, dtype=torch.int64).reshape(batch), torch.zeros(batch, dtype=torch.int64, device=device)
    seeds = torch.full((batch,), int(seed), dtype=torch.int64, device=device)
    return seeds, torch.arange(batch, dtype=torch.int64, device=device)


class ChainCoins:
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


def draft_passes(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 coins: torch.Tensor) -> torch.Tensor:
    """bool [B, g]: each draft's own test u_i * q_i(x_i) < p_i(x_i) (float32 probabilities, float64
    product, no division: q = 0 < p passes, p = 0 and NaN never do); ids outside [0, V) never pass.
    rejection_sample accepts the prefix of these; a position after the first failure is still tested."""
    g = draft_tokens.shape[1]
    tokens = draft_tokens.to(torch.int64)
    p, in_range = gather_token_values(target_probs[:, :g], tokens)
    q, _ = gather_token_values(draft_probs, tokens)
    return (coins.to(torch.float64) * q.double() < p.double()) & in_range
