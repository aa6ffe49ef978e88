"""The Triton kernel of `tree_rejection_sample` (registered by tree_verify.py): one walk for both
sibling rules, split over V.

A row walks its tree from the root (reference/tree_verify.py). At node `cur` (p = target row
cur) the children are tried in index order; a test reads a few scalars, but each rejected sibling
needs the residual's total over V before the next test, and the final draw needs a cdf over V.
Those full-V passes are what a row costs, so they are split over V across the row's programs.

Grid (B, C): a row advances in stages, each one pass over C V-chunks. Programs claim chunks from the
row's claim word (int64: stage << 32 | chunks claimed) with one atomic add; the program that finishes a
stage's last chunk (a ticket) runs the walk's serial part (child tests, the rank table, the outputs)
until the walk needs another pass, then opens the next stage. A program only waits for chunks running
programs hold, so any grid and schedule works (under the interpreter the first program does the whole
row). The residual after rejected siblings is recomputed per pass from p and the rejected q rows
rather than stored: k rejected siblings of a node cost k(k+3)/2 row reads (independent rule), less
than writing and re-reading an int64 residual row up to about k = 13 (16-bit) or 5 (float32).
csrc/tree_verify.cu is the CUDA twin (with a cluster form on sm_90).
"""

import torch
import triton
import triton.language as tl

from ..common.workspace import zeroed_workspace
from ._fixed_point import count_at_or_below, draw_threshold, to_weights
from ._launch import MAX_GRID_YZ, device_scope, randomness_mode, tree_outputs
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._split_plans import BLOCK_V, MAX_TILES, MIN_TILES, TARGET_PROGRAMS, most_sampling_splits, sampling_plan
from ._split_v_sampling import INTERPRET
from ._tree_walk import load_tree, next_child

# what the next stage's pass computes (the walk state's `kind`)
NO_PASS: tl.constexpr = tl.constexpr(0)
RESID: tl.constexpr = tl.constexpr(1)  # the residual after the state's `rank` rejections, and p
FINAL_P: tl.constexpr = tl.constexpr(2)  # p's weights alone (a final draw with no residual)
DONE: tl.constexpr = tl.constexpr(0x7FFFFFFF)  # the claim word's stage once the row is finished
# the walk state, int64 per row: the node, its depth, rejections there, the last child tried, the
# residual's total S, the draft mass T' left (without replacement), the pending pass
CUR: tl.constexpr = tl.constexpr(0)
LEVEL: tl.constexpr = tl.constexpr(1)
RANK: tl.constexpr = tl.constexpr(2)
LAST: tl.constexpr = tl.constexpr(3)
TOTAL: tl.constexpr = tl.constexpr(4)
Q_LEFT: tl.constexpr = tl.constexpr(5)
KIND: tl.constexpr = tl.constexpr(6)
STATE_WORDS: tl.constexpr = tl.constexpr(8)
# per row, in the zeroed workspace: claim word, finished chunks, programs left, padded to a 128-byte line of
# their own (a row's waiting programs poll its claim word; a line shared with other rows' atomics would bounce)
SYNC_WORDS: tl.constexpr = tl.constexpr(16)
PART_WORDS: tl.constexpr = tl.constexpr(3)  # per chunk: sum of residual weights, of p's, of Q's
RANK_TABLE_COLUMNS = 2  # per node slot of a row: the rejected child (token) of that rank, its total (scale)
CUT_CAP: tl.constexpr = tl.constexpr(2**41)  # above any R(x) <= 2^40: N capped cuts stay inside int64
CUT_CAP_F64: tl.constexpr = tl.constexpr(2.0**41)  # CUT_CAP as float64, applied before the cast


# ------------------------------------------------------------------ residual weights (both rules)

@triton.jit
def _clean_prob(q):
    """float64 of q with NaN/+inf -> 1, -inf -> 0, clamped to [0, 1] (reference q_clean)."""
    q = tl.where(q != q, 1.0, q)
    return tl.minimum(tl.maximum(q, 0.0), 1.0).to(tl.float64)


