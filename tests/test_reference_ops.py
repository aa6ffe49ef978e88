"""Every op (torch backend) against the slow Python loops in oracles.py on random cases."""

import math

import pytest
import torch

from specdec_kernels import ops, reference
from specdec_kernels.common import rng
from specdec_kernels.reference import attention as reference_attention
from specdec_kernels.reference.attention import paged_from_contiguous, row_kv

import oracles

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_probs(*shape, generator, sparsity=0.3, dtype=torch.float32):
    """Probability rows with exact zeros in a random subset and occasional one-hot rows."""
    logits = torch.randn(*shape, generator=generator) * 2
    logits[torch.rand(*shape, generator=generator) < sparsity] = -math.inf
    logits[..., 0] = torch.where(torch.isinf(logits).all(dim=-1), 0.0, logits[..., 0])
    return torch.softmax(logits, dim=-1).to(dtype)


def chain_case(seed, dtype, batch=4, g=4, vocab=9):
    gen = torch.Generator().manual_seed(seed)
    p = random_probs(batch, g + 1, vocab, generator=gen, dtype=dtype)
    q = random_probs(batch, g, vocab, generator=gen, dtype=dtype)
    drafts = torch.randint(0, vocab, (batch, g), generator=gen)
    # make some drafts likely to be accepted: copy the target's most likely token
    copy = torch.rand(batch, g, generator=gen) < 0.5
    drafts = torch.where(copy, p[:, :g].float().argmax(-1), drafts)
    drafts[0, -1] = -1  # padding id: always rejected
    counts = torch.randint(0, g + 1, (batch,), generator=gen)
    uniforms = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
    uniforms[1, 0] = 0.0  # an endpoint coin
    return p, q, drafts, counts, uniforms


def as_lists(t):
    return t.float().tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ragged", [False, True])
def test_rejection_sample_matches_loop(dtype, seed, ragged):
    p, q, drafts, counts, uniforms = chain_case(seed, dtype)
    counts = counts if ragged else None
    out, acc = ops.rejection_sample(p, q, drafts, uniforms=uniforms, num_draft_tokens=counts, backend="torch")
    for b in range(drafts.shape[0]):
        n_b = drafts.shape[1] if counts is None else int(counts[b])
        want = oracles.rejection_sample(as_lists(p[b]), as_lists(q[b]), drafts[b].tolist(), uniforms[b].tolist(), n_b)
        assert (out[b].tolist(), int(acc[b])) == want


def test_rejection_sample_edge_rows():
    """p == q (empty residual), q == 0 where p > 0, NaN and all-zero rows, one-hot p."""
    vocab = 6
    p = torch.full((5, 2, vocab), 1.0 / vocab)
    q = p[:, :1].clone()
    q[1, 0] = torch.tensor([0, 0.5, 0.5, 0, 0, 0])  # draft 0 has q == 0 < p: always accepted
    p[2, 0] = float("nan")
    q[2, 0] = float("nan")
    p[3, :] = 0.0  # no mass anywhere: the lowest index comes out
    p[4, 0] = torch.nn.functional.one_hot(torch.tensor(3), vocab).float()
    drafts = torch.tensor([[2], [0], [1], [1], [3]])
    uniforms = torch.tensor([[0.99, 0.5]] * 5)
    out, acc = ops.rejection_sample(p, q, drafts, uniforms=uniforms, backend="torch")
    for b in range(5):
        want = oracles.rejection_sample(as_lists(p[b]), as_lists(q[b]), drafts[b].tolist(), uniforms[b].tolist(), 1)
        assert (out[b].tolist(), int(acc[b])) == want
    assert acc.tolist() == [1, 1, 0, 0, 1]
    assert out[3, 0] == 0 and out[2, 0] == 0  # rejected with no mass: in range, lowest id
    assert ((out >= -1) & (out < vocab)).all()


