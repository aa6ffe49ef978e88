"""SpecDec sweep on a trained (target, drafter) pair: the paper's axes (Xia et al., Tables 3 and 4).

For each block size k in {5, 10, 25} a drafter is trained for k (train_specdec_drafter; or loaded
from --drafters DIR/k<k> when that folder exists) and every (top_beta, tau) in {(1, 0), (3, 1),
(5, 3), (5, 5)} decodes the evaluation prompts with strategy "specdec", one request at a time
(batch 1, as the paper times it; --batch to change). Reported per (k, beta, tau):
- tok_per_iter: tokens emitted per target forward (the paper's Tok.), per-position acceptance;
- speedup over plain greedy decoding of the target (HF generate, do_sample=False, same prompts,
  same batch), wall time with a device sync per request;
- identical_to_greedy: share of outputs token-identical to greedy (1.0 by construction for the
  lossless beta=1 or tau=0 rows; the drift of the lossy rows), and the share of generated
  positions that match greedy up to the first difference (a proxy for relative quality);
- draft_ms / verify_ms per iteration (the engine's timers: CUDA events on a GPU).

Text: the Python standard library's source files (every machine has them), tokenized with
--tokenizer, or turned into ids as bytes modulo the vocabulary when the target has none (the
default target is a tiny random Llama, created on the fly).

    python bench/sweep_specdec.py --target PATH --tokenizer PATH --out bench/results   # GPU, real pair
    python bench/sweep_specdec.py --smoke --out /tmp/bench                             # tiny (CI, CPU)

--default-models (or --models PATH, a set in the defaults layout): the embedded default pair and its
shipped drafter (no training), every k in --block-sizes (default 1 3 5 8) with the same drafter, on
two prompt sets, the demo's prompts and held-out text (_stdlib_text.HELD_OUT); greedy is the
engine's plain decoding of the target (EOS ignored everywhere). Adds per row the share of generated
tokens that differ from greedy, and one plot (tokens per target forward over k, per setting):

    python bench/sweep_specdec.py --default-models --out bench/results/specdec_sweep_cpu   # issue 28
"""

import argparse
import sys
import time
from pathlib import Path

import torch

import specdec_kernels
from specdec_kernels.models import SpecDecDrafter
from specdec_kernels.training import train_specdec_drafter

from _report import write_report  # noqa: E402  (bench/ is on sys.path)
from _stdlib_text import stdlib_texts  # noqa: E402

BLOCK_SIZES = (5, 10, 25)
SETTINGS = ((1, 0.0), (3, 1.0), (5, 3.0), (5, 5.0))


