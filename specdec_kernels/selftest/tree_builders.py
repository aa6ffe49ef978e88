"""The tree verification cases' builders: build(seed, device, **settings) -> the op's inputs, one named
function per kind of case of cases_tree_verify.py (the settings are its rows').

Shape cases and GPU-size cases draw from the seed on the device. Crafted cases (@crafted) are fixed,
built on the CPU and moved to the device: the seed does not matter; each reproduces a former test
instance. Cases marked `unvalidated` hold ids the op's CPU checks refuse (>= V, < -1: what a GPU
call may get): the case's run calls the backends' implementations directly."""

import functools

import torch

from .inputs import random_logits, random_parents, seeded_generator
from .tree_inputs import (INF, MODES, NAN, adversarial_prob_rows, biased_parents, coins, edge_rows, exact_residual_row,
                          garbage_tokens, gpu_randomness, greedy_edge_rows, greedy_tokens, high_coins, make_tree,
                          many_rejected_siblings, randomness, sampled_sibling_tokens, sampled_tree, special_logit_rows)

WR = "without_replacement"
EDGE_MODES = MODES + ("uniforms all 0", "uniforms 1 - 2^-53")  # the crafted edge rows' coins: also 0 and the largest u
HIGH_MODES = ("high uniforms32", "high uniforms64", "seed+offsets", "per-row seeds")  # coins skewed high


def on_device(device, x):
    """Every tensor of x on `device` (python values stay)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}


def crafted(make):
    """A crafted case's builder: make(**settings) builds fixed CPU inputs; the seed does not matter. tiles:
    the Triton launcher's tiles for the case (None: the op's own)."""
    @functools.wraps(make)
    def build(seed, device, tiles=None, **settings):
        x = on_device(device, make(**settings))
        return x if tiles is None else dict(x, triton_overrides=tiles)
    return build


def probs(target, draft, tokens, parents, **more):
    """tree_rejection_sample's tree inputs."""
    return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, **more)


def logits_of(logits, tokens, parents, **more):
    """tree_greedy_verify's tree inputs."""
    return dict(target_logits=logits, tree_tokens=tokens, parents=parents, **more)


# ---------------------------------------------------------------------------- the shapes x dtypes

def shape_greedy(seed, device, shape, dtype):
    from ..common.sampling import safe_argmax

    batch, n, vocab = shape
    gen = seeded_generator(device, seed)
    parents = random_parents(batch, n, seed).to(device)
    logits = random_logits(batch, n, vocab, dtype, gen, device)
    parent_top = safe_argmax(logits).gather(1, parents.clamp(min=0))
    tokens = torch.where(torch.rand(batch, n, generator=gen, device=device) < 0.6, parent_top,
                         torch.randint(0, vocab, (batch, n), generator=gen, device=device))
    tokens = torch.where(parents < 0, -1, tokens)
    tokens[:, 0] = 0
    return logits_of(logits, tokens, parents, max_depth=n - 1)


def shape_sampling(seed, device, shape, dtype, sampled, row_seeds):
    """Children as a real drafter proposes them, or (sampled) drawn from the parent's row without replacement
    (draft row v = the q of v's children, updated after each rejected sibling); uniforms, or per-row seeds."""
    from ..common.sampling import safe_argmax

    batch, n, vocab = shape
    gen = seeded_generator(device, seed)
    parents = random_parents(batch, n, seed).to(device)
    logits = torch.randn(batch, n, vocab, generator=gen, device=device) * 2
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=gen, device=device), -1)
    # the parent's target argmax, the draft's own argmax (likely accepted), random ids (likely rejected)
    parent = parents.clamp(min=0)
    choice = torch.rand(batch, n, generator=gen, device=device)
    tokens = torch.where(choice < 0.4, safe_argmax(target).gather(1, parent),
                         torch.where(choice < 0.7, safe_argmax(draft).gather(1, parent),
                                     torch.randint(0, vocab, (batch, n), generator=gen, device=device)))
    tokens = torch.where(parents < 0, -1, tokens)
    x = probs(target.to(dtype), draft.to(dtype), tokens, parents, max_depth=n - 1,
              uniforms=torch.rand(batch, n, generator=gen, device=device, dtype=torch.float64))
    if sampled:
        x.update(tree_tokens=sampled_sibling_tokens(x["draft_probs"], parents, seeded_generator(device, seed + 3)),
                 siblings=WR)
    x["tree_tokens"][:, 0] = 0
    if row_seeds:
        del x["uniforms"]
        x["seed"] = torch.randint(-(2**62), 2**62, (batch,), generator=seeded_generator(device, seed + 1),
                                  device=device)
        x["offsets"] = torch.randint(0, 5000, (batch,), generator=seeded_generator(device, seed + 2), device=device)
    return x


