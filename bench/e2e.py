"""End-to-end tokens/s of our speculative decoding against HF `generate`, in one run (issue 9).

Methods (bench/_e2e_runners.py says exactly what each one runs):
    hf_dynamic        HF generate, dynamic cache
    hf_static         HF generate, cache_implementation="static" (compiled by HF on a GPU)
    hf_assisted       HF assisted generation (assistant_model=draft, gamma drafts); batch > 1 fails in HF
    ours_spec         specdec_kernels.generate(strategy="speculative"), CUDA graphs on a GPU ("graphs" column)
    ours_hf_hook      ours_spec through HF's own target.generate(custom_generate=specdec_kernels.custom_generate,
                      assistant_model=draft): hook_overhead is its time over ours_spec's, minus 1, the median
                      of --repeats rounds that call both back to back (hook_overhead_range: min and max)
    ours_plain        our plain greedy: the same engine with a zero-token draft (Leviathan's baseline)
    ours_plain_draft  the same plain loop on the draft model (gives the cost ratio c)
    ours_spec_tree    ours_spec with a token tree (--trees K,N: tree_topk=K, tree_nodes=N at depth gamma); its
                      mean_accepted is tokens per target forward, vs_chain its ratio to ours_spec's (Leviathan's
                      theory is a chain's, so the theory columns stay empty)
Pairs: synthetic aligned pairs at each --noise level (bench/_e2e_pairs.py; TinyLlama-1.1B-shaped 22-layer
target and 2-layer draft on a GPU, small shapes on the CPU), the embedded default pair (or --models PATH),
and every --pair TARGET DRAFT. Batch sizes x greedy/sampling x gamma.

Per row: tokens/s (median of --repeats synchronised calls after the first), the first call's latency
separately (first_call_s: kept CUDA graphs are freed before every row, so it includes capture) and the
second call's (second_call_s: it replays the graphs the first call kept), and for ours_spec: Leviathan's
alpha, vLLM's acceptance rate, mean tokens per target forward, c, the theoretical speedup
(1 - a^(g+1)) / ((1 - a)(g c + 1)), the measured speedup over ours_plain (same batch, same graph mode; sampling rows use it too, as plain sampling costs one
target forward per token as well), measured/theory, the speedup over hf_static, and whether greedy output equals HF's greedy.
EOS is switched off so every method generates exactly --max-new-tokens per row.

    python bench/e2e.py --out bench/results                 # GPU: TinyLlama-shaped pair, default pair
    python bench/e2e.py --smoke --models PATH --out /tmp/e2e # CPU, tiny (CI)
    python bench/e2e.py --noise 0 0.04 --no-default --methods ours_plain ours_plain_draft hf_dynamic ours_spec \
        --graph-modes on --hf-modes greedy --jsonl /tmp/rows.jsonl --out /tmp/e2e   # a slice (the first GPU look's)
Writes e2e.json, e2e.md, e2e_speedup.png, e2e_tokens.png under --out (--stem renames them); --jsonl also appends
each row to a file the moment it is measured.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

import _e2e_runners as run
from specdec_kernels.decoding import clear_graph_cache
from _e2e_pairs import (CPU_SHAPE, SMOKE_SHAPE, TINYLLAMA_SHAPE, AlignedPair, Pair, default_pair, local_pair,
                        random_prompts)
from _report import write_report  # noqa: E402  (bench/ is on sys.path)

HF_METHODS = ("hf_dynamic", "hf_static", "hf_assisted")
METHODS = ("ours_plain", "ours_plain_draft", *HF_METHODS, "ours_spec", "ours_hf_hook", "ours_spec_tree")
COLS = ["pair", "noise", "batch", "mode", "method", "graphs", "gamma", "tree", "status", "tok_s", "first_call_s",
        "second_call_s", "alpha", "acceptance_rate", "mean_accepted", "c", "theory_speedup", "speedup_vs_plain", "measured_over_theory",
        "speedup_vs_hf_static", "vs_chain", "hook_overhead", "hook_overhead_range", "matches_hf_greedy", "error"]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampling"], choices=["greedy", "sampling"])
    parser.add_argument("--hf-modes", nargs="+", default=None, choices=["greedy", "sampling"],
                        help="the modes the HF methods run in (default: --modes)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                        help="the methods to run (default: all; ours_spec_tree needs --trees, theory needs "
                             "ours_plain and ours_plain_draft)")
    parser.add_argument("--graph-modes", nargs="+", default=None, choices=["on", "off"],
                        help="our CUDA graphs on a GPU (default: off and on; the CPU runs off only)")
    parser.add_argument("--gammas", type=int, nargs="+", default=[4], help="num_draft_tokens values")
    parser.add_argument("--trees", nargs="*", default=[], metavar="K,N",
                        help="token trees (tree_topk,tree_nodes) run as ours_spec_tree rows at every gamma")
    parser.add_argument("--noise", type=float, nargs="*", default=None,
                        help="synthetic pair noise levels (std in units of the init range); none = no synthetic pair")
    parser.add_argument("--target-layers", type=int, default=None, help="synthetic target layers (GPU: 22)")
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--models", default=None, help="default model set folder (default: the embedded set)")
    parser.add_argument("--no-default", action="store_true", help="skip the default pair")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("TARGET", "DRAFT"),
                        help="local HF model folders (repeatable)")
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 128 on a GPU, 48 on the CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method-timeout", type=float, default=300, help="seconds per method (a timeout is a row)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--smoke", action="store_true", help="tiny synthetic pair, batch 1 and 2, few tokens (CI)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--stem", default="e2e", help="output file names")
    parser.add_argument("--jsonl", type=Path, default=None,
                        help="also append every row to this file as one JSON line the moment it is measured")
    args = parser.parse_args(argv)
    args.hf_modes = args.hf_modes or args.modes
    if args.jsonl is not None and not args.jsonl.resolve().parent.is_dir():
        parser.error(f"--jsonl {args.jsonl}: no such folder")
    gpu = args.device.startswith("cuda")
    if args.smoke:
        args.batch_sizes, args.gammas, args.prompt_length, args.repeats = [1, 2], [3], 8, 1
        args.noise = [0.0, 0.3] if args.noise is None else args.noise
        args.max_new_tokens = args.max_new_tokens or 8
        args.threads = args.threads or 1
    if args.noise is None:
        args.noise = [0.0, 0.1, 0.3, 1.0]
    args.max_new_tokens = args.max_new_tokens or (128 if gpu else 48)
    args.shape = TINYLLAMA_SHAPE if gpu and not args.smoke else SMOKE_SHAPE if args.smoke else CPU_SHAPE
    try:
        args.trees = [tuple(int(v) for v in tree.split(",")) for tree in args.trees]
    except ValueError:
        parser.error("--trees takes K,N pairs of ints, e.g. --trees 3,12 2,8")
    if any(len(tree) != 2 for tree in args.trees):
        parser.error("--trees takes K,N pairs of ints, e.g. --trees 3,12 2,8")
    args.target_layers = args.target_layers or (22 if gpu and not args.smoke else 4 if args.smoke else 8)
    return args


def pairs(args, device, dtype):
    """Every pair in turn (the synthetic one once per noise level, re-noised in place)."""
    rows = max(args.batch_sizes)
    if args.noise:
        family = AlignedPair(args.shape, args.draft_layers, args.target_layers, device, dtype)
        prompts = random_prompts(args.shape["vocab_size"], rows, args.prompt_length)
        for noise in args.noise:
            family.set_noise(noise)
            yield Pair("synthetic", family.target, family.draft, prompts, noise=noise, info=family.describe())
    if not args.no_default:
        yield default_pair(args.models, rows, args.prompt_length, device, dtype)
    for target, draft in args.pair:
        yield local_pair(target, draft, rows, args.prompt_length, device, dtype)


class Rows(list):
    """The rows of one pair; with --jsonl each row is appended to the file as it is added, so a run killed by
    a time limit keeps every row it finished."""

    def __init__(self, jsonl: Path | None):
        super().__init__()
        self.jsonl = jsonl

    def append(self, row: dict) -> None:
        super().append(row)
        if self.jsonl is not None:
            with open(self.jsonl, "a", encoding="utf-8") as file:
                file.write(json.dumps(clean(row)) + "\n")

    def extend(self, rows) -> None:
        for row in rows:
            self.append(row)

    def __iadd__(self, rows):
        self.extend(rows)
        return self


def clean(row: dict) -> dict:
    """A row as written: no empty fields, no internal ones."""
    return {k: v for k, v in row.items() if v is not None and k != "median_s"}


def measure(row: dict, fn, device, args) -> tuple[dict, object]:
    """Time fn into row (tok_s, first_call_s, second_call_s, status); a failure or timeout is a row, not a
    crash. Graphs kept by earlier rows are freed first: they would make this row's first call a replay
    (same models and shapes, e.g. the synthetic pair re-noised in place) and hold their memory."""
    clear_graph_cache()
    try:
        timing = run.time_calls(fn, device, args.repeats, args.method_timeout)
    except TimeoutError as error:
        return {**row, "status": "timeout", "error": str(error)}, None
    except Exception as error:  # noqa: BLE001  (HF raises many types; every one is a result here)
        return {**row, "status": "failed", "error": f"{type(error).__name__}: {error}"[:300]}, None
    out = timing["out"]
    tokens = out.stats.emitted_tokens if hasattr(out, "stats") else row["batch"] * args.max_new_tokens
    row = {**row, "status": "ok", "tok_s": round(tokens / timing["median_s"], 2),
           "first_call_s": round(timing["first_call_s"], 4), "median_s": timing["median_s"]}
    if timing["second_call_s"] is not None:
        row["second_call_s"] = round(timing["second_call_s"], 4)
    return row, out


def new_tokens(out, prompt_length: int) -> torch.Tensor:
    sequences = out.sequences if hasattr(out, "sequences") else out
    return sequences[:, prompt_length:].cpu()


def run_pair(pair: Pair, args, device, static_tok_s: dict, first_level: bool) -> list[dict]:
    base = {"pair": pair.name, "noise": pair.noise}
    if pair.skip:
        return [{**base, "method": "all", "status": "skipped", "error": pair.skip}]
    graph_modes = [mode == "on" for mode in args.graph_modes or ("off", "on")] if device.type == "cuda" else [False]
    rows, wanted = Rows(args.jsonl), set(args.methods)
    for batch in args.batch_sizes:
        ids = pair.prompts[:batch].to(device)
        at = {**base, "batch": batch}
        plain, draft_plain = {}, {}
        for graphs in graph_modes:  # our plain greedy on the target, then on the draft: c per graph mode
            for model, method, store in ((pair.target, "ours_plain", plain),
                                         (pair.draft, "ours_plain_draft", draft_plain)):
                if method not in wanted:
                    continue
                fn = run.ours_method("ours_plain", model, None, ids, args.max_new_tokens, do_sample=False, gamma=0,
                                     graphs=graphs)
                row, _ = measure({**at, "mode": "greedy", "method": method, "graphs": graphs}, fn, device, args)
                rows.append(row)
                store[graphs] = row.get("median_s")
        for mode in args.modes:
            sampling = mode == "sampling"
            at_mode = {**at, "mode": mode}
            hf_greedy = None
            for method in HF_METHODS:
                if method not in wanted or mode not in args.hf_modes:
                    continue
                if method == "hf_static" and not first_level:
                    continue  # its cost does not depend on the noise values; each compile is long
                for gamma in (args.gammas if method == "hf_assisted" else [None]):
                    row, out = measure({**at_mode, "method": method, "graphs": False, "gamma": gamma},
                                       run.hf_method(method, pair.target, pair.draft, ids, args.max_new_tokens,
                                                     sampling, gamma or 1), device, args)
                    row["compiled"] = method == "hf_static" and device.type == "cuda"
                    rows.append(row)
                    if method == "hf_dynamic" and out is not None and not sampling:
                        hf_greedy = new_tokens(out, ids.shape[1])
                    if method == "hf_static" and row["status"] == "ok":
                        static_tok_s[(pair.name, batch, mode)] = row["tok_s"]
            for gamma in args.gammas if "ours_spec" in wanted else ():
                for graphs in graph_modes:
                    row, out = measure({**at_mode, "method": "ours_spec", "graphs": graphs, "gamma": gamma},
                                       run.ours_method("ours_spec", pair.target, pair.draft, ids, args.max_new_tokens,
                                                       sampling, gamma, graphs), device, args)
                    if out is not None:
                        row.update(spec_fields(out, gamma, row, plain.get(graphs), draft_plain.get(graphs),
                                               static_tok_s.get((pair.name, batch, mode))))
                        if hf_greedy is not None:
                            row["matches_hf_greedy"] = bool(torch.equal(new_tokens(out, ids.shape[1]), hf_greedy))
                    rows.append(row)
                    if "ours_hf_hook" in wanted:
                        rows.append(hook_row(pair, args, device, ids, at_mode, gamma, graphs, row, hf_greedy))
            if "ours_spec_tree" in wanted:
                rows += tree_rows(pair, args, device, ids, at_mode, rows, graph_modes, hf_greedy)
    return rows


def hook_row(pair: Pair, args, device, ids, at_mode: dict, gamma: int, graphs: bool, spec: dict, hf_greedy) -> dict:
    """ours_hf_hook: the ours_spec call made through HF's generate; its overhead over calling us directly."""
    sampling = at_mode["mode"] == "sampling"
    hook = run.ours_method("ours_hf_hook", pair.target, pair.draft, ids, args.max_new_tokens, sampling, gamma, graphs)
    row, out = measure({**at_mode, "method": "ours_hf_hook", "graphs": graphs, "gamma": gamma}, hook, device, args)
    if out is not None:
        row["mean_accepted"] = round(out.stats.mean_accepted_tokens, 3)
        if spec.get("status") == "ok":
            direct = run.ours_method("ours_spec", pair.target, pair.draft, ids, args.max_new_tokens, sampling, gamma,
                                     graphs)
            ratio, low, high = run.paired_ratio(direct, hook, device, max(args.repeats, 3))
            row["hook_overhead"] = round(ratio - 1, 4)
            row["hook_overhead_range"] = f"{low - 1:.4f}..{high - 1:.4f}"
        if hf_greedy is not None:
            row["matches_hf_greedy"] = bool(torch.equal(new_tokens(out, ids.shape[1]), hf_greedy))
    return row


