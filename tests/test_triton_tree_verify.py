"""The Triton tree_greedy_verify / tree_rejection_sample backends against the torch
reference, bit for bit.

Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported); on a machine without triton the module is skipped. Shapes stay small: the
interpreter walks every level and sibling in Python.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import ops, reference
from specdec_kernels.reference._sampling import safe_argmax
from specdec_kernels.triton import tree_verify as triton_module

pytestmark = [
    # the interpreter evaluates 0 * inf and NaN arithmetic with numpy, which warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731
OUTPUT_NAMES = ("output_tokens", "num_accepted", "accepted_nodes")


# ------------------------------------------------------------------ helpers

def random_parents(gen, n, unused_frac=0.2):
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
    """Target/draft rows that are close (acceptances) with zero target entries (rejections);
    each node's token drawn from its own draft row; unused slots hold token -1."""
    if parents is None:
        parents = torch.tensor([random_parents(gen, n, unused_frac) for _ in range(batch)], dtype=torch.int64)
    target = torch.rand(batch, n, vocab, generator=gen) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen) < zero_frac, 0.0, target)
    target[..., 0] += 1e-3  # no all-zero row by accident
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, n, vocab, generator=gen)
    # node c's draft row is close to its parent's target row (the p it is tested against)
    at_parent = target.gather(1, parents.clamp(min=0).unsqueeze(2).expand(-1, -1, vocab))
    draft = 0.7 * at_parent + 0.3 * noise / noise.sum(-1, keepdim=True)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
    unused = (parents < 0) & (torch.arange(n) > 0)
    tokens = torch.where(unused, -1, tokens)
    return target.to(dtype), draft.to(dtype), tokens, parents


def uniforms(batch, n, gen, dtype=torch.float64, zero_frac=0.15):
    u = torch.rand(batch, n, generator=gen, dtype=torch.float64).to(dtype)
    return torch.where(torch.rand(u.shape, generator=gen) < zero_frac, torch.zeros_like(u), u)


def all_modes(batch, n, gen):
    """float32 / float64 uniforms (with exact 0.0 coins), an int seed with offsets (crossing
    2^32 in the counter), per-row seeds without offsets."""
    return [
        dict(uniforms=uniforms(batch, n, gen, torch.float32)),
        dict(uniforms=uniforms(batch, n, gen, torch.float64)),
        dict(seed=int(torch.randint(-2**62, 2**62, (1,), generator=gen)),
             offsets=torch.tensor([0, 2**32 - 2, 17, -5, 2**40] * 4)[:batch]),
        dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)),
    ]