def test_seeded_rejection_sample_is_batch_invariant():
    p, q, drafts, _, _ = chain_case(3, torch.float32, batch=6)
    seeds = torch.arange(100, 106)
    offsets = torch.arange(6) * 7
    out, acc = ops.rejection_sample(p, q, drafts, seed=seeds, offsets=offsets, backend="torch")
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    out_p, acc_p = ops.rejection_sample(p[perm], q[perm], drafts[perm], seed=seeds[perm], offsets=offsets[perm],
                                        backend="torch")
    assert torch.equal(out_p, out[perm]) and torch.equal(acc_p, acc[perm])
    single = ops.rejection_sample(p[2:3], q[2:3], drafts[2:3], seed=seeds[2:3], offsets=offsets[2:3], backend="torch")
    assert torch.equal(single[0], out[2:3])
    again = ops.rejection_sample(p, q, drafts, seed=seeds, offsets=offsets, backend="torch")
    assert torch.equal(again[0], out)
    moved = ops.rejection_sample(p, q, drafts, seed=seeds, offsets=offsets + 1, backend="torch")
    assert not torch.equal(moved[0], out)  # new positions, new coins


def test_seeded_draws_follow_documented_philox_counters():
    """Seeded mode equals uniforms mode fed with the documented counter-based draws."""
    p, q, drafts, _, _ = chain_case(4, torch.float32, batch=3)
    batch, g = drafts.shape
    seed, offsets = 1234, torch.tensor([0, 5, 9])
    out, acc = ops.rejection_sample(p, q, drafts, seed=seed, offsets=offsets, backend="torch")
    rows = torch.arange(batch)
    coins = rng.philox_uniform(seed, offsets.unsqueeze(1) + torch.arange(g), rows.unsqueeze(1),
                                         rng.SALT_ACCEPT)
    final = rng.philox_uniform(seed, offsets + acc, rows, rng.SALT_FINAL)
    out_u, acc_u = ops.rejection_sample(p, q, drafts, uniforms=torch.cat([coins, final.unsqueeze(1)], 1), backend="torch")
    assert torch.equal(out, out_u) and torch.equal(acc, acc_u)


def logits_case(seed, dtype, batch=5, g=4, vocab=12):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, g + 1, vocab, generator=gen)
    logits[0, 1, 3:6] = logits[0, 1].max() + 1  # a three-way tie for the top
    logits[1, 2] = float("nan")
    logits[2, 0, 4] = float("nan")
    logits = logits.to(dtype)
    top = oracles_argmax(logits)
    drafts = torch.where(torch.rand(batch, g, generator=gen) < 0.7, top[:, :g],
                         torch.randint(0, vocab, (batch, g), generator=gen))
    drafts[0, 1] = 5  # tied with the argmax (3) but not the argmax
    counts = torch.randint(0, g + 1, (batch,), generator=gen)
    return logits, drafts, counts


def oracles_argmax(logits):
    return torch.tensor([[oracles.argmax(row) for row in rows] for rows in logits.float().tolist()])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ragged", [False, True])
def test_greedy_relaxed_bild_match_loops(dtype, seed, ragged):
    logits, drafts, counts = logits_case(seed, dtype)
    counts = counts if ragged else None
    lists = logits.float().tolist()
    for beta, tau in [(1, 5.0), (3, 0.0), (2, 0.7), (4, 3.0)]:
        out, acc = ops.relaxed_verify(logits, drafts, top_beta=beta, tau=tau, num_draft_tokens=counts, backend="torch")
        for b in range(len(lists)):
            n_b = drafts.shape[1] if counts is None else int(counts[b])
            assert (out[b].tolist(), int(acc[b])) == oracles.relaxed(lists[b], drafts[b].tolist(), n_b, beta, tau)
    out, acc = ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="torch")
    for b in range(len(lists)):
        n_b = drafts.shape[1] if counts is None else int(counts[b])
        assert (out[b].tolist(), int(acc[b])) == oracles.greedy(lists[b], drafts[b].tolist(), n_b)
    clean = torch.nan_to_num(logits.float(), nan=0.0).to(dtype)  # BiLD's NLL needs finite rows
    for threshold in (0.5, 2.0, 4.0):
        out, acc = ops.bild_verify(clean, drafts, rollback_threshold=threshold, num_draft_tokens=counts, backend="torch")
        for b in range(len(lists)):
            n_b = drafts.shape[1] if counts is None else int(counts[b])
            want = oracles.bild(clean[b].float().tolist(), drafts[b].tolist(), n_b, threshold)
            assert (out[b].tolist(), int(acc[b])) == want