def tree_rows(pair: Pair, args, device, ids, at_mode: dict, done: list[dict], graph_modes, hf_greedy) -> list[dict]:
    """ours_spec_tree rows: each --trees (K, N) that fits depth gamma (N <= K + (gamma - 1) K^2)."""
    rows = []
    for gamma in args.gammas:
        chain = {r["graphs"]: r.get("mean_accepted") for r in done
                 if r.get("method") == "ours_spec" and r.get("gamma") == gamma and r.get("mode") == at_mode["mode"]}
        for k, n in args.trees:
            if n > k + (gamma - 1) * k * k:
                continue
            for graphs in graph_modes:
                row, out = measure({**at_mode, "method": "ours_spec_tree", "graphs": graphs, "gamma": gamma,
                                    "tree": f"{k},{n}"},
                                   run.ours_method("ours_spec", pair.target, pair.draft, ids, args.max_new_tokens,
                                                   at_mode["mode"] == "sampling", gamma, graphs, tree=(k, n)),
                                   device, args)
                if out is not None:
                    stats = out.stats
                    row.update(acceptance_rate=round(stats.acceptance_rate, 4),
                               mean_accepted=round(stats.mean_accepted_tokens, 3))
                    if chain.get(graphs):
                        row["vs_chain"] = round(stats.mean_accepted_tokens / chain[graphs], 3)
                    if hf_greedy is not None:
                        row["matches_hf_greedy"] = bool(torch.equal(new_tokens(out, ids.shape[1]), hf_greedy))
                rows.append(row)
    return rows


