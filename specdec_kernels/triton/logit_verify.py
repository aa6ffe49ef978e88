"""Triton backends of the logits verification ops: `greedy_verify`, `relaxed_verify`
(SpecDec), `bild_verify` (BiLD rollback) and `max_prob`.

One launch per call, split over V (the usual speculative-decoding batch has few rows and
a large V, so one program per row would leave the GPU idle). No host sync, no
data-dependent allocation; every logits row the contract needs is read once.

`_chain_verify_kernel`, grid (B*(g+1), num_splits), stores per chunk the argmax partial, the count
of ids ranking ahead of the draft (relaxed: exact integer sums) or the chunk's (max, sum exp) (bild);
the program that draws its batch row's last ticket merges every position at once ([g+1, splits])
and finds the first rejection with no serial walk. greedy and relaxed are comparisons and counts,
bit-exact; bild_verify and max_prob sum lse in another order than torch.logsumexp (docs/ops.md,
"Numerics").
"""

import torch
import triton
import triton.language as tl

from ..common.registry import register
from ..common.workspace import zeroed_counters
from . import _launch
from ._launch import chain_launch, device_scope
from ._split_plans import BLOCK_V, STATS_MAX_SPLITS, STATS_TILES, stats_plan
from ._split_v_stats import chunk_stats, merge_argmax, merge_lse
from ._tickets import last_ticket, load_partials, reset_ticket

# accept rules of _chain_verify_kernel (constexpr so the kernel can branch on them)
GREEDY: tl.constexpr = tl.constexpr(0)
RELAXED: tl.constexpr = tl.constexpr(1)
BILD: tl.constexpr = tl.constexpr(2)


@triton.jit
def _draft_logits(logits_ptr, draft_ptr, b, p, n, vocab, stride_b, stride_p, stride_db, stride_dg):
    """(draft id d, its fp32 logit l_x, d in [0, V)) at positions p (scalar or vector) of
    row b; positions >= n have no draft (d = -1, l_x = -inf). NaN counts as -inf."""
    has_draft = p < n
    d = tl.load(draft_ptr + b * stride_db + p * stride_dg, mask=has_draft, other=-1)
    d_ok = has_draft & (d >= 0) & (d < vocab)
    lx = tl.load(logits_ptr + b * stride_b + p * stride_p + tl.where(d_ok, d, 0), mask=d_ok,
                 other=float("-inf")).to(tl.float32)
    return d, tl.where(lx != lx, float("-inf"), lx), d_ok


