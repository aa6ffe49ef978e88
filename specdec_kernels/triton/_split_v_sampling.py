"""Split-V sampling helpers in Triton: the twin of csrc/split_v_sampling.cuh.

The chain, block, tree and logits sampling kernels split each row over V: a program owns one
chunk, sums its int64 fixed-point weights (`_fixed_point`), stores the chunk totals and takes a
ticket (`_tickets`); the row's last program draws the threshold, finds the chunk whose running
total crosses it and rescans that chunk alone. Integer sums do not depend on the split, so
every plan gives the reference's token.
"""

import os

import triton
import triton.language as tl

from ._fixed_point import count_at_or_below, draw_threshold, to_weights
from ._tickets import load_partials

SCALE: tl.constexpr = tl.constexpr(1099511627776.0)  # 2^40, the fixed-point scale of `common.sampling`


# ------------------------------------------------------------------ softmax statistics (LOGITS)
#
# p(x) = exp(z - M) / S with z = x / T, the arithmetic of csrc/logit_math.cuh (softmax_prob),
# per element: no division, one exp2 (ex2.approx on a GPU) and no NaN/inf test.
# - z is the correctly rounded x / T: T = t 2^e with |t| in [1, 2), r = 1 / t rounded,
#   y = x r and one Markstein step z' = fma(fma(-y, t, x), r, y) = RN(x / t); z = z' 2^-e
#   exactly, so fma(z', 2^-e, -M) is the reference's RN(z - M) bit for bit.
# - exp(d) = exp2(d log2 e); p = exp2(d log2 e) * (1 / S), 1 / S once per row.
# p then differs from torch's by the exp2 and the rounding of d log2 e: <= ~2e-6 relative for
# every p >= 2^-40, far inside the 1e-5 decision band (tests/test_logit_sampling_arithmetic.py).

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
FLT_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)
# The interpreter's tl.fma rounds twice (x * y + z in float32: triton/runtime/interpreter.py),
# which breaks the exact remainder above; under TRITON_INTERPRET the fma is evaluated in float64
# (exact product, one rounding that matters), as the GPU's fma.rn.f32 does it.
INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def fma_rn(a, b, c):
    """float32 a * b + c rounded once (fma.rn.f32 on a GPU)."""
    if INTERPRET:
        out = (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    else:
        out = tl.fma(a, b, c)
    return out


@triton.jit
def temp_scale(temp):
    """(t, r, scale) of a float32 scalar temperature T, x / T = div_mantissa(x, t, r) * scale:
    T = t 2^e with |t| in [1, 2), r = 1 / t, scale = 2^-e (T = +-inf: (1, 0, 1); 0 or NaN:
    (T, 1 / T, 1), the division's own inf / NaN; subnormal T acts as +-2^-126)."""
    bits = temp.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    sign = bits & -2147483648  # 0x80000000
    unit = (sign | 0x3F800000).to(tl.float32, bitcast=True)  # +-1
    mant = ((bits & -2139095041) | 0x3F800000).to(tl.float32, bitcast=True)  # 0x807FFFFF: +-[1, 2)
    exp_bits = tl.minimum(tl.maximum(254 - field, 1), 254) << 23
    scale = tl.where(field == 254, 5.877471754111438e-39, exp_bits.to(tl.float32, bitcast=True))  # 2^-127
    special = (temp != temp) | (temp == 0.0)
    t = tl.where(special, temp, tl.where(field == 255, 1.0, tl.where(field == 0, unit, mant)))
    r = tl.where(field == 255, 0.0, tl.where(field == 0, unit, tl.math.div_rn(1.0, t)))
    scale = tl.where(special | (field == 255), 1.0, tl.where(field == 0, 8.507059173023462e37, scale))  # 2^126
    return t, r, scale


@triton.jit
def div_mantissa(x, t, r):
    """RN(x / t) of float32 x (one Markstein step from x * r); +-inf and NaN as the division
    gives them (an infinite x's remainder is inf - inf = NaN, which the max makes -FLT_MAX so
    the last fma returns y)."""
    y = x * r
    rem = fma_rn(-y, t, x)
    if INTERPRET:  # triton < 3.7's interpreter max propagates NaN (np.maximum); a GPU's max.f32 drops it
        rem = tl.where(rem != rem, -FLT_MAX, rem)
    rem = tl.maximum(rem, -FLT_MAX)  # NaN-ignoring max
    return fma_rn(rem, r, y)


@triton.jit
def chunk_softmax_stats(base, start, vocab, temp, BLOCK_V: tl.constexpr, TILES: tl.constexpr):
    """(max m, sum exp(z - m)) of z = x / T over the TILES tiles of one row from `start`;
    the sum is NaN when the chunk holds a NaN (which makes the whole softmax row NaN): no
    per-element test, a NaN z makes its exp and so the sum NaN."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    t_, r_, scale = temp_scale(temp)
    best = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)  # sum exp(z - best) over the chunk so far
    for t in range(TILES):
        offs = start + t * BLOCK_V + lanes
        mask = offs < vocab
        x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
        zq = div_mantissa(x, t_, r_)  # z = zq * scale = RN(x / T), like torch
        # the tile's max z (NaN ignored on a GPU and by triton >= 3.7's interpreter; where it
        # propagates, the NaN sum below marks the row all the same); overflows to inf exactly
        # where x / T does
        new_max = tl.maximum(best, tl.max(zq, axis=0) * scale)
        # shift by the running max; an infinite max shifts by 0 (the row is then all NaN
        # in the reference and the sum is unused)
        shift = tl.where(tl.abs(new_max) < float("inf"), new_max, 0.0)
        total = total * tl.exp2((best - shift) * LOG2E) + \
            tl.sum(tl.exp2(fma_rn(zq, scale, -shift) * LOG2E), axis=0)
        best = new_max
    return best, total


@triton.jit
def merge_softmax_stats(part_max_ptr, part_sum_ptr, rows, row_mask, num_splits, BLOCK_S: tl.constexpr):
    """Per row of `rows`: (max M, 1 / S with S = sum exp(z - M), usable) from its chunk
    partials. usable is False where torch.softmax gives an all-NaN row: a NaN, a +inf, or no
    finite value (1 / S is then NaN, so every p of the row is NaN)."""
    vals, mask = load_partials(part_max_ptr, rows, row_mask, num_splits, float("-inf"), BLOCK_S)
    sums, _ = load_partials(part_sum_ptr, rows, row_mask, num_splits, 0.0, BLOCK_S)
    top = tl.max(vals, axis=1)
    finite = tl.abs(top) < float("inf")
    shift = tl.where(finite, top, 0.0)
    total = tl.sum(tl.where(mask, sums * tl.exp2((vals - shift[:, None]) * LOG2E), 0.0), axis=1)
    usable = finite & (total == total)  # a NaN chunk sum poisons the row
    inv = tl.math.div_rn(tl.zeros_like(total) + 1.0, tl.where(usable, total, 1.0))
    return top, tl.where(usable, inv, float("nan")), usable


@triton.jit
def softmax_prob(x, temp, top, inv_total):
    """float32 softmax value of logit x (any float dtype) given its row's max and 1 / sum:
    exp2(fma(x / t, 2^-e, -top) * log2 e) * inv_total (temp_scale and div_mantissa). Nothing is divided
    per element; p stays within ~3e-6 (relative, p >= 2^-40) of the float32 reference
    (tests/test_logit_sampling_arithmetic.py)."""
    t, r, scale = temp_scale(temp)  # scalar work, hoisted out of the tile loops
    d = fma_rn(div_mantissa(x.to(tl.float32), t, r), scale, -top)  # RN(x / T - top), as torch
    return tl.exp2(d * LOG2E) * inv_total


@triton.jit
def position_stats(stats_max_ptr, stats_sum_ptr, b, n, k, g, stat_splits, target_rows, LOGITS: tl.constexpr,
                   BLOCK_SS: tl.constexpr):
    """LOGITS: per position lane k, the target row's (max, 1 / sum, usable) and the draft row's,
    merged from the statistics launch's partials (rows laid out as `_softmax_stats`: target rows
    b * (g + 1) + k, then draft rows target_rows + b * g + k; only rows the batch row uses were
    written). Probabilities: placeholders that nothing reads."""
    if LOGITS:
        t_max, t_inv, t_ok = merge_softmax_stats(stats_max_ptr, stats_sum_ptr, b * (g + 1) + k, k <= n, stat_splits,
                                                 BLOCK_SS)
        q_max, q_inv, q_ok = merge_softmax_stats(stats_max_ptr, stats_sum_ptr, target_rows + b * g + k, k < n,
                                                 stat_splits, BLOCK_SS)
    else:
        t_max = tl.zeros(k.shape, tl.float32)
        t_inv = t_max + 1.0
        t_ok = k >= 0
        q_max, q_inv, q_ok = t_max, t_inv, t_ok
    return t_max, t_inv, t_ok, q_max, q_inv, q_ok


@triton.jit
def row_temperature(temps_ptr, b, stride_temp, temperature, PER_ROW_TEMP: tl.constexpr):
    """Batch row b's temperature as a float32 scalar: temperatures[b], or the one `temperature`."""
    if PER_ROW_TEMP:
        temp = tl.load(temps_ptr + b * stride_temp).to(tl.float32)
    else:
        temp = tl.full((), 0.0, tl.float32) + temperature
    return temp


