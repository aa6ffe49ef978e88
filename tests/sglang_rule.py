"""SGLang's own acceptance rule at any thresholds (lossy below 1), restated in torch for the tests: accept
sibling k iff u <= (p(x_1) + ... + p(x_k)) / threshold_acc or p(x_k) >= threshold_single, in float32 as
SGLang computes it; the new token from SGLang's residual relu(p - d) at the last node, drawn with our op.
The adapter (integrations/sglang.py) runs only the lossless thresholds (1, 1) and refuses the others; this
walk checks it there against SGLang's own order of tests, and shows why it refuses the rest (lossy)."""

import torch

from specdec_kernels import ops
from specdec_kernels.integrations.sglang_layout import BELOW_ONE


def threshold_rule(tree, tokens, target_probs, draft_probs, uniform_samples, final_coins, threshold_single,
                   threshold_acc, steps, backend):
    """SGLang's rule (module docstring) on a `sglang_layout.Tree`, tokens [B, N] int64 in SGLang's
    numbering. Returns (path [B, S] old node ids root first, num [B], emitted [B, S])."""
    batch, n, vocab = target_probs.shape
    device = tokens.device
    rows = torch.arange(batch, device=device)
    children = tree.children()
    single = torch.tensor(threshold_single, dtype=torch.float32, device=device)
    acc_scale = torch.tensor(threshold_acc, dtype=torch.float32, device=device).clamp(min=1e-9)  # SGLang's cap
    coins = uniform_samples.float()
    cur = torch.zeros(batch, dtype=torch.int64, device=device)
    num = torch.zeros(batch, dtype=torch.int64, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, steps), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    coin = coins[:, 0]

    def child_tokens(node):
        kids = children[rows, node]  # [B, K] in list order
        token = tokens.gather(1, kids.clamp(min=0))
        valid = (kids >= 0) & (token >= 0) & (token < vocab)
        return kids, token.clamp(0, vocab - 1), valid

    for step in range(1, steps):
        kids, token, valid = child_tokens(cur)
        p = torch.where(valid, target_probs[rows.unsqueeze(1), cur.unsqueeze(1), token].float(), 0.0)
        prob_acc = torch.cumsum(p, 1)
        accept = (kids >= 0) & alive.unsqueeze(1) & ((coin.unsqueeze(1) <= prob_acc / acc_scale) | (p >= single))
        moved = accept.any(1)
        chosen = kids.gather(1, accept.to(torch.int8).argmax(1, keepdim=True)).squeeze(1)
        cur = torch.where(moved, chosen, cur)
        path[:, step] = torch.where(moved, chosen, -1)
        num = num + moved.long()
        coin = torch.where(moved, coins.gather(1, cur.unsqueeze(1)).squeeze(1), coin)
        alive = moved
    # the residual at the last node: p minus the caller's draft row with p written at every
    # rejected child (all of them: the walk stopped there); the bonus (depth S - 1) draws from p
    bonus = num == steps - 1
    p_last = target_probs[rows, cur].float()
    draft = (torch.zeros_like(p_last) if draft_probs is None else draft_probs[rows, cur].float())
    _, token, valid = child_tokens(cur)
    valid = valid & ~bonus.unsqueeze(1)
    spill = torch.cat([draft, torch.zeros_like(draft[:, :1])], 1)  # column V: writes of invalid slots
    spill.scatter_(1, torch.where(valid, token, vocab), p_last.gather(1, token))
    draft = torch.where(bonus.unsqueeze(1), 0.0, spill[:, :vocab])
    residual = (p_last - draft).clamp(min=0.0)
    residual = torch.where((residual.sum(1) > 0).unsqueeze(1), residual, p_last)
    single_node = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    final, _, _ = ops.tree_rejection_sample(residual.unsqueeze(1), torch.zeros_like(residual).unsqueeze(1),
                                            torch.zeros_like(single_node), single_node, max_depth=0,
                                            uniforms=final_coins.double().clamp(0.0, BELOW_ONE).unsqueeze(1),
                                            backend=backend)
    following = torch.cat([path[:, 1:], torch.full_like(path[:, :1], -1)], 1)
    steps_index = torch.arange(steps, device=device).unsqueeze(0)
    emitted = torch.where(steps_index < num.unsqueeze(1), tokens.gather(1, following.clamp(min=0)), final[:, :1])
    return path, num, emitted
