"""The timing probe of the first GPU look: the timings that decide what to optimise next, in about 90 s.

Each row is one implementation at one shape, in microseconds and as a percentage of its bound, appended to
OUT as one JSON line the moment it is measured (a probe cut off by its timeout keeps every row it finished).
Every timed call starts with a cold L2 (a 256 MiB write before it; do_bench's own flush for attention), and
every "% of bound" is bench/_bound.py's: the bytes the op must move / time / the measured copy bandwidth
(read + written bytes per second of a 256 MiB device copy). In the order of the decisions they inform:

  verify     the ops never timed on a GPU first (block_verify, block_verify_logits, tree_rejection_sample
             with siblings="without_replacement", label tree_rejection_sample_wr), then greedy_verify,
             rejection_sample, rejection_sample_logits, tree_greedy_verify and tree_rejection_sample, each at
             (B=1, g=4, V=151936) and (B=64, g=4, V=128256), bf16, natural acceptance: ours (cuda, triton) vs
             the naive torch chain where there is one, CUDA-graph replay; pct_bound for bench_verify's
             minimal bytes (block_verify: every row, (2g+1) V per request), pct_nominal for every row
  attention  tree_attention bf16, Hq=32, Hkv=8, D=128, a random tree, at two shapes, (B=8, P=4096, N=32) and
             (B=1, P=32768, N=64): cuda, triton and SDPA with a dense mask; pct_bound for the K/V read
  kv         kv_compact over 32 layers (B=8, N=64, Hkv=8, D=128, bf16, one allocation): ours vs
             index_select + copy_; pct_bound for the bytes that move
  exit       early_exit_topk B in {1, 8}, H=4096, V=128256, bf16: ours vs torch.topk(lm_head(norm(h)));
             pct_bound for the weight read
  targets    a row for each performance target that the sections above do not time at its own shape
             (bench/_probe_targets.py: B=1 at V=128256, early_exit_topk at B=64 and as `auto` picks it,
             tree_attention's other target shapes, the host path per eager call); last, so a tight budget
             lists them as skipped; `--sections targets` runs them alone
  questions  what the review of the kernels left to a GPU (bench/_probe_questions.py): whether a tree
             sampling pass slows with the rank table of the rejections before it (K 4 and 32 rejected
             siblings), whether the tensor-core early_exit_topk restages its hidden state past B = 32
The end-to-end figures are bench/e2e.py's (the first look's e2e stage), not the probe's.

    python bench/gpu_probe.py --out probe.jsonl                  # on a GPU (~90 s on an H100, an estimate)
    python bench/gpu_probe.py --dry-run --out /tmp/probe.jsonl   # CPU stand-in: tiny shapes, Triton
                                                                 # interpreted, no timing claims

--budget S stops starting new rows after S seconds (the rows not run are listed as skipped).
"""

import argparse
import json
import os
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
from _probe_questions import question_rows  # noqa: E402
from _probe_targets import target_rows  # noqa: E402
from _timing import FLUSH_BYTES, copy_bandwidth  # noqa: E402

NEW_VERIFY_OPS = ("block_verify", "block_verify_logits", "tree_rejection_sample_wr")  # never timed on a GPU: first
VERIFY_OPS = ("greedy_verify", "rejection_sample", "rejection_sample_logits", "tree_greedy_verify",
              "tree_rejection_sample")
VERIFY_SHAPES = {"gpu": ((1, 4, 151936), (64, 4, 128256)), "dry": ((1, 2, 50), (3, 2, 64))}
ATTENTION = {"gpu": (dict(batch=8, prefix=4096, nodes=32), dict(batch=1, prefix=32768, nodes=64)),
             "dry": (dict(batch=2, prefix=40, nodes=5), dict(batch=1, prefix=64, nodes=8))}