def check_outputs(got, want, vocab, context=""):
    for name, g_, w_ in zip(OUTPUT_NAMES, got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape, name
        assert torch.equal(g_, w_), f"{name}: triton {g_.tolist()} != torch {w_.tolist()} {context}"
    out, accepted, _ = got
    width = out.shape[1]
    emitted = torch.arange(width).unsqueeze(0) <= accepted.unsqueeze(1)
    assert bool(((out >= 0) & (out < vocab))[emitted].all()), out
    assert bool((out[~emitted] == -1).all()), out


def assert_sample_matches(target, draft, tokens, parents, **kwargs):
    got = ops.tree_rejection_sample(target, draft, tokens, parents, backend="triton", **kwargs)
    want = ops.tree_rejection_sample(target, draft, tokens, parents, backend="torch", **kwargs)
    check_outputs(got, want, target.shape[-1], sorted(kwargs))
    return got


def assert_greedy_matches(logits, tokens, parents, **kwargs):
    """The public op, then both kernels (split over V, and the one-program walk) by hand."""
    got = ops.tree_greedy_verify(logits, tokens, parents, backend="triton", **kwargs)
    want = ops.tree_greedy_verify(logits, tokens, parents, backend="torch", **kwargs)
    check_outputs(got, want, logits.shape[-1], sorted(kwargs))
    check_both_greedy_kernels(logits, tokens, parents, want[0].shape[1] - 1, want)
    return got


def check_both_greedy_kernels(logits, tokens, parents, max_depth, want, **plan):
    for split in (True, False):
        got = triton_module._launch_greedy(logits, tokens, parents, max_depth=max_depth, split=split, **plan)
        check_outputs(got, want, logits.shape[-1], f"split={split} {plan}")


def greedy_tokens(logits, tokens, parents, gen):
    """Make about half of the used nodes carry their parent's argmax, so walks go deep."""
    top1 = safe_argmax(logits).gather(1, parents.clamp(min=0))
    force = (torch.rand(tokens.shape, generator=gen) < 0.6) & (parents >= 0)
    return torch.where(force, top1, tokens)


# ------------------------------------------------------------------ shapes, dtypes, modes

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab", (1, 37, 300))
def test_random_trees_match_reference(dtype, vocab):
    batch, n = 4, 9
    gen = torch.Generator().manual_seed(vocab)
    target, draft, tokens, parents = make_tree(batch, n, vocab, dtype, gen)
    parents[1, 5:] = -1  # a ragged batch: row 1 is a smaller tree padded with unused slots
    tokens[1, 5:] = -1
    depth = reference.max_tree_depth(parents)
    for i, kwargs in enumerate(all_modes(batch, n, gen)):
        got = assert_sample_matches(target, draft, tokens, parents, **kwargs)
        if i % 2 == 0:  # a max_depth cut below the tree depth
            assert_sample_matches(target, draft, tokens, parents, max_depth=1, **kwargs)
    assert got[0].shape == (batch, depth + 1)
    logits = torch.log(target.float() + 1e-3).to(dtype)
    g_tokens = greedy_tokens(logits, tokens, parents, gen)
    for max_depth in (None, 0, 1):
        assert_greedy_matches(logits, g_tokens, parents, max_depth=max_depth)


@pytest.mark.parametrize("vocab", (7, 300))
def test_small_tiles(vocab):
    """BLOCK_V = 16: many tiles, so the residual passes and the int64 cdf cross tiles."""
    gen = torch.Generator().manual_seed(vocab + 1)
    target, draft, tokens, parents = make_tree(3, 7, vocab, torch.float32, gen, zero_frac=0.6)
    for kwargs in all_modes(3, 7, gen)[1:]:
        depth = reference.max_tree_depth(parents)
        want = reference.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, **kwargs)
        got = triton_module._launch_rejection(target, draft, tokens, parents, max_depth=depth, block_v=16, **kwargs)
        check_outputs(got, want, vocab, sorted(kwargs))
    logits = torch.randn(3, 7, vocab, generator=gen)
    g_tokens = greedy_tokens(logits, tokens, parents, gen)
    want = reference.tree_greedy_verify(logits, g_tokens, parents, max_depth=3)
    check_both_greedy_kernels(logits, g_tokens, parents, 3, want, block_v=16, tiles_per_program=1)  # many splits


def test_star_tree_rejects_siblings_in_turn():
    """Every node a child of the root, tokens from each child's own draft row far from p:
    several siblings are rejected one after the other (first rule, then the fixed-point
    residual rule with in-place updates), and some row accepts a later sibling."""
    batch, n, vocab = 6, 8, 24
    gen = torch.Generator().manual_seed(21)
    parents = torch.tensor([[-1] + [0] * (n - 1)] * batch)
    target, draft, tokens, _ = make_tree(batch, n, vocab, torch.float32, gen, zero_frac=0.5, parents=parents)
    draft = torch.softmax(3 * torch.randn(batch, n, vocab, generator=gen), -1)  # far from p
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
    later_accepts = 0
    for kwargs in all_modes(batch, n, gen):
        out, accepted, nodes = assert_sample_matches(target, draft, tokens, parents, **kwargs)
        later_accepts += int((nodes[:, 1] > 1).sum())
    assert later_accepts > 0  # the residual rule decided some acceptances


