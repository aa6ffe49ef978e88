"""Triton backend of `rejection_sample_logits`: speculative sampling on logits and a
temperature, p = softmax(target_logits / T), q = softmax(draft_logits / T) in float32,
without ever writing a softmax to memory.

One launch, grid (B*(g+1) + B*g, num_splits), no host sync, no data-dependent allocation:

1. Program (row, split) owns one chunk of one row: the target rows first, then the draft
   rows. It computes split-V softmax statistics like `logit_verify`'s (SUMEXP), with a
   temperature: it streams the chunk in BLOCK_V tiles (widened to float32, z = x / T
   with IEEE division, as torch divides) and stores the chunk max m and sum exp(z - m)
   (online softmax: a running max rescaled per tile). A chunk with a NaN stores a NaN sum.
   Rows a ragged row never uses (target positions > n_b, draft positions >= n_b) are not
   read and take no ticket.
2. It takes a ticket from its batch row's counter (`_tickets`); the program that draws the
   last of the row's (2 n_b + 1) * num_splits tickets (`_accept_draw`) merges each
   position's chunks (M = max, S = sum S_s * exp(m_s - M)); p(v) = exp(z_v - M) / S. A
   row with a NaN, a +inf, or no finite value (all -inf) is all NaN in torch.softmax, and
   so here (its p and q are NaN). It gathers p(x_i), q(x_i), draws the coins exactly as
   `rejection_sample` (caller uniforms, or Philox(seed, offsets[b] + i, row key,
   SALT_ACCEPT)), accepts while u * q < p in float64, then streams the one row pair the
   final token comes from (the residual max(0, p - q) at the first rejection, the bonus
   row p otherwise) twice with the fixed-point rules of `reference._sampling`: pass 1 sums
   the weights of the residual and of p, pass 2 counts the ids whose running cdf is
   <= floor(u * total) (u = Philox(seed, offsets[b] + num_accepted, row key, SALT_FINAL)
   in seeded mode). An empty residual (p == q, or a NaN q row) draws from p; a row without
   mass (a NaN p row) gives 0. Ids are always in [0, V) and no load leaves its row. It
   then stores 0 back into the counter.

The final draw is done by that one program over the whole final row (the CUDA kernel does
the same): the row's softmax statistics are only known once every chunk is merged, so a
split draw would need a second handshake.

Exactness contract: z = x / T is bit-identical to the reference and so are the row maxima,
but exp and the summation order differ from torch's in the last ulps, so p and q carry a
relative error of a few float32 ulps (up to ~1e-6 with a GPU's approximate exp for
exponents near -100). With supplied uniforms the output equals
`reference.rejection_sample_logits` except where a decision lies within a relative margin
of about 1e-5 of its boundary: a coin with |u q - p| < 1e-5 max(p, q), or a final draw
whose threshold u * total is within 1e-5 (in probability units) of a cdf boundary, or
whose residual mass is below ~1e-5 (empty vs not). Identical target and draft rows give
identical p and q here too, so their residual is exactly empty, as in the reference.
"""

import torch
import triton
import triton.language as tl

from ..common.workspace import zeroed_counters
from ..common.registry import register
from ._fixed_point import count_at_or_below, draw_threshold, to_weights
from ._launch import chain_launch, device_scope, grid_x_refusal, randomness_mode, temperature_args
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._tickets import last_ticket, reset_ticket
from .logit_verify import _load_partials, _split_plan

BLOCK_V = 1024  # vocabulary elements per tile (power of two)
TILES_PER_PROGRAM = 4  # tiles one stats program streams before V is split further
MAX_SPLITS = 64  # cap on stats programs per row


@triton.jit
def _scale(x, temp):
    """float32 x / T rounded to nearest (torch's division; a plain `/` may be approximate on
    a GPU). div_rn does not broadcast, so T is spread to x's shape first."""
    x = x.to(tl.float32)
    return tl.math.div_rn(x, tl.zeros_like(x) + temp)


