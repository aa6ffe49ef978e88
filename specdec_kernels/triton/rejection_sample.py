"""Triton backend of `rejection_sample` (chain drafts, speculative sampling).

One launch, grid (B, num_splits): the final row of each batch row is split over V so that
a small batch still fills the GPU (B = 1 with V ~ 150k would otherwise be one program
streaming one row twice). No host sync, no data-dependent allocation. Program (b, split)
1. redoes the row's cheap accept walk itself (so it knows the final row without talking
   to the others): gathers p = target_probs[b, i, x_i] and q = draft_probs[b, i, x_i] for
   the n_b drafts (2 n_b scalars; ids outside [0, V) read nothing and are rejected), draws
   the coins (caller uniforms, or Philox(seed, offsets[b] + i, row key, SALT_ACCEPT)) and
   accepts draft i while u_i * q < p in float64, giving num_accepted;
2. sums the fixed-point weights of its chunk of the final row: of the residual
   max(0, p - q) at the first rejection (or of the bonus row p[n_b]) and of p (the
   fallback), and stores the two int64 chunk totals; q is only read for a rejected row;
3. takes a ticket from the row's counter (`_tickets`). The program that draws the row's
   last ticket adds the chunk totals, draws the threshold floor(u * total), finds the
   chunk whose cumulative range holds it, and rescans only that chunk: the drawn id is
   the chunk start plus the number of its ids whose running int64 cdf (`tl.cumsum`) is
   <= the threshold. An empty residual draws from p with the same u, and a row with no
   mass at all gives 0 (the argmax of all-zero weights). It writes the outputs and stores
   0 back into the counter.

Everything is integer or exactly rounded, and integer sums do not depend on how V is
split, so the result equals `specdec_kernels.reference.rejection_sample` bit for bit on
every dtype and for every split.

The split count depends on (B, V) only (`_split_plan`): about TARGET_PROGRAMS programs in
all at small B, chunks of MIN_TILES..MAX_TILES tiles (one chunk for a small V), so a large
B gets few splits per row and the last program rescans at most MAX_TILES tiles. Since the
plan follows B, the chunk length and the split count are runtime ints (not specialised) and
BLOCK_S covers the most splits V can have (at B = 1): as rows finish the kernel is not
recompiled (tests/test_triton_recompiles.py).
"""

import torch
import triton
import triton.language as tl

from ..common.workspace import zeroed_counters
from ..common.registry import register
from ._fixed_point import count_at_or_below, draw_threshold, to_weights
from ._launch import chain_launch, device_scope, randomness_mode
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._tickets import last_ticket, reset_ticket

BLOCK_V = 1024  # vocabulary elements per tile (power of two)
MIN_TILES = 2  # smallest chunk in tiles: each program also redoes the accept walk, so not too small
MAX_TILES = 8  # largest chunk in tiles: bounds the last program's rescan at large B
TARGET_PROGRAMS = 4 * 132  # programs per launch worth aiming for at small B (~4 per SM of an H100)


@triton.jit
def _chunk_weights(p_row, q_row, q_limit, start, vocab, tiles, BLOCK_V: tl.constexpr):
    """(sum of residual weights, sum of p's weights) over the `tiles` tiles from `start`; q is
    read below q_limit only (q = 0 above it: then the residual weights are p's)."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    sum_r = tl.full((), 0, tl.int64)
    sum_p = tl.full((), 0, tl.int64)
    for t in range(tiles):
        offs = start + t * BLOCK_V + lanes
        p = tl.load(p_row + offs, mask=offs < vocab, other=0.0).to(tl.float32)
        # the limit is a vector compare rather than `mask & flag` (some Triton interpreter
        # versions reject a block mask combined with a scalar flag)
        q = tl.load(q_row + offs, mask=offs < q_limit, other=0.0).to(tl.float32)  # q = 0: p - 0 == p
        sum_r += tl.sum(to_weights(p - q), axis=0)
        sum_p += tl.sum(to_weights(p), axis=0)  # masked lanes weigh 0
    return sum_r, sum_p


@triton.jit
def _chunk_crossing(p_row, q_row, q_limit, start, carry, threshold, vocab, tiles, BLOCK_V: tl.constexpr):
    """How many ids of the chunk from `start` have carry + their running weight <= threshold
    (weights of p - q, q read below q_limit only): the drawn id's offset in the chunk."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    count = tl.full((), 0, tl.int64)
    for t in range(tiles):
        offs = start + t * BLOCK_V + lanes
        m = offs < vocab
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
        q = tl.load(q_row + offs, mask=offs < q_limit, other=0.0).to(tl.float32)
        w = to_weights(p - q)  # the residual, or p's weights when q was not read
        count += count_at_or_below(w, carry, threshold, m)
        carry += tl.sum(w, axis=0)
    return count


