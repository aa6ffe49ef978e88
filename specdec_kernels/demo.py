"""`specdec-kernels demo`: every strategy on one model pair, checked against greedy and timed.

With no arguments it loads the embedded default models (specdec_kernels.defaults) on the GPU if
there is one, else the CPU, decodes a few fixed Python-code prompts with plain greedy and with the
four strategies at lossless settings, prints one sample continuation per strategy and a table of
tokens/s, speed-up over greedy, mean accepted tokens per target forward, acceptance rate and whether
the tokens equal greedy's. `--models PATH` takes another set in the defaults layout; `--target PATH
--draft PATH` takes the user's own local HF causal LMs (sharing a tokenizer).
"""

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch

PROMPTS = (
    "def fibonacci(n):\n    ",
    "import os\n\n\ndef list_files(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
)
STRATEGIES = ("plain", "speculative", "specdec", "bild", "ppd")
TREE = "speculative tree"  # speculative's draft proposing a token tree (tree_topk, tree_nodes) instead of a chain
TREE_OPTIONS = dict(tree_topk=3, tree_nodes=12)
GREEDY = "greedy"  # the baseline users know: the target's own HF generate loop
LABELS = {GREEDY: "greedy (HF generate)", "plain": "plain (our engine, no draft)"}
SAMPLE_CHARS = 120


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models (default: the embedded default set)")
    models.add_argument("--models", metavar="PATH", help="a folder in the defaults layout (tokenizer/, target/, draft/, "
                                                         "specdec_drafter/, early_exit_heads/)")
    models.add_argument("--target", metavar="PATH", help="a local HF causal LM (needs --draft)")
    models.add_argument("--draft", metavar="PATH", help="a smaller local HF causal LM sharing the target's tokenizer")
    models.add_argument("--specdec-drafter", metavar="PATH",
                        help="a SpecDecDrafter for --target (without it strategy specdec is skipped)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per row (EOS is ignored; default 32)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="rows per generate call; the prompts are cycled to fill the rows, left-padded (default 1)")
    parser.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable; replaces the built-in ones)")
    parser.add_argument("--device", help="cuda, cuda:1, cpu, ... (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="model dtype (default float32: the dtype in which lossless means token-identical)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def fail(message: str) -> NoReturn:
    raise SystemExit(f"specdec-kernels demo: {message}")


@dataclass
class Pair:
    """What the demo decodes with: a tokenizer, a target, and each strategy's options (None = skipped)."""

    tokenizer: object
    target: torch.nn.Module
    options: dict
    skipped: dict = field(default_factory=dict)  # strategy -> why
    source: str = ""

    def __post_init__(self):
        if "speculative" in self.options:  # the chain's row and the tree's row share the draft and depth
            self.options[TREE] = dict(self.options["speculative"], **TREE_OPTIONS)


def load_pair(args, device: torch.device, dtype: torch.dtype, *, draft_required: bool = True,
              fail=fail) -> Pair:
    """The models of `args` (--models, or --target [--draft] [--specdec-drafter], else the embedded
    set) with each strategy's lossless options; without --draft (draft_required=False) the
    strategies that need one are skipped. `fail` reports a bad argument (the calling command's)."""
    from .defaults import DEFAULT_MODELS_DIR, default_models_available, load_default_models

    if args.target or args.draft:
        if args.models:
            fail("pass either --models or --target/--draft, not both")
        if not args.target or (draft_required and not args.draft):
            fail("--target and --draft go together (a model and a smaller one sharing its tokenizer)")
        return _user_pair(args, device, dtype, fail)
    if args.specdec_drafter:
        fail("--specdec-drafter goes with --target/--draft (a --models set has its own drafter)")
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
    pick = models.strategy_options()
    depth = models.target.config.num_hidden_layers
    layers = [layer for layer in models.early_exit_heads.layers if 1 <= layer < depth]
    exit_layer = min(layers, key=lambda layer: abs(layer - depth // 2)) if layers else None
    ppd = dict(k=3, exit_layer=exit_layer, head=models.early_exit_heads) if layers else dict(k=3, head="N")
    options = {"plain": {}, "speculative": dict(pick["speculative"], num_draft_tokens=4),
               "specdec": dict(pick["specdec"], top_beta=1, tau=0.0),
               "bild": dict(pick["bild"], rollback_rule="exact"),
               "ppd": ppd}
    return Pair(models.tokenizer, models.target, options, source=str(root))


def _user_pair(args, device, dtype, fail=fail) -> Pair:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def folder(option, path):
        if not Path(path).is_dir():
            fail(f"{option} {path}: no such folder")
        return Path(path)

    def causal_lm(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()

    target_path = folder("--target", args.target)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = causal_lm(target_path)
    options, skipped = {"plain": {}, "ppd": dict(k=3, head="N")}, {}
    if args.draft:
        draft = causal_lm(folder("--draft", args.draft))
        options.update(speculative=dict(draft_model=draft, num_draft_tokens=4),
                       bild=dict(draft_model=draft, rollback_rule="exact"))
    else:
        skipped.update(dict.fromkeys(("speculative", "bild"), "needs a draft model (--draft PATH)"))
    if args.specdec_drafter:
        from .models import SpecDecDrafter

        drafter = SpecDecDrafter.from_pretrained(folder("--specdec-drafter", args.specdec_drafter), dtype=dtype)
        options["specdec"] = dict(drafter=drafter.to(device).eval(), top_beta=1, tau=0.0)
    else:
        skipped["specdec"] = "needs a trained SpecDec drafter (--specdec-drafter PATH; see train_specdec_drafter)"
    source = f"{target_path} + {args.draft}" if args.draft else str(target_path)
    return Pair(tokenizer, target, options, skipped, source=source)


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
                                           strategy="speculative" if name == TREE else name, **common,
                                           **pair.options[name])
            return out.sequences[:, batch["input_ids"].shape[1]:], out.stats
        return run

    table = {GREEDY: greedy}
    order = [n for name in STRATEGIES for n in ((name, TREE) if name == "speculative" else (name,))]  # tree after chain
    table.update({name: strategy(name) for name in order if name in pair.options})
    return table


def run_all(pair: Pair, work: list[dict], max_new_tokens: int, device) -> list[dict]:
    """Per method: one warm-up call (first batch; its time is the first-call latency), then the timed pass."""
    from tqdm.auto import tqdm

    pad = pair.tokenizer.pad_token_id
    methods = decoders(pair, max_new_tokens, pad)
    rows, greedy_tokens = [], None
    with tqdm(total=len(methods) * (1 + len(work)), desc="demo", unit="run", file=sys.stderr) as bar:
        for name, decode in methods.items():
            bar.set_postfix_str(name.split()[0])
            with torch.no_grad():
                _, first_call_s = timed(lambda: decode(work[0]), device)
                bar.update()
                outputs, total_s = [], 0.0
                for batch in work:
                    out, seconds = timed(lambda: decode(batch), device)
                    outputs.append(out)
                    total_s += seconds
                    bar.update()
            tokens = [tok.cpu() for tok, _ in outputs]
            if greedy_tokens is None:
                greedy_tokens = tokens
            stats = [s for _, s in outputs if s is not None]
            count = sum(t.numel() for t in tokens)
            row = {"strategy": name, "tokens": count, "time_s": total_s, "first_call_s": first_call_s,
                   "tokens_per_s": count / total_s,
                   "identical_to_greedy": all(torch.equal(a, b) for a, b in zip(tokens, greedy_tokens)),
                   "sample": pair.tokenizer.decode(tokens[0][0], skip_special_tokens=True),
                   "options": {k: v for k, v in pair.options.get(name, {}).items() if isinstance(v, (int, float, str))}}
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
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


def format_table(rows: list[dict]) -> str:
    lines = ["| strategy | tokens/s | speedup vs greedy | mean accepted tokens per target forward | acceptance rate "
             "| identical to greedy | first call (s) |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        rate = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}"
        lines.append(f"| {LABELS.get(row['strategy'], row['strategy'])} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x "
                     f"| {row['mean_accepted_tokens']:.2f} | {rate} | {'yes' if row['identical_to_greedy'] else 'no'} "
                     f"| {row['first_call_s']:.2f} |")
    return "\n".join(lines)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)} ({device})"
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads; no GPU found)"


def run(args) -> int:
    if args.max_new_tokens < 1 or args.batch_size < 1:
        fail("--max-new-tokens and --batch-size must be at least 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {args.device}: CUDA is not available here")
    dtype = getattr(torch, args.dtype)
    print(f"device: {describe(device)}, {args.dtype}", flush=True)
    pair = load_pair(args, device, dtype)
    prompts = tuple(args.prompt) if args.prompt else PROMPTS
    work = batches(pair.tokenizer, prompts, args.batch_size, device)
    print(f"models: {pair.source}", flush=True)
    print(f"{len(work)} batch(es) x {args.batch_size} row(s) x {args.max_new_tokens} new tokens per method", flush=True)
    for name, why in pair.skipped.items():
        print(f"skipping {name}: {why}")
    rows = run_all(pair, work, args.max_new_tokens, device)

    print(f"\nprompt: {prompts[0]!r}")
    for row in rows:
        text = row["sample"]
        text = text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS] + "..."
        print(f"\n== {LABELS.get(row['strategy'], row['strategy'])}  identical to greedy: {'yes' if row['identical_to_greedy'] else 'no'}")
        print(f"   {text!r}")
    print()
    print(format_table(rows))
    print(f"\n{LABELS[GREEDY]} is the baseline: the target's own `generate(do_sample=False)`; 'plain' is our "
          "engine with no draft (one target forward per token, the loop the strategies speed up). Lossless "
          "settings: speculative g=4 (tree: K=3, N=12), specdec top_beta=1, bild rollback_rule='exact', ppd k=3. "
          "Times are synchronised; the first call (warm-up, incl. CUDA-graph capture) is not in tokens/s.")
    if args.json:
        meta = {"device": describe(device), "dtype": args.dtype, "models": pair.source, "prompts": list(prompts),
                "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["specdec-kernels", *sys.argv[1:]]),
                "skipped": pair.skipped}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0