@pytest.mark.parametrize("accept_side", (False, True))
def test_later_sibling_rule_reads_the_exact_residual(accept_side):
    """The later-sibling rule compares (u * q(x)) * S with the exact int64 R(x) (in float64).
    After two rejections R(x) = R_1(x) - floor(S_1 * q_2(x)) needs more than 24 bits; the
    third child's coin puts (u * q(x)) * S between float32(R(x)) and R(x) (or below both),
    where an implementation that rounds R(x) through float32 would decide otherwise."""
    vocab = 16
    gen = torch.Generator().manual_seed(31)
    parents = torch.tensor([[-1, 0, 0, 0]])
    target = torch.softmax(torch.randn(1, 4, vocab, generator=gen), -1)
    draft = torch.softmax(torch.randn(1, 4, vocab, generator=gen), -1)
    tokens = torch.tensor([[0, 3, 4, 5]])
    target[0, 0, 3:5] = 0.0  # the first two children are rejected whatever their coins
    draft[0, 2, 5] = 0.01  # keeps R(5) > 0 after the second update
    draft[0, 3] *= 0.1
    draft[0, 3, 5] = 0.9  # q(x) > r(x): the third child's coin matters
    to_weights = reference._sampling.to_weights
    r_1 = to_weights(target[0, 0] - draft[0, 1])
    s_1 = float(r_1.sum())
    r_2 = (r_1 - torch.floor(s_1 * draft[0, 2].double()).to(torch.int64)).clamp(min=0)
    total, r_x, q_x = int(r_2.sum()), int(r_2[5]), float(draft[0, 3, 5])
    r_32 = float(torch.tensor(float(r_x), dtype=torch.float64).float())
    assert r_32 != r_x and r_x > 0
    lo, hi = sorted((r_32, float(r_x)))
    goal = lo - (hi - lo) if accept_side else (lo + hi) / 2  # below both, or between the two
    u = torch.tensor([[0.5, 0.25, 0.75, goal / (q_x * total)]], dtype=torch.float64)
    product = (u[0, 3].item() * q_x) * total
    assert (product < lo) if accept_side else (lo < product < hi)
    out, accepted, nodes = assert_sample_matches(target, draft, tokens, parents, uniforms=u)
    assert nodes[0, 1].item() == (3 if (accept_side or r_32 < r_x) else -1)

def test_chain_shaped_tree_matches_chain_ops():
    """A chain tree is `rejection_sample` / `greedy_verify` on the same data, in every mode
    (checks the counter layout: level positions, rank 0, final draw at the stop level)."""
    batch, g, vocab = 5, 4, 40
    gen = torch.Generator().manual_seed(9)
    parents = reference.chain_parents(batch, g + 1)
    target, node_q, tokens, _ = make_tree(batch, g + 1, vocab, torch.float16, gen, parents=parents)
    drafts = tokens[:, 1:]
    q = node_q[:, 1:]  # node i + 1 was drawn from q[:, i]
    u = uniforms(batch, g + 1, gen)
    node_u = torch.cat([u[:, g:], u[:, :g]], dim=1)  # column 0 is the final draw
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)
    offsets = torch.tensor([0, 2**32 - 3, 5, -2, 2**40])
    cases = [(dict(uniforms=u), dict(uniforms=node_u)), (dict(seed=11, offsets=offsets),) * 2,
             (dict(seed=seeds),) * 2, (dict(seed=-3),) * 2]
    for chain_kwargs, tree_kwargs in cases:
        chain = ops.rejection_sample(target, q, drafts, backend="triton", **chain_kwargs)
        tree = assert_sample_matches(target, node_q, tokens, parents, **tree_kwargs)
        assert torch.equal(tree[0], chain[0]) and torch.equal(tree[1], chain[1]), sorted(tree_kwargs)
        path = torch.arange(g + 1)  # a chain accepts nodes 1, 2, ..., num_accepted
        assert torch.equal(tree[2], torch.where(path <= tree[1].unsqueeze(1), path, -1))
    logits = torch.log(target.float() + 1e-4)
    g_tokens = greedy_tokens(logits, tokens, parents, gen)
    chain = ops.greedy_verify(logits, g_tokens[:, 1:], backend="triton")
    tree = assert_greedy_matches(logits, g_tokens, parents)
    assert torch.equal(tree[0], chain[0]) and torch.equal(tree[1], chain[1])
    assert int(tree[1].sum()) > 0