@triton.jit
def _draft_base(draft_ptr, b, cur, stride_qb, stride_qn, WR: tl.constexpr):
    """Where node cur's siblings' q rows start: the node's own draft row (WR: every child of cur
    was drawn from it), else row b's draft block (child c's q is its row c)."""
    base = draft_ptr + b * stride_qb
    if WR:
        base += cur * stride_qn
    return base


@triton.jit
def _load_cg(ptr):
    """A word another program stored (the walk state, the rank table): from L2, since L1 is not coherent
    across SMs."""
    return tl.load(ptr, cache_modifier=".cg")


@triton.jit
def _residual(p, q_base, stride_qn, table, n, count, offs, m, WR: tl.constexpr):
    """(R, Q) at ids `offs` after `count` (>= 1) rejections at the node, from p (float32 tile, 0
    off the mask). Independent: q_base is the row's draft block and the table holds the rejected
    children and their totals; Q is unused (0). WR: q_base is the node's own draft row and the
    table holds the rejected tokens and scales; Q = to_weights(q)."""
    if WR:
        q = tl.load(q_base + offs, mask=m, other=0.0).to(tl.float32)
        q_weight = to_weights(q)
        r = to_weights(p - q)
        removed = offs < 0  # all False
        for i in range(1, count):
            removed = removed | (offs == _load_cg(table + i - 1))  # q_i is 0 on the tokens rejected before
            scale = _load_cg(table + n + i).to(tl.float64, bitcast=True)
            # >= 0: the truncating cast is the floor; capped (R <= 2^40 < CUT_CAP, so a capped cut
            # empties R as the uncapped one would) so that removed lanes, where Q may exceed T', cast safely
            cut = tl.minimum(scale * q_weight.to(tl.float64), CUT_CAP_F64).to(tl.int64)
            r = tl.where(removed, r, tl.maximum(r - cut, 0))
    else:
        q = tl.load(q_base + _load_cg(table) * stride_qn + offs, mask=m, other=0.0).to(tl.float32)
        q_weight = tl.zeros(offs.shape, tl.int64)
        r = to_weights(p - q)
        for i in range(1, count):
            node = _load_cg(table + i)
            total_f = _load_cg(table + n + i - 1).to(tl.float64)
            q_clean = _clean_prob(tl.load(q_base + node * stride_qn + offs, mask=m, other=0.0).to(tl.float32))
            cut = (total_f * q_clean).to(tl.int64)  # >= 0, so the truncating cast is the floor
            r = tl.maximum(r - cut, 0)
    return r, q_weight


@triton.jit
def _tile_weights(p_row, q_base, stride_qn, table, n, count, offs, vocab, plain, WR: tl.constexpr):
    """The weights a draw walks over one tile: p's when `plain`, else the residual's."""
    m = offs < vocab
    p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
    if plain:
        w = to_weights(p)
    else:
        w, _ = _residual(p, q_base, stride_qn, table, n, count, offs, m, WR)
    return w


@triton.jit
def _pause(nanoseconds):
    """Sleep about `nanoseconds` (PTX nanosleep, sm_70+) between polls of the claim word, so waiting programs
    leave its line to the atomics that move the row on (Triton has no thread index: each warp polls, one
    request a warp). Nothing under the interpreter, which runs no PTX."""
    if not INTERPRET:
        tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, $1;", "=r,r", [nanoseconds], dtype=tl.int32,
                                  is_pure=False, pack=1)


# ------------------------------------------------------------------ a program's chunk of a pass

@triton.jit
def _pass_chunk(target_ptr, draft_ptr, table, state, parts, b, c, n, vocab, tiles, stride_tb, stride_tn,
                stride_qb, stride_qn, WR: tl.constexpr, BLOCK_V: tl.constexpr):
    """Store chunk c's sums (residual, p, Q) of the pass the walk state asks for."""
    cur = _load_cg(state + CUR)
    count = _load_cg(state + RANK)
    kind = _load_cg(state + KIND)
    p_row = target_ptr + b * stride_tb + cur * stride_tn
    q_base = _draft_base(draft_ptr, b, cur, stride_qb, stride_qn, WR)
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    sum_r = tl.full((), 0, tl.int64)
    sum_p = tl.full((), 0, tl.int64)
    sum_q = tl.full((), 0, tl.int64)
    for t in range(tiles):
        offs = (c * tiles + t) * BLOCK_V + lanes
        m = offs < vocab
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
        sum_p += tl.sum(to_weights(p), axis=0)  # lanes past V weigh 0
        if kind == RESID:
            r, q_weight = _residual(p, q_base, stride_qn, table, n, count, offs, m, WR)
            sum_r += tl.sum(r, axis=0)
            sum_q += tl.sum(q_weight, axis=0)
    tl.store(parts + c * PART_WORDS, sum_r)
    tl.store(parts + c * PART_WORDS + 1, sum_p)
    tl.store(parts + c * PART_WORDS + 2, sum_q)


