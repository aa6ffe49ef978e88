"""`specdec-kernels selftest`: every GPU kernel against the torch reference on this GPU.

Runs every op of `specdec_kernels.ops` on every GPU backend this install has (cuda, triton)
at small and production shapes (vocabularies up to 151936, batches up to 256, trees up to 64
nodes, tree attention over 4096-token prefixes, contiguous and paged KV, head dims 64 and
128, float32/float16/bfloat16), captures each op once in a CUDA graph and replays it on new
inputs, and decodes with the embedded default models through every strategy, with and
without CUDA graphs, asking for the target's own greedy tokens. Prints a pass/fail matrix
(ops x backends) with the device, driver and versions, then every failure in detail.

Each check compares a backend with `backend="torch"` (the reference) on the same inputs:
token outputs bit for bit (sampling with caller-supplied uniforms or a seed); attention and
probabilities within per-dtype tolerances; the two ops whose decisions depend on a
logsumexp (bild_verify, rejection_sample_logits) exactly away from a 1e-4..1e-3 band
around each decision boundary (the contract in the README's op table).

Exit status: 0 when nothing failed (skips allowed), 1 when a check failed, 2 without a
CUDA GPU (or on a usage error).

    specdec-kernels selftest                   # everything
    specdec-kernels selftest --quick --json selftest.json
    specdec-kernels selftest --ops tree_attention,greedy_verify --backends triton

`--device cpu` tests the selftest itself (CI): the same matrix at tiny shapes, the Triton
kernels under TRITON_INTERPRET=1 (set by re-running the command), no CUDA graphs.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

PASS, FAIL, SKIP = "pass", "fail", "skip"
GPU_BACKENDS = ("cuda", "triton")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_GPU = ("specdec-kernels selftest: no CUDA GPU is visible (torch.cuda.is_available() is False); "
          "selftest checks the GPU kernels and needs one.")
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write the header, the matrix and every check as JSON")
    parser.add_argument("--quick", action="store_true", help="small shapes only (skips the production shapes)")
    parser.add_argument("--ops", metavar="NAME,...", help="only these ops (default: every registered op)")
    parser.add_argument("--backends", metavar="NAME,...",
                        help="only these backends (default: cuda,triton; an explicitly named backend that "
                             "cannot run here is a failure, a default one a skip)")
    parser.add_argument("--device", default="cuda",
                        help="cuda or cuda:N (default cuda). `cpu` tests the selftest itself: tiny shapes, "
                             "Triton under TRITON_INTERPRET=1, no CUDA graphs")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph capture checks")
    parser.add_argument("--no-engine", action="store_true",
                        help="skip the engine check (every strategy on the embedded default models vs greedy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


# ------------------------------------------------------------------------------------------ data model

@dataclass
class Result:
    """One check: an op on a backend at one case (shape and dtype)."""
    op: str
    backend: str
    case: str
    dtype: str
    status: str
    error: float | None = None  # max abs difference (float outputs) or number of differing entries (tokens)
    message: str = ""
    seconds: float = 0.0


@dataclass
class Case:
    """How to build one problem, run it on a backend and judge a backend's answer.

    build(seed) -> inputs (a dict; tensors on the device; every seed gives the same shapes,
    so a captured graph can be replayed on another seed's values); run(inputs, backend) ->
    a tuple of tensors; compare(got, want, inputs) -> (error, problem or None)."""
    op: str
    name: str
    dtype: torch.dtype | None
    build: Callable[[int], dict]
    run: Callable[[dict, str], tuple]
    compare: Callable[[tuple, tuple, dict], tuple]
    graph: bool = False  # also capture this case in a CUDA graph
    reference: Callable[[dict], tuple] | None = None  # default: run(inputs, "torch")
    backends: tuple = ()  # the backends to check; () = the op's non-torch backends


@dataclass
class Plan:
    device: torch.device
    profile: str  # "tiny" (cpu dev mode), "quick" or "full"
    backends: tuple
    explicit_backends: bool
    ops: tuple
    graphs: bool
    engine: bool
    seed: int
    results: list = field(default_factory=list)
    # capture(device, fn) -> (outputs, replay): how graph checks capture; None = CUDA graphs (on a GPU only).
    # Tests pass an eager stand-in to check the graph-check logic on the CPU.
    capture: Callable | None = None


# ------------------------------------------------------------------------------------------ comparisons

def _short(x: torch.Tensor, limit: int = 12) -> str:
    values = x.flatten().tolist()
    text = ", ".join(str(v) for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"


def exact(names: tuple[str, ...]):
    """Outputs must be equal bit for bit; the problem names the first differing rows."""
    def compare(got, want, inputs):
        for name, g, w in zip(names, got, want):
            if g.shape != w.shape or g.dtype != w.dtype:
                return None, f"{name}: got {g.dtype} {list(g.shape)}, want {w.dtype} {list(w.shape)}"
            differ = g != w
            if g.is_floating_point():
                differ &= ~(torch.isnan(g) & torch.isnan(w))
            count = int(differ.sum())
            if count:
                rows = differ.reshape(differ.shape[0], -1).any(1).nonzero().flatten()[:3].tolist() if g.dim() else []
                detail = "; ".join(f"row {r}: got {_short(g[r])} want {_short(w[r])}" for r in rows)
                return float(count), f"{name}: {count} entries differ ({detail})"
        return 0.0, None
    return compare


def close(names: tuple[str, ...], tolerances: tuple[tuple[float, float], ...]):
    """Float outputs within (atol, rtol) each; NaN must meet NaN."""
    def compare(got, want, inputs):
        worst = 0.0
        for name, g, w, (atol, rtol) in zip(names, got, want, tolerances):
            if g.shape != w.shape or g.dtype != w.dtype:
                return None, f"{name}: got {g.dtype} {list(g.shape)}, want {w.dtype} {list(w.shape)}"
            g, w = g.double(), w.double()
            both_nan = torch.isnan(g) & torch.isnan(w)
            same_inf = torch.isinf(g) & (g == w)
            diff = torch.where(both_nan | same_inf, torch.zeros_like(g), (g - w).abs())
            diff = torch.nan_to_num(diff, nan=math.inf)
            error = float(diff.max()) if diff.numel() else 0.0
            worst = max(worst, error)
            bad = diff > atol + rtol * w.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
            if bool(bad.any()):
                at = tuple(bad.nonzero()[0].tolist())
                return worst, (f"{name}: {int(bad.sum())} of {bad.numel()} values off by more than atol {atol:g} + "
                               f"rtol {rtol:g} (max {error:.3g}; first at {list(at)}: got {float(g[at]):.6g}, "
                               f"want {float(w[at]):.6g})")
        return worst, None
    return compare


# ------------------------------------------------------------------------------------------ inputs

def _gen(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def random_logits(batch, rows, vocab, dtype, gen, device, scale=3.0):
    """randn * scale with each row's max repeated at a random second id in about half the
    rows, so ties (the lowest id must win) show up in every dtype."""
    x = torch.randn(batch, rows, vocab, generator=gen, device=device) * scale
    flat = x.view(-1, vocab)
    dup = torch.rand(flat.shape[0], generator=gen, device=device) < 0.5
    at = torch.randint(0, vocab, (flat.shape[0],), generator=gen, device=device)
    flat[dup, at[dup]] = flat.max(dim=-1).values[dup]
    return x.to(dtype)


def near_top_drafts(logits, gen, wild=0.1):
    """Half the drafts the argmax, the others a token of rank 1..4, a `wild` fraction random
    or -1: accepted prefixes of every length, plus rejections. (Ids >= V would fail the op's
    validation on the CPU; the GPU tests cover them.)"""
    from .reference._sampling import nan_to_neg_inf

    batch, positions, vocab = logits.shape
    g, device = positions - 1, logits.device
    top = torch.topk(nan_to_neg_inf(logits[:, :g]), min(vocab, 5), dim=-1).indices
    rank = torch.randint(0, top.shape[-1], (batch, g), generator=gen, device=device)
    rank = torch.where(torch.rand(batch, g, generator=gen, device=device) < 0.5, torch.zeros_like(rank), rank)
    drafts = top.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    noise = torch.randint(-1, vocab, (batch, g), generator=gen, device=device)  # -1: padding, never accepted
    return torch.where(torch.rand(batch, g, generator=gen, device=device) < wild, noise, drafts)


def random_probs(batch, g, vocab, dtype, gen, device):
    """Close target/draft distributions (drafts often accepted), some zero target entries
    (some rejected), drafts sampled from the draft rows."""
    target = torch.rand(batch, g + 1, vocab, generator=gen, device=device) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen, device=device) < 0.2, 0.0, target)
    target[..., 0] += 1e-3
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, g, vocab, generator=gen, device=device)
    draft = 0.7 * target[:, :g] + 0.3 * noise / noise.sum(-1, keepdim=True)
    drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    return target.to(dtype), draft.to(dtype), drafts


def random_parents(batch, n, seed, unused=0.15):
    """Random trees, parents before children (biased to recent nodes so trees get deep as well
    as wide), about `unused` of the slots unused (-1). On the CPU: a Python loop over nodes."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    coins = torch.rand(batch, n, 2, generator=gen).tolist()
    for b in range(batch):
        used = [0]
        for i in range(1, n):
            if coins[b][i][0] < unused:
                continue
            pick = min(int(coins[b][i][1] * 4), len(used) - 1)
            parents[b, i] = used[-1 - pick]
            used.append(i)
    return parents


def ragged(batch, g, gen, device):
    return torch.randint(0, g + 1, (batch,), generator=gen, device=device)


# ------------------------------------------------------------------------------------------ chain ops

def chain_shapes(profile):
    """(B, g, V) of the chain verification and sampling ops."""
    if profile == "tiny":
        return [(3, 3, 50), (2, 1, 300)]
    small = [(1, 4, 1000), (3, 5, 32000), (64, 1, 4099)]
    if profile == "quick":
        return small
    return small + [(1, 8, 151936), (64, 4, 128256), (256, 4, 151936), (256, 8, 32000)]


def _draft_nll_band(logits, drafts, margin):
    from .reference._sampling import gather_token_values, nan_to_neg_inf

    body = nan_to_neg_inf(logits[:, :drafts.shape[1]])
    value, in_range = gather_token_values(body, drafts)
    lse = torch.logsumexp(body, dim=-1)
    nll = lse - value
    keep = in_range & torch.isfinite(nll)
    return nll[keep], margin + 8 * torch.finfo(torch.float32).eps * lse[keep].abs()


def bild_threshold(logits, drafts, start, margin=1e-3):
    """A rollback threshold at least `margin` (nats) from every draft's NLL: the backends sum
    the logsumexp in another order, so a threshold inside that band may go either way."""
    nll, band = _draft_nll_band(logits, drafts, margin)
    t = start
    while nll.numel() and bool(((nll - t).abs() < band).any()):
        t += 2.5 * margin
    return t


def compare_bild(got, want, inputs):
    """Equal rows, except rows with a draft NLL within the logsumexp rounding band of the
    threshold (none at the thresholds the cases pick; a graph replay reuses the captured
    threshold on new logits, where one may land in the band)."""
    error, problem = exact(("output_tokens", "num_accepted"))(got, want, inputs)
    if problem is None or got[0].shape != want[0].shape:
        return error, problem
    logits, drafts, threshold = inputs["target_logits"], inputs["draft_tokens"], inputs["rollback_threshold"]
    rows = ((got[0] != want[0]).any(1) | (got[1] != want[1])).nonzero().flatten().tolist()
    for b in rows:
        nll, band = _draft_nll_band(logits[b:b + 1], drafts[b:b + 1], 1e-3)
        if not bool(((nll - threshold).abs() < band).any()):
            return float(len(rows)), f"row {b} differs with every draft NLL clear of the threshold: {problem}"
    return float(len(rows)), None


def _logits_boundary_explains(b, inputs, got, want, margin=1e-4):
    """True when row b's difference comes from a decision within `margin` of its boundary,
    recomputed in float64 (rejection_sample_logits reduces its softmax in another order)."""
    t_logits, d_logits, drafts, u = inputs["target_logits"], inputs["draft_logits"], inputs["draft_tokens"], \
        inputs["uniforms"].double()
    temperature, counts = inputs["temperature"], inputs.get("num_draft_tokens")
    g = drafts.shape[1]
    p = torch.softmax(t_logits[b].double() / temperature, -1)
    q = torch.softmax(d_logits[b].double() / temperature, -1)
    n = g if counts is None else int(counts[b].clamp(0, g))
    a_got, a_want = int(got[1][b]), int(want[1][b])
    vocab = p.shape[-1]
    if a_got != a_want:
        j = min(a_got, a_want)
        tok = int(drafts[b, j])
        if not 0 <= tok < vocab:
            return False
        lhs, rhs = float(u[b, j]) * float(q[j, tok]), float(p[j, tok])
        return abs(lhs - rhs) <= margin * max(abs(rhs), abs(lhs), 1e-30)
    residual = (p[a_got] - q[a_got]).clamp(min=0) if a_got < n else p[a_got]
    if float(residual.sum()) < margin:
        return True  # a nearly empty residual: the fallback decision itself is marginal
    cdf = residual.cumsum(0)
    lo = min(int(got[0][b, a_got]), int(want[0][b, a_got]))
    return abs(float(cdf[lo]) - float(u[b, g]) * float(cdf[-1])) <= margin * float(cdf[-1])


def compare_logits_sampling(got, want, inputs):
    """Equal rows, except at most max(1, 2%) rows that a near-boundary decision explains."""
    problem = exact(("output_tokens", "num_accepted"))(got[:2], want[:2], inputs)[1]
    if problem is None:
        return 0.0, None
    if got[0].shape != want[0].shape:
        return None, problem
    rows = ((got[0] != want[0]).any(1) | (got[1] != want[1])).nonzero().flatten().tolist()
    if len(rows) > max(1, 0.02 * got[0].shape[0]):
        return float(len(rows)), f"{len(rows)} rows differ (more than 2%): {problem}"
    unexplained = [b for b in rows if not _logits_boundary_explains(b, inputs, got, want)]
    if unexplained:
        b = unexplained[0]
        return float(len(rows)), (f"row {b} differs away from any decision boundary: got {_short(got[0][b])} "
                                  f"want {_short(want[0][b])}")
    return float(len(rows)), None


def chain_cases(profile, device):
    from . import ops

    verify_outputs = ("output_tokens", "num_accepted")
    cases = []
    for index, (batch, g, vocab) in enumerate(chain_shapes(profile)):
        shape = f"B={batch} g={g} V={vocab}"
        for dtype in DTYPES:
            use_ragged = (index + DTYPES.index(dtype)) % 2 == 1
            suffix = " ragged" if use_ragged else ""
            graph = index == 0 and dtype == torch.bfloat16

            def logits_inputs(seed, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged):
                gen = _gen(device, seed)
                logits = random_logits(batch, g + 1, vocab, dtype, gen, device)
                return dict(target_logits=logits, draft_tokens=near_top_drafts(logits, gen),
                            num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)

            cases.append(Case("greedy_verify", shape + suffix, dtype, logits_inputs,
                              lambda x, be: ops.greedy_verify(**x, backend=be), exact(verify_outputs), graph))
            beta, tau = ((1, 0.0), (3, 0.7), (50, 3.0), (2, 0.0))[(index + DTYPES.index(dtype)) % 4]
            cases.append(Case("relaxed_verify", f"{shape} top_beta={beta} tau={tau}{suffix}", dtype, logits_inputs,
                              lambda x, be, beta=beta, tau=tau: ops.relaxed_verify(**x, top_beta=beta, tau=tau, backend=be),
                              exact(verify_outputs), graph))

            def bild_inputs(seed, logits_inputs=logits_inputs, index=index):
                x = logits_inputs(seed)
                x["rollback_threshold"] = bild_threshold(x["target_logits"], x["draft_tokens"], (1.5, 4.0, 9.0)[index % 3])
                return x

            cases.append(Case("bild_verify", shape + suffix, dtype, bild_inputs,
                              lambda x, be: ops.bild_verify(**x, backend=be), compare_bild, graph))
            cases.append(Case("max_prob", f"[{batch},{g + 1},{vocab}]", dtype,
                              lambda seed, batch=batch, g=g, vocab=vocab, dtype=dtype: dict(
                                  logits=random_logits(batch, g + 1, vocab, dtype, _gen(device, seed), device)),
                              lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)),
                              graph))

            def probs_inputs(seed, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged):
                gen = _gen(device, seed)
                target, draft, drafts = random_probs(batch, g, vocab, dtype, gen, device)
                u = torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64)
                u = torch.where(torch.rand(u.shape, generator=gen, device=device) < 0.1, torch.zeros_like(u), u)
                return dict(target_probs=target, draft_probs=draft, draft_tokens=drafts, uniforms=u,
                            num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)

            cases.append(Case("rejection_sample", f"{shape} uniforms{suffix}", dtype, probs_inputs,
                              lambda x, be: ops.rejection_sample(**x, backend=be), exact(verify_outputs), graph))

            def seeded_inputs(seed, probs_inputs=probs_inputs, batch=batch):
                x = probs_inputs(seed)
                del x["uniforms"]
                x["offsets"] = torch.randint(0, 2**40, (batch,), generator=_gen(device, seed + 1), device=device)
                return x

            cases.append(Case("rejection_sample", f"{shape} seed+offsets{suffix}", dtype, seeded_inputs,
                              lambda x, be: ops.rejection_sample(**x, seed=1234, backend=be), exact(verify_outputs),
                              graph))

            def sampling_logits_inputs(seed, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged):
                gen = _gen(device, seed)
                t = torch.randn(batch, g + 1, vocab, generator=gen, device=device) * 3
                q = t[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=device) * 0.7
                temperature = 0.8
                drafts = torch.multinomial(torch.softmax(q.to(dtype).float() / temperature, -1).reshape(-1, vocab), 1,
                                           generator=gen).reshape(batch, g)
                return dict(target_logits=t.to(dtype), draft_logits=q.to(dtype), draft_tokens=drafts,
                            temperature=temperature,
                            uniforms=torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64),
                            num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)

            cases.append(Case("rejection_sample_logits", f"{shape} T=0.8 uniforms{suffix}", dtype,
                              sampling_logits_inputs, lambda x, be: ops.rejection_sample_logits(**x, backend=be),
                              compare_logits_sampling, graph))
    return cases