# ---------------------------------------------------------------------------- crafted: small trees
# mode: the randomness mode of tree_rejection_sample's inputs (MODES); None: tree_greedy_verify's inputs,
# logits on the same tree (drawn after the modes' coins, so each op's inputs stay as they were).

@crafted
def ragged(vocab, dtype, cut, mode=None):
    """Random trees: V in {1, 37, 300}, a ragged batch (every dtype, randomness mode, depth cut)."""
    gen = torch.Generator().manual_seed(vocab)
    target, draft, tokens, parents = make_tree(4, 9, vocab, dtype, gen)
    parents[1, 5:] = -1  # row 1: a smaller tree padded with unused slots
    tokens[1, 5:] = -1
    modes = randomness(4, 9, gen)
    if mode is None:
        logits = torch.log(target.float() + 1e-3).to(target.dtype)
        return logits_of(logits, greedy_tokens(logits, tokens, parents, gen), parents, max_depth=cut)
    return probs(target, draft, tokens, parents, max_depth=cut, **modes[MODES.index(mode)])


@crafted
def small_tiles(vocab, mode=None):
    """For BLOCK_V = 16 over V in {7, 300}: the residual passes and the int64 cdf cross tiles."""
    gen = torch.Generator().manual_seed(vocab + 1)
    target, draft, tokens, parents = make_tree(3, 7, vocab, torch.float32, gen, zero_frac=0.6)
    modes = randomness(3, 7, gen)
    if mode is None:
        logits = torch.randn(3, 7, vocab, generator=gen)
        return logits_of(logits, greedy_tokens(logits, tokens, parents, gen), parents, max_depth=3)
    return probs(target, draft, tokens, parents, **modes[MODES.index(mode)])


@crafted
def star_far_from_p(mode):
    """Every node a child of the root, q far from p: siblings rejected one after the other."""
    batch, n, vocab = 6, 8, 24
    gen = torch.Generator().manual_seed(21)
    parents = torch.tensor([[-1] + [0] * (n - 1)] * batch)
    target, _, _, _ = make_tree(batch, n, vocab, torch.float32, gen, zero_frac=0.5, parents=parents)
    draft = torch.softmax(3 * torch.randn(batch, n, vocab, generator=gen), -1)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
    return probs(target, draft, tokens, parents, **randomness(batch, n, gen)[MODES.index(mode)])


@crafted
def exact_residual(coin):
    """The later-sibling rule reads the exact int64 residual, not one rounded through float32."""
    return dict(exact_residual_row(coin == "below both")[0])


@crafted
def empty_batch(greedy):
    """B = 0."""
    empty = torch.zeros(0, 3, dtype=torch.int64)
    if greedy:
        return logits_of(torch.rand(0, 3, 10), empty, empty - 1, max_depth=2)
    return probs(torch.rand(0, 3, 10), torch.rand(0, 3, 10), empty, empty - 1, seed=1, max_depth=2)


@crafted
def root_only(cut, mode=None):
    """The root alone: the bonus from p; max_depth beyond the tree pads with -1."""
    gen = torch.Generator().manual_seed(3)
    target, draft, tokens, parents = make_tree(3, 1, 50, torch.bfloat16, gen)
    if mode is None:
        return logits_of(torch.randn(3, 1, 50, generator=gen), tokens, parents, max_depth=cut)
    return probs(target, draft, tokens, parents, max_depth=cut, **randomness(3, 1, gen)[MODES.index(mode)])


@crafted
def deep_cut(mode=None):
    """max_depth + 1 wider than BLOCK_N: the output tail padded by the store loop."""
    gen = torch.Generator().manual_seed(4)
    target, draft, tokens, parents = make_tree(2, 3, 12, torch.float32, gen, unused_frac=0.0)
    modes = randomness(2, 3, gen)
    if mode is None:
        return logits_of(torch.randn(2, 3, 12, generator=gen), tokens, parents, max_depth=9)
    return probs(target, draft, tokens, parents, max_depth=9, **modes[MODES.index(mode)])


