"""Triton backend of `block_verify` (Sun et al., Algorithm 2; the block kernel of the logits op too).

One launch, grid (B * (g + 1), num_splits): program (row, split) owns one V-chunk of one
position `pos` of batch row b (row = b * (g + 1) + pos). Positions past the row's n_b drafts
exit at once and take no ticket. No host sync, no data-dependent allocation, no [B, V] scratch.

Every live program redoes the row's cheap prefix scan (2 n_b gathered scalars), sums its chunk's
int64 residual and plain weights, and takes a ticket; the last program (`_finish`) forms Z, h and tau
and draws the final token from the chunk totals with a one-chunk rescan. Integer sums and exactly
rounded float64 arithmetic make the output equal `reference.block_verify` bit for bit for every
dtype and split.
"""

import functools

import triton
import triton.language as tl

from ..common.registry import register
from ..common.workspace import zeroed_counters
from ._chain_launch import launch_on_probs, launch_split_v
from ._launch import grid_x_refusal
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._split_v_sampling import (chunk_weight_sums, draw_from_chunks, drafts_in_row, gather_drafts, pick,
                                position_stats, row_temperature)
from ._tickets import last_ticket, reset_ticket

INV_SCALE: tl.constexpr = tl.constexpr(9.094947017729282e-13)  # 2^-40, exact


@triton.jit
def _prefix_ratios(p_tok, q_tok, valid, k, g):
    """float32 (ratios, nexts): ratios[k] = p_k (p_0 = 1), nexts[k] = p_{k+1}; p_i = min(1,
    p_{i-1} p(X_i) / q(X_i)) in float64 (NaN -> 0, clamped, 0 for an invalid draft), rounded to
    float32 at each step like the reference. A sequential scan over g (min() breaks a cumprod)."""
    ratios = tl.where(k == 0, 1.0, 0.0).to(tl.float32)
    nexts = tl.zeros(k.shape, tl.float32)
    prev = tl.full((), 1.0, tl.float32)
    ok = valid.to(tl.int32)
    for i in range(g):  # lanes past n are invalid, so their ratios are 0 as in the reference
        # every lane's candidate ratio, then lane i's: dividing before the pick keeps a -0.0 q
        # (p / -0.0 = -inf -> 0, as in the reference); picks are inlined (cheaper to interpret)
        r = prev.to(tl.float64) * p_tok / q_tok  # exact product of two float32 values; IEEE division
        at = k == i  # lane i holds X_{i+1}
        r = tl.sum(tl.where(at, r, 0.0), axis=0)
        r = tl.where(r != r, 0.0, r)
        r = tl.minimum(tl.maximum(r, 0.0), 1.0)  # q == 0 < p: +inf -> 1
        r = tl.where(tl.sum(tl.where(at, ok, 0), axis=0) > 0, r, 0.0).to(tl.float32)
        ratios = tl.where(k == i + 1, r, ratios)
        nexts = tl.where(at, r, nexts)
        prev = r
    return ratios, nexts