# ------------------------------------------------------------------ a batch row's drafts

@triton.jit
def pick(values, lanes, index):
    """values[index] of a small vector as a scalar (a sum of one selected lane; keeps inf/NaN)."""
    return tl.sum(tl.where(lanes == index, values, 0), axis=0)


@triton.jit
def drafts_in_row(counts_ptr, b, stride_c, g, HAS_COUNTS: tl.constexpr):
    """n_b = clamp(num_draft_tokens[b], 0, g), or g without counts."""
    if HAS_COUNTS:
        n = tl.load(counts_ptr + b * stride_c).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), g)
    else:
        n = tl.full((), 0, tl.int64) + g
    return n


@triton.jit
def gather_drafts(target_ptr, draft_ptr, draft_tok_ptr, b, n, k, vocab, temp, t_max, t_inv, t_ok, q_max, q_inv,
                  q_ok, stride_tb, stride_tp, stride_qb, stride_qp, stride_db, stride_dg, LOGITS: tl.constexpr):
    """Per lane k: the draft X_{k+1} (int64), float64 p(X_{k+1}) and q(X_{k+1}) (float32 values
    widened), and whether the draft exists (k < n) and is in [0, V). Ids outside [0, V) read
    nothing; a row torch.softmax makes all NaN gives NaN (no coin passes it)."""
    slot = k < n
    tok = tl.load(draft_tok_ptr + b * stride_db + k * stride_dg, mask=slot, other=-1).to(tl.int64)
    in_range = (tok >= 0) & (tok < vocab)
    safe = tl.where(in_range, tok, 0)  # never address outside the row
    lp = tl.load(target_ptr + b * stride_tb + k * stride_tp + safe, mask=slot & in_range, other=0.0)
    lq = tl.load(draft_ptr + b * stride_qb + k * stride_qp + safe, mask=slot & in_range, other=0.0)
    if LOGITS:
        p_tok = tl.where(t_ok, softmax_prob(lp, temp, t_max, t_inv), float("nan"))
        q_tok = tl.where(q_ok, softmax_prob(lq, temp, q_max, q_inv), float("nan"))
    else:
        p_tok = lp.to(tl.float32)
        q_tok = lq.to(tl.float32)
    return tok, p_tok.to(tl.float64), q_tok.to(tl.float64), slot & in_range