@triton.jit
def _chunk_softmax_stats(base, start, vocab, temp, BLOCK_V: tl.constexpr, TILES: tl.constexpr):
    """(max m, sum exp(z - m)) of z = x / T over the TILES tiles of one row from `start`;
    the sum is NaN when the chunk holds a NaN (which makes the whole softmax row NaN)."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    best = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)  # sum exp(z - best) over the chunk so far
    nans = tl.full((), 0, tl.int32)
    for t in range(TILES):
        offs = start + t * BLOCK_V + lanes
        mask = offs < vocab
        x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
        z = _scale(x, temp)  # IEEE x / T, like torch (T > 0 keeps -inf at -inf)
        is_nan = z != z
        nans += tl.sum(is_nan.to(tl.int32), axis=0)
        z = tl.where(is_nan, float("-inf"), z)
        new_max = tl.maximum(best, tl.max(z, axis=0))
        # shift by the running max; an infinite max shifts by 0 (the row is then all NaN
        # in the reference and the sum is unused)
        shift = tl.where(tl.abs(new_max) < float("inf"), new_max, 0.0)
        total = total * tl.exp(best - shift) + tl.sum(tl.exp(z - shift), axis=0)
        best = new_max
    return best, tl.where(nans > 0, float("nan"), total)


@triton.jit
def _merge_stats(part_max_ptr, part_sum_ptr, rows, row_mask, num_splits, BLOCK_S: tl.constexpr):
    """Per row of `rows`: (max M, sum exp(z - M), usable) from its chunk partials. usable is
    False where torch.softmax gives an all-NaN row: a NaN, a +inf, or no finite value."""
    vals, mask = _load_partials(part_max_ptr, rows, row_mask, num_splits, float("-inf"), BLOCK_S)
    sums, _ = _load_partials(part_sum_ptr, rows, row_mask, num_splits, 0.0, BLOCK_S)
    top = tl.max(vals, axis=1)
    finite = tl.abs(top) < float("inf")
    shift = tl.where(finite, top, 0.0)
    total = tl.sum(tl.where(mask, sums * tl.exp(vals - shift[:, None]), 0.0), axis=1)
    usable = finite & (total == total)  # a NaN chunk sum poisons the row
    return top, tl.where(usable, total, 1.0), usable


@triton.jit
def _prob(x, temp, top, total):
    """float32 softmax value of logit x (any float dtype) given its row's max and sum."""
    return tl.exp(_scale(x, temp) - top) / total


@triton.jit
def _pick(values, lanes, index):
    """values[index] of a small vector as a scalar (a sum of one selected lane; keeps inf/NaN)."""
    return tl.sum(tl.where(lanes == index, values, 0), axis=0)


