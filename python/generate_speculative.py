"""Speculative decoding and BiLD on HF models with `specdec_kernels.generate`.

    python python/generate_speculative.py                               # the embedded default set if shipped,
                                                                        # else a tiny random Llama pair
    python python/generate_speculative.py --models PATH                 # a set in the default-models layout
    python python/generate_speculative.py --target PATH --draft PATH    # local checkpoints sharing a tokenizer

Two left-padded prompts of different lengths are decoded greedily three ways: the target's own
`generate`, strategy "speculative" (the draft proposes 4 tokens, the target verifies them in one
forward) and strategy "bild" with the exact-match rollback rule; all three must agree token for
token. Then one seeded sampling run. Statistics come with every output.
"""

import torch

import specdec_kernels
from example_models import pair_or_tiny, parser

args = parser(__doc__).parse_args()

target, draft, input_ids, attention_mask, pad = pair_or_tiny(args, noise=0.02)
common = dict(attention_mask=attention_mask, max_new_tokens=args.max_new_tokens, pad_token_id=pad, eos_token_id=[])

reference = target.generate(input_ids, do_sample=False, **common)
speculative = specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft,
                                       num_draft_tokens=4, **common)
bild = specdec_kernels.generate(target, input_ids, strategy="bild", draft_model=draft, rollback_rule="exact",
                                fallback_threshold=0.1, **common)
sampled = specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft, do_sample=True,
                                   temperature=0.8, top_p=0.95, seed=0, **common)

print("target greedy      :", reference[:, input_ids.shape[1]:].tolist())
print("speculative greedy :", speculative.sequences[:, input_ids.shape[1]:].tolist())
print("bild (exact rule)  :", bild.sequences[:, input_ids.shape[1]:].tolist())
print("speculative sample :", sampled.sequences[:, input_ids.shape[1]:].tolist())
stats = speculative.stats
print(f"speculative stats  : {stats.steps} steps, {stats.mean_accepted_tokens:.2f} tokens per target forward, "
      f"acceptance rate {stats.acceptance_rate:.2f}")
print(f"bild stats         : fallback rate {bild.stats.extra['fallback_rate']:.2f}, "
      f"rollback rate {bild.stats.extra['rollback_rate']:.2f}")
print("speculative == target greedy:", torch.equal(speculative.sequences, reference))
print("bild == target greedy:", torch.equal(bild.sequences, reference))