# ---------------------------------------------------------------------------- crafted: edge rows, odd inputs

@crafted
def edge_rows_sampling(dtype, mode, cut):
    x = edge_rows(dtype)
    batch, n = x["tree_tokens"].shape
    gen = torch.Generator().manual_seed(12)
    all_modes = randomness(batch, n, gen) + [
        dict(uniforms=torch.zeros(batch, n)),
        dict(uniforms=torch.full((batch, n), 1.0 - 2**-53, dtype=torch.float64))]
    return dict(x, max_depth=cut, **all_modes[EDGE_MODES.index(mode)])


@crafted
def edge_rows_greedy(dtype, cut):
    logits, tokens, parents = greedy_edge_rows()
    return logits_of(logits.to(dtype), tokens, parents, max_depth=cut)


@crafted
def out_of_range(mode=None):
    """Ids >= V or < -1 (a GPU does not validate values): they read nothing, rejected / never matched."""
    gen = torch.Generator().manual_seed(14)
    target, draft, tokens, parents = make_tree(3, 6, 20, torch.float32, gen, unused_frac=0.0)
    tokens[:, 1:] = torch.tensor([[20, 0, 2**40, -7, 5], [-2**62, 20, 21, 3, 3], [1, 2, 3, 4, 2**33]])
    tokens[:, 0] = torch.tensor([-5, 99, 2**50])  # the root's entry is ignored
    modes = randomness(3, 6, gen)
    if mode is None:
        return logits_of(torch.randn(3, 6, 20, generator=gen), tokens, parents, unvalidated=True)
    return probs(target, draft, tokens, parents, unvalidated=True, **modes[MODES.index(mode)])


@crafted
def strided(dtype, mode=None):
    """A batch stride past the rows, node-major storage, transposed index tensors; mode "uniforms" or
    "strided seeds and offsets"."""
    batch, n, vocab = 3, 6, 30
    gen = torch.Generator().manual_seed(2)
    target, draft, tokens, parents = make_tree(batch, n, vocab, dtype, gen)
    big = torch.zeros(batch, n + 2, vocab, dtype=dtype)
    big[:, 1:n + 1] = target
    tokens, parents = tokens.t().contiguous().t(), parents.t().contiguous().t()
    if mode is None:
        return logits_of(big[:, 1:n + 1], tokens, parents)
    modes = {"uniforms": dict(uniforms=coins(batch, n, gen).t().contiguous().t()),
             "strided seeds and offsets": dict(seed=torch.randint(0, 2**40, (2 * batch,), generator=gen)[::2],
                                               offsets=torch.tensor([5, 0, 9, 0, 2**33, 0])[::2])}
    return probs(big[:, 1:n + 1], draft.transpose(0, 1).contiguous().transpose(0, 1), tokens, parents,
                 **modes[mode])


@crafted
def many_rejected(mode):
    """The residual recomputed after many rejected siblings at two levels (no [B, V] scratch)."""
    x, gen = many_rejected_siblings()
    batch, n = x["tree_tokens"].shape
    return dict(x, **(randomness(batch, n, gen) + [dict(uniforms=torch.zeros(batch, n))])[EDGE_MODES.index(mode)])


# ---------------------------------------------------------------------------- crafted: sampled siblings

@crafted
def sampled_ragged(dtype, mode, cut):
    """siblings="without_replacement": children really drawn without replacement, coins skewed high."""
    gen = torch.Generator().manual_seed(1)
    target, draft, tokens, parents = sampled_tree(4, 9, 37, dtype, gen)
    parents[1, 5:] = -1
    tokens[1, 5:] = -1
    modes = [dict(uniforms=high_coins(4, 9, gen, torch.float32)), dict(uniforms=high_coins(4, 9, gen))]
    modes += randomness(4, 9, gen)[2:]
    return probs(target, draft, tokens, parents, siblings=WR, max_depth=cut, **modes[HIGH_MODES.index(mode)])


