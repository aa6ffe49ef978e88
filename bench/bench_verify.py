"""Microbenchmark of the chain verification ops: every backend side by side.

Ops: rejection_sample (probs in) and greedy_verify (logits in); backends: a naive PyTorch
chain (gather, ratio, cumprod, residual, multinomial: what HF-style code does), and every
backend of ours available here (torch reference, triton, cuda). Acceptance regimes:
"reject0" (the first draft always fails), "natural" (drafts from a perturbed target, the
realised acceptance is recorded) and "acceptall" (p == q / drafts equal the argmax).

Reported per call: median microseconds (CUDA-graph replay on a GPU when the call can be
captured, else eager), percent of the minimal-bytes bound (bytes the contract must read
divided by the measured device-to-device copy bandwidth) and of the nominal bound (all of
p and q, what a kernel that streams every row reads).

    python bench/bench_verify.py --out bench/results          # GPU: the full grid
    python bench/bench_verify.py --smoke --out /tmp/bench      # tiny shapes (CI, CPU)
    pytest bench/ --benchmark-only                             # the same cases as a pytest-benchmark suite
"""

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from specdec_kernels import build_info, ops

FULL = {"B": (1, 8, 64, 256), "g": (1, 4, 8), "V": (32000, 128256, 151936)}
SMOKE = {"B": (1, 3), "g": (1, 4), "V": (50, 257)}
REGIMES = ("reject0", "natural", "acceptall")
OPS = ("rejection_sample", "greedy_verify")


