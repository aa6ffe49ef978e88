"""Random inputs of the cases: logits with ties, drafts near the top, close distributions, trees."""

import torch


def seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def random_logits(batch, rows, vocab, dtype, gen, device, scale=3.0):
    """randn * scale with each row's max repeated at a random second id in about half the
    rows, so ties (the lowest id must win) show up in every dtype."""
    x = torch.randn(batch, rows, vocab, generator=gen, device=device) * scale
    flat = x.view(-1, vocab)
    dup = torch.rand(flat.shape[0], generator=gen, device=device) < 0.5
    at = torch.randint(0, vocab, (flat.shape[0],), generator=gen, device=device)
    flat[dup, at[dup]] = flat.max(dim=-1).values[dup]
    return x.to(dtype)


def near_top_drafts(logits, gen, wild=0.1):
    """Half the drafts the argmax, the others a token of rank 1..4, a `wild` fraction random
    or -1: accepted prefixes of every length, plus rejections. (Ids >= V would fail the op's
    validation on the CPU; the GPU tests cover them.)"""
    from ..common.sampling import nan_to_neg_inf

    batch, positions, vocab = logits.shape
    g, device = positions - 1, logits.device
    top = torch.topk(nan_to_neg_inf(logits[:, :g]), min(vocab, 5), dim=-1).indices
    rank = torch.randint(0, top.shape[-1], (batch, g), generator=gen, device=device)
    rank = torch.where(torch.rand(batch, g, generator=gen, device=device) < 0.5, torch.zeros_like(rank), rank)
    drafts = top.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    noise = torch.randint(-1, vocab, (batch, g), generator=gen, device=device)  # -1: padding, never accepted
    return torch.where(torch.rand(batch, g, generator=gen, device=device) < wild, noise, drafts)


def random_probs(batch, g, vocab, dtype, gen, device):
    """Close target/draft distributions (drafts often accepted), some zero target entries
    (some rejected), drafts sampled from the draft rows."""
    target = torch.rand(batch, g + 1, vocab, generator=gen, device=device) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen, device=device) < 0.2, 0.0, target)
    target[..., 0] += 1e-3
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, g, vocab, generator=gen, device=device)
    draft = 0.7 * target[:, :g] + 0.3 * noise / noise.sum(-1, keepdim=True)
    drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    return target.to(dtype), draft.to(dtype), drafts


def random_parents(batch, n, seed, unused=0.15):
    """Random trees, parents before children (biased to recent nodes so trees get deep as well
    as wide), about `unused` of the slots unused (-1). On the CPU: a Python loop over nodes."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    coins = torch.rand(batch, n, 2, generator=gen).tolist()
    for b in range(batch):
        used = [0]
        for i in range(1, n):
            if coins[b][i][0] < unused:
                continue
            pick = min(int(coins[b][i][1] * 4), len(used) - 1)
            parents[b, i] = used[-1 - pick]
            used.append(i)
    return parents


def ragged(batch, g, gen, device):
    return torch.randint(0, g + 1, (batch,), generator=gen, device=device)
