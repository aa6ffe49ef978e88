"""Drafters side by side on the embedded default models (or --models PATH): the same target, the same held-out
prompts, one row per way of drafting, greedy and sampled (temperature 1.0).

Prompts: --prompts windows of --prompt-tokens tokens cut from the standard-library files no part of the default
set trained on (_heldout_slice.py); batch 1 decodes them one at a time, batch B in groups of B (all of one length:
no padding). EOS is off: every call emits rows x --max-new-tokens tokens.

Rows per batch size (--batch-sizes) and mode (--modes): HF `generate` (greedy; in sample mode HF's sampling,
top_k=0: the baseline of speedup_vs_hf_greedy either way); ours with the draft model as a chain of
--num-draft-tokens and as a tree (tree_topk 3, 12 nodes); SpecDec (its drafter's trained block, top_beta=1,
tau=0: lossless; greedy only); lookup (no draft model); EAGLE-3 chain and tree (rows say "no head" while the set
has no eagle3/ folder); HF assisted generation with the draft model (a constant --num-draft-tokens, batch 1 only:
HF refuses batches). Columns: tokens/s (median of --repeats passes, the methods interleaved in every pass so a
busy neighbour slows all of them alike; min-max beside it), the speed-up over HF at the same batch and mode (the
median of per-pass ratios), tokens per target forward (HF: its forward calls counted by a hook), draft time per
step, acceptance rate, and (greedy) whether every row equals HF greedy of that prompt decoded alone.

    python bench/drafters.py --out bench/results              # CPU, 1 thread
    python bench/drafters.py --smoke --out /tmp/drafters      # two prompts, 8 tokens, batch 1 and 2 (CI)

Writes drafters_<device>.json, .md (the table, then the EAGLE-3 targets, met or not) and _tokens.png under --out.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec_kernels
from _heldout_slice import heldout_examples
from _method_bars import ForwardCounter, method_bars, sync
from _report import write_report

METHODS = ("hf greedy", "draft model chain", "draft model tree", "specdec", "lookup", "eagle chain", "eagle tree",
           "hf assisted")
TREE = dict(tree_topk=3, tree_nodes=12)
COLS = ["batch", "mode", "method", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "speedup_vs_hf_greedy",
        "tokens_per_forward", "draft_ms_per_step", "acceptance_rate", "identical_to_greedy", "status"]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="a default-models folder (default: the embedded set)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--modes", nargs="+", default=["greedy", "sample"], choices=["greedy", "sample"])
    parser.add_argument("--num-draft-tokens", type=int, default=4, help="K: chain length, tree depth, HF's drafts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--smoke", action="store_true", help="2 prompts, 8 tokens, batch 1 and 2, 1 pass (CI)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--stem", default=None, help="output file names (default: drafters_<device>)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.max_new_tokens, args.batch_sizes, args.repeats = 2, 8, [1, 2], 1
        args.modes = ["greedy", "sample"]
    args.stem = args.stem or f"drafters_{torch.device(args.device).type}"
    return args


def skipped(method: str, size: int, mode: str, models) -> str | None:
    """Why `method` has no numbers at this batch size and mode (None: it runs)."""
    if method.startswith("eagle") and models.eagle3 is None:
        return "no head"
    if method == "specdec" and mode == "sample":
        return "greedy only"
    if method == "hf assisted" and size > 1:
        return "batch 1 only"
    return None


def assistant_config(draft, k: int):
    """The draft's generation_config set for K drafts a step, every step: this transformers reads
    num_assistant_tokens and its schedule from the ASSISTANT's config (not generate's keywords), and its default
    assistant_confidence_threshold (0.4) would end a draft early whenever the draft is unsure."""
    import copy

    config = copy.deepcopy(draft.generation_config)
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
    config.assistant_confidence_threshold = 0.0
    return config


def methods(models, args, mode: str) -> dict:
    """name -> fn(batch) -> (new tokens [B, T], numbers dict): every method of METHODS in this mode."""
    target, k = models.target, args.num_draft_tokens
    common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=0)
    sample = mode == "sample"
    # HF's top_k defaults to 50, ours to no filter: top_k=0 makes HF sample the same law
    hf_sampling = dict(do_sample=True, temperature=1.0, top_k=0) if sample else dict(do_sample=False)
    our_sampling = dict(do_sample=True, temperature=1.0, seed=0) if sample else {}
    hf_assistant = assistant_config(models.draft, k)

    def hf(**options):
        def run(batch):
            counter = ForwardCounter(target)
            draft_config = models.draft.generation_config
            if "assistant_model" in options:
                models.draft.generation_config = hf_assistant
            if sample:
                torch.manual_seed(0)  # HF samples from the global generator: the same tokens every pass
            try:
                out = target.generate(**batch, eos_token_id=None, **common, **hf_sampling, **options)
            finally:
                counter.remove()
                models.draft.generation_config = draft_config
            rows = batch["input_ids"].shape[0]
            return out[:, batch["input_ids"].shape[1]:], {"forwards": counter.calls * rows}
        return run

    def ours(**options):
        def run(batch):
            out = specdec_kernels.generate(target, batch["input_ids"], attention_mask=batch["attention_mask"],
                                           eos_token_id=[], **common, **our_sampling, **options)
            stats = out.stats
            return out.sequences[:, batch["input_ids"].shape[1]:], {
                "forwards": stats.target_forwards, "drafted": stats.drafted_tokens,
                "accepted": stats.accepted_tokens, "draft_s": stats.draft_time_s, "steps": stats.steps}
        return run

    draft = dict(strategy="speculative", draft_model=models.draft, num_draft_tokens=k)
    eagle = dict(strategy="eagle", draft_model=models.eagle3, num_draft_tokens=k)
    return {"hf greedy": hf(), "draft model chain": ours(**draft), "draft model tree": ours(**draft, **TREE),
            # block_size left at the drafter's trained block: the drafter predicts that many [MASK] slots
            "specdec": ours(strategy="specdec", drafter=models.specdec_drafter, top_beta=1, tau=0.0),
            "lookup": ours(strategy="lookup", num_draft_tokens=k),
            "eagle chain": ours(**eagle), "eagle tree": ours(**eagle, **TREE),
            "hf assisted": hf(assistant_model=models.draft)}


def batches(prompts: list[list[int]], size: int, device) -> list[dict]:
    """The prompts in groups of `size` (one length: the mask is all ones, nothing to pad)."""
    out = []
    for start in range(0, len(prompts) - size + 1, size):
        ids = torch.tensor(prompts[start:start + size], dtype=torch.int64, device=device)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return out


def greedy_alone(target, prompts, args, device) -> list[torch.Tensor]:
    """HF greedy's new tokens of each prompt decoded alone (no batch, no padding): what greedy rows must equal."""
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.int64, device=device)
        out.append(target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=None,
                                   max_new_tokens=args.max_new_tokens, pad_token_id=0)[0, ids.shape[1]:].cpu())
    return out


