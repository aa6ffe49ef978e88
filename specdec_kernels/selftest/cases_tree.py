"""The tree verification ops' shapes and cases."""

import torch

from .compare import exact, expect, with_checks
from .inputs import _gen, random_logits, random_parents
from .model import DTYPES, Case


def tree_shapes(profile):
    """(B, N, V) of the tree verification ops."""
    if profile == "tiny":
        return [(2, 7, 40)]
    small = [(1, 8, 1000), (4, 16, 32000)]
    if profile == "quick":
        return small
    return small + [(8, 64, 151936), (64, 16, 151936), (256, 8, 32000)]


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


def tree_cases(profile, device):
    from .. import ops
    from ..reference._sampling import safe_argmax

    outputs = ("output_tokens", "num_accepted", "accepted_nodes")
    cases = []
    for index, (batch, n, vocab) in enumerate(tree_shapes(profile)):
        shape = f"B={batch} N={n} V={vocab}"
        # at "tiny" the generic shape is the graph case only (bfloat16): the crafted cases below cover every
        # dtype and randomness mode there, and the interpreter is slow
        for dtype in ((torch.bfloat16,) if profile == "tiny" else DTYPES):
            graph = index == 0 and dtype == torch.bfloat16

            def greedy_inputs(seed, batch=batch, n=n, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed)
                parents = random_parents(batch, n, seed).to(device)
                logits = random_logits(batch, n, vocab, dtype, gen, device)
                parent_top = safe_argmax(logits).gather(1, parents.clamp(min=0))
                tokens = torch.where(torch.rand(batch, n, generator=gen, device=device) < 0.6, parent_top,
                                     torch.randint(0, vocab, (batch, n), generator=gen, device=device))
                tokens = torch.where(parents < 0, -1, tokens)
                tokens[:, 0] = 0
                return dict(target_logits=logits, tree_tokens=tokens, parents=parents, max_depth=n - 1)

            cases.append(Case("tree_greedy_verify", shape, dtype, greedy_inputs,
                              lambda x, be: ops.tree_greedy_verify(**x, backend=be), exact(outputs), graph))

            def sampling_inputs(seed, batch=batch, n=n, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed)
                parents = random_parents(batch, n, seed).to(device)
                logits = torch.randn(batch, n, vocab, generator=gen, device=device) * 2
                target = torch.softmax(logits, -1)
                draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=gen, device=device), -1)
                # children as a real drafter proposes them: the parent's target argmax, the draft's own
                # argmax (likely accepted), random ids (likely rejected)
                parent = parents.clamp(min=0)
                choice = torch.rand(batch, n, generator=gen, device=device)
                tokens = torch.where(choice < 0.4, safe_argmax(target).gather(1, parent),
                                     torch.where(choice < 0.7, safe_argmax(draft).gather(1, parent),
                                                 torch.randint(0, vocab, (batch, n), generator=gen, device=device)))
                tokens = torch.where(parents < 0, -1, tokens)
                tokens[:, 0] = 0
                return dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype), tree_tokens=tokens,
                            parents=parents, max_depth=n - 1,
                            uniforms=torch.rand(batch, n, generator=gen, device=device, dtype=torch.float64))

            cases.append(Case("tree_rejection_sample", f"{shape} uniforms", dtype, sampling_inputs,
                              lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs), graph))
            def sampled_sibling_inputs(seed, sampling_inputs=sampling_inputs):
                # siblings drawn from the parent's row without replacement (draft row v = the q
                # of v's children), verified with q updated after each rejected sibling
                x = sampling_inputs(seed)
                tokens = sampled_sibling_tokens(x["draft_probs"], x["parents"], _gen(device, seed + 3))
                tokens[:, 0] = 0
                x.update(tree_tokens=tokens, siblings="without_replacement")
                return x

            cases.append(Case("tree_rejection_sample", f"{shape} sampled siblings", dtype, sampled_sibling_inputs,
                              lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs), graph))
            if dtype == torch.float32:
                def seeded(seed, sampling_inputs=sampling_inputs, batch=batch):
                    x = sampling_inputs(seed)
                    del x["uniforms"]
                    x["seed"] = torch.randint(-(2**62), 2**62, (batch,), generator=_gen(device, seed + 1), device=device)
                    x["offsets"] = torch.randint(0, 5000, (batch,), generator=_gen(device, seed + 2), device=device)
                    return x

                cases.append(Case("tree_rejection_sample", f"{shape} per-row seeds", dtype, seeded,
                                  lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs)))

                def seeded_sampled(seed, seeded=seeded, sampled_sibling_inputs=sampled_sibling_inputs):
                    x = seeded(seed)
                    y = sampled_sibling_inputs(seed)
                    x.update(tree_tokens=y["tree_tokens"], siblings="without_replacement")
                    return x

                cases.append(Case("tree_rejection_sample", f"{shape} sampled siblings, per-row seeds", dtype,
                                  seeded_sampled, lambda x, be: ops.tree_rejection_sample(**x, backend=be),
                                  exact(outputs)))
    for op, name, dtype, build, compare in tree_edge_cases(profile, device) + gpu_tree_cases(profile, device):
        cases.append(Case(op, name, dtype, build, run_rejection if op == "tree_rejection_sample" else run_greedy,
                          compare))
    return cases


