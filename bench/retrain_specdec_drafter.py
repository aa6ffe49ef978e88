"""Retrain only the SpecDec drafter of a default-models set (issue 28), from its shipped target.

Same training text as bench/train_default_models.py (the standard library's source minus the
held-out files), the fixed recipe of specdec_kernels.training.train_specdec_drafter (dense blocks,
rotary positions, width-64 heads, cosine schedule, prompts cut to 4..32 tokens), then the drafter
is saved in float16 into <models>/specdec_drafter (or --out) and the held-out diagnosis runs.

    python bench/retrain_specdec_drafter.py --threads 2                       # the shipped drafter
    python bench/retrain_specdec_drafter.py --out /tmp/drafter --steps 100    # a quick look
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stdlib_text import HELD_OUT, stdlib_texts  # noqa: E402

from specdec_kernels.defaults import DEFAULT_MODELS_DIR, load_default_models  # noqa: E402
from specdec_kernels.training import train_specdec_drafter  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=str(DEFAULT_MODELS_DIR))
    parser.add_argument("--out", help="where the drafter goes (default: <models>/specdec_drafter)")
    parser.add_argument("--work", default="/tmp/specdec_drafter_work", help="distillation data and checkpoints")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--prompts", type=int, default=2048)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--glancing", action="store_true")
    parser.add_argument("--checkpoint-every", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", help="continue training this drafter folder (a fresh schedule)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = load_default_models(args.models)
    tokenizer, target = models.tokenizer, models.target
    texts = stdlib_texts(10_000_000, exclude=HELD_OUT)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    init = None
    if args.init:
        from specdec_kernels.models import SpecDecDrafter
        init = SpecDecDrafter.from_pretrained(args.init, dtype=torch.float32)
    started = time.perf_counter()
    drafter = train_specdec_drafter(
        target, ids, block_size=args.block, steps=args.steps, batch_size=args.batch, learning_rate=args.lr,
        warmup_steps=max(args.steps // 20, 1), prompt_length=32, continuation_length=32, min_prompt_length=4,
        max_prompts=args.prompts, glancing=args.glancing, output_dir=args.work,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=100, seed=args.seed, drafter=init,
        drafter_config={"num_layers": 2, "intermediate_size": 384})
    wall = time.perf_counter() - started
    out = Path(args.out) if args.out else Path(args.models) / "specdec_drafter"
    drafter.to(torch.float16).save_pretrained(out)
    print(f"trained in {wall:.0f} s ({args.threads} threads); saved to {out}")


if __name__ == "__main__":
    main()
