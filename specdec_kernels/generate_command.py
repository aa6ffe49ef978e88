"""`specdec-kernels generate`: decode your prompts with one strategy and print the text and its statistics.

Its options (models, `--option NAME=VALUE`, `--check`, sampling): docs/demo.md, "specdec-kernels generate".
"""

import argparse
import ast
import json
import sys
import time
from pathlib import Path
from typing import NoReturn

import torch

from .cli_machine import add_machine_arguments, pick_device, set_threads
from .cli_progress import Progress
from .decoding.strategies import accepted_options, names
from .demo import batches, describe, load_pair, timed

SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "seed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models (default: the embedded default set)")
    models.add_argument("--models", metavar="PATH", help="a folder in the defaults layout")
    models.add_argument("--target", metavar="PATH", help="a local HF causal LM")
    models.add_argument("--draft", metavar="PATH", help="a smaller local HF causal LM sharing the target's tokenizer")
    models.add_argument("--specdec-drafter", metavar="PATH", help="a SpecDecDrafter trained for --target")
    models.add_argument("--eagle-head", metavar="PATH", help="an EAGLE-3 head's folder for --target")
    parser.add_argument("--strategy", choices=names(), default="speculative")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a keyword of the strategy (repeatable), VALUE a Python literal")
    parser.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable; default: stdin)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    sampling = parser.add_argument_group("sampling (default: greedy; these need --do-sample)")
    sampling.add_argument("--do-sample", action="store_true")
    sampling.add_argument("--temperature", type=float, default=None, help="default 1.0")
    sampling.add_argument("--top-k", type=int, default=None)
    sampling.add_argument("--top-p", type=float, default=None)
    sampling.add_argument("--seed", type=int, default=None, help="reproducible sampling (per-row Philox streams)")
    parser.add_argument("--check", action="store_true", help="compare with the target's greedy generate()")
    add_machine_arguments(parser)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--json", metavar="FILE", help="also write prompts, completions and statistics as JSON")


def fail(message: str) -> NoReturn:
    raise SystemExit(f"specdec-kernels generate: {message}")


