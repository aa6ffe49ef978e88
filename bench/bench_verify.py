"""Microbenchmark of the verification ops: every backend side by side.

Ops: rejection_sample (probs in), rejection_sample_logits, greedy_verify, relaxed_verify,
bild_verify, max_prob (the BiLD fallback score), tree_greedy_verify, tree_rejection_sample
(a binary tree of g+1 nodes, siblings drawn independently), block_verify and
block_verify_logits (block verification on the chain inputs of rejection_sample /
rejection_sample_logits) and tree_rejection_sample_wr (tree_rejection_sample with
siblings="without_replacement": the two children of node v drawn without replacement from
q_v = draft_probs[:, v]). Backends: a naive PyTorch chain (gather, ratio, cumprod, residual,
multinomial: what HF-style code does) for the chain sampling, block and greedy ops, and every
backend of ours available here (torch reference, triton, cuda).
Acceptance regimes: "reject0" (the first draft always fails), "natural" (drafts from a
perturbed target, the realised acceptance is recorded) and "acceptall" (p == q / drafts
equal the argmax).

Reported per call: median microseconds (CUDA-graph replay on a GPU when the call can be
captured, else eager; L2 flushed before every timed call unless --warm-l2), and, in the one
convention of bench/_bound.py (bytes / time / the measured copy bandwidth), pct_bound for the
bytes the contract must read (minimal_bytes) and pct_nominal for all of p and q (what a
kernel that streams every row reads).

    python bench/bench_verify.py --out bench/results          # GPU: the full grid
    python bench/bench_verify.py --smoke --out /tmp/bench      # tiny shapes (CI, CPU)
    python bench/bench_verify.py --ops rejection_sample --batch 1 64 --out /tmp/b   # a slice
    pytest bench/ --benchmark-only                             # the same cases as a pytest-benchmark suite
"""

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_kernels import ops
from specdec_kernels.selftest.tree_inputs import sampled_sibling_tokens

from _bound import pct_of_bound  # noqa: E402  (bench/ is on sys.path: script dir or pytest rootdir)
from _report import base_parser, write_report  # noqa: E402
# capture_graph, copy_bandwidth and time_eager are also bench_tree_attention's, through this module
from _timing import FLUSH_BYTES, capture_graph, copy_bandwidth, time_eager  # noqa: E402,F401

FULL = {"B": (1, 8, 64, 256), "g": (1, 4, 8), "V": (32000, 128256, 151936)}
SMOKE = {"B": (1, 3), "g": (1, 4), "V": (50,)}
REGIMES = ("reject0", "natural", "acceptall")
OPS = ("rejection_sample", "greedy_verify", "rejection_sample_logits", "relaxed_verify", "bild_verify", "max_prob",
       "tree_greedy_verify", "tree_rejection_sample", "block_verify", "block_verify_logits", "tree_rejection_sample_wr")
# bench labels that are one op of `ops` called with extra keyword arguments
VARIANTS = {"tree_rejection_sample_wr": ("tree_rejection_sample", {"siblings": "without_replacement"})}
LOGIT_OPS = ("greedy_verify", "relaxed_verify", "bild_verify", "tree_greedy_verify")  # drafts judged by argmax
SAMPLING_OPS = ("rejection_sample", "rejection_sample_logits", "tree_rejection_sample", "block_verify",
                "block_verify_logits", "tree_rejection_sample_wr")
LOGITS_SAMPLING_OPS = ("rejection_sample_logits", "block_verify_logits")  # sampled drafts, logits in
NAIVE_OPS = ("rejection_sample", "rejection_sample_logits", "greedy_verify", "block_verify", "block_verify_logits")
# ops whose backends must equal the reference bit for bit (the others use exp/log: see their docs)
BIT_EXACT_OPS = ("rejection_sample", "greedy_verify", "relaxed_verify", "tree_greedy_verify", "tree_rejection_sample",
                 "block_verify", "tree_rejection_sample_wr")


def op_call(op: str) -> tuple[str, dict]:
    """The `ops` function behind a bench label and the keyword arguments the label adds."""
    return VARIANTS.get(op, (op, {}))


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


def binary_tree(batch: int, n: int, device) -> torch.Tensor:
    """parents [B, n] of a complete binary tree (node i's parent is (i - 1) // 2)."""
    parents = (torch.arange(n, device=device) - 1).div(2, rounding_mode="floor")
    parents[0] = -1
    return parents.expand(batch, n).contiguous()


