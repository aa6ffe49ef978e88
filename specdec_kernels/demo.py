"""`specdec-kernels demo`: every strategy on one model pair, checked against greedy and timed.

With no arguments it loads the embedded default models (specdec_kernels.defaults) on the GPU if
there is one, else the CPU, decodes a few fixed Python-code prompts with plain greedy and with every
strategy (chains and trees) at lossless settings, prints one sample continuation per strategy and a table of
tokens/s, speed-up over greedy, mean accepted tokens per target forward, acceptance rate and whether
the tokens equal greedy's. `--models PATH` takes another set in the defaults layout; `--target PATH
--draft PATH` takes the user's own local HF causal LMs (sharing a tokenizer).

Its options, the timing (interleaved repeats, medians, a noisy flag) and the CPU threads: docs/demo.md.
"""

import argparse
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch

from .cli_machine import add_machine_arguments, pick_device, set_threads

PROMPTS = (
    "def fibonacci(n):\n    ",
    "import os\n\n\ndef list_files(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
)
GREEDY = "greedy"  # the baseline users know: the target's own HF generate loop
LABELS = {GREEDY: "greedy (HF generate)", "plain": "plain (our engine, no draft)"}
SAMPLE_CHARS = 120
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
NOISY = 0.25  # a method whose tokens/s varies by more than this share of its median between passes is flagged
# why a strategy is skipped without the part of a models set its partner needs (--target/--draft runs)
MISSING = {"draft": "needs a draft model (--draft PATH)",
           "specdec_drafter": "needs a trained SpecDec drafter (--specdec-drafter PATH; see train_specdec_drafter)",
           "eagle3": "needs an EAGLE-3 head for the target (--eagle-head PATH; bench/train_eagle.py makes one)"}


def strategies() -> tuple:
    """The table's strategies that run on any target (the demo's models): all but those drafting with the
    target's own modules (mtp), which the default models lack."""
    from .decoding.strategies import TABLE

    return tuple(s for s in TABLE if s.target is None)


def rows() -> dict:
    """The demo's rows (also the selftest's engine checks): label -> (strategy, options of the row's form),
    every strategy of strategies() in the table's order, a token-tree form right after its chain ("NAME tree")."""
    out = {}
    for strategy in strategies():
        out[strategy.name] = (strategy.name, {})
        if strategy.tree is not None:
            out[f"{strategy.name} tree"] = (strategy.name, strategy.tree)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models (default: the embedded default set)")
    models.add_argument("--models", metavar="PATH", help="a folder in the defaults layout (tokenizer/, target/, draft/, "
                                                         "specdec_drafter/, early_exit_heads/)")
    models.add_argument("--target", metavar="PATH", help="a local HF causal LM (needs --draft)")
    models.add_argument("--draft", metavar="PATH", help="a smaller local HF causal LM sharing the target's tokenizer")
    models.add_argument("--specdec-drafter", metavar="PATH",
                        help="a SpecDecDrafter for --target (without it strategy specdec is skipped)")
    models.add_argument("--eagle-head", metavar="PATH",
                        help="an EAGLE-3 head's folder for --target (without it strategy eagle is skipped)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per row (EOS is ignored; default 32)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="rows per generate call; the prompts are cycled to fill the rows, left-padded (default 1)")
    parser.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable; replaces the built-in ones)")
    add_machine_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed passes per method, interleaved; the table shows the median and the spread "
                             "(default 3)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="model dtype (default float32: the dtype in which lossless means token-identical)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def fail(message: str) -> NoReturn:
    raise SystemExit(f"specdec-kernels demo: {message}")


@dataclass
class Pair:
    """What the demo decodes with: a tokenizer, a target, and each row's options (a row absent: skipped)."""

    tokenizer: object
    target: torch.nn.Module
    options: dict
    skipped: dict = field(default_factory=dict)  # strategy -> why
    source: str = ""

    def __post_init__(self):
        for label, (name, form) in rows().items():  # a tree's row shares its chain's models and depth
            if label != name and name in self.options:
                self.options[label] = dict(self.options[name], **form)


def lossless_options(parts: dict, target) -> tuple[dict, dict]:
    """Each strategy's lossless options with the models of `parts` (defaults.PARTS -> model, or None where
    the run has none), and the strategies skipped for want of one (strategy -> why)."""
    from .decoding.strategies import TABLE

    options, skipped = {}, {}
    for strategy in TABLE:
        if strategy.runs_on is not None and not strategy.runs_on(target):
            skipped[strategy.name] = f"needs {strategy.target}"
            continue
        chosen = dict(strategy.lossless)
        partner = strategy.partner
        if partner is not None:
            model = parts.get(partner.part)
            if model is None and partner.required:
                skipped[strategy.name] = MISSING[partner.part]
                continue
            if model is not None:
                chosen.update(partner.options_for(model, target))
        options[strategy.name] = chosen
    return options, skipped


