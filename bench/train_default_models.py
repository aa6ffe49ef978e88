"""Train the embedded default models (specdec_kernels.defaults) on the Python standard library's source.

Parts, in order, each with a progress bar and a fixed seed:
  1. tokenizer: byte-level BPE (`tokenizers`) on the training files;
  2. target: a Llama (head_dim 64, GQA, tied embeddings) trained from scratch, next-token loss;
  3. draft: a 1-layer Llama started from the target's embeddings and first layer, then distilled
     from the target's output distribution (KL), so that it agrees with the target's greedy token often;
  4. SpecDec drafter: specdec_kernels.training.train_specdec_drafter on the trained target;
  5. early-exit "Y" heads at layers d/2 and 3d/4: specdec_kernels.training.train_early_exit_heads.
A few standard-library files are held out (_stdlib_text.HELD_OUT) for the losses and the acceptance rate in MADE.md.

    python bench/train_default_models.py --out specdec_kernels/default_models          # the shipped set
    python bench/train_default_models.py --out /tmp/dm --device cuda --steps-multiplier 5    # a GPU
    python bench/train_default_models.py --out /tmp/dm --quick                         # < 1 min, CI
"""

import argparse
import math
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stdlib_text import HELD_OUT, stdlib_files, stdlib_texts  # noqa: E402

from specdec_kernels.defaults import DefaultModels, save_default_models  # noqa: E402
from specdec_kernels.models import EarlyExitHeads  # noqa: E402
from specdec_kernels.training import train_early_exit_heads, train_specdec_drafter  # noqa: E402
from specdec_kernels.training.distill import IGNORE, greedy_continuations, token_chunks  # noqa: E402
from specdec_kernels.training.tokenizer import train_bpe_tokenizer  # noqa: E402

SAMPLE_PROMPTS = ("def ", "import os\n")

# Sizes: the full set is about 10.5 MB in float16 and trains in about 17 minutes on 2 idle CPU cores
# (hidden 128 = 2 heads of 64, our kernels' fast head_dim, with 1 KV head: GQA). On these cores a step
# of the width-256 model costs ~3-7x more, so for the same wall time the smaller model sees far more text.
FULL = dict(text_bytes=10_000_000, vocab=4096, hidden=128, intermediate=384, layers=6, heads=2, kv_heads=1,
            draft_layers=1, sequence=128, batch=16, target_steps=1200, target_lr=3e-3, draft_steps=600,
            draft_lr=2e-3, drafter_layers=2, drafter_block=5, drafter_steps=1200, drafter_prompts=24576, drafter_lr=2e-3,
            head_steps=400, eval_prompts=16, eval_tokens=32)
QUICK = dict(text_bytes=150_000, vocab=300, hidden=64, intermediate=128, layers=4, heads=1, kv_heads=1,
             draft_layers=1, sequence=32, batch=4, target_steps=8, target_lr=3e-3, draft_steps=4, draft_lr=2e-3,
             drafter_layers=1, drafter_block=3, drafter_steps=4, drafter_prompts=16, drafter_lr=2e-3, head_steps=4,
             eval_prompts=2, eval_tokens=8)


