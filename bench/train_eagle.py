"""Train an EAGLE-3 head for the embedded default target and save it in the published layout beside the
default models (specdec_kernels/default_models/eagle3/, with MADE.md), on the CPU by default.

    python bench/train_eagle.py --out specdec_kernels/default_models/eagle3

Text: the standard library's source, as the default models were trained on, without their held-out files
(_stdlib_text.HELD_OUT), which measure the head here: greedy acceptance of its first draft, teacher-forced.
`--quick` trains a few steps on little text (a smoke run for tests).
"""

import argparse
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stdlib_text import HELD_OUT, stdlib_files, stdlib_texts  # noqa: E402

from specdec_kernels.defaults import load_default_models  # noqa: E402
from specdec_kernels.training.distill import token_chunks  # noqa: E402
from specdec_kernels.training.eagle3 import (frequent_ids, new_head, target_pass, train_eagle3_head,  # noqa: E402
                                             ttt_loss)

# aux layer ids of the 6-layer default target: the states entering layers 2 and 4 and the last layer's
# output (EAGLE-3's default 2, L // 2, L - 3 would read layer 3 twice in a target this shallow)
AUX_LAYERS = (2, 4, 6)
FULL = dict(text_bytes=10_000_000, draft_vocab=3072, sequence=128, batch=16, steps=1200, lr=2e-3, ttt_steps=3)
QUICK = dict(text_bytes=100_000, draft_vocab=512, sequence=32, batch=4, steps=3, lr=2e-3, ttt_steps=2)


@torch.no_grad()
def first_draft_acceptance(head, target, chunks, batch=16) -> float:
    """Share of positions where the head's first draft (step 0, committed states) is the target's argmax."""
    hits = total = 0
    for start in range(0, chunks.shape[0], batch):
        rows = chunks[start:start + batch]
        states, logprobs = target_pass(target, rows, head.aux_layers)
        length = rows.shape[1] - 1
        positions = torch.arange(length).expand(rows.shape[0], -1)
        out = head(head.combine([s[:, :length] for s in states]), rows[:, 1:], positions,
                   attention_mask=torch.ones(length, length, dtype=torch.bool).tril().view(1, 1, length, length))
        drafts = head.target_ids(head.draft_logits(out).argmax(-1))
        hits += int((drafts == logprobs[:, 1:length + 1].argmax(-1)).sum())
        total += drafts.numel()
    return hits / total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    size = dict(QUICK if args.quick else FULL)
    if args.steps is not None:
        size["steps"] = args.steps
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    models = load_default_models()
    target, tokenizer = models.target, models.tokenizer
    texts = stdlib_texts(size["text_bytes"], exclude=HELD_OUT)
    held_out = stdlib_files(HELD_OUT)
    chunks = token_chunks(texts, tokenizer, size["sequence"])
    eval_chunks = token_chunks(list(held_out.values()), tokenizer, size["sequence"])[:64]
    draft_ids = frequent_ids(chunks, size["draft_vocab"])
    coverage = float(torch.isin(chunks, draft_ids).float().mean())
    head = new_head(target, aux_layers=AUX_LAYERS, draft_ids=draft_ids)
    print(f"training tokens {chunks.numel():,}, held out {eval_chunks.numel():,}; draft vocab {draft_ids.numel()} "
          f"covers {coverage:.4f} of the training tokens; head parameters "
          f"{sum(p.numel() for p in head.parameters()):,}", flush=True)
    before = first_draft_acceptance(head, target, eval_chunks)

    def progress(step, loss):
        if step % 50 == 0 or step == size["steps"] - 1:
            print(f"step {step}/{size['steps']} loss {loss:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)

    loss = train_eagle3_head(head, target, chunks, steps=size["steps"], batch=size["batch"], lr=size["lr"],
                             ttt_steps=size["ttt_steps"], seed=args.seed, progress=progress)
    after = first_draft_acceptance(head, target, eval_chunks)
    with torch.no_grad():
        states, logprobs = target_pass(target, eval_chunks[:16], head.aux_layers)
        held_loss = ttt_loss(head, states, eval_chunks[:16], logprobs, size["ttt_steps"]).item()
    head.save_pretrained(args.out)
    seconds = time.perf_counter() - started
    made = [
        "# The default target's EAGLE-3 head: how it was made", "",
        f"- command: `python bench/train_eagle.py --out {args.out}{' --quick' if args.quick else ''}`",
        f"- device: CPU ({torch.get_num_threads()} threads, {platform.machine()}); date: {date.today()}",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}",
        f"- text: the standard library's source without {', '.join(HELD_OUT)} ({chunks.numel():,} tokens in "
        f"{size['sequence']}-token chunks); held out for the measures below: {eval_chunks.numel():,} tokens of those "
        "files",
        f"- aux layer ids {list(AUX_LAYERS)} (the states entering target layers 2 and 4, and layer 6's output); "
        f"draft vocabulary: the {draft_ids.numel()} most frequent training ids ({coverage:.2%} of the training "
        "tokens), mapped by d2t; the target's embedding shared (not saved)",
        f"- training: {size['steps']} AdamW steps of {size['batch']} chunks, lr {size['lr']}, training-time test "
        f"over {size['ttt_steps']} steps (specdec_kernels/training/eagle3.py), KL to the target's distribution",
        f"- wall time {seconds:.0f} s; head parameters {sum(p.numel() for p in head.parameters()):,}", "",
        "| measure | value |", "|---|---|",
        f"| final training loss (KL, nats) | {loss:.4f} |",
        f"| held-out loss (KL, nats) | {held_loss:.4f} |",
        f"| held-out first-draft greedy acceptance, before training | {before:.4f} |",
        f"| held-out first-draft greedy acceptance, after training | {after:.4f} |", "",
        "(first-draft acceptance: share of held-out positions where the head's draft from the target's committed "
        "states is the target's argmax)", "",
    ]
    (args.out / "MADE.md").write_text("\n".join(made))
    print("\n".join(made))


if __name__ == "__main__":
    main()
