"""specdec_kernels.ops as the backend of a hand-written speculative decoding loop: plain torch, no transformers.

    python python/ops_decode_loop.py [--models PATH] [--max-new-tokens 32] [--draft-tokens 4]

A Llama forward written out below reads the default set's target and draft weights with safetensors;
each model's KV cache is plain tensors [B, Hkv, S_max, D] per layer, and the rows share one length
vector seq_lens [B] (both models have seen the same tokens). ops.tree_attention (a chain: parents=None)
attends over cache + new tokens, ops.greedy_verify accepts drafts, ops.kv_rollback is the rollback.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer

from specdec_kernels import ops
from specdec_kernels.defaults import DEFAULT_MODELS_DIR


class Llama:
    def __init__(self, folder: Path):
        self.c = json.loads((folder / "config.json").read_text())
        self.w = {k: v.float() for k, v in load_file(folder / "model.safetensors").items()}
        self.heads, self.kv_heads = self.c["num_attention_heads"], self.c["num_key_value_heads"]
        self.dim = self.c.get("head_dim") or self.c["hidden_size"] // self.heads
        theta = self.c.get("rope_parameters", {}).get("rope_theta") or self.c.get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.dim, 2).float() / self.dim)
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

    def new_cache(self, batch, length):
        shape = (batch, self.kv_heads, length, self.dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(self.c["num_hidden_layers"])]

    def norm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * self.w[name]

    def __call__(self, tokens, cache, seq_lens):
        """tokens [B, N] at positions seq_lens[b] + i -> logits [B, N, V]; writes their K/V to the cache."""
        (B, N), w = tokens.shape, self.w
        pos = seq_lens[:, None] + torch.arange(N)                             # [B, N]
        angles = torch.cat([pos[..., None] * self.inv_freq] * 2, -1)[:, :, None]  # [B, N, 1, D]

        def rope(x):
            half = x.shape[-1] // 2
            return x * angles.cos() + torch.cat([-x[..., half:], x[..., :half]], -1) * angles.sin()

        x = w["model.embed_tokens.weight"][tokens]
        for i, (k_cache, v_cache) in enumerate(cache):
            p = f"model.layers.{i}."
            h = self.norm(x, p + "input_layernorm.weight")
            q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(B, N, self.heads, self.dim))
            k_cache[torch.arange(B)[:, None], :, pos] = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(B, N, -1, self.dim))
            v_cache[torch.arange(B)[:, None], :, pos] = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, N, -1, self.dim)
            out, _ = ops.tree_attention(q, k_cache, v_cache, seq_lens)        # prefix + causal chain of N
            x = x + out.reshape(B, N, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, p + "post_attention_layernorm.weight")
            x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        return self.norm(x, "model.norm.weight") @ self.lm_head.T


def prefill(models, prompts, length):
    """Right-padded prompts from position 0; returns caches, seq_lens = true lengths, each row's next token."""
    lens = torch.tensor([len(p) for p in prompts])
    tokens = torch.tensor([p + [0] * (int(lens.max()) - len(p)) for p in prompts])
    caches = [m.new_cache(len(prompts), length) for m in models]
    logits = [m(tokens, c, torch.zeros_like(lens)) for m, c in zip(models, caches)][0]  # the target's; pads' K/V
    # sit past each row's length and are overwritten before anything attends to them
    return caches, lens, logits[torch.arange(len(prompts)), lens - 1].argmax(-1)


def greedy(target, prompts, new):
    (cache,), seq_lens, root = prefill([target], prompts, max(map(len, prompts)) + new)
    out = [root]
    for _ in range(new - 1):
        root = target(root[:, None], cache, seq_lens)[:, -1].argmax(-1)
        seq_lens, out = seq_lens + 1, out + [root]
    return torch.stack(out, 1)


def speculative(target, draft, prompts, new, g):
    room = max(map(len, prompts)) + (new + 1) * (g + 1)  # rows that are done keep decoding until all are
    (t_cache, d_cache), seq_lens, root = prefill([target, draft], prompts, room)
    out, steps = [[int(r)] for r in root], 0
    while min(map(len, out)) < new:
        chain = [root]
        for i in range(g + 1):  # g drafts; the last forward only writes d_g's K/V so both caches stay equal
            logits = draft(chain[-1][:, None], d_cache, seq_lens + i)
            chain.append(logits[:, -1].argmax(-1))
        drafts = torch.stack(chain[1:g + 1], 1)                                # [B, g]
        logits = target(torch.stack(chain[:g + 1], 1), t_cache, seq_lens)     # root + drafts: [B, g+1, V]
        tokens, num_accepted = ops.greedy_verify(logits, drafts)
        for b, row in enumerate(tokens.tolist()):
            out[b] += row[:int(num_accepted[b]) + 1]
        root = tokens[torch.arange(len(prompts)), num_accepted]               # the correction / bonus token
        seq_lens, steps = ops.kv_rollback(seq_lens, num_accepted), steps + 1  # keep root + accepted drafts
    return torch.tensor([row[:new] for row in out]), steps


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--models", type=Path, default=DEFAULT_MODELS_DIR, help="default-models folder (default: embedded)")
parser.add_argument("--max-new-tokens", type=int, default=32)
parser.add_argument("--draft-tokens", type=int, default=4)
args = parser.parse_args()
tokenizer = Tokenizer.from_file(str(args.models / "tokenizer" / "tokenizer.json"))
target, draft = Llama(args.models / "target"), Llama(args.models / "draft")
prompts = [tokenizer.encode(text).ids for text in ("def fibonacci(n):\n    ", "import os\n\n\ndef walk(path):\n")]
with torch.no_grad():
    fast, steps = speculative(target, draft, prompts, args.max_new_tokens, args.draft_tokens)
    reference = greedy(target, prompts, args.max_new_tokens)
for row in fast.tolist():
    print("tokens:", row, "\n  text:", repr(tokenizer.decode(row)))
print(f"{steps} verify forwards for {args.max_new_tokens} tokens per row (greedy: {args.max_new_tokens - 1} after the prefill)")
print("speculative == greedy loop:", torch.equal(fast, reference))
