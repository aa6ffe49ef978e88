"""GPU tests of the CUDA tree_greedy_verify / tree_rejection_sample (csrc/tree_verify.cu).

Every test runs the public op with backend="cuda" and backend="torch" (the reference)
on the same GPU tensors and asks for bit-identical outputs; chain-shaped trees must also
reproduce the chain ops. Everything skips cleanly without CUDA or without a built _C.
"""

import pytest

torch = pytest.importorskip("torch")

from gpu_support import CUDA_KERNEL_MARKS, _C  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.reference import chain_parents  # noqa: E402
from specdec_kernels.reference._sampling import safe_argmax  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = lambda d: str(d).split(".")[-1]  # noqa: E731
NAN, INF = float("nan"), float("inf")
RANDOMNESS = ["uniforms32", "uniforms64", "seed", "seeds"]


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------
def random_parents(B, N, gen, unused_frac=0.25):
    """Valid random trees: node i > 0 is unused (-1) or a child of an earlier used node."""
    parents = torch.full((B, N), -1, dtype=torch.int64)
    for b in range(B):
        used = [0]
        for i in range(1, N):
            if float(torch.rand(1, generator=gen)) < unused_frac:
                continue
            # bias towards recent nodes so that trees get deep as well as wide
            if float(torch.rand(1, generator=gen)) < 0.6:
                pick = used[-1 - int(torch.randint(0, min(len(used), 3), (1,), generator=gen))]
            else:
                pick = used[int(torch.randint(0, len(used), (1,), generator=gen))]
            parents[b, i] = pick
            used.append(i)
    return parents


def bad_token(V, gen):
    choices = [-1, V, V + 3, -V, 2**40]
    return choices[int(torch.randint(0, len(choices), (1,), generator=gen))]


def tree_tokens_for(parents, top1, V, gen, match_frac=0.5, bad_frac=0.08):
    """Tokens: the parent's argmax (so walks go deep), random ids, out-of-range ids; unused
    slots hold -1 or garbage (the root's entry is garbage too)."""
    B, N = parents.shape
    parents, top1 = parents.cpu(), top1.cpu()
    tokens = torch.randint(0, V, (B, N), generator=gen)
    for b in range(B):
        tokens[b, 0] = bad_token(V, gen)
        for i in range(1, N):
            par = int(parents[b, i])
            r = float(torch.rand(1, generator=gen))
            if par < 0:
                tokens[b, i] = -1 if r < 0.5 else bad_token(V, gen)
            elif r < match_frac:
                tokens[b, i] = int(top1[b, par])
            elif r < match_frac + bad_frac:
                tokens[b, i] = bad_token(V, gen)
    return tokens


def random_logits(B, N, V, cgen, ties=True):
    """[B, N, V] float32 logits on the GPU (cgen: a CUDA generator); half the rows repeat
    their max at a second random index, so ties (lowest id wins) show up in every dtype."""
    x = torch.randn(B, N, V, generator=cgen, device="cuda") * 3
    if ties:
        flat = x.view(-1, V)
        rows = torch.arange(flat.shape[0], device="cuda")
        at = torch.randint(0, V, (flat.shape[0],), generator=cgen, device="cuda")
        keep = torch.rand(flat.shape[0], generator=cgen, device="cuda") < 0.5
        flat[rows[keep], at[keep]] = flat.max(dim=-1).values[keep]
    return x


def probs_pair(B, N, V, cgen, sharp=2.0):
    """(target, draft) float32 probabilities on the GPU, the draft a noisy copy of the target."""
    logits = torch.randn(B, N, V, generator=cgen, device="cuda") * sharp
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + torch.randn(B, N, V, generator=cgen, device="cuda"), -1)
    return target, draft


def randomness(mode, B, N, gen, device="cuda"):
    """kwargs of the randomness argument of tree_rejection_sample."""
    if mode == "uniforms32":
        return {"uniforms": torch.rand(B, N, generator=gen).to(device)}
    if mode == "uniforms64":
        return {"uniforms": torch.rand(B, N, generator=gen, dtype=torch.float64).to(device)}
    offsets = torch.randint(0, 5000, (B,), generator=gen).to(device)
    if mode == "seed":
        return {"seed": int(torch.randint(-(2**62), 2**62, (1,), generator=gen)), "offsets": offsets}
    return {"seed": torch.randint(-(2**62), 2**62, (B,), generator=gen).to(device), "offsets": offsets}


