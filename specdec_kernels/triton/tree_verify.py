"""Triton backends of `tree_greedy_verify` and `tree_rejection_sample` (token trees).

One launch per call, no host sync and no data-dependent allocation. A row is a serial
walk from the root, one level per step, and the levels depend on each other (the next
node is the child accepted at this one), so one program keeps the walk in registers: the
row's `parents` and `tree_tokens` as BLOCK_N = next_power_of_2(N) lanes, the current
node, and the accepted path (nodes and tokens, at most N entries). Node i's children are
the lanes j > i with parents[j] == i; the next one to try is the smallest such lane above
the last one tried, so siblings go in index order without building a children table. The
outputs are stored once at the end (the path, then -1 up to max_depth + 1).

tree_greedy_verify: at each visited node a lane compare finds the first child whose token
is the node's argmax (fp32 after loading, NaN -> -inf, ties -> lowest id, all -inf -> 0).
Two kernels, chosen from (B, N, max_depth) only (`SPLIT_ROWS_PER_LEVEL`):
- large B, `_tree_greedy_kernel`, grid (B,): one program per row streams each visited
  node's row when it gets there. Nothing else is read.
- small B, `_tree_greedy_split_kernel`, grid (B*N, splits): the argmax partials of every
  node the walk could reach (the root, or a parent in [0, node)) are computed split over V
  in parallel, as `greedy_verify` does for a chain; the program that draws the row's last
  ticket (`_tickets`) merges them into one argmax per node and walks the tree in registers.
  This reads the rows of unvisited nodes too, but in parallel instead of one after another.

tree_rejection_sample: at node `cur` (p = target_probs[b, cur]) the children are tried in
index order with the reference's fixed-point rules (reference/tree_verify.py):
- the first child reads two scalars, p(x) and q_c(x), and accepts iff u * q(x) < p(x) in
  float64 (ids outside [0, V) read nothing and are rejected);
- after k rejected siblings c_1..c_k the residual is R_1 = to_weights(p - q_c1) and
  R_j = max(0, R_{j-1} - floor(S_{j-1} * q_clean_cj)), S_j = sum R_j. Each R_j(v) depends
  only on p(v), the rejected siblings' q(v) and the scalars S_1..S_{j-1}, so nothing of
  size V is stored: a rejection runs one pass over p and the k rejected q rows that
  recomputes R_k tile by tile and sums S_k, and a later child's test recomputes the one
  value R_k(x) from k + 1 scalar loads, accepting iff (u * q(x)) * S_k < R_k(x) in float64
  (R(x) <= 2^40 is exact there);
- the rank table (int64 [B, 2N], `rejection_plan`) holds, per sibling rank, the rejected
  child and the total after it, for those recomputations. Its entries are written by the
  row's own program, behind a barrier, before any thread reads them.
siblings="without_replacement" runs `_tree_rejection_wr_kernel` (same grid, same rank table,
other contents): all children of a node share the node's own draft row, so a rejection's pass
reads p and that one q row whatever the rank (see the section below).
When no child is accepted (all rejected, a leaf, or depth max_depth: the bonus) the row
draws its final token: from R_k when S_k > 0 (one more recomputing pass, the usual count of
cdf entries <= floor(u * S) over BLOCK_V tiles), else from p's weights (one pass to sum
them, one to draw), else id 0.
Traffic: the k-th rejection at a node reads k + 1 rows, so k rejected siblings cost
k(k+3)/2 row reads plus k + 1 for a residual draw, instead of the old scratch's k reads of
q plus an int64 row written and re-read per rejection (8-16 bytes per id): recomputing
reads less up to about k = 13 rejected siblings of one node in 16-bit dtypes and k = 5 in
float32, and a node with more rejected siblings than that pays the quadratic term.

Coins: caller uniforms [B, N] (column c = node c's coin, column 0 the final draw), or
Philox(seed, offsets[b] + level, row key, SALT_ACCEPT, sibling rank) for a coin and
Philox(seed, offsets[b] + level, row key, SALT_FINAL, 0) for the final draw, level being
the depth of the node the walk is at. Everything is integer or exactly rounded and uses
the reference's float64 expressions, so both ops equal the reference bit for bit on
every dtype.

tree_rejection_sample runs one program per row (grid (B,)), which leaves most SMs idle for
small B and large V. Splitting a row over V needs a grid-wide handshake per rejected
sibling: S_{j-1} gates both the next child's test and every value of R_j, so the programs
of a row would have to wait for each other once per rejection. Per-row tickets give one
merge only (the last program goes on alone); waiting requires every program of the row to
be resident at once, which a plain launch does not promise (a grid larger than what can
be resident deadlocks, e.g. under an MPS SM limit, and the interpreter, which runs programs
one after another, always would). Ways out, for a later step with a GPU to test on: a
cooperative launch or an sm_90 cluster per row (co-residency promised), or per-row work
stealing (programs claim the V-chunks of the current stage from an atomic counter, the one
finishing the last chunk decides and opens the next stage; a program only ever waits for
chunks that running programs have claimed, so it needs no co-residency).
"""

import torch
import triton
import triton.language as tl