def drafter_recipe(size: dict) -> dict:
    """train_specdec_drafter's settings for the shipped drafter (bench/retrain_specdec_drafter.py
    retrains it alone with the same): dense blocks after prompts cut to 4..32 tokens, 32 greedy tokens
    each, a fresh prompt for about every training row (fewer prompts are learned by heart), cosine
    schedule, GLAT glancing (at 600 steps it lifted held-out first-position accuracy from 0.37 to 0.58)."""
    steps = size["drafter_steps"]
    return dict(block_size=size["drafter_block"], steps=steps, batch_size=size["batch"],
                learning_rate=size["drafter_lr"], warmup_steps=max(steps // 20, 1), prompt_length=32,
                continuation_length=32, min_prompt_length=4, max_prompts=size["drafter_prompts"],
                distill_batch_size=128, glancing=True,
                drafter_config={"num_layers": size["drafter_layers"], "intermediate_size": size["intermediate"]})


def llama(tokenizer, size, layers, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    eos = tokenizer.eos_token_id
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                         num_hidden_layers=layers, num_attention_heads=size["heads"],
                         num_key_value_heads=size["kv_heads"], head_dim=size["hidden"] // size["heads"],
                         max_position_embeddings=2048, tie_word_embeddings=True, initializer_range=0.02,
                         eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    return LlamaForCausalLM(config).to(device)


def learning_rate(step, steps, peak):
    """Linear warm-up over 5% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(steps // 20, 1)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1))))


def train(model, chunks, steps, batch, peak_lr, desc, seed, teacher=None):
    """AdamW on random rows of chunks [M, L]: next-token cross-entropy, or (teacher given) the KL
    from the teacher's next-token distribution. Returns the last step's loss."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(float("nan"))
    bar = tqdm(range(steps), desc=desc)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr)
        rows = chunks[torch.randint(0, chunks.shape[0], (batch,), generator=generator)].to(device)
        logits = model(rows).logits[:, :-1].float()
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                target_logprobs = teacher(rows).logits[:, :-1].float().log_softmax(-1)
            loss = F.kl_div(logits.log_softmax(-1).flatten(0, 1), target_logprobs.flatten(0, 1), log_target=True,
                            reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return loss.item()


@torch.no_grad()
def held_out_loss(model, chunks, batch=16):
    """Mean next-token cross-entropy (nats) over chunks [M, L]."""
    device = next(model.parameters()).device
    total = count = 0.0
    for start in range(0, chunks.shape[0], batch):
        rows = chunks[start:start + batch].to(device)
        logits = model(rows).logits[:, :-1].float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum").item()
        count += rows[:, 1:].numel()
    return total / count


@torch.no_grad()
def greedy_acceptance(target, draft, prompts, new_tokens):
    """Share of the target's greedy tokens (after prompts [N, P]) that the draft's argmax, fed the same
    prefix, predicts too: the per-token acceptance rate of greedy speculative decoding."""
    device = next(target.parameters()).device
    continuation = greedy_continuations(target, prompts, new_tokens).continuations.to(device)
    prompts = prompts.to(device)
    valid = continuation != IGNORE
    sequence = torch.cat([prompts, continuation.masked_fill(~valid, 0)], 1)
    guesses = draft(sequence).logits[:, prompts.shape[1] - 1:-1].argmax(-1)
    return ((guesses == continuation) & valid).sum().item() / max(valid.sum().item(), 1)


@torch.no_grad()
def sample(model, tokenizer, prompt, new_tokens):
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0])


def parameter_count(module):
    return sum(p.numel() for p in module.parameters())