def make_inputs(case: Case, seed: int = 0) -> dict:
    gen = torch.Generator(device=case.device).manual_seed(seed)
    shape = (case.batch, case.g + 1, case.vocab)
    logits = torch.randn(shape, device=case.device, generator=gen) * 3
    tree = case.op.startswith("tree_")
    if tree:  # the same g + 1 rows, read as the nodes of a binary tree
        parents = binary_tree(case.batch, case.g + 1, case.device)
    if case.op == "max_prob":
        return {"logits": logits[:, 0].to(case.dtype)}
    if case.op in LOGIT_OPS:
        top = logits.argmax(-1)
        if tree:  # node i's token should match its parent's argmax
            top = top.gather(1, parents.clamp(min=0))
        else:
            top = top[:, : case.g]
        drafts = top if case.regime == "acceptall" else (top + 1) % case.vocab
        if case.regime == "natural":  # accept a random prefix
            keep = torch.rand(drafts.shape, device=case.device, generator=gen) < 0.7
            drafts = torch.where(keep, top, drafts)
        inputs = {"target_logits": logits.to(case.dtype)}
        if tree:
            return {**inputs, "tree_tokens": drafts, "parents": parents, "max_depth": max_depth(case.g + 1)}
        inputs["draft_tokens"] = drafts
        if case.op == "relaxed_verify":
            inputs.update(top_beta=3, tau=2.0)
        if case.op == "bild_verify":
            inputs["rollback_threshold"] = 4.0
        return inputs
    noise = 0.0 if case.regime == "acceptall" else 1.0
    draft_logits = logits + noise * torch.randn(logits.shape, device=case.device, generator=gen)
    without_replacement = case.op == "tree_rejection_sample_wr"
    if tree and not without_replacement:  # node i is drafted from q at its parent: row i of draft_probs is q[parent(i)]
        draft_logits = draft_logits.gather(1, parents.clamp(min=0).unsqueeze(-1).expand(shape))
    elif not tree:
        draft_logits = draft_logits[:, : case.g]
    p = torch.softmax(logits, -1)
    q = torch.softmax(draft_logits, -1)
    if without_replacement:  # row v is q_v; v's children are draws without replacement from it (Gumbel-top-k)
        drafts = sampled_sibling_tokens(q, parents, gen)
        drafts[:, 0] = 0  # the root's token is not judged
    else:
        drafts = torch.multinomial(q.reshape(-1, case.vocab), 1, generator=gen).reshape(q.shape[:2])
    uniforms = torch.rand(case.batch, q.shape[1] + (0 if tree else 1), device=case.device, generator=gen)
    if case.regime == "reject0":  # p(x) = 0 for the first draft(s) at the root: rejected
        first = drafts[:, 1:3] if tree else drafts[:, :1]
        p[:, 0].scatter_(1, first, 0.0)
        logits[:, 0].scatter_(1, first, float("-inf"))
    if case.op in LOGITS_SAMPLING_OPS:
        return {"target_logits": logits.to(case.dtype), "draft_logits": draft_logits.to(case.dtype),
                "draft_tokens": drafts, "uniforms": uniforms}
    if tree:
        return {"target_probs": p.to(case.dtype), "draft_probs": q.to(case.dtype), "tree_tokens": drafts,
                "parents": parents, "uniforms": uniforms, "max_depth": max_depth(case.g + 1)}
    return {"target_probs": p.to(case.dtype), "draft_probs": q.to(case.dtype), "draft_tokens": drafts,
            "uniforms": uniforms}


def max_depth(n: int) -> int:
    return max(n - 1, 0).bit_length()  # depth of node n - 1 in a binary heap


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


def naive_torch_chain_logits(target_logits, draft_logits, draft_tokens, uniforms):
    """The naive chain on logits: materialise both softmaxes first."""
    return naive_torch_chain(torch.softmax(target_logits.float(), -1), torch.softmax(draft_logits.float(), -1),
                             draft_tokens, uniforms)