@dataclass
class Case:
    op: str
    batch: int
    g: int
    vocab: int
    regime: str
    dtype: torch.dtype
    device: torch.device

    @property
    def name(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"{self.op}-B{self.batch}-g{self.g}-V{self.vocab}-{self.regime}-{dtype}"


def make_inputs(case: Case, seed: int = 0) -> dict:
    gen = torch.Generator(device=case.device).manual_seed(seed)
    shape = (case.batch, case.g + 1, case.vocab)
    logits = torch.randn(shape, device=case.device, generator=gen) * 3
    if case.op == "greedy_verify":
        top = logits[:, : case.g].argmax(-1)
        drafts = top if case.regime == "acceptall" else (top + 1) % case.vocab
        if case.regime == "natural":  # accept a random prefix
            keep = torch.rand(case.batch, case.g, device=case.device, generator=gen) < 0.7
            drafts = torch.where(keep, top, drafts)
        return {"target_logits": logits.to(case.dtype), "draft_tokens": drafts}
    p = torch.softmax(logits, -1)
    noise = 0.0 if case.regime == "acceptall" else 1.0
    q = torch.softmax(logits[:, : case.g] + noise * torch.randn(logits[:, : case.g].shape, device=case.device,
                                                                  generator=gen), -1)
    drafts = torch.multinomial(q.reshape(-1, case.vocab), 1, generator=gen).reshape(case.batch, case.g)
    if case.regime == "reject0":  # p(x_0) = 0: the first draft is always rejected
        p[:, 0].scatter_(1, drafts[:, :1], 0.0)
    return {"target_probs": p.to(case.dtype), "draft_probs": q.to(case.dtype), "draft_tokens": drafts,
            "uniforms": torch.rand(case.batch, case.g + 1, device=case.device, generator=gen)}


def naive_torch_chain(target_probs, draft_probs, draft_tokens, uniforms):
    """The textbook chain in plain torch: every position's ratio and residual, then a pick."""
    batch, g = draft_tokens.shape
    p = target_probs.float()
    q = draft_probs.float()
    idx = draft_tokens.unsqueeze(-1)
    ratio = p[:, :g].gather(-1, idx).squeeze(-1) / q.gather(-1, idx).squeeze(-1)
    accepted = torch.cumprod((uniforms[:, :g] < ratio).long(), dim=1)
    num_accepted = accepted.sum(1)
    residual = torch.clamp(p[:, :g] - q, min=0)
    residual = torch.cat([residual, p[:, g:]], dim=1)
    rows = residual[torch.arange(batch, device=p.device), num_accepted]
    final = torch.multinomial(rows / rows.sum(-1, keepdim=True), 1).squeeze(1)
    out = torch.where(accepted.bool(), draft_tokens, -1)
    return torch.cat([out, final.unsqueeze(1)], 1), num_accepted


def naive_greedy(target_logits, draft_tokens):
    top = target_logits.argmax(-1)
    g = draft_tokens.shape[1]
    num_accepted = torch.cumprod((top[:, :g] == draft_tokens).long(), 1).sum(1)
    return top, num_accepted


def callable_for(case: Case, backend: str, inputs: dict):
    if backend == "naive":
        return (lambda: naive_torch_chain(**inputs)) if case.op == "rejection_sample" else (lambda: naive_greedy(**inputs))
    fn = getattr(ops, case.op)
    return lambda: fn(**inputs, backend=backend)


def backends_for(op: str, device: torch.device) -> list[str]:
    names = ["naive"]
    for backend in ops.implemented_backends(op):
        try:
            ops.resolve(op, backend, device)
            names.append(backend)
        except (ValueError, RuntimeError):
            pass
    return names


def minimal_bytes(case: Case) -> int:
    """What the contract must read: the draft tokens' probabilities (or the g argmax rows for
    greedy, which needs every position) plus the one row the final token is drawn from."""
    elem = torch.tensor([], dtype=case.dtype).element_size()
    if case.op == "greedy_verify":
        return case.batch * (case.g + 1) * case.vocab * elem
    return case.batch * (2 * case.g * elem + 2 * case.vocab * elem)


def nominal_bytes(case: Case) -> int:
    elem = torch.tensor([], dtype=case.dtype).element_size()
    rows = case.g + 1 if case.op == "greedy_verify" else 2 * case.g + 1
    return case.batch * rows * case.vocab * elem


def copy_bandwidth(device: torch.device) -> float | None:
    """Measured device-to-device copy bandwidth (bytes read + written per second)."""
    if device.type != "cuda":
        return None
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (time_eager(lambda: dst.copy_(src), device, 20) * 1e-6)


def time_eager(fn, device: torch.device, repeats: int) -> float:
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


def time_graph(fn, repeats: int) -> float | None:
    """Median microseconds of one call replayed from a CUDA graph, or None if not capturable."""
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # noqa: BLE001 - any capture failure means "time it eagerly"
        torch.cuda.synchronize()
        return None
    return time_eager(graph.replay, torch.device("cuda"), repeats)


def measure(case: Case, backend: str, repeats: int, bandwidth: float | None) -> dict:
    inputs = make_inputs(case)
    fn = callable_for(case, backend, inputs)
    out = fn()
    us, mode = None, "eager"
    if case.device.type == "cuda":
        us = time_graph(fn, repeats)
        mode = "graph" if us is not None else "eager"
    if us is None:
        us = time_eager(fn, case.device, repeats)
    row = {"op": case.op, "B": case.batch, "g": case.g, "V": case.vocab, "regime": case.regime,
           "dtype": str(case.dtype).replace("torch.", ""), "backend": backend, "us": round(us, 2), "timing": mode,
           "mean_accepted": round(float(out[1].float().mean()), 3)}
    if backend not in ("naive", "torch"):  # ours must equal the reference
        want = callable_for(case, "torch", inputs)()
        row["exact"] = bool(torch.equal(out[0], want[0]) and torch.equal(out[1], want[1]))
    if bandwidth:
        row["pct_min_bytes"] = round(100 * minimal_bytes(case) / (us * 1e-6) / (bandwidth / 2), 1)
        row["pct_nominal"] = round(100 * nominal_bytes(case) / (us * 1e-6) / (bandwidth / 2), 1)
    return row


def grid(smoke: bool, dtype: torch.dtype, device: torch.device) -> list[Case]:
    axes = SMOKE if smoke else FULL
    return [Case(op, b, g, v, regime, dtype, device)
            for op, b, g, v, regime in itertools.product(OPS, axes["B"], axes["g"], axes["V"], REGIMES)]


def write_results(rows: list[dict], out: Path, command: str, bandwidth: float | None) -> None:
    info = build_info()
    meta = {"date": date.today().isoformat(), "device": info["device"], "command": command, "torch": info["torch"],
            "triton": info["triton"], "cuda_module": info["cuda_module"]["loaded"], "python": platform.python_version(),
            "copy_bandwidth_GBps": round(bandwidth / 1e9, 1) if bandwidth else None}
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    cols = ["op", "B", "g", "V", "regime", "dtype", "backend", "us", "timing", "pct_min_bytes", "pct_nominal",
            "mean_accepted", "exact"]
    lines = [f"# Chain verification ({meta['device']}, {meta['date']})", "", f"`{command}`", "",
             f"torch {meta['torch']}, triton {meta['triton']}, copy bandwidth {meta['copy_bandwidth_GBps']} GB/s", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    (out / "verify.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and few repeats (CPU-friendly)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type == "cpu"
    repeats = args.repeats or (3 if smoke else 200)
    bandwidth = copy_bandwidth(device)
    rows = []
    for case in grid(smoke, getattr(torch, args.dtype), device):
        for backend in backends_for(case.op, device):
            rows.append(measure(case, backend, repeats, bandwidth))
            print(json.dumps(rows[-1]), flush=True)
    write_results(rows, args.out, "python " + " ".join(sys.argv), bandwidth)
    return 0 if all(r.get("exact", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
