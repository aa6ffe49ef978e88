"""Which kernel backends `backend="auto"` tries on a GPU, per op and batch regime, from GPU measurements.

The rule that made each entry, from the results file it cites: in each regime, a kernel backend is listed
only if it was no slower than plain torch in every measured row of that regime (plain torch: the torch
backend and the bench's own torch stand-ins, whichever was faster per row: `naive` in bench_verify,
`baseline` = torch.topk(lm_head(norm(h))) in bench_early_exit_topk, `index_select` in bench_kv_compact);
the listed ones are ordered by the geometric mean of their times over the regime's rows. `auto` tries
them in that order (a backend that is not loaded, or whose launch limits refuse the shape, is skipped) and
falls back to torch; an empty order means torch. tests/test_auto_table.py derives every entry again from
its file. Ops without measurements keep the old rule, cuda then triton.

Regimes split the batch at 8: the verify rows were measured at B = 1 and 64 only, so the B = 1 rows decide
B <= 8 and the B = 64 rows every larger batch (early_exit_topk was measured at 1, 8 and 64; kv_compact at
1, 8 and 32). The measurements are of one H100; other GPUs use them until they are measured themselves.
"""

from typing import NamedTuple

DEFAULT_ORDER = ("cuda", "triton")  # an op no GPU row covers: the old rule
SMALL_BATCH = 8  # the largest batch of the first regime

H100 = "bench/results/gpu_checks_h100_2026-11-27/"
VERIFY_ROWS = H100 + "call3_verify_kv/verify_rows.jsonl"  # B 1, 64; g 1, 4, 8; V 128256; bf16; graph replay
EARLY_EXIT = H100 + "call2_benchmarks/early_exit_topk.json"  # B 1, 8, 64; H 2048, 4096; V 32000, 128256
KV_COMPACT = H100 + "call3_verify_kv/kv_compact.json"  # B 1, 8, 32; N 8, 64; 32 layers; stacked, separate


class Measured(NamedTuple):
    source: str  # the results file the orders come from
    batch: str  # the size that is the batch: "B", or "R" (rows) for max_prob
    small: tuple[str, ...]  # the order for batch <= SMALL_BATCH
    large: tuple[str, ...]  # the order for larger batches


MEASURED: dict[str, Measured] = {
    # verify_rows.jsonl: both kernels 5-11x faster than torch at B 1 and 64; Triton the faster at both
    "bild_verify": Measured(VERIFY_ROWS, "B", ("triton", "cuda"), ("triton", "cuda")),
    # verify_rows.jsonl: B 1 Triton by a hair (13.4 against 13.9 us geometric mean), B 64 CUDA (41 against 59)
    "greedy_verify": Measured(VERIFY_ROWS, "B", ("triton", "cuda"), ("cuda", "triton")),
    # verify_rows.jsonl: Triton the faster at both (fallback_check runs as max_prob)
    "max_prob": Measured(VERIFY_ROWS, "R", ("triton", "cuda"), ("triton", "cuda")),
    # verify_rows.jsonl: Triton the faster at both (B 64: 28 against 36 us)
    "rejection_sample": Measured(VERIFY_ROWS, "B", ("triton", "cuda"), ("triton", "cuda")),
    # verify_rows.jsonl: B 1 CUDA 0.76-1.99x of torch (slower at g=4) and Triton 0.36-0.55x: torch; B 64 CUDA
    # 1.56-3.88x, Triton 0.89-2.71x (slower than naive torch at g=1): CUDA only
    "rejection_sample_logits": Measured(VERIFY_ROWS, "B", (), ("cuda",)),
    # verify_rows.jsonl: B 1 Triton (11.1 against 12.5 us), B 64 CUDA (65 against 83)
    "relaxed_verify": Measured(VERIFY_ROWS, "B", ("triton", "cuda"), ("cuda", "triton")),
    # verify_rows.jsonl: CUDA the faster at both (B 64: 43 against 194 us)
    "tree_greedy_verify": Measured(VERIFY_ROWS, "B", ("cuda", "triton"), ("cuda", "triton")),
    # verify_rows.jsonl: CUDA the faster at both (independent siblings; the same kernels serve both rules)
    "tree_rejection_sample": Measured(VERIFY_ROWS, "B", ("cuda", "triton"), ("cuda", "triton")),
    # early_exit_topk.json: B 1 and 8 Triton 1.19-1.61x of torch.topk(lm_head(norm(h))), CUDA 0.15-0.94x;
    # B 64 Triton 0.49-0.85x and CUDA 0.02-0.06x: neither, so torch (the fp32 reference, not timed there)
    "early_exit_topk": Measured(EARLY_EXIT, "B", ("triton",), ()),
    # kv_compact.json: both ~200x faster than torch (graph replay against eager); CUDA by a hair
    "kv_compact": Measured(KV_COMPACT, "B", ("cuda", "triton"), ("cuda", "triton")),
}


def auto_order(op: str, sizes: dict | None) -> tuple[str, ...]:
    """The kernel backends `auto` tries for `op` at these sizes, in order (torch comes after them).
    Without sizes: the small-batch regime."""
    measured = MEASURED.get(op)
    if measured is None:
        return DEFAULT_ORDER
    batch = None if sizes is None else sizes.get(measured.batch)
    return measured.small if batch is None or batch <= SMALL_BATCH else measured.large
