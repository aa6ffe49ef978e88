"""bench/gpu_probe.py's `targets` section: a row for each performance target of the kernels' plan that the
probe's other sections do not time at the target's own shape (H100/H200, bf16, g=4, V=128256, L2 flushed,
graph replay; each target's figure lives here and in its rows, never in an assert):

  verify     rejection_sample_logits B=1 (target <= 25 us), tree_rejection_sample B=1 with both sibling rules
             (<= 30 us): the verify section times B=1 at V=151936 (its B=64 rows are at the targets' shape:
             rejection_sample_logits <= 85 us, tree_rejection_sample <= 80 us, tree_greedy_verify Triton
             within 1.3x of CUDA, rejection_sample >= 50% of its bound); then CUDA tree_rejection_sample with
             each form forced (SPECDEC_TREE_FORM: the sm_90 cluster form and the work-stealing split form) at
             B 1 and 64, both sibling rules
  exit       early_exit_topk at B=64 (H 4096, V 128256) beside torch.topk(lm_head(norm(h))), the torch backend
             that `auto` takes there, and `auto` itself at B 1, 8, 64 (target: faster than the baseline at
             every B, >= 60% of the weight-read bound at B <= 8)
  attention  tree_attention at the target's other shapes, B 8/32 x N 8/32 at P 4096 (the attention section
             has B=8 N=32): cuda, triton, SDPA with a dense mask (target: >= 70% of HBM)
  host       every op's host path per eager call on CUDA tensors, kernels stubbed, and kv_compact at 32
             layers with its kernels launched (bench/host_overhead.py; target <= 30 us)

    python bench/gpu_probe.py --sections targets --out probe.jsonl    # only these rows (~40 s on an H100, an
                                                                      # estimate: ~28 rows at ~1 s, compiles)
"""

import torch

import bench_early_exit_topk as bx  # bench/ is on sys.path: the probe's folder
import bench_tree_attention as ba
import bench_verify as bv
import host_overhead
from _timing import FLUSH_BYTES
from specdec_kernels.cuda.tree_verify import forced_tree_form

HOST_TARGET = "host path <= 30 us per eager call"
VERIFY = {  # (op, B, g, V, target)
    "gpu": (("rejection_sample_logits", 1, 4, 128256, "B=1 <= 25 us"),
            ("tree_rejection_sample", 1, 4, 128256, "B=1 <= 30 us"),
            ("tree_rejection_sample_wr", 1, 4, 128256, "B=1 <= 30 us")),
    "dry": (("rejection_sample_logits", 1, 2, 50, "B=1 <= 25 us"), ("tree_rejection_sample", 1, 2, 50, "B=1 <= 30 us"),
            ("tree_rejection_sample_wr", 1, 2, 50, "B=1 <= 30 us")),
}
# The CUDA tree_rejection_sample kernel has two forms (cuda/tree_verify.py): the sm_90 cluster form, which the
# plan picks there, and the work-stealing split form; each is timed forced, at both target batches.
TREE_FORMS = ("split", "cluster")
TREE_FORM_ROWS = {"gpu": ((1, "B=1 <= 30 us"), (64, "B=64 <= 80 us")), "dry": ((1, "B=1 <= 30 us"),)}
EXIT = {"gpu": (4096, 128256, 64, (1, 8, 64)), "dry": (64, 200, 3, (1, 3))}  # H, V, the new B, the B of `auto`
EXIT_TARGET = "faster than torch.topk(lm_head(norm(h))) at B 1/8/64; >= 60% of the bound at B <= 8"
ATTENTION = {"gpu": ((8, 4096, 8), (32, 4096, 8), (32, 4096, 32)), "dry": ((3, 40, 5),)}  # B, P, N
ATTENTION_TARGET = ">= 70% of nominal HBM at P >= 4096"
HOST_REPEATS = {"gpu": (11, 50), "dry": (1, 2)}  # rounds, calls per round


def target_rows(probe, device: torch.device, dtype: torch.dtype, bandwidth) -> None:
    """Every row of the section, cheapest first (host, verify, exit, attention)."""
    rounds, calls = HOST_REPEATS[probe.mode]
    if not probe.over_budget("targets", {"target": HOST_TARGET}):
        for row in host_overhead.gpu_rows(device, rounds=rounds, calls=calls):
            probe.write({"section": "targets", "target": HOST_TARGET, **row})
    flush = FLUSH_BYTES if device.type == "cuda" else 0
    repeats = 50 if device.type == "cuda" else 2
    for op, batch, g, vocab, target in VERIFY[probe.mode]:
        case = bv.Case(op, batch, g, vocab, "natural", dtype, device)
        for backend in bv.backends_for(op, device):
            if backend == "torch" and device.type == "cuda":
                continue  # the reference is what `exact` compares with
            probe.run("targets", {"target": f"{op} {target}", "op": op, "B": batch, "g": g, "V": vocab,
                                  "backend": backend},
                      lambda: bv.measure(case, backend, repeats, bandwidth, flush_bytes=flush))
    tree_form_rows(probe, device, dtype, bandwidth, flush, repeats)
    hidden, vocab, batch, auto_batches = EXIT[probe.mode]
    exit_cases = [(batch, backend) for backend in (*bx.backends_for(device), "torch")]
    exit_cases += [(b, "auto") for b in auto_batches]
    for batch, backend in exit_cases:
        case = bx.Case(batch, hidden, vocab, dtype, device)
        probe.run("targets", {"target": f"early_exit_topk {EXIT_TARGET}", "B": batch, "H": hidden, "V": vocab,
                              "backend": backend},
                  lambda: bx.measure(case, backend, repeats, bandwidth))
    impls = [impl for impl in ba.implementations(device) if impl != "flex"]  # Flex compiles for minutes
    for batch, prefix, nodes in ATTENTION[probe.mode]:
        heads = (32, 8, 128) if probe.mode == "gpu" else (4, 2, 16)
        case = ba.Case(batch, prefix, nodes, "uniform", "tree", "contiguous", *heads, dtype, device)
        label = {"target": f"tree_attention {ATTENTION_TARGET}", "B": batch, "P": prefix, "N": nodes}
        if probe.over_budget("targets", label):
            return
        for row in ba.measure(case, impls, 100 if device.type == "cuda" else 2, bandwidth):
            probe.write({"section": "targets", **label, **row})


def tree_form_rows(probe, device: torch.device, dtype: torch.dtype, bandwidth, flush: int, repeats: int) -> None:
    """CUDA tree_rejection_sample (both sibling rules) with each form forced through SPECDEC_TREE_FORM; a form
    the device cannot run (the cluster form below sm_90) is a row with its error."""
    _, _, g, vocab, _ = VERIFY[probe.mode][1]
    for op in ("tree_rejection_sample", "tree_rejection_sample_wr"):
        if "cuda" not in bv.backends_for(op, device):
            return
        for batch, target in TREE_FORM_ROWS[probe.mode]:
            case = bv.Case(op, batch, g, vocab, "natural", dtype, device)
            for form in TREE_FORMS:
                with forced_tree_form(form):
                    probe.run("targets", {"target": f"{op} {target}", "op": op, "B": batch, "g": g, "V": vocab,
                                          "backend": "cuda", "form": form},
                              lambda: bv.measure(case, "cuda", repeats, bandwidth, flush_bytes=flush))