def load_pair(args, device: torch.device, dtype: torch.dtype, *, draft_required: bool = True,
              fail=fail) -> Pair:
    """The models of `args` (--models, or --target [--draft] [--specdec-drafter], else the embedded
    set) with each strategy's lossless options; without --draft (draft_required=False) the
    strategies that need one are skipped. `fail` reports a bad argument (the calling command's)."""
    from .defaults import DEFAULT_MODELS_DIR, OPTIONAL_PARTS, PARTS, default_models_available, load_default_models

    if args.target or args.draft:
        if args.models:
            fail("pass either --models or --target/--draft, not both")
        if not args.target or (draft_required and not args.draft):
            fail("--target and --draft go together (a model and a smaller one sharing its tokenizer)")
        return _user_pair(args, device, dtype, fail)
    if args.specdec_drafter:
        fail("--specdec-drafter goes with --target/--draft (a --models set has its own drafter)")
    if getattr(args, "eagle_head", None):
        fail("--eagle-head goes with --target/--draft (a --models set has its own eagle3/ head)")
    if args.models and not Path(args.models).is_dir():
        fail(f"--models {args.models}: no such folder")
    root = Path(args.models) if args.models else DEFAULT_MODELS_DIR
    if not args.models and not default_models_available(root):
        fail(f"the embedded default models are not in this install ({root}); pass --models PATH "
             "or --target PATH --draft PATH")
    try:
        models = load_default_models(root, device=device, dtype=dtype)
    except FileNotFoundError as error:  # names the missing parts
        fail(str(error))
    parts = {part: getattr(models, part) for part in PARTS + OPTIONAL_PARTS}
    options, skipped = lossless_options(parts, models.target)
    return Pair(models.tokenizer, models.target, options, skipped, source=str(root))


def _user_pair(args, device, dtype, fail=fail) -> Pair:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def folder(option, path):
        if not Path(path).is_dir():
            fail(f"{option} {path}: no such folder")
        return Path(path)

    def causal_lm(option, path):
        if not (path / "config.json").is_file():
            fail(f"{option} {path}: not an HF model folder (no config.json; save_pretrained writes one)")
        try:
            return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        except (OSError, ValueError, KeyError) as error:  # unknown model type, missing or broken weights
            fail(f"{option} {path}: transformers cannot load it as a causal LM: {first_line(error)}")

    target_path = folder("--target", args.target)
    if not any((target_path / name).is_file() for name in TOKENIZER_FILES):
        fail(f"--target {target_path}: no tokenizer in it (expected one of {', '.join(TOKENIZER_FILES)} beside "
             "the weights: tokenizer.save_pretrained(PATH) writes them)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_path)
    except (OSError, ValueError, ImportError) as error:
        fail(f"--target {target_path}: transformers cannot load its tokenizer: {first_line(error)}")
    target = causal_lm("--target", target_path)
    parts = {}
    if args.draft:
        parts["draft"] = causal_lm("--draft", folder("--draft", args.draft))
    if args.specdec_drafter:
        from .models import SpecDecDrafter

        drafter = SpecDecDrafter.from_pretrained(folder("--specdec-drafter", args.specdec_drafter), dtype=dtype)
        parts["specdec_drafter"] = drafter.to(device).eval()
    if getattr(args, "eagle_head", None):
        from .models import Eagle3Drafter

        try:
            parts["eagle3"] = Eagle3Drafter.from_pretrained(folder("--eagle-head", args.eagle_head), target)
        except (OSError, ValueError) as error:  # not a head's folder, or one made for another target
            fail(f"--eagle-head {args.eagle_head}: {first_line(error)}")
    options, skipped = lossless_options(parts, target)
    source = f"{target_path} + {args.draft}" if args.draft else str(target_path)
    return Pair(tokenizer, target, options, skipped, source=source)


def settings_line() -> str:
    """The lossless settings every row runs with, beside each strategy's defaults (the table's)."""
    def spelled(options: dict) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in options.items()) or "its defaults"

    return "Lossless settings: " + "; ".join(
        f"{s.name} {spelled(s.lossless)}" + (f" (tree: {spelled(s.tree)})" if s.tree else "") for s in strategies())


