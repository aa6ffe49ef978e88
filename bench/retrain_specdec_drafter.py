"""Retrain only the SpecDec drafter of a default-models set (issue 28), from its shipped target.

Same training text and the same drafter recipe as bench/train_default_models.py (the standard
library's source minus the held-out files; train_default_models.drafter_recipe: dense blocks, rotary
positions, width-64 heads, cosine schedule, prompts cut to 4..32 tokens, a fresh distilled prompt for
about every training row), then the drafter is saved in float16 into <models>/specdec_drafter (or --out).

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
from train_default_models import FULL, drafter_recipe  # noqa: E402

from specdec_kernels.defaults import DEFAULT_MODELS_DIR, load_default_models  # noqa: E402
from specdec_kernels.training import train_specdec_drafter  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=str(DEFAULT_MODELS_DIR))
    parser.add_argument("--out", help="where the drafter goes (default: <models>/specdec_drafter)")
    parser.add_argument("--work", default="/tmp/specdec_drafter_work", help="distillation data and checkpoints")
    parser.add_argument("--steps", type=int, default=FULL["drafter_steps"])
    parser.add_argument("--batch", type=int, default=FULL["batch"])
    parser.add_argument("--lr", type=float, default=FULL["drafter_lr"])
    parser.add_argument("--prompts", type=int, default=FULL["drafter_prompts"],
                        help="distillation prompts (each seen about steps*batch/prompts times: too few are learned "
                             "by heart)")
    parser.add_argument("--block", type=int, default=FULL["drafter_block"])
    parser.add_argument("--no-glancing", action="store_true", help="train without GLAT glancing")
    parser.add_argument("--checkpoint-every", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", help="continue training this drafter folder (a fresh schedule)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = load_default_models(args.models)
    tokenizer, target = models.tokenizer, models.target
    texts = stdlib_texts(FULL["text_bytes"], exclude=HELD_OUT)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    init = None
    if args.init:
        from specdec_kernels.models import SpecDecDrafter
        init = SpecDecDrafter.from_pretrained(args.init, dtype=torch.float32)
    started = time.perf_counter()
    recipe = drafter_recipe(dict(FULL, drafter_steps=args.steps, batch=args.batch, drafter_lr=args.lr,
                                 drafter_prompts=args.prompts, drafter_block=args.block))
    recipe.update(glancing=not args.no_glancing, output_dir=args.work, checkpoint_every=args.checkpoint_every,
                  keep_checkpoints=100, seed=args.seed, drafter=init)
    drafter = train_specdec_drafter(target, ids, **recipe)
    wall = time.perf_counter() - started
    out = Path(args.out) if args.out else Path(args.models) / "specdec_drafter"
    drafter.to(torch.float16).save_pretrained(out)
    print(f"trained in {wall:.0f} s ({args.threads} threads); saved to {out}")


if __name__ == "__main__":
    main()
