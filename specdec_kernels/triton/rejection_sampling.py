"""Triton backend of `rejection_sample` (chain drafts, speculative sampling), and the chain
kernel of `rejection_sample_logits` (LOGITS).

One launch, grid (B, num_splits): the final row is split over V so that a small batch still fills
the GPU. Each program redoes the row's cheap accept walk (2 n_b gathered scalars), so it knows the
final row without talking to the others, sums its chunk's fixed-point weights of the residual and
of p (the fallback) and takes a ticket; the row's last program draws floor(u * total) and rescans
the one chunk that holds it. Integer sums make the result equal `reference.rejection_sample` bit
for bit on every dtype and split. With LOGITS, p and q come from the logits and the per-chunk
softmax statistics of a first launch (rejection_sampling_logits.py).
"""

import functools

import triton
import triton.language as tl

from ..common.registry import register
from ..common.workspace import zeroed_counters
from ._chain_launch import launch_on_probs, launch_split_v
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._split_v_sampling import (chunk_weight_sums, draw_from_chunks, drafts_in_row, gather_drafts, pick,
                                position_stats, row_temperature)
from ._tickets import last_ticket, reset_ticket


# Not specialised (tests/test_triton_recompiles.py): the seed; the ints that follow the draft
# length g (g, the strides g and g + 1 of the drafts, uniforms and outputs) or, through the
# V-chunk plan, the batch size (num_splits, tiles, the target row count B * (g + 1) of the
# statistics): Triton would compile a variant for the value 1 and for multiples of 16 as rows
# finish or g adapts. The chunk length in tiles is a runtime loop bound for the same reason;
# g enters the key only through BLOCK_G, and BLOCK_S is sized for V's largest split count.
@triton.jit(do_not_specialize=["seed", "g", "num_splits", "tiles", "target_rows", "stride_db", "stride_ub",
                               "stride_ob"])
