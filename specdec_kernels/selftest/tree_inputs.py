"""The tree verification cases' inputs: random trees (parents), target/draft rows, children's tokens (drawn
from the draft rows, the parent's argmax, garbage ids), every randomness mode (uniforms with exact 0.0 coins, a
seed with offsets, per-row seeds), and crafted rows: each row of a batch one edge case with a known answer
(zero / NaN / inf / negative / one-hot / duplicate rows, greedy ties), long chains of rejected siblings, the
exact int64 residual, the adversarial rows of the GPU-size cases. A crafted row's index is looked up by its
name, never written as a number."""

import torch

MODES = ("uniforms32", "uniforms64", "seed+offsets", "per-row seeds")
INF, NAN = float("inf"), float("nan")
FIRST_LEVEL = 1  # the column of accepted_nodes holding the node accepted below the root
FIRST_EMITTED = 0  # the column of output_tokens holding the first emitted token
# three root children, two grandchildren under 1, one under 2, an unused slot
EDGE_PARENTS = [-1, 0, 0, 0, 1, 1, 2, -1]


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
    earlier = torch.ones(n, n, dtype=torch.bool, device=draft.device).tril(-1)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & earlier
    rank = same.sum(dim=2).clamp(max=ranked.shape[2] - 1)  # earlier siblings
    per_node = ranked.gather(1, parent.unsqueeze(2).expand(-1, -1, ranked.shape[2]))  # [B, N, K] the parent's draws
    tokens = per_node.gather(2, rank.unsqueeze(2)).squeeze(2)
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


# ---------------------------------------------------------------------------- tree_rejection_sample edge rows

EDGE_ROWS = ("p == q on a zero-mass id", "q == 0 < p", "zero target root", "NaN target root", "rejected, then +inf q",
             "one-hot top-k", "padding tokens", "negative and subnormal", "duplicate siblings")
EDGE_ROW = {name: b for b, name in enumerate(EDGE_ROWS)}


def edge_rows(dtype):
    """One crafted row per edge case of tree_rejection_sample (V = 40, N = 8), row EDGE_ROW[name]; each
    craft edits its own row of p (target), q (draft) and the tokens."""
    vocab, n, batch, row = 40, len(EDGE_PARENTS), len(EDGE_ROWS), EDGE_ROW
    parents = torch.tensor([EDGE_PARENTS] * batch)
    p, q, tokens, _ = make_tree(batch, n, vocab, torch.float32, torch.Generator().manual_seed(11), parents=parents)
    p, q = p.clone(), q.clone()
    # p == q for every child and tokens on a zero-mass id: rejected, empty residual -> draw from p
    b = row["p == q on a zero-mass id"]
    p[b, :, 5] = 0.0
    q[b] = p[b, parents[b].clamp(min=0)]
    tokens[b, 1:7] = 5
    # q == 0 < p at the drafted tokens: the first child is accepted whatever the coin
    b = row["q == 0 < p"]
    q[b, :, 9], p[b, :, 9], tokens[b, 1:7] = 0.0, 0.25, 9
    # an all-zero target row at the root: every child rejected, residual and p empty -> id 0
    p[row["zero target root"], 0] = 0.0
    # NaN target at the root, NaN / inf in the children's q
    b = row["NaN target root"]
    p[b, 0], q[b, 1, ::3], q[b, 2, 4], q[b, 3, :] = NAN, NAN, INF, -INF
    # the first child rejected (p(x) = 0); the second child's q has +inf at its token and NaN entries
    b = row["rejected, then +inf q"]
    p[b, 0, tokens[b, 1]], q[b, 2, tokens[b, 2]], q[b, 2, 1::4] = 0.0, INF, NAN
    # one-hot target, distinct deterministic drafts with one-hot q (top-k siblings): the third hits
    b = row["one-hot top-k"]
    p[b], p[b, :, 17], q[b] = 0.0, 1.0, 0.0
    q[b, torch.arange(1, 7), torch.tensor([3, 4, 17, 17, 2, 17])] = 1.0
    tokens[b, 1:7] = torch.tensor([3, 4, 17, 17, 2, 17])
    # -1 tokens on used nodes (rejected, the residual still updated) and an all-zero q row
    b = row["padding tokens"]
    tokens[b, 1], tokens[b, 3], q[b, 2] = -1, -1, 0.0
    # negative values, subnormals and a residual with mass only at the last id
    b = row["negative and subnormal"]
    p[b, 0], p[b, 0, vocab - 1], p[b, 0, 3] = 0.0, 0.5, -0.5
    p[b, 1, 20:30] = 1e-30 if dtype == torch.float32 else 1e-7
    q[b, 1:4] = 0.01
    # duplicate tokens among siblings; +inf entries in p at drafted tokens and in a bonus row
    b = row["duplicate siblings"]
    tokens[b, 1:4] = tokens[b, 1]
    q[b, 1:4] = q[b, 1]
    p[b, 0, tokens[b, 1]], p[b, 1, tokens[b, 4]], p[b, 4, 30:33] = INF, INF, INF
    return dict(target_probs=p.to(dtype), draft_probs=q.to(dtype), tree_tokens=tokens, parents=parents)


