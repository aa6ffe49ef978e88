"""The lossy strategies' quality/speed frontier (issue 41): BiLD over its fallback and rollback thresholds,
SpecDec over top-beta and tau, beside the plain loop and the lossless points, on held-out text.

Text: windows of the standard-library files the embedded default models never trained on
(_stdlib_text.HELD_OUT: shlex.py, fnmatch.py, glob.py, colorsys.py; bench/_heldout_slice.py), each a
--prompt-tokens prompt followed by its true continuation in the file. Every point decodes every prompt at
batch 1 (as both papers time it), greedy, --new-tokens tokens with EOS ignored, in float32.

Points: the plain loop (one target forward per token: the speed-up's baseline) and lossless speculative
chains (--gammas) as references; SpecDec at top_beta=1 (lossless) and every (--betas x --taus); BiLD in
both --modes at every --fallbacks threshold with the exact rule (rollback_rule="exact", the no-loss point)
and the paper's NLL rule at every --rollbacks threshold.

Per point: target forwards per generated token (hardware-independent), tokens/s (median over --repeats
interleaved rounds at --threads threads, with their spread) and the speed-up over the plain loop in the
same rounds (median, min-max); quality as the papers measure it, adapted: ROUGE-L F1 of the output against
the target's own greedy output and against the true continuation (on token ids), and the target's mean
per-token NLL of the output, each also as a paired difference from greedy with a 95% interval. Then the
Pareto frontier of each strategy, the issue's targets, JSON + markdown + a plot in --out.

    python bench/lossy_frontier.py                     # the default models, CPU, 1 thread (~5 minutes)
    python bench/lossy_frontier.py --smoke --out /tmp/lf   # tiny grid (CI)
    python bench/lossy_frontier.py --pair TARGET DRAFT [--specdec-drafter PATH]   # HF folders
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from _frontier_grid import bild_points, reference_points, specdec_points
from _frontier_plot import plot_frontiers
from _frontier_runs import decode_all, greedy_baseline, point_row
from _frontier_summary import frontier_markdown, frontiers, rollback_pressure, targets, targets_markdown
from _heldout_slice import heldout_examples
from _report import write_report
from _stdlib_text import HELD_OUT

COLS = ["point", "lossless", "forwards_per_token", "acceptance_rate", "tokens_per_s", "tokens_per_s_spread", "speedup", "speedup_min",
        "speedup_max", "rouge_l_greedy", "identical_to_greedy", "nll", "nll_minus_greedy", "rouge_l_true",
        "rouge_l_true_minus_greedy", "fallback_rate", "rollback_rate"]
SMOKE = dict(prompts=2, prompt_tokens=16, new_tokens=12, repeats=2, gammas=[4], betas=[3], taus=[1.0],
             fallbacks=[0.2], rollbacks=[2.0])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--stem", default=None, help="file names (default: lossy_frontier_<device>)")
    p.add_argument("--models", help="a default-models folder (default: the embedded set)")
    p.add_argument("--pair", nargs=2, metavar=("TARGET", "DRAFT"), help="HF causal-LM folders (tokenizer in TARGET)")
    p.add_argument("--specdec-drafter", help="a SpecDecDrafter folder for --pair (without it SpecDec is skipped)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds")
    p.add_argument("--gammas", type=int, nargs="+", default=[4, 8], help="lossless speculative chains (references)")
    p.add_argument("--betas", type=int, nargs="+", default=[2, 3, 5])
    p.add_argument("--taus", type=float, nargs="+", default=[0.05, 0.25, 1.0, 3.0])
    p.add_argument("--block-size", type=int, default=None, help="SpecDec drafts per step (default: the drafter's)")
    p.add_argument("--modes", nargs="+", default=["paper", "official"], choices=["paper", "official"])
    p.add_argument("--fallbacks", type=float, nargs="+", default=[0.05, 0.2, 0.5])
    p.add_argument("--rollbacks", type=float, nargs="+", default=[1.0, 1.5, 2.0, 4.0])
    p.add_argument("--max-small-run", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="a tiny grid on 2 short prompts (CI)")
    args = p.parse_args(argv)
    if args.smoke:
        given = set(argv)
        for key, value in SMOKE.items():
            if "--" + key.replace("_", "-") not in given:
                setattr(args, key, value)
    if min(args.prompts, args.prompt_tokens, args.new_tokens, args.repeats, args.threads) < 1:
        p.error("--prompts, --prompt-tokens, --new-tokens, --repeats and --threads must be at least 1")
    if args.specdec_drafter and not args.pair:
        p.error("--specdec-drafter goes with --pair (a --models set has its own drafter)")
    return args


def load_models(args, device) -> tuple[dict, str, str]:
    """(models {target, draft, drafter, tokenizer}, where they came from, what the held-out slice is to them)."""
    if args.pair:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from specdec_kernels.models import SpecDecDrafter

        def causal_lm(path):
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        drafter = None
        if args.specdec_drafter:
            drafter = SpecDecDrafter.from_pretrained(args.specdec_drafter).to(device).eval()
        models = {"target": causal_lm(args.pair[0]), "draft": causal_lm(args.pair[1]), "drafter": drafter,
                  "tokenizer": AutoTokenizer.from_pretrained(args.pair[0])}
        return models, f"{args.pair[0]} + {args.pair[1]}", "held out for the default models only: unknown for this pair"
    from specdec_kernels.defaults import load_default_models
    loaded = load_default_models(args.models, device=device, dtype=torch.float32)
    models = {"target": loaded.target, "draft": loaded.draft, "drafter": loaded.specdec_drafter,
              "tokenizer": loaded.tokenizer}
    return models, str(loaded.path), ("never trained on by any part of the set (bench/train_default_models.py and "
                                      "bench/retrain_specdec_drafter.py exclude these files)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.perf_counter()
    load_at_start = os.getloadavg()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    models, source, held_out = load_models(args, device)
    tokenizer = models["tokenizer"]
    pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    examples = heldout_examples(tokenizer, args.prompts, args.prompt_tokens, args.new_tokens)

    points, skipped = reference_points(args.gammas), {}
    if models["drafter"] is not None:
        block = args.block_size or models["drafter"].config.block_size
        points += specdec_points(args.betas, args.taus, block)
    else:
        skipped["specdec"] = "no SpecDec drafter (--specdec-drafter PATH)"
    points += bild_points(args.modes, args.fallbacks, args.rollbacks, args.max_small_run)
    print(f"{len(points)} points x {len(examples)} prompts x {args.repeats} rounds", file=sys.stderr, flush=True)

    runs = decode_all(points, [e.prompt for e in examples], models, args.new_tokens, args.repeats, device, pad,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    base = greedy_baseline(runs["plain"], examples, models["target"])
    rows = [point_row(p, runs[p.name], base, runs["plain"], examples, models["target"]) for p in points]
    fronts, found = frontiers(rows), targets(rows)
    wall = time.perf_counter() - started

    stem = args.stem or f"lossy_frontier_{device.type}"
    command = "python bench/lossy_frontier.py" + ("" if not argv else " " + " ".join(argv))
    extra = {"models": source, "threads": args.threads, "prompts": len(examples), "prompt_tokens": args.prompt_tokens,
             "new_tokens": args.new_tokens, "repeats": args.repeats, "batch": 1, "dtype": "float32",
             "held_out": {"files": list(HELD_OUT), "status": held_out, "windows": [e.source for e in examples]},
             "greedy_nll": round(sum(base["nll"]) / len(base["nll"]), 4), "true_continuation_nll": round(base["true_nll"], 4),
             "greedy_rouge_l_true": round(sum(base["rouge_true"]) / len(base["rouge_true"]), 4),
             "rollback_pressure": rollback_pressure(base["token_nlls"], args.rollbacks),
             "frontiers": fronts, "targets": found, "skipped": skipped, "wall_s": round(wall, 1),
             "cpu_count": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load_at_start],
             "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    note = "\n".join([
        f"{extra['threads']} thread(s), batch 1, float32, greedy, EOS ignored; {len(examples)} prompts of "
        f"{args.prompt_tokens} tokens from held-out text ({', '.join(HELD_OUT)}: {held_out}), {args.new_tokens} new "
        f"tokens each; {args.repeats} interleaved rounds; models: {source}. Wall time {wall:.0f} s; load average "
        f"{extra['loadavg_start'][0]} at the start, {extra['loadavg_end'][0]} at the end, on {os.cpu_count()} cores.",
        "",
        f"The target's greedy output: mean NLL {extra['greedy_nll']} nats/token, ROUGE-L {extra['greedy_rouge_l_true']} "
        f"against the true continuation, whose own NLL under the target is {extra['true_continuation_nll']}. Share of "
        f"the greedy tokens whose -log p exceeds each rollback threshold (paper mode rolls back there even when the "
        f"small model agreed): {extra['rollback_pressure']}.",
        "", *targets_markdown(found), "", *frontier_markdown(rows, fronts), "", "## Every point", ""])
    meta = write_report(rows, args.out, stem, "Lossy strategies: quality/speed frontier (BiLD, SpecDec)", COLS,
                        command, extra, note)
    plot_frontiers(rows, fronts, args.out / f"{stem}.png", meta)
    print(f"wrote {args.out / stem}.json, .md, .png in {wall:.0f} s", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