# ------------------------------------------------------------------ the completer: the walk's serial part

@triton.jit
def _chunk_sums(parts, word, num_chunks, BLOCK_C: tl.constexpr):
    """[BLOCK_C] column `word` of the chunk sums (0 past num_chunks)."""
    s = tl.arange(0, BLOCK_C)
    return tl.load(parts + s * PART_WORDS + word, mask=s < num_chunks, other=0, cache_modifier=".cg")


@triton.jit
def _draw(parts, plain, u, p_row, q_base, stride_qn, table, n, count, num_chunks, tiles, vocab, WR: tl.constexpr,
          BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr):
    """The final token from the last pass's chunk sums: of p when `plain`, else of the residual after
    `count` rejections. floor(u * total), the chunk whose running total crosses it, a rescan of
    that chunk; id 0 when there is no mass."""
    s = tl.arange(0, BLOCK_C)
    chunk_w = _chunk_sums(parts, tl.where(plain, 1, 0), num_chunks, BLOCK_C)
    total = tl.sum(chunk_w, axis=0)
    threshold = draw_threshold(u, total)
    c = tl.minimum(count_at_or_below(chunk_w, 0, threshold, s < num_chunks), num_chunks - 1)
    carry = tl.sum(tl.where(s < c, chunk_w, 0), axis=0)
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    below = tl.full((), 0, tl.int64)
    for t in range(tiles):
        offs = (c * tiles + t) * BLOCK_V + lanes
        w = _tile_weights(p_row, q_base, stride_qn, table, n, count, offs, vocab, plain, WR)
        below += count_at_or_below(w, carry, threshold, offs < vocab)
        carry += tl.sum(w, axis=0)
    # threshold < total, so the id is < V whenever total > 0: the clamp only guards the id range
    return tl.where(total > 0, tl.minimum(c * tiles * BLOCK_V + below, vocab - 1), 0)


@triton.jit
def _uniform(uniforms_ptr, seeds_ptr, offsets_ptr, b, seed, column, level, salt, rank, stride_ub, stride_un,
             stride_s, stride_o, RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr):
    """A coin (salt SALT_ACCEPT, `column` = the child, `rank` its sibling rank) or the final draw
    (SALT_FINAL, column 0, rank 0) at depth `level`: the caller's uniforms[b, column], else
    Philox(seed, offsets[b] + level, row key, salt, rank). The row's stream is looked up here, at
    each use, rather than kept live through the walk."""
    if RANDOM == UNIFORMS:
        u = tl.load(uniforms_ptr + b * stride_ub + column * stride_un).to(tl.float64)
    else:
        seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)
        u = philox_uniform(seed_b, offset + level, row_key, salt, rank)
    return u