ATTENTION_HEADS = {"gpu": dict(hq=32, hkv=8, head_dim=128), "dry": dict(hq=4, hkv=2, head_dim=16)}
KV = {"gpu": dict(batch=8, nodes=64, layers=32, heads=8, dim=128, prefix=1024),
      "dry": dict(batch=2, nodes=8, layers=2, heads=2, dim=16, prefix=16)}
EXIT = {"gpu": ((1, 4096, 128256), (8, 4096, 128256)), "dry": ((1, 64, 200), (3, 64, 200))}


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
    rows = [(shape, op) for ops_ in (NEW_VERIFY_OPS, VERIFY_OPS) for shape in VERIFY_SHAPES[probe.mode] for op in ops_]
    for (batch, g, vocab), op in rows:
        case = bv.Case(op, batch, g, vocab, "natural", dtype, device)
        for backend in bv.backends_for(op, device):
            if backend == "torch" and device.type == "cuda":
                continue  # the reference is what `exact` compares with, not a contender
            probe.run("verify", {"op": op, "B": batch, "g": g, "V": vocab, "backend": backend},
                      lambda: bv.measure(case, backend, repeats, bandwidth, flush_bytes=flush))


def attention_rows(probe: Probe, device, dtype, bandwidth) -> None:
    heads = ATTENTION_HEADS[probe.mode]
    impls = [impl for impl in ba.implementations(device) if impl != "flex"]  # Flex compiles for minutes
    repeats = 100 if device.type == "cuda" else 2
    for shape in ATTENTION[probe.mode]:
        case = ba.Case(shape["batch"], shape["prefix"], shape["nodes"], "uniform", "tree", "contiguous", heads["hq"],
                       heads["hkv"], heads["head_dim"], dtype, device)
        label = {"B": case.batch, "P": case.prefix, "N": case.nodes, "Hq": case.hq, "Hkv": case.hkv,
                 "D": case.head_dim}
        if probe.over_budget("attention", label):
            return
        for row in ba.measure(case, impls, repeats, bandwidth):  # every implementation on the same inputs
            probe.write({"section": "attention", **row})


def kv_rows(probe: Probe, device, dtype, bandwidth) -> None:
    shape = KV[probe.mode]
    case = bk.Case(shape["batch"], shape["nodes"], shape["layers"], shape["heads"], shape["dim"], shape["prefix"],
                   "stacked", dtype, device)
    repeats = 50 if device.type == "cuda" else 2
    for backend in bk.backends_for(device):
        if backend == "torch" and device.type == "cuda":
            continue
        probe.run("kv", {"B": case.batch, "N": case.nodes, "L": case.layers, "backend": backend},
                  lambda: bk.measure(case, backend, repeats, bandwidth))


def exit_rows(probe: Probe, device, dtype, bandwidth) -> None:
    repeats = 50 if device.type == "cuda" else 2
    for batch, hidden, vocab in EXIT[probe.mode]:
        case = bx.Case(batch, hidden, vocab, dtype, device)
        for backend in bx.backends_for(device):
            probe.run("exit", {"B": batch, "H": hidden, "V": vocab, "backend": backend},
                      lambda: bx.measure(case, backend, repeats, bandwidth))


SECTIONS = ("verify", "attention", "kv", "exit", "targets", "questions")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines file rows are appended to")
    parser.add_argument("--dry-run", action="store_true", help="CPU stand-in: tiny shapes, no timing claims")
    parser.add_argument("--budget", type=float, default=80.0, help="seconds after which no new row starts")
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
                          ("exit", lambda: exit_rows(probe, device, dtype, bandwidth)),
                          ("targets", lambda: target_rows(probe, device, dtype, bandwidth)),
                          ("questions", lambda: question_rows(probe, device, dtype, bandwidth))):
        if section in wanted:
            try:
                rows()
            except Exception as error:  # noqa: BLE001 - one section's failure must not cost the others
                probe.write({"section": section, "error": one_line(error)})
    probe.write({"section": "done", "seconds": round(time.perf_counter() - probe.start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