# ---------------------------------------------------------------------------- the crafted cases
# Shared by the Triton interpreter tests (tiny), the GPU tests and the selftest. At "tiny" some cases
# carry `triton_overrides` (block_v, split, tiles_per_program): the Triton launcher is then called
# with those tiles (many tiles over a small V, each greedy kernel by hand); every other backend, and
# every case at "quick" / "full", runs the op. Cases marked `unvalidated` hold ids the op's CPU checks
# refuse (>= V, < -1: what a GPU call may get): they call the backends' implementations directly.

INF, NAN = float("inf"), float("nan")
OUTPUTS = ("output_tokens", "num_accepted", "accepted_nodes")
MODES = ("uniforms32", "uniforms64", "seed+offsets", "per-row seeds")
WR = "without_replacement"


def _call(op, x, backend, launcher):
    from .. import ops, reference
    from ..common.registry import implementation

    x = dict(x)
    overrides = x.pop("triton_overrides", None)
    unvalidated = x.pop("unvalidated", False)
    if overrides is not None and backend == "triton":
        from ..triton import tree_verify as triton_module

        if implementation(op, "triton") is not getattr(triton_module, op):
            overrides = None  # the registered backend was replaced (a mutation test): judge the registered one
    if (overrides is not None and backend == "triton") or unvalidated:
        if x.get("max_depth") is None:
            x["max_depth"] = reference.max_tree_depth(x["parents"])
        if overrides is not None and backend == "triton":
            from ..triton import tree_verify as triton_module

            return getattr(triton_module, launcher)(**x, **overrides)
        return implementation(op, backend)(**x)
    return getattr(ops, op)(**x, backend=backend)


def run_rejection(x, backend):
    """tree_rejection_sample (the Triton launcher with the case's tiles, or the implementation itself
    for unvalidated ids)."""
    return _call("tree_rejection_sample", x, backend, "_launch_rejection")


def run_greedy(x, backend):
    return _call("tree_greedy_verify", x, backend, "_launch_greedy")


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


def greedy_tokens(logits, tokens, parents, gen):
    """About half of the used nodes carry their parent's argmax, so walks go deep."""
    from ..reference._sampling import safe_argmax

    top1 = safe_argmax(logits).gather(1, parents.clamp(min=0))
    force = (torch.rand(tokens.shape, generator=gen) < 0.6) & (parents >= 0)
    return torch.where(force, top1, tokens)


def structure(got, x):
    """Emitted tokens (up to num_accepted) in [0, V), -1 after; int64 outputs."""
    out, accepted, _ = got
    vocab = (x.get("target_probs") if x.get("target_probs") is not None else x["target_logits"]).shape[-1]
    if out.dtype != torch.int64 or accepted.dtype != torch.int64:
        return False
    emitted = torch.arange(out.shape[1], device=out.device).unsqueeze(0) <= accepted.unsqueeze(1)
    return bool(((out >= 0) & (out < vocab))[emitted].all()) and bool((out[~emitted] == -1).all())