def timed_passes(usable: dict, work: list[dict], repeats: int, device) -> dict:
    """--repeats passes over the batches, every method once per pass, the order rotated each pass so none is
    always first; the last pass's tokens and numbers are kept."""
    results = {name: {"seconds": [], "stats": None, "tokens": None} for name in usable}
    with torch.no_grad():
        for fn in usable.values():  # warm-up
            fn(work[0])
        for repeat in range(repeats):
            order = list(usable)
            order = order[repeat % len(order):] + order[:repeat % len(order)]
            for name in order:
                outputs, stats = [], []
                sync(device)
                start = time.perf_counter()
                for batch in work:
                    tokens, numbers = usable[name](batch)
                    outputs.append(tokens)
                    stats.append(numbers)
                sync(device)
                results[name]["seconds"].append(time.perf_counter() - start)
                results[name]["tokens"], results[name]["stats"] = outputs, stats
    return results


def summary(size: int, mode: str, name: str, result: dict, reference: list, baseline: list | None) -> dict:
    """One table row from a method's passes."""
    emitted = sum(t.numel() for t in result["tokens"])
    rates = [emitted / s for s in result["seconds"]]
    total = {key: sum(s.get(key, 0) for s in result["stats"]) for key in ("forwards", "drafted", "accepted",
                                                                           "draft_s", "steps")}
    ours = not name.startswith("hf ")
    identical = "-"
    if mode == "greedy":
        rows = [row for tokens in result["tokens"] for row in tokens.cpu()]
        identical = len(rows) == len(reference) and all(torch.equal(a, b) for a, b in zip(rows, reference))
    # paired by pass: both ran in the same interleaved round, so a slow spell of the machine cancels out
    speedup = round(statistics.median(a / b for a, b in zip(rates, baseline)), 3) if baseline else "-"
    return {"batch": size, "mode": mode, "method": name, "tokens_per_s": round(statistics.median(rates), 1),
            "tokens_per_s_min": round(min(rates), 1), "tokens_per_s_max": round(max(rates), 1),
            "tokens_per_s_passes": [round(r, 1) for r in rates], "speedup_vs_hf_greedy": speedup,
            "tokens_per_forward": round(emitted / total["forwards"], 3),
            "draft_ms_per_step": round(1000 * total["draft_s"] / total["steps"], 3) if ours and total["steps"] else "-",
            "acceptance_rate": round(total["accepted"] / total["drafted"], 3) if total["drafted"] else "-",
            "identical_to_greedy": identical, "status": "ok"}