@crafted
def sampled_star(mode):
    from ..decoding.draft_tree import sample_children

    gen = torch.Generator().manual_seed(2)
    batch, vocab = 5, 50
    parents = torch.tensor([[-1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2]] * batch)
    n = parents.shape[1]
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 3, -1)
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1)
    tokens = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        for v, kids in ((0, list(range(1, 8))), (1, [8, 9, 10]), (2, [11, 12])):
            tokens[b, kids] = sample_children(draft[b, v:v + 1], torch.rand(1, len(kids), generator=gen,
                                                                           dtype=torch.float64))[0][0]
    modes = {"high uniforms64": dict(uniforms=high_coins(batch, n, gen)), "seed": dict(seed=7),
             "int32 offsets": dict(seed=torch.arange(batch) * 3 - 5, offsets=torch.arange(batch, dtype=torch.int32))}
    return probs(target, draft, tokens, parents, siblings=WR, **modes[mode])


# The odd root distributions of the sampled-sibling rows, one batch row each, in this order:
# (what it is, the side it poisons, the value written over the root's whole row; +inf: its first ids)
ODD_ROOTS = (("NaN p", "p", NAN), ("NaN q", "q", NAN), ("zero p", "p", 0.0), ("zero q", "q", 0.0),
             ("+inf q", "q", INF))


def _odd_roots(target, draft, inf_width):
    """Row i's root (node 0) gets ODD_ROOTS[i]; +inf fills the first `inf_width` ids only."""
    for row, (_, side, value) in enumerate(ODD_ROOTS):
        probs = target if side == "p" else draft
        probs[row, 0, :inf_width if value == INF else None] = value


@crafted
def sampled_odd_rows(mode):
    """One row per ODD_ROOTS entry, then a row with -inf in p and q above 1 at the root; repeats."""
    gen = torch.Generator().manual_seed(3)
    target, draft, tokens, parents = sampled_tree(len(ODD_ROOTS) + 1, 7, 19, torch.float32, gen, odd_frac=0.3)
    _odd_roots(target, draft, inf_width=5)
    minus_inf_row = len(ODD_ROOTS)
    target[minus_inf_row, 0, :5] = -INF
    draft[minus_inf_row, 0, 5:9] = 2.0
    tokens[:, 2] = tokens[:, 1]  # a repeated sibling where both hang off one parent
    modes = {"high uniforms64": dict(uniforms=high_coins(len(ODD_ROOTS) + 1, 7, gen)), "seed": dict(seed=11)}
    return probs(target, draft, tokens, parents, siblings=WR, **modes[mode])


@crafted
def sampled_strided(index_dtype, mode):
    gen = torch.Generator().manual_seed(4)
    batch, n, vocab = 3, 8, 23
    target, draft, tokens, parents = sampled_tree(batch, n, vocab, torch.float16, gen)
    wide_tokens = torch.zeros(batch, 2 * n, dtype=index_dtype)
    wide_tokens[:, ::2] = tokens
    wide_parents = torch.zeros(batch, 2 * n, dtype=index_dtype)
    wide_parents[:, ::2] = parents
    modes = {"high uniforms64": dict(uniforms=high_coins(batch, n, gen)),
             "per-row seeds and offsets": dict(seed=torch.tensor([5, -6, 7], dtype=index_dtype),
                                               offsets=torch.tensor([1, 2, 3], dtype=index_dtype))}
    return probs(target, draft, wide_tokens[:, ::2], wide_parents[:, ::2], siblings=WR, **modes[mode])


# ---------------------------------------------------------------------------- GPU sizes
# Random trees with garbage tokens in unused slots and out-of-range ids (unvalidated: a GPU call does
# not inspect values), adversarial logit and probability rows, wide trees with long rejection chains,
# sampled siblings at production vocabularies, non-contiguous inputs.

def garbage_greedy(seed, device, dtype, vocab, batch, n, cut):
    from ..common.sampling import safe_argmax

    gen = torch.Generator().manual_seed(vocab + 17 * batch + n + seed)
    parents = biased_parents(batch, n, gen)
    logits = random_logits(batch, n, vocab, dtype, seeded_generator(device, vocab + batch + n + seed), device)
    tokens = garbage_tokens(parents, safe_argmax(logits), vocab, gen)
    return logits_of(logits, tokens.to(device), parents.to(device), max_depth=cut, unvalidated=True)