def edge_rows_answer(got, x):
    """What the crafted rows must give (every backend, every randomness mode)."""
    out, accepted, nodes = (t.cpu() for t in got)
    target = x["target_probs"].cpu()
    first, level, row = FIRST_EMITTED, FIRST_LEVEL, EDGE_ROW
    zero_mass = row["p == q on a zero-mass id"]
    return (nodes[row["q == 0 < p"], level] == 1 and out[row["q == 0 < p"], first] == 9
            and accepted[row["zero target root"]] == 0 and out[row["zero target root"], first] == 0
            and accepted[row["NaN target root"]] == 0 and out[row["NaN target root"], first] == 0
            and nodes[row["one-hot top-k"], level] == 3 and out[row["one-hot top-k"], first] == 17
            and accepted[zero_mass] == 0 and bool(target[zero_mass, 0, out[zero_mass, first]] > 0)
            and nodes[row["duplicate siblings"], level:].tolist() == [1, 4])


# ---------------------------------------------------------------------------- tree_greedy_verify edge rows

GREEDY_ROWS = ("tie at the root", "NaN root", "all -inf root, all-NaN child", "two +inf at the root",
               "no child can match")
GREEDY_ROW = {name: b for b, name in enumerate(GREEDY_ROWS)}


def greedy_edge_rows():
    """Ties (lowest id wins), NaN (never wins), all -inf / all NaN (id 0), +inf, -1 tokens."""
    vocab, batch, row = 30, len(GREEDY_ROWS), GREEDY_ROW
    parents = torch.tensor([EDGE_PARENTS] * batch)
    logits = torch.randn(batch, len(EDGE_PARENTS), vocab, generator=torch.Generator().manual_seed(13))
    tokens = torch.full((batch, len(EDGE_PARENTS)), 2)
    tie, nan, low, inf = row["tie at the root"], row["NaN root"], row["all -inf root, all-NaN child"], \
        row["two +inf at the root"]
    logits[tie, 0, 4] = logits[tie, 0, 7] = logits[tie, 0, 20] = 50.0  # 4 wins
    tokens[tie, 1:4] = torch.tensor([7, 4, 4])  # the second child matches (first in index order)
    logits[nan, 0] = NAN
    logits[nan, 0, 6] = 1.0  # NaN never wins over a number
    tokens[nan, 1:4] = torch.tensor([0, -1, 6])
    logits[low, 0] = -INF  # all -inf: id 0
    tokens[low, 1:4] = torch.tensor([-1, 0, 0])
    logits[low, 1] = NAN  # all NaN: id 0
    logits[inf, 0, 11] = INF
    logits[inf, 0, 12] = INF
    tokens[inf, 1:4] = torch.tensor([12, 11, 3])
    tokens[row["no child can match"], 1:4] = -1
    return logits, tokens, parents


def greedy_edge_answer(got, x):
    out, accepted, nodes = (t.cpu() for t in got)
    level, row = FIRST_LEVEL, GREEDY_ROW
    return (nodes[row["tie at the root"], level] == 2 and nodes[row["NaN root"], level] == 3
            and nodes[row["all -inf root, all-NaN child"], level] == 2
            and nodes[row["two +inf at the root"], level] == 2
            and out[row["all -inf root, all-NaN child"], FIRST_EMITTED] == 0
            and accepted[row["no child can match"]] == 0)


# ---------------------------------------------------------------------------- rejected siblings, exact residual

def many_rejected_siblings():
    """Root: 9 children, the first 7 rejected whatever their coins (p(x) = 0), with NaN / +inf /
    -inf / all-zero entries in their q rows, then one accepted through the residual rule (q(x) = 0 <
    R(x)). Node 8: 4 children (fewer ranks than the root used: rank-table entries must not leak),
    all rejected, then the draw from the residual."""
    vocab, batch = 50, 3
    gen = torch.Generator().manual_seed(41)
    parents = torch.tensor([[-1] + [0] * 9 + [8] * 4] * batch)
    n = parents.shape[1]
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1)
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    tokens[:, 1:8] = torch.arange(1, 8)
    target[:, 0, 1:8] = 0.0
    draft[:, 2, ::5] = NAN
    draft[:, 3, 10] = INF
    draft[:, 4, 11:13] = -INF
    draft[:, 5] = 0.0
    draft[:, 1:9, 31] = 0.0
    tokens[:, 8] = 31
    target[:, 0, 31] = 0.5
    tokens[:, 10:13] = torch.tensor([40, 41, 42])
    target[:, 8, 40:43] = 0.0
    tokens[:, 13] = 43
    target[:, 8, 43] = 0.0
    return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents), gen