def _on(device, x):
    """Every tensor of x on `device` (python values stay)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}


EDGE_PARENTS = [-1, 0, 0, 0, 1, 1, 2, -1]  # three root children, two grandchildren under 1, one under 2, an unused slot


def edge_rows(dtype):
    """One crafted row per edge case of tree_rejection_sample (V = 40, N = 8, 9 rows)."""
    vocab, n = 40, len(EDGE_PARENTS)
    gen = torch.Generator().manual_seed(11)
    batch = 9
    parents = torch.tensor([EDGE_PARENTS] * batch)
    target, draft, tokens, _ = make_tree(batch, n, vocab, torch.float32, gen, parents=parents)
    target, draft = target.clone(), draft.clone()
    at_parent = lambda x, b: x[b, parents[b].clamp(min=0)]  # noqa: E731
    # 0: p == q for every child and tokens on a zero-mass id: rejected, empty residual -> draw from p
    target[0, :, 5] = 0.0
    draft[0] = at_parent(target, 0)
    tokens[0, 1:7] = 5
    # 1: q == 0 < p at the drafted tokens: the first child is accepted whatever the coin
    draft[1, :, 9] = 0.0
    target[1, :, 9] = 0.25
    tokens[1, 1:7] = 9
    # 2: all-zero target row at the root: every child rejected, residual and p empty -> id 0
    target[2, 0] = 0.0
    # 3: NaN target at the root, NaN / inf in the children's q
    target[3, 0] = NAN
    draft[3, 1, ::3] = NAN
    draft[3, 2, 4] = INF
    draft[3, 3, :] = -INF
    # 4: the first child rejected (p(x) = 0); the second child's q has +inf at its token and NaN entries
    target[4, 0, tokens[4, 1]] = 0.0
    draft[4, 2, tokens[4, 2]] = INF
    draft[4, 2, 1::4] = NAN
    # 5: one-hot target, distinct deterministic drafts with one-hot q (top-k siblings): the third hits
    target[5] = 0.0
    target[5, :, 17] = 1.0
    draft[5] = 0.0
    draft[5, torch.arange(1, 7), torch.tensor([3, 4, 17, 17, 2, 17])] = 1.0
    tokens[5, 1:7] = torch.tensor([3, 4, 17, 17, 2, 17])
    # 6: -1 tokens on used nodes (rejected, the residual still updated) and an all-zero q row
    tokens[6, 1] = -1
    tokens[6, 3] = -1
    draft[6, 2] = 0.0
    # 7: negative values, subnormals and a residual with mass only at the last id
    target[7, 0] = 0.0
    target[7, 0, vocab - 1] = 0.5
    target[7, 0, 3] = -0.5
    target[7, 1, 20:30] = 1e-30 if dtype == torch.float32 else 1e-7
    draft[7, 1:4] = 0.01
    # 8: duplicate tokens among siblings; +inf entries in p at drafted tokens and in a bonus row
    tokens[8, 1:4] = tokens[8, 1]
    draft[8, 1:4] = draft[8, 1]
    target[8, 0, tokens[8, 1]] = INF
    target[8, 1, tokens[8, 4]] = INF
    target[8, 4, 30:33] = INF
    return dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype), tree_tokens=tokens, parents=parents)


def edge_rows_answer(got, x):
    """What the crafted rows must give (every backend, every randomness mode)."""
    out, accepted, nodes = (t.cpu() for t in got)
    target = x["target_probs"].cpu()
    return (nodes[1, 1] == 1 and out[1, 0] == 9 and accepted[2] == 0 and out[2, 0] == 0 and accepted[3] == 0
            and out[3, 0] == 0 and nodes[5, 1] == 3 and out[5, 0] == 17 and accepted[0] == 0
            and bool(target[0, 0, out[0, 0]] > 0) and nodes[8, 1:].tolist() == [1, 4])


def greedy_edge_rows():
    """Ties (lowest id wins), NaN (never wins), all -inf / all NaN (id 0), +inf, -1 tokens."""
    vocab = 30
    parents = torch.tensor([EDGE_PARENTS] * 5)
    logits = torch.randn(5, len(EDGE_PARENTS), vocab, generator=torch.Generator().manual_seed(13))
    tokens = torch.full((5, len(EDGE_PARENTS)), 2)
    logits[0, 0, 4] = logits[0, 0, 7] = logits[0, 0, 20] = 50.0  # tie at the root: 4 wins
    tokens[0, 1:4] = torch.tensor([7, 4, 4])  # the second child matches (first in index order)
    logits[1, 0] = NAN
    logits[1, 0, 6] = 1.0  # NaN never wins over a number
    tokens[1, 1:4] = torch.tensor([0, -1, 6])
    logits[2, 0] = -INF  # all -inf: id 0
    tokens[2, 1:4] = torch.tensor([-1, 0, 0])
    logits[2, 1] = NAN  # all NaN: id 0
    logits[3, 0, 11] = INF
    logits[3, 0, 12] = INF
    tokens[3, 1:4] = torch.tensor([12, 11, 3])
    tokens[4, 1:4] = -1  # no child can match
    return logits, tokens, parents


def greedy_edge_answer(got, x):
    out, accepted, nodes = (t.cpu() for t in got)
    return (nodes[0, 1] == 2 and nodes[1, 1] == 3 and nodes[2, 1] == 2 and nodes[3, 1] == 2 and out[2, 0] == 0
            and accepted[4] == 0)


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
    from ..reference._sampling import to_weights

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


def high_coins(batch, n, gen, dtype=torch.float64):
    return (torch.rand(batch, n, generator=gen, dtype=torch.float64) ** 0.25).to(dtype)


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def tree_edge_cases(profile, device):
    """(op, name, dtype, build(seed), compare) of the crafted tree verification cases. Their inputs
    are fixed (the seed only matters where a case says so): each reproduces a former test instance."""
    tiny = profile == "tiny"
    base = exact(OUTPUTS)
    shape_check = expect("emitted tokens in [0, V) and -1 after them", structure)
    cases = []

    def add(op, name, dtype, make, *checks, overrides=None):
        def build(seed):
            x = make()
            if tiny and overrides is not None:
                x["triton_overrides"] = overrides
            return _on(device, x)
        cases.append((op, name, dtype, build, with_checks(base, shape_check, *checks)))

    # random trees: every dtype, V in {1, 37, 300}, a ragged batch, every randomness mode, depth cuts;
    # greedy through the op and (tiny) each of its two kernels by hand
    for vocab in (1, 37, 300):
        for dtype in DTYPES:
            def tree(vocab=vocab, dtype=dtype):
                gen = torch.Generator().manual_seed(vocab)
                target, draft, tokens, parents = make_tree(4, 9, vocab, dtype, gen)
                parents[1, 5:] = -1  # row 1: a smaller tree padded with unused slots
                tokens[1, 5:] = -1
                return gen, dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents)

            for i, mode in enumerate(MODES):
                for cut in ((None, 1) if i % 2 == 0 else (None,)):
                    def make(tree=tree, i=i, cut=cut):
                        gen, x = tree()
                        return dict(x, max_depth=cut, **randomness(4, 9, gen)[i])

                    add("tree_rejection_sample", f"random trees B=4 N=9 V={vocab} ragged {mode}"
                        + ("" if cut is None else f" max_depth={cut}"), dtype, make)

            for cut in (None, 0, 1):
                for split in ((None, True, False) if tiny else (None,)):
                    def make(tree=tree, cut=cut):
                        gen, x = tree()
                        randomness(4, 9, gen)  # the generator's state after drawing the modes, as before
                        logits = torch.log(x["target_probs"].float() + 1e-3).to(x["target_probs"].dtype)
                        return dict(target_logits=logits, tree_tokens=greedy_tokens(logits, x["tree_tokens"],
                                                                                    x["parents"], gen),
                                    parents=x["parents"], max_depth=cut)

                    add("tree_greedy_verify", f"random trees B=4 N=9 V={vocab} ragged max_depth={cut}"
                        + ("" if split is None else f" split={split}"), dtype, make,
                        overrides=None if split is None else dict(split=split))

    # small tiles: BLOCK_V = 16 over V in {7, 300}: the residual passes and the int64 cdf cross tiles
    for vocab in (7, 300):
        def small(vocab=vocab):
            gen = torch.Generator().manual_seed(vocab + 1)
            target, draft, tokens, parents = make_tree(3, 7, vocab, torch.float32, gen, zero_frac=0.6)
            return gen, dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents)

        for i in (1, 2, 3):
            add("tree_rejection_sample", f"16-wide tiles V={vocab} {MODES[i]}", torch.float32,
                lambda small=small, i=i: (lambda g, x: dict(x, **randomness(3, 7, g)[i]))(*small()),
                overrides=dict(block_v=16))
        for split in ((True, False) if tiny else (None,)):
            def make(small=small):
                gen, x = small()
                randomness(3, 7, gen)
                logits = torch.randn(3, 7, x["target_probs"].shape[-1], generator=gen)
                return dict(target_logits=logits, tree_tokens=greedy_tokens(logits, x["tree_tokens"], x["parents"],
                                                                            gen), parents=x["parents"], max_depth=3)

            add("tree_greedy_verify", f"16-wide tiles V={vocab} one tile per program"
                + ("" if split is None else f" split={split}"), torch.float32, make,
                overrides=None if split is None else dict(split=split, block_v=16, tiles_per_program=1))

    # a star: every node a child of the root, q far from p: siblings rejected one after the other
    for i, mode in enumerate(MODES):
        def star(i=i):
            batch, n, vocab = 6, 8, 24
            gen = torch.Generator().manual_seed(21)
            parents = torch.tensor([[-1] + [0] * (n - 1)] * batch)
            target, _, _, _ = make_tree(batch, n, vocab, torch.float32, gen, zero_frac=0.5, parents=parents)
            draft = torch.softmax(3 * torch.randn(batch, n, vocab, generator=gen), -1)
            tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
            return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents,
                        **randomness(batch, n, gen)[i])

        add("tree_rejection_sample", f"star of 7 siblings far from p {mode}", torch.float32, star)

    # the later-sibling rule reads the exact int64 residual (not one rounded through float32)
    for accept_side in (False, True):
        x, node = exact_residual_row(accept_side)
        add("tree_rejection_sample", f"exact residual, coin {'below both' if accept_side else 'between'} "
            "float32(R) and R", torch.float32, lambda x=x: dict(x),
            expect(f"first level accepts node {node}", lambda got, x, node=node: int(got[2][0, 1]) == node))

    # empty batch; the root alone (the bonus from p; max_depth beyond the tree pads with -1)
    empty = torch.zeros(0, 3, dtype=torch.int64)
    add("tree_rejection_sample", "B=0", torch.float32,
        lambda: dict(target_probs=torch.rand(0, 3, 10), draft_probs=torch.rand(0, 3, 10), tree_tokens=empty,
                     parents=empty - 1, seed=1, max_depth=2))
    add("tree_greedy_verify", "B=0", torch.float32,
        lambda: dict(target_logits=torch.rand(0, 3, 10), tree_tokens=empty, parents=empty - 1, max_depth=2))
    for cut in (None, 2):
        for i, mode in enumerate(MODES):
            def root(i=i, cut=cut):
                gen = torch.Generator().manual_seed(3)
                target, draft, tokens, parents = make_tree(3, 1, 50, torch.bfloat16, gen)
                return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents,
                            max_depth=cut, **randomness(3, 1, gen)[i])

            add("tree_rejection_sample", f"N=1 (root only) {mode}" + ("" if cut is None else f" max_depth={cut}"),
                torch.bfloat16, root, expect("nothing accepted, node 0 first",
                                             lambda got, x: got[1].tolist() == [0, 0, 0]
                                             and got[2][:, 0].tolist() == [0, 0, 0]))

        def root_greedy(cut=cut):
            gen = torch.Generator().manual_seed(3)
            _, _, tokens, parents = make_tree(3, 1, 50, torch.bfloat16, gen)
            return dict(target_logits=torch.randn(3, 1, 50, generator=gen), tree_tokens=tokens, parents=parents,
                        max_depth=cut)

        add("tree_greedy_verify", "N=1 (root only)" + ("" if cut is None else f" max_depth={cut}"), torch.float32,
            root_greedy)

    # max_depth + 1 wider than BLOCK_N: the output tail padded by the store loop
    for i in (1, 2):
        def deep(i=i):
            gen = torch.Generator().manual_seed(4)
            target, draft, tokens, parents = make_tree(2, 3, 12, torch.float32, gen, unused_frac=0.0)
            return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, max_depth=9,
                        **randomness(2, 3, gen)[i])

        add("tree_rejection_sample", f"max_depth=9 past BLOCK_N {MODES[i]}", torch.float32, deep,
            expect("[2, 10] outputs, -1 from column 4", lambda got, x: tuple(got[0].shape) == (2, 10)
                   and bool((got[0][:, 4:] == -1).all()) and bool((got[2][:, 4:] == -1).all())))

    def deep_greedy():
        gen = torch.Generator().manual_seed(4)
        _, _, tokens, parents = make_tree(2, 3, 12, torch.float32, gen, unused_frac=0.0)
        randomness(2, 3, gen)
        return dict(target_logits=torch.randn(2, 3, 12, generator=gen), tree_tokens=tokens, parents=parents,
                    max_depth=9)

    add("tree_greedy_verify", "max_depth=9 past BLOCK_N", torch.float32, deep_greedy)

    # one crafted row per edge case, every dtype and randomness mode, coins at exactly 0 and at the largest u
    for dtype in DTYPES:
        modes = list(MODES) + ["uniforms all 0", "uniforms 1 - 2^-53"]
        for i, mode in enumerate(modes):
            for cut in ((None, 0, 1) if i in (1, 2) else (None,)):
                def rows(dtype=dtype, i=i, cut=cut):
                    x = edge_rows(dtype)
                    batch, n = x["tree_tokens"].shape
                    gen = torch.Generator().manual_seed(12)
                    all_modes = randomness(batch, n, gen) + [
                        dict(uniforms=torch.zeros(batch, n)),
                        dict(uniforms=torch.full((batch, n), 1.0 - 2**-53, dtype=torch.float64))]
                    return dict(x, max_depth=cut, **all_modes[i])

                checks = (expect("the crafted rows' known answers", edge_rows_answer),) if cut is None else ()
                add("tree_rejection_sample", f"edge rows (zero/NaN/inf/negative/one-hot/duplicate) {mode}"
                    + ("" if cut is None else f" max_depth={cut}"), dtype, rows, *checks)
        for cut in (None, 1):
            add("tree_greedy_verify", "edge rows (ties, NaN, all -inf, all NaN, +inf, -1 tokens)"
                + ("" if cut is None else f" max_depth={cut}"), dtype,
                lambda dtype=dtype, cut=cut: (lambda lg, tk, pa: dict(target_logits=lg.to(dtype), tree_tokens=tk,
                                                                       parents=pa, max_depth=cut))(*greedy_edge_rows()),
                *((expect("the crafted rows' known answers", greedy_edge_answer),) if cut is None else ()))
        for split in ((True, False) if tiny else ()):  # BLOCK_V = 16: ties, all -inf and NaN rows over two tiles
            add("tree_greedy_verify", f"edge rows over 16-wide tiles split={split}", dtype,
                lambda dtype=dtype: (lambda lg, tk, pa: dict(target_logits=lg.to(dtype), tree_tokens=tk, parents=pa,
                                                              max_depth=2))(*greedy_edge_rows()),
                overrides=dict(split=split, block_v=16, tiles_per_program=1))

    # ids >= V or < -1 (a GPU does not validate values): they read nothing and are rejected / never match
    def out_of_range():
        gen = torch.Generator().manual_seed(14)
        target, draft, tokens, parents = make_tree(3, 6, 20, torch.float32, gen, unused_frac=0.0)
        tokens[:, 1:] = torch.tensor([[20, 0, 2**40, -7, 5], [-2**62, 20, 21, 3, 3], [1, 2, 3, 4, 2**33]])
        tokens[:, 0] = torch.tensor([-5, 99, 2**50])  # the root's entry is ignored
        return gen, dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, unvalidated=True)

    for i in (1, 2, 3):
        add("tree_rejection_sample", f"ids >= V and < -1 {MODES[i]}", torch.float32,
            lambda i=i: (lambda g, x: dict(x, **randomness(3, 6, g)[i]))(*out_of_range()))
    for split in ((None, True, False) if tiny else (None,)):
        def make():
            gen, x = out_of_range()
            randomness(3, 6, gen)
            return dict(target_logits=torch.randn(3, 6, 20, generator=gen), tree_tokens=x["tree_tokens"],
                        parents=x["parents"], unvalidated=True)

        add("tree_greedy_verify", "ids >= V and < -1" + ("" if split is None else f" split={split}"), torch.float32,
            make, overrides=None if split is None else dict(split=split))

    # strided inputs: a batch stride past the rows, node-major storage, transposed index tensors
    for dtype in DTYPES:
        def strided(dtype=dtype):
            batch, n, vocab = 3, 6, 30
            gen = torch.Generator().manual_seed(2)
            target, draft, tokens, parents = make_tree(batch, n, vocab, dtype, gen)
            big = torch.zeros(batch, n + 2, vocab, dtype=dtype)
            big[:, 1:n + 1] = target
            u = coins(batch, n, gen).t().contiguous().t()
            seeds = torch.randint(0, 2**40, (2 * batch,), generator=gen)[::2]
            offsets = torch.tensor([5, 0, 9, 0, 2**33, 0])[::2]
            return dict(target_probs=big[:, 1:n + 1], draft_probs=draft.transpose(0, 1).contiguous().transpose(0, 1),
                        tree_tokens=tokens.t().contiguous().t(), parents=parents.t().contiguous().t()), u, seeds, \
                offsets

        add("tree_rejection_sample", "strided inputs uniforms", dtype,
            lambda strided=strided: (lambda x, u, s, o: dict(x, uniforms=u))(*strided()))
        add("tree_rejection_sample", "strided inputs strided seeds and offsets", dtype,
            lambda strided=strided: (lambda x, u, s, o: dict(x, seed=s, offsets=o))(*strided()))
        add("tree_greedy_verify", "strided inputs", dtype,
            lambda strided=strided: (lambda x, u, s, o: dict(target_logits=x["target_probs"],
                                                             tree_tokens=x["tree_tokens"],
                                                             parents=x["parents"]))(*strided()))

    # the residual recomputed after many rejected siblings at two levels (no [B, V] scratch)
    for i, mode in enumerate(list(MODES) + ["uniforms all 0"]):
        for block_v in ((16, None) if tiny else (None,)):
            def many(i=i):
                x, gen = many_rejected_siblings()
                batch, n = x["tree_tokens"].shape
                return dict(x, **(randomness(batch, n, gen) + [dict(uniforms=torch.zeros(batch, n))])[i])

            add("tree_rejection_sample", f"9 + 4 siblings, 7 + 4 rejected {mode}"
                + ("" if block_v is None else f" block_v={block_v}"), torch.float32, many,
                expect("node 8 accepted at the first level, one accepted", lambda got, x: got[2][:, 1].tolist()
                       == [8] * 3 and got[1].tolist() == [1] * 3),
                overrides=None if block_v is None else dict(block_v=block_v))

    # siblings="without_replacement": trees whose children really are draws without replacement
    for dtype in DTYPES:
        def wr_tree(dtype=dtype):
            gen = torch.Generator().manual_seed(1)
            target, draft, tokens, parents = sampled_tree(4, 9, 37, dtype, gen)
            parents[1, 5:] = -1
            tokens[1, 5:] = -1
            return gen, dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, siblings=WR)

        for i, mode in enumerate(("high uniforms32", "high uniforms64", "seed+offsets", "per-row seeds")):
            for cut in ((None, 1) if i % 2 == 0 else (None,)):
                def make(wr_tree=wr_tree, i=i, cut=cut):
                    gen, x = wr_tree()
                    modes = [dict(uniforms=high_coins(4, 9, gen, torch.float32)), dict(uniforms=high_coins(4, 9, gen))]
                    modes += randomness(4, 9, gen)[2:]
                    return dict(x, max_depth=cut, **modes[i])

                add("tree_rejection_sample", f"sampled siblings B=4 N=9 V=37 ragged {mode}"
                    + ("" if cut is None else f" max_depth={cut}"), dtype, make)

    def wr_star(i):
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
        modes = [dict(uniforms=high_coins(batch, n, gen)), dict(seed=7),
                 dict(seed=torch.arange(batch) * 3 - 5, offsets=torch.arange(batch, dtype=torch.int32))]
        return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, siblings=WR,
                    **modes[i])

    for i, mode in enumerate(("high uniforms64", "seed", "int32 offsets")):
        add("tree_rejection_sample", f"sampled siblings: 7 and 3 and 2 far from p {mode}"
            + (" block_v=16" if tiny else ""), torch.float32, lambda i=i: wr_star(i), overrides=dict(block_v=16))

    for i, mode in enumerate(("high uniforms64", "seed")):
        def wr_edges(i=i):
            gen = torch.Generator().manual_seed(3)
            target, draft, tokens, parents = sampled_tree(6, 7, 19, torch.float32, gen, odd_frac=0.3)
            target[0, 0] = NAN
            draft[1, 0] = NAN
            target[2, 0] = 0.0
            draft[3, 0] = 0.0
            draft[4, 0, :5] = INF
            target[5, 0, :5] = -INF
            draft[5, 0, 5:9] = 2.0
            tokens[:, 2] = tokens[:, 1]  # a repeated sibling where both hang off one parent
            modes = [dict(uniforms=high_coins(6, 7, gen)), dict(seed=11)]
            return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens, parents=parents, siblings=WR,
                        **modes[i])

        add("tree_rejection_sample", f"sampled siblings: NaN/inf/zero/negative rows, repeats {mode}",
            torch.float32, wr_edges)

    for index_dtype in (torch.int32, torch.int64):
        for i, mode in enumerate(("high uniforms64", "per-row seeds and offsets")):
            def wr_strided(index_dtype=index_dtype, i=i):
                gen = torch.Generator().manual_seed(4)
                batch, n, vocab = 3, 8, 23
                target, draft, tokens, parents = sampled_tree(batch, n, vocab, torch.float16, gen)
                wide_tokens = torch.zeros(batch, 2 * n, dtype=index_dtype)
                wide_tokens[:, ::2] = tokens
                wide_parents = torch.zeros(batch, 2 * n, dtype=index_dtype)
                wide_parents[:, ::2] = parents
                modes = [dict(uniforms=high_coins(batch, n, gen)),
                         dict(seed=torch.tensor([5, -6, 7], dtype=index_dtype),
                              offsets=torch.tensor([1, 2, 3], dtype=index_dtype))]
                return dict(target_probs=target, draft_probs=draft, tree_tokens=wide_tokens[:, ::2],
                            parents=wide_parents[:, ::2], siblings=WR, **modes[i])

            add("tree_rejection_sample", f"sampled siblings: strided {_dtype_name(index_dtype)} indices {mode}",
                torch.float16, wr_strided)
    return cases


# ---------------------------------------------------------------------------- GPU-size cases
# The GPU tests' instances (quick: a slice, full: all): random trees with garbage tokens in unused
# slots and out-of-range ids (unvalidated: a GPU call does not inspect values), depth cuts below and
# past the tree, adversarial logit and probability rows, wide trees with long rejection chains,
# non-contiguous inputs and sampled siblings at production vocabularies.

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


def gpu_randomness(mode, batch, n, gen, device):
    if mode == "uniforms32":
        return {"uniforms": torch.rand(batch, n, generator=gen).to(device)}
    if mode == "uniforms64":
        return {"uniforms": torch.rand(batch, n, generator=gen, dtype=torch.float64).to(device)}
    offsets = torch.randint(0, 5000, (batch,), generator=gen).to(device)
    if mode == "seed+offsets":
        return {"seed": int(torch.randint(-(2**62), 2**62, (1,), generator=gen)), "offsets": offsets}
    return {"seed": torch.randint(-(2**62), 2**62, (batch,), generator=gen).to(device), "offsets": offsets}


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


def gpu_tree_cases(profile, device):
    """(op, name, dtype, build(seed), compare) at GPU sizes (empty at "tiny")."""
    from ..reference._sampling import safe_argmax

    if profile == "tiny":
        return []
    full = profile == "full"
    base = exact(OUTPUTS)
    cases = []
    batches, vocabs = ((1, 4, 16), (32000, 128256)) if full else ((4,), (32000,))
    for dtype in DTYPES:
        for vocab in vocabs:
            for batch in batches:
                for n in (1, 2, 9, 32):
                    for cut in ((None, 0, 1, 3, n + 4) if n == 9 else (None,)):
                        def greedy(seed, dtype=dtype, vocab=vocab, batch=batch, n=n, cut=cut):
                            gen = torch.Generator().manual_seed(vocab + 17 * batch + n + seed)
                            parents = biased_parents(batch, n, gen)
                            logits = random_logits(batch, n, vocab, dtype, _gen(device, vocab + batch + n + seed),
                                                   device)
                            tokens = garbage_tokens(parents, safe_argmax(logits), vocab, gen)
                            return dict(target_logits=logits, tree_tokens=tokens.to(device), parents=parents.to(device),
                                        max_depth=cut, unvalidated=True)

                        cases.append(("tree_greedy_verify", f"B={batch} N={n} V={vocab} garbage and out-of-range ids"
                                      + ("" if cut is None else f" max_depth={cut}"), dtype, greedy, base))
                    for mode in MODES:
                        for cut in ((None, 0, 2, n + 3) if n == 9 else (None,)):
                            def rejection(seed, dtype=dtype, vocab=vocab, batch=batch, n=n, cut=cut, mode=mode):
                                gen = torch.Generator().manual_seed(vocab + 31 * batch + n + seed)
                                parents = biased_parents(batch, n, gen)
                                dgen = _gen(device, vocab + batch + n + seed)
                                logits = torch.randn(batch, n, vocab, generator=dgen, device=device) * 2
                                target = torch.softmax(logits, -1)
                                draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=dgen,
                                                                           device=device), -1)
                                tokens = garbage_tokens(parents, safe_argmax(target), vocab, gen, match_frac=0.3)
                                top_q = safe_argmax(draft).cpu()
                                own = (torch.rand(batch, n, generator=gen) < 0.3) & (parents >= 0)
                                own[:, 0] = False
                                tokens = torch.where(own, top_q, tokens)
                                return dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype),
                                            tree_tokens=tokens.to(device), parents=parents.to(device), max_depth=cut,
                                            unvalidated=True, **gpu_randomness(mode, batch, n, gen, device))

                            cases.append(("tree_rejection_sample", f"B={batch} N={n} V={vocab} garbage ids {mode}"
                                          + ("" if cut is None else f" max_depth={cut}"), dtype, rejection, base))
        for vocab in vocabs:
            def adversarial_greedy(seed, dtype=dtype, vocab=vocab):
                gen = torch.Generator().manual_seed(vocab + 2 + seed)
                rows = special_logit_rows(vocab)
                batch, n = len(rows), 12
                parents = biased_parents(batch, n, gen, unused_frac=0.1)
                logits = torch.stack([torch.stack([rows[(b + i) % len(rows)] for i in range(n)])
                                      for b in range(batch)]).to(dtype)
                tokens = garbage_tokens(parents, safe_argmax(logits), vocab, gen, match_frac=0.6, bad_frac=0.2)
                return _on(device, dict(target_logits=logits, tree_tokens=tokens, parents=parents, unvalidated=True))

            cases.append(("tree_greedy_verify", f"adversarial rows (ties across chunks, NaN, inf, -0) V={vocab}",
                          dtype, adversarial_greedy, base))
            for mode in MODES:
                def adversarial(seed, dtype=dtype, vocab=vocab, mode=mode):
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
                    x = dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype), tree_tokens=tokens,
                             parents=parents, unvalidated=True)
                    return dict(_on(device, x), **gpu_randomness(mode, batch, n, gen, device))

                cases.append(("tree_rejection_sample", f"adversarial rows (every fallback) V={vocab} {mode}",
                              dtype, adversarial, base))
            for mode in (MODES if vocab == vocabs[0] else ()):  # V = 32000 only
                for siblings in ("independent", WR):
                    def wide(seed, dtype=dtype, mode=mode, siblings=siblings):
                        """Root with 10 children, node 1 with 8, the rest under node 2: long rejection chains with
                        i.i.d.-style drafts (shared q) and one-hot (top-k) drafts; NaN / inf / zero rows."""
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
                            target[0, 0] = NAN
                            draft[1, 0] = NAN
                            target[2, 0] = 0.0
                            draft[3, 0] = 0.0
                            draft[4, 0, :100] = INF
                            tokens[5, 2] = tokens[5, 1]
                        else:
                            for b in range(batch):
                                for node in range(n):
                                    kids = (parents[b] == node).nonzero().flatten().tolist()
                                    if not kids:
                                        continue
                                    if b % 2:  # deterministic top-k children with one-hot q, worst first
                                        top = torch.topk(target[b, node], len(kids)).indices.tolist()[::-1]
                                        for kid, tok in zip(kids, top):
                                            tokens[b, kid] = tok
                                            draft[b, kid] = 0.0
                                            draft[b, kid, tok] = 1.0
                                    else:  # siblings share one q and draw from it
                                        draft[b, kids] = draft[b, kids[0]].clone()
                                        tokens[b, kids] = torch.multinomial(draft[b, kids[0]], len(kids),
                                                                            replacement=True, generator=gen)
                        tokens[:, 0] = 0
                        x = dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype), tree_tokens=tokens,
                                 parents=parents, siblings=siblings)
                        return dict(_on(device, x), **gpu_randomness(mode, batch, n, gen, device))

                    kind = "sampled siblings, NaN/inf/zero rows, repeats" if siblings == WR else \
                        "shared-q and one-hot top-k drafts"
                    cases.append(("tree_rejection_sample", f"wide trees 10/8/5 siblings V=32000 {kind} {mode}", dtype,
                                  wide, base))
    for dtype in DTYPES:  # sampled siblings (children drawn without replacement) at production vocabularies
        for batch, n, vocab in (((1, 7, 1000), (4, 12, 32000), (16, 32, 128256)) if full else ((4, 12, 32000),)):
            for mode in MODES:
                for cut in (None, 1, n + 3):
                    def sampled(seed, dtype=dtype, batch=batch, n=n, vocab=vocab, mode=mode, cut=cut):
                        gen = torch.Generator().manual_seed(41 + MODES.index(mode) + seed)
                        parents = biased_parents(batch, n, gen)
                        dgen = _gen(device, 41 + seed)
                        logits = torch.randn(batch, n, vocab, generator=dgen, device=device)
                        target = torch.softmax(logits, -1).to(dtype)
                        draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=dgen, device=device),
                                              -1).to(dtype)
                        tokens = sampled_sibling_tokens(draft, parents.to(device), _gen(device, 42 + seed))
                        odd = (torch.rand(batch, n, generator=gen) < 0.05) & (parents >= 0)
                        noise = torch.randint(0, vocab, (batch, n), generator=gen).to(device)
                        tokens = torch.where(odd.to(device), noise, tokens)
                        return dict(target_probs=target, draft_probs=draft, tree_tokens=tokens,
                                    parents=parents.to(device), max_depth=cut, siblings=WR,
                                    **gpu_randomness(mode, batch, n, gen, device))

                    cases.append(("tree_rejection_sample", f"sampled siblings B={batch} N={n} V={vocab} {mode}"
                                  + ("" if cut is None else f" max_depth={cut}"), dtype, sampled, base))
    for mode in ("uniforms32", "per-row seeds"):
        def strided_rejection(seed, mode=mode):
            gen = torch.Generator().manual_seed(8 + seed)
            batch, n, vocab = 5, 9, 32000
            dgen = _gen(device, 8 + seed)
            logits = torch.randn(batch, n + 1, vocab + 1, generator=dgen, device=device) * 2
            target = torch.softmax(logits, -1).half()[:, 1:, 1:]  # unaligned, strided views
            draft = torch.softmax(logits + torch.randn(logits.shape, generator=dgen, device=device), -1).half()[:, :n,
                                                                                                                :vocab]
            parents = biased_parents(batch, n, gen)
            tokens = garbage_tokens(parents, safe_argmax(target), vocab, gen, match_frac=0.3)
            wide = torch.stack([tokens, tokens], dim=2).reshape(batch, 2 * n).to(device)
            rnd = gpu_randomness(mode, batch, n, gen, device)
            if "uniforms" in rnd:
                rnd["uniforms"] = torch.cat([rnd["uniforms"], rnd["uniforms"]], dim=1)[:, :n]
            else:
                rnd["seed"] = torch.stack([rnd["seed"], rnd["seed"]], dim=1)[:, 0]
                rnd["offsets"] = torch.stack([rnd["offsets"], rnd["offsets"]], dim=1)[:, 1]
            return dict(target_probs=target, draft_probs=draft, tree_tokens=wide[:, ::2],
                        parents=parents.t().contiguous().to(device).t(), unvalidated=True, **rnd)

        cases.append(("tree_rejection_sample", f"non-contiguous unaligned inputs V=32000 {mode}", torch.float16,
                      strided_rejection, base))

    def strided_greedy(seed):
        gen = torch.Generator().manual_seed(3 + seed)
        batch, n, vocab = 4, 10, 32001
        big = random_logits(batch, n + 2, vocab + 1, torch.float16, _gen(device, 3 + seed), device)
        logits = big[:, 1:n + 1, 1:]  # unaligned rows: the scalar path
        parents = biased_parents(batch, n, gen)
        tokens = garbage_tokens(parents, safe_argmax(logits), vocab, gen)
        wide = torch.stack([tokens, tokens], dim=2).reshape(batch, 2 * n).to(device)
        return dict(target_logits=logits, tree_tokens=wide[:, ::2], parents=parents.t().contiguous().to(device).t(),
                    unvalidated=True)

    cases.append(("tree_greedy_verify", "non-contiguous unaligned logits V=32001", torch.float16, strided_greedy, base))

    def out_of_range_children(seed):
        vocab, batch = 1000, 3
        return dict(target_logits=torch.full((batch, 4, vocab), NAN, device=device),  # argmax 0 everywhere
                    parents=torch.tensor([[-1, 0, 0, 0]] * batch, device=device),
                    tree_tokens=torch.tensor([[0, -1, vocab, 0], [0, 2**40, -vocab, 5], [7, 0, 0, 0]], device=device),
                    max_depth=1, unvalidated=True)

    cases.append(("tree_greedy_verify", "out-of-range children never match", torch.float32, out_of_range_children,
                  with_checks(base, expect("accepted [1, 0, 1], first nodes [3, -1, 1]",
                                           lambda got, x: got[1].tolist() == [1, 0, 1]
                                           and got[2][:, 1].tolist() == [3, -1, 1]))))
    return cases