@triton.jit
def _accept_draw(
        target_ptr, draft_ptr, draft_tok_ptr, part_max_ptr, part_sum_ptr, uniforms_ptr, seeds_ptr, offsets_ptr,
        out_ptr, num_acc_ptr, b, n, temp, seed, g, vocab, num_splits, target_rows,
        stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_ub, stride_up, stride_s, stride_o,
        stride_ob, RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr,
        BLOCK_V: tl.constexpr):
    """Batch row b once every chunk of its rows is stored: merge, accept, draw, store."""
    # ---- row statistics of every position (target 0..g, draft 0..g-1)
    j = tl.arange(0, BLOCK_P).to(tl.int64)
    slot = j < n  # the drafts of the row (slots past n_b are never read)
    # rows the batch row does not use were never written: target j > n, draft j >= n
    t_max, t_sum, t_ok = _merge_stats(part_max_ptr, part_sum_ptr, b * (g + 1) + j, j <= n, num_splits, BLOCK_S)
    q_max, q_sum, q_ok = _merge_stats(part_max_ptr, part_sum_ptr, target_rows + b * g + j, j < n, num_splits, BLOCK_S)

    # ---- acceptance: p(x_j), q(x_j) from one gathered logit each
    tok = tl.load(draft_tok_ptr + b * stride_db + j * stride_dg, mask=slot, other=-1)
    in_range = (tok >= 0) & (tok < vocab)
    safe = tl.where(in_range, tok, 0)  # never address outside the row
    lt = tl.load(target_ptr + b * stride_tb + j * stride_tp + safe, mask=slot & in_range, other=0.0)
    lq = tl.load(draft_ptr + b * stride_qb + j * stride_qp + safe, mask=slot & in_range, other=0.0)
    p_tok = tl.where(t_ok, _prob(lt, temp, t_max, t_sum), float("nan")).to(tl.float64)
    q_tok = tl.where(q_ok, _prob(lq, temp, q_max, q_sum), float("nan")).to(tl.float64)

    seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)
    if RANDOM == UNIFORMS:
        coins = tl.load(uniforms_ptr + b * stride_ub + j * stride_up, mask=slot, other=1.0).to(tl.float64)
    else:
        # one Philox call for the coins (SALT_ACCEPT at offset + j) and every candidate final
        # draw (SALT_FINAL at offset + j, the one at j == num_accepted is used): [2, BLOCK_P]
        which = tl.arange(0, 2)[:, None]
        salt = tl.where(which == 0, SALT_ACCEPT, SALT_FINAL)
        draws = philox_uniform(seed_b, offset + j[None, :] + 0 * which, row_key, salt, 0)
        coins = tl.sum(tl.where(which == 0, draws, 0.0), axis=0)
        finals = tl.sum(tl.where(which == 1, draws, 0.0), axis=0)

    # u * q < p without dividing: q == 0 < p accepts, p == 0 and NaN never do
    accept = (coins * q_tok < p_tok) & in_range & slot
    num_acc = tl.min(tl.where(accept, g, j), axis=0).to(tl.int64)  # first rejected slot, or n

    # ---- the final draw from one row pair
    if RANDOM == UNIFORMS:
        u = tl.load(uniforms_ptr + b * stride_ub + g * stride_up).to(tl.float64)
    else:
        u = _pick(finals, j, num_acc)  # Philox(seed, offset + num_accepted, row key, SALT_FINAL)
    rejected = num_acc < n  # residual at the first rejection; otherwise the bonus row (plain p)
    q_pos = tl.maximum(tl.minimum(num_acc, g - 1), 0)
    p_top = _pick(t_max, j, num_acc)
    p_total = _pick(t_sum, j, num_acc)
    p_ok = _pick(t_ok.to(tl.int32), j, num_acc) > 0
    q_top = _pick(q_max, j, q_pos)
    q_total = _pick(q_sum, j, q_pos)
    q_bad = _pick(q_ok.to(tl.int32), j, q_pos) == 0
    p_row = target_ptr + b * stride_tb + num_acc * stride_tp
    q_row = draft_ptr + b * stride_qb + q_pos * stride_qp
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    # vector limits rather than `mask & flag`: an all-NaN p row reads nothing (weights 0,
    # like NaN's); q is read only on a rejected row
    p_limit = tl.where(p_ok, vocab, 0)
    q_limit = tl.where(rejected, vocab, 0)
    q_nan = tl.where(q_bad, float("nan"), 0.0)  # a NaN q row: NaN residual, weight 0 -> draw from p

    total_r = tl.full((), 0, tl.int64)  # residual weights (plain p on a bonus row)
    total_p = tl.full((), 0, tl.int64)  # fallback: p's weights
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        mp = offs < p_limit
        mq = offs < q_limit
        p = tl.where(mp, _prob(tl.load(p_row + offs, mask=mp, other=0.0), temp, p_top, p_total), 0.0)
        q = tl.where(mq, _prob(tl.load(q_row + offs, mask=mq, other=0.0), temp, q_top, q_total) + q_nan, 0.0)
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
        mp = offs < p_limit
        mq = offs < q_limit
        p = tl.where(mp, _prob(tl.load(p_row + offs, mask=mp, other=0.0), temp, p_top, p_total), 0.0)
        q = tl.where(mq, _prob(tl.load(q_row + offs, mask=mq, other=0.0), temp, q_top, q_total) + q_nan, 0.0)
        w = to_weights(p - q)  # the residual, or p's weights when q was not read
        count += count_at_or_below(w, carry, threshold, offs < vocab)
        carry += tl.sum(w, axis=0)
    # threshold < total, so count < V whenever total > 0; the clamp only guards the id range.
    # No mass at all: argmax of all-zero weights, i.e. 0.
    token = tl.where(total > 0, tl.minimum(count, vocab - 1), 0)

    # ---- outputs: accepted drafts, then the final token, then -1
    out = tl.where(j < num_acc, tok, tl.where(j == num_acc, token, -1))
    tl.store(out_ptr + b * stride_ob + j, out, mask=j < g + 1)
    tl.store(num_acc_ptr + b, num_acc)


