"""Why does SpecDec's drafter barely draft? (issue 28) Evidence on a (target, draft, drafter) set.

Measures, on held-out text (bench/_stdlib_text.HELD_OUT) and on the demo's prompts, against the
target's own greedy continuation (the labels the strategy is judged by):
1. teacher-forced accuracy per block position: for every prefix (prompt + greedy[:p]) the drafter
   gets exactly what the strategy feeds it (the prefix, then k masks) and drafts greedy[p:p+k];
   split by prompt length (the training recipe's prompts were always 32 tokens long);
2. the 1-layer AR draft's teacher-forced next-token accuracy on the same prefixes (its position 1);
3. the drafter's logits from a training-style forward (whole prefix, no cache) against the
   strategy's cached steps after a sequence of partial accepts (max |difference|);
4. the expected tokens per target forward at top_beta=1 from (1): 1 + E[leading correct drafts].

    python bench/diagnose_specdec.py                          # the shipped default set
    python bench/diagnose_specdec.py --models PATH --json out.json
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stdlib_text import HELD_OUT, stdlib_files  # noqa: E402

from specdec_kernels.defaults import load_default_models  # noqa: E402
from specdec_kernels.demo import PROMPTS  # noqa: E402
from specdec_kernels.training.distill import greedy_continuations  # noqa: E402


def held_out_prompts(tokenizer, count, length):
    ids = []
    for text in stdlib_files(HELD_OUT).values():
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
    stride = max(len(ids) // count, length)
    return torch.tensor([ids[i * stride:i * stride + length] for i in range(count)], dtype=torch.int64)


@torch.no_grad()
def per_position(drafter, draft, target, prompts, new_tokens, k):
    """prompts: list of 1-D id tensors. Returns (drafter accuracy per block position [k], AR draft
    next-token accuracy, expected tokens per forward at top_beta=1, number of prefixes)."""
    correct, count = torch.zeros(k), torch.zeros(k)
    ar_correct = ar_count = 0
    leading = []
    for prompt in prompts:
        cont = greedy_continuations(target, prompt.unsqueeze(0), new_tokens).continuations[0]
        cont = cont[cont >= 0]
        seq = torch.cat([prompt, cont])
        ar = draft(seq.unsqueeze(0)).logits[0].argmax(-1)  # ar[i] guesses seq[i + 1]
        p0 = prompt.numel()
        prefixes = [seq[:p0 + p] for p in range(cont.numel())]
        width = max(x.numel() for x in prefixes)
        ids = torch.zeros(len(prefixes), width, dtype=torch.int64)
        for row, x in enumerate(prefixes):
            ids[row, :x.numel()] = x
        lengths = torch.tensor([x.numel() for x in prefixes])
        guesses = drafter(ids, lengths, block_size=k).logits.argmax(-1)
        for p in range(cont.numel()):
            labels = cont[p:p + k]
            hit = guesses[p, :labels.numel()] == labels
            correct[:labels.numel()] += hit.float()
            count[:labels.numel()] += 1
            leading.append(int(hit.long().cumprod(0).sum()))
            ar_correct += int(ar[p0 + p - 1] == cont[p])
            ar_count += 1
    return ((correct / count.clamp(min=1)).tolist(), ar_correct / max(ar_count, 1),
            1 + sum(leading) / max(len(leading), 1), len(leading))


@torch.no_grad()
def cached_vs_full(drafter, prompt, cont, k, accepts=(0, 2, 1, 4, 0, 3)):
    """Feed the prompt, then the strategy's pending tokens after partial accepts of n drafts (n + 1
    committed tokens per step); compare every step's block logits with a full recompute."""
    cache = drafter.new_cache(1, prompt.numel() + cont.numel() + 2 * k + 2)
    worst = 0.0
    feed, committed = prompt, prompt
    pos = 0
    for n in accepts:
        _, cached = drafter.draft(feed.unsqueeze(0), torch.tensor([feed.numel()]), cache, k)
        full = drafter(committed.unsqueeze(0), block_size=k).logits
        worst = max(worst, (cached - full).abs().max().item())
        feed = cont[pos:pos + n + 1]
        pos += n + 1
        committed = torch.cat([committed, feed])
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="a default-models folder (default: the shipped one)")
    parser.add_argument("--drafter", help="a SpecDecDrafter folder to diagnose instead of the set's")
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--held-out", type=int, default=12, help="held-out prompts")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = load_default_models(args.models)
    tok, target, draft, drafter = models.tokenizer, models.target, models.draft, models.specdec_drafter
    if args.drafter:
        from specdec_kernels.models import SpecDecDrafter
        drafter = SpecDecDrafter.from_pretrained(args.drafter, dtype=torch.float32).eval()
    k = args.block
    results = {}
    sets = {"demo prompts": [torch.tensor(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]}
    for length in (8, 32):
        sets[f"held-out, {length}-token prompts"] = list(held_out_prompts(tok, args.held_out, length))
    for name, prompts in sets.items():
        acc, ar, tpf, n = per_position(drafter, draft, target, prompts, args.new_tokens, k)
        results[name] = {"drafter_per_position": [round(a, 3) for a in acc], "ar_draft_next_token": round(ar, 3),
                         "expected_tokens_per_forward_beta1": round(tpf, 3), "prefixes": n}
        print(f"{name}: drafter per position {[round(a, 3) for a in acc]}, AR draft {ar:.3f}, "
              f"expected tokens/forward (beta=1) {tpf:.2f} over {n} prefixes")
    prompt = sets["demo prompts"][0]
    cont = greedy_continuations(target, prompt.unsqueeze(0), 24).continuations[0]
    worst = cached_vs_full(drafter, prompt, cont[cont >= 0], k)
    results["cached_vs_full_max_abs_logit_diff"] = worst
    print(f"cached strategy steps vs training-style forward: max |logit difference| {worst:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