def test_empty_batch_and_root_only():
    gen = torch.Generator().manual_seed(3)
    empty = torch.zeros(0, 3, dtype=torch.int64)
    got = ops.tree_rejection_sample(torch.rand(0, 3, 10), torch.rand(0, 3, 10), empty, empty - 1, seed=1,
                                    max_depth=2, backend="triton")
    assert [tuple(x.shape) for x in got] == [(0, 3), (0,), (0, 3)]
    got = ops.tree_greedy_verify(torch.rand(0, 3, 10), empty, empty - 1, max_depth=2, backend="triton")
    assert [tuple(x.shape) for x in got] == [(0, 3), (0,), (0, 3)]
    # N == 1: the root only; the bonus from p; max_depth beyond the tree pads with -1
    target, draft, tokens, parents = make_tree(3, 1, 50, torch.bfloat16, gen)
    for max_depth in (None, 2):
        for kwargs in all_modes(3, 1, gen):
            out, accepted, nodes = assert_sample_matches(target, draft, tokens, parents, max_depth=max_depth, **kwargs)
            assert accepted.tolist() == [0, 0, 0] and nodes[:, 0].tolist() == [0, 0, 0]
        assert_greedy_matches(torch.randn(3, 1, 50, generator=gen), tokens, parents, max_depth=max_depth)


def test_max_depth_beyond_block():
    """max_depth + 1 wider than BLOCK_N: the output tail is padded by the store loop."""
    gen = torch.Generator().manual_seed(4)
    target, draft, tokens, parents = make_tree(2, 3, 12, torch.float32, gen, unused_frac=0.0)
    for kwargs in all_modes(2, 3, gen)[1:3]:
        out, _, nodes = assert_sample_matches(target, draft, tokens, parents, max_depth=9, **kwargs)
        assert out.shape == (2, 10) and bool((out[:, 4:] == -1).all()) and bool((nodes[:, 4:] == -1).all())
    assert_greedy_matches(torch.randn(2, 3, 12, generator=gen), tokens, parents, max_depth=9)


# ------------------------------------------------------------------ edge rows

EDGE_PARENTS = [-1, 0, 0, 0, 1, 1, 2, -1]  # three root children, two grandchildren under 1, one under 2, an unused slot