@pytest.mark.parametrize("seed", range(4))
def test_relaxed_with_beta_1_or_tau_0_is_greedy(seed):
    logits, drafts, counts = logits_case(seed, torch.float32, batch=8)
    greedy = ops.greedy_verify(logits, drafts, num_draft_tokens=counts)
    for beta, tau in [(1, 0.0), (1, 100.0), (50, 0.0)]:
        relaxed = ops.relaxed_verify(logits, drafts, top_beta=beta, tau=tau, num_draft_tokens=counts)
        assert torch.equal(relaxed[0], greedy[0]) and torch.equal(relaxed[1], greedy[1])


def test_bild_and_greedy_treat_nan_logits_as_minus_inf():
    logits = torch.zeros(2, 2, 4)
    logits[:, 0, 2] = 5.0
    logits[:, 0, 1] = float("nan")
    drafts = torch.tensor([[2], [1]])  # row 1 drafted the NaN entry: NLL = inf, rolled back
    out, acc = ops.bild_verify(logits, drafts, rollback_threshold=10.0)
    assert acc.tolist() == [1, 0] and out[1, 0] == 2
    out, acc = ops.greedy_verify(logits, drafts)
    assert acc.tolist() == [1, 0] and out[1, 0] == 2


def test_max_prob_and_fallback_check():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0], [float("-inf")] * 4,
                           [float("nan"), 1.0, 1.0, float("nan")], [float("inf"), 0.0, 0.0, 0.0]])
    got = ops.max_prob(logits)
    want = torch.tensor([0.25, 1 / (1 + 3 * math.exp(-10)), 0.0, 0.5, 1.0])
    assert torch.allclose(got, want)
    assert ops.fallback_check(logits, 0.6).tolist() == [True, False, True, True, False]
    assert ops.max_prob(logits.reshape(1, 5, 4)).shape == (1, 5)


def random_tree(gen, n, max_children=3):
    parents = [-1]
    for i in range(1, n):
        candidates = [j for j in range(i) if parents.count(j) < max_children]
        parents.append(candidates[int(torch.randint(0, len(candidates), (1,), generator=gen))])
    return parents