@triton.jit
def _finish(target_ptr, draft_ptr, part_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, out_ptr, num_acc_ptr,
            b, n, k, tok, ratios, nexts, temp, t_max, t_sum, t_ok, q_max, q_sum, q_ok,
            seed, g, vocab, num_splits, tiles, stride_tb, stride_tp, stride_qb, stride_qp, stride_ub, stride_up,
            stride_s, stride_o, stride_ob, RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, LOGITS: tl.constexpr,
            BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr):
    """Batch row b once every chunk total of its positions 0..n is stored: tau, final draw, outputs."""
    s = tl.arange(0, BLOCK_S)
    # ---- thresholds: lane k holds h_{k+1}; Z(i) (i = 1..n-1) adds position i's chunk totals.
    # A loop over positions keeps one [BLOCK_S] vector live (BLOCK_S reaches 2048 at V = 2^24).
    z_int = tl.zeros(k.shape, tl.int64)
    for i in range(1, g):
        live = s < tl.where(i < n, num_splits, 0)  # a vector compare, not `mask & flag`
        # ".cg": other programs wrote these; skip this SM's possibly stale L1 (see _tickets)
        chunk_z = tl.load(part_ptr + ((b * (g + 1) + i) * num_splits + s) * 2, mask=live, other=0,
                          cache_modifier=".cg")
        z_int = tl.where(k + 1 == i, tl.sum(chunk_z, axis=0), z_int)
    z = z_int.to(tl.float64) * INV_SCALE  # exact: int64 -> float64 rounds like torch's .double()
    p_i = nexts.to(tl.float64)
    denom = z + (1.0 - p_i)
    inner = tl.where(denom > 0, z / tl.where(denom > 0, denom, 1.0), 1.0)  # Z = 0 and p_i = 1: always pass
    h = tl.where(k + 1 < n, inner, tl.where(k + 1 == n, p_i, 0.0))

    seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)
    if RANDOM == UNIFORMS:
        coins = tl.load(uniforms_ptr + b * stride_ub + k * stride_up, mask=k < n, other=1.0).to(tl.float64)
    else:
        coins = philox_uniform(seed_b, offset + k, row_key, SALT_ACCEPT, 0)  # eta_{k+1}: rejection_sample's
    # strict: h = 0 never passes, h = 1 always does. p_i > 0 (so i <= n and X_1..X_i valid) keeps
    # the op's contract for uniforms a GPU call cannot inspect: a negative coin never keeps -1
    # padding, an id outside [0, V), or a slot past n_b (the reference's `eta_i < h_i` alone would, at h = 0)
    passed = (coins < h) & (nexts > 0)
    tau = tl.max(tl.where(passed, k + 1, 0), axis=0).to(tl.int64)  # a later pass rescues earlier failures

    # ---- the final token from position tau's chunk totals (residual, or p on the bonus row)
    if RANDOM == UNIFORMS:
        u = tl.load(uniforms_ptr + b * stride_ub + g * stride_up).to(tl.float64)
    else:
        u = philox_uniform(seed_b, offset + tau, row_key, SALT_FINAL, 0)  # keyed by the drawn position
    q_pos = tl.maximum(tl.minimum(tau, g - 1), 0)  # read only when tau < n <= g
    p_nan = tl.where(pick(t_ok.to(tl.int32), k, tau) > 0, 0.0, float("nan"))
    q_nan = tl.where(pick(q_ok.to(tl.int32), k, q_pos) > 0, 0.0, float("nan"))
    p_row = target_ptr + b * stride_tb + tau * stride_tp
    q_row = draft_ptr + b * stride_qb + q_pos * stride_qp
    token = draw_from_chunks(part_ptr + (b * (g + 1) + tau) * num_splits * 2, num_splits, u, tau < n, p_row, q_row,
                             pick(ratios, k, tau).to(tl.float64), vocab, tiles, temp, pick(t_max, k, tau),
                             pick(t_sum, k, tau), p_nan, pick(q_max, k, q_pos), pick(q_sum, k, q_pos), q_nan, LOGITS,
                             True, BLOCK_S, BLOCK_V)

    # ---- outputs: X_1..X_tau, the final token, then -1
    out = tl.where(k < tau, tok, tl.where(k == tau, token, -1))
    tl.store(out_ptr + b * stride_ob + k, out, mask=k < g + 1)
    tl.store(num_acc_ptr + b, tau)


# Not specialised (tests/test_triton_recompiles.py): the seed and the ints that follow B or g
# (g, the row count B * (g + 1), the split plan over those rows, the strides g and g + 1 of the
# drafts, uniforms and outputs). g enters the key only through BLOCK_G; BLOCK_S is sized for
# V's largest split count (B = 1, g = 0).
@triton.jit(do_not_specialize=["seed", "g", "num_splits", "tiles", "target_rows", "stride_db", "stride_ub",
                               "stride_ob"])