def edge_case_inputs(dtype):
    """One crafted row per edge case, V = 40, N = 8."""
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
    # 3: NaN target at the root, NaN / inf in the children's q (q_clean -> 1 empties R)
    target[3, 0] = NAN
    draft[3, 1, ::3] = NAN
    draft[3, 2, 4] = INF
    draft[3, 3, :] = -INF
    # 4: the first child rejected (p(x) = 0); the second child's q has +inf at its token
    # (u * inf is never < a finite value) and NaN entries (q_clean -> 1 in the update)
    target[4, 0, tokens[4, 1]] = 0.0
    draft[4, 2, tokens[4, 2]] = INF
    draft[4, 2, 1::4] = NAN
    # 5: one-hot target, distinct deterministic drafts with one-hot q (top-k siblings): the
    # residual after each miss is the hot id; the third sibling hits it
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
    # 8: duplicate tokens among siblings (i.i.d. drafts from one q); +inf entries in p: at
    # the drafted tokens of nodes 1 and 4 (always accepted) and in node 4's bonus row (weight 1)
    tokens[8, 1:4] = tokens[8, 1]
    draft[8, 1:4] = draft[8, 1]
    target[8, 0, tokens[8, 1]] = INF
    target[8, 1, tokens[8, 4]] = INF
    target[8, 4, 30:33] = INF
    return target.to(dtype), draft.to(dtype), tokens, parents


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_edge_rows(dtype):
    target, draft, tokens, parents = edge_case_inputs(dtype)
    batch, n = tokens.shape
    gen = torch.Generator().manual_seed(12)
    modes = all_modes(batch, n, gen)
    modes.append(dict(uniforms=torch.zeros(batch, n)))  # every coin and the final draw at exactly 0
    modes.append(dict(uniforms=torch.full((batch, n), 1.0 - 2**-53, dtype=torch.float64)))  # largest u
    for kwargs in modes:
        out, accepted, nodes = assert_sample_matches(target, draft, tokens, parents, **kwargs)
        assert nodes[1, 1] == 1 and out[1, 0] == 9
        assert accepted[2] == 0 and out[2, 0] == 0
        assert accepted[3] == 0 and out[3, 0] == 0
        assert nodes[5, 1] == 3 and out[5, 0] == 17
        assert accepted[0] == 0 and target[0, 0, out[0, 0]] > 0
        assert nodes[8, 1:].tolist() == [1, 4]
    for max_depth in (0, 1):
        for kwargs in modes[1:3]:
            assert_sample_matches(target, draft, tokens, parents, max_depth=max_depth, **kwargs)


def test_greedy_edge_rows():
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
    for dtype in DTYPES:
        out, accepted, nodes = assert_greedy_matches(logits.to(dtype), tokens, parents)
        assert nodes[0, 1] == 2 and nodes[1, 1] == 3 and nodes[2, 1] == 2 and nodes[3, 1] == 2
        assert out[2, 0] == 0 and accepted[4] == 0
        assert_greedy_matches(logits.to(dtype), tokens, parents, max_depth=1)
        # BLOCK_V = 16: the ties, the all -inf row and the NaN rows span two tiles
        want = reference.tree_greedy_verify(logits.to(dtype), tokens, parents, max_depth=2)
        check_both_greedy_kernels(logits.to(dtype), tokens, parents, 2, want, block_v=16, tiles_per_program=1)


