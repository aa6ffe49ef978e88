"""The timing probe of the first GPU look: the decisions that matter, in about 90 seconds.

Each row is one implementation at one shape, in microseconds and as a percentage of a bound,
appended to OUT as one JSON line the moment it is measured (a probe cut off by its timeout keeps
every row it finished). In the order of the decisions they inform:

  verify     greedy_verify, rejection_sample, rejection_sample_logits, tree_greedy_verify and
             tree_rejection_sample at (B=1, g=4, V=151936) and (B=64, g=4, V=128256), bf16, natural
             acceptance; ours vs a naive torch chain; CUDA-graph replay with a cold L2 (a 256 MiB
             write before every call); % of the minimal-bytes bound (bench_verify.minimal_bytes over
             half the measured copy bandwidth); then, at the same shapes, block_verify (probs) and
             tree_rejection_sample with siblings="without_replacement" (label tree_rejection_sample_wr),
             ours vs the naive torch block verification (the tree variant has no naive baseline, like
             tree_rejection_sample); block_verify's minimal-bytes bound is every row, (2g+1)*V per request
  attention  tree_attention bf16, B=8, P=4096, N=32, Hq=32, Hkv=8, D=128, a random tree: cuda,
             triton and SDPA with a dense mask; % of nominal HBM for the K/V read
  kv         kv_compact over 32 layers (B=8, N=64, Hkv=8, D=128, bf16, one allocation): ours vs
             index_select + copy_; % of the copy bandwidth for the bytes that move
  exit       early_exit_topk B in {1, 8}, H=4096, V=128256, bf16: ours vs torch.topk(lm_head(norm(h)));
             % of nominal HBM for the weight read
  engine     the embedded default models in bf16: HF greedy, plain and speculative, CUDA graphs off and
             on, B=1 and 4, 64 new tokens; microseconds per engine step (graphs captured by a warm-up call)

    python bench/gpu_probe.py --out probe.jsonl                  # on a GPU (~90 s on an H100)
    python bench/gpu_probe.py --dry-run --out /tmp/probe.jsonl   # CPU stand-in: tiny shapes, Triton
                                                                 # interpreted, no timing claims

--budget S stops starting new rows after S seconds (the rows not run are listed as skipped).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if "--dry-run" in sys.argv:  # the Triton backend runs on CPU tensors only under the interpreter, set before import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import bench_early_exit_topk as bx  # noqa: E402  (bench/ is on sys.path: the script's folder)
import bench_kv_compact as bk  # noqa: E402
import bench_tree_attention as ba  # noqa: E402
import bench_verify as bv  # noqa: E402
from _timing import copy_bandwidth  # noqa: E402

FLUSH_BYTES = 256 * 2**20  # larger than any L2 here
VERIFY_OPS = ("greedy_verify", "rejection_sample", "rejection_sample_logits", "tree_greedy_verify",
              "tree_rejection_sample")
NEW_VERIFY_OPS = ("block_verify", "tree_rejection_sample_wr")  # after every VERIFY_OPS row: the older decisions first
VERIFY_SHAPES = {"gpu": ((1, 4, 151936), (64, 4, 128256)), "dry": ((1, 2, 50), (3, 2, 64))}
ATTENTION = {"gpu": dict(batch=8, prefix=4096, nodes=32, hq=32, hkv=8, head_dim=128),
             "dry": dict(batch=2, prefix=40, nodes=5, hq=4, hkv=2, head_dim=16)}
KV = {"gpu": dict(batch=8, nodes=64, layers=32, heads=8, dim=128, prefix=1024),
      "dry": dict(batch=2, nodes=8, layers=2, heads=2, dim=16, prefix=16)}
EXIT = {"gpu": ((1, 4096, 128256), (8, 4096, 128256)), "dry": ((1, 64, 200), (3, 64, 200))}
ENGINE_BATCHES, ENGINE_TOKENS = {"gpu": (1, 4), "dry": (1, 2)}, {"gpu": 64, "dry": 8}


class Probe:
    """Writes rows as JSON lines and keeps the time budget."""

    def __init__(self, out: Path, budget: float, mode: str):
        self.file = open(out, "a", encoding="utf-8")  # noqa: SIM115 - open for the probe's life
        self.start, self.budget, self.mode = time.perf_counter(), budget, mode

    def write(self, row: dict) -> None:
        row = {**row, "t_s": round(time.perf_counter() - self.start, 1)}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        print(json.dumps(row), file=sys.stderr, flush=True)

    def over_budget(self, section: str, label: dict) -> bool:
        """Past the budget: the row is listed as skipped and not started."""
        if time.perf_counter() - self.start <= self.budget:
            return False
        self.write({"section": section, **label, "skipped": f"past the {self.budget:.0f} s budget"})
        return True

    def run(self, section: str, label: dict, measure) -> None:
        """One row: measure() -> dict, or the error that stopped it, or skipped past the budget."""
        if self.over_budget(section, label):
            return
        try:
            row = measure()
        except Exception as error:  # noqa: BLE001 - a failing row is a result; the probe goes on
            row = {"error": one_line(error)}
        self.write({"section": section, **label, **row})
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def verify_rows(probe: Probe, device, dtype, bandwidth) -> None:
    flush = FLUSH_BYTES if device.type == "cuda" else 0
    repeats = 50 if device.type == "cuda" else 2
    rows = [(shape, op) for ops_ in (VERIFY_OPS, NEW_VERIFY_OPS) for shape in VERIFY_SHAPES[probe.mode] for op in ops_]
    for (batch, g, vocab), op in rows:
        case = bv.Case(op, batch, g, vocab, "natural", dtype, device)
        for backend in bv.backends_for(op, device):
            if backend == "torch" and device.type == "cuda":
                continue  # the reference is what `exact` compares with, not a contender
            probe.run("verify", {"op": op, "B": batch, "g": g, "V": vocab, "backend": backend},
                      lambda: bv.measure(case, backend, repeats, bandwidth, flush_bytes=flush))


def attention_rows(probe: Probe, device, dtype, bandwidth) -> None:
    shape = ATTENTION[probe.mode]
    case = ba.Case(shape["batch"], shape["prefix"], shape["nodes"], "uniform", "tree", "contiguous", shape["hq"],
                   shape["hkv"], shape["head_dim"], dtype, device)
    impls = [impl for impl in ba.implementations(device) if impl != "flex"]  # Flex compiles for minutes
    label = {"B": case.batch, "P": case.prefix, "N": case.nodes, "Hq": case.hq, "Hkv": case.hkv, "D": case.head_dim}
    repeats = 100 if device.type == "cuda" else 2
    if probe.over_budget("attention", label):
        return
    for row in ba.measure(case, impls, repeats, bandwidth):  # every implementation on the same inputs
        probe.write({"section": "attention", **row})


def kv_rows(probe: Probe, device, dtype, bandwidth) -> None:
    shape = KV[probe.mode]
    case = bk.Case(shape["batch"], shape["nodes"], shape["layers"], shape["heads"], shape["dim"], shape["prefix"],
                   "stacked", dtype, device)
    nominal = bk.nominal_bandwidth(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    repeats = 50 if device.type == "cuda" else 2
    for backend in bk.backends_for(device):
        if backend == "torch" and device.type == "cuda":
            continue
        probe.run("kv", {"B": case.batch, "N": case.nodes, "L": case.layers, "backend": backend},
                  lambda: bk.measure(case, backend, repeats, bandwidth, nominal))


def exit_rows(probe: Probe, device, dtype) -> None:
    nominal = bk.nominal_bandwidth(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    repeats = 50 if device.type == "cuda" else 2
    for batch, hidden, vocab in EXIT[probe.mode]:
        case = bx.Case(batch, hidden, vocab, dtype, device)
        for backend in bx.backends_for(device):
            probe.run("exit", {"B": batch, "H": hidden, "V": vocab, "backend": backend},
                      lambda: bx.measure(case, backend, repeats, nominal))


def engine_rows(probe: Probe, device, dtype) -> None:
    import specdec_kernels
    from specdec_kernels.demo import PROMPTS, batches, load_pair

    models = argparse.Namespace(models=None, target=None, draft=None, specdec_drafter=None)
    pair = load_pair(models, device, dtype)
    pad, new = pair.tokenizer.pad_token_id, ENGINE_TOKENS[probe.mode]
    common = dict(max_new_tokens=new, pad_token_id=pad, eos_token_id=[])
    modes = (False, True) if device.type == "cuda" else (False,)
    for rows in ENGINE_BATCHES[probe.mode]:
        batch = batches(pair.tokenizer, PROMPTS, rows, device)[0]

        def hf_greedy():
            with torch.no_grad():
                pair.target.generate(**batch, do_sample=False, **common)
            return new  # one forward per token

        probe.run("engine", {"method": "hf_greedy", "B": rows, "graphs": False}, lambda: timed_steps(hf_greedy, device))
        for name in ("plain", "speculative"):
            for graphs in modes:
                def ours():
                    out = specdec_kernels.generate(pair.target, batch["input_ids"],
                                                   attention_mask=batch["attention_mask"], strategy=name,
                                                   cuda_graphs=graphs, **common, **pair.options[name])
                    return out.stats.steps

                probe.run("engine", {"method": name, "B": rows, "graphs": graphs}, lambda: timed_steps(ours, device))


def timed_steps(call, device, repeats: int = 3) -> dict:
    """call() -> engine steps; a warm-up call (JIT, graph capture), then the median of `repeats`."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call()
    seconds, steps = [], 0
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        steps = call()
        sync()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"steps": steps, "ms_per_call": round(1e3 * median, 2), "us_per_step": round(1e6 * median / max(steps, 1), 1),
            "spread_ms": [round(1e3 * min(seconds), 2), round(1e3 * max(seconds), 2)]}