from ..common.workspace import zeroed_counters
from ..common.registry import register
from ._fixed_point import count_at_or_below, draw_threshold, to_weights
from ._launch import device_scope, randomness_mode, tree_outputs
from ._philox import SALT_ACCEPT, SALT_FINAL, UNIFORMS, philox_uniform, row_stream
from ._tickets import last_ticket, reset_ticket
from .logit_verify import MAX_SPLITS, TILES_PER_PROGRAM, _chunk_stats, _merge_argmax, _split_plan

BLOCK_V = 1024  # vocabulary elements per tile (power of two)
# tree_greedy_verify at small B reads every node the walk could reach, split over V, in
# parallel; otherwise one program per row walks and streams only the visited rows, one
# after another at the speed of one SM. The parallel read wins while B * N stays below
# about (max_depth + 1) times the ratio of HBM to one SM's bandwidth: this estimate of
# that ratio is to be tuned on a GPU.
SPLIT_ROWS_PER_LEVEL = 32


# ------------------------------------------------------------------ shared device helpers

@triton.jit
def _next_child(par, lanes, cur, after, n):
    """The smallest lane j > after with parents[j] == cur (j > cur, j > 0), or n if none."""
    is_child = (par == cur) & (lanes > cur) & (lanes > after) & (lanes > 0) & (lanes < n)
    return tl.min(tl.where(is_child, lanes, n), axis=0)


@triton.jit
def _store_path(out_ptr, nodes_ptr, out_vec, nodes_vec, lanes, b, stride_ob, stride_nb, width,
                BLOCK_N: tl.constexpr):
    """Store the path vectors to positions < width (= max_depth + 1), then -1 beyond BLOCK_N."""
    tl.store(out_ptr + b * stride_ob + lanes, out_vec, mask=lanes < width)
    tl.store(nodes_ptr + b * stride_nb + lanes, nodes_vec, mask=lanes < width)
    pad = tl.full((BLOCK_N,), -1, tl.int64)
    for start in range(BLOCK_N, width, BLOCK_N):
        offs = start + lanes
        tl.store(out_ptr + b * stride_ob + offs, pad, mask=offs < width)
        tl.store(nodes_ptr + b * stride_nb + offs, pad, mask=offs < width)


@triton.jit
def _row_argmax(row_ptr, vocab, BLOCK_V: tl.constexpr):
    """safe_argmax of one row: fp32, NaN -> -inf, ties -> lowest id, all -inf -> 0."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int64) + vocab  # larger than any id
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        m = offs < vocab
        x = tl.load(row_ptr + offs, mask=m, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("-inf"), x)
        tile_max = tl.max(x, axis=0)
        tile_idx = tl.min(tl.where((x == tile_max) & m, offs, vocab), axis=0)
        # tiles come in increasing id order: a later tile wins only with a strictly larger max
        better = (tile_max > best_val) | ((tile_max == best_val) & (tile_idx < best_idx))
        best_idx = tl.where(better, tile_idx, best_idx)
        best_val = tl.where(better, tile_max, best_val)
    return tl.where(best_idx < vocab, best_idx, 0)


# ------------------------------------------------------------------ tree_greedy_verify

@triton.jit
def _greedy_walk(logits_ptr, par, tok, lanes, argmax_vec, b, n, vocab, max_depth, stride_lb, stride_ln,
                 out_ptr, num_acc_ptr, nodes_ptr, stride_ob, stride_nb, BLOCK_N: tl.constexpr,
                 BLOCK_V: tl.constexpr, MERGED: tl.constexpr):
    """Walk row b from the root and store its outputs. MERGED: each node's argmax is lane
    `node` of argmax_vec; otherwise each visited node's row is streamed here."""
    out_vec, nodes_vec, cur, level, alive = _start_walk(lanes, BLOCK_N)
    while alive:
        if MERGED:
            want = tl.sum(tl.where(lanes == cur, argmax_vec, 0), axis=0)
        else:
            want = _row_argmax(logits_ptr + b * stride_lb + cur * stride_ln, vocab, BLOCK_V)
        # no child at depth max_depth; a vector limit rather than `block & scalar flag`
        # (some Triton interpreter versions reject the latter)
        limit = tl.where(level < max_depth, n, 0)
        match = (par == cur) & (lanes > cur) & (lanes > 0) & (lanes < limit) & (tok == want)
        child = tl.min(tl.where(match, lanes, n), axis=0)  # the first matching child in index order
        moving = child < n
        # moving: the child's token (== want) at slot `level`; stopping: the argmax there
        out_vec = tl.where(lanes == level, want, out_vec)
        nodes_vec = tl.where(moving & (lanes == level + 1), child, nodes_vec)
        cur = tl.where(moving, child, cur)
        level = tl.where(moving, level + 1, level)
        alive = moving
    tl.store(num_acc_ptr + b, level)
    _store_path(out_ptr, nodes_ptr, out_vec, nodes_vec, lanes, b, stride_ob, stride_nb, max_depth + 1, BLOCK_N)


