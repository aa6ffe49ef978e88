"""Token trees for strategy "speculative": the draft proposes a small tree instead of a chain.

    python python/generate_speculative_tree.py                               # the embedded default set if shipped,
                                                                             # else a tiny random Llama pair
    python python/generate_speculative_tree.py --models PATH                 # a set in the default-models layout
    python python/generate_speculative_tree.py --target PATH --draft PATH    # local checkpoints sharing a tokenizer

With num_draft_tokens=DEPTH, tree_topk=K and tree_nodes=N, each of the DEPTH draft levels expands the K most
probable children of the K best nodes so far, and the N nodes of highest cumulative draft probability form
each row's tree; the target verifies the whole tree in one forward. A chain dies at its first miss, a tree
keeps the draft's second and third guesses alive, so more tokens come out of each target forward. Both are
lossless: greedy output equals the target's own greedy `generate`, token for token.
"""

import torch

import specdec_kernels
from example_models import pair_or_tiny, parser

args = parser(__doc__).parse_args()

target, draft, input_ids, attention_mask, pad = pair_or_tiny(args, noise=0.05)
common = dict(attention_mask=attention_mask, max_new_tokens=args.max_new_tokens, pad_token_id=pad, eos_token_id=[])

reference = target.generate(input_ids, do_sample=False, **common)
print("target greedy:", reference[:, input_ids.shape[1]:].tolist())
for name, tree in (("chain", dict(tree_topk=1)), ("tree", dict(tree_topk=3, tree_nodes=12))):
    out = specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft,
                                   num_draft_tokens=4, **tree, **common)
    stats = out.stats
    print(f"{name:5} (DEPTH 4, {tree}): {stats.emitted_tokens / stats.target_forwards:.2f} tokens per target "
          f"forward, {stats.target_forwards} target forwards")
    print(f"{name} == target greedy:", torch.equal(out.sequences, reference))
sampled = specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft, num_draft_tokens=4,
                                   tree_topk=3, tree_nodes=12, do_sample=True, temperature=0.8, top_p=0.95, seed=0,
                                   **common)
print("tree sample:", sampled.sequences[:, input_ids.shape[1]:].tolist())