# ------------------------------------------------------------------------------------------ tree ops

def tree_shapes(profile):
    """(B, N, V) of the tree verification ops."""
    if profile == "tiny":
        return [(2, 7, 40)]
    small = [(1, 8, 1000), (4, 16, 32000)]
    if profile == "quick":
        return small
    return small + [(8, 64, 151936), (64, 16, 151936), (256, 8, 32000)]


def tree_cases(profile, device):
    from . import ops
    from .reference._sampling import safe_argmax

    outputs = ("output_tokens", "num_accepted", "accepted_nodes")
    cases = []
    for index, (batch, n, vocab) in enumerate(tree_shapes(profile)):
        shape = f"B={batch} N={n} V={vocab}"
        for dtype in DTYPES:
            graph = index == 0 and dtype == torch.bfloat16

            def greedy_inputs(seed, batch=batch, n=n, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed)
                parents = random_parents(batch, n, seed).to(device)
                logits = random_logits(batch, n, vocab, dtype, gen, device)
                parent_top = safe_argmax(logits).gather(1, parents.clamp(min=0))
                tokens = torch.where(torch.rand(batch, n, generator=gen, device=device) < 0.6, parent_top,
                                     torch.randint(0, vocab, (batch, n), generator=gen, device=device))
                tokens = torch.where(parents < 0, -1, tokens)
                tokens[:, 0] = 0
                return dict(target_logits=logits, tree_tokens=tokens, parents=parents, max_depth=n - 1)

            cases.append(Case("tree_greedy_verify", shape, dtype, greedy_inputs,
                              lambda x, be: ops.tree_greedy_verify(**x, backend=be), exact(outputs), graph))

            def sampling_inputs(seed, batch=batch, n=n, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed)
                parents = random_parents(batch, n, seed).to(device)
                logits = torch.randn(batch, n, vocab, generator=gen, device=device) * 2
                target = torch.softmax(logits, -1)
                draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=gen, device=device), -1)
                # children as a real drafter proposes them: the parent's target argmax, the draft's own
                # argmax (likely accepted), random ids (likely rejected)
                parent = parents.clamp(min=0)
                choice = torch.rand(batch, n, generator=gen, device=device)
                tokens = torch.where(choice < 0.4, safe_argmax(target).gather(1, parent),
                                     torch.where(choice < 0.7, safe_argmax(draft).gather(1, parent),
                                                 torch.randint(0, vocab, (batch, n), generator=gen, device=device)))
                tokens = torch.where(parents < 0, -1, tokens)
                tokens[:, 0] = 0
                return dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype), tree_tokens=tokens,
                            parents=parents, max_depth=n - 1,
                            uniforms=torch.rand(batch, n, generator=gen, device=device, dtype=torch.float64))

            cases.append(Case("tree_rejection_sample", f"{shape} uniforms", dtype, sampling_inputs,
                              lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs), graph))
            if dtype == torch.float32:
                def seeded(seed, sampling_inputs=sampling_inputs, batch=batch):
                    x = sampling_inputs(seed)
                    del x["uniforms"]
                    x["seed"] = torch.randint(-(2**62), 2**62, (batch,), generator=_gen(device, seed + 1), device=device)
                    x["offsets"] = torch.randint(0, 5000, (batch,), generator=_gen(device, seed + 2), device=device)
                    return x

                cases.append(Case("tree_rejection_sample", f"{shape} per-row seeds", dtype, seeded,
                                  lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs)))
    return cases