def garbage_sampling(seed, device, dtype, vocab, batch, n, mode, cut):
    from ..common.sampling import safe_argmax

    gen = torch.Generator().manual_seed(vocab + 31 * batch + n + seed)
    parents = biased_parents(batch, n, gen)
    dgen = seeded_generator(device, vocab + batch + n + seed)
    logits = torch.randn(batch, n, vocab, generator=dgen, device=device) * 2
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=dgen, device=device), -1)
    tokens = garbage_tokens(parents, safe_argmax(target), vocab, gen, match_frac=0.3)
    top_q = safe_argmax(draft).cpu()
    own = (torch.rand(batch, n, generator=gen) < 0.3) & (parents >= 0)
    own[:, 0] = False
    tokens = torch.where(own, top_q, tokens)
    return probs(target.to(dtype), draft.to(dtype), tokens.to(device), parents.to(device), max_depth=cut,
                 unvalidated=True, **gpu_randomness(mode, batch, n, gen, device))


def adversarial_greedy(seed, device, dtype, vocab):
    from ..common.sampling import safe_argmax

    gen = torch.Generator().manual_seed(vocab + 2 + seed)
    rows = special_logit_rows(vocab)
    batch, n = len(rows), 12
    parents = biased_parents(batch, n, gen, unused_frac=0.1)
    logits = torch.stack([torch.stack([rows[(b + i) % len(rows)] for i in range(n)]) for b in range(batch)]).to(dtype)
    tokens = garbage_tokens(parents, safe_argmax(logits), vocab, gen, match_frac=0.6, bad_frac=0.2)
    return on_device(device, logits_of(logits, tokens, parents, unvalidated=True))


def adversarial_sampling(seed, device, dtype, vocab, mode):
    gen = torch.Generator().manual_seed(vocab + 3 + MODES.index(mode) + seed)
    rows = adversarial_prob_rows(vocab, gen)
    batch, n = len(rows), 5
    parents = torch.tensor([-1, 0, 0, 0, 1]).expand(batch, -1).clone()
    target, draft = torch.empty(batch, n, vocab), torch.empty(batch, n, vocab)
    tokens = torch.empty(batch, n, dtype=torch.int64)
    for b in range(batch):
        for node in range(n):
            target[b, node] = rows[(b + node) % batch][0]
            draft[b, node] = rows[(b + 2 * node) % batch][1]
            tokens[b, node] = rows[(b + 2 * node) % batch][2]
        target[b, 0], draft[b, 1], tokens[b, 1] = rows[b]
    x = probs(target.to(dtype), draft.to(dtype), tokens, parents, unvalidated=True)
    return dict(on_device(device, x), **gpu_randomness(mode, batch, n, gen, device))


def _shared_or_top_k_drafts(target, draft, tokens, parents, gen):
    """Odd rows: deterministic top-k children with one-hot q, worst first; even rows: siblings share
    one q and draw from it."""
    batch, n = tokens.shape
    for b in range(batch):
        for node in range(n):
            kids = (parents[b] == node).nonzero().flatten().tolist()
            if not kids:
                continue
            if b % 2:
                top = torch.topk(target[b, node], len(kids)).indices.tolist()[::-1]
                for kid, tok in zip(kids, top):
                    tokens[b, kid] = tok
                    draft[b, kid] = 0.0
                    draft[b, kid, tok] = 1.0
            else:
                draft[b, kids] = draft[b, kids[0]].clone()
                tokens[b, kids] = torch.multinomial(draft[b, kids[0]], len(kids), replacement=True, generator=gen)


WIDE_SIBLINGS = {"shared-q and one-hot top-k drafts": "independent", "sampled siblings, NaN/inf/zero rows, repeats": WR}


def repeated_wide_tree(seed, device, drafts, repeat):
    """wide_tree in bfloat16 with seeded coins, called `repeat` times back to back (cases_tree_verify._call)."""
    return dict(wide_tree(seed, device, torch.bfloat16, "seed+offsets", drafts), repeat=repeat)