def parse_options(items: list[str], strategy: str) -> dict:
    """["num_draft_tokens=6", "mode=official"] -> {"num_draft_tokens": 6, "mode": "official"}; a NAME
    that `strategy` does not take is refused with the ones it does."""
    accepted = accepted_options(strategy)
    options = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            fail(f"--option {item!r}: expected NAME=VALUE, e.g. num_draft_tokens=6")
        if name not in accepted:
            fail(f"--option {item}: strategy {strategy} has no option {name!r}; its options: {', '.join(accepted)}")
        try:
            options[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[name] = text  # a bare word: a string
    return options


def library_message(error: Exception) -> str:
    """The library's message without its own "generate: " prefix (the CLI prints its own)."""
    return str(error).removeprefix("generate: ")


def readable(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{key.replace('_', ' ')} {readable(item)}" for key, item in value.items())
    return str(value)


def format_report(report: dict) -> str:
    """The statistics as a few labelled lines (the JSON keeps every raw number)."""
    options = " ".join(f"{key}={value}" for key, value in report["options"].items())
    lines = [f"strategy {report['strategy']}" + (f" ({options})" if options else "")
             + f": {report['tokens']} new tokens in {report['seconds']:.2f} s"
             + (f" ({report['tokens_per_s']} tokens/s)" if report["tokens_per_s"] is not None else ""),
             f"  target forwards {report['target_forwards']}, mean accepted tokens per target forward "
             f"{report['mean_accepted_tokens']}"
             + (f", acceptance rate {report['acceptance_rate']}" if report["acceptance_rate"] is not None else "")]
    shown = {"strategy", "options", "tokens", "seconds", "tokens_per_s", "target_forwards", "mean_accepted_tokens",
             "acceptance_rate", "identical_to_target_generate"}
    extra = {key: value for key, value in report.items() if key not in shown
             and not (key.startswith("cuda_graphs") and not value)}  # no graphs (CPU): nothing to say
    scalars = {key: value for key, value in extra.items() if not isinstance(value, dict)}
    if scalars:
        lines.append("  " + ", ".join(f"{key.replace('_', ' ')} {readable(value)}" for key, value in scalars.items()))
    for key, value in extra.items():
        if isinstance(value, dict):
            lines.append(f"  {report['strategy']} {key.replace('_', ' ')}: {readable(value)}")
    if "identical_to_target_generate" in report:
        lines.append("  identical to the target's greedy generate: "
                     + ("yes" if report["identical_to_target_generate"] else "NO"))
    return "\n".join(lines)


def drop_unused_sampling_flags(args) -> None:
    """Sampling flags without --do-sample change nothing (greedy decoding): say so in one line and drop them,
    as `generate` warns (and HF's GenerationConfig) for the same settings."""
    if args.do_sample:
        return
    given = [name for name in SAMPLING_FLAGS if getattr(args, name) is not None]
    if given:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        print(f"specdec-kernels generate: warning: {flags} {'applies' if len(given) == 1 else 'apply'} to "
              "sampling and greedy decoding ignores it: add --do-sample", file=sys.stderr)
        for name in given:
            setattr(args, name, None)


def run(args) -> int:
    if args.max_new_tokens < 1:
        fail("--max-new-tokens must be at least 1")
    if args.check and args.do_sample:
        fail("--check compares with greedy decoding; drop --do-sample")
    drop_unused_sampling_flags(args)
    device = pick_device(args.device, fail)
    threads = set_threads(args.threads, fail)
    prompts = args.prompt or ([sys.stdin.read()] if not sys.stdin.isatty() else [])
    if not prompts or not all(p.strip() for p in prompts):
        fail("give a non-empty --prompt TEXT (repeatable) or pipe the prompt into standard input")
    pair = load_pair(args, device, getattr(torch, args.dtype), draft_required=False, fail=fail)
    if args.strategy in pair.skipped:
        fail(f"strategy {args.strategy} {pair.skipped[args.strategy]}")
    options = {**pair.options[args.strategy], **parse_options(args.option, args.strategy)}
    batch = batches(pair.tokenizer, list(prompts), len(prompts), device)[0]
    pad = pair.tokenizer.pad_token_id
    temperature = 1.0 if args.temperature is None else args.temperature

    import specdec_kernels

    print(f"device: {describe(device, threads)}, {args.dtype}; models: {pair.source}", file=sys.stderr)
    label = f"decoding {len(prompts)} prompt(s) x {args.max_new_tokens} new tokens with {args.strategy}"
    try:
        with Progress(label):
            out, seconds = timed(lambda: specdec_kernels.generate(
                pair.target, batch["input_ids"], attention_mask=batch["attention_mask"], strategy=args.strategy,
                max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, temperature=temperature,
                top_k=args.top_k, top_p=args.top_p, seed=args.seed, pad_token_id=pad, **options), device)
    except (TypeError, ValueError) as error:  # a bad option value, a prompt too long: the library's message
        fail(library_message(error))
    width = batch["input_ids"].shape[1]
    new = out.sequences[:, width:]
    completions = [pair.tokenizer.decode(row[row != pad] if pad is not None else row, skip_special_tokens=True)
                   for row in new]
    stats = out.stats
    plain = (int, float, str, bool, type(None))  # models and heads are named by their class
    report = {"strategy": args.strategy,
              "options": {k: v if isinstance(v, plain) else type(v).__name__ for k, v in options.items()},
              "tokens": stats.emitted_tokens, "seconds": round(seconds, 4),
              "tokens_per_s": round(stats.emitted_tokens / seconds, 1) if seconds > 0 else None,
              "mean_accepted_tokens": round(stats.mean_accepted_tokens, 3),
              "acceptance_rate": round(stats.acceptance_rate, 3) if stats.drafted_tokens else None,
              "target_forwards": stats.target_forwards, **stats.extra}
    if args.check:
        with Progress("running the target's own greedy generate for --check"):
            reference = pair.target.generate(**batch, max_new_tokens=args.max_new_tokens, do_sample=False,
                                             pad_token_id=pad)
        report["identical_to_target_generate"] = (reference.shape == out.sequences.shape
                                                  and bool(torch.equal(reference, out.sequences)))
    for prompt, completion in zip(prompts, completions):
        print(prompt + completion)
        print("-" * 40)
    print(format_report(report))
    if args.json:
        meta = {"device": describe(device), "dtype": args.dtype, "models": pair.source, "torch": torch.__version__,
                "threads": torch.get_num_threads() if device.type == "cpu" else None,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["specdec-kernels", *sys.argv[1:]])}
        Path(args.json).write_text(json.dumps({"meta": meta, "prompts": list(prompts), "completions": completions,
                                               "stats": report}, indent=2))
    return 0 if report.get("identical_to_target_generate", True) else 1
