"""Where our engine's time goes per token, next to HF's greedy `generate`, in one run (issue 18).

For each model pair and batch size this script
  1. times HF greedy `generate` (do_sample=False, its default dynamic cache), our `plain` strategy
     (one target forward per token on our engine) and our `speculative` strategy, interleaved call by
     call (round r runs every method once, then round r + 1), and reports the median tokens/s of the
     rounds with their min-max spread; plain / HF is computed per round and reported the same way;
  2. runs each method once more with timing hooks (a breakdown, not a speed figure: the hooks cost
     about a microsecond each) that split the time per token into
       model          the model's own modules: embeddings, decoder layers minus attention, norm, LM head
       draft_model    the same for the draft (speculative)
       attention      the attention kernel (ours: the chain/tree attention; HF: its SDPA function)
       attn_dispatch  our attention hook and op wrappers around the kernel (checks, dispatch)
       cache_write    SpecCache.write (our K/V writes; HF's cache update is inside `model`)
       cache_commit   SpecCache commit / rollback / crop
       verify_op      the accept rule (greedy_verify on the target's logits)
       bookkeeping    everything else: the engine's (or HF generate's) own loop
  3. checks that plain and speculative greedy output equals HF's, token for token.
Speculative's expected speedup over plain is Leviathan's (1 - a^(g+1)) / ((1 - a)(g c + 1)), with a the
acceptance rate whose (1 - a^(g+1)) / (1 - a) equals the measured tokens per target forward, and c the
draft's plain time per token over the target's (same loop, same batch), both from this run
("leviathan" column; "spec_vs_plain" is the measured speedup, per round). Leviathan's model prices a
verification forward of g + 1 tokens like a one-token forward; "v" is their measured time ratio here
and "leviathan_v" = (1 - a^(g+1)) / ((1 - a)(g c + v)) the same formula with that cost.

Pairs: "default" (the embedded default target and draft, text prompts) and "wide" (a 6-layer x 384
Llama built here, 12.6 M parameters, random init, with a 1-layer draft sharing its first layer,
embeddings and head: bench/_e2e_pairs.AlignedPair; --noise sets how far the target's extra layers
move it from the draft, i.e. the acceptance rate). Batch 4 rows are left-padded to ragged lengths.
EOS is off, fp32, one torch thread.

    python bench/engine_overhead.py --out bench/results --stem engine_overhead_after
    python bench/engine_overhead.py --smoke --out /tmp/eo      # a few seconds (CI)
"""

import argparse
import contextlib
import shlex
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import specdec_kernels  # noqa: E402
from _e2e_pairs import WIDE_SHAPE, AlignedPair, SMOKE_SHAPE, default_pair, random_prompts  # noqa: E402
from _report import write_report  # noqa: E402

METHODS = ("hf_greedy", "plain", "speculative")
PARTS = ("model", "draft_model", "attention", "attn_dispatch", "cache_write", "cache_commit", "verify_op",
         "bookkeeping")