def _rejection_sample_kernel(
        target_ptr, draft_ptr, draft_tok_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, counts_ptr, temps_ptr,
        stats_max_ptr, stats_sum_ptr, part_ptr, tickets_ptr, out_ptr, num_acc_ptr,
        temperature, seed, g, vocab, num_splits, tiles, stat_splits, target_rows,
        stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_ub, stride_up,
        stride_s, stride_o, stride_c, stride_temp, stride_ob,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_COUNTS: tl.constexpr, LOGITS: tl.constexpr,
        PER_ROW_TEMP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr,
        BLOCK_SS: tl.constexpr, passes_ptr, STORE_PASSES: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1).to(tl.int64)
    n = drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS)
    temp = row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP)  # read with LOGITS only

    # ---- acceptance coins over the draft slots j < n (BLOCK_G >= g + 1 lanes); every
    # program of the row redoes this (2 n scalars and n coins) to learn the final row
    j = tl.arange(0, BLOCK_G).to(tl.int64)
    t_max, t_sum, t_ok, q_max, q_sum, q_ok = position_stats(stats_max_ptr, stats_sum_ptr, b, n, j, g, stat_splits,
                                                            target_rows, LOGITS, BLOCK_SS)
    tok, p_tok, q_tok, valid = gather_drafts(target_ptr, draft_ptr, draft_tok_ptr, b, n, j, vocab, temp, t_max, t_sum,
                                             t_ok, q_max, q_sum, q_ok, stride_tb, stride_tp, stride_qb, stride_qp,
                                             stride_db, stride_dg, LOGITS)
    seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)
    if RANDOM == UNIFORMS:
        coins = tl.load(uniforms_ptr + b * stride_ub + j * stride_up, mask=j < n, other=1.0).to(tl.float64)
    else:
        coins = philox_uniform(seed_b, offset + j, row_key, SALT_ACCEPT, 0)
    # u * q < p without dividing: q == 0 < p accepts, p == 0 and NaN never do
    accept = (coins * q_tok < p_tok) & valid
    num_acc = tl.min(tl.where(accept, g, j), axis=0).to(tl.int64)  # first rejected slot, or n
    if STORE_PASSES:
        if split == 0:  # every program of the row has the same lanes; split 0 stores them (False past n)
            tl.store(passes_ptr + b * g + j, accept, mask=j < g)

    # ---- this program's chunk of the final row
    rejected = num_acc < n  # residual at the first rejection; otherwise the bonus row (plain p)
    q_pos = tl.maximum(tl.minimum(num_acc, g - 1), 0)
    p_row = target_ptr + b * stride_tb + num_acc * stride_tp
    q_row = draft_ptr + b * stride_qb + q_pos * stride_qp
    p_top, p_total = pick(t_max, j, num_acc), pick(t_sum, j, num_acc)
    q_top, q_total = pick(q_max, j, q_pos), pick(q_sum, j, q_pos)
    p_nan = tl.where(pick(t_ok.to(tl.int32), j, num_acc) > 0, 0.0, float("nan"))  # 0 for probabilities
    q_nan = tl.where(pick(q_ok.to(tl.int32), j, q_pos) > 0, 0.0, float("nan"))  # a NaN q row: draw from p
    chunk = BLOCK_V * tiles
    sum_r, sum_p = chunk_weight_sums(p_row, q_row, tl.where(rejected, vocab, 0), 1.0, split * chunk, vocab, tiles,
                                     temp, p_top, p_total, p_nan, q_top, q_total, q_nan, LOGITS, False, BLOCK_V)
    part = part_ptr + (b * num_splits + split) * 2
    tl.store(part, sum_r)  # the residual's (plain p's on a bonus row: q is 0 there)
    tl.store(part + 1, sum_p)

    if last_ticket(tickets_ptr + b, num_splits):
        # ---- the row's last program: the final draw from the chunk totals and one chunk
        if RANDOM == UNIFORMS:
            u = tl.load(uniforms_ptr + b * stride_ub + g * stride_up).to(tl.float64)
        else:
            u = philox_uniform(seed_b, offset + num_acc, row_key, SALT_FINAL, 0)  # keyed by the drawn position
        token = draw_from_chunks(part_ptr + b * num_splits * 2, num_splits, u, rejected, p_row, q_row, 1.0, vocab,
                                 tiles, temp, p_top, p_total, p_nan, q_top, q_total, q_nan, LOGITS, False, BLOCK_S,
                                 BLOCK_V)
        # ---- outputs: accepted drafts, then the final token, then -1
        out = tl.where(j < num_acc, tok, tl.where(j == num_acc, token, -1))
        tl.store(out_ptr + b * stride_ob + j, out, mask=j < g + 1)
        tl.store(num_acc_ptr + b, num_acc)
        reset_ticket(tickets_ptr + b)


def launch_chain(target, draft, draft_tokens, out_tokens, num_accepted, *, draft_passes=None, **options) -> None:
    """Launch the chain kernel (B >= 1): a program per batch row on grid x (see launch_split_v); it
    writes each draft's own test to `draft_passes` (bool [B, g] contiguous) when that is given."""
    batch = draft_tokens.shape[0]
    # without the output the flag is off and the placeholder pointer is never written
    passes = dict(passes_ptr=draft_tokens if draft_passes is None else draft_passes,
                  STORE_PASSES=draft_passes is not None)
    launch_split_v(_rejection_sample_kernel, batch, zeroed_counters(draft_tokens.device, batch), target, draft,
                   draft_tokens, out_tokens, num_accepted, kernel_args=passes, **options)


# The planned launch; tests force split plans through its keywords (block_v, min_tiles, ...).
_launch = functools.partial(launch_on_probs, launch_chain)


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None, draft_passes=None):
    """Triton `rejection_sample` on validated inputs (see specdec_kernels.ops.rejection_sample)."""
    return _launch(target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed, offsets=offsets,
                   num_draft_tokens=num_draft_tokens, draft_passes=draft_passes)


register("rejection_sample", "triton", rejection_sample)