def tiny_target(device, **overrides):
    """A random Llama (2 layers, width 64 unless overridden), the same for every call."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    settings = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    initializer_range=0.1, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    config = LlamaConfig(**{**settings, **overrides})
    return LlamaForCausalLM(config).to(device).eval()


def prompts_and_corpus(args, target, tokenizer):
    """(training texts, evaluation prompts [N, P] int64): prompts come from held-out text."""
    texts = stdlib_texts(args.text_bytes)
    if tokenizer is None:
        vocab = target.get_output_embeddings().weight.shape[0]
        texts = [[b % vocab for b in t.encode()] for t in texts]
        held_out = [b % vocab for b in Path(argparse.__file__).read_text().encode()]
    else:
        held_out = tokenizer(Path(argparse.__file__).read_text(), add_special_tokens=False)["input_ids"]
    width = args.prompt_length
    stride = max(len(held_out) // max(args.prompts, 1), width)
    prompts = torch.tensor([held_out[i * stride:i * stride + width] for i in range(args.prompts)], dtype=torch.int64)
    return texts, prompts


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device, fn):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def batches(prompts, size):
    return [prompts[i:i + size] for i in range(0, prompts.shape[0], size)]


def greedy_runs(target, prompts, args, device):
    """HF greedy outputs (new tokens only) and total wall time, after one warm-up call."""
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0)
    target.generate(prompts[:1].to(device), **kwargs)
    outs, total = [], 0.0
    for batch in batches(prompts, args.batch):
        out, seconds = timed(device, lambda: target.generate(batch.to(device), **kwargs))
        outs += [row[batch.shape[1]:].cpu() for row in out]
        total += seconds
    return outs, total


def drafter_for(k, args, target, texts, tokenizer, device):
    path = Path(args.drafters) / f"k{k}" if args.drafters else None
    if path is not None and (path / "config.json").is_file():
        return SpecDecDrafter.from_pretrained(path).to(device).eval(), 0.0
    start = time.perf_counter()
    drafter = train_specdec_drafter(target, texts, tokenizer=tokenizer, block_size=k, steps=args.steps,
                                    batch_size=args.train_batch, prompt_length=args.prompt_length,
                                    continuation_length=args.continuation_length, max_prompts=args.train_prompts,
                                    output_dir=path, learning_rate=args.lr, warmup_steps=max(args.steps // 10, 1),
                                    progress=not args.smoke)
    return drafter, time.perf_counter() - start


def agreement(out, expected) -> float:
    """Share of the greedy positions matched before the first difference."""
    n = min(out.numel(), expected.numel())
    same = (out[:n] == expected[:n]).long().cumprod(0).sum().item()
    return same / max(expected.numel(), 1)


def sweep_row(k, beta, tau, target, drafter, prompts, greedy, greedy_s, args, device):
    options = dict(strategy="specdec", drafter=drafter, block_size=k, top_beta=beta, tau=tau,
                   max_new_tokens=args.max_new_tokens, pad_token_id=0, eos_token_id=[])
    specdec_kernels.generate(target, prompts[:1].to(device), **options)  # warm-up
    totals = dict(steps=0, forwards=0, emitted=0, draft=0.0, verify=0.0)
    accepted_at, drafted_at = [0.0] * k, [0.0] * k
    outs, total = [], 0.0
    for batch in batches(prompts, args.batch):
        out, seconds = timed(device, lambda: specdec_kernels.generate(target, batch.to(device), **options))
        total += seconds
        outs += [row[batch.shape[1]:].cpu() for row in out.sequences]
        stats = out.stats
        totals["steps"] += stats.steps
        totals["forwards"] += stats.target_forwards
        totals["emitted"] += stats.emitted_tokens
        totals["draft"] += stats.draft_time_s
        totals["verify"] += stats.verify_time_s
        rows = batch.shape[0]
        for i, rate in enumerate(stats.per_position_acceptance[:k]):
            drafted_at[i] += rows
            accepted_at[i] += rate * rows
    identical = sum(torch.equal(o, g) for o, g in zip(outs, greedy)) / len(greedy)
    return {"k": k, "beta": beta, "tau": tau, "lossless": beta == 1 or tau == 0,
            "tok_per_iter": round(totals["emitted"] / max(totals["forwards"], 1), 3),
            "acc_pos1": round(accepted_at[0] / max(drafted_at[0], 1), 3),
            "acc_pos_last": round(accepted_at[-1] / max(drafted_at[-1], 1), 3),
            "per_position_acceptance": [round(a / max(d, 1), 4) for a, d in zip(accepted_at, drafted_at)],
            "speedup": round(greedy_s / total, 3), "specdec_s": round(total, 4), "greedy_s": round(greedy_s, 4),
            "identical_to_greedy": round(identical, 3),
            "greedy_prefix_match": round(sum(agreement(o, g) for o, g in zip(outs, greedy)) / len(greedy), 3),
            "draft_ms": round(1e3 * totals["draft"] / max(totals["steps"], 1), 3),
            "verify_ms": round(1e3 * totals["verify"] / max(totals["steps"], 1), 3)}


DEFAULT_SETTINGS = ((1, 0.0), (3, 1.0), (5, 3.0))


def differing_share(outs, expected) -> float:
    """Share of generated positions whose token differs from greedy's at the same position."""
    total = sum(g.numel() for g in expected)
    same = sum(int((o[:g.numel()] == g[:o.numel()]).sum()) for o, g in zip(outs, expected))
    return 1 - same / max(total, 1)