# ------------------------------------------------------------------------------------------ tree_attention

# (out atol = rtol, lse atol) per dtype: the looser of the two backends' GPU-test tolerances
# (tests/test_gpu_tree_attention_{triton,cuda}.py); lse rtol 1e-5.
ATTENTION_TOL = {torch.float32: (1e-4, 2e-4), torch.float16: (1e-2, 2e-4), torch.bfloat16: (2e-2, 2e-4)}


def attention_shapes(profile):
    """(prefix lengths, N, Hq, Hkv, D, dtypes, tree, page size or None)."""
    if profile == "tiny":
        return [([9, 3], 4, 2, 1, 16, (torch.float32,), True, None), ([5, 0], 3, 2, 2, 16, (torch.float32,), True, 4)]
    small = []
    for d in (64, 128):
        for page_size in (None, 16):
            small.append(([100, 333], 16, 8, 2, d, DTYPES, True, page_size))
    small.append(([37, 1, 200], 8, 4, 4, 64, (torch.float16,), False, None))
    if profile == "quick":
        return small
    prefixes = [4096, 3000, 17, 4095, 0, 2500, 4000, 1]
    production = []
    for n in (8, 64):
        for tree in (False, True):
            for page_size in (None, 16):
                production.append((prefixes, n, 32, 8, 128, (torch.bfloat16,), tree, page_size))
    production += [(prefixes, 32, 32, 8, 128, (torch.float16,), True, None),
                   (prefixes, 32, 32, 8, 64, (torch.bfloat16,), True, 16),
                   ([4096], 32, 32, 4, 128, (torch.bfloat16, torch.float32), True, 1),
                   ([1000, 4000], 16, 8, 1, 64, (torch.float32,), True, 64)]
    return small + production


