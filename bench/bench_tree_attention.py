"""Microbenchmark of tree_attention: our kernels against PyTorch SDPA and FlexAttention.

Default grid (the first numbers the targets ask for): B {8, 32} x prefix P 4096 x draft nodes N {8, 32},
uniform prefixes, a causal chain and a random tree, contiguous KV and a paged pool; Hq 32 / Hkv 8, D 128,
bf16. --full: B {1, 8, 32} x P {512, 4096, 32768} x N {8, 32, 64}, uniform and ragged prefixes (row b
uniform in [P/2, P], fixed seed). Trees: parent of node i uniform in [0, i), a different tree per row;
paged pools have pages of 16 in random order. Implementations:
- ours: every backend of `ops.tree_attention` that runs here except the torch reference
  (which is the correctness gate; it is timed only on the CPU);
- `sdpa` and `flex` (bench/_attention_anchors.py): SDPA with a dense boolean mask and enable_gqa; compiled
  flex_attention with a block mask (one compile per shape, none per case); a compile or lowering failure
  is a result row (`error`), not a skipped case. SDPA and Flex take no page table: contiguous cases only.

Order: ours and SDPA case by case; then Flex, every shape compiled first (`compile_s`, on each of its
rows) and only then timed, so no compile runs between timings and a run cut short loses Flex rows first.
Every row goes to OUT/tree_attention.jsonl (and stdout) the moment it is measured; the .json/.md report is
written at the end, and also when the run is interrupted (Ctrl-C, or the SIGTERM of `timeout`).

Every implementation is first checked against the torch reference (max abs error of out
<= 8e-3 for 16-bit inputs, 1e-4 for fp32; ours also lse); a failing one is not timed.

Reported per call: median microseconds (CUDA-graph replay when the call can be captured,
L2 flushed before every replay: triton.testing.do_bench), the KV bytes the call must read,
sum_b (P_b + N) * Hkv * D * 2 * bytes, as GB/s and as pct_bound (those bytes / time / a
measured device copy's bandwidth, bytes read + written per second of a 256 MiB copy:
bench/_bound.py), and percent of the dense 16-bit tensor-core peak for
4 * Hq * D * sum_b N (P_b + N) flops. The markdown ends with the issue's targets at B >= 8,
P >= 4096, N <= 32 (the bandwidth one in GB/s: 70% of the GPU's nominal HBM bandwidth).

Time of the default grid on an H100 (an estimate: it has not run on a GPU yet): 48 rows (8 contiguous cases
x 4 implementations, 8 paged x 2) at ~0.15 s each (do_bench: 10 ms warm-up + 50 ms of replays, graph
capture, the reference) ~7 s; 4 Flex compiles (one per B x N; chain and tree share them) at ~5 s plus ~8 s
for the first ~28 s; Triton's compiles of the kernel variants ~8 s; setup (imports, copy bandwidth) ~6 s:
~50 s, under the 60 s it is meant to take.

    python bench/bench_tree_attention.py --out bench/results                 # GPU: the default grid (~50 s)
    python bench/bench_tree_attention.py --full --out bench/results          # GPU: the whole grid (long)
    python bench/bench_tree_attention.py --batch 8 --prefix 4096 --out /tmp/b # a slice
    python bench/bench_tree_attention.py --impls triton sdpa --layouts contiguous --trees tree --out /tmp/b
    python bench/bench_tree_attention.py --smoke --out /tmp/b                 # tiny shapes on the CPU (CI)
    pytest bench/test_bench_tree_attention.py --benchmark-only                # pytest-benchmark suite
"""

import os
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    # the Triton backend runs on CPU tensors under the interpreter, which must be on
    # before triton (imported by specdec_kernels) is
    os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import bench_verify as bv  # noqa: E402  (copy bandwidth, CUDA-graph capture, CPU timing)
from _attention_anchors import flex_call, sdpa_call, warm_up  # noqa: E402  (bta.sdpa_call / flex_call: the suite)
from _bound import pct_of_bound  # noqa: E402  (bench/ is on sys.path: script dir or pytest rootdir)
from _report import base_parser, write_report  # noqa: E402
from specdec_kernels import ops  # noqa: E402
from specdec_kernels.reference.attention import paged_from_contiguous  # noqa: E402

