"""Reference block verification of chain drafts: the executable specification.

Sun et al., "Block Verification Accelerates Speculative Decoding" (ICLR 2025, arXiv
2403.10444), Algorithm 2. Same drafts, same target law as token-wise speculative sampling
(`rejection_sampling.rejection_sample`), and at least as many accepted drafts in expectation.

Paper notation (1-based) -> tensors (0-based): X_i = draft_tokens[:, i-1], Mb(. | c, X^j) =
target_probs[:, j] (j = g is the bonus row), Ms(. | c, X^j) = draft_probs[:, j]. Every backend must
reproduce this arithmetic bit for bit: float64 ratios rounded to float32, int64 fixed-point weights
(so no summation order matters), float64 thresholds.
"""

import torch

from ..common.sampling import WEIGHT_SCALE, as_int64, gather_token_values, sample_with_fallback, to_weights
from ..common.draws import ChainCoins
from ._chain import draft_mask, emit, on_logits, row_at

# ---------------------------------------------------------------- the algorithm's pieces

def prefix_ratios(target_probs, draft_probs, draft_tokens, valid) -> torch.Tensor:
    """float32 [B, g+1]: p_0 = 1, p_i = min(1, p_{i-1} p(X_i) / q(X_i)) (0 where X_i is not a
    valid, existing draft). `valid` is bool [B, g]."""
    g = draft_tokens.shape[1]
    p_tok, in_range = gather_token_values(target_probs[:, :g], draft_tokens)
    q_tok, _ = gather_token_values(draft_probs, draft_tokens)
    valid = valid & in_range
    ratios = [torch.ones(draft_tokens.shape[0], dtype=torch.float32, device=draft_tokens.device)]
    for i in range(g):  # a sequential scan over g, vectorised over B (min() breaks a cumprod)
        ratio = ratios[-1].double() * p_tok[:, i].double() / q_tok[:, i].double()
        ratio = torch.nan_to_num(ratio, nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
        ratios.append(torch.where(valid[:, i], ratio, torch.zeros_like(ratio)).float())
    return torch.stack(ratios, dim=1)


def residual_weights(scale: torch.Tensor, target_rows: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """int64 [..., V]: floor(clamp(scale * target - draft, 0, 1) * 2^40), computed in float64.

    scale [...] float32 (p_j), target_rows / draft_rows [..., V] (any float dtype).
    """
    # the product of two float32 values is exact in float64, so a kernel's FMA gives the same bits
    r = scale.double().unsqueeze(-1) * target_rows.float().double() - draft_rows.float().double()
    r = torch.nan_to_num(r, nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    return torch.floor(r * WEIGHT_SCALE).to(torch.int64)


def residual_masses(p_cum, target_probs, draft_probs) -> torch.Tensor:
    """float64 [B, g]: Z(j) = sum_x max(p_j p(x | X^j) - q(x | X^j), 0) for j = 0..g-1, as
    the exact int64 sum of the fixed-point weights times 2^-40."""
    g = draft_probs.shape[1]
    weights = residual_weights(p_cum[:, :g], target_probs[:, :g], draft_probs)
    return weights.sum(dim=-1).double() / WEIGHT_SCALE


def acceptance_thresholds(p_cum, masses, num_drafts) -> torch.Tensor:
    """float64 [B, g]: column i-1 holds h_i (i = 1..g) of Algorithm 2.

    h_i = Z(i) / (Z(i) + 1 - p_i) for i < n_b (a zero denominator gives 1), h_{n_b} = p_{n_b},
    and 0 past the row's last draft n_b.
    """
    batch, g = masses.shape
    index = torch.arange(1, g + 1, device=masses.device).unsqueeze(0)
    p_i = p_cum[:, 1:].double()
    z_next = torch.cat([masses[:, 1:], masses.new_zeros(batch, 1)], dim=1)  # Z(i) for i = 1..g (Z(g) unused)
    denom = z_next + (1.0 - p_i)
    inner = torch.where(denom > 0, z_next / denom, torch.ones_like(denom))
    n = num_drafts.unsqueeze(1)
    return torch.where(index < n, inner, torch.where(index == n, p_i, torch.zeros_like(p_i)))


# ---------------------------------------------------------------- the op

def block_verify(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                 num_draft_tokens=None):
    """Block verification (Sun et al. 2025, Algorithm 2): lossless, >= token-wise acceptance.
    Takes validated inputs (the checks live in ops.block_verify).

    Args:
        target_probs: [B, g+1, V] float32/float16/bfloat16: the target's distributions at the
            g draft positions and the bonus position (after the sampling filters).
        draft_probs: [B, g, V], same dtype: the distributions the drafts were sampled from
            (one-hot rows for deterministic drafts).
        draft_tokens: [B, g] int64/int32, ids in [0, V) (-1 padding, never accepted).
        uniforms: [B, g+1] float32/float64 in [0, 1): eta_1..eta_g in columns 0..g-1, the
            draw of the final token in column g (whatever the row's num_draft_tokens).
        seed: int (rows keyed by batch index) or int64/int32 [B] (one seed per request),
            instead of `uniforms`; offsets: [B] int64/int32 each row's draw cursor (rng.py's rule).
        num_draft_tokens: [B] int64/int32 in [0, g]: ragged rows.

    Returns:
        output_tokens [B, g+1] int64 (X_1..X_tau, Y, then -1 padding), num_accepted [B] int64
        (= tau).
    """
    draft_tokens, num_draft_tokens = as_int64(draft_tokens), as_int64(num_draft_tokens)
    batch, g = draft_tokens.shape
    device = draft_tokens.device
    exists = draft_mask(draft_tokens, num_draft_tokens)
    num_drafts = exists.sum(dim=1)
    coins = ChainCoins(uniforms, seed, offsets, batch, g, device)  # eta_i is coins.accept[:, i - 1]

    p_cum = prefix_ratios(target_probs, draft_probs, draft_tokens, exists)
    h = acceptance_thresholds(p_cum, residual_masses(p_cum, target_probs, draft_probs), num_drafts)
    # strict: h = 0 never passes, h = 1 always does; p_i > 0 also holds a coin outside [0, 1) (no backend
    # can inspect caller uniforms on a GPU) from keeping a slot past n_b, an invalid draft or a p = 0 prefix
    passed = (coins.accept < h) & (p_cum[:, 1:] > 0)
    index = torch.arange(1, g + 1, device=device).unsqueeze(0)
    # the LARGEST passing i: a later position can keep a longer prefix after an earlier coin failed
    tau = (passed.to(torch.int64) * index).amax(dim=1) if g else torch.zeros(batch, dtype=torch.int64, device=device)
    accept = index <= tau.unsqueeze(1)  # the prefix X_1..X_tau

    def final_token(num_accepted):
        u = coins.final(num_accepted)
        p_row = row_at(target_probs, num_accepted)
        plain = to_weights(p_row)
        if g == 0:
            return sample_with_fallback(plain, plain, u)
        q_row = row_at(draft_probs, num_accepted.clamp(max=g - 1))
        scale = p_cum.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
        residual = residual_weights(scale, p_row, q_row)
        bonus = (num_accepted == num_drafts).unsqueeze(1)
        return sample_with_fallback(torch.where(bonus, plain, residual), plain, u)

    return emit(accept, draft_tokens, final_token)


def block_verify_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                        offsets=None, num_draft_tokens=None):
    """block_verify on softmax(logits / temperature) computed in float32 (as rejection_sample_logits).

    temperature: a float, or a float32 tensor [B] of per-row temperatures.
    """
    return on_logits(block_verify, target_logits, draft_logits, draft_tokens, temperature, uniforms=uniforms, seed=seed,
                     offsets=offsets, num_draft_tokens=num_draft_tokens)
