"""Drafts without a draft model: strategy `lookup` against HF's own prompt lookup, on a workload whose output
should repeat its input, with the embedded default target (or --models PATH).

Workload "edit": standard-library functions (docstrings dropped, 40-64 tokens with the copy), each followed by
the first third of an edited copy of itself (its first argument renamed): the continuation is expected to
copy the rest of the function. The held-out files come first (the target never trained on them), then others.
Workload "repeat" (--cache): the same requests a second time with a LookupCache holding the first pass's
outputs (an agent loop re-asking what it asked before; SuffixDecoding's setting).

Rows per batch size (--batch-sizes, default 1 and 4): HF greedy `generate`; HF prompt lookup
(`prompt_lookup_num_tokens`, batch 1 only: HF refuses batches); ours plain (the engine, no drafts); ours lookup
chain and lookup tree (--tree-nodes); ours lookup chain with the cache. Columns: tokens/s (median of --repeats
passes, the methods interleaved in every pass so a busy neighbour slows all of them alike; min-max beside it),
tokens per target forward (HF: its forward calls counted by a hook), acceptance rate, and whether every row
equals HF greedy of that prompt decoded alone. EOS is off: every call emits rows x --max-new-tokens tokens.

    python bench/lookup.py --out bench/results                # CPU, 1 thread: the table in docs/strategies/lookup.md
    python bench/lookup.py --smoke --out /tmp/lookup          # two prompts, a few tokens (CI)

Writes lookup_<device>.json, .md (with the issue's targets, met or not) and _tokens.png under --out.
"""

import argparse
import ast
import re
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec_kernels
from _method_bars import ForwardCounter, method_bars, sync
from _report import write_report
from _stdlib_text import HELD_OUT, stdlib_files

OTHER_FILES = ("textwrap.py", "bisect.py", "heapq.py", "string.py", "copy.py", "keyword.py", "this.py",
               "calendar.py", "base64.py", "quopri.py")
COLS = ["batch", "method", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "tokens_per_forward",
        "acceptance_rate", "match_rate", "identical_to_greedy", "status"]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="a default-models folder (default: the embedded set)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts of the workload (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--num-draft-tokens", type=int, default=10, help="chain length (HF's default 10)")
    parser.add_argument("--max-ngram", type=int, default=3, help="longest suffix matched (both ours and HF's)")
    parser.add_argument("--tree-nodes", type=int, default=16)
    parser.add_argument("--no-cache", dest="cache", action="store_false", help="skip the repeated-requests rows")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--smoke", action="store_true", help="2 prompts, 8 tokens, batch 1 and 2, 1 pass (CI)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--stem", default=None, help="output file names (default: lookup_<device>)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.max_new_tokens, args.batch_sizes, args.repeats = 2, 8, [1, 2], 1
    args.stem = args.stem or f"lookup_{torch.device(args.device).type}"
    return args


def edit_prompts(tokenizer, count: int, low: int = 40, high: int = 64) -> list[str]:
    """Functions followed by the first third of a copy with the first argument renamed (see the module doc)."""
    prompts = []
    for source in stdlib_files((*HELD_OUT, *OTHER_FILES)).values():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef) or not node.args.args:
                continue
            function = ast.get_source_segment(source, node)
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):  # the docstring
                function = function.replace(ast.get_source_segment(source, first), "")
            function = re.sub(r"\n\s*\n", "\n", function)
            name = node.args.args[0].arg
            edited = re.sub(rf"\b{re.escape(name)}\b", f"{name}_value", function)
            prompt = function + "\n\n" + edited[:len(edited) // 3]
            if low <= len(tokenizer(prompt).input_ids) <= high:
                prompts.append(prompt)
            if len(prompts) == count:
                return prompts
    return prompts


def methods(target, args, caches: dict) -> dict:
    """name -> fn(batch) -> (new tokens [B, T], stats dict or None); None for a method this batch cannot run."""
    common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=0)
    lookup = dict(strategy="lookup", num_draft_tokens=args.num_draft_tokens, max_ngram=args.max_ngram)

    def hf(**options):
        def run(batch):
            counter = ForwardCounter(target)
            try:
                out = target.generate(**batch, do_sample=False, eos_token_id=None, **common, **options)
            finally:
                counter.remove()
            rows = batch["input_ids"].shape[0]
            return out[:, batch["input_ids"].shape[1]:], {"forwards": counter.calls * rows}
        return run

    def ours(cache_key=None, **options):
        def run(batch):
            extra = {} if cache_key is None else {"lookup_cache": caches[cache_key](batch)}
            out = specdec_kernels.generate(target, batch["input_ids"], attention_mask=batch["attention_mask"],
                                           eos_token_id=[], **common, **options, **extra)
            stats = out.stats
            return out.sequences[:, batch["input_ids"].shape[1]:], {
                "forwards": stats.target_forwards, "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens,
                "match_rate": stats.extra.get("match_rate")}
        return run

    table = {"HF greedy": hf(), "HF prompt lookup": hf(prompt_lookup_num_tokens=args.num_draft_tokens,
                                                      max_matching_ngram_size=args.max_ngram),
             "ours plain": ours(strategy="plain"), "ours lookup chain": ours(**lookup),
             "ours lookup tree": ours(**lookup, tree_nodes=args.tree_nodes)}
    if args.cache:
        table["ours lookup chain, repeated requests (LookupCache)"] = ours("repeat", **lookup)
    return table