DEFAULT = {"B": (8, 32), "P": (4096,), "N": (8, 32), "heads": (32, 8), "D": 128, "prefix": ("uniform",)}
FULL = {"B": (1, 8, 32), "P": (512, 4096, 32768), "N": (8, 32, 64), "heads": (32, 8), "D": 128,
        "prefix": ("uniform", "ragged")}
SMOKE = {"B": (2,), "P": (40,), "N": (5,), "heads": (4, 2), "D": 16, "prefix": ("uniform", "ragged")}
PREFIXES = ("uniform", "ragged")
TREES = ("chain", "tree")
LAYOUTS = ("contiguous", "paged")
WARMUP_MS, REP_MS = 10, 50  # do_bench per row: a few hundred replays of a ~50-500 us call
ANCHORS = ("sdpa", "flex")
# nominal HBM bandwidth (the target's scale, never a % of bound) and dense 16-bit tensor-core peak by device name
NOMINAL = {"H100 PCIe": (2.0e12, 756e12), "H100": (3.35e12, 989e12), "H200": (4.8e12, 989e12),
           "A100": (2.0e12, 312e12)}
GATE = {torch.float32: 1e-4, torch.float16: 8e-3, torch.bfloat16: 8e-3}  # max abs error of out vs the reference
LSE_GATE = 1e-3


