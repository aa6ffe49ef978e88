"""The tree verification cases' random inputs: trees (parents), target/draft rows, children's
tokens (drawn from the draft rows, the parent's argmax, garbage ids) and every randomness mode
(uniforms with exact 0.0 coins, a seed with offsets, per-row seeds). Crafted rows: tree_rows.py."""

import torch

MODES = ("uniforms32", "uniforms64", "seed+offsets", "per-row seeds")


# ---------------------------------------------------------------------------- trees and rows

def list_parents(gen, n, unused_frac=0.2):
    """Random topological parents; some slots i > 0 unused (-1), never a parent themselves."""
    parents, used = [-1], [0]
    for i in range(1, n):
        if float(torch.rand((), generator=gen)) < unused_frac:
            parents.append(-1)
            continue
        parents.append(used[int(torch.randint(0, len(used), (), generator=gen))])
        used.append(i)
    return parents


def make_tree(batch, n, vocab, dtype, gen, *, zero_frac=0.2, unused_frac=0.2, parents=None):
    """Target/draft rows that are close (acceptances) with zero target entries (rejections); each
    node's token drawn from its own draft row; unused slots hold token -1 (CPU tensors)."""
    if parents is None:
        parents = torch.tensor([list_parents(gen, n, unused_frac) for _ in range(batch)], dtype=torch.int64)
    target = torch.rand(batch, n, vocab, generator=gen) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen) < zero_frac, 0.0, target)
    target[..., 0] += 1e-3
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, n, vocab, generator=gen)
    at_parent = target.gather(1, parents.clamp(min=0).unsqueeze(2).expand(-1, -1, vocab))
    draft = 0.7 * at_parent + 0.3 * noise / noise.sum(-1, keepdim=True)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
    unused = (parents < 0) & (torch.arange(n) > 0)
    tokens = torch.where(unused, -1, tokens)
    return target.to(dtype), draft.to(dtype), tokens, parents




def biased_parents(batch, n, gen, unused_frac=0.25):
    """Random trees biased to recent nodes (deep as well as wide): node i > 0 unused (-1) or a child
    of an earlier used node."""
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        used = [0]
        for i in range(1, n):
            if float(torch.rand(1, generator=gen)) < unused_frac:
                continue
            if float(torch.rand(1, generator=gen)) < 0.6:
                pick = used[-1 - int(torch.randint(0, min(len(used), 3), (1,), generator=gen))]
            else:
                pick = used[int(torch.randint(0, len(used), (1,), generator=gen))]
            parents[b, i] = pick
            used.append(i)
    return parents




def sampled_tree(batch, n, vocab, dtype, gen, *, unused_frac=0.15, odd_frac=0.1):
    """Per-parent draft rows; each node's children drawn without replacement from its row, in index
    order; a fraction `odd_frac` of children replaced by ids the rule skips or rejects."""
    from ..decoding.draft_tree import sample_children

    parents = torch.tensor([list_parents(gen, n, unused_frac) for _ in range(batch)], dtype=torch.int64)
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, -1)
    target = torch.where(torch.rand(target.shape, generator=gen) < 0.2, 0.0, target)
    draft = torch.softmax(torch.log(target + 1e-3) + torch.randn(batch, n, vocab, generator=gen) * 1.5, -1)
    draft = torch.where(torch.rand(draft.shape, generator=gen) < 0.1, 0.0, draft)
    tokens = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        for v in range(n):
            kids = [c for c in range(1, n) if int(parents[b, c]) == v]
            if kids:
                u = torch.rand(1, len(kids), generator=gen, dtype=torch.float64)
                tokens[b, kids] = sample_children(draft[b, v].to(dtype).float().unsqueeze(0), u)[0][0]
    odd = (torch.rand(batch, n, generator=gen) < odd_frac) & (parents >= 0)
    tokens = torch.where(odd, torch.randint(0, vocab, (batch, n), generator=gen), tokens)
    return target.to(dtype), draft.to(dtype), tokens, parents




# ---------------------------------------------------------------------------- children's tokens