def tree_case(seed, dtype, batch=4, n=9, vocab=7):
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor([random_tree(gen, n) for _ in range(batch)])
    parents[1, 6:] = -1  # a smaller tree padded with unused slots
    p = random_probs(batch, n, vocab, generator=gen, dtype=dtype)
    q = random_probs(batch, n, vocab, generator=gen, dtype=dtype)
    tokens = torch.multinomial(q.float().reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
    uniforms = torch.rand(batch, n, generator=gen)
    return p, q, tokens, parents, uniforms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_depth", [None, 1])
def test_tree_ops_match_loops(dtype, seed, max_depth):
    p, q, tokens, parents, uniforms = tree_case(seed, dtype)
    out, acc, nodes = ops.tree_rejection_sample(p, q, tokens, parents, uniforms=uniforms, max_depth=max_depth,
                                                backend="torch")
    depth = reference.max_tree_depth(parents) if max_depth is None else max_depth
    assert out.shape == (4, depth + 1)
    for b in range(4):
        want = oracles.tree_rejection(as_lists(p[b]), as_lists(q[b]), tokens[b].tolist(), parents[b].tolist(),
                                      uniforms[b].tolist(), depth)
        assert (out[b].tolist(), int(acc[b]), nodes[b].tolist()) == want
    logits = torch.log(p.float() + 1e-3).to(dtype)
    logits_tokens = tokens.clone()
    logits_tokens[:, 1::2] = logits.float().argmax(-1).gather(1, parents.clamp(min=0))[:, 1::2]  # force matches
    out, acc, nodes = ops.tree_greedy_verify(logits, logits_tokens, parents, max_depth=max_depth, backend="torch")
    for b in range(4):
        want = oracles.tree_greedy(logits[b].float().tolist(), logits_tokens[b].tolist(), parents[b].tolist(), depth)
        assert (out[b].tolist(), int(acc[b]), nodes[b].tolist()) == want


def test_chain_shaped_tree_reproduces_chain_ops():
    p, q, drafts, _, uniforms = chain_case(7, torch.float32, batch=5, g=3)
    drafts = drafts.clamp(min=0)
    batch, g = drafts.shape
    parents = reference.chain_parents(batch, g + 1)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), drafts], dim=1)
    node_q = torch.cat([torch.zeros_like(q[:, :1]), q], dim=1)  # node i+1 was drawn from q[:, i]
    node_u = torch.cat([uniforms[:, g:], uniforms[:, :g]], dim=1)  # column 0 is the final draw
    chain = ops.rejection_sample(p, q, drafts, uniforms=uniforms)
    tree = ops.tree_rejection_sample(p, node_q, tokens, parents, uniforms=node_u)
    assert torch.equal(tree[0], chain[0]) and torch.equal(tree[1], chain[1])
    seeded_chain = ops.rejection_sample(p, q, drafts, seed=11, offsets=torch.arange(batch))
    seeded_tree = ops.tree_rejection_sample(p, node_q, tokens, parents, seed=11, offsets=torch.arange(batch))
    assert torch.equal(seeded_tree[0], seeded_chain[0])
    greedy_chain = ops.greedy_verify(torch.log(p), drafts)
    greedy_tree = ops.tree_greedy_verify(torch.log(p), tokens, parents)
    assert torch.equal(greedy_tree[0], greedy_chain[0]) and torch.equal(greedy_tree[1], greedy_chain[1])


@pytest.fixture(params=["flash_cpu", "einsum"])
def attention_path(request, monkeypatch):
    """The reference's two CPU paths: torch's fused CPU kernel, and the einsum path other devices take."""
    if request.param == "einsum":
        monkeypatch.setattr(reference_attention, "_FLASH_CPU", None)
    elif reference_attention._FLASH_CPU is None:
        pytest.skip("this torch has no _scaled_dot_product_flash_attention_for_cpu")
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_tree", [False, True])
@pytest.mark.parametrize("page_size", [None, 1, 5], ids=["contiguous", "paged1", "paged5"])
def test_tree_attention_matches_per_node_loop(dtype, use_tree, page_size, attention_path):
    gen = torch.Generator().manual_seed(1)
    batch, n, hq, hkv, d, s_max = 3, 6, 4, 2, 8, 24
    q = torch.randn(batch, n, hq, d, generator=gen).to(dtype)
    k = torch.randn(batch, hkv, s_max, d, generator=gen).to(dtype)
    v = torch.randn(batch, hkv, s_max, d, generator=gen).to(dtype)
    block_table = None
    if page_size is not None:
        k, block_table = paged_from_contiguous(k, page_size, generator=torch.Generator().manual_seed(2), spare_pages=2)
        v, _ = paged_from_contiguous(v, page_size, generator=torch.Generator().manual_seed(2), spare_pages=2)
    seq_lens = torch.tensor([0, 5, 17])
    parents = torch.tensor([random_tree(gen, n) for _ in range(batch)]) if use_tree else None
    out, lse = ops.tree_attention(q, k, v, seq_lens, parents, block_table=block_table, backend="torch")
    want_out, want_lse = oracles.tree_attention(q, k, v, seq_lens, parents, block_table, 1 / math.sqrt(d))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.double(), torch.tensor(want_out, dtype=torch.float64), atol=tol, rtol=tol)
    assert torch.allclose(lse.double(), torch.tensor(want_lse, dtype=torch.float64), atol=1e-5, rtol=1e-5)