def attention_cases(profile, device):
    from . import ops
    from .reference.attention import paged_from_contiguous

    cases = []
    for index, (prefixes, n, hq, hkv, d, dtypes, tree, page_size) in enumerate(attention_shapes(profile)):
        layout = "contiguous" if page_size is None else f"paged{page_size}"
        shape = (f"B={len(prefixes)} P<={max(prefixes)} N={n} Hq={hq} Hkv={hkv} D={d} "
                 f"{'tree' if tree else 'chain'} {layout}")
        for dtype in dtypes:
            def build(seed, prefixes=prefixes, n=n, hq=hq, hkv=hkv, d=d, dtype=dtype, tree=tree, page_size=page_size):
                gen = _gen(device, seed)
                batch = len(prefixes)
                s_max = max(prefixes) + n
                order = torch.randperm(batch, generator=torch.Generator().manual_seed(seed)).tolist()
                seq_lens = torch.tensor([prefixes[i] for i in order], dtype=torch.int64, device=device)
                q = torch.randn(batch, n, hq, d, generator=gen, device=device).to(dtype)
                k = torch.randn(batch, hkv, s_max, d, generator=gen, device=device).to(dtype)
                v = torch.randn(batch, hkv, s_max, d, generator=gen, device=device).to(dtype)
                block_table = None
                if page_size is not None:
                    k, block_table = paged_from_contiguous(k, page_size, generator=torch.Generator().manual_seed(seed),
                                                           spare_pages=7)
                    v, _ = paged_from_contiguous(v, page_size, generator=torch.Generator().manual_seed(seed),
                                                 spare_pages=7)
                parents = random_parents(batch, n, seed).to(device) if tree else None
                return dict(q=q, k_cache=k, v_cache=v, seq_lens=seq_lens, parents=parents, block_table=block_table)

            out_tol, lse_tol = ATTENTION_TOL[dtype]
            cases.append(Case("tree_attention", shape, dtype, build, lambda x, be: ops.tree_attention(**x, backend=be),
                              close(("out", "lse"), ((out_tol, out_tol), (lse_tol, 1e-5))),
                              graph=index in (0, 1) and dtype == dtypes[-1]))
    return cases


# ------------------------------------------------------------------------------------------ KV cache ops

def kv_shapes(profile):
    """(layers, B, Hkv, S_max, D, N tree nodes, one allocation?)."""
    if profile == "tiny":
        return [(2, 3, 2, 24, 16, 6, True), (2, 2, 1, 16, 8, 4, False)]
    small = [(4, 3, 2, 100, 64, 8, True), (3, 4, 2, 80, 128, 16, False)]
    if profile == "quick":
        return small
    return small + [(32, 8, 8, 1088, 128, 64, True), (32, 32, 8, 272, 128, 8, False)]


