"""No Triton kernel recompiles as rows finish (the batch size B shrinks) or the draft length g
adapts: over a sweep of B and g, each kernel's compile key (constexprs, the specialisation
of its int and pointer arguments, launch options) changes only through the buckets that the
table below allows, each with its reason.

tests/triton_compile_keys.py makes every launch the decoding loop's ops make, through
Triton's own launch path for an sm_90 target with the stand-in driver of
tests/triton_compile_targets.py, and records the key Triton computes right before it would
compile (nothing compiles or runs; a few seconds). Run without TRITON_INTERPRET, in a
subprocess: under the interpreter nothing is specialised.

What the rules mean for a kernel (per op config, i.e. fixed mode flags, dtypes and layout):
- over B at a fixed g, the key is the same for every B, except where the table allows a few
  plan regimes (`b_regimes`): then each key holds for one contiguous range of B (a plan that
  switches at thresholds, never back and forth), at most `b_regimes` of them;
- over g, the key is a function of the documented bucket `g_bucket(g)` (e.g. the next power
  of two of g + 1): two draft lengths in one bucket share the compiled kernel.
Ints that follow B or g (g itself, B * (g + 1), strides g and g + 1, split counts) are in
the kernels' `do_not_specialize`: Triton would otherwise compile a variant for the value 1
and for multiples of 16. The logits/probs strides (g + 1) * V keep their specialisation: they
are multiples of 16 for every g when V is (Llama's 32000 and 128256, Qwen2's 151936, the
sweep's), and their alignment lets the row loads vectorise. With a V that is not (GPT-2's
50257) a row stride is a multiple of 16 only where 16 divides g + 1 (g for draft rows, N for
trees): extra variants at those few g, accepted rather than losing the common case's aligned
loads (not swept here).

kv_rollback has no Triton backend (it is arithmetic on [B] lengths), so it is not here.
"""

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from test_triton_compile_targets import launched_kernels  # every *_kernel of the Triton modules

pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parents[1]


def np2(x: int) -> int:
    """triton.next_power_of_2 for x >= 1."""
    return 1 << (x - 1).bit_length()


@dataclass(frozen=True)
class Allowance:
    why: str
    g_bucket: Callable[[int], object] = lambda g: None  # the key may differ between buckets only
    b_regimes: int = 1  # distinct keys over B at one g (contiguous ranges of B)