# Not specialised (tests/test_triton_recompiles.py): the seed; the ints that follow the draft
# length g (g, the strides g and g + 1 of the drafts, uniforms and outputs) or, through the
# V-chunk plan, the batch size (num_splits, tiles): Triton would compile a variant for the
# value 1 and for multiples of 16 as rows finish or g adapts. The chunk length in tiles is a
# runtime loop bound for the same reason (the plan gives B-dependent values); g enters the
# key only through BLOCK_G, and BLOCK_S is sized for V's largest split count.
@triton.jit(do_not_specialize=["seed", "g", "num_splits", "tiles", "stride_db", "stride_ub", "stride_ob"])
def _rejection_sample_kernel(
        target_ptr, draft_probs_ptr, draft_tok_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, counts_ptr,
        part_ptr, tickets_ptr, out_ptr, num_acc_ptr, seed, g, vocab, num_splits, tiles,
        stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_ub, stride_up,
        stride_s, stride_o, stride_c, stride_ob,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_COUNTS: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1).to(tl.int64)
    if HAS_COUNTS:
        n = tl.load(counts_ptr + b * stride_c).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), g)
    else:
        n = tl.full((), 0, tl.int64) + g

    # ---- acceptance coins over the draft slots j < n (BLOCK_G >= g + 1 lanes); every
    # program of the row redoes this (2 n scalars and n coins) to learn the final row
    j = tl.arange(0, BLOCK_G).to(tl.int64)
    slot = j < n
    tok = tl.load(draft_tok_ptr + b * stride_db + j * stride_dg, mask=slot, other=-1)
    in_range = (tok >= 0) & (tok < vocab)
    safe = tl.where(in_range, tok, 0)  # never address outside the row
    p_tok = tl.load(target_ptr + b * stride_tb + j * stride_tp + safe, mask=slot & in_range, other=0.0)
    q_tok = tl.load(draft_probs_ptr + b * stride_qb + j * stride_qp + safe, mask=slot & in_range, other=0.0)
    p_tok = p_tok.to(tl.float32).to(tl.float64)
    q_tok = q_tok.to(tl.float32).to(tl.float64)

    seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)
    if RANDOM == UNIFORMS:
        coins = tl.load(uniforms_ptr + b * stride_ub + j * stride_up, mask=slot, other=1.0).to(tl.float64)
    else:
        coins = philox_uniform(seed_b, offset + j, row_key, SALT_ACCEPT, 0)

    # u * q < p without dividing: q == 0 < p accepts, p == 0 and NaN never do
    accept = (coins * q_tok < p_tok) & in_range & slot
    num_acc = tl.min(tl.where(accept, g, j), axis=0).to(tl.int64)  # first rejected slot, or n

    # ---- this program's chunk of the final row
    rejected = num_acc < n  # residual at the first rejection; otherwise the bonus row (plain p)
    p_row = target_ptr + b * stride_tb + num_acc * stride_tp
    q_row = draft_probs_ptr + b * stride_qb + tl.maximum(tl.minimum(num_acc, g - 1), 0) * stride_qp
    q_limit = tl.where(rejected, vocab, 0)  # q is read only on a rejected row
    chunk = BLOCK_V * tiles
    sum_r, sum_p = _chunk_weights(p_row, q_row, q_limit, split * chunk, vocab, tiles, BLOCK_V)
    part = part_ptr + (b * num_splits + split) * 2
    tl.store(part, sum_r)
    tl.store(part + 1, sum_p)

    if last_ticket(tickets_ptr + b, num_splits):
        # ---- the row's last program: totals, threshold, the chunk that holds it
        s = tl.arange(0, BLOCK_S)
        has = s < num_splits
        parts = part_ptr + (b * num_splits + s) * 2
        # ".cg": other programs wrote these; skip this SM's (possibly stale) L1 (see _tickets)
        chunk_r = tl.load(parts, mask=has, other=0, cache_modifier=".cg")
        chunk_p = tl.load(parts + 1, mask=has, other=0, cache_modifier=".cg")
        total_r = tl.sum(chunk_r, axis=0)  # residual weights (plain p on a bonus row)
        use_r = total_r > 0
        chunk_w = tl.where(use_r, chunk_r, chunk_p)  # an empty residual draws from p alone
        total = tl.sum(chunk_w, axis=0)
        q_limit = tl.where(use_r, q_limit, 0)
        if RANDOM == UNIFORMS:
            u = tl.load(uniforms_ptr + b * stride_ub + g * stride_up).to(tl.float64)
        else:
            u = philox_uniform(seed_b, offset + num_acc, row_key, SALT_FINAL, 0)  # keyed by the drawn position
        threshold = draw_threshold(u, total)
        # the first chunk whose running total exceeds the threshold (< num_splits as
        # threshold < total; the clamp covers total == 0), and the weight before it
        c = tl.minimum(count_at_or_below(chunk_w, 0, threshold, has), num_splits - 1)
        base = tl.sum(tl.where(s < c, chunk_w, 0), axis=0)
        count = _chunk_crossing(p_row, q_row, q_limit, c * chunk, base, threshold, vocab, tiles, BLOCK_V)
        # threshold < total, so the id is < V whenever total > 0; the clamp only guards the
        # id range. No mass at all: argmax of all-zero weights, i.e. 0.
        token = tl.where(total > 0, tl.minimum(c * chunk + count, vocab - 1), 0)

        # ---- outputs: accepted drafts, then the final token, then -1
        out = tl.where(j < num_acc, tok, tl.where(j == num_acc, token, -1))
        tl.store(out_ptr + b * stride_ob + j, out, mask=j < g + 1)
        tl.store(num_acc_ptr + b, num_acc)
        reset_ticket(tickets_ptr + b)


