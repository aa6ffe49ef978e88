"""Microbenchmark of ops.greedy_verify: every available backend, side by side.

Reports median microseconds per call and the share of HBM bandwidth for the bytes the op
must read (all B*(g+1)*V logits: greedy needs every position's argmax).

    python bench/bench_greedy_verify.py --out bench/results          # GPU, full grid
    python bench/bench_greedy_verify.py --smoke --out /tmp/bench      # CPU smoke run (CI)
"""

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

from specdec_kernels import build_info, ops

FULL_GRID = [(b, g, v) for b in (1, 8, 64) for g in (4, 8) for v in (32000, 128256, 151936)]
SMOKE_GRID = [(1, 2, 50), (3, 4, 257)]
PEAK_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}


def time_call(fn, device: torch.device, repeats: int) -> float:
    """Median microseconds of fn() over `repeats` calls (CUDA events on a GPU)."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def peak_bandwidth(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((bw for key, bw in PEAK_BYTES_PER_S.items() if key in name), None)


def run(grid, dtype: torch.dtype, device: torch.device, repeats: int) -> list[dict]:
    rows = []
    peak = peak_bandwidth(device)
    for batch, g, vocab in grid:
        logits = torch.randn(batch, g + 1, vocab, device=device).to(dtype)
        drafts = logits[:, :g].float().argmax(-1)
        drafts[:, g // 2:] = 0  # accept about half
        reference = ops.greedy_verify(logits, drafts, backend="torch")
        for backend in ops.implemented_backends("greedy_verify"):
            try:
                ops.resolve("greedy_verify", backend, device)
            except (ValueError, RuntimeError):
                continue
            got = ops.greedy_verify(logits, drafts, backend=backend)
            exact = torch.equal(got[0], reference[0]) and torch.equal(got[1], reference[1])
            us = time_call(lambda: ops.greedy_verify(logits, drafts, backend=backend), device, repeats)
            read_bytes = logits.numel() * logits.element_size()
            rows.append({"B": batch, "g": g, "V": vocab, "dtype": str(dtype).replace("torch.", ""), "backend": backend,
                         "us": round(us, 2), "exact": exact,
                         "hbm_pct": round(100 * read_bytes / (us * 1e-6) / peak, 1) if peak else None})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def write(rows: list[dict], out: Path, device: torch.device, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": date.today().isoformat(), "device": build_info()["device"], "command": command,
            "torch": torch.__version__, "python": platform.python_version()}
    (out / "greedy_verify.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# greedy_verify ({meta['device']}, {meta['date']})", "", f"`{command}`", "",
             "| B | g | V | dtype | backend | us | % HBM | exact |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['B']} | {r['g']} | {r['V']} | {r['dtype']} | {r['backend']} | {r['us']} | {r['hbm_pct']} | {r['exact']} |"
              for r in rows]
    (out / "greedy_verify.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, few repeats (CPU-friendly)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grid = SMOKE_GRID if args.smoke or device.type == "cpu" else FULL_GRID
    repeats = args.repeats or (3 if args.smoke else 100)
    rows = run(grid, getattr(torch, args.dtype), device, repeats)
    write(rows, args.out, device, "python " + " ".join(sys.argv))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