def _block_verify_kernel(
        target_ptr, draft_ptr, draft_tok_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, counts_ptr, temps_ptr,
        stats_max_ptr, stats_sum_ptr, part_ptr, tickets_ptr, out_ptr, num_acc_ptr,
        temperature, seed, g, vocab, num_splits, tiles, stat_splits, target_rows,
        stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_ub, stride_up,
        stride_s, stride_o, stride_c, stride_temp, stride_ob,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_COUNTS: tl.constexpr, LOGITS: tl.constexpr,
        PER_ROW_TEMP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_SS: tl.constexpr,
        BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # b * (g + 1) + pos
    split = tl.program_id(1).to(tl.int64)
    b = row // (g + 1)
    pos = row % (g + 1)
    n = drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS)
    if pos <= n:  # positions past the row's bonus are never read and take no ticket
        temp = row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP)  # read with LOGITS only
        k = tl.arange(0, BLOCK_G).to(tl.int64)  # position lanes 0..g
        t_max, t_sum, t_ok, q_max, q_sum, q_ok = position_stats(stats_max_ptr, stats_sum_ptr, b, n, k, g,
                                                                stat_splits, target_rows, LOGITS, BLOCK_SS)
        tok, p_tok, q_tok, valid = gather_drafts(target_ptr, draft_ptr, draft_tok_ptr, b, n, k, vocab, temp, t_max,
                                                 t_sum, t_ok, q_max, q_sum, q_ok, stride_tb, stride_tp, stride_qb,
                                                 stride_qp, stride_db, stride_dg, LOGITS)
        ratios, nexts = _prefix_ratios(p_tok, q_tok, valid, k, g)

        # ---- this program's chunk of position pos: residual (pos < n) and plain p sums
        residual = pos < n  # the bonus position pos == n is plain p; its q is not read
        q_pos = tl.maximum(tl.minimum(pos, g - 1), 0)
        p_nan = tl.where(pick(t_ok.to(tl.int32), k, pos) > 0, 0.0, float("nan"))
        q_nan = tl.where(pick(q_ok.to(tl.int32), k, q_pos) > 0, 0.0, float("nan"))
        chunk = BLOCK_V * tiles
        sum_r, sum_p = chunk_weight_sums(target_ptr + b * stride_tb + pos * stride_tp,
                                         draft_ptr + b * stride_qb + q_pos * stride_qp, tl.where(residual, vocab, 0),
                                         pick(ratios, k, pos).to(tl.float64), split * chunk, vocab, tiles, temp,
                                         pick(t_max, k, pos), pick(t_sum, k, pos), p_nan, pick(q_max, k, q_pos),
                                         pick(q_sum, k, q_pos), q_nan, LOGITS, True, BLOCK_V)
        part = part_ptr + (row * num_splits + split) * 2
        tl.store(part, tl.where(residual, sum_r, sum_p))
        tl.store(part + 1, sum_p)
        if last_ticket(tickets_ptr + b, (n + 1) * num_splits):
            _finish(target_ptr, draft_ptr, part_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, out_ptr, num_acc_ptr,
                    b, n, k, tok, ratios, nexts, temp, t_max, t_sum, t_ok, q_max, q_sum, q_ok,
                    seed, g, vocab, num_splits, tiles, stride_tb, stride_tp, stride_qb, stride_qp, stride_ub,
                    stride_up, stride_s, stride_o, stride_ob, RANDOM, HAS_OFFSETS, LOGITS, BLOCK_S, BLOCK_V)
            reset_ticket(tickets_ptr + b)


def launch_block(target, draft, draft_tokens, out_tokens, num_accepted, **options) -> None:
    """Launch the block kernel (B >= 1): a program per position of every row, B * (g + 1), on
    grid x (see launch_split_v); the row's tickets count its positions' programs."""
    batch, g = draft_tokens.shape
    launch_split_v(_block_verify_kernel, batch * (g + 1), zeroed_counters(draft_tokens.device, batch), target, draft,
                   draft_tokens, out_tokens, num_accepted, **options)


# The planned launch; tests force split plans through its keywords (block_v, min_tiles, ...).
_launch = functools.partial(launch_on_probs, launch_block)


def block_verify(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                 num_draft_tokens=None):
    """Triton `block_verify` on validated inputs (see specdec_kernels.ops.block_verify)."""
    return _launch(target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed, offsets=offsets,
                   num_draft_tokens=num_draft_tokens)


def launch_limits(sizes: dict) -> str | None:
    """The registry's `limits`: grid x holds a program per position of every row, B * (g + 1)."""
    return grid_x_refusal(sizes["B"] * (sizes["G"] + 1), "B * (g + 1)")


register("block_verify", "triton", block_verify, limits=launch_limits)
