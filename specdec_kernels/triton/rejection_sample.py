"""Triton backend of `rejection_sample` (chain drafts, speculative sampling), and the chain
kernel of `rejection_sample_logits` (LOGITS).

One launch, grid (B, num_splits): the final row of each batch row is split over V so that
a small batch still fills the GPU (B = 1 with V ~ 150k would otherwise be one program
streaming one row twice). No host sync, no data-dependent allocation. Program (b, split)
1. redoes the row's cheap accept walk itself (so it knows the final row without talking
   to the others): gathers p = target_probs[b, i, x_i] and q = draft_probs[b, i, x_i] for
   the n_b drafts (2 n_b scalars; ids outside [0, V) read nothing and are rejected), draws
   the coins (caller uniforms, or Philox(seed, offsets[b] + i, row key, SALT_ACCEPT)) and
   accepts draft i while u_i * q < p in float64, giving num_accepted;
2. sums the fixed-point weights of its chunk of the final row (`_split_v_sampling`): of the
   residual max(0, p - q) at the first rejection (or of the bonus row p[n_b]) and of p (the
   fallback), and stores the two int64 chunk totals; q is only read for a rejected row;
3. takes a ticket from the row's counter (`_tickets`). The program that draws the row's
   last ticket adds the chunk totals, draws the threshold floor(u * total), finds the
   chunk whose cumulative range holds it, and rescans only that chunk (`draw_from_chunks`).
   An empty residual draws from p with the same u, and a row with no mass at all gives 0.
   It writes the outputs and stores 0 back into the counter.

Everything is integer or exactly rounded, and integer sums do not depend on how V is
split, so the result equals `specdec_kernels.reference.rejection_sample` bit for bit on
every dtype and for every split.

LOGITS (`rejection_sample_logits.py`): the rows hold logits and p = softmax(x / T) is computed
on the fly from the per-chunk statistics a first launch stored (`_softmax_stats`); every
program merges the statistics of its row's positions (2 n_b + 1 small merges) before step 1.
See that module for its contract.

The split count depends on (B, V) only (`sampling_plan`): about TARGET_PROGRAMS programs in
all at small B, chunks of MIN_TILES..MAX_TILES tiles (one chunk for a small V), so a large
B gets few splits per row and the last program rescans at most MAX_TILES tiles. Since the
plan follows B, the chunk length and the split count are runtime ints (not specialised) and
BLOCK_S covers the most splits V can have (at B = 1): as rows finish the kernel is not
recompiled (tests/test_triton_recompiles.py).
"""

import torch
import triton
import triton.language as tl

from ..common.registry import register
from ..common.workspace import zeroed_counters
from ._launch import chain_launch, device_scope, randomness_mode
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._split_plans import BLOCK_V, MAX_TILES, MIN_TILES, TARGET_PROGRAMS, most_sampling_splits, sampling_plan
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
        BLOCK_SS: tl.constexpr):
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


def launch_chain(target, draft, draft_tokens, out_tokens, num_accepted, *, uniforms=None, seed=None, offsets=None,
                 num_draft_tokens=None, temperature=1.0, stats=None, block_v: int = BLOCK_V,
                 min_tiles: int = MIN_TILES, max_tiles: int = MAX_TILES,
                 target_programs: int = TARGET_PROGRAMS) -> None:
    """Launch the chain kernel (B >= 1). `stats` = (part_max, part_sum) [B * (2g + 1), splits]
    float32 softmax statistics when target/draft hold logits (LOGITS), else None."""
    batch, g = draft_tokens.shape
    vocab = target.shape[-1]
    device = draft_tokens.device
    block_v, tiles, num_splits = sampling_plan(batch, vocab, block_v, min_tiles, max_tiles, target_programs)
    most_splits = most_sampling_splits(vocab, block_v, min_tiles, max_tiles, target_programs)
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    if g == 0:
        draft = target  # [B, 0, V] has nothing to read; keep a valid pointer
    logits = stats is not None
    per_row_temp = isinstance(temperature, torch.Tensor)
    part_max, part_sum = stats if logits else (placeholder, placeholder)
    temps_t = temperature if per_row_temp else placeholder
    uniforms_t = placeholder if uniforms is None else uniforms
    seeds_t = placeholder if seeds is None else seeds
    offsets_t = placeholder if offsets is None else offsets
    counts_t = placeholder if num_draft_tokens is None else num_draft_tokens
    stat_splits = part_max.shape[1] if logits else 1
    chunk_totals = torch.empty(batch, num_splits, 2, dtype=torch.int64, device=device)  # (residual, p) per chunk
    tickets = zeroed_counters(device, batch)
    with device_scope(device):
        _rejection_sample_kernel[(batch, num_splits)](
            target, draft, draft_tokens, uniforms_t, seeds_t, offsets_t, counts_t, temps_t, part_max, part_sum,
            chunk_totals, tickets, out_tokens, num_accepted,
            1.0 if per_row_temp else float(temperature), seed_int, g, vocab, num_splits, tiles, stat_splits,
            batch * (g + 1),
            target.stride(0), target.stride(1), draft.stride(0), draft.stride(1),
            draft_tokens.stride(0), draft_tokens.stride(1),
            uniforms_t.stride(0) if uniforms is not None else 0, uniforms_t.stride(1) if uniforms is not None else 0,
            seeds_t.stride(0) if seeds is not None else 0, offsets_t.stride(0) if offsets is not None else 0,
            counts_t.stride(0) if num_draft_tokens is not None else 0, temps_t.stride(0) if per_row_temp else 0,
            out_tokens.stride(0),
            RANDOM=mode, HAS_OFFSETS=offsets is not None and mode != UNIFORMS.value,
            HAS_COUNTS=num_draft_tokens is not None, LOGITS=logits, PER_ROW_TEMP=per_row_temp,
            BLOCK_G=max(2, triton.next_power_of_2(g + 1)), BLOCK_V=block_v,
            BLOCK_S=max(2, triton.next_power_of_2(most_splits)), BLOCK_SS=max(2, triton.next_power_of_2(stat_splits)))


def _launch(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, **plan):
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_probs, draft_tokens)
    if batch:
        launch_chain(target_probs, draft_probs, draft_tokens, out_tokens, num_accepted, uniforms=uniforms, seed=seed,
                     offsets=offsets, num_draft_tokens=num_draft_tokens, **plan)
    return out_tokens, num_accepted


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None):
    """Triton `rejection_sample` on validated inputs (see specdec_kernels.ops.rejection_sample)."""
    return _launch(target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed, offsets=offsets,
                   num_draft_tokens=num_draft_tokens)


register("rejection_sample", "triton", rejection_sample)