def exact_residual_row(accept_side):
    """The later-sibling rule compares (u * q(x)) * S with the exact int64 R(x) (in float64). After
    two rejections R(x) needs more than 24 bits; the third child's coin puts (u * q(x)) * S between
    float32(R(x)) and R(x) (or below both), where rounding R(x) through float32 decides otherwise.
    Returns the inputs and the node the first level must accept (3 or -1)."""
    from ..common.sampling import to_weights

    vocab = 16
    gen = torch.Generator().manual_seed(31)
    parents = torch.tensor([[-1, 0, 0, 0]])
    target = torch.softmax(torch.randn(1, 4, vocab, generator=gen), -1)
    draft = torch.softmax(torch.randn(1, 4, vocab, generator=gen), -1)
    tokens = torch.tensor([[0, 3, 4, 5]])
    target[0, 0, 3:5] = 0.0
    draft[0, 2, 5] = 0.01
    draft[0, 3] *= 0.1
    draft[0, 3, 5] = 0.9
    r_1 = to_weights(target[0, 0] - draft[0, 1])
    s_1 = float(r_1.sum())
    r_2 = (r_1 - torch.floor(s_1 * draft[0, 2].double()).to(torch.int64)).clamp(min=0)
    total, r_x, q_x = int(r_2.sum()), int(r_2[5]), float(draft[0, 3, 5])
    r_32 = float(torch.tensor(float(r_x), dtype=torch.float64).float())
    assert r_32 != r_x and r_x > 0
    lo, hi = sorted((r_32, float(r_x)))
    goal = lo - (hi - lo) if accept_side else (lo + hi) / 2
    u = torch.tensor([[0.5, 0.25, 0.75, goal / (q_x * total)]], dtype=torch.float64)
    product = (u[0, 3].item() * q_x) * total
    assert (product < lo) if accept_side else (lo < product < hi)
    x = dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, uniforms=u)
    return x, (3 if (accept_side or r_32 < r_x) else -1)


# ---------------------------------------------------------------------------- GPU-size adversarial rows

def special_logit_rows(vocab):
    base = -5.0 - torch.arange(vocab, dtype=torch.float32) / vocab
    rows = []
    r = base.clone(); r[vocab - 1] = 10.0; rows.append(r)  # noqa: E702 - max at the last index
    r = base.clone(); r[vocab // 2:] = 10.0; rows.append(r)  # noqa: E702 - tie over every later chunk
    rows.append(torch.full((vocab,), 1.5))  # constant -> 0
    rows.append(torch.full((vocab,), NAN))  # all NaN -> 0
    rows.append(torch.full((vocab,), -INF))  # all -inf -> 0
    r = base.clone(); r[0] = NAN; r[vocab // 3] = INF; r[vocab - 1] = INF; rows.append(r)  # noqa: E702 - first +inf
    r = torch.full((vocab,), -1.0); r[1] = -0.0; r[2] = 0.0; rows.append(r)  # noqa: E702 - -0 ties +0
    r = base.clone(); r[4095] = 7.0; r[4096] = 7.0; rows.append(r)  # noqa: E702 - tie across a chunk edge
    return rows


def adversarial_prob_rows(vocab, gen):
    """(p row, q row for the child, token) triples hitting every fallback of the spec."""
    p = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
    top = int(p.argmax())
    cases = [(p, q, top), (p, p.clone(), top)]
    z = q.clone(); z[top] = 0.0; cases.append((p, z, top))  # noqa: E702
    cases.append((torch.zeros(vocab), q, top))
    cases.append((torch.zeros(vocab), torch.zeros(vocab), 5))
    n = p.clone(); n[top] = NAN; cases.append((n, q, top))  # noqa: E702
    cases.append((torch.full((vocab,), NAN), q, top))
    i = p.clone(); i[vocab // 2] = INF; cases.append((i, q, vocab // 2))  # noqa: E702
    cases.append((p, torch.full((vocab,), NAN), top))
    cases.append((p, torch.full((vocab,), INF), top))
    neg = q.clone(); neg[::2] = -INF; cases.append((p, neg, top))  # noqa: E702
    cases.append((torch.full((vocab,), INF), q, 3))
    cases.append((p * 3.0, q, top))
    cases.append((p, q, -1))
    cases.append((p, q, vocab))
    t = torch.zeros(vocab); t[[7, vocab - 1]] = 0.5; cases.append((t, q, vocab - 1))  # noqa: E702
    return cases