COLS = ["pair", "params_m", "batch", "method", "tok_s", "tok_s_min", "tok_s_max", "vs_hf", "vs_hf_min", "vs_hf_max",
        "ms_per_token", *[f"{p}_ms" for p in PARTS], "alpha", "tokens_per_forward", "c", "leviathan", "v",
        "leviathan_v", "spec_vs_plain", "matches_hf"]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=["default", "wide"], choices=["default", "wide"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=4, help="num_draft_tokens of `speculative`")
    parser.add_argument("--noise", type=float, default=0.05, help="the wide pair's noise (lower: higher acceptance)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (after one warm-up round)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a tiny random pair, batch 1 and 2, 6 tokens (CI)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--stem", default="engine_overhead")
    parser.add_argument("--label", default="", help="a word for the markdown title (e.g. before / after)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.pairs, args.batch_sizes, args.max_new_tokens, args.prompt_length = ["smoke"], [1, 2], 6, 6
        args.repeats = 1
    return args


# ---- the pairs -------------------------------------------------------------------------------

def build_pairs(args):
    """(name, target, draft, prompts [N, P]) for each requested pair."""
    for name in args.pairs:
        if name == "default":
            pair = default_pair(None, max(args.batch_sizes), args.prompt_length, "cpu", torch.float32)
            if pair.skip:
                print(f"skipping the default pair: {pair.skip}", file=sys.stderr)
                continue
            yield name, pair.target, pair.draft, pair.prompts
        else:
            shape = SMOKE_SHAPE if name == "smoke" else WIDE_SHAPE
            family = AlignedPair(shape, 1, 2 if name == "smoke" else 6, "cpu", torch.float32)
            family.set_noise(args.noise)
            for model in (family.target, family.draft):
                model.generation_config.eos_token_id = None
                model.generation_config.pad_token_id = 0
            yield name, family.target, family.draft, random_prompts(shape["vocab_size"], max(args.batch_sizes),
                                                                    args.prompt_length)


def ragged(prompts: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` rows, left-padded: row b drops its first 2b tokens (batch 1: the full prompt)."""
    ids = prompts[:batch].clone()
    mask = torch.ones_like(ids)
    for b in range(batch):
        cut = min(2 * b, ids.shape[1] - 1)
        ids[b] = torch.cat([ids.new_zeros(cut), prompts[b, :ids.shape[1] - cut]])
        mask[b, :cut] = 0
    return ids, mask


def methods(target, draft, ids, mask, args) -> dict:
    """Zero-argument callables returning new tokens [B, T] and our stats (None for HF)."""
    common = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens)
    prompt = ids.shape[1]

    def hf():
        out = target.generate(ids, do_sample=False, pad_token_id=0, **common)
        return out[:, prompt:], None

    def ours(strategy, **options):
        def call():
            out = specdec_kernels.generate(target, ids, strategy=strategy, **common, **options)
            return out.sequences[:, prompt:], out.stats
        return call

    return {"hf_greedy": hf, "plain": ours("plain"),
            "speculative": ours("speculative", draft_model=draft, num_draft_tokens=args.gamma),
            "plain_draft": lambda: (specdec_kernels.generate(draft, ids, strategy="plain", **common).sequences[:, prompt:],
                                    None)}


# ---- timing ----------------------------------------------------------------------------------

def interleaved(calls: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of every method, round by round (one untimed warm-up round first)."""
    for fn in calls.values():
        fn()
    times = defaultdict(list)
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


class Sections:
    """Exclusive time per named section: a section's time excludes the sections nested in it."""

    def __init__(self):
        self.totals = defaultdict(float)
        self.stack: list[float] = []

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self.stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                nested = self.stack.pop()
                self.totals[name(args) if callable(name) else name] += elapsed - nested
                if self.stack:
                    self.stack[-1] += elapsed
        return timed


_ABSENT = object()


def _get(owner, key):
    if isinstance(owner, dict):
        return owner.get(key, _ABSENT)
    return owner.__dict__[key] if isinstance(owner, type) else getattr(owner, key)


def _set(owner, key, value):
    if isinstance(owner, dict):
        if value is _ABSENT:
            owner.pop(key, None)
        else:
            owner[key] = value
    else:
        setattr(owner, key, value)


@contextlib.contextmanager
def patched(patches):
    """Set (owner, name, value) for the duration: a class or instance attribute, or a dict entry;
    restore the originals after."""
    saved = [(owner, key, _get(owner, key)) for owner, key, _ in patches]
    try:
        for owner, key, value in patches:
            _set(owner, key, value)
        yield
    finally:
        for owner, key, value in reversed(saved):
            _set(owner, key, value)


def hook_points(sections: Sections, target) -> list:
    """What the breakdown wraps: our attention hook, op wrappers and kernels, cache methods, the
    adapters' forwards (target vs draft), the verifier; HF's model forward and SDPA function."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from specdec_kernels import ops
    from specdec_kernels.common import registry
    from specdec_kernels.decoding.verifier import Verifier
    from specdec_kernels.hf import attention as hf_attention
    from specdec_kernels.hf.adapter_base import ModelAdapter
    from specdec_kernels.hf.cache import SpecCache

    wrap = sections.wrap
    kernels = registry._IMPLS["tree_attention"]
    patches = [
        *[(ModelAdapter, m, wrap(lambda a: "model" if a[0].model is target else "draft_model", ModelAdapter.__dict__[m]))
          for m in ("start", "run_layers", "logits")],  # every forward of ours is made of these three
        (SpecCache, "write", wrap("cache_write", SpecCache.write)),
        *[(SpecCache, m, wrap("cache_commit", SpecCache.__dict__[m])) for m in ("commit", "rollback", "crop")],
        (Verifier, "__call__", wrap("verify_op", Verifier.__call__)),  # every drafter is judged by it
        (ops, "tree_attention", wrap("attn_dispatch", ops.tree_attention)),
        (target, "forward", wrap("model", target.forward)),
    ]
    patches.append((kernels, "torch", wrap("attention", kernels["torch"])))
    # the lean chain path (when the attention hook has one) is a kernel too
    for name in ("chain_attention",):
        if hasattr(hf_attention, name):
            patches.append((hf_attention, name, wrap("attention", getattr(hf_attention, name))))
    # HF looks attention functions up by name at call time: local entries shadow the global ones
    mapping = ALL_ATTENTION_FUNCTIONS._local_mapping
    for key, part in (("sdpa", "attention"), (hf_attention.ATTENTION_NAME, "attn_dispatch")):
        patches.append((mapping, key, wrap(part, ALL_ATTENTION_FUNCTIONS[key])))
    return patches


def breakdown(fn, target, tokens: int, calls: int = 3) -> dict:
    """ms per emitted token in each part: of `calls` calls with the hooks on, the fastest (the one
    other processes disturbed least)."""
    best = None
    for _ in range(calls):
        sections = Sections()
        with patched(hook_points(sections, target)):
            start = time.perf_counter()
            fn()
            total = time.perf_counter() - start
        if best is None or total < best[0]:
            best = (total, sections.totals)
    total, totals = best
    parts = {p: totals.get(p, 0.0) for p in PARTS}
    parts["bookkeeping"] = total - sum(v for k, v in parts.items() if k != "bookkeeping")
    return {f"{p}_ms": round(1e3 * v / tokens, 4) for p, v in parts.items()}


# ---- one pair --------------------------------------------------------------------------------

def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al. Eq. 1: expected tokens per target forward, (1 - a^(g+1)) / (1 - a)."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def alpha_of(tokens_per_forward: float, gamma: int) -> float:
    """The acceptance rate a whose expected_tokens(a, g) is the measured tokens per forward
    (bisection: expected_tokens grows with a)."""
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens(mid, gamma) < tokens_per_forward else (low, mid)
    return (low + high) / 2


def leviathan(alpha: float, gamma: int, c: float) -> float:
    """Expected speedup of speculative over plain decoding (Leviathan et al., Theorem 3.8):
    (1 - a^(g+1)) / ((1 - a)(g c + 1))."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def forward_cost_ratio(target, ids: torch.Tensor, gamma: int, repeats: int = 15) -> float:
    """v: the time of one target forward of gamma + 1 tokens over that of a one-token forward, on a
    cache holding the prompt (medians of interleaved calls). Leviathan's cost model takes v = 1 (on a
    GPU a forward of a few tokens is bound by reading the weights); on a CPU it is not."""
    from specdec_kernels import hf
    from specdec_kernels.decoding.engine import restored_attention

    times = {1: [], gamma + 1: []}
    with restored_attention(target), torch.no_grad():
        adapter = hf.adapt(target)
        cache = adapter.new_cache(ids.shape[0], ids.shape[1] + gamma + 2)
        adapter.prefill(ids, cache, logits=False)
        for _ in range(repeats):
            for n in times:  # verify leaves the lengths alone: every call sees the same cache
                start = time.perf_counter()
                adapter.verify(ids[:, -n:], cache)
                times[n].append(time.perf_counter() - start)
    return statistics.median(times[gamma + 1]) / statistics.median(times[1])


def run_pair(name, target, draft, prompts, args) -> list[dict]:
    rows = []
    params = round(sum(p.numel() for p in target.parameters()) / 1e6, 2)
    for batch in args.batch_sizes:
        ids, mask = ragged(prompts, batch)
        calls = methods(target, draft, ids, mask, args)
        times = interleaved(calls, args.repeats)
        outputs = {m: calls[m]() for m in METHODS}
        tokens = batch * args.max_new_tokens
        hf_tokens = outputs["hf_greedy"][0]
        stats = outputs["speculative"][1]
        per_forward = stats.emitted_tokens / max(stats.target_forwards, 1)
        alpha = alpha_of(per_forward, args.gamma)
        # c: the draft's plain time per token over the target's (same loop, same batch)
        c = statistics.median(times["plain_draft"]) / statistics.median(times["plain"])
        for method in METHODS:
            seconds = times[method]
            speed = [tokens / s for s in seconds]
            row = {"pair": name, "params_m": params, "batch": batch, "method": method,
                   "tok_s": round(statistics.median(speed), 1), "tok_s_min": round(min(speed), 1),
                   "tok_s_max": round(max(speed), 1)}
            ratios = [h / s for h, s in zip(times["hf_greedy"], seconds)]  # round by round
            row.update(vs_hf=round(statistics.median(ratios), 3), vs_hf_min=round(min(ratios), 3),
                       vs_hf_max=round(max(ratios), 3))
            row["ms_per_token"] = round(1e3 * statistics.median(seconds) / tokens, 4)
            row.update(breakdown(calls[method], target, tokens))
            if method != "hf_greedy":
                row["matches_hf"] = bool(torch.equal(outputs[method][0], hf_tokens))
            if method == "speculative":
                per_step = [r / s for r, s in zip(times["plain"], seconds)]
                v = forward_cost_ratio(target, ids, args.gamma)
                row.update(v=round(v, 3), leviathan_v=round(expected_tokens(alpha, args.gamma) / (args.gamma * c + v), 3))
                row.update(alpha=round(alpha, 3), c=round(c, 3),
                           tokens_per_forward=round(per_forward, 3),
                           leviathan=round(leviathan(alpha, args.gamma, c), 3),
                           spec_vs_plain=round(statistics.median(per_step), 3))
            rows.append(row)
            print(" ".join(f"{k}={row[k]}" for k in ("pair", "batch", "method", "tok_s", "vs_hf", "ms_per_token")
                           if k in row), flush=True)
    return rows


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    command = "python bench/engine_overhead.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    rows = []
    for name, target, draft, prompts in build_pairs(args):
        rows += run_pair(name, target, draft, prompts, args)
    note = (f"fp32, {args.threads} thread(s), {args.max_new_tokens} new tokens per row (EOS off), prompts of "
            f"{args.prompt_length} tokens (batch > 1: left-padded, row b {2}b tokens shorter), gamma={args.gamma}; "
            f"tok_s: median of {args.repeats} interleaved rounds (min-max beside it); vs_hf: tokens/s over HF "
            f"greedy generate, per round; *_ms: ms per token from one extra call with timing hooks. "
            f"{args.label}")
    title = f"Engine overhead per token{': ' + args.label if args.label else ''}"
    write_report(rows, Path(args.out), args.stem, title, COLS, command,
                 {"threads": args.threads, "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
                  "noise": args.noise, "repeats": args.repeats}, note)
    return rows


if __name__ == "__main__":
    main()