def spec_fields(out, gamma: int, row: dict, plain_s, draft_plain_s, static_tok_s) -> dict:
    stats = out.stats
    alpha = run.leviathan_alpha(stats, gamma)
    fields = {"alpha": round(alpha, 4), "acceptance_rate": round(stats.acceptance_rate, 4),
              "mean_accepted": round(stats.mean_accepted_tokens, 3),
              "draft_time_s": round(stats.draft_time_s, 4), "verify_time_s": round(stats.verify_time_s, 4)}
    if plain_s and draft_plain_s:
        c = draft_plain_s / plain_s
        theory = run.leviathan_speedup(alpha, gamma, c)
        measured = plain_s / row["median_s"]  # both generate batch x max_new_tokens tokens
        fields.update(c=round(c, 4), theory_speedup=round(theory, 3), speedup_vs_plain=round(measured, 3),
                      measured_over_theory=round(measured / theory, 3))
    if static_tok_s:
        fields["speedup_vs_hf_static"] = round(row["tok_s"] / static_tok_s, 3)
    return fields


def targets(rows: list[dict], args) -> dict:
    """Issue 9's two targets, read off the batch-1 greedy rows of the acceptance-1 synthetic pair."""
    picked = [r for r in rows if r.get("pair") == "synthetic" and r.get("noise") == 0 and r.get("batch") == 1
              and r.get("mode") == "greedy" and r.get("method") == "ours_spec" and r.get("status") == "ok"]
    best = max(picked, key=lambda r: r["tok_s"], default=None)
    if best is None:
        return {}
    shape = "TinyLlama-1.1B-shaped" if args.shape is TINYLLAMA_SHAPE else "small (not the issue's shape)"
    return {"shape": shape, "graphs": best["graphs"], "gamma": best["gamma"],
            "speedup_vs_hf_static": best.get("speedup_vs_hf_static"), "target_vs_hf_static": 4.0,
            "measured_over_theory": best.get("measured_over_theory"), "target_measured_over_theory": 0.8}