def test_out_of_range_ids_never_emitted():
    """Ids >= V or < -1 (possible on a GPU, where values are not validated) read nothing and
    are rejected / never match."""
    gen = torch.Generator().manual_seed(14)
    target, draft, tokens, parents = make_tree(3, 6, 20, torch.float32, gen, unused_frac=0.0)
    tokens[:, 1:] = torch.tensor([[20, 0, 2**40, -7, 5], [-2**62, 20, 21, 3, 3], [1, 2, 3, 4, 2**33]])
    tokens[:, 0] = torch.tensor([-5, 99, 2**50])  # the root's entry is ignored
    depth = reference.max_tree_depth(parents)
    for kwargs in all_modes(3, 6, gen)[1:]:
        want = reference.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, **kwargs)
        got = triton_module.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, **kwargs)
        check_outputs(got, want, 20, sorted(kwargs))
    logits = torch.randn(3, 6, 20, generator=gen)
    want = reference.tree_greedy_verify(logits, tokens, parents, max_depth=depth)
    check_outputs(triton_module.tree_greedy_verify(logits, tokens, parents, max_depth=depth), want, 20)
    check_both_greedy_kernels(logits, tokens, parents, depth, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_inputs(dtype):
    batch, n, vocab = 3, 6, 30
    gen = torch.Generator().manual_seed(2)
    target, draft, tokens, parents = make_tree(batch, n, vocab, dtype, gen)
    big = torch.zeros(batch, n + 2, vocab, dtype=dtype)
    big[:, 1:n + 1] = target
    target_view = big[:, 1:n + 1]  # batch stride (n + 2) * V
    draft_view = draft.transpose(0, 1).contiguous().transpose(0, 1)  # node-major storage
    tokens_view, parents_view = tokens.t().contiguous().t(), parents.t().contiguous().t()
    u = uniforms(batch, n, gen).t().contiguous().t()
    seeds = torch.randint(0, 2**40, (2 * batch,), generator=gen)[::2]
    offsets = torch.tensor([5, 0, 9, 0, 2**33, 0])[::2]
    for kwargs in (dict(uniforms=u), dict(seed=seeds, offsets=offsets)):
        assert_sample_matches(target_view, draft_view, tokens_view, parents_view, **kwargs)
    assert_greedy_matches(target_view, tokens_view, parents_view)


# ------------------------------------------------------------------ properties

def test_batch_invariance_with_row_seeds():
    """With per-request seeds a row's result depends on that row only: permuting the batch
    permutes the outputs, and a row run alone gives the same tokens."""
    batch, n, vocab = 5, 7, 30
    gen = torch.Generator().manual_seed(8)
    target, draft, tokens, parents = make_tree(batch, n, vocab, torch.bfloat16, gen)
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)
    offsets = torch.randint(0, 1000, (batch,), generator=gen)
    depth = reference.max_tree_depth(parents)
    run = lambda rows: ops.tree_rejection_sample(  # noqa: E731
        target[rows], draft[rows], tokens[rows], parents[rows], seed=seeds[rows], offsets=offsets[rows],
        max_depth=depth, backend="triton")
    full = run(torch.arange(batch))
    perm = torch.randperm(batch, generator=gen)
    for got, want in zip(run(perm), full):
        assert torch.equal(got, want[perm])
    b = int(perm[0])
    for got, want in zip(run(torch.tensor([b])), full):
        assert torch.equal(got[0], want[b])


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(1, 7), vocab=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(("u32", "u64", "seed", "seeds")), seed=st.integers(0, 2**31 - 1),
       special=st.floats(0.0, 0.3), cut=st.booleans())
def test_property_matches_reference(batch, n, vocab, dtype, mode, seed, special, cut):
    gen = torch.Generator().manual_seed(seed)
    target, draft, tokens, parents = make_tree(batch, n, vocab, torch.float32, gen, zero_frac=0.5)
    specials = torch.tensor([NAN, INF, 0.0, -1.0])
    for x in (target, draft):
        pick = specials[torch.randint(0, 4, x.shape, generator=gen)]
        x.copy_(torch.where(torch.rand(x.shape, generator=gen) < special, pick, x))
    tokens = torch.where(torch.rand(tokens.shape, generator=gen) < special, -1, tokens)
    target, draft = target.to(dtype), draft.to(dtype)
    kwargs = all_modes(batch, n, gen)[("u32", "u64", "seed", "seeds").index(mode)]
    max_depth = int(torch.randint(0, n + 1, (), generator=gen)) if cut else None
    got = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend="triton", **kwargs)
    depth = reference.max_tree_depth(parents) if max_depth is None else max_depth
    want = reference.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, **kwargs)
    check_outputs(got, want, vocab)
    logits = torch.log(target.float()).to(dtype)
    g_tokens = greedy_tokens(logits, tokens, parents, gen)
    got = ops.tree_greedy_verify(logits, g_tokens, parents, max_depth=max_depth, backend="triton")
    want = reference.tree_greedy_verify(logits, g_tokens, parents, max_depth=depth)
    check_outputs(got, want, vocab)
    check_both_greedy_kernels(logits, g_tokens, parents, depth, want, block_v=16, tiles_per_program=1)


# ------------------------------------------------------------------ the residual without a [B, V] scratch

