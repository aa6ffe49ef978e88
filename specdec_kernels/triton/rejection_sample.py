"""Triton backend of `rejection_sample` (chain drafts, speculative sampling).

One launch, grid (B,): one program per row, no host sync and no data-dependent allocation.
Each program
1. gathers p = target_probs[b, i, x_i] and q = draft_probs[b, i, x_i] for the g drafts
   (2g scalars; ids outside [0, V) read nothing and are rejected), draws the coins
   (caller uniforms, or Philox(seed, offsets[b] + i, row key, SALT_ACCEPT)) and accepts
   draft i while u_i * q < p in float64, giving num_accepted;
2. streams the single row the final token comes from: the residual max(0, p - q) at the
   first rejection, or the bonus row p[n_b]. Pass 1 sums the fixed-point weights of the
   residual and of p (the fallback) in BLOCK_V tiles; pass 2 counts the tokens whose
   running int64 cdf (`tl.cumsum`) is <= floor(u * total), which is the drawn id. An empty
   residual draws from p with the same u, and a row with no mass at all gives 0 (the
   argmax of all-zero weights). q is only read for a rejected row.

Everything is integer or exactly rounded, so the result equals
`specdec_kernels.reference.rejection_sample` bit for bit on every dtype.

One program per row is the first version: for small B it leaves most SMs idle on large V.
Splitting the residual row over programs (partial totals, then a second launch or a
cross-program handshake for the search) is a later step.
"""

import torch
import triton
import triton.language as tl

from ..ops._backend import register
from ._launch import chain_outputs, device_scope, randomness_mode
from ._fixed_point import count_at_or_below, draw_threshold, to_weights
from ._philox import INT_SEED, ROW_SEEDS, SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform

BLOCK_V = 1024  # vocabulary elements per tile (power of two)



