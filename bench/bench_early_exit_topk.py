"""Microbenchmark of early_exit_topk against torch.topk(lm_head(norm(h))).

The early-exit head of PPD runs on the serial critical path once per decoding step: the
final norm, the LM head over the whole vocabulary and a top-k. The baseline is what a
PyTorch user writes: norm in float32, the LM head in the weights' dtype (cuBLAS), then
torch.topk over the materialised [B, V] logits. Ours never writes the logits and reads
the [V, H] weight once, so its bound is the weight read at the measured copy bandwidth.

Grid: V in {32000, 128256}, H in {2048, 4096}, B in {1, 8, 64}, bf16, rms norm, k = 8.
Reported per case: median microseconds (CUDA-graph replay, L2 flushed before every
call; eager wall time if a call cannot be captured), the eager time, the weight bytes,
GB/s of weight read, pct_bound (weight bytes / time / the measured copy bandwidth:
bench/_bound.py), speed-up over the baseline, and the fraction of ids equal to the float32
reference's.

    python bench/bench_early_exit_topk.py --out bench/results          # GPU: the full grid
    python bench/bench_early_exit_topk.py --smoke --out /tmp/bench      # tiny shapes (CI, CPU)
    pytest bench/test_bench_early_exit_topk.py --benchmark-only         # the same cases, pytest-benchmark
"""

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_kernels import ops
from specdec_kernels.reference.early_exit import normalize

# bench/ is on sys.path (the script's folder, or pytest's rootdir insertion)
from _bound import pct_of_bound  # noqa: E402
from _report import base_parser, write_report  # noqa: E402
from _timing import copy_bandwidth  # noqa: E402
from bench_kv_compact import captured, time_calls  # noqa: E402

FULL = {"B": (1, 8, 64), "H": (2048, 4096), "V": (32000, 128256)}
SMOKE = {"B": (1, 3), "H": (64,), "V": (200,)}
BACKENDS = ("baseline", "torch", "triton", "cuda")
TIMED_BY_DEFAULT = ("baseline", "triton", "cuda")  # the reference (fp32 weights copy) is slow and big
K = 8


@dataclass
class Case:
    batch: int
    hidden: int
    vocab: int
    dtype: torch.dtype
    device: torch.device

    @property
    def name(self) -> str:
        return f"B{self.batch}-H{self.hidden}-V{self.vocab}-{str(self.dtype).replace('torch.', '')}"

    @property
    def weight_bytes(self) -> int:
        return self.vocab * self.hidden * torch.tensor([], dtype=self.dtype).element_size()


def make_inputs(case: Case, seed: int = 0) -> dict:
    gen = torch.Generator(device=case.device).manual_seed(seed)
    kw = dict(generator=gen, device=case.device)
    hidden = torch.randn(case.batch, case.hidden, **kw).to(case.dtype)
    norm_weight = (1 + 0.1 * torch.randn(case.hidden, **kw)).to(case.dtype)
    weight = (torch.randn(case.vocab, case.hidden, **kw) * case.hidden ** -0.5).to(case.dtype)
    return {"hidden": hidden, "norm_weight": norm_weight, "lm_head_weight": weight}


def baseline(hidden, norm_weight, lm_head_weight, k=K):
    """torch.topk(lm_head(norm(h))): norm in float32, the LM head in the weights' dtype."""
    h = normalize(hidden, norm_weight, None, eps=1e-6, norm="rms").to(lm_head_weight.dtype)
    return torch.topk(F.linear(h, lm_head_weight).float(), k, dim=-1)


def callable_for(backend: str, inputs: dict):
    if backend == "baseline":
        return lambda: baseline(**inputs)
    return lambda: ops.early_exit_topk(inputs["hidden"], inputs["norm_weight"], inputs["lm_head_weight"], K,
                                       backend=backend)


def backends_for(device: torch.device, wanted=TIMED_BY_DEFAULT) -> list[str]:
    names = []
    for backend in wanted:
        if backend != "baseline":
            try:
                ops.resolve("early_exit_topk", backend, device)
            except (ValueError, RuntimeError):
                continue
        names.append(backend)
    return names


def id_agreement(backend: str, inputs: dict) -> float:
    """Fraction of the top-K ids equal to the float32 reference's (near-ties may differ)."""
    _, got = callable_for(backend, inputs)()
    _, want = ops.early_exit_topk(inputs["hidden"], inputs["norm_weight"], inputs["lm_head_weight"], K,
                                  backend="torch")
    return round(float((got == want).float().mean()), 3)


def measure(case: Case, backend: str, repeats: int, copy_bw: float | None) -> dict:
    inputs = make_inputs(case)
    row = {"B": case.batch, "H": case.hidden, "V": case.vocab, "dtype": str(case.dtype).replace("torch.", ""),
           "backend": backend, "id_agreement": id_agreement(backend, inputs)}
    fn = callable_for(backend, inputs)
    eager = time_calls(fn, case.device, repeats)
    replay = captured(fn) if case.device.type == "cuda" else None
    us = time_calls(replay, case.device, repeats) if replay is not None else eager
    nbytes = case.weight_bytes
    row.update(us=round(us, 2), timing="graph" if replay is not None else "eager", eager_us=round(eager, 2),
               weight_MB=round(nbytes / 2**20, 1), GBps=round(nbytes / (us * 1e-6) / 1e9, 1))
    if copy_bw:
        row["pct_bound"] = pct_of_bound(nbytes, us * 1e-6, copy_bw)
    return row


def grid(smoke: bool, dtype: torch.dtype, device: torch.device, batches=None) -> list[Case]:
    axes = SMOKE if smoke else FULL
    return [Case(b, h, v, dtype, device) for v, h, b in itertools.product(axes["V"], axes["H"], batches or axes["B"])]


def add_speedups(rows: list[dict]) -> None:
    base = {(r["B"], r["H"], r["V"]): r["us"] for r in rows if r["backend"] == "baseline"}
    for r in rows:
        ref = base.get((r["B"], r["H"], r["V"]))
        if ref and r["backend"] != "baseline":
            r["speedup"] = round(ref / r["us"], 2)


def main(argv=None) -> int:
    parser = base_parser(__doc__)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(TIMED_BY_DEFAULT))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type == "cpu"
    repeats = args.repeats or (3 if smoke else 30)
    copy_bw = copy_bandwidth(device)
    rows = []
    for case in grid(smoke, getattr(torch, args.dtype), device, args.batch):
        for backend in backends_for(device, args.backends):
            rows.append(measure(case, backend, repeats, copy_bw))
            print(json.dumps(rows[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    add_speedups(rows)
    cols = ["B", "H", "V", "dtype", "backend", "us", "timing", "eager_us", "speedup", "weight_MB", "GBps", "pct_bound",
            "id_agreement"]
    copy_gbps = round(copy_bw / 1e9, 1) if copy_bw else None
    write_report(rows, args.out, "early_exit_topk", "early_exit_topk", cols, "python " + " ".join(sys.argv),
                 {"copy_bandwidth_GBps": copy_gbps, "k": K},
                 f"k = {K}, rms norm; pct_bound = weight bytes / time / copy bandwidth {copy_gbps} GB/s (read + "
                 "write; bench/_bound.py); speedup over torch.topk(lm_head(norm(h)))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