SECTIONS = ("verify", "attention", "kv", "exit", "engine")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines file rows are appended to")
    parser.add_argument("--dry-run", action="store_true", help="CPU stand-in: tiny shapes, no timing claims")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds after which no new row starts")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here; --dry-run runs the probe's code paths on the CPU")
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.bfloat16
    probe = Probe(args.out, args.budget, "dry" if args.dry_run else "gpu")
    bandwidth = copy_bandwidth(device)
    probe.write({"section": "facts", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "dry_run": args.dry_run, "copy_bandwidth_GBps": round(bandwidth / 1e9, 1) if bandwidth else None,
                 "flush_bytes": FLUSH_BYTES if device.type == "cuda" else 0})
    wanted = set(args.sections)
    for section, rows in (("verify", lambda: verify_rows(probe, device, dtype, bandwidth)),
                          ("attention", lambda: attention_rows(probe, device, dtype, bandwidth)),
                          ("kv", lambda: kv_rows(probe, device, dtype, bandwidth)),
                          ("exit", lambda: exit_rows(probe, device, dtype)),
                          ("engine", lambda: engine_rows(probe, device, dtype))):
        if section in wanted:
            try:
                rows()
            except Exception as error:  # noqa: BLE001 - one section's failure must not cost the others
                probe.write({"section": section, "error": one_line(error)})
    probe.write({"section": "done", "seconds": round(time.perf_counter() - probe.start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