@triton.jit
def _test_independent(p_row, q_base, stride_qn, table, n, rank, total, child, x, u, lanes, vocab):
    """Whether child (token x) passes at sibling rank `rank` (the rule of its own q row): u * q(x) <
    p(x) first, then (u * q(x)) * S < R(x), R(x) loop-free over the rank lanes (every cut >= 0,
    so max(0, max(0, a - c) - d) = max(0, a - c - d); a capped cut empties R(x) in both forms)."""
    in_range = (x >= 0) & (x < vocab)
    safe_x = tl.where(in_range, x, 0)  # never address outside the row
    p_x = tl.load(p_row + safe_x, mask=in_range, other=0.0).to(tl.float32)
    q_x = tl.load(q_base + child * stride_qn + safe_x, mask=in_range, other=0.0).to(tl.float32).to(tl.float64)
    first = tl.where(rank > 0, _load_cg(table), 0)  # the first rejected child (garbage before any)
    q_first = tl.load(q_base + first * stride_qn + safe_x, mask=in_range & (rank > 0), other=0.0).to(tl.float32)
    later = (lanes >= 1) & (lanes < rank)
    nodes = tl.load(table + lanes, mask=later, other=0, cache_modifier=".cg")
    totals = tl.load(table + n + lanes - 1, mask=later, other=0, cache_modifier=".cg").to(tl.float64)
    # mask `later` alone: safe_x keeps the address in the row, and an x outside [0, V) fails below whatever
    # is read; `later & in_range` would broadcast a scalar bool, which Triton 3.9's interpreter widens to int
    q_later = _clean_prob(tl.load(q_base + nodes * stride_qn + safe_x, mask=later, other=0.0).to(tl.float32))
    cuts = tl.minimum((totals * q_later).to(tl.int64), CUT_CAP)  # masked lanes: 0
    r_x = tl.maximum(to_weights(p_x - q_first) - tl.sum(cuts, axis=0), 0).to(tl.float64)  # <= 2^40: exact
    first_rule = u * q_x < p_x.to(tl.float64)
    later_rule = (u * q_x) * total.to(tl.float64) < r_x
    return in_range & tl.where(rank > 0, later_rule, first_rule)


@triton.jit
def _test_without_replacement(p_row, q_row, table, n, rank, total, q_left, x, u, lanes, vocab):
    """(real, accept, scale) of a child with token x at rank `rank` (all siblings from q_row): real
    when q could have drawn x (in [0, V), Q(x) > 0, not a rejected token); u * q(x) < p(x) first,
    then u * (c * Q(x)) < R(x) with c = S / T' (the scale stored on rejection)."""
    in_range = (x >= 0) & (x < vocab)
    safe_x = tl.where(in_range, x, 0)
    p_x = tl.load(p_row + safe_x, mask=in_range, other=0.0).to(tl.float32)
    q_x = tl.load(q_row + safe_x, mask=in_range, other=0.0).to(tl.float32)
    q_weight_x = to_weights(q_x)
    rejected_toks = tl.load(table + lanes, mask=lanes < rank, other=-1, cache_modifier=".cg")
    repeated = tl.max(((rejected_toks == x) & (lanes < rank)).to(tl.int32), axis=0) > 0
    real = in_range & (q_weight_x > 0) & (repeated == 0)
    # R(x) = max(0, R_1(x) - sum_i min(cut_i, CAP)): x is no rejected token, so every rank cut it
    later = (lanes >= 1) & (lanes < rank)
    scales = tl.load(table + n + lanes, mask=later, other=0, cache_modifier=".cg").to(tl.float64, bitcast=True)
    cuts = tl.minimum(scales * q_weight_x.to(tl.float64), CUT_CAP_F64).to(tl.int64)  # masked lanes: 0
    r_x = tl.maximum(to_weights(p_x - q_x) - tl.sum(cuts, axis=0), 0).to(tl.float64)  # <= 2^40: exact
    scale = tl.where(rank > 0, total.to(tl.float64) / tl.maximum(q_left, 1).to(tl.float64), 0.0)
    first_rule = u * q_x.to(tl.float64) < p_x.to(tl.float64)
    later_rule = u * (scale * q_weight_x.to(tl.float64)) < r_x
    return real, tl.where(rank > 0, later_rule, first_rule), scale


@triton.jit
def _finish_row(out_ptr, num_acc_ptr, nodes_ptr, b, level, final, max_depth, stride_ob, stride_nb,
                BLOCK_N: tl.constexpr):
    """The final token at `level`, num_accepted, and -1 past it (the path itself is stored already)."""
    tl.store(out_ptr + b * stride_ob + level, final)
    tl.store(num_acc_ptr + b, level)
    lanes = tl.arange(0, BLOCK_N).to(tl.int64)
    pad = tl.full((BLOCK_N,), -1, tl.int64)
    for start in range(0, max_depth + 1, BLOCK_N):
        offs = start + lanes
        past = (offs > level) & (offs <= max_depth)
        tl.store(out_ptr + b * stride_ob + offs, pad, mask=past)
        tl.store(nodes_ptr + b * stride_nb + offs, pad, mask=past)