@triton.jit
def _accept_row(logits_ptr, draft_ptr, part_val_ptr, part_idx_ptr, part_cnt_ptr, part_sum_ptr, out_ptr,
                num_acc_ptr, b, n, g, vocab, num_splits, stride_b, stride_p, stride_db, stride_dg, stride_ob,
                top_beta, tau, threshold, MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the partials of every position 0..n of row b, accept, store the outputs."""
    num_pos = g + 1
    p = tl.arange(0, BLOCK_P)  # every position 0..g of the row at once
    rows = b * num_pos + p
    used = p <= n  # positions past n were never written
    top_val, top, vals, mask = merge_argmax(part_val_ptr, part_idx_ptr, rows, used, num_splits, vocab, BLOCK_S)
    d, lx, d_ok = _draft_logits(logits_ptr, draft_ptr, b, p, n, vocab, stride_b, stride_p, stride_db, stride_dg)
    if MODE == GREEDY:
        ok = d == top
    elif MODE == RELAXED:
        ahead, _ = load_partials(part_cnt_ptr, rows, used, num_splits, 0, BLOCK_S)
        ahead = tl.sum(ahead, axis=1)
        ok = (ahead < top_beta) & ((d == top) | ((top_val - lx) < tau))
    else:
        sums, _ = load_partials(part_sum_ptr, rows, used, num_splits, 0.0, BLOCK_S)
        _, lse = merge_lse(vals, sums, mask, 1)
        ok = (lse - lx) <= threshold
    ok = ok & d_ok  # d_ok is false at p >= n
    accepted = tl.min(tl.where(ok, BLOCK_P, p), axis=0)  # the first rejection (or the bonus position)
    final = tl.sum(tl.where(p == accepted, top, 0), axis=0)
    # accepted drafts, then the argmax at the first rejection or the bonus argmax, then padding
    tok = tl.where(p < accepted, d, tl.where(p == accepted, final, -1))
    tl.store(out_ptr + b * stride_ob + p, tok, mask=p < num_pos)
    tl.store(num_acc_ptr + b, accepted.to(tl.int64))


# The ints that follow the draft length (g; the strides g of draft_tokens and g + 1 of the
# outputs) are not specialised: Triton would compile a variant for the value 1 and for
# multiples of 16, i.e. mid-decoding when g adapts (tests/test_triton_recompiles.py). The
# logits strides keep it: (g + 1) * V and V are multiples of 16 for every g when V is, and
# that alignment vectorises the row loads. g enters the key only through BLOCK_P.
@triton.jit(do_not_specialize=["g", "stride_db", "stride_ob"])
def _chain_verify_kernel(logits_ptr, draft_ptr, counts_ptr, part_val_ptr, part_idx_ptr, part_cnt_ptr,
                         part_sum_ptr, tickets_ptr, out_ptr, num_acc_ptr, g, vocab, num_splits, stride_b, stride_p,
                         stride_db, stride_dg, stride_c, stride_ob, top_beta, tau, threshold,
                         MODE: tl.constexpr, HAS_COUNTS: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row = b * (g+1) + position
    split = tl.program_id(1).to(tl.int64)
    b = row // (g + 1)
    p = row % (g + 1)
    if HAS_COUNTS:
        n = tl.load(counts_ptr + b * stride_c).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), g)
    else:
        n = tl.full((), 0, tl.int64) + g
    last = tl.full((), 0, tl.int1)
    if p <= n:  # positions past the row's drafts are never read, and take no ticket
        if MODE == RELAXED:
            d, lx, _ = _draft_logits(logits_ptr, draft_ptr, b, p, n, vocab, stride_b, stride_p, stride_db, stride_dg)
        else:
            d = tl.full((), -1, tl.int64)
            lx = tl.full((), float("-inf"), tl.float32)
        best_val, best_idx, total, ahead = chunk_stats(
            logits_ptr + b * stride_b + p * stride_p, split * (BLOCK_V * TILES), vocab, lx, d,
            BLOCK_V, TILES, True, MODE == RELAXED, MODE == BILD)
        out = row * num_splits + split
        tl.store(part_val_ptr + out, best_val)
        tl.store(part_idx_ptr + out, best_idx)
        if MODE == RELAXED:
            tl.store(part_cnt_ptr + out, ahead)
        if MODE == BILD:
            tl.store(part_sum_ptr + out, total)
        last = last_ticket(tickets_ptr + b, (n + 1) * num_splits)
    if last:
        _accept_row(logits_ptr, draft_ptr, part_val_ptr, part_idx_ptr, part_cnt_ptr, part_sum_ptr, out_ptr,
                    num_acc_ptr, b, n, g, vocab, num_splits, stride_b, stride_p, stride_db, stride_dg, stride_ob,
                    top_beta, tau, threshold, MODE, BLOCK_P, BLOCK_S)
        reset_ticket(tickets_ptr + b)


# `inner` is the row count of a [rows, V] input (B, which shrinks as rows finish) or the
# positions g + 1 of a [B, g + 1, V] one: not specialised (tests/test_triton_recompiles.py).
@triton.jit(do_not_specialize=["inner"])
def _max_prob_kernel(logits_ptr, part_val_ptr, part_sum_ptr, tickets_ptr, out_ptr, vocab, inner, num_splits,
                     stride_outer, stride_inner, BLOCK_V: tl.constexpr, TILES: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row = outer * inner + inner index
    split = tl.program_id(1).to(tl.int64)
    base = logits_ptr + (row // inner) * stride_outer + (row % inner) * stride_inner
    best_val, _, total, _ = chunk_stats(base, split * (BLOCK_V * TILES), vocab, 0.0, 0, BLOCK_V, TILES,
                                         False, False, True)
    tl.store(part_val_ptr + row * num_splits + split, best_val)
    tl.store(part_sum_ptr + row * num_splits + split, total)
    if last_ticket(tickets_ptr + row, num_splits):
        s = tl.arange(0, BLOCK_S)
        mask = s < num_splits
        # ".cg": other programs wrote these; skip this SM's (possibly stale) L1 (see _tickets)
        vals = tl.load(part_val_ptr + row * num_splits + s, mask=mask, other=float("-inf"), cache_modifier=".cg")
        sums = tl.load(part_sum_ptr + row * num_splits + s, mask=mask, other=0.0, cache_modifier=".cg")
        top, lse = merge_lse(vals, sums, mask, 0)
        finite = tl.abs(top) < float("inf")
        prob = tl.exp(tl.where(finite, top, 0.0) - tl.where(finite, lse, 0.0))  # exp(max - lse), like the reference
        prob = tl.where(top == float("inf"), 1.0, tl.where(top == float("-inf"), 0.0, prob))
        tl.store(out_ptr + row, prob)
        reset_ticket(tickets_ptr + row)


def _float32(value: float) -> float:
    """`value` rounded to float32, as torch rounds a Python float compared to a float32 tensor."""
    return float(torch.tensor(value, dtype=torch.float32))


def _launch_chain(target_logits, draft_tokens, num_draft_tokens, *, mode: int, top_beta: int = 1,
                  tau: float = 0.0, threshold: float = 0.0, block_v: int = BLOCK_V,
                  tiles_per_program: int = STATS_TILES, max_splits: int = STATS_MAX_SPLITS):
    batch, g, vocab, device, out_tokens, num_accepted = chain_launch(target_logits, draft_tokens)
    if batch == 0:
        return out_tokens, num_accepted
    block_v, tiles, num_splits = stats_plan(vocab, block_v, tiles_per_program, max_splits)
    rows = batch * (g + 1)
    part_val = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
    part_idx = torch.empty(rows, num_splits, dtype=torch.int64, device=device)
    # rank counts (relaxed) and exp sums (bild) only when the rule reads them and there are drafts
    part_cnt = torch.empty(rows, num_splits, dtype=torch.int32, device=device) if mode == RELAXED.value else part_idx
    part_sum = torch.empty(rows, num_splits, dtype=torch.float32, device=device) if mode == BILD.value else part_val
    tickets = zeroed_counters(device, batch)
    counts = draft_tokens if num_draft_tokens is None else num_draft_tokens  # placeholder when absent
    with device_scope(device):
        _chain_verify_kernel[(rows, num_splits)](
            target_logits, draft_tokens, counts, part_val, part_idx, part_cnt, part_sum, tickets, out_tokens,
            num_accepted, g, vocab, num_splits, target_logits.stride(0), target_logits.stride(1),
            draft_tokens.stride(0), draft_tokens.stride(1),
            0 if num_draft_tokens is None else num_draft_tokens.stride(0), out_tokens.stride(0),
            min(top_beta, vocab + 1), _float32(tau), _float32(threshold),  # a rank is at most V - 1
            MODE=mode, HAS_COUNTS=num_draft_tokens is not None, BLOCK_V=block_v, TILES=tiles,
            BLOCK_P=max(2, triton.next_power_of_2(g + 1)), BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    return out_tokens, num_accepted


def greedy_verify(target_logits, draft_tokens, *, num_draft_tokens=None):
    """Triton `greedy_verify` on validated inputs (see specdec_kernels.ops.greedy_verify)."""
    return _launch_chain(target_logits, draft_tokens, num_draft_tokens, mode=GREEDY.value)


def relaxed_verify(target_logits, draft_tokens, *, top_beta: int, tau: float, num_draft_tokens=None):
    """Triton `relaxed_verify` on validated inputs (see specdec_kernels.ops.relaxed_verify)."""
    return _launch_chain(target_logits, draft_tokens, num_draft_tokens, mode=RELAXED.value, top_beta=top_beta, tau=tau)


def bild_verify(target_logits, draft_tokens, *, rollback_threshold: float, num_draft_tokens=None):
    """Triton `bild_verify` on validated inputs (see specdec_kernels.ops.bild_verify)."""
    return _launch_chain(target_logits, draft_tokens, num_draft_tokens, mode=BILD.value, threshold=rollback_threshold)


def _launch_max_prob(logits, *, block_v: int = BLOCK_V, tiles_per_program: int = STATS_TILES,
                     max_splits: int = STATS_MAX_SPLITS):
    vocab = logits.shape[-1]
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    rows = out.numel()
    if rows == 0:
        return out
    # rows addressed as [outer, inner, V] with two strides: a view for 1-3 dims, and for
    # more dims a view when the leading dims collapse (reshape copies otherwise)
    if logits.dim() <= 2:
        rows3 = logits.reshape(1, -1, vocab)
    else:
        rows3 = logits.reshape(-1, logits.shape[-2], vocab)
    block_v, tiles, num_splits = stats_plan(vocab, block_v, tiles_per_program, max_splits)
    part_val = torch.empty(rows, num_splits, dtype=torch.float32, device=logits.device)
    part_sum = torch.empty(rows, num_splits, dtype=torch.float32, device=logits.device)
    tickets = zeroed_counters(logits.device, rows)
    # one outer row: its stride (rows * V, which follows B) is never used; 0 keeps it out of the key
    stride_outer = rows3.stride(0) if rows3.shape[0] > 1 else 0
    with device_scope(logits.device):
        _max_prob_kernel[(rows, num_splits)](
            rows3, part_val, part_sum, tickets, out, vocab, rows3.shape[1], num_splits, stride_outer,
            rows3.stride(1), BLOCK_V=block_v, TILES=tiles, BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    return out


def max_prob(logits):
    """Triton `max_prob` on validated inputs (see specdec_kernels.ops.max_prob)."""
    return _launch_max_prob(logits)


def chain_limits(sizes: dict) -> str | None:
    """The registry's `limits`: grid x holds one program per scored row, B * (g + 1)."""
    return _launch.grid_x_refusal(sizes["B"] * (sizes["G"] + 1), "B * (g + 1)")


def max_prob_limits(sizes: dict) -> str | None:
    return _launch.grid_x_refusal(sizes["R"], "rows")


register("greedy_verify", "triton", greedy_verify, limits=chain_limits)
register("relaxed_verify", "triton", relaxed_verify, limits=chain_limits)
register("bild_verify", "triton", bild_verify, limits=chain_limits)
register("max_prob", "triton", max_prob, limits=max_prob_limits)