def naive_block_verify(target_probs, draft_probs, draft_tokens, uniforms):
    """Block verification (the formula of ops.block_verify) in plain torch: every prefix's
    ratio p_i, every position's residual mass Z(i) and threshold h_i, then the pick."""
    batch, g = draft_tokens.shape
    p = target_probs.float()
    q = draft_probs.float()
    idx = draft_tokens.unsqueeze(-1)
    ratio = p[:, :g].gather(-1, idx).squeeze(-1) / q.gather(-1, idx).squeeze(-1)
    prefix = [torch.ones(batch, device=p.device)]  # p_0 = 1, p_i = min(1, p_{i-1} p(X_i) / q(X_i))
    for i in range(g):
        prefix.append(torch.clamp(prefix[-1] * ratio[:, i], max=1.0))
    prefix = torch.stack(prefix, 1)  # [B, g + 1]
    residual = torch.clamp(prefix[:, :g, None] * p[:, :g] - q, min=0)  # [B, g, V]: residual after i drafts
    z = residual.sum(-1)
    h = torch.cat([z[:, 1:] / (z[:, 1:] + 1 - prefix[:, 1:g]), prefix[:, g:]], 1)  # h_1..h_g
    passed = uniforms[:, :g] < h
    steps = torch.arange(1, g + 1, device=p.device)
    num_accepted = torch.where(passed, steps, 0).amax(1)  # the longest passing prefix
    rows = torch.cat([residual, p[:, g:]], 1)[torch.arange(batch, device=p.device), num_accepted]
    empty = rows.sum(-1, keepdim=True) <= 0  # an empty residual falls back to p
    rows = torch.where(empty, p[torch.arange(batch, device=p.device), num_accepted], rows)
    final = torch.multinomial(rows / rows.sum(-1, keepdim=True), 1).squeeze(1)
    out = torch.where(steps <= num_accepted.unsqueeze(1), draft_tokens, -1)
    return torch.cat([out, final.unsqueeze(1)], 1), num_accepted


def naive_block_verify_logits(target_logits, draft_logits, draft_tokens, uniforms):
    """The naive block verification on logits: materialise both softmaxes first."""
    return naive_block_verify(torch.softmax(target_logits.float(), -1), torch.softmax(draft_logits.float(), -1),
                              draft_tokens, uniforms)


def naive_greedy(target_logits, draft_tokens):
    top = target_logits.argmax(-1)
    g = draft_tokens.shape[1]
    num_accepted = torch.cumprod((top[:, :g] == draft_tokens).long(), 1).sum(1)
    return top, num_accepted


def callable_for(case: Case, backend: str, inputs: dict):
    if backend == "naive":
        naive = {"rejection_sample": naive_torch_chain, "rejection_sample_logits": naive_torch_chain_logits,
                 "greedy_verify": naive_greedy, "block_verify": naive_block_verify,
                 "block_verify_logits": naive_block_verify_logits}[case.op]
        return lambda: naive(**inputs)
    name, extra = op_call(case.op)
    fn = getattr(ops, name)
    return lambda: fn(**inputs, **extra, backend=backend)


def backends_for(op: str, device: torch.device) -> list[str]:
    names = ["naive"] if op in NAIVE_OPS else []
    name, _ = op_call(op)
    for backend in ops.implemented_backends(name):
        try:
            ops.resolve(name, backend, device)
            names.append(backend)
        except (ValueError, RuntimeError):
            pass
    return names


def minimal_bytes(case: Case) -> int:
    """What the contract must read: for rejection_sample and both tree_rejection_sample variants,
    the draft tokens' p and q plus the one row pair (p, q) the final token is drawn from (without
    replacement, a node's first child is judged on q_v(x) as given, so the same bound holds when
    every accepted node took its first child); for block_verify, every draft position's target
    and draft rows plus the bonus row, (2g+1) * V elements per request (each threshold h_i needs
    the residual mass Z(i) over a whole row pair; this is also its nominal bound); for logits in,
    every row (an argmax or a softmax normaliser needs the whole row)."""
    elem = torch.tensor([], dtype=case.dtype).element_size()
    if case.op in ("rejection_sample", "tree_rejection_sample", "tree_rejection_sample_wr"):
        return case.batch * (2 * case.g * elem + 2 * case.vocab * elem)
    return nominal_bytes(case)


def nominal_bytes(case: Case) -> int:
    """Every row of every input, what a kernel that streams all of them reads."""
    elem = torch.tensor([], dtype=case.dtype).element_size()
    rows = {"max_prob": 1, "rejection_sample": 2 * case.g + 1, "rejection_sample_logits": 2 * case.g + 1,
            "block_verify": 2 * case.g + 1, "block_verify_logits": 2 * case.g + 1,
            "tree_rejection_sample": 2 * (case.g + 1),
            "tree_rejection_sample_wr": 2 * (case.g + 1)}.get(case.op, case.g + 1)
    return case.batch * rows * case.vocab * elem