@triton.jit
def _stats_row(row, target_rows, g, target_ptr, draft_ptr, stride_tb, stride_tp, stride_qb, stride_qp):
    """(b, row pointer, last_needed) of statistics row `row`: target rows b * (g + 1) + i first,
    then draft rows b * g + i. The row is read only when last_needed <= n_b."""
    if row < target_rows:
        b = row // (g + 1)
        pos = row % (g + 1)
        base = target_ptr + b * stride_tb + pos * stride_tp
        last_needed = pos  # target position pos is read when pos <= n_b
    else:
        r = row - target_rows
        gd = tl.maximum(g, 1)  # only reached when g >= 1
        b = r // gd
        pos = r % gd
        base = draft_ptr + b * stride_qb + pos * stride_qp
        last_needed = pos + 1  # draft position pos is read when pos < n_b
    return b, base, last_needed


@triton.jit
def _drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS: tl.constexpr):
    """n_b = clamp(num_draft_tokens[b], 0, g), or g without counts."""
    if HAS_COUNTS:
        n = tl.load(counts_ptr + b * stride_c).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), g)
    else:
        n = tl.full((), 0, tl.int64) + g
    return n


@triton.jit
def _row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP: tl.constexpr):
    """Batch row b's temperature as a float32 scalar: temperatures[b], or the one `temperature`."""
    if PER_ROW_TEMP:
        temp = tl.load(temps_ptr + b * stride_temp).to(tl.float32)
    else:
        temp = tl.full((), 0.0, tl.float32) + temperature
    return temp


# Not specialised (tests/test_triton_recompiles.py): the seed, and the ints that follow the
# batch size or the draft length g (g, the target rows B * (g + 1), the strides g and g + 1
# of the drafts, uniforms and outputs): Triton would compile a variant for the value 1 and
# for multiples of 16 as rows finish or g adapts. g enters the key only through BLOCK_P.
@triton.jit(do_not_specialize=["seed", "g", "target_rows", "stride_db", "stride_ub", "stride_ob"])
def _rejection_sample_logits_kernel(
        target_ptr, draft_ptr, draft_tok_ptr, temps_ptr, part_max_ptr, part_sum_ptr, tickets_ptr,
        uniforms_ptr, seeds_ptr, offsets_ptr, counts_ptr, out_ptr, num_acc_ptr,
        temperature, seed, g, vocab, num_splits, target_rows,
        stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_temp,
        stride_ub, stride_up, stride_s, stride_o, stride_c, stride_ob,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_COUNTS: tl.constexpr, PER_ROW_TEMP: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, STATS_BLOCK_V: tl.constexpr,
        TILES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # target rows b * (g+1) + i first, then draft rows b * g + i
    split = tl.program_id(1).to(tl.int64)
    b, base, last_needed = _stats_row(row, target_rows, g, target_ptr, draft_ptr, stride_tb, stride_tp, stride_qb,
                                      stride_qp)
    n = _drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS)
    temp = _row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP)
    last = tl.full((), 0, tl.int1)
    if last_needed <= n:  # rows the batch row never uses are not read and take no ticket
        best, total = _chunk_softmax_stats(base, split * (STATS_BLOCK_V * TILES), vocab, temp, STATS_BLOCK_V, TILES)
        tl.store(part_max_ptr + row * num_splits + split, best)
        tl.store(part_sum_ptr + row * num_splits + split, total)
        last = last_ticket(tickets_ptr + b, (2 * n + 1) * num_splits)
    if last:
        _accept_draw(target_ptr, draft_ptr, draft_tok_ptr, part_max_ptr, part_sum_ptr, uniforms_ptr, seeds_ptr,
                     offsets_ptr, out_ptr, num_acc_ptr, b, n, temp, seed, g, vocab, num_splits, target_rows,
                     stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, stride_ub, stride_up,
                     stride_s, stride_o, stride_ob, RANDOM, HAS_OFFSETS, BLOCK_P, BLOCK_S, BLOCK_V)
        reset_ticket(tickets_ptr + b)