def kv_cases(profile, device):
    from . import ops

    cases = []
    for index, (layers, batch, hkv, s_max, d, n, one) in enumerate(kv_shapes(profile)):
        shape = f"L={layers} B={batch} Hkv={hkv} S={s_max} D={d} N={n} {'one allocation' if one else 'per-layer tensors'}"
        for dtype in DTYPES:
            def build(seed, layers=layers, batch=batch, hkv=hkv, s_max=s_max, d=d, n=n, one=one, dtype=dtype):
                gen = _gen(device, seed)
                shape = (layers, batch, hkv, s_max, d)
                pristine = [torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(2)]
                if one:  # SpecCache's layout: the layers are views of one [L, B, Hkv, S, D] tensor
                    work = [torch.empty(shape, dtype=dtype, device=device) for _ in range(2)]
                    layers_k, layers_v = list(work[0].unbind(0)), list(work[1].unbind(0))
                else:
                    layers_k = [torch.empty(shape[1:], dtype=dtype, device=device) for _ in range(layers)]
                    layers_v = [torch.empty(shape[1:], dtype=dtype, device=device) for _ in range(layers)]
                seq_lens = torch.randint(0, s_max - n + 1, (batch,), generator=gen, device=device)
                # accepted paths: the root, then increasing node ids, then -1 (a tree verify op's output)
                width = min(n, 9)
                cpu = torch.Generator().manual_seed(seed)
                rows = []
                for _ in range(batch):
                    m = int(torch.randint(0, width, (), generator=cpu))
                    nodes = sorted((torch.randperm(n - 1, generator=cpu)[:m] + 1).tolist())
                    rows.append([0] + nodes + [-1] * (width - 1 - m))
                accepted = torch.tensor(rows, dtype=torch.int64, device=device)
                return dict(pristine_k=pristine[0], pristine_v=pristine[1], k_caches=layers_k, v_caches=layers_v,
                            seq_lens=seq_lens, accepted_nodes=accepted)

            def run(x, backend):
                # start every run from the same cache contents (the op works in place); copy_ is capturable
                for pristine, caches in ((x["pristine_k"], x["k_caches"]), (x["pristine_v"], x["v_caches"])):
                    for layer, cache in enumerate(caches):
                        cache.copy_(pristine[layer])
                lens = ops.kv_compact(x["k_caches"], x["v_caches"], x["seq_lens"], x["accepted_nodes"], backend=backend)
                return lens, torch.stack(x["k_caches"]), torch.stack(x["v_caches"])

            cases.append(Case("kv_compact", shape, dtype, build, run, exact(("new_seq_lens", "k_caches", "v_caches")),
                              graph=index == 0 and dtype == torch.bfloat16))
    # kv_rollback is one add on the device (no kernel): the torch backend on the device against the arithmetic
    for batch in ((3,) if profile == "tiny" else (1, 256)):
        def rollback_inputs(seed, batch=batch):
            gen = _gen(device, seed)
            return dict(seq_lens=torch.randint(0, 4096, (batch,), generator=gen, device=device),
                        num_accepted=torch.randint(0, 9, (batch,), generator=gen, device=device))

        cases.append(Case("kv_rollback", f"B={batch}", None, rollback_inputs,
                          lambda x, be: (ops.kv_rollback(**x, backend=be),), exact(("new_seq_lens",)), graph=True,
                          reference=lambda x: (x["seq_lens"] + x["num_accepted"] + 1,), backends=("torch",)))
    return cases


# ------------------------------------------------------------------------------------------ early_exit_topk

EARLY_EXIT_REL_TOL = 3e-5  # of max_v sum_h |norm(h)_h * W[v, h]|: float32 sums of H terms in another order


def compare_topk(got, want, inputs):
    """Values within float rounding of the reference logits; ids exact wherever the reference's
    sorted logits around that rank are farther apart than the tolerance (tests/early_exit_support.py)."""
    from .reference._sampling import nan_to_neg_inf
    from .reference.early_exit import normalize

    values, indices = got
    k = inputs["k"]
    norm = inputs.get("norm", "rms")
    weight, bias = (None, None) if norm == "none" else (inputs["norm_weight"], inputs.get("norm_bias"))
    h = normalize(inputs["hidden"], weight, bias, eps=1e-6, norm=norm)
    w = inputs["lm_head_weight"].float()
    logits = nan_to_neg_inf(h @ w.t())
    tol = EARLY_EXIT_REL_TOL * torch.nan_to_num(h.abs() @ w.abs().t(), nan=0.0, posinf=0.0).amax(1, keepdim=True) + 1e-6
    batch, vocab = logits.shape
    if values.shape != (batch, k) or indices.shape != (batch, k) or indices.dtype != torch.int64:
        return None, f"got shapes {list(values.shape)} {list(indices.shape)} {indices.dtype}, want [{batch}, {k}] int64"
    ref_vals, ref_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    want_vals = ref_vals[:, :k]
    finite = torch.isfinite(want_vals)
    error = float(((values - want_vals).abs()[finite]).max()) if bool(finite.any()) else 0.0
    if not bool(((indices >= 0) & (indices < vocab)).all()):
        return error, f"ids outside [0, {vocab}): {_short(indices)}"
    if not torch.equal(values[~finite], want_vals[~finite]):
        return error, "non-finite values differ from the reference's"
    if not bool(((values - want_vals).abs() <= tol)[finite].all()):
        return error, f"values off by up to {error:.3g} (tolerance {float(tol.max()):.3g})"
    carried = logits.gather(1, indices)
    if not bool(((carried - values).abs() <= tol)[finite].all()):
        return error, "an id does not carry the logit reported beside it"
    padded = torch.cat([torch.full((batch, 1), math.inf, device=logits.device), ref_vals,
                        torch.full((batch, 1), -math.inf, device=logits.device)], 1)
    separated = (padded[:, :k] - padded[:, 1:k + 1] > tol) & (padded[:, 1:k + 1] - padded[:, 2:k + 2] > tol)
    must_match = (want_vals == -math.inf) | separated
    if not torch.equal(indices[must_match], ref_ids[:, :k][must_match]):
        rows = (must_match & (indices != ref_ids[:, :k])).any(1).nonzero().flatten()[:2].tolist()
        return error, "; ".join(f"row {r}: ids {_short(indices[r])} want {_short(ref_ids[r, :k])}" for r in rows)
    return error, None


def early_exit_shapes(profile):
    """(B, H, V, k, norm, dtypes)."""
    if profile == "tiny":
        return [(3, 64, 300, 5, "rms", (torch.float32,)), (2, 32, 100, 1, "layer", (torch.float32,))]
    small = [(5, 520, 3001, k, norm, DTYPES) for k, norm in ((1, "rms"), (5, "layer"), (16, "none"))]
    if profile == "quick":
        return small
    return small + [(b, 4096, v, 8, "rms", (torch.bfloat16,)) for b in (1, 64) for v in (128256, 151936)] + \
        [(8, 2048, 32000, 8, "rms", (torch.float16,))]


def early_exit_cases(profile, device):
    from . import ops

    cases = []
    for index, (batch, hidden, vocab, k, norm, dtypes) in enumerate(early_exit_shapes(profile)):
        for dtype in dtypes:
            def build(seed, batch=batch, hidden=hidden, vocab=vocab, k=k, norm=norm, dtype=dtype):
                gen = _gen(device, seed)
                x = dict(hidden=torch.randn(batch, hidden, generator=gen, device=device) * 3 + 0.5,
                         norm_weight=1 + 0.2 * torch.randn(hidden, generator=gen, device=device),
                         lm_head_weight=torch.randn(vocab, hidden, generator=gen, device=device) * hidden ** -0.5)
                if norm == "layer":
                    x["norm_bias"] = 0.1 * torch.randn(hidden, generator=gen, device=device)
                x = {name: t.to(dtype) for name, t in x.items()}
                return dict(x, k=k, norm=norm)

            cases.append(Case("early_exit_topk", f"B={batch} H={hidden} V={vocab} k={k} norm={norm}", dtype, build,
                              lambda x, be: ops.early_exit_topk(**x, backend=be), compare_topk,
                              graph=index == 0 and dtype == dtypes[-1]))
    return cases


CASE_FAMILIES = (chain_cases, tree_cases, attention_cases, kv_cases, early_exit_cases)