@dataclass(frozen=True)
class Case:
    batch: int
    prefix: int
    nodes: int
    prefix_kind: str
    tree: str
    layout: str
    hq: int
    hkv: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    page_size: int = 16

    @property
    def name(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"B{self.batch}-P{self.prefix}-N{self.nodes}-{self.prefix_kind}-{self.tree}-{self.layout}-{dtype}"


def make_inputs(case: Case, seed: int = 0) -> dict:
    """Op arguments of one case: q, k_cache, v_cache, seq_lens, parents, block_table."""
    gen = torch.Generator().manual_seed(seed)
    if case.prefix_kind == "ragged":
        seq_lens = torch.randint(case.prefix // 2, case.prefix + 1, (case.batch,), generator=gen)
    else:
        seq_lens = torch.full((case.batch,), case.prefix, dtype=torch.int64)
    s_max = case.prefix + case.nodes  # every case of a shape reads the same KV length (one Flex compile)
    dev, dt = case.device, case.dtype
    q = torch.randn(case.batch, case.nodes, case.hq, case.head_dim, device=dev, dtype=dt)
    k = torch.randn(case.batch, case.hkv, s_max, case.head_dim, device=dev, dtype=dt)
    v = torch.randn(case.batch, case.hkv, s_max, case.head_dim, device=dev, dtype=dt)
    parents = None
    if case.tree == "tree":  # node i's parent uniform in [0, i)
        parents = (torch.rand(case.batch, case.nodes, generator=gen) * torch.arange(case.nodes)).long()
        parents[:, 0] = -1
        parents = parents.to(dev)
    block_table = None
    if case.layout == "paged":
        k, block_table = paged_from_contiguous(k, case.page_size, generator=torch.Generator().manual_seed(seed))
        v, _ = paged_from_contiguous(v, case.page_size, generator=torch.Generator().manual_seed(seed))
    return dict(q=q, k_cache=k, v_cache=v, seq_lens=seq_lens.to(dev), parents=parents, block_table=block_table)


def ours_call(inputs: dict, backend: str):
    return lambda: ops.tree_attention(**inputs, backend=backend)


def implementations(device: torch.device) -> list[str]:
    names = []
    for backend in ops.implemented_backends("tree_attention"):
        if backend == "torch" and device.type == "cuda":
            continue  # the reference is the gate, not a contender
        try:
            ops.resolve("tree_attention", backend, device)
            names.append(backend)
        except (ValueError, RuntimeError):
            pass
    return names + list(ANCHORS)


def kv_bytes(inputs: dict) -> int:
    q, k = inputs["q"], inputs["k_cache"]
    hkv = k.shape[2] if inputs["block_table"] is not None else k.shape[1]
    tokens = int(inputs["seq_lens"].sum()) + q.shape[0] * q.shape[1]
    return tokens * hkv * q.shape[3] * 2 * q.element_size()


def flops(inputs: dict) -> int:
    q = inputs["q"]
    tokens = int(inputs["seq_lens"].sum()) + q.shape[0] * q.shape[1]
    return 4 * q.shape[2] * q.shape[3] * q.shape[1] * tokens


def device_peaks(device: torch.device) -> tuple[float | None, float | None]:
    """(nominal HBM bytes/s, dense 16-bit tensor-core flop/s) of this GPU, if known."""
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    for key, peaks in NOMINAL.items():  # "H100 PCIe" is listed before "H100"
        if key in name:
            return peaks
    return None, None


def time_us(fn, device: torch.device, repeats: int) -> tuple[float, str]:
    """Median microseconds and how: a CUDA-graph replay (or the eager call when capture
    fails) under triton's do_bench, which flushes L2 before every call; on the CPU the
    wall clock."""
    if device.type != "cuda":
        return bv.time_eager(fn, device, repeats), "eager"
    import triton.testing
    graph = bv.capture_graph(fn)
    target = graph.replay if graph is not None else fn
    return 1e3 * triton.testing.do_bench(target, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"), \
        "graph" if graph is not None else "eager"


def check(impl: str, got, want, dtype: torch.dtype) -> tuple[bool, float]:
    out = got[0] if isinstance(got, tuple) else got
    err = float((out.float() - want[0].float()).abs().max()) if out.numel() else 0.0
    ok = err <= GATE[dtype]
    if isinstance(got, tuple):  # ours also return lse
        ok = ok and float((got[1] - want[1]).abs().max() if got[1].numel() else 0.0) <= LSE_GATE
    return ok, float(f"{err:.3g}")


def _emit_stdout(row: dict) -> None:
    print(json.dumps(row), flush=True)


def measure(case: Case, impls: list[str], repeats: int, copy_bw: float | None, *, emit=_emit_stdout,
            compile_s: float | str | None = None) -> list[dict]:
    """Rows of every implementation on one case's inputs, each passed to `emit` as soon as it is measured.
    compile_s: Flex's compile of this shape when warm_up already did it (seconds), or its error."""
    inputs = make_inputs(case)
    scale = 1.0 / math.sqrt(case.head_dim)
    want = ops.tree_attention(**inputs, backend="torch")
    _, tc_peak = device_peaks(case.device)
    base = {"B": case.batch, "P": case.prefix, "N": case.nodes, "prefix": case.prefix_kind, "tree": case.tree,
            "layout": case.layout, "dtype": str(case.dtype).replace("torch.", ""),
            "kv_MiB": round(kv_bytes(inputs) / 2**20, 1)}
    rows = []
    for impl in impls:
        if impl in ANCHORS and case.layout != "contiguous":
            continue  # no page tables in SDPA / Flex
        row = {**base, "impl": impl}
        try:
            if impl == "flex" and isinstance(compile_s, str):
                raise RuntimeError(compile_s)  # its shape failed to compile in warm_up: not tried again
            started = time.perf_counter()
            fn = {"sdpa": sdpa_call, "flex": flex_call}[impl](inputs, scale) if impl in ANCHORS else ours_call(inputs, impl)
            got = fn()  # compiles on first use (Flex: done by warm_up when compile_s is given)
            if case.device.type == "cuda":
                torch.cuda.synchronize()
            if impl == "flex":
                row["compile_s"] = round(time.perf_counter() - started, 2) if compile_s is None else compile_s
            row["ok"], row["max_err"] = check(impl, got, want, case.dtype)
            if row["ok"]:
                us, row["timing"] = time_us(fn, case.device, repeats)
                row["us"] = round(us, 2)
                seconds = us * 1e-6
                row["GBps"] = round(kv_bytes(inputs) / seconds / 1e9, 1)
                if copy_bw:
                    row["pct_bound"] = pct_of_bound(kv_bytes(inputs), seconds, copy_bw)
                if tc_peak and case.dtype != torch.float32:
                    row["pct_tc"] = round(100 * flops(inputs) / seconds / tc_peak, 1)
        except Exception as error:  # noqa: BLE001 - a failing anchor is a result
            row["ok"], row["error"] = False, one_line(error)
        rows.append(row)
        emit(row)
    del inputs, want
    if case.device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def flex_shape(case: Case) -> tuple:
    """What a Flex compile is specialised on (make_inputs reads P + N positions whatever the prefix kind)."""
    return case.batch, case.nodes, case.hq, case.hkv, case.head_dim, case.prefix + case.nodes, case.dtype, case.device


def measure_flex(cases: list[Case], repeats: int, copy_bw: float | None, emit=_emit_stdout) -> list[dict]:
    """Flex's rows: every shape compiled first (one call on a case's inputs), then every case timed."""
    cases = [c for c in cases if c.layout == "contiguous"]
    compiled: dict[tuple, float | str] = {}
    for case in cases:
        if flex_shape(case) not in compiled:
            inputs = make_inputs(case)
            try:
                compiled[flex_shape(case)] = round(warm_up(inputs, 1.0 / math.sqrt(case.head_dim)), 2)
            except Exception as error:  # noqa: BLE001 - a failing compile is the row's result
                compiled[flex_shape(case)] = one_line(error)
            del inputs
    rows = []
    for case in cases:
        rows += measure(case, ["flex"], repeats, copy_bw, emit=emit, compile_s=compiled[flex_shape(case)])
    return rows


def grid(smoke: bool, dtype: torch.dtype, device: torch.device, *, full: bool = False, batches=None, prefixes=None,
         nodes=None, prefix_kinds=None, trees=TREES, layouts=LAYOUTS, page_size: int = 16) -> list[Case]:
    axes = SMOKE if smoke else FULL if full else DEFAULT
    hq, hkv = axes["heads"]
    return [Case(b, p, n, kind, tree, layout, hq, hkv, axes["D"], dtype, device, page_size)
            for b, p, n, kind, tree, layout in itertools.product(
                batches or axes["B"], prefixes or axes["P"], nodes or axes["N"], prefix_kinds or axes["prefix"],
                trees, layouts)]


def _case_key(row: dict) -> tuple:
    """The shape of a result row, layout aside (anchors run the contiguous layout only)."""
    return row["B"], row["P"], row["N"], row["prefix"], row["tree"], row["dtype"]


def speedups(rows: list[dict]) -> None:
    """Add vs_sdpa / vs_flex (their time over ours) to our rows, matching cases on the
    contiguous layout (the anchors' only layout)."""
    anchor_us = {(_case_key(r), r["impl"]): r.get("us") for r in rows if r["impl"] in ANCHORS}
    for r in rows:
        if r["impl"] in ANCHORS or "us" not in r:
            continue
        for anchor in ANCHORS:
            other = anchor_us.get((_case_key(r), anchor))
            if other and r["layout"] == "contiguous":
                r[f"vs_{anchor}"] = round(other / r["us"], 2)


def target_summary(rows: list[dict], nominal_bw: float | None = None) -> list[str]:
    """The issue's H100 targets over the rows at B >= 8, P >= 4096, N <= 32; the bandwidth target is 70% of
    the GPU's nominal HBM bandwidth (nominal_bw, bytes/s), in GB/s of KV read."""
    lines = ["## Targets (B >= 8, P >= 4096, N <= 32)", ""]
    for impl in sorted({r["impl"] for r in rows if r["impl"] not in ANCHORS}):
        mine = [r for r in rows if r["impl"] == impl and r["B"] >= 8 and r["P"] >= 4096 and r["N"] <= 32]
        if not mine:
            lines.append(f"- {impl}: no such case in this run")
            continue
        gbps = [r["GBps"] for r in mine if "GBps" in r]
        goal = f"{0.7 * nominal_bw / 1e9:.0f} GB/s, 70% of nominal HBM" if nominal_bw else "70% of nominal HBM"
        bound = [r["pct_bound"] for r in mine if "pct_bound" in r]
        sdpa = [r["vs_sdpa"] for r in mine if "vs_sdpa" in r]
        flex_ran = {_case_key(r) for r in rows if r["impl"] == "flex"}
        flex = [r for r in mine if r["layout"] == "contiguous" and _case_key(r) in flex_ran]
        flex_beaten = sum(1 for r in flex if "vs_flex" not in r or r["vs_flex"] > 1)  # no Flex time: Flex failed
        lines += [f"- {impl}: {len(mine)} cases, {sum(1 for r in mine if not r['ok'])} failed the gate",
                  f"  - GB/s of KV read (target >= {goal}): min {min(gbps, default='n/a')}, "
                  f"max {max(gbps, default='n/a')}; % of bound: min {min(bound, default='n/a')}, "
                  f"max {max(bound, default='n/a')}",
                  f"  - speed-up over SDPA with a dense mask (target >= 3): min {min(sdpa, default='n/a')}",
                  f"  - faster than FlexAttention (or Flex failed): {flex_beaten} of {len(flex)} contiguous cases"]
    return lines + [""]


def write_results(rows: list[dict], out: Path, command: str, copy_bw: float | None, device: torch.device) -> None:
    """tree_attention.json / .md (bench/_report.py), then the targets section appended to the markdown."""
    nominal_bw, tc_peak = device_peaks(device)
    extra = {"cuda": torch.version.cuda, "copy_bandwidth_GBps": round(copy_bw / 1e9, 1) if copy_bw else None,
             "nominal_hbm_GBps": round(nominal_bw / 1e9) if nominal_bw else None,
             "tensor_core_peak_TFLOPs": round(tc_peak / 1e12) if tc_peak else None}
    speedups(rows)
    cols = ["B", "P", "N", "prefix", "tree", "layout", "impl", "us", "timing", "GBps", "pct_bound", "pct_tc",
            "vs_sdpa", "vs_flex", "kv_MiB", "max_err", "ok", "compile_s", "error"]
    note = (f"CUDA {extra['cuda']}; copy bandwidth {extra['copy_bandwidth_GBps']} GB/s (read + write; pct_bound = "
            f"KV bytes / time / copy bandwidth, bench/_bound.py), nominal HBM {extra['nominal_hbm_GBps']} GB/s (the "
            f"target's scale), tensor-core peak {extra['tensor_core_peak_TFLOPs']} TFLOP/s")
    write_report(rows, out, "tree_attention", "tree_attention", cols, command, extra, note)
    with open(out / "tree_attention.md", "a") as md:
        md.write("\n" + "\n".join(target_summary(rows, nominal_bw)))


class Interrupted(Exception):
    """SIGTERM (e.g. from `timeout`): stop measuring, write the report of the rows so far."""


def _stop(signum, frame):
    raise Interrupted()


def main(argv=None) -> int:
    parser = base_parser(__doc__, default_dtype=None)  # bfloat16, float32 in smoke runs; --repeats: CPU calls
    parser.add_argument("--full", action="store_true", help="the whole grid (B 1/8/32, P 512/4096/32768, N 8/32/64, "
                                                            "uniform and ragged prefixes): long")
    parser.add_argument("--prefix", nargs="+", type=int, default=None)
    parser.add_argument("--nodes", nargs="+", type=int, default=None)
    parser.add_argument("--prefix-kinds", nargs="+", choices=PREFIXES, default=None)
    parser.add_argument("--trees", nargs="+", choices=TREES, default=list(TREES))
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--impls", nargs="+", default=None, help="subset of: torch triton cuda sdpa flex")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type == "cpu"
    dtype = getattr(torch, args.dtype or ("float32" if smoke else "bfloat16"))
    repeats = args.repeats or 1  # CPU wall-clock repeats (GPU timing is do_bench's)
    impls = [i for i in implementations(device) if args.impls is None or i in args.impls]
    cases = grid(smoke, dtype, device, full=args.full, batches=args.batch, prefixes=args.prefix, nodes=args.nodes,
                 prefix_kinds=args.prefix_kinds, trees=args.trees, layouts=args.layouts, page_size=args.page_size)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    interrupted, copy_bw = False, None
    with open(args.out / "tree_attention.jsonl", "w", encoding="utf-8") as jsonl:
        def emit(row: dict) -> None:  # every row on disk the moment it is measured
            rows.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            _emit_stdout(row)

        previous = signal.signal(signal.SIGTERM, _stop)
        try:
            copy_bw = bv.copy_bandwidth(device)
            for case in cases:  # ours and SDPA: no compile between their timings
                measure(case, [i for i in impls if i != "flex"], repeats, copy_bw, emit=emit)
            if "flex" in impls:
                measure_flex(cases, repeats, copy_bw, emit=emit)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
        finally:
            signal.signal(signal.SIGTERM, previous)
    write_results(rows, args.out, "python " + " ".join(sys.argv), copy_bw, device)
    if interrupted:
        print(f"interrupted: {len(rows)} rows written", file=sys.stderr)
        return 130
    ours = [r for r in rows if r["impl"] not in ANCHORS]
    return 0 if all(r["ok"] for r in ours) else 1  # an anchor may fail; ours may not


if __name__ == "__main__":
    sys.exit(main())