def measure(models, prompts, reference, size: int, mode: str, args, device) -> list[dict]:
    """Every method at batch `size` in `mode`; a method that cannot run here gets a row with its reason."""
    work = batches(prompts, size, device)
    table = methods(models, args, mode)
    usable = {name: fn for name, fn in table.items() if skipped(name, size, mode, models) is None}
    results = timed_passes(usable, work, args.repeats, device)
    baseline = [sum(t.numel() for t in results["hf greedy"]["tokens"]) / s for s in results["hf greedy"]["seconds"]]
    rows = []
    for name in METHODS:
        reason = skipped(name, size, mode, models)
        if reason is not None:
            rows.append({"batch": size, "mode": mode, "method": name, "status": reason})
            continue
        rows.append(summary(size, mode, name, results[name], reference[:len(work) * size], baseline))
    return rows


def targets(rows: list[dict]) -> list[str]:
    """The EAGLE-3 targets from the greedy rows, each with its measured value: met or not met."""
    sizes = sorted({r["batch"] for r in rows})

    def row(batch, method):
        return next((r for r in rows if r["batch"] == batch and r["mode"] == "greedy" and r["method"] == method
                     and r["status"] == "ok"), None)

    lines = []

    def check(label, a, b, key, at_least):
        if a is None or b is None:
            why = next((r["status"] for r in rows if r["method"].startswith("eagle") and r["status"] != "ok"),
                       "not measured")
            lines.append(f"- {label}: n/a ({why}) (target >= {at_least}x): not met")
            return
        ratio = a[key] / b[key] if key != "speedup_vs_hf_greedy" else a[key]
        lines.append(f"- {label}: {ratio:.3f}x (target >= {at_least}x): {'met' if ratio >= at_least else 'not met'}")

    first = sizes[0] if sizes else 1
    chain, tree, draft_chain = row(first, "eagle chain"), row(first, "eagle tree"), row(first, "draft model chain")
    check(f"tokens per target forward, eagle chain / draft model chain, same depth (batch {first})", chain,
          draft_chain, "tokens_per_forward", 1.0)
    check(f"tokens per target forward, eagle tree / eagle chain (batch {first})", tree, chain, "tokens_per_forward",
          1.15)
    eagles = [r for r in (row(1, "eagle chain"), row(1, "eagle tree")) if r]
    best = max(eagles, key=lambda r: r["speedup_vs_hf_greedy"], default=None)
    label = f"tokens/s, {best['method']} / hf greedy (batch 1)" if best else "tokens/s, eagle / hf greedy (batch 1)"
    check(label, best, row(1, "hf greedy"), "speedup_vs_hf_greedy", 1.2)
    return lines


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    """Tokens/s and tokens per target forward per method, a bar per batch size and mode."""
    names = [m for m in METHODS if any(r["method"] == m and r["status"] == "ok" for r in rows)]
    method_bars(rows, path, f"drafters on the default models, held-out prompts ({meta['device']}, {meta['date']})",
                names, group_of=lambda r: (r["batch"], r["mode"]), label_of=lambda group: "batch {}, {}".format(*group))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from specdec_kernels.defaults import load_default_models

    models = load_default_models(args.models, device=device, dtype=torch.float32)
    examples = heldout_examples(models.tokenizer, args.prompts, args.prompt_tokens, args.max_new_tokens)
    prompts = [example.prompt for example in examples]
    with torch.no_grad():
        reference = greedy_alone(models.target, prompts, args, device)
    rows = []
    for size in args.batch_sizes:
        for mode in args.modes:
            print(f"batch {size}, {mode}: {len(prompts) // size * size} prompts x {args.max_new_tokens} tokens, "
                  f"{args.repeats} passes", file=sys.stderr, flush=True)
            rows += measure(models, prompts[:len(prompts) // size * size], reference, size, mode, args, device)
    import transformers

    command = "python bench/drafters.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = targets(rows)
    k = args.num_draft_tokens
    note = (f"transformers {transformers.__version__}, {args.threads} thread(s), default models "
            f"({models.path.name}), float32; {len(prompts)} held-out prompts of {args.prompt_tokens} tokens, "
            f"{args.max_new_tokens} new tokens, EOS off; K={k} drafts (chains, tree depth, HF assisted's constant "
            f"num_assistant_tokens), trees tree_topk={TREE['tree_topk']} tree_nodes={TREE['tree_nodes']}, specdec "
            f"block {models.specdec_drafter.config.block_size} (its trained block) top_beta=1 tau=0; sample mode: "
            f"temperature 1.0, no top-k/top-p (ours seed=0); {args.repeats} interleaved passes; "
            f"EAGLE-3 head: {'yes' if models.eagle3 is not None else 'none in this set'}.")
    out = Path(args.out)
    meta = write_report(rows, out, args.stem, "Drafters on the default models", COLS, command,
                        {"threads": args.threads, "prompts": [e.source for e in examples], "targets": lines,
                         "num_draft_tokens": k, "transformers": transformers.__version__}, note)
    report = out / f"{args.stem}.md"
    report.write_text(report.read_text() + "\n## Targets (greedy rows)\n\n" + "\n".join(lines) + "\n")
    plot(rows, out / f"{args.stem}_tokens.png", meta)
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