def assert_same(got, want):
    for name, g, w in zip(("output_tokens", "num_accepted", "accepted_nodes"), got, want):
        assert g.dtype == torch.int64 and g.shape == w.shape, name
        assert torch.equal(g, w), f"{name}:\ncuda {g.tolist()}\ntorch {w.tolist()}"


def run_greedy(logits, tokens, parents, max_depth=None):
    got = ops.tree_greedy_verify(logits, tokens, parents, max_depth=max_depth, backend="cuda")
    want = ops.tree_greedy_verify(logits, tokens, parents, max_depth=max_depth, backend="torch")
    assert_same(got, want)
    return got


def run_rejection(target, draft, tokens, parents, max_depth=None, **rnd):
    got = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend="cuda", **rnd)
    want = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend="torch", **rnd)
    assert_same(got, want)
    return got


def rejection_tokens(target, draft, parents, V, gen):
    """Children drafted like a real system: the parent's target argmax, the child's own
    draft argmax (likely accepted), random ids (likely rejected) and out-of-range ids."""
    top_p = safe_argmax(target).cpu()
    top_q = safe_argmax(draft).cpu()
    parents = parents.cpu()
    B, N = parents.shape
    tokens = tree_tokens_for(parents, top_p, V, gen, match_frac=0.3)
    for b in range(B):
        for i in range(1, N):
            if int(parents[b, i]) >= 0 and float(torch.rand(1, generator=gen)) < 0.3:
                tokens[b, i] = int(top_q[b, i])
    return tokens