@triton.jit
def _resume(state, nodes_ptr, b, stage, stride_nb):
    """The walk state (cur, level, rank, last, total, q_left, kind) that `stage` opens with: the
    root and an empty path at stage 0 (its node slot 0 stored here), else what the last stage saved."""
    zero = tl.full((), 0, tl.int64)
    if stage == 0:
        cur, level, rank, last, total, q_left, kind = zero, zero, zero, zero, zero, zero, zero + NO_PASS
        tl.store(nodes_ptr + b * stride_nb, zero)
    else:
        cur, level, rank = _load_cg(state + CUR), _load_cg(state + LEVEL), _load_cg(state + RANK)
        last, total, q_left = _load_cg(state + LAST), _load_cg(state + TOTAL), _load_cg(state + Q_LEFT)
        kind = _load_cg(state + KIND)
    return cur, level, rank, last, total, q_left, kind


@triton.jit
def _absorb_pass(parts, table, uniforms_ptr, seeds_ptr, offsets_ptr, b, seed, level, rank, total, q_left, kind,
                 p_row, q_base, stride_qn, n, vocab, num_chunks, tiles, stride_ub, stride_un, stride_s, stride_o,
                 RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, WR: tl.constexpr, BLOCK_V: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    """(done, final, total, q_left) once the pass `kind` asked for is in: FINAL_P draws the final
    token; RESID takes the residual's total S (and T, the first time)."""
    done = kind == FINAL_P
    final = tl.full((), 0, tl.int64)
    if kind == FINAL_P:  # a node without rejections: p's chunk sums are in
        u = _uniform(uniforms_ptr, seeds_ptr, offsets_ptr, b, seed, 0, level, SALT_FINAL, 0, stride_ub, stride_un,
                     stride_s, stride_o, RANDOM, HAS_OFFSETS)
        final = _draw(parts, done, u, p_row, q_base, stride_qn, table, n, rank, num_chunks, tiles, vocab, WR, BLOCK_C,
                      BLOCK_V)
    if kind == RESID:  # the residual after `rank` rejections
        total = tl.sum(_chunk_sums(parts, 0, num_chunks, BLOCK_C), axis=0)
        if WR:
            q_all = tl.sum(_chunk_sums(parts, 2, num_chunks, BLOCK_C), axis=0)
            x = _load_cg(table + rank - 1)  # the token just rejected, a real sibling: in [0, V)
            q_weight_x = to_weights(tl.load(q_base + x).to(tl.float32))
            q_left = tl.where(rank == 1, q_all, q_left) - q_weight_x
        else:
            tl.store(table + n + rank - 1, total)  # read by the passes and tests of later ranks
    return done, final, total, q_left


@triton.jit
def _test_child(p_row, q_base, stride_qn, table, n, rank, total, q_left, child, x, u, lanes, vocab,
                WR: tl.constexpr):
    """(real, accept, scale) of child (token x) at sibling rank `rank`, by the sibling rule."""
    if WR:
        real, accept, scale = _test_without_replacement(p_row, q_base, table, n, rank, total, q_left, x, u, lanes,
                                                        vocab)
    else:
        real = child >= 0  # every child is a real sibling: an id outside [0, V) is rejected
        accept = _test_independent(p_row, q_base, stride_qn, table, n, rank, total, child, x, u, lanes, vocab)
        scale = 0.0
    return real, accept, scale


@triton.jit
def _record_rejection(table, n, rank, child, x, scale, WR: tl.constexpr):
    """The rank table's entry of a rejected child: its token and scale (WR), else the child."""
    if WR:
        tl.store(table + rank, x)
        tl.store(table + n + rank, scale.to(tl.int64, bitcast=True))
    else:
        tl.store(table + rank, child)


@triton.jit
def _save_state(state, cur, level, rank, last, total, q_left, need, stage):
    """Store the walk state for the next stage; the claim word that opens it."""
    tl.store(state + CUR, cur)
    tl.store(state + LEVEL, level)
    tl.store(state + RANK, rank)
    tl.store(state + LAST, last)
    tl.store(state + TOTAL, total)
    tl.store(state + Q_LEFT, q_left)
    tl.store(state + KIND, need)
    return (stage + 1) << 32


@triton.jit
def _walk(target_ptr, draft_ptr, tok_ptr, par_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, table, state, parts,
          out_ptr, num_acc_ptr, nodes_ptr, b, stage, seed, n, vocab, max_depth, num_chunks, tiles,
          stride_tb, stride_tn, stride_qb, stride_qn, stride_kb, stride_kn, stride_pb, stride_pn, stride_ub,
          stride_un, stride_s, stride_o, stride_ob, stride_nb,
          RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, WR: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
    """The completer of `stage`: absorb its pass, walk until the next pass or the end; returns the
    claim word that opens the next stage (or marks the row done)."""
    lanes, par, tok = load_tree(tok_ptr, par_ptr, b, n, stride_kb, stride_kn, stride_pb, stride_pn, BLOCK_N)
    zero = tl.full((), 0, tl.int64)
    cur, level, rank, last, total, q_left, kind = _resume(state, nodes_ptr, b, stage, stride_nb)
    p_row = target_ptr + b * stride_tb + cur * stride_tn
    q_base = _draft_base(draft_ptr, b, cur, stride_qb, stride_qn, WR)
    done, final, total, q_left = _absorb_pass(parts, table, uniforms_ptr, seeds_ptr, offsets_ptr, b, seed, level, rank,
                                              total, q_left, kind, p_row, q_base, stride_qn, n, vocab, num_chunks,
                                              tiles, stride_ub, stride_un, stride_s, stride_o, RANDOM, HAS_OFFSETS, WR,
                                              BLOCK_V, BLOCK_C)
    need = zero + NO_PASS
    while (need == NO_PASS) & (done == 0):
        child = tl.where(level < max_depth, next_child(par, lanes, cur, last, n), n)  # no child at max_depth
        if child < n:
            x = tl.sum(tl.where(lanes == child, tok, 0), axis=0)
            u = _uniform(uniforms_ptr, seeds_ptr, offsets_ptr, b, seed, child, level, SALT_ACCEPT, rank, stride_ub,
                         stride_un, stride_s, stride_o, RANDOM, HAS_OFFSETS)
            real, accept, scale = _test_child(p_row, q_base, stride_qn, table, n, rank, total, q_left, child, x, u,
                                              lanes, vocab, WR)
            last = child
            if real & accept:  # move down: the child's token at slot `level`
                tl.store(out_ptr + b * stride_ob + level, x)
                tl.store(nodes_ptr + b * stride_nb + level + 1, child)
                cur = child
                level += 1
                rank = zero
                total = zero
                q_left = zero
                p_row = target_ptr + b * stride_tb + cur * stride_tn
                q_base = _draft_base(draft_ptr, b, cur, stride_qb, stride_qn, WR)
            elif real:  # rejected: the residual's total over V is the next pass
                _record_rejection(table, n, rank, child, x, scale, WR)
                rank += 1
                need = zero + RESID
        else:  # no child left (or a leaf, or max_depth): the final draw
            if rank > 0:  # from the residual (empty: from p) with the last pass's chunk sums
                u = _uniform(uniforms_ptr, seeds_ptr, offsets_ptr, b, seed, 0, level, SALT_FINAL, 0, stride_ub,
                             stride_un, stride_s, stride_o, RANDOM, HAS_OFFSETS)
                final = _draw(parts, total == 0, u, p_row, q_base, stride_qn, table, n, rank, num_chunks, tiles, vocab,
                              WR, BLOCK_C, BLOCK_V)
                done = rank > 0
            else:
                need = zero + FINAL_P
    if done:
        _finish_row(out_ptr, num_acc_ptr, nodes_ptr, b, level, final, max_depth, stride_ob, stride_nb, BLOCK_N)
        word = zero + (DONE << 32)
    else:
        word = _save_state(state, cur, level, rank, last, total, q_left, need, stage)
    return word


# Not specialised (tests/test_triton_recompiles.py): the seed and the ints that follow the tree size
# N or its depth (n, max_depth, the strides N of the token / parent / uniform rows, max_depth + 1 of
# the outputs, 2N of the rank table), or B through the plan (num_chunks, tiles): Triton would compile
# a variant for the value 1 and for multiples of 16 whenever they move. N enters the key only through
# BLOCK_N = next_pow2(N), V through BLOCK_C (its largest chunk count).
@triton.jit(do_not_specialize=["seed", "n", "max_depth", "num_chunks", "tiles", "stride_kb", "stride_pb",
                               "stride_ub", "stride_ob", "stride_nb", "stride_table"])
def _tree_rejection_kernel(
        target_ptr, draft_ptr, tok_ptr, par_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, table_ptr, state_ptr,
        part_ptr, sync_ptr, out_ptr, num_acc_ptr, nodes_ptr, seed, n, vocab, max_depth, num_chunks, tiles,
        stride_tb, stride_tn, stride_qb, stride_qn, stride_kb, stride_kn, stride_pb, stride_pn,
        stride_ub, stride_un, stride_s, stride_o, stride_ob, stride_nb, stride_table,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, WR: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    working = tl.full((), 1, tl.int1)
    while working:
        # the row's words, derived again in each pass through the loop rather than kept live across it
        claim = sync_ptr + b * SYNC_WORDS  # stage << 32 | chunks claimed
        word = tl.atomic_add(claim, 1, sem="acq_rel")
        stage = word >> 32
        c = word & 0xFFFFFFFF
        chunks = tl.where(stage == 0, 1, num_chunks)  # stage 0: one empty chunk, its completer starts the walk
        if stage == DONE:
            working = stage != DONE
        elif c < chunks:
            table = table_ptr + b * stride_table
            state = state_ptr + b * STATE_WORDS
            parts = part_ptr + b * num_chunks * PART_WORDS
            if stage > 0:
                _pass_chunk(target_ptr, draft_ptr, table, state, parts, b, c, n, vocab, tiles, stride_tb, stride_tn,
                            stride_qb, stride_qn, WR, BLOCK_V)
            tl.debug_barrier()  # every thread's chunk sums come before the ticket
            finished = claim + 1  # chunks of the current stage done
            if tl.atomic_add(finished, 1, sem="acq_rel") == chunks - 1:
                tl.store(finished, 0)  # every chunk of this stage is done: the next one counts from 0
                nxt = _walk(target_ptr, draft_ptr, tok_ptr, par_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, table,
                            state, parts, out_ptr, num_acc_ptr, nodes_ptr, b, stage, seed, n, vocab, max_depth,
                            num_chunks, tiles, stride_tb, stride_tn, stride_qb, stride_qn, stride_kb, stride_kn,
                            stride_pb, stride_pn, stride_ub, stride_un, stride_s, stride_o, stride_ob, stride_nb,
                            RANDOM, HAS_OFFSETS, WR, BLOCK_N, BLOCK_V, BLOCK_C)
                tl.debug_barrier()  # the state, table and outputs come before the next stage opens
                tl.atomic_xchg(claim, nxt, sem="release")
        else:  # every chunk of this stage is claimed by running programs: wait for the next stage
            waiting = tl.full((), 1, tl.int1)
            pause = tl.full((), 32, tl.int32)
            while waiting:
                _pause(pause)
                pause = tl.minimum(pause * 2, 512)  # backing off to ~0.5 us, a fraction of a stage
                waiting = (tl.load(claim, volatile=True) >> 32) == stage
    tl.debug_barrier()
    claim = sync_ptr + b * SYNC_WORDS
    if tl.atomic_add(claim + 2, 1, sem="acq_rel") == tl.num_programs(1) - 1:  # the row's last program leaves:
        tl.store(claim, 0)  # zero its words (every program of the row has made its last access)
        tl.store(claim + 1, 0)
        tl.store(claim + 2, 0)


# ------------------------------------------------------------------ launcher

def rejection_plan(batch: int, n: int, vocab: int, *, block_v: int = BLOCK_V, min_tiles: int = MIN_TILES,
                   max_tiles: int = MAX_TILES, target_programs: int = TARGET_PROGRAMS) -> dict:
    """Launch plan of `tree_rejection_sample`: grid (B, C), C V-chunks per pass, and the buffers.

    Nothing grows with V but the chunk sums (3 int64 per chunk, at most V / 2048 chunks): the rank
    table is int64 [B, 2N] (per rejected rank: the child or token, the total or scale), the walk
    state int64 [B, 8], and the claim words 128 bytes per row of the zeroed workspace. The residual
    is recomputed from p and the rejected siblings' q rows, never stored.
    """
    block_v, tiles, chunks = sampling_plan(batch, vocab, block_v, min_tiles, max_tiles, target_programs)
    most = most_sampling_splits(vocab, block_v, min_tiles, max_tiles, target_programs)
    return dict(grid=(batch, chunks), block_v=block_v, tiles=tiles, chunks=chunks,
                block_c=max(2, triton.next_power_of_2(most)),
                table_shape=(batch, RANK_TABLE_COLUMNS * n), table_bytes=batch * RANK_TABLE_COLUMNS * n * 8,
                state_shape=(batch, STATE_WORDS.value), parts_shape=(batch, chunks, PART_WORDS.value),
                sync_bytes=batch * SYNC_WORDS.value * 8)


def launch_rejection(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None, seed=None,
                     offsets=None, siblings: str = "independent", **plan_knobs):
    """The outputs of `tree_rejection_sample` on validated inputs; plan_knobs override `rejection_plan`'s
    tiles (tests force many chunks at small shapes)."""
    batch, n = tree_tokens.shape
    vocab = target_probs.shape[-1]
    device = tree_tokens.device
    out_tokens, num_accepted, accepted_nodes = tree_outputs(tree_tokens, max_depth)
    if batch == 0:
        return out_tokens, num_accepted, accepted_nodes
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    has_offsets = offsets is not None and mode != UNIFORMS.value
    plan = rejection_plan(batch, n, vocab, **plan_knobs)
    # every entry of these is stored before it is read (the walk's completers): no zeroing
    table = torch.empty(plan["table_shape"], dtype=torch.int64, device=device)
    state = torch.empty(plan["state_shape"], dtype=torch.int64, device=device)
    parts = torch.empty(plan["parts_shape"], dtype=torch.int64, device=device)
    sync = zeroed_workspace(device, plan["sync_bytes"])[:plan["sync_bytes"]].view(torch.int64)
    placeholder = tree_tokens  # any tensor on the device; never read when its flag is off
    uniforms_t = placeholder if uniforms is None else uniforms
    seeds_t = placeholder if seeds is None else seeds
    offsets_t = offsets if has_offsets else placeholder
    with device_scope(device):
        _tree_rejection_kernel[plan["grid"]](
            target_probs, draft_probs, tree_tokens, parents, uniforms_t, seeds_t, offsets_t, table, state, parts, sync,
            out_tokens, num_accepted, accepted_nodes, seed_int, n, vocab, max_depth, plan["chunks"], plan["tiles"],
            target_probs.stride(0), target_probs.stride(1), draft_probs.stride(0), draft_probs.stride(1),
            tree_tokens.stride(0), tree_tokens.stride(1), parents.stride(0), parents.stride(1),
            uniforms_t.stride(0) if uniforms is not None else 0, uniforms_t.stride(1) if uniforms is not None else 0,
            seeds_t.stride(0) if seeds is not None else 0, offsets_t.stride(0) if has_offsets else 0,
            out_tokens.stride(0), accepted_nodes.stride(0), table.stride(0),
            RANDOM=mode, HAS_OFFSETS=has_offsets, WR=siblings == "without_replacement",
            BLOCK_N=triton.next_power_of_2(n), BLOCK_V=plan["block_v"], BLOCK_C=plan["block_c"])
    return out_tokens, num_accepted, accepted_nodes


def launch_limits(sizes: dict) -> str | None:
    """The registry's `limits`: grid y holds a row's V-chunks (at least V / 8192 of them)."""
    chunks = rejection_plan(max(sizes["B"], 1), 1, sizes["V"])["chunks"]
    return f"{chunks} V-chunks per row, past CUDA's grid y limit of {MAX_GRID_YZ}" if chunks > MAX_GRID_YZ else None