def _stats_buffers(batch: int, g: int, num_splits: int, device) -> tuple:
    """(target_rows, rows, part_max, part_sum): the per-chunk softmax statistics of the B * (g + 1)
    target rows, then the B * g draft rows (the layout `_stats_row` decodes)."""
    target_rows = batch * (g + 1)
    rows = target_rows + batch * g
    part_max = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
    part_sum = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
    return target_rows, rows, part_max, part_sum


def _launch(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None, offsets=None,
            num_draft_tokens=None, block_v: int = BLOCK_V, tiles_per_program: int = TILES_PER_PROGRAM,
            max_splits: int = MAX_SPLITS):
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    if g == 0:
        draft_logits = target_logits  # [B, 0, V] has nothing to read; keep a valid pointer
    per_row_temp, temps_t, temp_value, stride_temp = temperature_args(temperature, placeholder)
    uniforms_t = placeholder if uniforms is None else uniforms
    seeds_t = placeholder if seeds is None else seeds
    offsets_t = placeholder if offsets is None else offsets
    counts_t = placeholder if num_draft_tokens is None else num_draft_tokens
    stride_c = counts_t.stride(0) if num_draft_tokens is not None else 0

    stats_block_v, tiles, num_splits = _split_plan(vocab, block_v, tiles_per_program, max_splits)
    target_rows, rows, part_max, part_sum = _stats_buffers(batch, g, num_splits, device)
    tickets = zeroed_counters(device, batch)
    with device_scope(device):
        _rejection_sample_logits_kernel[(rows, num_splits)](
            target_logits, draft_logits, draft_tokens, temps_t, part_max, part_sum, tickets,
            uniforms_t, seeds_t, offsets_t, counts_t, out_tokens, num_accepted,
            temp_value, seed_int, g, vocab, num_splits, target_rows,
            target_logits.stride(0), target_logits.stride(1), draft_logits.stride(0), draft_logits.stride(1),
            draft_tokens.stride(0), draft_tokens.stride(1), stride_temp,
            uniforms_t.stride(0) if uniforms is not None else 0, uniforms_t.stride(1) if uniforms is not None else 0,
            seeds_t.stride(0) if seeds is not None else 0, offsets_t.stride(0) if offsets is not None else 0,
            stride_c, out_tokens.stride(0),
            RANDOM=mode, HAS_OFFSETS=offsets is not None and mode != UNIFORMS.value,
            HAS_COUNTS=num_draft_tokens is not None, PER_ROW_TEMP=per_row_temp,
            BLOCK_P=max(2, triton.next_power_of_2(g + 1)), BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
            BLOCK_V=min(block_v, max(16, triton.next_power_of_2(vocab))), STATS_BLOCK_V=stats_block_v, TILES=tiles)
    return out_tokens, num_accepted


def rejection_sample_logits(target_logits, draft_logits, draft_tokens, *, temperature=1.0, uniforms=None, seed=None,
                            offsets=None, num_draft_tokens=None):
    """Triton `rejection_sample_logits` on validated inputs (see specdec_kernels.ops.rejection_sample_logits)."""
    return _launch(target_logits, draft_logits, draft_tokens, temperature=temperature, uniforms=uniforms, seed=seed,
                   offsets=offsets, num_draft_tokens=num_draft_tokens)


def launch_limits(sizes: dict) -> str | None:
    """The registry's `limits`: grid x holds a program per target and per draft row, B * (2g + 1)."""
    return grid_x_refusal(sizes["B"] * (2 * sizes["G"] + 1), "B * (2g + 1)")


register("rejection_sample_logits", "triton", rejection_sample_logits, limits=launch_limits)