def test_many_rejected_siblings_at_two_levels():
    """The residual after k rejected siblings is recomputed from p and their q rows (no
    scratch row). Root: 9 children, the first 7 rejected whatever their coins (p(x) = 0),
    with NaN / +inf / -inf / all-zero entries in their q rows, then one accepted through
    the residual rule (q(x) = 0 < R(x), nothing cut there). Node 8: 4 children (fewer ranks than the root
    used, so entries left in the rank table from the root must not leak), 3 rejected, then
    the draw from the residual. BLOCK_V = 16 puts every pass over several tiles."""
    vocab, batch = 50, 3
    gen = torch.Generator().manual_seed(41)
    parents = torch.tensor([[-1] + [0] * 9 + [8] * 4] * batch)
    n = parents.shape[1]
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1)
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    tokens[:, 1:8] = torch.arange(1, 8)  # the first 7 root children: ids 1..7, all with p = 0
    target[:, 0, 1:8] = 0.0
    draft[:, 2, ::5] = NAN  # q_clean -> 1: floor(S * 1) empties those ids
    draft[:, 3, 10] = INF
    draft[:, 4, 11:13] = -INF
    draft[:, 5] = 0.0  # an all-zero q: the update leaves R as it is
    draft[:, 1:9, 31] = 0.0  # child 8 (token 31): nothing cut at 31, q(x) = 0 < R(x): accepted
    tokens[:, 8] = 31
    target[:, 0, 31] = 0.5
    tokens[:, 10:13] = torch.tensor([40, 41, 42])  # node 8's first 3 children: p = 0 there
    target[:, 8, 40:43] = 0.0
    tokens[:, 13] = 43
    target[:, 8, 43] = 0.0  # and the 4th too: the row ends with a draw from the residual
    depth = reference.max_tree_depth(parents)
    modes = all_modes(batch, n, gen) + [dict(uniforms=torch.zeros(batch, n))]
    for kwargs in modes:
        want = reference.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, **kwargs)
        assert want[2][:, 1].tolist() == [8] * batch and want[1].tolist() == [1] * batch
        for block_v in (16, BLOCK_V_DEFAULT):
            got = triton_module._launch_rejection(target, draft, tokens, parents, max_depth=depth,
                                                  block_v=block_v, **kwargs)
            check_outputs(got, want, vocab, f"block_v={block_v} {sorted(kwargs)}")
        assert_sample_matches(target, draft, tokens, parents, **kwargs)


BLOCK_V_DEFAULT = triton_module.BLOCK_V


class _AllocationLog(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes of every tensor created by a torch factory or copy op inside the block."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and func._schema.name.split("::")[-1] in (
                "empty", "empty_strided", "zeros", "ones", "full", "zeros_like", "empty_like", "full_like",
                "new_empty", "new_zeros", "new_full", "clone", "new_empty_strided"):
            self.sizes.append(out.untyped_storage().nbytes())
        return out


def test_no_allocation_scales_with_batch_times_vocab():
    """The launcher used to allocate an int64 [B, V] residual scratch per call (311 MB at
    B = 256, V = 151936). Now its buffers depend on (B, N) only: every tensor the call
    creates stays below one byte per (row, id), at a shape where V dwarfs N."""
    batch, n, vocab = 4, 5, 4096
    gen = torch.Generator().manual_seed(5)
    target, draft, tokens, parents = make_tree(batch, n, vocab, torch.float32, gen)
    depth = reference.max_tree_depth(parents)
    log = _AllocationLog()
    with log:
        got = triton_module.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, seed=3)
    want = reference.tree_rejection_sample(target, draft, tokens, parents, max_depth=depth, seed=3)
    check_outputs(got, want, vocab)
    assert log.sizes, "the log saw no allocation at all (not even the outputs)"
    assert max(log.sizes) < batch * vocab, log.sizes
    plan = triton_module.rejection_plan(256, 64, 151936)
    assert plan["grid"] == (256,)
    assert plan["table_bytes"] == 256 * 2 * 64 * 8  # 256 KiB, whatever V (was 256 * 151936 * 8 = 311 MB)
    assert triton_module.rejection_plan(256, 64, 1)["table_bytes"] == plan["table_bytes"]