def time_graph(fn, repeats: int, flush_bytes: int = 0) -> float | None:
    """Median microseconds of one call replayed from a CUDA graph, or None if not capturable."""
    graph = capture_graph(fn)
    return None if graph is None else time_eager(graph.replay, torch.device("cuda"), repeats, flush_bytes)


def measure(case: Case, backend: str, repeats: int, bandwidth: float | None, flush_bytes: int = FLUSH_BYTES) -> dict:
    """Every timed call starts with a cold L2 (flush_bytes written before it; 0: a warm L2). Inputs replayed
    back to back without the flush stay in L2: the first H100 run's B=64 rows, timed so, read faster than
    HBM can deliver."""
    inputs = make_inputs(case)
    fn = callable_for(case, backend, inputs)
    out = fn()
    us, mode = None, "eager"
    if case.device.type == "cuda":
        us = time_graph(fn, repeats, flush_bytes)
        mode = "graph" if us is not None else "eager"
    if us is None:
        us = time_eager(fn, case.device, repeats, flush_bytes)
    row = {"op": case.op, "B": case.batch, "g": case.g, "V": case.vocab, "regime": case.regime,
           "dtype": str(case.dtype).replace("torch.", ""), "backend": backend, "us": round(us, 2), "timing": mode,
           "mean_accepted": round(float(out[1].float().mean()), 3) if case.op != "max_prob" else None}
    if backend not in ("naive", "torch"):  # ours must equal the reference
        want = callable_for(case, "torch", inputs)()
        row["exact"] = agrees(case.op, out, want)
    if bandwidth:
        row["pct_bound"] = pct_of_bound(minimal_bytes(case), us * 1e-6, bandwidth)
        row["pct_nominal"] = pct_of_bound(nominal_bytes(case), us * 1e-6, bandwidth)
    row["l2"] = "flushed" if flush_bytes and case.device.type == "cuda" else "warm"
    return row


def agrees(op: str, out, want) -> bool:
    """Bit-exact ops must be equal; max_prob within float32 rounding; the exp/log-based
    ops (bild, the logits path) may differ only in rare rows at a decision boundary."""
    if op == "max_prob":
        return bool(torch.allclose(out, want, rtol=1e-5, atol=1e-6))
    if op in BIT_EXACT_OPS:
        return all(torch.equal(a, b) for a, b in zip(out, want))
    same_rows = (out[0] == want[0]).all(dim=1) & (out[1] == want[1])
    return float(same_rows.float().mean()) >= 0.99


def grid(smoke: bool, dtype: torch.dtype, device: torch.device, ops_=OPS, batches=None, vocabs=None) -> list[Case]:
    axes = SMOKE if smoke else FULL
    cases = []
    for op, b, g, v in itertools.product(ops_, batches or axes["B"], axes["g"], vocabs or axes["V"]):
        regimes = ("natural",) if op == "max_prob" else REGIMES  # max_prob has no drafts
        cases += [Case(op, b, g, v, regime, dtype, device) for regime in regimes]
    return cases


def write_results(rows: list[dict], out: Path, command: str, bandwidth: float | None) -> None:
    cols = ["op", "B", "g", "V", "regime", "dtype", "backend", "us", "timing", "l2", "pct_bound", "pct_nominal",
            "mean_accepted", "exact"]
    gbps = round(bandwidth / 1e9, 1) if bandwidth else None
    write_report(rows, out, "verify", "Verification ops", cols, command, {"copy_bandwidth_GBps": gbps},
                 f"copy bandwidth {gbps} GB/s (read + write); pct_bound = minimal bytes / time / copy bandwidth, "
                 "pct_nominal = every row's bytes / time / copy bandwidth (bench/_bound.py)")


def main(argv=None) -> int:
    parser = base_parser(__doc__)
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--vocab", nargs="+", type=int, default=None, help="override the V axis")
    parser.add_argument("--warm-l2", action="store_true",
                        help="do not flush L2 before each timed call (inputs that fit stay cached between replays)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type == "cpu"
    repeats = args.repeats or (3 if smoke else 200)
    bandwidth = copy_bandwidth(device)
    rows = []
    for case in grid(smoke, getattr(torch, args.dtype), device, args.ops, args.batch, args.vocab):
        for backend in backends_for(case.op, device):
            rows.append(measure(case, backend, repeats, bandwidth, 0 if args.warm_l2 else FLUSH_BYTES))
            print(json.dumps(rows[-1]), flush=True)
    write_results(rows, args.out, "python " + " ".join(sys.argv), bandwidth)
    return 0 if all(r.get("exact", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