def folder_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def start_from_target(draft, target):
    """Copy the target's embeddings, final norm and first draft_layers layers into the draft."""
    state = target.state_dict()
    draft.load_state_dict({name: state[name] for name in draft.state_dict()})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for the set (load_default_models(path=...) reads it)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and a few steps (a test of the script)")
    parser.add_argument("--steps-multiplier", type=float, default=1.0,
                        help="scale every part's training steps (e.g. 5 on a GPU: more text per part)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    size = dict(QUICK if args.quick else FULL)
    for name in ("target_steps", "draft_steps", "drafter_steps", "head_steps"):
        size[name] = max(1, round(size[name] * args.steps_multiplier))
    device = torch.device(args.device)
    out = Path(args.out)
    wall, started = {}, time.perf_counter()

    def part(name):  # record wall time per part
        now = time.perf_counter()
        wall[name] = now - part.last
        part.last = now
    part.last = started

    texts = stdlib_texts(size["text_bytes"], exclude=HELD_OUT)
    held_out = stdlib_files(HELD_OUT)
    print(f"text: {len(texts)} standard-library files ({sum(map(len, texts)) / 1e6:.2f} MB) for training, "
          f"held out: {', '.join(held_out)}")
    tokenizer = train_bpe_tokenizer(texts, size["vocab"], progress=True)
    train_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    eval_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in held_out.values()]
    chunks = token_chunks(train_ids, None, size["sequence"])
    eval_chunks = token_chunks(eval_ids, None, size["sequence"])
    print(f"tokens: {chunks.numel():,} training, {eval_chunks.numel():,} held out (vocab {len(tokenizer)})")
    part("tokenizer")

    torch.manual_seed(args.seed)
    target = llama(tokenizer, size, size["layers"], device)
    target_loss = train(target, chunks, size["target_steps"], size["batch"], size["target_lr"], "target", args.seed)
    part("target")

    torch.manual_seed(args.seed + 1)
    draft = llama(tokenizer, size, size["draft_layers"], device)
    start_from_target(draft, target)
    draft_loss = train(draft, chunks, size["draft_steps"], size["batch"], size["draft_lr"], "draft (distil)",
                       args.seed + 1, teacher=target)
    part("draft")

    drafter = train_specdec_drafter(target, train_ids, **drafter_recipe(size), seed=args.seed)
    part("specdec_drafter")

    d = size["layers"]
    exit_layers = sorted({d // 2, 3 * d // 4})
    heads = train_early_exit_heads(target, exit_layers, train_ids, steps=size["head_steps"], batch_size=size["batch"],
                                   sequence_length=size["sequence"], seed=args.seed)
    part("early_exit_heads")

    models = DefaultModels(tokenizer=tokenizer, target=target, draft=draft, specdec_drafter=drafter,
                           early_exit_heads=heads, path=out)
    save_default_models(models, out)
    prompts = eval_chunks[:size["eval_prompts"], :32]
    stats = {
        "target held-out loss": held_out_loss(target, eval_chunks), "draft held-out loss": held_out_loss(draft, eval_chunks),
        "draft greedy acceptance": greedy_acceptance(target, draft, prompts, size["eval_tokens"]),
    }
    samples = {prompt: sample(target, tokenizer, prompt, 48) for prompt in SAMPLE_PROMPTS}
    part("evaluation")
    write_made(out, args, size, device, texts, held_out, chunks, eval_chunks, models, exit_layers,
               {"target final train loss": target_loss, "draft final train KL": draft_loss, **stats},
               samples, wall, time.perf_counter() - started)
    print((out / "MADE.md").read_text())
    return out


def write_made(out, args, size, device, texts, held_out, chunks, eval_chunks, models, exit_layers, losses, samples,
               wall, total):
    import transformers
    command = "python bench/train_default_models.py " + " ".join(sys.argv[1:])
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    parts = {name: parameter_count(getattr(models, name))
             for name in ("target", "draft", "specdec_drafter", "early_exit_heads")}
    sizes = {p.name: folder_bytes(p) for p in sorted(out.iterdir()) if p.is_dir()}
    lines = [
        "# The embedded default models: how they were made", "",
        f"- command: `{command}`{f' (commit {commit})' if commit else ''}",
        f"- device: {device_name}; date: {date.today().isoformat()}",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}",
        f"- training text: {len(texts)} top-level *.py files of this Python's standard library, largest first "
        f"({sum(map(len, texts)) / 1e6:.2f} MB, {chunks.numel():,} tokens in {size['sequence']}-token chunks)",
        f"- held out (losses, acceptance): {', '.join(held_out)} ({eval_chunks.numel():,} tokens)",
        f"- sizes: {size}",
        f"- early-exit (\"Y\") heads at layers {exit_layers} of {size['layers']}", "",
        "| part | parameters | on disk (float16) | wall time (s) |", "|---|---|---|---|",
        f"| tokenizer (vocab {len(models.tokenizer)}) | - | {sizes.get('tokenizer', 0) / 1e6:.2f} MB | "
        f"{wall['tokenizer']:.0f} |",
    ]
    lines += [f"| {name} | {count:,} | {sizes.get(name, 0) / 1e6:.2f} MB | {wall[name]:.0f} |"
              for name, count in parts.items()]
    lines += [f"| evaluation | - | - | {wall['evaluation']:.0f} |",
              f"| **total** | {sum(parts.values()):,} | {sum(sizes.values()) / 1e6:.2f} MB | {total:.0f} |", "",
              "| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value:.4f} |" for name, value in losses.items()]
    lines += ["", "(losses in nats per token; acceptance = share of the target's greedy tokens on held-out prompts that "
              "the draft's argmax matches, teacher-forced)", "", "Greedy samples from the target:", ""]
    for prompt, text in samples.items():
        lines += [f"prompt {prompt!r}:", "", "```python", text, "```", ""]
    lines += ["Retrain: `python bench/train_default_models.py --out specdec_kernels/default_models` "
              "(add `--device cuda` on a GPU)."]
    (out / "MADE.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
