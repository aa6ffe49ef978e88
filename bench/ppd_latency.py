"""PPD on one device: a Table-2-shaped match-rate table (heads "N" and trained "Y") and measured
latency of strategy "ppd" vs plain greedy, next to the theory at the measured match rate.

For the target (default: a tiny random 8-layer Llama created on the fly; --target PATH for a real
one) this script
- trains "Y" heads for layers d/4, d/2, 3d/4 (train_early_exit_heads, --train-steps) on the Python
  standard library's source (token ids: --tokenizer, else bytes modulo the vocabulary);
- prints match_rate(...) for k in {1, 3, 5} along the greedy trajectory of held-out prompts;
- times greedy (HF generate, do_sample=False) and "ppd" (d̄ = d/2, k in {1, 3, 5}, heads N and Y),
  batch 1, --new-tokens tokens per prompt, median of --repeats runs after a warm-up, and prints each measured
  speed-up next to theory(...)["single_gpu_speedup"] (this package's one-device tree form) and
  theory(...)["speedup"] (the paper's k+1-device form) at the measured p̂.

    python bench/ppd_latency.py                      # tiny random Llama (CPU or GPU)
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
from specdec_kernels.training import train_early_exit_heads  # noqa: E402
from sweep_specdec import stdlib_texts, tiny_target  # noqa: E402


def token_ids(texts, tokenizer, vocab):
    if tokenizer is not None:
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [[b % vocab for b in t.encode()] for t in texts]


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target"), parser.add_argument("--tokenizer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.target:
        from transformers import AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained(args.target).to(device).eval()
    else:
        target = tiny_target(device, hidden_size=128, intermediate_size=256, num_hidden_layers=8)
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = target.get_output_embeddings().weight.shape[0]
    stream = [t for ids in token_ids(stdlib_texts(400_000), tokenizer, vocab) for t in ids]
    held_out, train = stream[:args.prompts * 32], stream[args.prompts * 32:]
    prompts = [held_out[i * 32:(i + 1) * 32] for i in range(args.prompts)]
    d = target.config.num_hidden_layers
    layers = sorted({max(d // 4, 1), d // 2, 3 * d // 4})
    heads = train_early_exit_heads(target, layers, [train], steps=args.train_steps, batch_size=8,
                                   sequence_length=64, learning_rate=1e-3)
    rows = match_rate(target, prompts, layers, (1, 3, 5), heads, new_tokens=args.new_tokens)
    print(f"\nmatch rates ({len(prompts)} prompts x {args.new_tokens} greedy tokens, d = {d}):\n")
    print(format_match_table(rows))

    print(f"\nlatency, batch 1, {args.new_tokens} new tokens, median of {args.repeats} runs per prompt set "
          "after a warm-up "
          f"({device}, {torch.get_num_threads()} threads):\n")
    print("| method | k | head | p̂ (ppd steps) | time (s) | speed-up | theory 1-device | theory k+1 devices |")
    print("|---|---|---|---|---|---|---|---|")

    def greedy_all():
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.new_tokens,
                            min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    base, _ = timed(greedy_all, device, args.repeats)
    print(f"| greedy (HF generate) | - | - | - | {base:.3f} | 1.00 | - | - |")
    for head in ("N", "Y"):
        for k in (1, 3, 5):
            def ppd_all():
                hits = steps = 0
                for ids in prompts:
                    x = torch.tensor([ids], device=device)
                    out = specdec_kernels.generate(target, x, strategy="ppd", k=k, head=None if head == "N" else heads,
                                                   max_new_tokens=args.new_tokens, eos_token_id=[], pad_token_id=0)
                    steps += out.stats.steps
                    hits += out.stats.accepted_tokens
                return hits / steps
            seconds, rate = timed(ppd_all, device, args.repeats)
            t = theory(d, d // 2, k, rate)
            print(f"| ppd (d̄ = {d // 2}) | {k} | {head} | {100 * rate:.1f}% | {seconds:.3f} | {base / seconds:.2f} | "
                  f"{t['single_gpu_speedup']:.2f} | {t['speedup']:.2f} |")


if __name__ == "__main__":
    main()