def first_line(error: BaseException) -> str:
    """An exception's message, first line only: a CLI error stays one line."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def batches(tokenizer, prompts, batch_size: int, device) -> list[dict]:
    """The prompts cycled to whole batches of `batch_size` rows, left-padded like HF users pass them."""
    rows = math.ceil(len(prompts) / batch_size) * batch_size
    texts = [prompts[i % len(prompts)] for i in range(rows)]
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    for start in range(0, rows, batch_size):
        enc = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True)
        out.append({"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)})
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    _sync(device)
    start = time.perf_counter()
    result = fn()
    _sync(device)
    return result, time.perf_counter() - start


def decoders(pair: Pair, max_new_tokens: int, pad: int) -> dict:
    """name -> fn(batch) -> (new tokens [B, max_new_tokens], stats or None)."""
    import specdec_kernels

    common = dict(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=[])

    def greedy(batch):
        out = pair.target.generate(**batch, do_sample=False, **common)
        return out[:, batch["input_ids"].shape[1]:], None

    def strategy(name):
        def run(batch):
            out = specdec_kernels.generate(pair.target, batch["input_ids"], attention_mask=batch["attention_mask"],
                                           strategy=rows()[name][0], **common,
                                           **pair.options[name])
            return out.sequences[:, batch["input_ids"].shape[1]:], out.stats
        return run

    table = {GREEDY: greedy}
    table.update({label: strategy(label) for label in rows() if label in pair.options})
    return table


def run_all(pair: Pair, work: list[dict], max_new_tokens: int, device, repeats: int = 1) -> list[dict]:
    """Per method one warm-up call (first batch; its time is the first-call latency), then `repeats`
    timed passes over all batches, the methods interleaved in each round so that a change of the
    machine's load hits them all; tokens/s and speed-up are the medians over the passes (the speed-up
    of a pass against greedy's pass of the same round), with their spread."""
    from tqdm.auto import tqdm

    pad = pair.tokenizer.pad_token_id
    methods = decoders(pair, max_new_tokens, pad)
    first_call, passes, outputs = {}, {name: [] for name in methods}, {}
    with tqdm(total=len(methods) * (1 + repeats * len(work)), desc="demo", unit="run", file=sys.stderr) as bar, \
            torch.no_grad():
        for name, decode in methods.items():
            bar.set_postfix_str(f"warm-up {name}")
            _, first_call[name] = timed(lambda: decode(work[0]), device)
            bar.update()
        for round_ in range(repeats):
            for name, decode in methods.items():
                bar.set_postfix_str(f"pass {round_ + 1}/{repeats} {name}")
                results, total_s = [], 0.0
                for batch in work:
                    out, seconds = timed(lambda: decode(batch), device)
                    results.append(out)
                    total_s += seconds
                    bar.update()
                passes[name].append(total_s)
                outputs.setdefault(name, []).append(results)
    greedy_tokens = [tok.cpu() for tok, _ in outputs[GREEDY][0]]
    rows = []
    for name in methods:
        tokens = [tok.cpu() for tok, _ in outputs[name][0]]
        stats = [s for _, s in outputs[name][0] if s is not None]  # every pass decodes the same tokens
        identical = all(torch.equal(tok.cpu(), want) for results in outputs[name]
                        for (tok, _), want in zip(results, greedy_tokens))
        count = sum(t.numel() for t in tokens)
        rates = [count / seconds for seconds in passes[name]]
        greedy_count = sum(t.numel() for t in greedy_tokens)
        speedups = [(count / seconds) / (greedy_count / base) for seconds, base in zip(passes[name], passes[GREEDY])]
        row = {"strategy": name, "tokens": count, "time_s": statistics.median(passes[name]),
               "first_call_s": first_call[name], "tokens_per_s": statistics.median(rates),
               "tokens_per_s_passes": rates, "speedup": statistics.median(speedups), "speedup_passes": speedups,
               "spread": spread(rates), "identical_to_greedy": identical,
               "sample": pair.tokenizer.decode(tokens[0][0], skip_special_tokens=True),
               "options": {k: v for k, v in pair.options.get(name, {}).items() if isinstance(v, (int, float, str))}}
        row["noisy"] = row["spread"] > NOISY
        if stats:
            forwards = sum(s.target_forwards for s in stats)
            drafted = sum(s.drafted_tokens for s in stats)
            row["mean_accepted_tokens"] = sum(s.emitted_tokens for s in stats) / max(forwards, 1)
            accepted = sum(s.accepted_tokens for s in stats)
            # "plain" drafts nothing by design: no rate, rather than 0
            row["acceptance_rate"] = accepted / max(drafted, 1) if name != "plain" else None
        else:  # plain greedy: one token per target forward, nothing drafted
            row["mean_accepted_tokens"], row["acceptance_rate"] = 1.0, None
        rows.append(row)
    return rows