# Per kernel: which compile-time parameters follow g (always a bucket) or B (a few plan
# regimes), and why. "g" is the op's draft length: drafts per row for chains, nodes N for
# trees and tree_attention, accepted path length - 1 for kv_compact, k for early_exit_topk.
ALLOWANCES = {
    "logit_verify._chain_verify_kernel": Allowance(
        "BLOCK_P = max(2, next_pow2(g + 1)): the lanes holding a row's g + 1 positions in the merge",
        g_bucket=lambda g: max(2, np2(g + 1))),
    "logit_verify._max_prob_kernel": Allowance(
        "nothing: the row count (B, or g + 1 of [B, g + 1, V] input) is a runtime int; the tile plan is V's"),
    "rejection_sampling._rejection_sample_kernel": Allowance(
        "BLOCK_G = max(2, next_pow2(g + 1)): a row's draft slots as lanes. The V-chunk plan, which follows B, "
        "is runtime ints (tiles per chunk, num_splits, with logits the target rows B * (g + 1)) and BLOCK_S is "
        "sized for V's largest split count",
        g_bucket=lambda g: max(2, np2(g + 1))),
    "block_verification._block_verify_kernel": Allowance(
        "BLOCK_G = max(2, next_pow2(g + 1)): a row's positions as lanes. The V-chunk plan over the B * (g + 1) "
        "rows is runtime ints (tiles, num_splits, row count) and BLOCK_S is sized for V's largest split count",
        g_bucket=lambda g: max(2, np2(g + 1))),
    "_softmax_stats._softmax_stats_kernel": Allowance(
        "nothing: g and the target row count B * (g + 1) are runtime; the statistics plan is V's"),
    "tree_verify._tree_greedy_kernel": Allowance(
        "BLOCK_N = next_pow2(N): the tree's nodes as lanes. tree_greedy_verify picks this kernel or the "
        "split one from B * N (SPLIT_ROWS_PER_LEVEL): each is compiled once, whichever B uses it",
        g_bucket=np2),
    "tree_verify._tree_greedy_split_kernel": Allowance(
        "BLOCK_N = next_pow2(N), as _tree_greedy_kernel", g_bucket=np2),
    "tree_verify_sampling._tree_rejection_kernel": Allowance(
        "BLOCK_N = next_pow2(N): the tree's nodes as lanes (both sibling rules: the constexpr WR). The V-chunk "
        "plan, which follows B, is runtime ints (chunks, tiles) and BLOCK_C is sized for V's largest chunk count",
        g_bucket=np2),
    "attention._split_kernel": Allowance(
        "g: BLOCK_T = max(16, next_pow2(N)) tail tile, DOUBLINGS = log2(BLOCK_T) ancestor squarings, "
        "BLOCK_M (N * group rows, pow2, capped) and the num_warps / num_stages it sets. "
        "B: DIRECT (one prefix split, no merge) once B * Hkv * M-blocks fill the SMs: 2 regimes; "
        "the split count itself is a runtime int",
        g_bucket=np2, b_regimes=2),
    "attention._merge_kernel": Allowance(
        "nothing: runs only while there are several splits; N, the split count and strides are runtime"),
    "kv_cache._kv_compact_kernel": Allowance(
        "g: BLOCK_A and BLOCK_M = next_pow2(g + 1) entries of the accepted path (BLOCK_M capped at 16). "
        "B: the column tiling (BLOCK_H x BLOCK_D, num_warps) splits heads, then head dim, by powers of two "
        "until B * 2L * column blocks reach TARGET_PROGRAMS: B = 1's tile for every B would launch up to 32x "
        "more, smaller programs at large B (tests/test_triton_kv_compact.py pins both plans). One regime per "
        "power of two of "
        "cdiv(TARGET_PROGRAMS, B * 2L) up to H * D / MIN_BLOCK_D column blocks: 6 with 4 layers, H = 8, D = 128",
        g_bucket=lambda g: np2(g + 1), b_regimes=6),
    "early_exit._split_topk_kernel": Allowance(
        "g (= k): K_PAD = max(2, next_pow2(k)) kept keys per row, k itself runtime. B: BLOCK_B = "
        "min(max(16, next_pow2(B)), 64) rows per program (the M of the tensor-core dot: 64 rows for one "
        "would waste 4x the MMA work and the registers of the smaller tiles): 3 regimes, B <= 16, <= 32, "
        "> 32; past 64 rows more B blocks, runtime",
        g_bucket=lambda k: max(2, np2(k)), b_regimes=3),
    "early_exit._normalize_kernel": Allowance(
        "B: BLOCK_B, the split kernel's rows per program (its three regimes); B and H are runtime",
        b_regimes=3),
    "early_exit._merge_kernel": Allowance(
        "BLOCK_C = max(16, next_pow2(most splits) * K_PAD): the candidates of a row; k runtime",
        g_bucket=lambda k: max(2, np2(k))),
}


@pytest.fixture(scope="module")
def sweep() -> tuple[dict, list, list]:
    """(variants by hash, launches, points) from tests/triton_compile_keys.py."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(ROOT / "tests/triton_compile_keys.py")], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    variants = {row["variant"]: row for row in rows if "constexprs" in row}
    launches = [row for row in rows if "op" in row and "kernel" in row]
    points = [row for row in rows if row.get("point")]
    return variants, launches, points


def difference(variants: dict, a: str, b: str) -> str:
    """What differs between two variants' keys, parameter by parameter."""
    va, vb = variants[a], variants[b]
    out = []
    for part in ("constexprs", "specialised", "options"):
        for name in sorted(set(va[part]) | set(vb[part])):
            x, y = va[part].get(name, "-"), vb[part].get(name, "-")
            if x != y:
                out.append(f"{part}.{name}: {x} vs {y}")
    return "; ".join(out) or "(only Triton-internal parts of the key)"