def _split_plan(batch: int, vocab: int, block_v: int = BLOCK_V, min_tiles: int = MIN_TILES,
                max_tiles: int = MAX_TILES, target_programs: int = TARGET_PROGRAMS) -> tuple[int, int, int]:
    """(BLOCK_V, tiles per chunk, num_splits) from the static shapes: about target_programs programs
    over the batch, each chunk min_tiles..max_tiles tiles (fewer when V is small)."""
    block_v = min(block_v, max(16, triton.next_power_of_2(vocab)))
    num_tiles = triton.cdiv(vocab, block_v)
    splits = min(triton.cdiv(target_programs, batch), max(1, num_tiles // min_tiles))
    splits = max(splits, triton.cdiv(num_tiles, max_tiles))
    tiles = triton.cdiv(num_tiles, splits)
    return block_v, tiles, triton.cdiv(num_tiles, tiles)  # every split owns at least one tile


def _launch(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, block_v: int = BLOCK_V, min_tiles: int = MIN_TILES, max_tiles: int = MAX_TILES,
            target_programs: int = TARGET_PROGRAMS):
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_probs, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    block_v, tiles, num_splits = _split_plan(batch, vocab, block_v, min_tiles, max_tiles, target_programs)
    most_splits = _split_plan(1, vocab, block_v, min_tiles, max_tiles, target_programs)[2]  # B = 1 splits most
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    if g == 0:
        draft_probs = target_probs  # [B, 0, V] has nothing to read; keep a valid pointer
    uniforms_t = placeholder if uniforms is None else uniforms
    seeds_t = placeholder if seeds is None else seeds
    offsets_t = placeholder if offsets is None else offsets
    counts_t = placeholder if num_draft_tokens is None else num_draft_tokens
    chunk_totals = torch.empty(batch, num_splits, 2, dtype=torch.int64, device=device)  # (residual, p) per chunk
    tickets = zeroed_counters(device, batch)
    with device_scope(device):
        _rejection_sample_kernel[(batch, num_splits)](
            target_probs, draft_probs, draft_tokens, uniforms_t, seeds_t, offsets_t, counts_t,
            chunk_totals, tickets, out_tokens, num_accepted, seed_int, g, vocab, num_splits, tiles,
            target_probs.stride(0), target_probs.stride(1), draft_probs.stride(0), draft_probs.stride(1),
            draft_tokens.stride(0), draft_tokens.stride(1),
            uniforms_t.stride(0) if uniforms is not None else 0, uniforms_t.stride(1) if uniforms is not None else 0,
            seeds_t.stride(0) if seeds is not None else 0, offsets_t.stride(0) if offsets is not None else 0,
            counts_t.stride(0) if num_draft_tokens is not None else 0, out_tokens.stride(0),
            RANDOM=mode, HAS_OFFSETS=offsets is not None and mode != UNIFORMS.value,
            HAS_COUNTS=num_draft_tokens is not None, BLOCK_G=triton.next_power_of_2(g + 1), BLOCK_V=block_v,
            BLOCK_S=max(2, triton.next_power_of_2(most_splits)))
    return out_tokens, num_accepted


def rejection_sample(target_probs, draft_probs, draft_tokens, *, uniforms=None, seed=None, offsets=None,
                     num_draft_tokens=None):
    """Triton `rejection_sample` on validated inputs (see specdec_kernels.ops.rejection_sample)."""
    return _launch(target_probs, draft_probs, draft_tokens, uniforms=uniforms, seed=seed, offsets=offsets,
                   num_draft_tokens=num_draft_tokens)


register("rejection_sample", "triton", rejection_sample)
