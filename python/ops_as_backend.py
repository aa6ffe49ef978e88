"""Using specdec_kernels.ops as the verification backend of your own decoding loop.

A toy "target" and "draft" (fixed random bigram tables) stand in for real models, so this
runs anywhere in a second: one speculative step with greedy and with sampled drafts.

    python python/ops_as_backend.py
"""

import torch

from specdec_kernels import ops

VOCAB, GAMMA, BATCH = 50, 4, 3
torch.manual_seed(0)
target_table = torch.randn(VOCAB, VOCAB)  # logits of the next token given the current one
draft_table = target_table + 0.5 * torch.randn(VOCAB, VOCAB)


def draft_step(last: torch.Tensor, sample: bool):
    tokens, probs = [], []
    for _ in range(GAMMA):
        p = torch.softmax(draft_table[last], -1)
        last = torch.multinomial(p, 1).squeeze(1) if sample else p.argmax(-1)
        tokens.append(last)
        probs.append(p)
    return torch.stack(tokens, 1), torch.stack(probs, 1)


def target_scores(last: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """[B, g+1, V] target logits at every draft position plus the bonus position (one pass)."""
    context = torch.cat([last.unsqueeze(1), drafts], 1)
    return target_table[context]


last = torch.randint(0, VOCAB, (BATCH,))
drafts, _ = draft_step(last, sample=False)
tokens, accepted = ops.greedy_verify(target_scores(last, drafts), drafts)
print("greedy   accepted", accepted.tolist(), "emitted", tokens.tolist())

drafts, draft_probs = draft_step(last, sample=True)
target_probs = torch.softmax(target_scores(last, drafts), -1)
tokens, accepted = ops.rejection_sample(target_probs, draft_probs, drafts, seed=2024, offsets=torch.zeros(BATCH, dtype=torch.int64))
print("sampling accepted", accepted.tolist(), "emitted", tokens.tolist())
print("backend picked on this machine:", ops.resolve("rejection_sample", "auto", last.device))