def test_tree_attention_of_zero_new_tokens_is_empty(attention_path):
    """N = 0 (a row with nothing drafted) returns empty outputs: torch's fused CPU kernel used to die of
    SIGFPE on zero query rows, taking the process with it."""
    q = torch.randn(2, 0, 4, 8)
    k, v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    out, lse = ops.tree_attention(q, k, v, torch.tensor([3, 9]), None, backend="torch")
    assert out.shape == (2, 0, 4, 8) and lse.shape == (2, 0, 4) and lse.dtype == torch.float32


def test_paged_from_contiguous_round_trips():
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(3, 2, 11, 4, generator=gen)
    pool, block_table = paged_from_contiguous(cache, 4, generator=gen, spare_pages=3)
    assert pool.shape == (3 * 3 + 3, 4, 2, 4) and block_table.shape == (3, 3) and block_table.dtype == torch.int32
    assert len(set(block_table.flatten().tolist())) == 9  # every page used once
    for b in range(3):
        assert torch.equal(row_kv(pool, b, 11, block_table), cache[b])
    assert bool(pool[block_table[0, 2].long(), 3:].isnan().all())  # slots past S_max are never filled


def test_kv_rollback_and_compact():
    batch, layers, hkv, s_max, d = 3, 2, 2, 12, 4
    caches = [torch.randn(batch, hkv, s_max, d) for _ in range(2 * layers)]
    before = [c.clone() for c in caches]
    seq_lens = torch.tensor([2, 0, 5])
    accepted = torch.tensor([[0, 2, 5], [0, -1, -1], [0, 1, 3]])
    new = ops.kv_compact(caches[:layers], caches[layers:], seq_lens, accepted)
    assert new.tolist() == [5, 1, 8]
    for cache, old in zip(caches, before):
        for b in range(batch):
            for j, node in enumerate(accepted[b].tolist()):
                if node >= 0:
                    assert torch.equal(cache[b, :, seq_lens[b] + j], old[b, :, seq_lens[b] + node])
            untouched = list(range(int(seq_lens[b]))) + list(range(int(new[b]), s_max))
            moved_from = [int(seq_lens[b]) + node for node in accepted[b].tolist() if node >= 0]
            for pos in untouched:
                if pos not in moved_from or pos < int(new[b]):
                    assert torch.equal(cache[b, :, pos], old[b, :, pos])
    assert ops.kv_rollback(seq_lens, torch.tensor([0, 3, 1])).tolist() == [3, 4, 7]
    assert ops.kv_rollback(seq_lens.int(), torch.tensor([0, 3, 1])).dtype == torch.int32


