"""Triton tree_greedy_verify's choice between its two kernels follows the H100 rows.

The walk kernel (one program per row) streams the visited rows one after another; the split
kernel reads all B * N node rows at once, as the CUDA kernel does. This derives the break-even
row count per visited row from the 2026-11-27 H100 file: the Triton rows at B = 64 all took the
walk, and CUDA's times give the cost of the parallel read of B * N rows.
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")
from specdec_kernels.triton import tree_verify  # noqa: E402

ROWS = (Path(__file__).resolve().parents[1]
        / "bench/results/gpu_checks_h100_2026-11-27/call3_verify_kv/verify_rows.jsonl")


def binary_tree_depth(n: int) -> int:
    """bench_verify's trees: node i's parent is (i - 1) // 2."""
    return (n).bit_length() - 1


def measured():
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["op"] == "tree_greedy_verify" and r["B"] == 64 and r["dtype"] == "bfloat16"]


def parallel_read_fit(rows):
    """Least-squares (intercept us, us per row) of CUDA's time against B * N."""
    points = [(r["B"] * (r["g"] + 1), r["us"]) for r in rows if r["backend"] == "cuda"]
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return mean_y - slope * mean_x, slope


def walk_us_per_visited_row(rows):
    """The Triton walk's time per row it visits, where that count is known: every row rejects
    at the root (1 row) or accepts down to the deepest level (max_depth + 1 rows)."""
    per_row = []
    for r in rows:
        if r["backend"] != "triton":
            continue
        depth = binary_tree_depth(r["g"] + 1)
        visited = {"reject0": 1, "acceptall": depth + 1}.get(r["regime"])
        if visited is not None:
            per_row.append(r["us"] / visited)
    return per_row


def test_the_measured_b64_rows_all_took_the_walk_under_the_old_rule():
    """Else the file says nothing about the walk: the old rule was B * N <= 32 * (depth + 1)."""
    rows = measured()
    assert {r["g"] for r in rows} == {1, 4, 8}
    for r in rows:
        assert r["B"] * (r["g"] + 1) > 32 * (binary_tree_depth(r["g"] + 1) + 1)


def test_split_rows_per_level_is_the_measured_break_even():
    rows = measured()
    intercept, slope = parallel_read_fit(rows)
    assert 0.05 < slope < 0.3 and 0 < intercept < 20  # us per 256 KB row, fixed cost: an H100's scale
    walk = walk_us_per_visited_row(rows)
    assert len(walk) == 6
    break_even = (min(walk) - intercept) / slope  # parallel rows that cost one visited row
    assert 0.8 * break_even <= tree_verify.SPLIT_ROWS_PER_LEVEL <= 1.25 * break_even


def test_every_measured_b64_shape_now_takes_the_kernel_that_won():
    """CUDA's parallel read beat the Triton walk in every B = 64 row; the rule now picks the split."""
    rows = measured()
    by_shape = {}
    for r in rows:
        by_shape.setdefault((r["g"], r["regime"]), {})[r["backend"]] = r["us"]
    for (g, _), times in by_shape.items():
        assert times["cuda"] < times["triton"]
        assert tree_verify._use_split_greedy(64, g + 1, binary_tree_depth(g + 1))


def test_large_trees_at_large_batch_keep_the_walk():
    """B 256 x N 64 is 16384 node rows (4 GB at V 128256 bf16): the walk reads at most 7 per row."""
    assert not tree_verify._use_split_greedy(256, 64, 6)
    assert tree_verify._use_split_greedy(1, 64, 6)
