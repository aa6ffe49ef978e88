"""One tree-verification step of a Llama-family model on a SpecCache.

    python python/hf_tree_verify.py                # a tiny random Llama, saved to a temp dir first
    python python/hf_tree_verify.py --model PATH   # any local Llama / Mistral / Qwen2 checkpoint

Two prompts of different lengths are prefilled into one SpecCache (no padding in the KV). Each row
then verifies a 5-node token tree in ONE forward (ops.tree_attention inside the model's own
attention layers), ops.tree_greedy_verify picks the longest branch the model agrees with, and
cache.compact moves that branch's K/V into place. The draft here is an oracle for one branch (the
model's own greedy tokens, decoded on a scratch cache) and random tokens elsewhere, so the step
accepts two drafts plus a bonus token.
"""

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from specdec_kernels import hf, ops

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", help="local checkpoint directory (default: a tiny random Llama)")
args = parser.parse_args()

path = args.model
if path is None:
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path).eval()
adapter = hf.adapt(model)  # switches the model's attention to ops.tree_attention on SpecCache
vocab = model.config.vocab_size

# Prefill: right-padded prompts; each row keeps its true length.
lengths = torch.tensor([8, 5])
prompts = torch.randint(0, vocab, (2, 8))
cache = adapter.new_cache(batch_size=2, max_length=64)
logits = adapter.prefill(prompts, cache, lengths)
root = logits[torch.arange(2), lengths - 1].argmax(-1)  # the next token: the tree's root

# Oracle draft: the model's next two greedy tokens after the root, decoded on a scratch cache.
scratch = adapter.new_cache(batch_size=2, max_length=64)
adapter.prefill(prompts, scratch, lengths)
greedy, last = [], root
for _ in range(3):
    last = adapter.verify(last[:, None], scratch)[:, 0].argmax(-1)
    scratch.commit()
    greedy.append(last)

# The tree (same shape for both rows):   0 (root)
#                                        /  \
#                                       1    2        1 -> 3 is the oracle branch,
#                                      / \            2 and 4 are random tokens
#                                     3   4
parents = torch.tensor([[-1, 0, 0, 1, 1]] * 2)
random_tokens = torch.randint(0, vocab, (2, 2))
tree = torch.stack([root, greedy[0], random_tokens[:, 0], greedy[1], random_tokens[:, 1]], dim=1)

tree_logits = adapter.verify(tree, cache, parents)  # [2, 5, V], one forward for every node
tokens, num_accepted, accepted_nodes = ops.tree_greedy_verify(tree_logits, tree, parents)
cache.compact(accepted_nodes)  # root + accepted nodes now sit contiguously in every layer

print("accepted drafts per row:", num_accepted.tolist(), " accepted nodes:", accepted_nodes.tolist())
print("emitted tokens:", tokens.tolist())
print("greedy tokens :", torch.stack(greedy, dim=1).tolist())
print("cache lengths :", cache.seq_lens.tolist(), "(prompt + root + accepted drafts)")
