"""bench/gpu_probe.py's `questions` section: what the static review of the kernels (issue 47) left to a GPU, each
as rows that answer it; the figures live in the rows, never in an assert, and a fix waits for them:

  rank table   does a pass of CUDA tree_rejection_sample slow down with the rejections before it? A star of K
               siblings at the root whose tokens p gives no mass (every one rejected: K + 1 passes over V), K in
               {4, 32}, B in {1, 64}, V 128256, bf16, both sibling rules, the form the plan picks; us and us per
               pass. Without replacement a pass reads p and q only, plus, per 16-byte slot, the rank table's
               entries of every earlier rejection from L2: if us per pass grows from K = 4 to K = 32 beyond the
               independent rule's extra q row a rank, those loads cost (then: stage the table in shared memory)
  exit B > 32  does the tensor-core early_exit_topk restage the hidden state per k-block past B = 32? CUDA at
               B 32, 33, 48, 64 (H 4096, V 128256, bf16): us per batch row; a step from 32 to 33 is the restaging

    python bench/gpu_probe.py --sections questions --out probe.jsonl    # these rows alone (~15 s, an estimate)
"""

import torch

import bench_early_exit_topk as bx  # bench/ is on sys.path: the probe's folder
import bench_verify as bv
from _timing import FLUSH_BYTES
from specdec_kernels import ops
from specdec_kernels.selftest.tree_inputs import sampled_sibling_tokens

RANK_TABLE = {"gpu": dict(siblings=(4, 32), batches=(1, 64), vocab=128256),
              "dry": dict(siblings=(2, 4), batches=(1,), vocab=64)}
EXIT_BATCHES = {"gpu": ((4096, 128256), (32, 33, 48, 64)), "dry": ((64, 200), (2, 3))}  # (H, V), batches
RULES = ("independent", "without_replacement")


def star_inputs(batch: int, siblings: int, vocab: int, rule: str, dtype, device) -> dict:
    """The root and `siblings` children, every child's token of p-mass 0 at the root: all rejected."""
    gen = torch.Generator(device=device).manual_seed(siblings + batch)
    n = siblings + 1
    parents = torch.tensor([-1] + [0] * siblings, device=device).expand(batch, n).contiguous()
    logits = torch.randn(batch, n, vocab, generator=gen, device=device)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(logits.shape, generator=gen, device=device), -1)
    if rule == "without_replacement":
        tokens = sampled_sibling_tokens(q, parents, gen)  # draws from the root's q, all distinct
    else:
        q = q[:, :1].expand(batch, n, vocab).contiguous()  # every child drafted from the root's q
        tokens = torch.randint(0, vocab, (batch, n), generator=gen, device=device)
    tokens[:, 0] = 0
    p[:, 0].scatter_(1, tokens[:, 1:], 0.0)
    return dict(target_probs=p.to(dtype), draft_probs=q.to(dtype), tree_tokens=tokens, parents=parents,
                seed=7, siblings=rule)


def rank_table_rows(probe, device: torch.device, dtype, repeats: int, flush: int) -> None:
    shape = RANK_TABLE[probe.mode]
    backend = "cuda" if device.type == "cuda" else "triton"  # the dry run: the same plumbing, interpreted
    for batch in shape["batches"]:
        for siblings in shape["siblings"]:
            for rule in RULES:
                label = {"question": "rank table", "op": "tree_rejection_sample", "siblings": rule, "K": siblings,
                         "B": batch, "V": shape["vocab"], "backend": backend}
                probe.run("questions", label, lambda: time_star(batch, siblings, shape["vocab"], rule, dtype, device,
                                                                backend, repeats, flush))


def time_star(batch, siblings, vocab, rule, dtype, device, backend, repeats, flush) -> dict:
    inputs = star_inputs(batch, siblings, vocab, rule, dtype, device)
    call = lambda: ops.tree_rejection_sample(**inputs, backend=backend)  # noqa: E731
    out = call()
    us = bv.time_graph(call, repeats, flush) if device.type == "cuda" else None
    us = us if us is not None else bv.time_eager(call, device, repeats, flush)
    row = {"us": round(us, 2), "us_per_pass": round(us / (siblings + 1), 2),
           "exact": all(torch.equal(a, b) for a, b in zip(out, ops.tree_rejection_sample(**inputs, backend="torch"))),
           "all_rejected": bool((out[1] == 0).all())}
    if backend == "cuda":
        from specdec_kernels.common import cuda_module

        row["form"] = cuda_module.load().tree_rejection_sample_plan(batch, siblings + 1, vocab, 0, 0)["form"]
    return row


def exit_rows(probe, device: torch.device, dtype, bandwidth, repeats: int) -> None:
    (hidden, vocab), batches = EXIT_BATCHES[probe.mode]
    backend = "cuda" if "cuda" in bx.backends_for(device) else "triton"
    for batch in batches:
        case = bx.Case(batch, hidden, vocab, dtype, device)
        label = {"question": "early_exit B > 32", "B": batch, "H": hidden, "V": vocab, "backend": backend}

        def measure(case=case, batch=batch):
            row = bx.measure(case, backend, repeats, bandwidth)
            return {**row, "us_per_row": round(row["us"] / batch, 2)}
        probe.run("questions", label, measure)


def question_rows(probe, device: torch.device, dtype, bandwidth) -> None:
    repeats = 50 if device.type == "cuda" else 2
    flush = FLUSH_BYTES if device.type == "cuda" else 0
    rank_table_rows(probe, device, dtype, repeats, flush)
    exit_rows(probe, device, dtype, bandwidth, repeats)
