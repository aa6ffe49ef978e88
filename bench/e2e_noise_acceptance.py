"""The acceptance of bench/_e2e_pairs.py's synthetic aligned pair at each noise level, without timing anything:
how the first GPU look picks the noise that gives acceptance ~0.7 (bench/gpu_first_look.sh's e2e stage).

For each noise level: the target's greedy continuation of random prompts, then one forward of the target and
one of the draft over it (teacher-forced). alpha_greedy: the fraction of positions where the draft's argmax is
the target's (the per-token acceptance of greedy verification); alpha_sampling: the mean of sum_x min(p, q) at
temperature 1 (that of rejection sampling). Both are Leviathan's alpha, estimated on the target's own text.
A CPU run of the TinyLlama shape initialises its weights with the CPU's generator, a GPU run with the GPU's:
the levels carry over in distribution, not exactly; the e2e rows report the alpha each run measured.

    python bench/e2e_noise_acceptance.py --noise 0.01 0.02 0.04 0.1        # TinyLlama-shaped, fp32 on the CPU
    python bench/e2e_noise_acceptance.py --shape smoke --noise 0 0.3         # tiny (CI)
Prints one JSON line per noise level.
"""

import argparse
import json
import sys
import time

import torch

from _e2e_pairs import CPU_SHAPE, SMOKE_SHAPE, TINYLLAMA_SHAPE, AlignedPair, random_prompts  # noqa: E402

SHAPES = {"tinyllama": (TINYLLAMA_SHAPE, 22), "cpu": (CPU_SHAPE, 8), "smoke": (SMOKE_SHAPE, 4)}


@torch.no_grad()
def acceptance(pair: AlignedPair, prompts: torch.Tensor, new_tokens: int) -> dict:
    """alpha_greedy and alpha_sampling of the pair as it is now, on the target's greedy continuation."""
    length = prompts.shape[1]
    text = pair.target.generate(prompts, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                eos_token_id=None)
    p = torch.softmax(pair.target(text).logits[:, length - 1:-1].float(), -1)
    q = torch.softmax(pair.draft(text).logits[:, length - 1:-1].float(), -1)
    return {"alpha_greedy": round(float((p.argmax(-1) == q.argmax(-1)).float().mean()), 3),
            "alpha_sampling": round(float(torch.minimum(p, q).sum(-1).mean()), 3), "positions": p.shape[0] * p.shape[1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="tinyllama")
    parser.add_argument("--noise", type=float, nargs="+", required=True)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    for name in ("rows", "prompt_length", "new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(noise < 0 for noise in args.noise):
        parser.error("--noise levels must be >= 0")
    torch.set_num_threads(args.threads)
    shape, target_layers = SHAPES[args.shape]
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    pair = AlignedPair(shape, 2, target_layers, args.device, dtype)
    prompts = random_prompts(shape["vocab_size"], args.rows, args.prompt_length).to(args.device)
    for noise in args.noise:
        started = time.perf_counter()
        pair.set_noise(noise)
        row = {"shape": args.shape, "noise": noise, **acceptance(pair, prompts, args.new_tokens),
               "seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