def by_group(launches) -> dict:
    """(kernel, op, config) -> {(B, g): set of variants}."""
    groups = defaultdict(lambda: defaultdict(set))
    for row in launches:
        groups[(row["kernel"], row["op"], row["config"])][(row["B"], row["g"])].add(row["variant"])
    return groups


def test_every_op_launches_and_every_kernel_is_in_the_table(sweep):
    _, launches, points = sweep
    launched = {(row["op"], row["config"], row["B"], row["g"]) for row in launches}
    silent = [p for p in points if (p["op"], p["config"], p["B"], p["g"]) not in launched]
    assert not silent, f"calls that launched no Triton kernel (another backend ran?): {silent[:5]}"
    assert {p["op"] for p in points} >= {
        "greedy_verify", "relaxed_verify", "bild_verify", "max_prob", "rejection_sample", "rejection_sample_logits",
        "tree_greedy_verify", "tree_rejection_sample", "tree_attention", "kv_compact", "early_exit_topk"}
    kernels = {row["kernel"] for row in launches}
    assert kernels == launched_kernels(), "a kernel no sweep reaches, or one the modules do not list"
    assert kernels <= set(ALLOWANCES), f"add these kernels to ALLOWANCES, with why: {kernels - set(ALLOWANCES)}"


def test_keys_do_not_follow_the_batch_size(sweep):
    """At each g, every B compiles the same variant, or (b_regimes > 1) one of a few plan
    regimes, each over one contiguous range of B."""
    variants, launches, _ = sweep
    failures = []
    for (kernel, op, config), points in sorted(by_group(launches).items()):
        allowed = ALLOWANCES[kernel].b_regimes
        for g in sorted({g for _, g in points}):
            runs = []  # consecutive (variant, [B...]) over increasing B
            for batch in sorted(b for b, gg in points if gg == g):
                (variant,) = points[(batch, g)]  # one launch of each kernel per call
                if runs and runs[-1][0] == variant:
                    runs[-1][1].append(batch)
                else:
                    runs.append((variant, [batch]))
            distinct = {variant for variant, _ in runs}
            if len(runs) > allowed or len(runs) != len(distinct):
                (va, ba), (vb, bb) = runs[0], runs[1]
                failures.append(f"{kernel} [{op}/{config}] g={g}: {len(distinct)} variants in {len(runs)} runs of B "
                                f"(allowed {allowed}), B={ba} vs B={bb}: {difference(variants, va, vb)}")
    assert not failures, "\n".join(failures)


def test_keys_follow_the_draft_length_only_through_buckets(sweep):
    """At each B, two draft lengths in one documented bucket compile the same variant."""
    variants, launches, _ = sweep
    failures = []
    for (kernel, op, config), points in sorted(by_group(launches).items()):
        bucket_of = ALLOWANCES[kernel].g_bucket
        for batch in sorted({b for b, _ in points}):
            seen = {}  # bucket -> (g, variant)
            for g in sorted(g for b, g in points if b == batch):
                (variant,) = points[(batch, g)]
                bucket = bucket_of(g)
                if bucket not in seen:
                    seen[bucket] = (g, variant)
                elif seen[bucket][1] != variant:
                    g0, v0 = seen[bucket]
                    failures.append(f"{kernel} [{op}/{config}] B={batch}: g={g0} and g={g} (bucket {bucket}) "
                                    f"compile apart: {difference(variants, v0, variant)}")
    assert not failures, "\n".join(failures)


def test_variant_counts_stay_small(sweep):
    """The whole sweep (10 batch sizes x 10 draft lengths) compiles each kernel of a config at
    most (g buckets) x (B regimes) times."""
    _, launches, _ = sweep
    for (kernel, op, config), points in by_group(launches).items():
        allowance = ALLOWANCES[kernel]
        buckets = {allowance.g_bucket(g) for _, g in points}
        count = len(set().union(*points.values()))
        assert count <= len(buckets) * allowance.b_regimes, (kernel, op, config, count)
