"""Triton backends of `tree_greedy_verify` and `tree_rejection_sample` (token trees; the sampling
kernel, split over V, is tree_verify_sampling.py's).

One launch per call, no host sync and no data-dependent allocation. A row is a serial
walk from the root, one level per step, and the levels depend on each other (the next
node is the child accepted at this one), so one program keeps the walk in registers: the
row's `parents` and `tree_tokens` as BLOCK_N = next_power_of_2(N) lanes (`_tree_walk`), the
current node, and the accepted path (nodes and tokens, at most N entries). The outputs are
stored once at the end (the path, then -1 up to max_depth + 1).

tree_greedy_verify has two kernels, chosen from (B, N, max_depth) only (SPLIT_ROWS_PER_LEVEL):
`_tree_greedy_kernel`, one program per row streaming each visited node's row, or
`_tree_greedy_split_kernel`, grid (B*N, splits), which computes every node's argmax split over V in
parallel and lets the row's last ticket walk the tree in registers. Comparisons only: bit-exact.
"""

import torch
import triton
import triton.language as tl

from ..common.registry import register
from ..common.workspace import zeroed_counters
from ._launch import device_scope, tree_outputs
from ._split_plans import STATS_MAX_SPLITS, STATS_TILES, stats_plan
from ._split_v_stats import chunk_stats, merge_argmax
from ._tickets import last_ticket, reset_ticket
from ._tree_walk import load_tree
from .tree_verify_sampling import launch_limits as rejection_limits
from .tree_verify_sampling import launch_rejection as _launch_rejection

BLOCK_V = 1024  # vocabulary elements per tile (power of two)
# tree_greedy_verify either reads every node the walk could reach, split over V, in parallel
# (the CUDA kernel's way), or has one program per row walk and stream only the visited rows,
# one after another at the speed of one SM. The parallel read wins while B * N stays below
# (max_depth + 1) times the ratio of one visited row's walk time to one row's share of the
# parallel read. The H100 rows (bench/results/gpu_checks_h100_2026-11-27/call3_verify_kv,
# V 128256 bf16) give 85-115 us per visited row for the walk against 0.12 us per row (+7 us)
# for the parallel read: about 650 rows per level even when every row rejects at the root.
# The old guess, 32, sent B = 64 to the walk: 327 us against CUDA's 46.
# tests/test_triton_tree_greedy_split_rule.py derives the ratio from that file again.
SPLIT_ROWS_PER_LEVEL = 640


# ------------------------------------------------------------------ device helpers

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
def _start_walk(lanes, BLOCK_N: tl.constexpr):
    """(out_vec, nodes_vec, cur, level, alive) of a walk at the root: no tokens yet, node 0."""
    out_vec = tl.full((BLOCK_N,), -1, tl.int64)
    nodes_vec = tl.where(lanes == 0, 0, out_vec)
    cur = tl.full((), 0, tl.int64)
    level = tl.full((), 0, tl.int64)
    alive = tl.full((), 1, tl.int1)
    return out_vec, nodes_vec, cur, level, alive


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


# Not specialised, in both kernels (tests/test_triton_recompiles.py): the ints that follow the
# tree size N or its depth (n, max_depth, the strides N of the token / parent rows, max_depth + 1
# of the outputs): Triton would compile a variant for the value 1 and for multiples of 16
# whenever the tree shape changes. The logits strides N * V keep their 16-alignment for every N
# when V has it. N enters the keys only through BLOCK_N = next_pow2(N).
_TREE_INTS = ["n", "max_depth", "stride_pb", "stride_ob", "stride_nb"]


@triton.jit(do_not_specialize=_TREE_INTS + ["stride_tb"])
def _tree_greedy_kernel(logits_ptr, tok_ptr, par_ptr, out_ptr, num_acc_ptr, nodes_ptr, n, vocab, max_depth,
                        stride_lb, stride_ln, stride_tb, stride_tn, stride_pb, stride_pn, stride_ob, stride_nb,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per row: the walk streams each visited node's row (reads only those)."""
    b = tl.program_id(0).to(tl.int64)
    lanes, par, tok = load_tree(tok_ptr, par_ptr, b, n, stride_tb, stride_tn, stride_pb, stride_pn, BLOCK_N)
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
        best_val, best_idx, _, _ = chunk_stats(logits_ptr + b * stride_lb + node * stride_ln,
                                                split * (BLOCK_V * TILES), vocab, 0.0, 0, BLOCK_V, TILES,
                                                True, False, False)
        tl.store(part_val_ptr + row * num_splits + split, best_val)
        tl.store(part_idx_ptr + row * num_splits + split, best_idx)
    if last_ticket(tickets_ptr + b, n * num_splits):  # every program counts, read or not
        lanes, par, tok = load_tree(tok_ptr, par_ptr, b, n, stride_tb, stride_tn, stride_pb, stride_pn, BLOCK_N)
        readable = (lanes < n) & ((lanes == 0) | ((par >= 0) & (par < lanes)))  # as above
        _, top, _, _ = merge_argmax(part_val_ptr, part_idx_ptr, b * n + lanes, readable, num_splits, vocab, BLOCK_S)
        _greedy_walk(logits_ptr, par, tok, lanes, top, b, n, vocab, max_depth, stride_lb, stride_ln, out_ptr,
                     num_acc_ptr, nodes_ptr, stride_ob, stride_nb, BLOCK_N, BLOCK_V, True)
        reset_ticket(tickets_ptr + b)


# ------------------------------------------------------------------ launchers

def _block_v(vocab: int, block_v: int) -> int:
    return min(block_v, max(16, triton.next_power_of_2(vocab)))


def _use_split_greedy(batch: int, n: int, max_depth: int) -> bool:
    """Static choice of tree_greedy_verify's kernel (see SPLIT_ROWS_PER_LEVEL)."""
    return batch * n <= SPLIT_ROWS_PER_LEVEL * (max_depth + 1)


def _launch_greedy(target_logits, tree_tokens, parents, *, max_depth: int, block_v: int = BLOCK_V,
                   split: bool | None = None, tiles_per_program: int = STATS_TILES,
                   max_splits: int = STATS_MAX_SPLITS):
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
        block_v, tiles, num_splits = stats_plan(vocab, block_v, tiles_per_program, max_splits)
        part_val = torch.empty(batch * n, num_splits, dtype=torch.float32, device=device)
        part_idx = torch.empty(batch * n, num_splits, dtype=torch.int64, device=device)
        tickets = zeroed_counters(device, batch)
        _tree_greedy_split_kernel[(batch * n, num_splits)](
            target_logits, tree_tokens, parents, part_val, part_idx, tickets, out_tokens, num_accepted,
            accepted_nodes, n, vocab, max_depth, num_splits, *strides, BLOCK_N=triton.next_power_of_2(n),
            BLOCK_V=block_v, TILES=tiles, BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
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
register("tree_rejection_sample", "triton", tree_rejection_sample, limits=rejection_limits)