def spread(values: list[float]) -> float:
    """(max - min) / median: 0 for a steady measurement (and for a single pass, which shows no spread)."""
    return (max(values) - min(values)) / statistics.median(values)


def format_table(rows: list[dict]) -> str:
    passes = len(rows[0]["tokens_per_s_passes"])
    lines = ["| strategy | tokens/s | speedup vs greedy | mean accepted tokens per target forward | acceptance rate "
             f"| identical to greedy | first call (s) | spread of tokens/s over {passes} passes |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        rate = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}"
        low, high = min(row["speedup_passes"]), max(row["speedup_passes"])
        speedup = f"{row['speedup']:.2f}x" + (f" ({low:.2f}-{high:.2f})" if passes > 1 else "")
        noise = f"{100 * row['spread']:.0f}%" + (" noisy" if row["noisy"] else "")
        lines.append(f"| {LABELS.get(row['strategy'], row['strategy'])} | {row['tokens_per_s']:.1f} | {speedup} "
                     f"| {row['mean_accepted_tokens']:.2f} | {rate} | {'yes' if row['identical_to_greedy'] else 'no'} "
                     f"| {row['first_call_s']:.2f} | {noise} |")
    return "\n".join(lines)


def describe(device: torch.device, threads_chosen_by: str | None = None) -> str:
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)} ({device})"
    threads = torch.get_num_threads()
    how = f", {threads_chosen_by}" if threads_chosen_by else ""
    plural = "s" if threads != 1 else ""
    return f"CPU {platform.processor() or platform.machine()} ({threads} thread{plural}{how}; no GPU found)"


def run(args) -> int:
    if args.max_new_tokens < 1 or args.batch_size < 1:
        fail("--max-new-tokens and --batch-size must be at least 1")
    if args.repeats < 1:
        fail(f"--repeats {args.repeats}: expected at least 1 timed pass")
    device = pick_device(args.device, fail)
    threads = set_threads(args.threads, fail)
    dtype = getattr(torch, args.dtype)
    print(f"device: {describe(device, threads)}, {args.dtype}", flush=True)
    pair = load_pair(args, device, dtype)
    prompts = tuple(args.prompt) if args.prompt else PROMPTS
    work = batches(pair.tokenizer, prompts, args.batch_size, device)
    print(f"models: {pair.source}", flush=True)
    print(f"{len(work)} batch(es) x {args.batch_size} row(s) x {args.max_new_tokens} new tokens per method, "
          f"{args.repeats} timed pass(es)", flush=True)
    for name, why in pair.skipped.items():
        print(f"skipping {name}: {why}")
    rows = run_all(pair, work, args.max_new_tokens, device, args.repeats)

    print(f"\nprompt: {prompts[0]!r}")
    for row in rows:
        text = row["sample"]
        text = text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS] + "..."
        print(f"\n== {LABELS.get(row['strategy'], row['strategy'])}  identical to greedy: {'yes' if row['identical_to_greedy'] else 'no'}")
        print(f"   {text!r}")
    print()
    print(format_table(rows))
    print(f"\n{LABELS[GREEDY]} is the baseline: the target's own `generate(do_sample=False)`; 'plain' is our "
          f"engine with no draft (one target forward per token, the loop the strategies speed up). {settings_line()}. "
          "Times are synchronised; the first call (warm-up, incl. CUDA-graph capture) is not in tokens/s. tokens/s and "
          f"speed-up are medians over {args.repeats} interleaved passes (speed-up: min-max in brackets); spread = "
          "(max - min) / median of tokens/s.")
    noisy = [LABELS.get(row["strategy"], row["strategy"]) for row in rows if row["noisy"]]
    if noisy:
        print(f"\nnoisy: tokens/s of {', '.join(noisy)} varied by more than {NOISY:.0%} between passes: something "
              "else is using this machine, so these speed-ups are not to be trusted (on a CPU: fewer --threads, "
              "more --repeats, or a quiet machine)")
    if args.json:
        meta = {"device": describe(device), "dtype": args.dtype, "models": pair.source, "prompts": list(prompts),
                "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                "threads": torch.get_num_threads() if device.type == "cpu" else None, "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["specdec-kernels", *sys.argv[1:]]),
                "skipped": pair.skipped}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0