@pytest.mark.parametrize("norm", ["rms", "layer", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_early_exit_topk_matches_loop(norm, dtype):
    gen = torch.Generator().manual_seed(2)
    batch, hidden, vocab, k = 3, 16, 40, 5
    h = torch.randn(batch, hidden, generator=gen).to(dtype)
    w = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    bias = torch.randn(hidden, generator=gen).to(dtype) if norm == "layer" else None
    head = torch.randn(vocab, hidden, generator=gen).to(dtype)
    head[7] = head[3]  # duplicate rows: exact ties, the lower id must come first
    values, indices = ops.early_exit_topk(h, w, head, k, eps=1e-5, norm=norm, norm_bias=bias, backend="torch")
    for b in range(batch):
        x = h[b].double().tolist()
        if norm == "rms":
            r = 1 / math.sqrt(sum(v * v for v in x) / hidden + 1e-5)
            x = [v * r * float(wi) for v, wi in zip(x, w.double().tolist())]
        elif norm == "layer":
            m = sum(x) / hidden
            r = 1 / math.sqrt(sum((v - m) ** 2 for v in x) / hidden + 1e-5)
            x = [(v - m) * r * float(wi) + float(bi) for v, wi, bi in zip(x, w.double().tolist(), bias.double().tolist())]
        logits = [sum(a * c for a, c in zip(x, row)) for row in head.double().tolist()]
        order = sorted(range(vocab), key=lambda i: (-logits[i], i))[:k]
        assert indices[b].tolist() == order
        assert torch.allclose(values[b].double(), torch.tensor([logits[i] for i in order], dtype=torch.float64),
                              rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rejection_sample_logits_is_rejection_sample_on_tempered_softmax(dtype):
    gen = torch.Generator().manual_seed(5)
    batch, g, vocab = 4, 3, 10
    target = (torch.randn(batch, g + 1, vocab, generator=gen) * 2).to(dtype)
    draft = (torch.randn(batch, g, vocab, generator=gen) * 2).to(dtype)
    drafts = torch.randint(0, vocab, (batch, g), generator=gen)
    uniforms = torch.rand(batch, g + 1, generator=gen)
    for temperature in (0.5, 1.0, torch.tensor([0.3, 1.0, 2.0, 5.0])):
        t = temperature.view(-1, 1, 1) if isinstance(temperature, torch.Tensor) else temperature
        p = torch.softmax(target.float() / t, -1)
        q = torch.softmax(draft.float() / t, -1)
        want = ops.rejection_sample(p, q, drafts, uniforms=uniforms)
        got = ops.rejection_sample_logits(target, draft, drafts, temperature=temperature, uniforms=uniforms)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for b in range(batch):  # and against the slow loop on the same probabilities
            assert (got[0][b].tolist(), int(got[1][b])) == oracles.rejection_sample(
                p[b].tolist(), q[b].tolist(), drafts[b].tolist(), uniforms[b].tolist(), g)
    with pytest.raises(ValueError, match="rejection_sample_logits: `temperature` must be > 0"):
        ops.rejection_sample_logits(target, draft, drafts, temperature=0.0, uniforms=uniforms)
    with pytest.raises(ValueError, match="rejection_sample_logits: `temperature` must be > 0 in every row"):
        ops.rejection_sample_logits(target, draft, drafts, temperature=torch.tensor([1.0, 0.0, 1.0, 1.0]),
                                    uniforms=uniforms)


def test_fallback_check_accepts_every_backend_of_max_prob():
    logits = torch.randn(3, 20)
    want = ops.fallback_check(logits, 0.3)
    assert torch.equal(ops.fallback_check(logits, 0.3, backend="torch"), want)


@pytest.mark.parametrize("seed", range(6))
def test_tree_depths_and_ancestor_mask_vs_walking_up(seed):
    """Pointer-jumping depths / ancestor bits == walking each node up to the root, on random trees
    of 1..70 nodes (deep chains included) with unused slots."""
    gen = torch.Generator().manual_seed(seed)
    for n in (1, 2, 3, 17, 64, 70):
        parents = torch.full((3, n), -1, dtype=torch.int64)
        for b in range(3):
            for i in range(1, n):
                roll = torch.rand((), generator=gen).item()
                if roll < 0.15:
                    continue  # unused slot
                candidates = [j for j in range(i) if j == 0 or parents[b, j] >= 0]
                parents[b, i] = i - 1 if roll < 0.5 and parents[b, i - 1] >= 0 or i == 1 else \
                    candidates[int(torch.randint(len(candidates), (), generator=gen))]
        parents[0] = torch.arange(n) - 1  # row 0: a chain, the deepest tree of n nodes
        depths, mask = reference.tree_depths(parents), reference.ancestor_mask(parents)
        for b in range(3):
            row = parents[b].tolist()
            for i in range(n):
                path = oracles.root_to_node_path(row, i) if i == 0 or row[i] >= 0 else [i]
                assert depths[b, i].item() == len(path) - 1
                assert sorted(torch.nonzero(mask[b, i]).flatten().tolist()) == path