def default_models_sweep(args):
    """The issue-28 sweep on a default-models set: (set, k, beta, tau) rows, one plot."""
    from specdec_kernels.defaults import load_default_models
    from specdec_kernels.demo import PROMPTS

    from _stdlib_text import HELD_OUT, stdlib_files  # noqa: E402

    device = torch.device(args.device)
    models = load_default_models(args.models, device=device, dtype=torch.float32)
    tok, target, drafter = models.tokenizer, models.target, models.specdec_drafter
    held = []
    for text in stdlib_files(HELD_OUT).values():
        held += tok(text, add_special_tokens=False)["input_ids"]
    stride = len(held) // args.prompts
    sets = {"demo": [torch.tensor([tok(p, add_special_tokens=False)["input_ids"]]) for p in PROMPTS],
            "held-out": [torch.tensor([held[i * stride:i * stride + args.prompt_length]]) for i in range(args.prompts)]}
    rows = []
    warm = sets["demo"][0].to(device)  # first calls pay one-time costs (imports, allocator): not in any timing
    specdec_kernels.generate(target, warm, strategy="plain", max_new_tokens=4, eos_token_id=[])
    specdec_kernels.generate(target, warm, strategy="specdec", drafter=drafter, block_size=args.block_sizes[0],
                             max_new_tokens=4, eos_token_id=[])
    for name, prompts in sets.items():
        greedy, greedy_s = [], 0.0
        for ids in prompts:
            out, seconds = timed(device, lambda: specdec_kernels.generate(
                target, ids.to(device), strategy="plain", max_new_tokens=args.max_new_tokens, eos_token_id=[]))
            greedy.append(out.sequences[0, ids.shape[1]:].cpu())
            greedy_s += seconds
        for k in args.block_sizes:
            for beta, tau in DEFAULT_SETTINGS:
                options = dict(strategy="specdec", drafter=drafter, block_size=k, top_beta=beta, tau=tau,
                               max_new_tokens=args.max_new_tokens, eos_token_id=[])
                outs, total, emitted, forwards = [], 0.0, 0, 0
                accepted_at, drafted_at = [0.0] * k, [0] * k
                for ids in prompts:
                    out, seconds = timed(device, lambda: specdec_kernels.generate(target, ids.to(device), **options))
                    total += seconds
                    outs.append(out.sequences[0, ids.shape[1]:].cpu())
                    emitted += out.stats.emitted_tokens
                    forwards += out.stats.target_forwards
                    for i, rate in enumerate(out.stats.per_position_acceptance[:k]):
                        drafted_at[i] += 1
                        accepted_at[i] += rate
                acc = [round(a / max(d, 1), 3) for a, d in zip(accepted_at, drafted_at)]
                row = {"set": name, "k": k, "beta": beta, "tau": tau, "lossless": beta == 1 or tau == 0,
                       "tok_per_forward": round(emitted / max(forwards, 1), 3), "acc_pos1": acc[0],
                       "per_position_acceptance": acc,
                       "identical_to_greedy": round(sum(torch.equal(o, g) for o, g in zip(outs, greedy)) / len(greedy), 3),
                       "differing_tokens": round(differing_share(outs, greedy), 3),
                       "greedy_prefix_match": round(sum(agreement(o, g) for o, g in zip(outs, greedy)) / len(greedy), 3),
                       "speedup_vs_plain": round(greedy_s / total, 3)}
                rows.append(row)
                print({key: row[key] for key in ("set", "k", "beta", "tau", "tok_per_forward", "acc_pos1",
                                                  "identical_to_greedy", "differing_tokens")}, flush=True)
    out = Path(args.out)
    cols = ["set", "k", "beta", "tau", "lossless", "tok_per_forward", "acc_pos1", "per_position_acceptance",
            "identical_to_greedy", "differing_tokens", "speedup_vs_plain"]
    note = (f"default pair ({models.path}), shipped drafter (trained for k={drafter.config.block_size}, used at every k), "
            f"{len(sets['demo'])} demo prompts and {args.prompts} held-out prompts of {args.prompt_length} tokens, "
            f"{args.max_new_tokens} new tokens, batch 1, fp32, EOS ignored. acc_pos1 = first-position acceptance; "
            "differing_tokens = share of generated positions whose token differs from greedy's (0 for lossless rows).")
    write_report(rows, out, "sweep_specdec", "SpecDec sweep on the default pair: block size x (top_beta, tau)", cols,
                 "python bench/sweep_specdec.py " + " ".join(sys.argv[1:] if argv_is_cli() else []),
                 {"models": str(models.path), "threads": torch.get_num_threads()}, note)
    plot(rows, out / "sweep_specdec.png")
    return rows