# ------------------------------------------------------------------ fixed-point weights over V-chunks

@triton.jit
def residual_weights(scale, p, q, SCALED: tl.constexpr):
    """int64 residual weights of float32 tiles p, q: to_weights(p - q) (the float32 difference),
    or SCALED, floor(clamp(scale * p - q, 0, 1) * 2^40) in float64 (scale a float64 scalar;
    NaN -> 0, +inf -> 1)."""
    if SCALED:
        r = scale * p.to(tl.float64) - q.to(tl.float64)  # the product is exact: FMA or not, same bits
        r = tl.where(r != r, 0.0, r)  # NaN first: min/max NaN semantics differ across targets
        r = tl.minimum(tl.maximum(r, 0.0), 1.0)
        w = (r * SCALE).to(tl.int64)  # exact scaling; r >= 0 so trunc == floor
    else:
        w = to_weights(p - q)
    return w


@triton.jit
def tile_pq(p_row, q_row, offs, vocab, q_limit, temp, p_top, p_inv, p_nan, q_top, q_inv, q_nan,
            LOGITS: tl.constexpr):
    """float32 (p, q) of one tile: p over offs < vocab, q below q_limit only (0 elsewhere). With
    LOGITS the rows hold logits: p = softmax from the row's (max, 1 / sum); p_nan / q_nan is NaN for a
    row torch.softmax makes all NaN (its weights are then 0), else 0."""
    in_v = offs < vocab
    has_q = offs < q_limit  # a vector compare, not `mask & flag` (interpreter versions differ)
    if LOGITS:
        p = tl.where(in_v, softmax_prob(tl.load(p_row + offs, mask=in_v, other=0.0), temp, p_top, p_inv) + p_nan,
                     0.0)
        q = tl.where(has_q, softmax_prob(tl.load(q_row + offs, mask=has_q, other=0.0), temp, q_top, q_inv) + q_nan,
                     0.0)
    else:
        p = tl.load(p_row + offs, mask=in_v, other=0.0).to(tl.float32)
        q = tl.load(q_row + offs, mask=has_q, other=0.0).to(tl.float32)
    return p, q