@triton.jit(do_not_specialize=["seed"])
def _rejection_sample_kernel(
        target_ptr, draft_probs_ptr, draft_tok_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, counts_ptr,
        out_ptr, num_acc_ptr, seed, g, vocab,
        stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_ub, stride_up,
        stride_s, stride_o, stride_c, stride_ob,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_COUNTS: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if HAS_COUNTS:
        n = tl.load(counts_ptr + b * stride_c)
        n = tl.minimum(tl.maximum(n, 0), g)
    else:
        n = tl.full((), 0, tl.int64) + g

    # ---- acceptance coins over the draft slots j < g (BLOCK_G >= g + 1 lanes)
    j = tl.arange(0, BLOCK_G).to(tl.int64)
    slot = j < g
    tok = tl.load(draft_tok_ptr + b * stride_db + j * stride_dg, mask=slot, other=-1)
    in_range = (tok >= 0) & (tok < vocab)
    safe = tl.where(in_range, tok, 0)  # never address outside the row
    p_tok = tl.load(target_ptr + b * stride_tb + j * stride_tp + safe, mask=slot & in_range, other=0.0)
    q_tok = tl.load(draft_probs_ptr + b * stride_qb + j * stride_qp + safe, mask=slot & in_range, other=0.0)
    p_tok = p_tok.to(tl.float32).to(tl.float64)
    q_tok = q_tok.to(tl.float32).to(tl.float64)

    if RANDOM == UNIFORMS:
        coins = tl.load(uniforms_ptr + b * stride_ub + j * stride_up, mask=slot, other=1.0).to(tl.float64)
        seed_b = tl.full((), 0, tl.int64)  # unused
        row_key = tl.full((), 0, tl.int64)
        offset = tl.full((), 0, tl.int64)
    else:
        if RANDOM == INT_SEED:
            seed_b = tl.full((), 0, tl.int64) + seed.to(tl.int64)
            row_key = b  # an int seed keys rows by batch index
        else:
            seed_b = tl.load(seeds_ptr + b * stride_s).to(tl.int64)
            row_key = tl.full((), 0, tl.int64)  # per-request seeds: row key 0
        if HAS_OFFSETS:
            offset = tl.load(offsets_ptr + b * stride_o).to(tl.int64)
        else:
            offset = tl.full((), 0, tl.int64)
        coins = philox_uniform(seed_b, offset + j, row_key, SALT_ACCEPT, 0)

    # u * q < p without dividing: q == 0 < p accepts, p == 0 and NaN never do
    accept = (coins * q_tok < p_tok) & in_range & slot & (j < n)
    num_acc = tl.min(tl.where(accept, g, j), axis=0).to(tl.int64)  # first rejected slot, or g

    # ---- the final draw from one row
    if RANDOM == UNIFORMS:
        u = tl.load(uniforms_ptr + b * stride_ub + g * stride_up).to(tl.float64)
    else:
        u = philox_uniform(seed_b, offset + num_acc, row_key, SALT_FINAL, 0)  # keyed by the drawn position
    rejected = num_acc < n  # residual at the first rejection; otherwise the bonus row (plain p)
    p_row = target_ptr + b * stride_tb + num_acc * stride_tp
    q_row = draft_probs_ptr + b * stride_qb + tl.maximum(tl.minimum(num_acc, g - 1), 0) * stride_qp
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    # q is read only on a rejected row; the limit is a vector compare rather than `mask & flag`
    # (some Triton interpreter versions reject a block mask combined with a scalar flag)
    q_limit = tl.where(rejected, vocab, 0)

    total_r = tl.full((), 0, tl.int64)  # residual weights (plain p on a bonus row)
    total_p = tl.full((), 0, tl.int64)  # fallback: p's weights
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        m = offs < vocab
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
        q = tl.load(q_row + offs, mask=offs < q_limit, other=0.0).to(tl.float32)  # q = 0: p - 0 == p
        total_r += tl.sum(to_weights(p - q), axis=0)
        total_p += tl.sum(to_weights(p), axis=0)

    use_r = total_r > 0
    total = tl.where(use_r, total_r, total_p)
    q_limit = tl.where(use_r, q_limit, 0)  # an empty residual draws from p alone
    threshold = draw_threshold(u, total)
    count = tl.full((), 0, tl.int64)
    carry = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        m = offs < vocab
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
        q = tl.load(q_row + offs, mask=offs < q_limit, other=0.0).to(tl.float32)
        w = to_weights(p - q)  # the residual, or p's weights when q was not read
        count += count_at_or_below(w, carry, threshold, m)
        carry += tl.sum(w, axis=0)
    # threshold < total, so count < V whenever total > 0; the clamp only guards the id range.
    # No mass at all: argmax of all-zero weights, i.e. 0.
    token = tl.where(total > 0, tl.minimum(count, vocab - 1), 0)

    # ---- outputs: accepted drafts, then the final token, then -1
    out = tl.where(j < num_acc, tok, tl.where(j == num_acc, token, -1))
    tl.store(out_ptr + b * stride_ob + j, out, mask=j < g + 1)
    tl.store(num_acc_ptr + b, num_acc)


def _launch(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, block_v: int = BLOCK_V):
    batch, g = draft_tokens.shape
    vocab = target_probs.shape[-1]
    device = draft_tokens.device
    out_tokens, num_accepted = chain_outputs(draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    block_v = min(block_v, max(16, triton.next_power_of_2(vocab)))
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    if g == 0:
        draft_probs = target_probs  # [B, 0, V] has nothing to read; keep a valid pointer
    uniforms_t = placeholder if uniforms is None else uniforms
    seeds_t = placeholder if seeds is None else seeds
    offsets_t = placeholder if offsets is None else offsets
    counts_t = placeholder if num_draft_tokens is None else num_draft_tokens
    with device_scope(device):
        _rejection_sample_kernel[(batch,)](
            target_probs, draft_probs, draft_tokens, uniforms_t, seeds_t, offsets_t, counts_t,
            out_tokens, num_accepted, seed_int, g, vocab,
            target_probs.stride(0), target_probs.stride(1), draft_probs.stride(0), draft_probs.stride(1),
            draft_tokens.stride(0), draft_tokens.stride(1),
            uniforms_t.stride(0) if uniforms is not None else 0, uniforms_t.stride(1) if uniforms is not None else 0,
            seeds_t.stride(0) if seeds is not None else 0, offsets_t.stride(0) if offsets is not None else 0,
            counts_t.stride(0) if num_draft_tokens is not None else 0, out_tokens.stride(0),
            RANDOM=mode, HAS_OFFSETS=offsets is not None and mode != UNIFORMS.value,
            HAS_COUNTS=num_draft_tokens is not None, BLOCK_G=triton.next_power_of_2(g + 1), BLOCK_V=block_v)
    return out_tokens, num_accepted


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None):
    """Triton `rejection_sample` on validated inputs (see specdec_kernels.ops.rejection_sample)."""
    return _launch(target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed, offsets=offsets,
                   num_draft_tokens=num_draft_tokens)


register("rejection_sample", "triton", rejection_sample)