def sampled_sibling_tokens(draft, parents, gen):
    """Each node's children as draws WITHOUT replacement from the parent's draft row (Gumbel-top-k
    over the row; the child of sibling rank j takes the j-th key), as siblings="without_replacement"
    expects. Vectorised: a [B, N, N - 1] key table, no per-node loop."""
    batch, n, vocab = draft.shape
    gumbel = -torch.log(-torch.log(torch.rand(batch, n, vocab, generator=gen, device=draft.device).clamp(min=1e-12)))
    keys = torch.log(draft.float()) + gumbel  # -inf where q = 0: never drawn while mass is left
    ranked = torch.topk(keys, max(1, min(n - 1, vocab)), dim=-1).indices  # [B, N, K] per parent, draw order
    parent = parents.clamp(min=0)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & torch.ones(n, n, dtype=torch.bool, device=draft.device).tril(-1)
    rank = same.sum(dim=2).clamp(max=ranked.shape[2] - 1)  # earlier siblings
    tokens = ranked.gather(1, parent.unsqueeze(2).expand(-1, -1, ranked.shape[2])).gather(2, rank.unsqueeze(2)).squeeze(2)
    return torch.where(parents < 0, -1, tokens)


def greedy_tokens(logits, tokens, parents, gen):
    """About half of the used nodes carry their parent's argmax, so walks go deep."""
    from ..common.sampling import safe_argmax

    top1 = safe_argmax(logits).gather(1, parents.clamp(min=0))
    force = (torch.rand(tokens.shape, generator=gen) < 0.6) & (parents >= 0)
    return torch.where(force, top1, tokens)



def _bad_token(vocab, gen):
    choices = [-1, vocab, vocab + 3, -vocab, 2**40]
    return choices[int(torch.randint(0, len(choices), (1,), generator=gen))]


def garbage_tokens(parents, top1, vocab, gen, match_frac=0.5, bad_frac=0.08):
    """The parent's argmax (walks go deep), random ids, out-of-range ids; unused slots and the root
    hold -1 or garbage."""
    batch, n = parents.shape
    parents, top1 = parents.cpu(), top1.cpu()
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    for b in range(batch):
        tokens[b, 0] = _bad_token(vocab, gen)
        for i in range(1, n):
            par = int(parents[b, i])
            r = float(torch.rand(1, generator=gen))
            if par < 0:
                tokens[b, i] = -1 if r < 0.5 else _bad_token(vocab, gen)
            elif r < match_frac:
                tokens[b, i] = int(top1[b, par])
            elif r < match_frac + bad_frac:
                tokens[b, i] = _bad_token(vocab, gen)
    return tokens


# ---------------------------------------------------------------------------- randomness modes

def coins(batch, n, gen, dtype=torch.float64, zero_frac=0.15):
    """Uniforms with exact 0.0 coins."""
    u = torch.rand(batch, n, generator=gen, dtype=torch.float64).to(dtype)
    return torch.where(torch.rand(u.shape, generator=gen) < zero_frac, torch.zeros_like(u), u)


def randomness(batch, n, gen):
    """Every randomness mode: float32 / float64 uniforms (with exact 0.0 coins), an int seed with
    offsets (crossing 2^32 in the counter, negative, 2^40), per-row seeds without offsets."""
    return [dict(uniforms=coins(batch, n, gen, torch.float32)),
            dict(uniforms=coins(batch, n, gen, torch.float64)),
            dict(seed=int(torch.randint(-2**62, 2**62, (1,), generator=gen)),
                 offsets=torch.tensor([0, 2**32 - 2, 17, -5, 2**40] * 4)[:batch]),
            dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen))]


def high_coins(batch, n, gen, dtype=torch.float64):
    return (torch.rand(batch, n, generator=gen, dtype=torch.float64) ** 0.25).to(dtype)


def gpu_randomness(mode, batch, n, gen, device):
    if mode == "uniforms32":
        return {"uniforms": torch.rand(batch, n, generator=gen).to(device)}
    if mode == "uniforms64":
        return {"uniforms": torch.rand(batch, n, generator=gen, dtype=torch.float64).to(device)}
    offsets = torch.randint(0, 5000, (batch,), generator=gen).to(device)
    if mode == "seed+offsets":
        return {"seed": int(torch.randint(-(2**62), 2**62, (1,), generator=gen)), "offsets": offsets}
    return {"seed": torch.randint(-(2**62), 2**62, (batch,), generator=gen).to(device), "offsets": offsets}