@triton.jit
def _load_tree(tok_ptr, par_ptr, b, n, stride_tb, stride_tn, stride_pb, stride_pn, BLOCK_N: tl.constexpr):
    """(lanes, parents, tokens) of row b as BLOCK_N lanes (parents -2, tokens -1 past n)."""
    lanes = tl.arange(0, BLOCK_N).to(tl.int64)
    in_tree = lanes < n
    par = tl.load(par_ptr + b * stride_pb + lanes * stride_pn, mask=in_tree, other=-2).to(tl.int64)
    tok = tl.load(tok_ptr + b * stride_tb + lanes * stride_tn, mask=in_tree, other=-1).to(tl.int64)
    return lanes, par, tok


# Not specialised, in the three kernels (tests/test_triton_recompiles.py): the ints that follow
# the tree size N or its depth (n, max_depth, the strides N of the token / parent / uniform
# rows, max_depth + 1 of the outputs, 2N of the rank table): Triton would compile a variant
# for the value 1 and for multiples of 16 whenever the tree shape changes. The logits / probs
# strides N * V keep their 16-alignment for every N when V has it. N enters the keys only
# through BLOCK_N = next_pow2(N).
_TREE_INTS = ["n", "max_depth", "stride_pb", "stride_ob", "stride_nb"]