def wide_tree(seed, device, dtype, mode, drafts):
    """Root with 10 children, node 1 with 8, the rest under node 2: long rejection chains with
    i.i.d.-style drafts (shared q) and one-hot (top-k) drafts; NaN / inf / zero rows. V = 32000."""
    siblings = WIDE_SIBLINGS[drafts]
    gen = torch.Generator().manual_seed(11 + MODES.index(mode) + seed)
    batch, vocab = 8, 32000
    parents = torch.tensor([-1] + [0] * 10 + [1] * 8 + [2] * 5).expand(batch, -1).clone()
    n = parents.shape[1]
    logits = torch.randn(batch, n, vocab, generator=gen)
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    if siblings == WR:
        tokens = sampled_sibling_tokens(draft, parents, gen)
        _odd_roots(target, draft, inf_width=100)  # one row per ODD_ROOTS entry, then a repeated sibling
        tokens[len(ODD_ROOTS), 2] = tokens[len(ODD_ROOTS), 1]
    else:
        _shared_or_top_k_drafts(target, draft, tokens, parents, gen)
    tokens[:, 0] = 0
    x = probs(target.to(dtype), draft.to(dtype), tokens, parents, siblings=siblings)
    return dict(on_device(device, x), **gpu_randomness(mode, batch, n, gen, device))


def sampled_production(seed, device, dtype, shape, mode, cut):
    batch, n, vocab = shape
    gen = torch.Generator().manual_seed(41 + MODES.index(mode) + seed)
    parents = biased_parents(batch, n, gen)
    dgen = seeded_generator(device, 41 + seed)
    logits = torch.randn(batch, n, vocab, generator=dgen, device=device)
    target = torch.softmax(logits, -1).to(dtype)
    draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=dgen, device=device), -1).to(dtype)
    tokens = sampled_sibling_tokens(draft, parents.to(device), seeded_generator(device, 42 + seed))
    odd = (torch.rand(batch, n, generator=gen) < 0.05) & (parents >= 0)
    noise = torch.randint(0, vocab, (batch, n), generator=gen).to(device)
    tokens = torch.where(odd.to(device), noise, tokens)
    return probs(target, draft, tokens, parents.to(device), max_depth=cut, siblings=WR,
                 **gpu_randomness(mode, batch, n, gen, device))


def unaligned_sampling(seed, device, mode):
    from ..common.sampling import safe_argmax

    gen = torch.Generator().manual_seed(8 + seed)
    batch, n, vocab = 5, 9, 32000
    dgen = seeded_generator(device, 8 + seed)
    logits = torch.randn(batch, n + 1, vocab + 1, generator=dgen, device=device) * 2
    target = torch.softmax(logits, -1).half()[:, 1:, 1:]  # unaligned, strided views
    draft = torch.softmax(logits + torch.randn(logits.shape, generator=dgen, device=device), -1).half()[:, :n, :vocab]
    parents = biased_parents(batch, n, gen)
    tokens = garbage_tokens(parents, safe_argmax(target), vocab, gen, match_frac=0.3)
    wide = torch.stack([tokens, tokens], dim=2).reshape(batch, 2 * n).to(device)
    rnd = gpu_randomness(mode, batch, n, gen, device)
    if "uniforms" in rnd:
        rnd["uniforms"] = torch.cat([rnd["uniforms"], rnd["uniforms"]], dim=1)[:, :n]
    else:
        rnd["seed"] = torch.stack([rnd["seed"], rnd["seed"]], dim=1)[:, 0]
        rnd["offsets"] = torch.stack([rnd["offsets"], rnd["offsets"]], dim=1)[:, 1]
    return probs(target, draft, wide[:, ::2], parents.t().contiguous().to(device).t(), unvalidated=True, **rnd)


def unaligned_greedy(seed, device):
    from ..common.sampling import safe_argmax

    gen = torch.Generator().manual_seed(3 + seed)
    batch, n, vocab = 4, 10, 32001
    big = random_logits(batch, n + 2, vocab + 1, torch.float16, seeded_generator(device, 3 + seed), device)
    logits = big[:, 1:n + 1, 1:]  # unaligned rows: the scalar path
    parents = biased_parents(batch, n, gen)
    tokens = garbage_tokens(parents, safe_argmax(logits), vocab, gen)
    wide = torch.stack([tokens, tokens], dim=2).reshape(batch, 2 * n).to(device)
    return logits_of(logits, wide[:, ::2], parents.t().contiguous().to(device).t(), unvalidated=True)


def out_of_range_children(seed, device):
    vocab, batch = 1000, 3
    return dict(target_logits=torch.full((batch, 4, vocab), NAN, device=device),  # argmax 0 everywhere
                parents=torch.tensor([[-1, 0, 0, 0]] * batch, device=device),
                tree_tokens=torch.tensor([[0, -1, vocab, 0], [0, 2**40, -vocab, 5], [7, 0, 0, 0]], device=device),
                max_depth=1, unvalidated=True)