# ----------------------------------------------------------------------------
# tree_greedy_verify
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("B", [1, 4, 16])
@pytest.mark.parametrize("V", [32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_greedy_random_trees(dtype, V, B):
    gen = torch.Generator().manual_seed(V + 17 * B)
    cgen = torch.Generator(device="cuda").manual_seed(V + 17 * B)
    for N in (1, 2, 9, 32):
        parents = random_parents(B, N, gen)
        logits = random_logits(B, N, V, cgen).to(dtype)
        tokens = tree_tokens_for(parents, safe_argmax(logits), V, gen)
        args = (logits.cuda(), tokens.cuda(), parents.cuda())
        got = run_greedy(*args)  # max_depth = the tree depth
        for max_depth in (0, 1, 3, N + 4):  # cut below the depth, and deeper than the tree
            run_greedy(*args, max_depth=max_depth)
        assert bool((got[1] >= 0).all())


@pytest.mark.parametrize("V", [1000, 32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_greedy_chain_equals_greedy_verify(dtype, V):
    cgen = torch.Generator(device="cuda").manual_seed(V + 1)
    B, g = 6, 7
    logits = random_logits(B, g + 1, V, cgen).to(dtype)
    top1 = safe_argmax(logits)
    drafts = top1[:, :g].clone()
    for b in range(B):  # row b rejects at draft b (row 6 and up accept everything)
        if b < g:
            drafts[b, b] = (drafts[b, b] + 1) % V if b % 2 else -1
    tokens = torch.cat([torch.full((B, 1), -1, device="cuda", dtype=torch.int64), drafts], dim=1)
    parents = chain_parents(B, g + 1, device="cuda")
    out, acc, nodes = run_greedy(logits, tokens, parents, max_depth=g)
    want_out, want_acc = ops.greedy_verify(logits, drafts, backend="cuda")
    assert torch.equal(out, want_out) and torch.equal(acc, want_acc)
    positions = torch.arange(g + 1, device="cuda").unsqueeze(0)
    assert torch.equal(nodes, torch.where(positions <= acc.unsqueeze(1), positions, -1))


def special_logit_rows(V):
    base = -5.0 - torch.arange(V, dtype=torch.float32) / V
    rows = []
    r = base.clone(); r[V - 1] = 10.0; rows.append(r)                          # max at the last index
    r = base.clone(); r[V // 2:] = 10.0; rows.append(r)                        # tie over every later chunk
    rows.append(torch.full((V,), 1.5))                                         # constant -> 0
    rows.append(torch.full((V,), NAN))                                         # all NaN -> 0
    rows.append(torch.full((V,), -INF))                                        # all -inf -> 0
    r = base.clone(); r[0] = NAN; r[V // 3] = INF; r[V - 1] = INF; rows.append(r)  # first +inf
    r = torch.full((V,), -1.0); r[1] = -0.0; r[2] = 0.0; rows.append(r)        # -0 ties +0
    r = base.clone(); r[4095] = 7.0; r[4096] = 7.0; rows.append(r)             # tie across a chunk edge
    return rows


@pytest.mark.parametrize("V", [32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_greedy_adversarial_rows(dtype, V):
    gen = torch.Generator().manual_seed(V + 2)
    rows = special_logit_rows(V)
    B, N = len(rows), 12
    parents = random_parents(B, N, gen, unused_frac=0.1)
    logits = torch.stack([torch.stack([rows[(b + i) % len(rows)] for i in range(N)]) for b in range(B)]).to(dtype)
    tokens = tree_tokens_for(parents, safe_argmax(logits), V, gen, match_frac=0.6, bad_frac=0.2)
    run_greedy(logits.cuda(), tokens.cuda(), parents.cuda())
    run_greedy(logits.cuda(), tokens.cuda(), parents.cuda(), max_depth=2)


def test_greedy_out_of_range_children_never_match():
    V, B = 1000, 3
    logits = torch.full((B, 4, V), NAN, device="cuda")  # argmax 0 everywhere
    parents = torch.tensor([[-1, 0, 0, 0]] * B, device="cuda")
    tokens = torch.tensor([[0, -1, V, 0], [0, 2**40, -V, 5], [7, 0, 0, 0]], device="cuda")
    out, acc, nodes = run_greedy(logits, tokens, parents, max_depth=1)
    assert acc.tolist() == [1, 0, 1] and nodes[:, 1].tolist() == [3, -1, 1]


def test_greedy_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(3)
    cgen = torch.Generator(device="cuda").manual_seed(3)
    B, N, V = 4, 10, 32001
    big = random_logits(B, N + 2, V + 1, cgen).half()
    logits = big[:, 1:N + 1, 1:]  # unaligned rows: the scalar path
    parents = random_parents(B, N, gen)
    tokens = tree_tokens_for(parents, safe_argmax(logits), V, gen)
    tokens_wide = torch.stack([tokens, tokens], dim=2).reshape(B, 2 * N).cuda()
    parents_t = parents.t().contiguous().cuda().t()  # stride (1, B)
    run_greedy(logits, tokens_wide[:, ::2], parents_t)


def test_greedy_workspace_left_zeroed_over_repeated_calls():
    from specdec_kernels.cuda import _launch

    gen = torch.Generator().manual_seed(4)
    cgen = torch.Generator(device="cuda").manual_seed(4)
    for step in range(4):
        B, N, V = (3, 17, 32000) if step % 2 else (16, 32, 128256)
        parents = random_parents(B, N, gen)
        logits = random_logits(B, N, V, cgen)
        tokens = tree_tokens_for(parents, safe_argmax(logits), V, gen)
        run_greedy(logits, tokens.cuda(), parents.cuda())
        torch.cuda.synchronize()
        for buf in _launch._zeroed_workspaces.values():
            assert int(buf.count_nonzero()) == 0, step


def test_greedy_cuda_graph_capture_and_replay():
    gen = torch.Generator().manual_seed(5)
    cgen = torch.Generator(device="cuda").manual_seed(5)
    B, N, V, D = 4, 16, 128256, 6
    logits = random_logits(B, N, V, cgen).bfloat16()
    parents = random_parents(B, N, gen).cuda()
    tokens = tree_tokens_for(parents, safe_argmax(logits), V, gen).cuda()
    ops.tree_greedy_verify(logits, tokens, parents, max_depth=D, backend="cuda")  # warm-up: workspace cached
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = ops.tree_greedy_verify(logits, tokens, parents, max_depth=D, backend="cuda")
    for _ in range(3):
        logits.copy_(random_logits(B, N, V, cgen).bfloat16())
        new_parents = random_parents(B, N, gen)
        parents.copy_(new_parents)
        tokens.copy_(tree_tokens_for(new_parents, safe_argmax(logits), V, gen))
        graph.replay()
        torch.cuda.synchronize()
        assert_same(static, ops.tree_greedy_verify(logits, tokens, parents, max_depth=D, backend="torch"))


# ----------------------------------------------------------------------------
# tree_rejection_sample
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("B", [1, 4, 16])
@pytest.mark.parametrize("V", [32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rejection_random_trees(dtype, V, B, mode):
    gen = torch.Generator().manual_seed(V + 31 * B + RANDOMNESS.index(mode))
    cgen = torch.Generator(device="cuda").manual_seed(V + 31 * B)
    for N in (1, 3, 12, 32):
        parents = random_parents(B, N, gen)
        target, draft = probs_pair(B, N, V, cgen)
        target, draft = target.to(dtype), draft.to(dtype)
        tokens = rejection_tokens(target, draft, parents, V, gen)
        args = (target.cuda(), draft.cuda(), tokens.cuda(), parents.cuda())
        rnd = randomness(mode, B, N, gen)
        run_rejection(*args, **rnd)
        for max_depth in (0, 2, N + 3):
            run_rejection(*args, max_depth=max_depth, **rnd)


@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rejection_wide_trees_many_rejections(dtype, mode):
    """Many siblings per node: the fixed-point residual goes through long chains of rejections,
    with i.i.d.-style drafts (shared q) and with one-hot (top-k) drafts."""
    gen = torch.Generator().manual_seed(11 + RANDOMNESS.index(mode))
    B, V = 8, 32000
    # root with 10 children; node 1 with 8 children; the rest hang off node 2
    parents = torch.tensor([-1] + [0] * 10 + [1] * 8 + [2] * 5).expand(B, -1).clone()
    N = parents.shape[1]
    target, draft = (x.cpu() for x in probs_pair(B, N, V, torch.Generator(device="cuda").manual_seed(11), sharp=1.0))
    tokens = torch.randint(0, V, (B, N), generator=gen)
    for b in range(B):
        if b % 2:  # deterministic top-k children with one-hot q_c
            for node in range(N):
                kids = (parents[b] == node).nonzero().flatten().tolist()
                top = torch.topk(target[b, node], len(kids)).indices if kids else []
                for kid, tok in zip(kids, reversed(top.tolist()) if kids else []):  # worst first: rejections
                    tokens[b, kid] = tok
                    draft[b, kid] = 0.0
                    draft[b, kid, tok] = 1.0
        else:  # siblings share one q (i.i.d. drafts) and draw from it
            for node in range(N):
                kids = (parents[b] == node).nonzero().flatten()
                if len(kids):
                    draft[b, kids] = draft[b, kids[0]].clone()
                    tokens[b, kids] = torch.multinomial(draft[b, kids[0]], len(kids), replacement=True,
                                                        generator=gen)
    args = (target.to(dtype).cuda(), draft.to(dtype).cuda(), tokens.cuda(), parents.cuda())
    for _ in range(3):
        run_rejection(*args, **randomness(mode, B, N, gen))


@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("V", [1000, 32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rejection_chain_equals_rejection_sample(dtype, V, mode):
    gen = torch.Generator().manual_seed(V + 7 + RANDOMNESS.index(mode))
    B, g = 8, 5
    target, q = probs_pair(B, g + 1, V, torch.Generator(device="cuda").manual_seed(V))
    target, draft = target.to(dtype), q[:, :g].to(dtype)
    drafts = safe_argmax(draft)
    drafts[::3, 2] = torch.randint(0, V, (len(drafts[::3]),), generator=gen).cuda()  # likely rejections
    drafts[1, 1] = -1
    tree_draft = torch.cat([torch.full_like(draft[:, :1], NAN), draft], dim=1)  # row 0 unused
    tokens = torch.cat([torch.full((B, 1), -1, device="cuda", dtype=torch.int64), drafts], dim=1)
    parents = chain_parents(B, g + 1, device="cuda")
    rnd = randomness(mode, B, g + 1, gen)
    if "uniforms" in rnd:  # chain: coins then the final draw; tree: column 0 is the final draw
        chain_rnd = {"uniforms": rnd["uniforms"]}
        rnd = {"uniforms": torch.cat([rnd["uniforms"][:, g:], rnd["uniforms"][:, :g]], dim=1)}
    else:
        chain_rnd = dict(rnd)
    out, acc, nodes = run_rejection(target, tree_draft, tokens, parents, max_depth=g, **rnd)
    want_out, want_acc = ops.rejection_sample(target, draft, drafts, backend="torch", **chain_rnd)
    assert torch.equal(out, want_out) and torch.equal(acc, want_acc)
    positions = torch.arange(g + 1, device="cuda").unsqueeze(0)
    assert torch.equal(nodes, torch.where(positions <= acc.unsqueeze(1), positions, -1))


def adversarial_prob_rows(V, gen):
    """(p row, q row for the child, token) triples hitting every fallback of the spec."""
    p = torch.softmax(torch.randn(V, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(V, generator=gen) * 2, -1)
    top = int(p.argmax())
    cases = []
    cases.append((p, q, top))                                        # ordinary
    cases.append((p, p.clone(), top))                                # p == q: empty residual -> p
    z = q.clone(); z[top] = 0.0; cases.append((p, z, top))           # q == 0 at the token: accepted
    cases.append((torch.zeros(V), q, top))                           # p all zero: never accepted, final 0
    cases.append((torch.zeros(V), torch.zeros(V), 5))                # nothing anywhere -> 0
    n = p.clone(); n[top] = NAN; cases.append((n, q, top))           # NaN at the token
    cases.append((torch.full((V,), NAN), q, top))                    # all NaN target
    i = p.clone(); i[V // 2] = INF; cases.append((i, q, V // 2))     # +inf target weight
    cases.append((p, torch.full((V,), NAN), top))                    # NaN draft row: residual cut to 0
    cases.append((p, torch.full((V,), INF), top))                    # inf draft row
    neg = q.clone(); neg[::2] = -INF; cases.append((p, neg, top))     # -inf in q
    cases.append((torch.full((V,), INF), q, 3))                      # total > 2^53
    big = p * 3.0; cases.append((big, q, top))                       # unnormalised, entries > 1
    cases.append((p, q, -1))                                         # padding id: rejected
    cases.append((p, q, V))                                          # id == V: rejected
    t = torch.zeros(V); t[[7, V - 1]] = 0.5; cases.append((t, q, V - 1))  # two-point target, last id
    return cases


@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("V", [32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rejection_adversarial_rows(dtype, V, mode):
    gen = torch.Generator().manual_seed(V + 3 + RANDOMNESS.index(mode))
    cases = adversarial_prob_rows(V, gen)
    # Each batch row: a root with 3 children and a grandchild; every case appears as the
    # root target / first child and, shifted, as later siblings (the residual rules).
    B, N = len(cases), 5
    parents = torch.tensor([-1, 0, 0, 0, 1]).expand(B, -1).clone()
    target = torch.empty(B, N, V)
    draft = torch.empty(B, N, V)
    tokens = torch.empty(B, N, dtype=torch.int64)
    for b in range(B):
        # node 1 is case b exactly (root target, its draft row and token); the other nodes
        # mix the cases, so every row also meets them as later siblings and deeper levels.
        for node in range(N):
            target[b, node] = cases[(b + node) % B][0]
            draft[b, node] = cases[(b + 2 * node) % B][1]
            tokens[b, node] = cases[(b + 2 * node) % B][2]
        target[b, 0], draft[b, 1], tokens[b, 1] = cases[b]
    args = (target.to(dtype).cuda(), draft.to(dtype).cuda(), tokens.cuda(), parents.cuda())
    for _ in range(3):
        out, acc, _ = run_rejection(*args, **randomness(mode, B, N, gen))
        positions = torch.arange(out.shape[1], device="cuda").unsqueeze(0)
        emitted = out[positions <= acc.unsqueeze(1)]
        # [0, V]: V itself only in the reference's own float64 rounding corner (total > 2^53)
        assert bool(((emitted >= 0) & (emitted <= V)).all())


@pytest.mark.parametrize("mode", ["uniforms32", "seeds"])
def test_rejection_non_contiguous_inputs(mode):
    gen = torch.Generator().manual_seed(8)
    B, N, V = 5, 9, 32000
    target, draft = probs_pair(B, N + 1, V + 1, torch.Generator(device="cuda").manual_seed(8))
    target = target.half()[:, 1:, 1:]  # unaligned, strided views
    draft = draft.half()[:, :N, :V]
    parents = random_parents(B, N, gen)
    tokens = rejection_tokens(target, draft, parents, V, gen)
    tokens_wide = torch.stack([tokens, tokens], dim=2).reshape(B, 2 * N).cuda()
    parents_t = parents.t().contiguous().cuda().t()
    rnd = randomness(mode, B, N, gen)
    if "uniforms" in rnd:
        rnd["uniforms"] = torch.cat([rnd["uniforms"], rnd["uniforms"]], dim=1)[:, :N]
    else:
        rnd["seed"] = torch.stack([rnd["seed"], rnd["seed"]], dim=1)[:, 0]
        rnd["offsets"] = torch.stack([rnd["offsets"], rnd["offsets"]], dim=1)[:, 1]
    run_rejection(target, draft, tokens_wide[:, ::2], parents_t, **rnd)


def test_rejection_repeated_calls_and_cuda_graph():
    gen = torch.Generator().manual_seed(9)
    cgen = torch.Generator(device="cuda").manual_seed(9)
    B, N, V, D = 4, 16, 128256, 5
    target, draft = (x.bfloat16() for x in probs_pair(B, N, V, cgen))
    parents = random_parents(B, N, gen).cuda()
    tokens = rejection_tokens(target, draft, parents, V, gen).cuda()
    uniforms = torch.rand(B, N, generator=gen).cuda()
    seeds = torch.randint(0, 2**62, (B,), generator=gen).cuda()
    offsets = torch.randint(0, 100, (B,), generator=gen).cuda()
    for _ in range(3):  # repeated calls: the scratch carries nothing over
        run_rejection(target, draft, tokens, parents, max_depth=D, uniforms=uniforms)
        run_rejection(target, draft, tokens, parents, max_depth=D, seed=seeds, offsets=offsets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_u = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=D, uniforms=uniforms,
                                             backend="cuda")
        static_s = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=D, seed=seeds,
                                             offsets=offsets, backend="cuda")
    for _ in range(3):
        new_t, new_d = probs_pair(B, N, V, cgen)
        target.copy_(new_t.bfloat16())
        draft.copy_(new_d.bfloat16())
        new_parents = random_parents(B, N, gen)
        parents.copy_(new_parents)
        tokens.copy_(rejection_tokens(target, draft, new_parents, V, gen))
        uniforms.copy_(torch.rand(B, N, generator=gen))
        offsets.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(static_u, ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=D,
                                                        uniforms=uniforms, backend="torch"))
        assert_same(static_s, ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=D, seed=seeds,
                                                        offsets=offsets, backend="torch"))


def test_auto_picks_cuda():
    device = torch.device("cuda")
    assert ops.resolve("tree_greedy_verify", "auto", device) == "cuda"
    assert ops.resolve("tree_rejection_sample", "auto", device) == "cuda"


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_rejection_allocates_nothing_of_size_batch_times_vocab(backend):
    """The launchers used to allocate an int64 [B, V] residual scratch per call (311 MB at
    B = 256, V = 151936); now the residual is recomputed and the only buffer is the rank
    table (B * N * 2 int64). Rows with several rejected siblings keep the recomputation
    busy, and the outputs stay bit-exact."""
    if backend == "triton":
        pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(16)
    B, V = 256, 151936
    parents = torch.tensor([-1, 0, 0, 0, 1, 1]).expand(B, -1).clone()
    N = parents.shape[1]
    target, draft = probs_pair(B, N, V, torch.Generator(device="cuda").manual_seed(16), sharp=1.0)
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    tokens = torch.randint(0, V, (B, N), generator=gen).cuda()  # random ids: mostly rejected
    parents = parents.cuda()
    rnd = randomness("seeds", B, N, gen)
    ops.tree_rejection_sample(target, draft, tokens, parents, backend=backend, **rnd)  # compile / warm up
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = ops.tree_rejection_sample(target, draft, tokens, parents, backend=backend, **rnd)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak < B * V, f"{backend}: {peak} bytes allocated by one call"  # the scratch alone was 8 * B * V
    want = ops.tree_rejection_sample(target, draft, tokens, parents, backend="torch", **rnd)
    assert_same(got, want)


# ----------------------------------------------------------------------------
# siblings="without_replacement": one q per parent (draft row v), children drawn from it
# without replacement (draft_tree.sample_children), verified with q updated after each
# rejected sibling. Both GPU backends against the reference, bit for bit.
# ----------------------------------------------------------------------------
WR = "without_replacement"


def sampled_children_tokens(draft, parents, gen, odd_frac=0.05):
    """Each node's children drawn without replacement from the node's draft row (in index order),
    a few replaced by random ids (skipped or rejected by the rule)."""
    from specdec_kernels.decoding.draft_tree import sample_children

    draft_cpu, parents = draft.float().cpu(), parents.cpu()
    B, N, V = draft_cpu.shape
    tokens = torch.full((B, N), -1, dtype=torch.int64)
    for b in range(B):
        for v in range(N):
            kids = (parents[b] == v).nonzero().flatten()
            kids = kids[kids > 0]
            if len(kids):
                u = torch.rand(1, len(kids), generator=gen, dtype=torch.float64)
                tokens[b, kids] = sample_children(draft_cpu[b, v:v + 1], u)[0][0]
    odd = (torch.rand(B, N, generator=gen) < odd_frac) & (parents >= 0)
    return torch.where(odd, torch.randint(0, V, (B, N), generator=gen), tokens)


def run_sampled(backend, target, draft, tokens, parents, max_depth=None, **rnd):
    got = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend=backend,
                                    siblings=WR, **rnd)
    want = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend="torch",
                                     siblings=WR, **rnd)
    assert_same(got, want)
    return got


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sampled_siblings_random_trees(dtype, mode, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(41 + RANDOMNESS.index(mode))
    cgen = torch.Generator(device="cuda").manual_seed(41)
    for B, N, V in ((1, 7, 1000), (4, 12, 32000), (16, 32, 128256)):
        parents = random_parents(B, N, gen)
        target, draft = (x.to(dtype) for x in probs_pair(B, N, V, cgen, sharp=1.0))
        tokens = sampled_children_tokens(draft, parents, gen).cuda()
        rnd = randomness(mode, B, N, gen)
        for max_depth in (None, 1, N + 3):
            run_sampled(backend, target, draft, tokens, parents.cuda(), max_depth=max_depth, **rnd)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sampled_siblings_wide_trees_and_bad_rows(dtype, backend):
    """10 and 8 sampled siblings (long rejection chains), NaN / inf / zero rows, repeats."""
    if backend == "triton":
        pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(43)
    B, V = 8, 32000
    parents = torch.tensor([-1] + [0] * 10 + [1] * 8 + [2] * 5).expand(B, -1).clone()
    N = parents.shape[1]
    target, draft = probs_pair(B, N, V, torch.Generator(device="cuda").manual_seed(43), sharp=0.5)
    tokens = sampled_children_tokens(draft, parents, gen)
    target[0, 0] = NAN
    draft[1, 0] = NAN
    target[2, 0] = 0.0
    draft[3, 0] = 0.0
    draft[4, 0, :100] = INF
    tokens[5, 2] = tokens[5, 1]  # a repeated sibling
    args = (target.to(dtype), draft.to(dtype), tokens.cuda(), parents.cuda())
    for mode in RANDOMNESS:
        out = run_sampled(backend, *args, **randomness(mode, B, N, gen))[0]
        assert bool(((out >= -1) & (out < V)).all())


def test_sampled_siblings_cuda_graph():
    gen = torch.Generator().manual_seed(45)
    cgen = torch.Generator(device="cuda").manual_seed(45)
    B, N, V, D = 4, 16, 128256, 5
    target, draft = (x.bfloat16() for x in probs_pair(B, N, V, cgen, sharp=1.0))
    parents = random_parents(B, N, gen).cuda()
    tokens = sampled_children_tokens(draft, parents, gen).cuda()
    seeds = torch.randint(0, 2**62, (B,), generator=gen).cuda()
    offsets = torch.randint(0, 100, (B,), generator=gen).cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=D, seed=seeds, offsets=offsets,
                                           siblings=WR, backend="cuda")
    for _ in range(3):
        new_t, new_d = probs_pair(B, N, V, cgen, sharp=1.0)
        target.copy_(new_t.bfloat16())
        draft.copy_(new_d.bfloat16())
        tokens.copy_(sampled_children_tokens(draft, parents, gen))
        offsets.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(static, ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=D, seed=seeds,
                                                      offsets=offsets, siblings=WR, backend="torch"))