@triton.jit(do_not_specialize=_TREE_INTS + ["stride_tb"])
def _tree_greedy_kernel(logits_ptr, tok_ptr, par_ptr, out_ptr, num_acc_ptr, nodes_ptr, n, vocab, max_depth,
                        stride_lb, stride_ln, stride_tb, stride_tn, stride_pb, stride_pn, stride_ob, stride_nb,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per row: the walk streams each visited node's row (reads only those)."""
    b = tl.program_id(0).to(tl.int64)
    lanes, par, tok = _load_tree(tok_ptr, par_ptr, b, n, stride_tb, stride_tn, stride_pb, stride_pn, BLOCK_N)
    _greedy_walk(logits_ptr, par, tok, lanes, lanes, b, n, vocab, max_depth, stride_lb, stride_ln, out_ptr,
                 num_acc_ptr, nodes_ptr, stride_ob, stride_nb, BLOCK_N, BLOCK_V, False)


@triton.jit(do_not_specialize=_TREE_INTS + ["stride_tb"])
def _tree_greedy_split_kernel(logits_ptr, tok_ptr, par_ptr, part_val_ptr, part_idx_ptr, tickets_ptr, out_ptr,
                              num_acc_ptr, nodes_ptr, n, vocab, max_depth, num_splits,
                              stride_lb, stride_ln, stride_tb, stride_tn, stride_pb, stride_pn, stride_ob,
                              stride_nb, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr,
                              BLOCK_S: tl.constexpr):
    """Grid (B*N, num_splits): split-V argmax partials of every node the walk could reach,
    then the row's last ticket merges them and walks the tree (see the module doc)."""
    row = tl.program_id(0).to(tl.int64)  # row = b * N + node
    split = tl.program_id(1).to(tl.int64)
    b = row // n
    node = row % n
    parent = tl.load(par_ptr + b * stride_pb + node * stride_pn).to(tl.int64)
    if (node == 0) | ((parent >= 0) & (parent < node)):  # others can never be visited: not read
        best_val, best_idx, _, _ = _chunk_stats(logits_ptr + b * stride_lb + node * stride_ln,
                                                split * (BLOCK_V * TILES), vocab, 0.0, 0, BLOCK_V, TILES,
                                                True, False, False)
        tl.store(part_val_ptr + row * num_splits + split, best_val)
        tl.store(part_idx_ptr + row * num_splits + split, best_idx)
    if last_ticket(tickets_ptr + b, n * num_splits):  # every program counts, read or not
        lanes, par, tok = _load_tree(tok_ptr, par_ptr, b, n, stride_tb, stride_tn, stride_pb, stride_pn, BLOCK_N)
        readable = (lanes < n) & ((lanes == 0) | ((par >= 0) & (par < lanes)))  # as above
        _, top, _, _ = _merge_argmax(part_val_ptr, part_idx_ptr, b * n + lanes, readable, num_splits, vocab, BLOCK_S)
        _greedy_walk(logits_ptr, par, tok, lanes, top, b, n, vocab, max_depth, stride_lb, stride_ln, out_ptr,
                     num_acc_ptr, nodes_ptr, stride_ob, stride_nb, BLOCK_N, BLOCK_V, True)
        reset_ticket(tickets_ptr + b)


# ------------------------------------------------------------------ tree_rejection_sample

@triton.jit
def _clean_prob(q):
    """float64 of q with NaN/+inf -> 1, -inf -> 0, clamped to [0, 1] (reference q_clean)."""
    q = tl.where(q != q, 1.0, q)
    return tl.minimum(tl.maximum(q, 0.0), 1.0).to(tl.float64)


@triton.jit
def _residual_at(p_row, q_base, stride_qn, table, n, count, offs, m):
    """R(offs) after the first `count` (>= 1) children of the current node were rejected,
    recomputed from p and their q rows: R = to_weights(p - q_c0), then for each later
    rejected sibling R <- max(0, R - floor(S * q_clean)) with S the total stored for the
    rank before it. Lanes outside the mask weigh 0 (p = q = 0 there)."""
    p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
    q = tl.load(q_base + tl.load(table) * stride_qn + offs, mask=m, other=0.0).to(tl.float32)
    r = to_weights(p - q)
    for i in range(1, count):
        node = tl.load(table + i)
        total_f = tl.load(table + n + i - 1).to(tl.float64)
        q_clean = _clean_prob(tl.load(q_base + node * stride_qn + offs, mask=m, other=0.0).to(tl.float32))
        cut = (total_f * q_clean).to(tl.int64)  # >= 0, so the truncating cast is the floor
        r = tl.maximum(r - cut, 0)
    return r


# Above any R(x) (<= 2^40): clamping each cut to it keeps a sum of N of them inside int64.
CUT_CAP: tl.constexpr = tl.constexpr(2**41)


@triton.jit
def _residual_at_token(p_row, q_base, stride_qn, table, n, count, x, in_range, lanes):
    """R(x) at one id after `count` (>= 1) rejected siblings, loop-free over the BLOCK_N
    lanes (lane i = rank i): since every cut is >= 0, max(0, max(0, a - c) - d) equals
    max(0, a - c - d), so R_k(x) = max(0, R_1(x) - sum_i min(cut_i(x), CUT_CAP)); a capped
    cut exceeds R_1(x) and empties R(x) in both forms. Same value as `_residual_at`, but one
    vector load instead of a serial loop in the walk (which made the sm_90 build spill)."""
    p = tl.load(p_row + x, mask=in_range, other=0.0).to(tl.float32)
    q = tl.load(q_base + tl.load(table) * stride_qn + x, mask=in_range, other=0.0).to(tl.float32)
    later = (lanes >= 1) & (lanes < count)
    nodes = tl.load(table + lanes, mask=later, other=0)
    totals = tl.load(table + n + lanes - 1, mask=later, other=0).to(tl.float64)
    q_later = _clean_prob(tl.load(q_base + nodes * stride_qn + x, mask=later & in_range, other=0.0).to(tl.float32))
    cuts = tl.minimum((totals * q_later).to(tl.int64), CUT_CAP)  # masked lanes: 0
    return tl.maximum(to_weights(p - q) - tl.sum(cuts, axis=0), 0)


@triton.jit
def _residual_total(p_row, q_base, stride_qn, table, n, count, vocab, BLOCK_V: tl.constexpr):
    """S = sum_v R(v) after `count` rejected siblings (one pass over p and their q rows)."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    total = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        total += tl.sum(_residual_at(p_row, q_base, stride_qn, table, n, count, offs, offs < vocab), axis=0)
    return total


@triton.jit
def _draw_residual(p_row, q_base, stride_qn, table, n, count, threshold, vocab, BLOCK_V: tl.constexpr):
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    count_below = tl.full((), 0, tl.int64)
    carry = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        m = offs < vocab
        w = _residual_at(p_row, q_base, stride_qn, table, n, count, offs, m)
        count_below += count_at_or_below(w, carry, threshold, m)
        carry += tl.sum(w, axis=0)
    return count_below


@triton.jit
def _p_total(p_row, vocab, BLOCK_V: tl.constexpr):
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    total = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        p = tl.load(p_row + offs, mask=offs < vocab, other=0.0).to(tl.float32)
        total += tl.sum(to_weights(p), axis=0)  # masked lanes weigh 0
    return total


@triton.jit
def _draw_p(p_row, threshold, vocab, BLOCK_V: tl.constexpr):
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    count = tl.full((), 0, tl.int64)
    carry = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        m = offs < vocab
        w = to_weights(tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32))
        count += count_at_or_below(w, carry, threshold, m)
        carry += tl.sum(w, axis=0)
    return count


@triton.jit
def _start_walk(lanes, BLOCK_N: tl.constexpr):
    """(out_vec, nodes_vec, cur, level, alive) of a walk at the root: no tokens yet, node 0."""
    out_vec = tl.full((BLOCK_N,), -1, tl.int64)
    nodes_vec = tl.where(lanes == 0, 0, out_vec)
    cur = tl.full((), 0, tl.int64)
    level = tl.full((), 0, tl.int64)
    alive = tl.full((), 1, tl.int1)
    return out_vec, nodes_vec, cur, level, alive


@triton.jit
def _accept_uniform(uniforms_ptr, b, child, stride_ub, stride_un, seed_b, row_key, offset, level, rank,
                    RANDOM: tl.constexpr):
    """The coin of `child`, tried at sibling rank `rank` and depth `level`: the caller's
    uniforms[b, child], else the Philox draw (offset + level, SALT_ACCEPT, rank)."""
    if RANDOM == UNIFORMS:
        u = tl.load(uniforms_ptr + b * stride_ub + child * stride_un).to(tl.float64)
    else:
        u = philox_uniform(seed_b, offset + level, row_key, SALT_ACCEPT, rank)
    return u


@triton.jit
def _final_uniform(uniforms_ptr, b, stride_ub, seed_b, row_key, offset, level, RANDOM: tl.constexpr):
    """The uniform of the final draw at depth `level`: the caller's uniforms[b, 0], else the
    Philox draw (offset + level, SALT_FINAL, 0)."""
    if RANDOM == UNIFORMS:
        u = tl.load(uniforms_ptr + b * stride_ub).to(tl.float64)
    else:
        u = philox_uniform(seed_b, offset + level, row_key, SALT_FINAL, 0)
    return u


@triton.jit
def _draw_from_p(p_row, u_final, vocab, BLOCK_V: tl.constexpr):
    """The final draw from p's own weights (no residual, or an empty one); id 0 when p has no mass."""
    total_p = _p_total(p_row, vocab, BLOCK_V)
    final = _draw_p(p_row, draw_threshold(u_final, total_p), vocab, BLOCK_V)
    return tl.where(total_p > 0, tl.minimum(final, vocab - 1), 0)


@triton.jit
def _descend(out_vec, nodes_vec, tok, lanes, accepted, level):
    """The path vectors after accepting child `accepted` at depth `level`."""
    out_vec = tl.where(lanes == level, tl.sum(tl.where(lanes == accepted, tok, 0), axis=0), out_vec)
    nodes_vec = tl.where(lanes == level + 1, accepted, nodes_vec)
    return out_vec, nodes_vec


@triton.jit(do_not_specialize=_TREE_INTS + ["seed", "stride_kb", "stride_ub", "stride_table"])
def _tree_rejection_kernel(
        target_ptr, draft_ptr, tok_ptr, par_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, table_ptr,
        out_ptr, num_acc_ptr, nodes_ptr, seed, n, vocab, max_depth,
        stride_tb, stride_tn, stride_qb, stride_qn, stride_kb, stride_kn, stride_pb, stride_pn,
        stride_ub, stride_un, stride_s, stride_o, stride_ob, stride_nb, stride_table,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lanes, par, tok = _load_tree(tok_ptr, par_ptr, b, n, stride_kb, stride_kn, stride_pb, stride_pn, BLOCK_N)
    # the row's rank table: [rank] the rejected child, [n + rank] the total S after it
    table = table_ptr + b * stride_table
    q_base = draft_ptr + b * stride_qb

    seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)

    out_vec, nodes_vec, cur, level, alive = _start_walk(lanes, BLOCK_N)
    final = tl.full((), 0, tl.int64)
    while alive:
        p_row = target_ptr + b * stride_tb + cur * stride_tn
        total = tl.full((), 0, tl.int64)  # S after the last rejection, meaningful once rank > 0
        rank = tl.full((), 0, tl.int64)  # sibling rank of the child being tried = siblings rejected so far
        accepted = tl.full((), -1, tl.int64)
        # no child is tried at depth max_depth (the bonus)
        child = tl.where(level < max_depth, _next_child(par, lanes, cur, cur, n), n)
        while child < n:
            x = tl.sum(tl.where(lanes == child, tok, 0), axis=0)
            in_range = (x >= 0) & (x < vocab)
            safe_x = tl.where(in_range, x, 0)  # never address outside the row
            p_x = tl.load(p_row + safe_x, mask=in_range, other=0.0).to(tl.float32).to(tl.float64)
            q_x = tl.load(q_base + child * stride_qn + safe_x, mask=in_range, other=0.0).to(tl.float32).to(tl.float64)
            r_x = tl.full((), 0.0, tl.float64)
            if rank > 0:  # R(x) <= 2^40 is exact in float64
                r_x = _residual_at_token(p_row, q_base, stride_qn, table, n, rank, safe_x, in_range,
                                         lanes).to(tl.float64)
            u = _accept_uniform(uniforms_ptr, b, child, stride_ub, stride_un, seed_b, row_key, offset, level, rank,
                                RANDOM)
            first_rule = u * q_x < p_x
            later_rule = (u * q_x) * total.to(tl.float64) < r_x
            accept = in_range & tl.where(rank > 0, later_rule, first_rule)
            if accept:
                accepted = child
                child = tl.full((), 0, tl.int64) + n  # stop trying siblings
            else:
                # every thread is done with the table's earlier entries (the last node's
                # passes) before one rewrites them; the entry is stored before any reads it
                tl.debug_barrier()
                tl.store(table + rank, child)
                tl.debug_barrier()
                total = _residual_total(p_row, q_base, stride_qn, table, n, rank + 1, vocab, BLOCK_V)
                # read only by the passes after the next rejection (behind its barriers): the
                # tests and the draw use the running `total` for the last rank
                tl.store(table + n + rank, total)
                rank += 1
                child = _next_child(par, lanes, cur, child, n)
        moving = accepted >= 0
        if moving:
            out_vec, nodes_vec = _descend(out_vec, nodes_vec, tok, lanes, accepted, level)
            cur = accepted
            level += 1
        else:
            # final draw: from R (when not empty), else from p, else id 0
            u_final = _final_uniform(uniforms_ptr, b, stride_ub, seed_b, row_key, offset, level, RANDOM)
            use_r = (rank > 0) & (total > 0)
            if use_r:
                final = _draw_residual(p_row, q_base, stride_qn, table, n, rank, draw_threshold(u_final, total),
                                       vocab, BLOCK_V)
                final = tl.minimum(final, vocab - 1)  # threshold < S: only guards the id range
            else:
                final = _draw_from_p(p_row, u_final, vocab, BLOCK_V)
            out_vec = tl.where(lanes == level, final, out_vec)
        alive = moving
    tl.store(num_acc_ptr + b, level)
    _store_path(out_ptr, nodes_ptr, out_vec, nodes_vec, lanes, b, stride_ob, stride_nb, max_depth + 1, BLOCK_N)


# ------------------------------------------------------------------ sampled siblings (without replacement)
# siblings="without_replacement" (reference `_without_replacement`): every child of node v was
# drawn from the one row q = draft[b, v] without replacement. The rank table of the row holds,
# per rejected rank i, [i] the rejected token x_i and [n + i] the float64 scale c_i = S / T'
# (its bits; rank 0 has none) used at that rank. R after `count` rejections is recomputed from p,
# q and these scalars: R = to_weights(p - q), then for i = 1..count-1, R <- max(0, R - floor(c_i *
# Q)) off the tokens x_0..x_{i-1}. One q row for all siblings: a rejection's pass reads p and q
# once, whatever the rank (the independent rule reads k + 1 rows at rank k).

CUT_CAP_F64: tl.constexpr = tl.constexpr(2.0**41)  # CUT_CAP as float64, applied before the cast


@triton.jit
def _wr_residual_at(p_row, q_row, table, n, count, offs, m):
    """(R, Q) at ids `offs` after `count` (>= 1) rejected siblings; masked lanes weigh 0."""
    p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
    q = tl.load(q_row + offs, mask=m, other=0.0).to(tl.float32)
    q_weight = to_weights(q)
    r = to_weights(p - q)
    removed = offs < 0  # all False
    for i in range(1, count):
        removed = removed | (offs == tl.load(table + i - 1))  # q_i is 0 on the tokens rejected before
        scale = tl.load(table + n + i).to(tl.float64, bitcast=True)
        # >= 0: the truncating cast is the floor; capped (R <= 2^40 < CUT_CAP, so a capped cut
        # empties R as the uncapped one would) so that removed lanes, where Q may exceed T', cast safely
        cut = tl.minimum(scale * q_weight.to(tl.float64), CUT_CAP_F64).to(tl.int64)
        r = tl.where(removed, r, tl.maximum(r - cut, 0))
    return r, q_weight


@triton.jit
def _wr_totals(p_row, q_row, table, n, count, vocab, BLOCK_V: tl.constexpr):
    """(S, T): the residual's total after `count` rejections and sum_v Q(v), one pass."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    total = tl.full((), 0, tl.int64)
    q_total = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        r, q_weight = _wr_residual_at(p_row, q_row, table, n, count, offs, offs < vocab)
        total += tl.sum(r, axis=0)
        q_total += tl.sum(q_weight, axis=0)
    return total, q_total


@triton.jit
def _wr_draw(p_row, q_row, table, n, count, threshold, vocab, BLOCK_V: tl.constexpr):
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    count_below = tl.full((), 0, tl.int64)
    carry = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK_V):
        offs = start + lanes
        m = offs < vocab
        w, _ = _wr_residual_at(p_row, q_row, table, n, count, offs, m)
        count_below += count_at_or_below(w, carry, threshold, m)
        carry += tl.sum(w, axis=0)
    return count_below


@triton.jit
def _wr_test_later(p_x, q_x, q_weight_x, u, table, n, rank, total, q_left, lanes):
    """The test of a real child x at rank >= 1: u * (c * Q(x)) < R(x), c = S / T'. x is no
    rejected token, so every later rank cut it: R(x) = max(0, R_1(x) - sum_i min(cut_i, CAP)),
    loop-free over the BLOCK_N lanes (lane i = rank i), as `_residual_at_token`."""
    later = (lanes >= 1) & (lanes < rank)
    scales = tl.load(table + n + lanes, mask=later, other=0).to(tl.float64, bitcast=True)
    cuts = tl.minimum(scales * q_weight_x.to(tl.float64), CUT_CAP_F64).to(tl.int64)  # masked lanes: 0
    r_x = tl.maximum(to_weights(p_x - q_x) - tl.sum(cuts, axis=0), 0).to(tl.float64)  # <= 2^40: exact
    scale = total.to(tl.float64) / q_left.to(tl.float64)
    return u * (scale * q_weight_x.to(tl.float64)) < r_x, scale


@triton.jit(do_not_specialize=_TREE_INTS + ["seed", "stride_kb", "stride_ub", "stride_table"])
def _tree_rejection_wr_kernel(
        target_ptr, draft_ptr, tok_ptr, par_ptr, uniforms_ptr, seeds_ptr, offsets_ptr, table_ptr,
        out_ptr, num_acc_ptr, nodes_ptr, seed, n, vocab, max_depth,
        stride_tb, stride_tn, stride_qb, stride_qn, stride_kb, stride_kn, stride_pb, stride_pn,
        stride_ub, stride_un, stride_s, stride_o, stride_ob, stride_nb, stride_table,
        RANDOM: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lanes, par, tok = _load_tree(tok_ptr, par_ptr, b, n, stride_kb, stride_kn, stride_pb, stride_pn, BLOCK_N)
    table = table_ptr + b * stride_table
    seed_b, row_key, offset = row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM, HAS_OFFSETS)

    out_vec, nodes_vec, cur, level, alive = _start_walk(lanes, BLOCK_N)
    while alive:
        p_row = target_ptr + b * stride_tb + cur * stride_tn
        q_row = draft_ptr + b * stride_qb + cur * stride_qn  # the one q all of cur's children came from
        total = tl.full((), 0, tl.int64)  # S after the last rejection, meaningful once rank > 0
        q_left = tl.full((), 0, tl.int64)  # T' = sum of Q off the rejected tokens, once rank > 0
        rank = tl.full((), 0, tl.int64)  # real siblings rejected so far
        accepted = tl.full((), -1, tl.int64)
        child = tl.where(level < max_depth, _next_child(par, lanes, cur, cur, n), n)
        while child < n:
            x = tl.sum(tl.where(lanes == child, tok, 0), axis=0)
            in_range = (x >= 0) & (x < vocab)
            safe_x = tl.where(in_range, x, 0)  # never address outside the row
            p_x = tl.load(p_row + safe_x, mask=in_range, other=0.0).to(tl.float32)
            q_x = tl.load(q_row + safe_x, mask=in_range, other=0.0).to(tl.float32)
            q_weight_x = to_weights(q_x)
            rejected_toks = tl.load(table + lanes, mask=lanes < rank, other=-1)
            repeated = tl.max(((rejected_toks == x) & (lanes < rank)).to(tl.int32), axis=0) > 0
            if in_range & (q_weight_x > 0) & ~repeated:  # else q_j could not have drawn x: skipped
                u = _accept_uniform(uniforms_ptr, b, child, stride_ub, stride_un, seed_b, row_key, offset, level,
                                    rank, RANDOM)
                accept = u * q_x.to(tl.float64) < p_x.to(tl.float64)
                scale = tl.full((), 0.0, tl.float64)
                if rank > 0:
                    accept, scale = _wr_test_later(p_x, q_x, q_weight_x, u, table, n, rank, total, q_left, lanes)
                if accept:
                    accepted = child
                    child = tl.full((), 0, tl.int64) + n  # stop trying siblings
                else:
                    # every thread is done with the table's earlier entries before one is
                    # rewritten; the entries are stored before the pass reads them
                    tl.debug_barrier()
                    tl.store(table + rank, x)
                    tl.store(table + n + rank, scale.to(tl.int64, bitcast=True))
                    tl.debug_barrier()
                    total, q_total = _wr_totals(p_row, q_row, table, n, rank + 1, vocab, BLOCK_V)
                    q_left = tl.where(rank == 0, q_total, q_left) - q_weight_x
                    rank += 1
                    child = _next_child(par, lanes, cur, child, n)
            else:
                child = _next_child(par, lanes, cur, child, n)
        moving = accepted >= 0
        if moving:
            out_vec, nodes_vec = _descend(out_vec, nodes_vec, tok, lanes, accepted, level)
            cur = accepted
            level += 1
        else:
            u_final = _final_uniform(uniforms_ptr, b, stride_ub, seed_b, row_key, offset, level, RANDOM)
            if (rank > 0) & (total > 0):
                final = _wr_draw(p_row, q_row, table, n, rank, draw_threshold(u_final, total), vocab, BLOCK_V)
                final = tl.minimum(final, vocab - 1)  # threshold < S: only guards the id range
            else:
                final = _draw_from_p(p_row, u_final, vocab, BLOCK_V)
            out_vec = tl.where(lanes == level, final, out_vec)
        alive = moving
    tl.store(num_acc_ptr + b, level)
    _store_path(out_ptr, nodes_ptr, out_vec, nodes_vec, lanes, b, stride_ob, stride_nb, max_depth + 1, BLOCK_N)


# ------------------------------------------------------------------ launchers

def _block_v(vocab: int, block_v: int) -> int:
    return min(block_v, max(16, triton.next_power_of_2(vocab)))


def _use_split_greedy(batch: int, n: int, max_depth: int) -> bool:
    """Static choice of tree_greedy_verify's kernel (see SPLIT_ROWS_PER_LEVEL)."""
    return batch * n <= SPLIT_ROWS_PER_LEVEL * (max_depth + 1)


def _launch_greedy(target_logits, tree_tokens, parents, *, max_depth: int, block_v: int = BLOCK_V,
                   split: bool | None = None, tiles_per_program: int = TILES_PER_PROGRAM,
                   max_splits: int = MAX_SPLITS):
    batch, n = tree_tokens.shape
    vocab = target_logits.shape[-1]
    device = tree_tokens.device
    out_tokens, num_accepted, accepted_nodes = tree_outputs(tree_tokens, max_depth)
    if batch == 0:
        return out_tokens, num_accepted, accepted_nodes
    strides = (target_logits.stride(0), target_logits.stride(1), tree_tokens.stride(0), tree_tokens.stride(1),
               parents.stride(0), parents.stride(1), out_tokens.stride(0), accepted_nodes.stride(0))
    if split is None:
        split = _use_split_greedy(batch, n, max_depth)
    with device_scope(device):
        if not split:
            _tree_greedy_kernel[(batch,)](
                target_logits, tree_tokens, parents, out_tokens, num_accepted, accepted_nodes, n, vocab, max_depth,
                *strides, BLOCK_N=triton.next_power_of_2(n), BLOCK_V=_block_v(vocab, block_v))
            return out_tokens, num_accepted, accepted_nodes
        block_v, tiles, num_splits = _split_plan(vocab, block_v, tiles_per_program, max_splits)
        part_val = torch.empty(batch * n, num_splits, dtype=torch.float32, device=device)
        part_idx = torch.empty(batch * n, num_splits, dtype=torch.int64, device=device)
        tickets = zeroed_counters(device, batch)
        _tree_greedy_split_kernel[(batch * n, num_splits)](
            target_logits, tree_tokens, parents, part_val, part_idx, tickets, out_tokens, num_accepted,
            accepted_nodes, n, vocab, max_depth, num_splits, *strides, BLOCK_N=triton.next_power_of_2(n),
            BLOCK_V=block_v, TILES=tiles, BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    return out_tokens, num_accepted, accepted_nodes


RANK_TABLE_COLUMNS = 2  # per node slot of a row: the rejected child of that rank, the total S after it


def rejection_plan(batch: int, n: int, vocab: int) -> dict:
    """Launch plan of `tree_rejection_sample`: the grid and the one per-call buffer.

    One program per row (grid (B,)). The only buffer is the rank table, int64 [B, 2 * N]
    (for each rejected sibling rank: the child and the residual total after it), so the
    memory depends on (B, N) and never on V: the residual weights are recomputed from p
    and the rejected siblings' q rows instead of being stored.
    """
    return dict(grid=(batch,), table_shape=(batch, RANK_TABLE_COLUMNS * n),
                table_bytes=batch * RANK_TABLE_COLUMNS * n * 8)


def _launch_rejection(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None, seed=None,
                      offsets=None, siblings: str = "independent", block_v: int = BLOCK_V):
    batch, n = tree_tokens.shape
    vocab = target_probs.shape[-1]
    device = tree_tokens.device
    out_tokens, num_accepted, accepted_nodes = tree_outputs(tree_tokens, max_depth)
    if batch == 0:
        return out_tokens, num_accepted, accepted_nodes
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    has_offsets = offsets is not None and mode != UNIFORMS.value
    plan = rejection_plan(batch, n, vocab)
    # every entry is stored before it is read (by the program that owns the row): no zeroing
    table = torch.empty(plan["table_shape"], dtype=torch.int64, device=device)
    placeholder = tree_tokens  # any tensor on the device; never read when its flag is off
    uniforms_t = placeholder if uniforms is None else uniforms
    seeds_t = placeholder if seeds is None else seeds
    offsets_t = offsets if has_offsets else placeholder
    kernel = _tree_rejection_wr_kernel if siblings == "without_replacement" else _tree_rejection_kernel
    with device_scope(device):
        kernel[plan["grid"]](
            target_probs, draft_probs, tree_tokens, parents, uniforms_t, seeds_t, offsets_t, table,
            out_tokens, num_accepted, accepted_nodes, seed_int, n, vocab, max_depth,
            target_probs.stride(0), target_probs.stride(1), draft_probs.stride(0), draft_probs.stride(1),
            tree_tokens.stride(0), tree_tokens.stride(1), parents.stride(0), parents.stride(1),
            uniforms_t.stride(0) if uniforms is not None else 0, uniforms_t.stride(1) if uniforms is not None else 0,
            seeds_t.stride(0) if seeds is not None else 0, offsets_t.stride(0) if has_offsets else 0,
            out_tokens.stride(0), accepted_nodes.stride(0), table.stride(0),
            RANDOM=mode, HAS_OFFSETS=has_offsets, BLOCK_N=triton.next_power_of_2(n),
            BLOCK_V=_block_v(vocab, block_v))
    return out_tokens, num_accepted, accepted_nodes


def tree_greedy_verify(target_logits, tree_tokens, parents, *, max_depth: int):
    """Triton `tree_greedy_verify` on validated inputs (see specdec_kernels.ops.tree_greedy_verify)."""
    return _launch_greedy(target_logits, tree_tokens, parents, max_depth=max_depth)


def tree_rejection_sample(target_probs, draft_probs, tree_tokens, parents, *, max_depth: int, uniforms=None,
                          seed=None, offsets=None, siblings: str = "independent"):
    """Triton `tree_rejection_sample` on validated inputs (see specdec_kernels.ops.tree_rejection_sample)."""
    return _launch_rejection(target_probs, draft_probs, tree_tokens, parents, max_depth=max_depth,
                             uniforms=uniforms, seed=seed, offsets=offsets, siblings=siblings)


register("tree_greedy_verify", "triton", tree_greedy_verify)
register("tree_rejection_sample", "triton", tree_rejection_sample)
