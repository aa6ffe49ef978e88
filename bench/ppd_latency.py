"""PPD on one device: a Table-2-shaped match-rate table (heads "N" and trained "Y") and measured
latency of strategy "ppd" vs plain greedy, next to the theory at the measured match rate.

By default it runs on the embedded default models (specdec_kernels.defaults: the target, its
tokenizer and its shipped "Y" heads at d/2 and 3d/4), with prompts cut from the standard-library
files those models never saw (_stdlib_text.HELD_OUT). --target PATH [--tokenizer PATH] runs it on
a user's model instead, training "Y" heads for layers d/4, d/2, 3d/4 first (train_early_exit_heads,
--train-steps) on the standard library's source. The script then
- prints match_rate(...) for k in {1, 3, 5} along the greedy trajectory of the prompts;
- times greedy (HF generate, do_sample=False) and "ppd" (d̄ = d/2, k in {1, 3, 5}, heads N and Y),
  batch 1, --new-tokens tokens per prompt, median of --repeats runs after a warm-up, and prints each measured
  speed-up next to theory(...)["single_gpu_speedup"] (this package's one-device tree form) and
  theory(...)["speedup"] (the paper's k+1-device form) at the measured p̂;
- writes both tables to --out (default bench/results) as ppd_latency_<cpu|cuda>.{json,md} (bench/_report.py).

    python bench/ppd_latency.py                      # embedded default models (CPU or GPU)
    python bench/ppd_latency.py --target PATH --tokenizer PATH --device cuda
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import specdec_kernels  # noqa: E402
from specdec_kernels.decoding.ppd import format_match_table, match_rate, theory  # noqa: E402
from specdec_kernels.defaults import load_default_models  # noqa: E402
from specdec_kernels.training import train_early_exit_heads  # noqa: E402

from _report import write_report  # noqa: E402  (bench/ is on sys.path)
from _stdlib_text import HELD_OUT, stdlib_files, stdlib_texts  # noqa: E402


def token_stream(texts, tokenizer) -> list[int]:
    """The texts' token ids, concatenated."""
    return [t for text in texts for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats):
    """Median wall time of `repeats` calls after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def load(args, device):
    """(target, tokenizer, "Y" heads or None, what it is): the user's model or the embedded defaults."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if args.target:
        target = AutoModelForCausalLM.from_pretrained(args.target).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.target)
        return target, tokenizer, None, args.target
    models = load_default_models(args.models, device=device, dtype=torch.float32)
    return models.target, models.tokenizer, models.early_exit_heads, f"default models ({args.models or 'embedded'})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="a local HF causal LM (default: the embedded default models)")
    parser.add_argument("--tokenizer", help="its tokenizer (default: --target)")
    parser.add_argument("--models", help="a default-models folder (default: the embedded one)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--train-steps", type=int, default=300, help="\"Y\" head training for --target")
    parser.add_argument("--prompts", type=int, default=8, help="prompts timed")
    parser.add_argument("--match-prompts", type=int, default=16, help="prompts for the match-rate table")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    target, tokenizer, heads, name = load(args, device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    held_out = token_stream(stdlib_files(HELD_OUT).values(), tokenizer)
    length = args.prompt_tokens
    chunks = [held_out[i * length:(i + 1) * length] for i in range(max(args.prompts, args.match_prompts))]
    prompts = chunks[:args.prompts]
    d = target.config.num_hidden_layers
    layers = sorted({max(d // 4, 1), d // 2, 3 * d // 4})
    if heads is None:
        train = token_stream(stdlib_texts(400_000, exclude=HELD_OUT), tokenizer)
        heads = train_early_exit_heads(target, layers, [train], steps=args.train_steps, batch_size=8,
                                       sequence_length=64, learning_rate=1e-3)
    rows = match_rate(target, chunks[:args.match_prompts], layers, (1, 3, 5), heads, new_tokens=args.new_tokens)
    match_table = format_match_table(rows)
    print(f"\n{name}: match rates ({args.match_prompts} prompts x {args.new_tokens} greedy tokens, d = {d}):\n")
    print(match_table)

    print(f"\nlatency, batch 1, {args.new_tokens} new tokens, median of {args.repeats} runs per prompt set "
          "after a warm-up "
          f"({device}, {torch.get_num_threads()} threads):\n")
    print("| method | k | head | p̂ (ppd steps) | time (s) | speed-up | theory 1-device | theory k+1 devices |")
    print("|---|---|---|---|---|---|---|---|")

    def greedy_all():
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.new_tokens,
                            min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=pad)

    base, _ = timed(greedy_all, device, args.repeats)
    results = [{"method": "greedy (HF generate)", "k": "-", "head": "-", "p_hat": "-", "seconds": round(base, 4),
                "speedup": 1.0, "theory_1_device": "-", "theory_k1_devices": "-"}]
    print(f"| greedy (HF generate) | - | - | - | {base:.3f} | 1.00 | - | - |")
    for head in ("N", "Y"):
        for k in (1, 3, 5):
            def ppd_all():
                hits = steps = 0
                for ids in prompts:
                    x = torch.tensor([ids], device=device)
                    out = specdec_kernels.generate(target, x, strategy="ppd", k=k, head=None if head == "N" else heads,
                                                   max_new_tokens=args.new_tokens, eos_token_id=[], pad_token_id=pad)
                    steps += out.stats.steps
                    hits += out.stats.accepted_tokens
                return hits / steps
            seconds, rate = timed(ppd_all, device, args.repeats)
            t = theory(d, d // 2, k, rate)
            results.append({"method": f"ppd (d̄ = {d // 2})", "k": k, "head": head, "p_hat": f"{100 * rate:.1f}%",
                            "seconds": round(seconds, 4), "speedup": round(base / seconds, 3),
                            "theory_1_device": round(t["single_gpu_speedup"], 3),
                            "theory_k1_devices": round(t["speedup"], 3)})
            print(f"| ppd (d̄ = {d // 2}) | {k} | {head} | {100 * rate:.1f}% | {seconds:.3f} | {base / seconds:.2f} | "
                  f"{t['single_gpu_speedup']:.2f} | {t['speedup']:.2f} |")
    command = "python bench/ppd_latency.py " + " ".join(sys.argv[1:])
    note = (f"{name}, d = {d}, batch 1, {len(prompts)} held-out prompts of {length} tokens, {args.new_tokens} new "
            f"tokens, median of {args.repeats} runs, {torch.get_num_threads()} threads.\n\n"
            f"Match rates (p̂ that the final top-1 is in the early head's top-k, along the greedy trajectory of "
            f"{args.match_prompts} prompts):\n\n"
            f"{match_table}\n\nLatency vs theory:")
    write_report(results, Path(args.out), f"ppd_latency_{device.type}", "PPD latency vs theory", list(results[0]),
                 command, {"model": name, "match_rates": rows}, note)
    print(f"\nwrote {args.out}/ppd_latency_{device.type}.json and .md")


if __name__ == "__main__":
    main()