@triton.jit
def chunk_weight_sums(p_row, q_row, q_limit, scale, start, vocab, tiles, temp, p_top, p_inv, p_nan, q_top, q_inv,
                      q_nan, LOGITS: tl.constexpr, SCALED: tl.constexpr, BLOCK_V: tl.constexpr):
    """(sum of residual weights, sum of p's weights) over the `tiles` tiles from `start`; q is
    read below q_limit only (q = 0 above it)."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    sum_r = tl.full((), 0, tl.int64)
    sum_p = tl.full((), 0, tl.int64)
    for t in range(tiles):
        offs = start + t * BLOCK_V + lanes
        p, q = tile_pq(p_row, q_row, offs, vocab, q_limit, temp, p_top, p_inv, p_nan, q_top, q_inv, q_nan, LOGITS)
        sum_r += tl.sum(residual_weights(scale, p, q, SCALED), axis=0)
        sum_p += tl.sum(to_weights(p), axis=0)  # lanes past V weigh 0
    return sum_r, sum_p


@triton.jit
def chunk_crossing(p_row, q_row, plain, scale, start, carry, threshold, vocab, tiles, temp, p_top, p_inv, p_nan,
                   q_top, q_inv, q_nan, LOGITS: tl.constexpr, SCALED: tl.constexpr, BLOCK_V: tl.constexpr):
    """How many ids of the chunk from `start` have carry + their running weight <= threshold:
    the drawn id's offset in the chunk. Weights of p alone when `plain`, else the residual."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    q_limit = tl.where(plain, 0, vocab)  # q is not read for plain p
    count = tl.full((), 0, tl.int64)
    for t in range(tiles):
        offs = start + t * BLOCK_V + lanes
        p, q = tile_pq(p_row, q_row, offs, vocab, q_limit, temp, p_top, p_inv, p_nan, q_top, q_inv, q_nan, LOGITS)
        w = tl.where(plain, to_weights(p), residual_weights(scale, p, q, SCALED))
        count += count_at_or_below(w, carry, threshold, offs < vocab)
        carry += tl.sum(w, axis=0)
    return count


@triton.jit
def draw_from_chunks(parts_ptr, num_splits, u, has_residual, p_row, q_row, scale, vocab, tiles, temp, p_top,
                     p_inv, p_nan, q_top, q_inv, q_nan, LOGITS: tl.constexpr, SCALED: tl.constexpr,
                     BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr):
    """The final token of a row from its stored chunk totals ([num_splits][residual, plain p]
    int64 at parts_ptr; `has_residual` False: a bonus row, whose totals are both p's). Draws the
    threshold floor(u * total), finds the chunk whose running total crosses it and rescans that
    chunk alone. An empty residual draws from p with the same u, a row with no mass gives 0."""
    s = tl.arange(0, BLOCK_S)
    has = s < num_splits
    # ".cg": other programs stored these; skip this SM's possibly stale L1 (see _tickets)
    chunk_r = tl.load(parts_ptr + s * 2, mask=has, other=0, cache_modifier=".cg")
    chunk_p = tl.load(parts_ptr + s * 2 + 1, mask=has, other=0, cache_modifier=".cg")
    total_r = tl.sum(chunk_r, axis=0)
    use_r = total_r > 0
    chunk_w = tl.where(use_r, chunk_r, chunk_p)  # an empty residual draws from p alone
    total = tl.sum(chunk_w, axis=0)
    plain = (has_residual == 0) | (total_r == 0)
    threshold = draw_threshold(u, total)
    # the first chunk whose running total exceeds the threshold (< num_splits as threshold <
    # total; the clamp covers total == 0), and the weight before it
    c = tl.minimum(count_at_or_below(chunk_w, 0, threshold, has), num_splits - 1)
    base = tl.sum(tl.where(s < c, chunk_w, 0), axis=0)
    chunk = BLOCK_V * tiles
    count = chunk_crossing(p_row, q_row, plain, scale, c * chunk, base, threshold, vocab, tiles, temp, p_top, p_inv,
                           p_nan, q_top, q_inv, q_nan, LOGITS, SCALED, BLOCK_V)
    # threshold < total, so the id is < V whenever total > 0; the clamp only guards the id
    # range. No mass at all: argmax of all-zero weights, i.e. 0.
    return tl.where(total > 0, tl.minimum(c * chunk + count, vocab - 1), 0)