def batches(tokenizer, prompts, size: int, device) -> list[dict]:
    tokenizer.padding_side = "left"
    out = []
    for start in range(0, len(prompts) - size + 1, size):
        enc = tokenizer(prompts[start:start + size], return_tensors="pt", padding=True)
        out.append({"input_ids": enc.input_ids.to(device), "attention_mask": enc.attention_mask.to(device)})
    return out


def greedy_alone(target, tokenizer, prompts, args, device) -> dict:
    """prompt -> HF greedy's new tokens of that prompt decoded alone."""
    out = {}
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        out[prompt] = target.generate(ids, do_sample=False, eos_token_id=None, max_new_tokens=args.max_new_tokens,
                                      pad_token_id=0)[0, ids.shape[1]:].cpu()
    return out


def measure(target, tokenizer, prompts, size: int, args, device) -> list[dict]:
    """Every method at batch `size`: --repeats interleaved passes over the workload's batches."""
    work = batches(tokenizer, prompts, size, device)
    texts = [prompts[i:i + size] for i in range(0, len(prompts) - size + 1, size)]
    reference = greedy_alone(target, tokenizer, prompts, args, device)
    earlier = {}  # the repeated-requests cache: what the first pass decoded for this batch

    def warmed(batch):
        cache = specdec_kernels.LookupCache(max_tokens=4096)
        cache.add(earlier[id(batch)])
        return cache

    table = methods(target, args, {"repeat": warmed})
    for batch, rows in zip(work, texts):  # the "first pass" the cache remembers: each row's greedy tokens
        earlier[id(batch)] = [reference[text] for text in rows]
    usable = {name: fn for name, fn in table.items() if not (name == "HF prompt lookup" and size > 1)}
    results = {name: {"seconds": [], "stats": None, "tokens": None} for name in usable}
    with torch.no_grad():
        for name, fn in usable.items():  # warm-up
            fn(work[0])
        for repeat in range(args.repeats):
            order = list(usable)
            order = order[repeat % len(order):] + order[:repeat % len(order)]  # rotate who goes first
            for name in order:
                fn, outputs, stats = usable[name], [], []
                sync(device)
                start = time.perf_counter()
                for batch in work:
                    tokens, numbers = fn(batch)
                    outputs.append(tokens)
                    stats.append(numbers)
                sync(device)
                results[name]["seconds"].append(time.perf_counter() - start)
                results[name]["tokens"], results[name]["stats"] = outputs, stats
    rows = []
    for name in table:
        if name not in usable:
            rows.append({"batch": size, "method": name, "status": "refused by HF (batch_size = 1 only)"})
            continue
        result = results[name]
        emitted = sum(t.numel() for t in result["tokens"])
        rates = [emitted / s for s in result["seconds"]]
        identical = all(torch.equal(tokens[r].cpu(), reference[text])
                        for tokens, batch_texts in zip(result["tokens"], texts) for r, text in enumerate(batch_texts))
        forwards = sum(s["forwards"] for s in result["stats"])
        drafted = sum(s.get("drafted", 0) for s in result["stats"])
        accepted = sum(s.get("accepted", 0) for s in result["stats"])
        matches = [s["match_rate"] for s in result["stats"] if s.get("match_rate") is not None]
        rows.append({"batch": size, "method": name, "tokens_per_s": round(statistics.median(rates), 1),
                     "tokens_per_s_min": round(min(rates), 1), "tokens_per_s_max": round(max(rates), 1),
                     "tokens_per_s_passes": [round(r, 1) for r in rates],
                     "tokens_per_forward": round(emitted / forwards, 3),
                     "acceptance_rate": round(accepted / drafted, 3) if drafted else "-",
                     "match_rate": round(statistics.mean(matches), 3) if matches else "-",
                     "identical_to_greedy": "yes" if identical else "NO", "status": "ok"})
    return rows


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets (CPU, batch 1 unless said), each with its numbers: met or not."""
    def row(batch, method):
        return next((r for r in rows if r["batch"] == batch and r["method"] == method and r["status"] == "ok"), None)

    lines = []

    def check(label, ratio_of, at_least):
        (a, b), ratio = ratio_of, None
        if a is not None and b is not None:
            ratio = a / b
        verdict = "n/a" if ratio is None else ("met" if ratio >= at_least else "NOT met")
        lines.append(f"- {label}: {'-' if ratio is None else f'{ratio:.3f}x'} (target >= {at_least}x): {verdict}")

    chain, tree, hf_pl, greedy = (row(1, m) for m in ("ours lookup chain", "ours lookup tree", "HF prompt lookup",
                                                      "HF greedy"))
    get = (lambda r, key: r[key] if r else None)
    check("tokens per target forward, our chain / HF prompt lookup (batch 1)",
          (get(chain, "tokens_per_forward"), get(hf_pl, "tokens_per_forward")), 1.0)
    check("tokens per target forward, our tree / our chain (batch 1)",
          (get(tree, "tokens_per_forward"), get(chain, "tokens_per_forward")), 1.2)
    best = max((r for r in (chain, tree) if r), key=lambda r: r["tokens_per_s"], default=None)
    for other, at_least in ((hf_pl, 1.1), (greedy, 1.5)):
        if not (best and other):
            continue
        # paired by pass: both ran in the same interleaved round, so a slow spell of the machine cancels out
        paired = [a / b for a, b in zip(best["tokens_per_s_passes"], other["tokens_per_s_passes"])]
        ratio = statistics.median(paired)
        verdict = "met" if ratio >= at_least else "NOT met"
        lines.append(f"- tokens/s, {best['method']} / {other['method']} (batch 1): {ratio:.3f}x, the median of "
                     f"{len(paired)} per-pass ratios ({min(paired):.3f}-{max(paired):.3f}) (target >= {at_least}x): "
                     f"{verdict}")
    batched = [r for r in rows if r["batch"] > 1 and r["method"].startswith("ours lookup") and r["status"] == "ok"]
    if batched:
        ok = all(r["identical_to_greedy"] == "yes" for r in batched)
        lines.append(f"- batch {batched[0]['batch']}: ours lookup runs (HF refuses) with every row identical to "
                     f"greedy of its prompt alone: {'met' if ok else 'NOT met'}")
    return lines


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    names = list(dict.fromkeys(r["method"] for r in rows if r["status"] == "ok"))
    method_bars(rows, path, f"lookup drafts, workload 'edit' ({meta['device']}, {meta['date']})", names,
                group_of=lambda r: r["batch"], label_of=lambda size: f"batch {size}",
                tick=lambda n: n.replace(" (LookupCache)", "").replace(", ", ",\n"))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from specdec_kernels.defaults import load_default_models

    models = load_default_models(args.models, device=device, dtype=torch.float32)
    target, tokenizer = models.target, models.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = edit_prompts(tokenizer, args.prompts)
    if not prompts:
        raise SystemExit("bench/lookup.py: no standard-library function fits the prompt length")
    rows = []
    for size in args.batch_sizes:
        print(f"batch {size}: {len(prompts) // size * size} prompts x {args.max_new_tokens} tokens, "
              f"{args.repeats} passes", file=sys.stderr, flush=True)
        rows += measure(target, tokenizer, prompts[:len(prompts) // size * size], size, args, device)
    import transformers

    command = "python bench/lookup.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = targets(rows)
    note = (f"transformers {transformers.__version__}, {args.threads} thread(s), default target "
            f"({models.path.name}), float32, workload 'edit': {len(prompts)} prompts, {args.max_new_tokens} new "
            "tokens, "
            f"EOS off; chain {args.num_draft_tokens} tokens from up to {args.max_ngram}-grams (HF: "
            f"prompt_lookup_num_tokens={args.num_draft_tokens}, max_matching_ngram_size={args.max_ngram}), tree "
            f"{args.tree_nodes} nodes; {args.repeats} interleaved passes.\n\nTargets (the issue's, CPU):\n\n"
            + "\n".join(lines))
    meta = write_report(rows, Path(args.out), args.stem, "Lookup drafts vs HF prompt lookup", COLS, command,
                        {"threads": args.threads, "prompts": prompts, "targets": lines,
                         "transformers": transformers.__version__}, note)
    plot(rows, Path(args.out) / f"{args.stem}_tokens.png", meta)
    print((Path(args.out) / f"{args.stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
