"""Speculative decoding inside HF's own `model.generate`: `custom_generate=specdec_kernels.custom_generate`.

    python python/hf_custom_generate.py                               # the embedded default set if shipped,
                                                                      # else a tiny random Llama pair
    python python/hf_custom_generate.py --models PATH                 # a set in the default-models layout
    python python/hf_custom_generate.py --target PATH --draft PATH    # local checkpoints sharing a tokenizer

HF prepares everything as usual (generation config, processors, stopping criteria); the draft is HF's own
`assistant_model=`, and every option of `specdec_kernels.generate` is a keyword. Two left-padded prompts
are decoded greedily by the target's own `generate` and through the hook, with strategies speculative and
bild (batched: HF's assisted generation takes one row); the outputs must agree token for token. Then a
seeded sampling run with block verification, min_p and min_new_tokens, and the statistics in HF's
output class.
"""

import torch

from example_models import pair_or_tiny, parser
from specdec_kernels import custom_generate

args = parser(__doc__).parse_args()

target, draft, input_ids, attention_mask, pad = pair_or_tiny(args, noise=0.02)
common = dict(attention_mask=attention_mask, max_new_tokens=args.max_new_tokens, pad_token_id=pad, eos_token_id=[])

reference = target.generate(input_ids, do_sample=False, **common)
speculative = target.generate(input_ids, custom_generate=custom_generate, assistant_model=draft, num_draft_tokens=4,
                              do_sample=False, **common)
bild = target.generate(input_ids, custom_generate=custom_generate, assistant_model=draft, strategy="bild",
                       rollback_rule="exact", do_sample=False, **common)
sampled = target.generate(input_ids, custom_generate=custom_generate, assistant_model=draft, do_sample=True,
                          temperature=0.8, min_p=0.05, min_new_tokens=2, verification="block", seed=0,
                          return_dict_in_generate=True, **common)

width = input_ids.shape[1]
print("target greedy        :", reference[:, width:].tolist())
print("hook, speculative    :", speculative[:, width:].tolist())
print("hook, bild (exact)   :", bild[:, width:].tolist())
print("hook, block sampling :", sampled.sequences[:, width:].tolist())
stats = sampled.stats
print(f"sampling stats       : {stats.steps} steps, {stats.mean_accepted_tokens:.2f} tokens per target forward")
print("speculative == target greedy:", torch.equal(speculative, reference))
print("bild == target greedy:", torch.equal(bild, reference))