def report(rows: list[dict], args, argv, dtype) -> None:
    """Write (or overwrite) the JSON, markdown and plots: called after every pair, so a run cut off by
    a time limit still leaves what it measured."""
    out = Path(args.out)
    command = "python " + " ".join([Path(sys.argv[0]).as_posix() if argv is None else "bench/e2e.py",
                                    *(sys.argv[1:] if argv is None else argv)])
    goal = targets(rows, args)
    note = (f"{args.max_new_tokens} new tokens per row (EOS off), prompts of {args.prompt_length} tokens, "
            f"median of {args.repeats} calls after a first call timed separately (first_call_s, graph capture "
            "included: kept graphs are freed before every row; second_call_s: the next call, which replays "
            "the graphs the first kept). "
            f"{'bf16' if dtype == torch.bfloat16 else 'fp32'}. hf_static runs at the first noise level only. "
            "c = ours_plain_draft / ours_plain time per token; speedup_vs_plain and theory use Leviathan's alpha "
            "(accepted / examined drafts). Issue 9 targets (H100, TinyLlama-shaped, batch 1, greedy, acceptance 1): "
            f"ours_spec >= 4x hf_static and >= 0.8x theory; this run: {goal or 'n/a'}")
    meta = write_report(rows, out, args.stem, "End-to-end: ours vs HF generate", COLS, command,
                        {"synthetic_shape": {**args.shape, "target_layers": args.target_layers,
                                             "draft_layers": args.draft_layers},
                         "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "targets": goal}, note)
    from _e2e_plots import plot_speedup, plot_tokens
    plot_speedup(rows, out / f"{args.stem}_speedup.png", meta)
    plot_tokens(rows, out / f"{args.stem}_tokens.png", meta)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows, static_tok_s, seen = [], {}, set()
    for pair in pairs(args, device, dtype):
        new = run_pair(pair, args, device, static_tok_s, first_level=pair.name not in seen)
        seen.add(pair.name)
        new = [clean(row) for row in new]
        for row in new:
            print({k: row[k] for k in ("pair", "noise", "batch", "mode", "method", "graphs", "gamma", "status",
                                       "tok_s", "alpha", "speedup_vs_plain") if k in row}, flush=True)
        rows += new
        report(rows, args, argv, dtype)


if __name__ == "__main__":
    main()