def argv_is_cli() -> bool:
    return Path(sys.argv[0]).name == "sweep_specdec.py"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sets = sorted({r["set"] for r in rows})
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], sets):
        for beta, tau in DEFAULT_SETTINGS:
            pts = [(r["k"], r["tok_per_forward"], r["differing_tokens"]) for r in rows
                   if r["set"] == name and r["beta"] == beta and r["tau"] == tau]
            label = f"top_beta={beta}, tau={tau:g}" + (" (lossless)" if beta == 1 or tau == 0 else
                                                          f" (differing {max(p[2] for p in pts):.0%} max)")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_title(f"SpecDec on the default pair: {name} prompts")
        ax.set_xlabel("block size k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("tokens per target forward")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-models", action="store_true",
                        help="sweep the embedded default pair with its shipped drafter (see the docstring)")
    parser.add_argument("--models", help="a default-models folder (implies --default-models)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--target", help="HF causal LM folder (default: a tiny random Llama)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the target's, if it has one)")
    parser.add_argument("--drafters", help="folder of trained drafters k<k>/ (trained and saved there if missing)")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=list(BLOCK_SIZES))
    parser.add_argument("--steps", type=int, default=3000, help="training steps per drafter")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--train-prompts", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--text-bytes", type=int, default=2_000_000)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--continuation-length", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=32, help="evaluation prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny everything (CI)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.default_models or args.models:
        if "--block-sizes" not in (sys.argv if argv is None else argv):
            args.block_sizes = [1, 3, 5, 8]
        if "--prompts" not in (sys.argv if argv is None else argv):
            args.prompts = 8
        if "--max-new-tokens" not in (sys.argv if argv is None else argv):
            args.max_new_tokens = 48
        if "--prompt-length" not in (sys.argv if argv is None else argv):
            args.prompt_length = 16
        return default_models_sweep(args)
    if args.smoke:
        args.block_sizes, args.steps, args.train_prompts, args.text_bytes = [3], 10, 32, 20_000
        args.prompt_length, args.continuation_length, args.prompts, args.max_new_tokens = 8, 12, 2, 8
        args.train_batch = 8
    device = torch.device(args.device)
    torch.manual_seed(0)
    tokenizer = None
    if args.target:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        target = AutoModelForCausalLM.from_pretrained(args.target).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.target)
    else:
        target = tiny_target(device)
    texts, prompts = prompts_and_corpus(args, target, tokenizer)
    greedy, greedy_s = greedy_runs(target, prompts, args, device)
    rows = []
    for k in args.block_sizes:
        drafter, train_s = drafter_for(k, args, target, texts, tokenizer, device)
        for beta, tau in SETTINGS:
            row = sweep_row(k, beta, tau, target, drafter, prompts, greedy, greedy_s, args, device)
            row["train_s"] = round(train_s, 1)
            rows.append(row)
            print({key: row[key] for key in ("k", "beta", "tau", "tok_per_iter", "speedup", "identical_to_greedy")})
    cols = ["k", "beta", "tau", "lossless", "tok_per_iter", "acc_pos1", "acc_pos_last", "speedup",
            "identical_to_greedy", "greedy_prefix_match", "draft_ms", "verify_ms"]
    note = (f"target {args.target or 'tiny random Llama'}, {args.prompts} prompts of {args.prompt_length} tokens, "
            f"{args.max_new_tokens} new tokens, batch {args.batch}, drafters trained {args.steps} steps. "
            "Lossy rows (beta>1 and tau>0) differ from greedy by design: identical_to_greedy is their drift.")
    write_report(rows, Path(args.out), "sweep_specdec", "SpecDec sweep: block size x (top_beta, tau)", cols,
                 "python " + " ".join([Path(sys.argv[0]).as_posix() if argv is None else "bench/sweep_specdec.py",
                                       *(sys.argv[1:] if argv is None else argv)]),
                 {"target": args.target or "tiny-random-llama", "batch": args.batch}, note)


if __name__ == "__main__":
    main()