# ------------------------------------------------------------------------------------------ running

def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _context_alive(device) -> bool:
    """False once a kernel fault has poisoned the CUDA context (every later call would fail)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return float(torch.ones(1, device=device).add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def _copy_into(static: dict, fresh: dict) -> None:
    """Write a new problem's values into the captured graph's input tensors (same shapes)."""
    for name, value in static.items():
        new = fresh[name]
        if isinstance(value, torch.Tensor):
            value.copy_(new)
        elif isinstance(value, list):
            for old, replacement in zip(value, new):
                old.copy_(replacement)
        # python scalars (thresholds, k, max_depth) are baked into the graph's launch: they stay


def _describe_error(error: BaseException) -> str:
    """The error's type and its first lines (a Triton compile error names the line on its second)."""
    lines = [line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    return " | ".join(lines[:3])[:600]


def _not_available(op, backend, device) -> str | None:
    """Why `backend` cannot run `op` on `device` here (no _C, no triton), or None."""
    from . import ops

    try:
        ops.resolve(op, backend, device)
    except (ValueError, RuntimeError) as error:
        return str(error)
    return None


class ContextLost(Exception):
    """A CUDA error poisoned the context at `where`; `results` are the checks done before it (the
    failing one included)."""

    def __init__(self, where: str, results: list | None = None):
        super().__init__(where)
        self.results = results or []


def run_case(plan: Plan, case: Case, backends: tuple) -> list[Result]:
    """Every backend on one case (and its CUDA-graph replay), against the reference."""
    device = plan.device
    dtype = "-" if case.dtype is None else str(case.dtype).replace("torch.", "")
    results = []

    def result(backend, name, status, error=None, message="", start=None):
        results.append(Result(case.op, backend, name, dtype, status, error, message,
                              0.0 if start is None else time.perf_counter() - start))

    try:
        inputs = case.build(plan.seed)
        want = case.reference(inputs) if case.reference else case.run(inputs, "torch")
        _sync(device)
    except torch.cuda.OutOfMemoryError:
        # the production shapes need a few GiB beside the reference's intermediates: a smaller GPU skips them
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        for backend in backends:
            result(backend, case.name, SKIP, message=f"the inputs and the reference do not fit in this GPU's "
                                                     f"{total:.0f} GiB")
        torch.cuda.empty_cache()
        return results
    except Exception as error:  # noqa: BLE001 - a broken case builder is a selftest failure, reported
        for backend in backends:
            result(backend, case.name, FAIL, message=f"building the case or the reference failed: {_describe_error(error)}")
        if not _context_alive(device):
            raise ContextLost(f"{case.op} {case.name} (reference)", results) from error
        return results
    for backend in backends:
        start = time.perf_counter()
        try:
            got = case.run(inputs, backend)
            _sync(device)
            error, problem = case.compare(got, want, inputs)
            result(backend, case.name, FAIL if problem else PASS, error, problem or "", start)
        except Exception as error:  # noqa: BLE001
            message = _describe_error(error)
            if isinstance(error, ValueError) and "cannot serve this call" in message:
                result(backend, case.name, SKIP, message=message, start=start)  # past a registered launch limit
                continue
            result(backend, case.name, FAIL, message=message, start=start)
            if not _context_alive(device):
                raise ContextLost(f"{case.op} [{backend}] {case.name}", results) from error
            continue
        if case.graph and plan.graphs and (device.type == "cuda" or plan.capture is not None):
            start = time.perf_counter()
            try:
                error, problem = graph_check(plan, case, backend)
                result(backend, case.name + " graph", FAIL if problem else PASS, error, problem or "", start)
            except Exception as error:  # noqa: BLE001
                result(backend, case.name + " graph", FAIL, message=_describe_error(error), start=start)
                if not _context_alive(device):
                    raise ContextLost(f"{case.op} [{backend}] {case.name} graph", results) from error
    return results


def cuda_graph_capture(device: torch.device, fn):
    """fn captured in a CUDA graph after a warm-up on the capture stream: (its outputs, replay)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()  # warm-up: compilation, cached workspaces and pointer tables exist before the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warm-up's stream: per-stream workspaces already exist
        outputs = fn()

    def replay():
        graph.replay()
        torch.cuda.synchronize(device)
    return outputs, replay


def graph_check(plan: Plan, case: Case, backend: str):
    """Capture the op once, write another problem's values into the captured inputs, replay:
    the replay must solve the new problem (nothing data-dependent baked in) and equal the
    reference and an eager call on it."""
    static = case.build(plan.seed + 101)
    captured, replay = (plan.capture or cuda_graph_capture)(plan.device, lambda: case.run(static, backend))
    _copy_into(static, case.build(plan.seed + 202))
    replay()
    replayed = tuple(t.clone() for t in captured)
    want = case.reference(static) if case.reference else case.run(static, "torch")
    error, problem = case.compare(replayed, want, static)
    if problem:
        return error, f"replay vs reference: {problem}"
    eager = case.run(static, backend)
    _, problem = case.compare(replayed, eager, static)
    return error, None if problem is None else f"replay vs eager: {problem}"


def engine_results(plan: Plan, backends: tuple) -> list[Result]:
    """Every strategy on the embedded default models (float32) must give the target's own greedy
    tokens (`generate(do_sample=False)`), on each backend, without and with CUDA graphs."""
    import specdec_kernels

    from .demo import PROMPTS, STRATEGIES, batches, load_pair

    device = plan.device
    results = []
    max_new = 32 if plan.profile == "full" else 16
    start = time.perf_counter()
    try:
        class NotLoaded(Exception):
            pass

        def fail(message):
            raise NotLoaded(message)

        no_paths = argparse.Namespace(models=None, target=None, draft=None, specdec_drafter=None)
        pair = load_pair(no_paths, device, torch.float32, fail=fail)
        batch = batches(pair.tokenizer, PROMPTS[:2], 2, device)[0]
        pad = pair.tokenizer.pad_token_id
        common = dict(max_new_tokens=max_new, pad_token_id=pad, eos_token_id=[])
        with torch.no_grad():
            greedy = pair.target.generate(**batch, do_sample=False, **common)
    except Exception as error:  # noqa: BLE001
        return [Result("engine", b, "load the default models + HF greedy", "float32", FAIL,
                       message=_describe_error(error), seconds=time.perf_counter() - start) for b in backends]
    modes = (False, True) if device.type == "cuda" and plan.graphs else (False,)
    for backend in backends:
        for graphs in modes:
            for name in STRATEGIES:
                case = f"{name} {'cuda graphs' if graphs else 'eager'} B=2 T={max_new}"
                if name not in pair.options:
                    results.append(Result("engine", backend, case, "float32", SKIP, message=pair.skipped.get(name, "")))
                    continue
                start = time.perf_counter()
                try:
                    out = specdec_kernels.generate(pair.target, batch["input_ids"], attention_mask=batch["attention_mask"],
                                                   strategy=name, backend=backend, cuda_graphs=graphs, **common,
                                                   **pair.options[name])
                    _sync(device)
                    got, want = out.sequences, greedy
                    differing, problem = None, None
                    if got.shape != want.shape:
                        problem = f"sequences {list(got.shape)}, greedy {list(want.shape)}"
                    else:
                        differing = float(int((got != want).sum()))
                    if differing:
                        row, pos = (int(v) for v in (got != want).nonzero()[0])
                        prompt = batch["input_ids"].shape[1]
                        problem = (f"not token-identical to greedy: row {row} first differs at new token {pos - prompt}: "
                                   f"got {_short(got[row, pos:pos + 6])} want {_short(want[row, pos:pos + 6])}")
                    results.append(Result("engine", backend, case, "float32", FAIL if problem else PASS, differing,
                                          problem or "", time.perf_counter() - start))
                except Exception as error:  # noqa: BLE001
                    results.append(Result("engine", backend, case, "float32", FAIL, message=_describe_error(error),
                                          seconds=time.perf_counter() - start))
                    if not _context_alive(device):
                        raise ContextLost(f"engine [{backend}] {case}", results) from error
    return results


def execute(plan: Plan, progress: Callable = lambda op, done, seconds: None) -> list[Result]:
    """Run the plan's checks, calling progress(op, its results) after each op; a lost CUDA
    context stops the remaining GPU checks (they are reported as skipped)."""
    from . import ops

    results = plan.results
    cases = [case for family in CASE_FAMILIES for case in family(plan.profile, plan.device) if case.op in plan.ops]
    lost = None
    by_op: dict[str, list[Case]] = {}
    for case in cases:
        by_op.setdefault(case.op, []).append(case)
    for op in plan.ops:
        op_cases = by_op.get(op, [])
        if op == "engine" or not op_cases:
            continue
        started, before = time.perf_counter(), len(results)
        for case in op_cases:
            backends = case.backends or tuple(b for b in plan.backends if b in ops.implemented_backends(op) and b != "torch")
            available, missing = [], []
            for backend in backends:
                reason = _not_available(op, backend, plan.device)
                (missing if reason else available).append((backend, reason))
            for backend, reason in missing:
                status = FAIL if plan.explicit_backends else SKIP
                results.append(Result(op, backend, case.name, "-" if case.dtype is None else str(case.dtype)[6:],
                                      status, message=reason))
            if lost is not None:
                for backend, _ in available:
                    results.append(Result(op, backend, case.name, "-" if case.dtype is None else str(case.dtype)[6:],
                                          SKIP, message=f"not run: the CUDA context was lost at {lost}"))
                continue
            if available:
                try:
                    results.extend(run_case(plan, case, tuple(b for b, _ in available)))
                except ContextLost as error:
                    lost = str(error)
                    results.extend(error.results)
                    results.append(Result(op, "-", "CUDA context", "-", FAIL,
                                          message=f"a CUDA error poisoned the context at {lost}; the remaining GPU "
                                                  "checks are not run (rerun with --ops to isolate)"))
        if plan.device.type == "cuda":
            torch.cuda.empty_cache()  # the production shapes of the next op start from a clean pool
        progress(op, results[before:], time.perf_counter() - started)
    if plan.engine and "engine" in plan.ops:
        started, before = time.perf_counter(), len(results)
        engine_backends = plan.backends if plan.device.type == "cuda" else ("torch",)
        usable = []
        for backend in engine_backends:
            reason = None if backend == "torch" else _not_available("greedy_verify", backend, plan.device)
            if reason:
                results.append(Result("engine", backend, "every strategy", "float32",
                                      FAIL if plan.explicit_backends else SKIP, message=reason))
            else:
                usable.append(backend)
        if lost is not None:
            results.append(Result("engine", "-", "every strategy", "float32", SKIP,
                                  message=f"not run: the CUDA context was lost at {lost}"))
        elif usable:
            try:
                results.extend(engine_results(plan, tuple(usable)))
            except ContextLost as error:
                results.extend(error.results)
                results.append(Result("engine", "-", "CUDA context", "-", FAIL,
                                      message=f"a CUDA error poisoned the context at {error}"))
        progress("engine", results[before:], time.perf_counter() - started)
    return results


# ------------------------------------------------------------------------------------------ report

def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _driver(device) -> dict:
    """The CUDA driver API version (libcuda) and the NVIDIA driver version (nvidia-smi), as far as found."""
    info = {"cuda_driver_api": None, "nvidia_driver": None}
    if device.type != "cuda":
        return info
    try:
        import ctypes

        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            info["cuda_driver_api"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={index}"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            info["nvidia_driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def header(plan: Plan) -> dict:
    from . import __version__, build_info

    device = plan.device
    info = {"specdec_kernels": __version__, "device": str(device), "python": platform.python_version(),
            "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
            "cuda_runtime": torch.version.cuda, "profile": plan.profile, "backends": list(plan.backends),
            "graphs": plan.graphs and device.type == "cuda", "engine": plan.engine, "seed": plan.seed,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(["specdec-kernels", *sys.argv[1:]])}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                    **_driver(device))
    else:
        info.update(name=f"CPU {platform.machine()} (selftest dev mode: tiny shapes, Triton interpreter)")
    try:
        built = build_info()
        info["cuda_module"] = built["cuda_module"]
    except Exception as error:  # noqa: BLE001 - the header must not stop the run
        info["cuda_module"] = {"error": _describe_error(error)}
    return info


def matrix(results: list[Result]) -> dict:
    """{op: {backend: {pass, fail, skip}}} in first-seen order."""
    table: dict[str, dict[str, dict[str, int]]] = {}
    for r in results:
        cell = table.setdefault(r.op, {}).setdefault(r.backend, {PASS: 0, FAIL: 0, SKIP: 0})
        cell[r.status] += 1
    return table


def format_header(info: dict) -> str:
    lines = []
    if info["device"].startswith("cuda"):
        driver = info.get("nvidia_driver") or "?"
        api = info.get("cuda_driver_api")
        lines.append(f"device: {info['name']} ({info['device']}), compute capability {info['compute_capability']}, "
                     f"{info['memory_gib']} GiB, driver {driver}{f' (CUDA {api})' if api else ''}")
    else:
        lines.append(f"device: {info['name']}")
    lines.append(f"versions: specdec-kernels {info['specdec_kernels']}, torch {info['torch']} (CUDA runtime "
                 f"{info['cuda_runtime']}), triton {info['triton']}, transformers {info['transformers']}, "
                 f"python {info['python']}")
    module = info.get("cuda_module", {})
    if module.get("loaded"):
        runtime = module.get("cuda_runtime_version")
        if isinstance(runtime, int):  # cudaRuntimeGetVersion's 1000 * major + 10 * minor
            runtime = f"{runtime // 1000}.{runtime % 1000 // 10}"
        archs = " ".join(f"sm_{arch}" for arch in module.get("archs") or []) or "?"
        lines.append(f"_C: loaded, built for {archs} with CUDA runtime {runtime}")
    else:
        lines.append(f"_C: not loaded ({module.get('error') or 'not built'}): the cuda backend is not checked")
    lines.append(f"shapes: {info['profile']}; backends: {', '.join(info['backends']) or 'none'}; "
                 f"CUDA graphs: {'on' if info['graphs'] else 'off'}; engine: {'on' if info['engine'] else 'off'}")
    return "\n".join(lines)


def format_report(results: list[Result], seconds: float) -> str:
    """The matrix (ops x backends: passed/ran, failures, skips), every failure, the skip reasons, the verdict."""
    lines = []
    table = matrix(results)
    order = {"cuda": 0, "triton": 1, "torch": 2}
    backends = sorted({b for row in table.values() for b in row}, key=lambda b: (order.get(b, 3), b))
    width = max([len(op) for op in table] + [8])
    lines.append(f"{'op':<{width}}  " + "  ".join(f"{b:<18}" for b in backends).rstrip())
    for op, row in table.items():
        cells = []
        for backend in backends:
            cell = row.get(backend)
            if cell is None:
                text = "-"
            else:
                ran = cell[PASS] + cell[FAIL]
                text = f"{cell[PASS]}/{ran} pass" if ran else "skipped"
                if cell[FAIL]:
                    text += f" {cell[FAIL]} FAIL"
                if cell[SKIP] and ran:
                    text += f" +{cell[SKIP]} skip"
            cells.append(f"{text:<18}")
        lines.append(f"{op:<{width}}  " + "  ".join(cells).rstrip())
    failures = [r for r in results if r.status == FAIL]
    skips = [r for r in results if r.status == SKIP]
    if failures:
        lines.append("")
        lines.append("failures:")
        for r in failures:
            lines.append(f"  FAIL {r.op} [{r.backend}] {r.case} {r.dtype}: {r.message}")
    if skips:
        reasons: dict[tuple, int] = {}
        for r in skips:
            reasons[(r.op, r.backend, r.message.splitlines()[0][:160] if r.message else "")] = \
                reasons.get((r.op, r.backend, r.message.splitlines()[0][:160] if r.message else ""), 0) + 1
        lines.append("")
        lines.append("skipped:")
        for (op, backend, reason), count in reasons.items():
            lines.append(f"  {op} [{backend}] x{count}: {reason}")
    passed = sum(r.status == PASS for r in results)
    outcome = "FAIL" if failures else ("PASS" if passed else "NOTHING RAN")
    lines.append("")
    lines.append(f"selftest: {passed} passed, {len(failures)} failed, {len(skips)} skipped in {seconds:.1f} s: {outcome}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ command

def _split(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _argv(args) -> list[str]:
    """The command line of `args` again (to re-run the CPU dev mode under the Triton interpreter)."""
    argv = ["selftest", "--device", args.device, "--seed", str(args.seed)]
    for flag, value in (("--json", args.json), ("--ops", args.ops), ("--backends", args.backends)):
        if value is not None:
            argv += [flag, value]
    for flag, on in (("--quick", args.quick), ("--no-graphs", args.no_graphs), ("--no-engine", args.no_engine)):
        if on:
            argv.append(flag)
    return argv


def fail(message: str) -> int:
    print(f"specdec-kernels selftest: {message}", file=sys.stderr)
    return EXIT_NO_GPU


def run(args) -> int:
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        return fail(f"--device {args.device}: use cuda, cuda:N, or cpu (which only tests the selftest itself)")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        return fail(f"--json {args.json}: no such folder")
    from . import ops

    known = (*ops.registered_ops(), "engine")
    wanted = _split(args.ops) or list(known)
    unknown = [name for name in wanted if name not in known]
    if unknown:
        return fail(f"--ops: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    backends = _split(args.backends) or list(GPU_BACKENDS)
    bad = [b for b in backends if b not in GPU_BACKENDS]
    if bad:
        return fail(f"--backends: unknown {', '.join(bad)}; the GPU backends are {', '.join(GPU_BACKENDS)} "
                    "(torch is the reference every check compares with)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(NO_GPU, file=sys.stderr)
            return EXIT_NO_GPU
        if device.index is not None and device.index >= torch.cuda.device_count():
            return fail(f"--device {args.device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        # The Triton kernels were decorated at import: only a fresh process can run them interpreted.
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.run([sys.executable, "-m", "specdec_kernels", *_argv(args)], env=env).returncode
    if device.type == "cpu":
        backends = [b for b in backends if b == "triton"]  # the cuda backend needs a GPU: nothing to run
    plan = Plan(device=device, profile="tiny" if device.type == "cpu" else ("quick" if args.quick else "full"),
                backends=tuple(backends), explicit_backends=args.backends is not None and device.type == "cuda",
                ops=tuple(name for name in known if name in wanted), graphs=not args.no_graphs,
                engine=not args.no_engine, seed=args.seed)
    info = header(plan)
    print(format_header(info), flush=True)
    start = time.perf_counter()

    def progress(op, done, op_seconds):
        print(f"  {op}: {sum(r.status == PASS for r in done)} passed, {sum(r.status == FAIL for r in done)} failed, "
              f"{sum(r.status == SKIP for r in done)} skipped ({op_seconds:.1f} s)", file=sys.stderr, flush=True)
        for r in done:
            if r.status == FAIL:
                print(f"    FAIL [{r.backend}] {r.case} {r.dtype}: {r.message}", file=sys.stderr, flush=True)
        if args.json:  # rewritten after every op, so a run cut off by a timeout keeps what it checked
            write_json(args.json, info, plan.results, time.perf_counter() - start, finished=False)

    try:
        results = execute(plan, progress)
    except KeyboardInterrupt:
        results = plan.results
        results.append(Result("selftest", "-", "interrupted", "-", FAIL, message="interrupted (Ctrl-C)"))
    except Exception:  # noqa: BLE001 - a bug of the selftest itself: report it with what ran so far
        results = plan.results
        results.append(Result("selftest", "-", "internal error", "-", FAIL, message=traceback.format_exc(limit=3)))
    seconds = time.perf_counter() - start
    print()
    print(format_report(results, seconds), flush=True)
    if args.json:
        write_json(args.json, info, results, seconds, finished=True)
        print(f"wrote {args.json}")
    return EXIT_OK if verdict(results) else EXIT_FAILED


def verdict(results: list[Result]) -> bool:
    """Passed: something ran and nothing failed (skips are listed, not failures)."""
    return any(r.status == PASS for r in results) and not any(r.status == FAIL for r in results)


def write_json(path: str, info: dict, results: list[Result], seconds: float, *, finished: bool) -> None:
    summary = {"passed": sum(r.status == PASS for r in results), "failed": sum(r.status == FAIL for r in results),
               "skipped": sum(r.status == SKIP for r in results), "seconds": round(seconds, 2),
               "finished": finished, "ok": finished and verdict(results)}
    Path(path).write_text(json.dumps({"header": info, "summary": summary, "matrix": matrix(results),
                                      "checks": [asdict(r) for r in results]}, indent=1))
