"""`integrations.flashinfer`: FlashInfer's `chain_speculative_sampling` (current and uniform-samples
forms) on our ops, every backend this machine runs.

Three groups:
- the assertions of FlashInfer's own spec-sampling tests (tests/utils/test_sampling.py,
  tests/utils/test_chain_speculative_reduction.py, tests/utils/test_sampling_seed_offset.py,
  tests/trace/test_chain_speculative_sampling_reference_correctness.py and the docstring example
  of flashinfer/sampling.py), restated in our own code;
- chi-square tests of every sampled output (torch, and cuda where present; the Triton backend is
  shown bit-identical to torch through these entry points instead, since the interpreter runs
  each program in numpy);
- one test per difference listed in docs/flashinfer-sglang.md (each named after its difference).

No FlashInfer is imported: its facts are restated, its code is not.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from specdec_kernels import ops
from specdec_kernels.integrations import flashinfer as fi
from specdec_kernels.integrations.flashinfer import chain_speculative_sampling, chain_speculative_sampling_legacy
from specdec_kernels.common import rng
from specdec_kernels.common.draws import draft_passes
from gpu_support import backends_here

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter NaN math


BACKENDS = backends_here("rejection_sample")
INTERPRETED = set() if GPU else {"triton"}  # one numpy pass per program: tiny shapes only
FAST = [b for b in BACKENDS if b not in INTERPRETED]  # statistics need many rows


def normalized(gen, *shape) -> torch.Tensor:
    x = torch.rand(*shape, generator=gen)
    return (x / x.sum(dim=-1, keepdim=True)).to(DEV)


def counters(batch, dtype=torch.int32):
    return torch.zeros(batch, dtype=dtype, device=DEV), torch.zeros(batch, dtype=dtype, device=DEV)


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def chi_square_p(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of `samples` (ids) against `probs`, bins with expected count < 5 pooled;
    a sample on a zero-probability id fails outright."""
    probs = probs.double().cpu().numpy()
    probs = probs / probs.sum()
    counts = np.bincount(samples.cpu().numpy(), minlength=len(probs)).astype(float)
    assert counts[probs == 0].sum() == 0, "drew a token of probability 0"
    expected = probs * counts.sum()
    keep = expected >= 5
    obs, exp = list(counts[keep]), list(expected[keep])
    if (~keep & (probs > 0)).any():
        obs.append(counts[~keep].sum())
        exp.append(expected[~keep].sum())
    return float(stats.chisquare(obs, exp).pvalue) if len(obs) > 1 else 1.0


# ============================================================== ported FlashInfer assertions

DOC_DRAFT = [[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]]
DOC_TARGET = [[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_docstring_example(backend):
    """flashinfer/sampling.py's example (both forms): draft 2 passes surely (p >= q), draft 1 surely
    fails (p = 0) and the residual max(0, p - q) is all on token 0: [[2, 0, -1]], 1 accepted, 1 emitted."""
    draft, target = torch.tensor(DOC_DRAFT, device=DEV), torch.tensor(DOC_TARGET, device=DEV)
    ids = torch.tensor([[2, 1]], dtype=torch.int32, device=DEV)
    want = torch.tensor([[2, 0, -1]], dtype=torch.int32, device=DEV)
    one = torch.ones(1, dtype=torch.int32, device=DEV)
    for kwargs in ({}, dict(seed=42, offset=0)):
        out, accepted, emitted = chain_speculative_sampling(draft, ids, target, backend=backend, **kwargs)
        assert out.dtype == accepted.dtype == emitted.dtype == torch.int32
        assert same((out, accepted, emitted), (want, one, one))
    u = torch.tensor([[0.8823, 0.9150, 0.3829]], device=DEV)  # the legacy example's uniforms
    assert same(chain_speculative_sampling_legacy(draft, ids, u, target, backend=backend), (want, one, one))


def assert_valid_chain(out, drafts, emitted, accepted, vocab):
    """test_sampling.py::test_chain_speculative_sampling's checks, plus accepted >= emitted."""
    batch, g = drafts.shape
    assert out.shape == (batch, g + 1) and out.dtype == torch.int32
    assert bool((out[out >= 0] < vocab).all()) and bool((out >= -1).all())
    mismatch = out[:, :-1] != drafts
    for row in range(batch):
        where = torch.nonzero(mismatch[row]).flatten()
        if len(where):
            assert torch.equal(where, torch.arange(int(where[0]), g, device=out.device))  # contiguous to the end
            assert bool((out[row, int(where[0]) + 1:] == -1).all())
    assert torch.equal(emitted + 1, (out != -1).sum(dim=1).to(emitted.dtype))
    assert bool((accepted >= emitted).all()) and bool((accepted <= g).all())


CHAIN_CASES = {"torch": [(1, 111, 1), (99, 111, 3), (99, 32000, 5), (7, 128256, 7)],
               "triton": [(2, 111, 1), (3, 111, 3)]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("onehot_target", [False, True])
def test_outputs_are_valid_chains(backend, onehot_target):
    """test_sampling.py::test_chain_speculative_sampling: ids below V, -1 after the first mismatch,
    emitted + 1 real tokens; a one-hot target agreeing with the drafts gives its own ids exactly."""
    gen = torch.Generator().manual_seed(1)
    for batch, vocab, g in CHAIN_CASES.get(backend, CHAIN_CASES["torch"]):
        draft = normalized(gen, batch, g, vocab)
        drafts = torch.randint(vocab, (batch, g), generator=gen).to(DEV)
        if onehot_target:
            target_ids = torch.randint(vocab, (batch, g + 1), generator=gen).to(DEV)
            target_ids[:, :g] = drafts
            target = torch.zeros(batch, g + 1, vocab, device=DEV).scatter_(2, target_ids.unsqueeze(-1), 1.0)
        else:
            target = normalized(gen, batch, g + 1, vocab)
        for trial in range(1 if backend in INTERPRETED else 3):
            accepted, emitted = counters(batch)
            out, accepted, emitted = chain_speculative_sampling(draft, drafts, target, accepted, emitted,
                                                                seed=trial, offset=0, backend=backend)
            if onehot_target:
                assert torch.equal(out, target_ids.to(torch.int32))
                assert bool((accepted == g).all()) and bool((emitted == g).all())
            assert_valid_chain(out, drafts, emitted, accepted, vocab)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch, g, vocab", [(3, 4, 128), (2, 3, 96)])
def test_one_hot_draft_equal_to_one_hot_target(backend, batch, g, vocab):
    """tests/trace reference test: one-hot drafts equal to a one-hot target accept every draft and
    emit the target's fixed bonus token."""
    gen = torch.Generator().manual_seed(2)
    drafts = torch.randint(vocab, (batch, g), generator=gen).to(DEV)
    bonus = torch.randint(vocab, (batch, 1), generator=gen).to(DEV)
    draft = torch.zeros(batch, g, vocab, device=DEV).scatter_(2, drafts.unsqueeze(-1), 1.0)
    target_ids = torch.cat([drafts, bonus], dim=1)
    target = torch.zeros(batch, g + 1, vocab, device=DEV).scatter_(2, target_ids.unsqueeze(-1), 1.0)
    out, _, _ = chain_speculative_sampling(draft, drafts.int(), target, *counters(batch), deterministic=True,
                                           backend=backend)
    assert torch.equal(out, target_ids.to(torch.int32))


def reduction_case(gen, batch, g, vocab):
    draft = normalized(gen, batch, g, vocab)
    drafts = torch.randint(vocab, (batch, g), generator=gen, dtype=torch.int32).to(DEV)
    return draft, drafts, normalized(gen, batch, g + 1, vocab)


TILE_VOCABS = {"torch": [33, 1023, 1024, 1025, 4095, 4096, 4097, 32001, 151937], "triton": [33, 1023, 1024, 1025, 4097]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_vocabulary_tile_boundaries(backend):
    """test_chain_speculative_reduction.py::test_chain_spec_tile_boundaries (seed 12345, offset 17):
    position 0 always holds a real token, every real token is below V, emitted + 1 real tokens."""
    gen = torch.Generator().manual_seed(20260913)
    batch = 2 if backend in INTERPRETED else 4
    for vocab in TILE_VOCABS.get(backend, TILE_VOCABS["torch"]):
        for g in ((1,) if backend in INTERPRETED else (1, 3)):
            draft, drafts, target = reduction_case(gen, batch, g, vocab)
            for deterministic in (False, True):
                out, accepted, emitted = chain_speculative_sampling(
                    draft, drafts, target, *counters(batch), deterministic=deterministic, seed=12345, offset=17,
                    backend=backend)
                assert out.shape == (batch, g + 1)
                assert bool((out[:, 0] >= 0).all())
                valid = out[out >= 0]
                assert valid.numel() >= batch and bool((valid < vocab).all())
                assert torch.equal(emitted + 1, (out != -1).sum(dim=1).int())


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_target_is_exact_at_large_vocabularies(backend):
    """test_chain_spec_onehot_target_is_exact: a one-hot target agreeing with every draft pins the output."""
    gen = torch.Generator().manual_seed(20260913)
    batch, g = (2, 3) if backend in INTERPRETED else (4, 3)
    for vocab in ([4097] if backend in INTERPRETED else [4097, 151937]):
        draft = normalized(gen, batch, g, vocab)
        drafts = torch.randint(vocab, (batch, g), generator=gen, dtype=torch.int32).to(DEV)
        target_ids = torch.randint(vocab, (batch, g + 1), generator=gen, dtype=torch.int32).to(DEV)
        target_ids[:, :g] = drafts
        target = torch.zeros(batch, g + 1, vocab, device=DEV).scatter_(2, target_ids.long().unsqueeze(-1), 1.0)
        for deterministic in (False, True):
            out, _, _ = chain_speculative_sampling(draft, drafts, target, *counters(batch),
                                                   deterministic=deterministic, seed=12345, offset=17, backend=backend)
            assert torch.equal(out, target_ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_disjoint_supports_reject_every_draft(backend):
    """test_chain_spec_all_draft_rejected: the residual lives in the target's half, the rest is -1,
    nothing emitted and nothing accepted."""
    batch, g = (2, 3) if backend in INTERPRETED else (4, 3)
    for vocab in ([1024] if backend in INTERPRETED else [1024, 8193]):
        half = vocab // 2
        draft = torch.zeros(batch, g, vocab, device=DEV)
        draft[..., :half] = 1.0 / half
        target = torch.zeros(batch, g + 1, vocab, device=DEV)
        target[..., half:] = 1.0 / (vocab - half)
        drafts = torch.zeros(batch, g, dtype=torch.int32, device=DEV)
        out, accepted, emitted = chain_speculative_sampling(draft, drafts, target, *counters(batch), seed=12345,
                                                            offset=17, backend=backend)
        assert bool((out[:, 0] >= half).all()) and bool((out[:, 1:] == -1).all())
        assert bool((emitted == 0).all()) and bool((accepted == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_residual_with_one_nonzero_index(backend):
    """test_chain_spec_residual_has_one_nonzero_index: the draft's token has no target mass and
    the residual is all on V - 1."""
    batch = 2 if backend in INTERPRETED else 4
    for vocab in ([1025] if backend in INTERPRETED else [1025, 32001]):
        draft = torch.zeros(batch, 1, vocab, device=DEV)
        draft[..., 0] = 1.0
        target = torch.zeros(batch, 2, vocab, device=DEV)
        target[:, 0, vocab - 1] = 1.0
        target[:, 1, 0] = 1.0
        drafts = torch.zeros(batch, 1, dtype=torch.int32, device=DEV)
        out, accepted, _ = chain_speculative_sampling(draft, drafts, target, *counters(batch), seed=12345, offset=17,
                                                      backend=backend)
        assert bool((out[:, 0] == vocab - 1).all()) and bool((out[:, 1:] == -1).all())
        assert bool((accepted == 0).all())


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("vocab", [4097, 32001])
def test_residual_normaliser_selects_the_token(backend, vocab):
    """test_chain_spec_residual_normalizer_selects_token: mass on every 65th id rising with the id;
    every row resamples (accepted 0, -1 after), lands on a weighted id, and the mean id is within
    6 standard errors (FlashInfer's assertion); here also a chi-square over the ids."""
    batch = 512
    draft = torch.zeros(batch, 1, vocab, device=DEV)
    draft[..., 0] = 1.0
    idx = torch.arange(1, vocab, 65, device=DEV)
    weights = torch.arange(1, idx.numel() + 1, device=DEV, dtype=torch.float32)
    probs = weights / weights.sum()
    target = torch.zeros(batch, 2, vocab, device=DEV)
    target[:, 0, idx] = probs
    target[:, 1, 0] = 1.0
    drafts = torch.zeros(batch, 1, dtype=torch.int32, device=DEV)
    drawn = []
    for seed in (12345, 999, 7):
        out, accepted, _ = chain_speculative_sampling(draft, drafts, target, *counters(batch), seed=seed, offset=17,
                                                      backend=backend)
        assert bool((accepted == 0).all()) and bool((out[:, 1:] == -1).all())
        assert bool(torch.isin(out[:, 0], idx.int()).all())
        drawn.append(out[:, 0].long())
    drawn = torch.cat(drawn)
    mean = (idx.double() * probs.double()).sum()
    var = ((idx.double() - mean) ** 2 * probs.double()).sum()
    assert abs(float(drawn.double().mean() - mean)) < 6 * float((var / drawn.numel()).sqrt())
    assert chi_square_p(drawn, target[0, 0]) > 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_counters_accumulate_across_calls(backend):
    """test_chain_spec_counters_accumulate_across_calls: the target agrees with the draft, so each
    call adds exactly one to both counters (and they are the caller's tensors)."""
    batch, vocab = (2, 4097) if backend in INTERPRETED else (4, 4097)
    draft = torch.zeros(batch, 1, vocab, device=DEV)
    draft[..., 0] = 1.0
    target = torch.zeros(batch, 2, vocab, device=DEV)
    target[:, :, 0] = 1.0
    drafts = torch.zeros(batch, 1, dtype=torch.int32, device=DEV)
    accepted, emitted = counters(batch)
    for call in range(1, 4):
        out, acc, emi = chain_speculative_sampling(draft, drafts, target, accepted, emitted, seed=12345, offset=17,
                                                   backend=backend)
        assert acc is accepted and emi is emitted
        assert bool((out[:, 0] == 0).all()) and bool((accepted == call).all()) and bool((emitted == call).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_are_read_at_call_time(backend):
    """test_chain_spec_graph_replay_updates_input without the graph: with the same seed/offset
    tensors, rewriting the only resampleable id moves the output (the GPU test below replays a graph)."""
    batch, vocab = 2, 1025
    draft = torch.zeros(batch, 1, vocab, device=DEV)
    draft[..., 0] = 1.0
    target = torch.zeros(batch, 2, vocab, device=DEV)
    target[:, 1, 0] = 1.0
    drafts = torch.zeros(batch, 1, dtype=torch.int32, device=DEV)
    seed = torch.tensor([12345], dtype=torch.uint64, device=DEV)
    offset = torch.tensor([17], dtype=torch.uint64, device=DEV)
    for token in (1024, 512, 1):
        target[:, 0].zero_()
        target[:, 0, token] = 1.0
        out, _, _ = chain_speculative_sampling(draft, drafts, target, seed=seed, offset=offset, backend=backend)
        assert bool((out[:, 0] == token).all())


@pytest.mark.gpu
@pytest.mark.skipif("cuda" not in BACKENDS, reason="needs a CUDA GPU and the built specdec_kernels._C")
def test_cuda_graph_replay_reads_the_current_inputs():
    """test_chain_spec_graph_replay_updates_input: captured with seed/offset tensors, each replay
    follows the rewritten target and equals an eager call."""
    batch, vocab = 4, 8193
    draft = torch.zeros(batch, 1, vocab, device=DEV)
    draft[..., 0] = 1.0
    target = torch.zeros(batch, 2, vocab, device=DEV)
    target[:, 1, 0] = 1.0
    target[:, 0, 8192] = 1.0
    drafts = torch.zeros(batch, 1, dtype=torch.int32, device=DEV)
    accepted, emitted = counters(batch)
    seed = torch.tensor([12345], dtype=torch.uint64, device=DEV)
    offset = torch.tensor([17], dtype=torch.uint64, device=DEV)

    def call():
        return chain_speculative_sampling(draft, drafts, target, accepted, emitted, seed=seed, offset=offset,
                                          backend="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, _ = call()
    for token in (8192, 4096, 1023, 1):
        target[:, 0].zero_()
        target[:, 0, token] = 1.0
        graph.replay()
        torch.cuda.synchronize()
        assert bool((out[:, 0] == token).all())
        assert torch.equal(out, call()[0])


def chain_sampler(reject_at: int):
    """test_sampling_seed_offset.py's chain case: draft 0 everywhere; the target agrees before
    `reject_at` and elsewhere is uniform over ids 1..256 (so 3 = every draft accepted)."""
    draft = torch.zeros(4, 3, 257, device=DEV)
    draft[:, :, 0] = 1
    target = torch.full((4, 4, 257), 1 / 256, device=DEV)
    target[:, :, 0] = 0
    target[:, :reject_at] = draft[:, :reject_at]
    return draft, torch.zeros(4, 3, dtype=torch.int32, device=DEV), target


def rows(case, index):
    return tuple(x[index] for x in case)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("reject_at", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
@pytest.mark.parametrize("seed_size, offset_size", [(4, 4), (1, 4), (4, 1), (1, 1)])
def test_seed_and_offset_tensors_follow_requests(backend, reject_at, dtype, seed_size, offset_size):
    """test_sampling_seed_offset.py::test_chain_sampling_row_seed_offset (FlashInfer main, 17ab765):
    tensor keys name requests, length-1 tensors too, so each row equals that request sampled alone
    (its own element, or the one element of a length-1 tensor), also in any reordered subset of rows."""
    case = chain_sampler(reject_at)
    seed = torch.tensor([17, 324, 907, 1049][:seed_size], dtype=dtype, device=DEV)
    offset = torch.tensor([0, 128, 512, 1024][:offset_size], dtype=dtype, device=DEV)
    got = chain_speculative_sampling(*case, seed=seed, offset=offset, backend=backend)
    assert bool((got[0][:, reject_at] > 0).all())  # the resampled (or bonus) token is a real, nonzero id
    for row in range(4):
        s, o = seed[min(row, seed_size - 1)].view(1), offset[min(row, offset_size - 1)].view(1)
        alone = chain_speculative_sampling(*rows(case, [row]), seed=s, offset=o, backend=backend)
        assert same(tuple(x[row:row + 1] for x in got), alone), row
    for subset in ([3, 1, 0, 2], [3, 1], [2]):
        pick = torch.tensor(subset, device=DEV)
        s = seed.view(torch.int64)[pick].view(dtype) if seed_size > 1 else seed
        o = offset.view(torch.int64)[pick].view(dtype) if offset_size > 1 else offset
        again = chain_speculative_sampling(*rows(case, pick), seed=s, offset=o, backend=backend)
        assert same(tuple(x[pick] for x in got), again), subset


@pytest.mark.parametrize("backend", FAST)
def test_a_length_one_tensor_is_one_request_for_every_row(backend):
    """The newest rule on a batch of 4 with seed=tensor([17]): each row's tokens are that row sampled
    alone with the same tensors, so four copies of one request give four equal rows. An int seed
    keeps FlashInfer's scalar rule, one stream per batch row: the same four copies then differ."""
    gen = torch.Generator().manual_seed(23)
    draft, drafts, target = adversarial_case(gen, batch=4, g=3, vocab=50)
    seed = torch.tensor([17], dtype=torch.int64, device=DEV)
    offset = torch.tensor([0], dtype=torch.int64, device=DEV)
    got = chain_speculative_sampling(draft, drafts, target, seed=seed, offset=offset, backend=backend)
    for row in range(4):
        alone = chain_speculative_sampling(*rows((draft, drafts, target), [row]), seed=seed, offset=offset,
                                           backend=backend)
        assert same(tuple(x[row:row + 1] for x in got), alone), row
    copies = rows(chain_sampler(0), [0, 0, 0, 0])  # every row rejects draft 0 and resamples from 256 ids
    first = chain_speculative_sampling(*copies, seed=seed, offset=offset, backend=backend)[0][:, 0]
    assert bool((first == first[0]).all()), first
    first_int = chain_speculative_sampling(*copies, seed=17, offset=0, backend=backend)[0][:, 0]
    assert len(set(first_int.tolist())) > 1, first_int


@pytest.mark.parametrize("backend", FAST)
def test_adjacent_tensor_offsets_do_not_share_draws(backend):
    """test_adjacent_offsets_do_not_share_draws for the chain op: a tensor offset names a stream, it is
    no start position, so offsets o and o + 1 are unrelated draws, while one (seed, offset) pair
    replays in whichever row it lands. Each of g = 2 drafts passes with probability 1/2; were o + 1
    the stream of o moved on by one draw, draft 0's coin at o + 1 would be draft 1's coin at o."""
    batch, vocab = 512, 4
    draft = torch.zeros(batch, 2, vocab, device=DEV)
    draft[..., 0] = 1.0
    target = torch.full((batch, 3, vocab), 0.5 / (vocab - 1), device=DEV)
    target[..., 0] = 0.5  # u * 1 < 0.5: each draft passes with probability 1/2
    drafts = torch.zeros(batch, 2, dtype=torch.int32, device=DEV)
    seed = torch.tensor([17], dtype=torch.int64, device=DEV)
    offsets = torch.arange(batch, dtype=torch.int64, device=DEV)
    _, accepted, emitted = chain_speculative_sampling(draft, drafts, target, seed=seed, offset=offsets,
                                                      backend=backend)
    _, accepted1, emitted1 = chain_speculative_sampling(draft, drafts, target, seed=seed, offset=offsets + 1,
                                                        backend=backend)
    assert torch.equal(accepted1[:-1], accepted[1:]) and torch.equal(emitted1[:-1], emitted[1:])
    seen = emitted >= 1  # draft 0 passed, so draft 1's test is accepted - 1
    draft1_at_o = (accepted - 1)[seen] == 1
    draft0_at_o_plus_1 = emitted1[seen] >= 1
    agree = (draft1_at_o == draft0_at_o_plus_1).float().mean().item()
    assert 0.35 < agree < 0.65, agree  # independent coins agree half the time; shifted ones always


@pytest.mark.parametrize("backend", FAST)
def test_a_repeated_request_replays_the_same_draws(backend):
    """test_repeated_request_rng_replays_same_draw: four copies of one request with one seed/offset
    (uint64 2**63 + 17 and 2**32) give four identical rows."""
    case = rows(chain_sampler(1), [2, 2, 2, 2])
    seed = torch.full((4,), 2**63 + 17, dtype=torch.uint64, device=DEV)
    offset = torch.full((4,), 2**32, dtype=torch.uint64, device=DEV)
    out, accepted, emitted = chain_speculative_sampling(*case, seed=seed, offset=offset, backend=backend)
    for row in range(1, 4):
        assert torch.equal(out[row], out[0]) and accepted[row] == accepted[0] and emitted[row] == emitted[0]


# ============================================================== statistics

def alpha(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Acceptance probability of a draft drawn from q: sum_x min(p(x), q(x))."""
    return torch.minimum(p, q).sum(dim=-1).double()


def sampled_case(gen, batch, g, vocab):
    """One (p, q) per position, shared by every row; each row's drafts drawn from q."""
    q = normalized(gen, g, vocab)
    p = normalized(gen, g + 1, vocab)
    p[0, :2] = q[0, :2]  # some overlap at every position keeps the acceptance rates away from 0
    p = p / p.sum(dim=-1, keepdim=True)
    drafts = torch.stack([torch.multinomial(q[i].cpu(), batch, replacement=True, generator=gen)
                          for i in range(g)], dim=1).to(DEV)
    return q.expand(batch, g, vocab), drafts, p.expand(batch, g + 1, vocab)


def assert_lossless(out, accepted, emitted, q, p):
    """The token at position k (in rows emitting more than k tokens) follows p_k; emitted and
    accepted counts follow the acceptance rates alpha_k (accepted: independent tests per position)."""
    g = q.shape[1]
    a = alpha(p[0, :g], q[0])
    for k in range(g + 1):
        reached = emitted.long() >= k
        assert chi_square_p(out[reached, k].long(), p[0, k]) > 1e-4, k
    emitted_probs = torch.stack([torch.prod(a[:n]) * (1 - a[n] if n < g else 1) for n in range(g + 1)])
    assert chi_square_p(emitted.long(), emitted_probs) > 1e-4
    accepted_probs = torch.tensor([1.0], dtype=torch.float64)
    for k in range(g):  # the distribution of a sum of independent Bernoulli(alpha_k)
        accepted_probs = torch.cat([accepted_probs * (1 - a[k]), torch.zeros(1, dtype=torch.float64)]) + \
            torch.cat([torch.zeros(1, dtype=torch.float64), accepted_probs * a[k]])
    assert chi_square_p(accepted.long(), accepted_probs) > 1e-4


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("mode", ["generator", "int_seed", "row_seeds", "legacy"])
def test_chi_square(backend, mode):
    gen = torch.Generator().manual_seed(3)
    batch, g, vocab = 30000, 2, 7
    q, drafts, p = sampled_case(gen, batch, g, vocab)
    if mode == "generator":
        got = chain_speculative_sampling(q, drafts, p, generator=torch.Generator(DEV).manual_seed(4), backend=backend)
    elif mode == "int_seed":
        got = chain_speculative_sampling(q, drafts, p, seed=5, offset=0, backend=backend)
    elif mode == "row_seeds":
        seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen).to(DEV)
        got = chain_speculative_sampling(q, drafts, p, seed=seeds, offset=torch.zeros(1, dtype=torch.int64, device=DEV),
                                         backend=backend)
    else:
        u = torch.rand(batch, g + 1, generator=gen).to(DEV)
        got = chain_speculative_sampling_legacy(q, drafts, u, p, backend=backend)
    assert_lossless(*got, q, p)


# ============================================================== the backends agree

def adversarial_case(gen, batch=4, g=3, vocab=50):
    draft = normalized(gen, batch, g, vocab)
    target = normalized(gen, batch, g + 1, vocab)
    drafts = torch.randint(vocab, (batch, g), generator=gen).to(DEV)
    drafts[0, 1] = -1  # padding: a rejected draft
    target[1, 0, drafts[1, 0]] = 0.0  # certain rejection at position 0
    target[2] = draft[2].max(dim=0).values.expand(g + 1, vocab)  # p >= q: every draft passes, bonus drawn
    return draft, drafts, target


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "torch"])
def test_every_backend_matches_torch(backend):
    """Bit-identical outputs and counters to the torch backend in every randomness mode (so the
    statistics above carry over to the interpreted Triton backend)."""
    gen = torch.Generator().manual_seed(6)
    case = adversarial_case(gen)
    batch, g = case[1].shape
    calls = [dict(seed=7, offset=3), dict(seed=torch.arange(batch, device=DEV), offset=torch.tensor([5], device=DEV))]
    for kwargs in calls:
        assert same(chain_speculative_sampling(*case, backend=backend, **kwargs),
                    chain_speculative_sampling(*case, backend="torch", **kwargs))
    assert same(chain_speculative_sampling(*case, generator=torch.Generator(DEV).manual_seed(8), backend=backend),
                chain_speculative_sampling(*case, generator=torch.Generator(DEV).manual_seed(8), backend="torch"))
    u = torch.rand(batch, g + 1, generator=gen).to(DEV)
    assert same(chain_speculative_sampling_legacy(case[0], case[1], u, case[2], backend=backend),
                chain_speculative_sampling_legacy(case[0], case[1], u, case[2], backend="torch"))


# ============================================================== the uniform-samples form

def flashinfer_model(draft, drafts, u, target):
    """FlashInfer's uniform-samples kernel as we read its source, one row at a time in numpy: the
    float32 test u * q < p, the residual row max(0, p - q) (q = 0 on the bonus row), the first id
    whose cumulative residual exceeds u[min(pos + 1, g)] * total."""
    draft, target = draft.float().cpu().numpy(), target.float().cpu().numpy()
    drafts, u = drafts.long().cpu().numpy(), u.float().cpu().numpy()
    batch, g = drafts.shape
    out = np.full((batch, g + 1), -1)
    accepted, emitted = np.zeros(batch, dtype=int), np.zeros(batch, dtype=int)
    for b in range(batch):
        passes = [np.float32(u[b, i]) * draft[b, i, drafts[b, i]] < target[b, i, drafts[b, i]] for i in range(g)]
        pos = next((i for i in range(g) if not passes[i]), g)
        out[b, :pos] = drafts[b, :pos]
        accepted[b], emitted[b] = sum(passes), pos
        residual = np.maximum(target[b, pos].astype(np.float64) - (draft[b, pos] if pos < g else 0.0), 0.0)
        cdf = np.cumsum(residual)
        out[b, pos] = int(np.argmax(cdf > u[b, min(pos + 1, g)] * cdf[-1]))
    return out, accepted, emitted


@pytest.mark.parametrize("backend", BACKENDS)
def test_legacy_form_matches_flashinfer_kernel_model(backend):
    gen = torch.Generator().manual_seed(9)
    batch, g, vocab = (4, 3, 40) if backend in INTERPRETED else (300, 3, 40)
    draft = normalized(gen, batch, g, vocab)
    target = normalized(gen, batch, g + 1, vocab)
    target[: batch // 2, :g] = draft[: batch // 2]  # half the rows accept everything (bonus drawn)
    drafts = torch.randint(vocab, (batch, g), generator=gen).to(DEV)
    u = torch.rand(batch, g + 1, generator=gen).to(DEV)
    out, accepted, emitted = chain_speculative_sampling_legacy(draft, drafts, u, target, backend=backend)
    want_out, want_accepted, want_emitted = flashinfer_model(draft, drafts, u, target)
    assert np.array_equal(out.cpu().numpy(), want_out)
    assert np.array_equal(accepted.cpu().numpy(), want_accepted)
    assert np.array_equal(emitted.cpu().numpy(), want_emitted)


@pytest.mark.parametrize("backend", BACKENDS)
def test_legacy_final_draw_uses_column_pos_plus_one(backend):
    """Rejected at position 0 of 2 drafts: the residual (ids 2 and 3, equal mass) is drawn with
    column 1; column 2 is never read. All accepted: the bonus is drawn with column 2."""
    draft = torch.tensor([[[1.0, 0, 0, 0], [1.0, 0, 0, 0]]], device=DEV)
    target = torch.tensor([[[0, 0, 0.5, 0.5], [1.0, 0, 0, 0], [0, 0, 0.5, 0.5]]], device=DEV)
    drafts = torch.zeros(1, 2, dtype=torch.int64, device=DEV)
    for col1, col2, token in ((0.2, 0.9, 2), (0.8, 0.1, 3)):
        u = torch.tensor([[0.5, col1, col2]], device=DEV)
        out, accepted, emitted = chain_speculative_sampling_legacy(draft, drafts, u, target, backend=backend)
        assert out.tolist() == [[token, -1, -1]]
        assert accepted.tolist() == [1] and emitted.tolist() == [0]  # draft 1 passes its own test after the rejection
    target[0, 0] = draft[0, 0]  # now draft 0 passes too: the bonus (ids 2, 3) uses column 2
    for col1, col2, token in ((0.9, 0.2, 2), (0.1, 0.8, 3)):
        out, _, _ = chain_speculative_sampling_legacy(draft, drafts, torch.tensor([[0.5, col1, col2]], device=DEV),
                                                      target, backend=backend)
        assert out.tolist() == [[0, 0, token]]


# ============================================================== documented differences (module docstring)

@pytest.mark.parametrize("backend", BACKENDS)
def test_random_streams_are_keyed_per_row(backend):
    """Row b of an int-seeded batch draws with seed ^ (b << 32) at offset..offset+g: it equals a
    batch of one with that seed, and the op's own per-request seed mode. A tensor pair's row draws
    with its request key (`_request_keys`) at 0..g, the same op mode."""
    gen = torch.Generator().manual_seed(10)
    draft, drafts, target = adversarial_case(gen)
    batch = drafts.shape[0]
    seed, offset = 2**40 + 3, 11
    got = chain_speculative_sampling(draft, drafts, target, seed=seed, offset=offset, backend=backend)
    keys = [seed ^ (b << 32) for b in range(batch)]
    for b in range(batch):
        alone = chain_speculative_sampling(draft[b:b + 1], drafts[b:b + 1], target[b:b + 1], seed=keys[b],
                                           offset=offset, backend=backend)
        assert same(tuple(x[b:b + 1] for x in got), alone), b
    out, num_accepted = ops.rejection_sample(target, draft, drafts, seed=torch.tensor(keys, device=DEV),
                                             offsets=torch.full((batch,), offset, device=DEV), backend=backend)
    assert torch.equal(got[0], out.int()) and torch.equal(got[2], num_accepted.int())
    seeds, offsets = torch.arange(batch, device=DEV) - 2, torch.tensor([2**40 + 11], device=DEV)
    got = chain_speculative_sampling(draft, drafts, target, seed=seeds, offset=offsets, backend=backend)
    out, num_accepted = ops.rejection_sample(target, draft, drafts, seed=fi._request_keys(seeds, offsets),
                                             offsets=torch.zeros(batch, dtype=torch.int64, device=DEV),
                                             backend=backend)
    assert torch.equal(got[0], out.int()) and torch.equal(got[2], num_accepted.int())


@pytest.mark.parametrize("backend", FAST)
def test_offset_counts_modulo_2_pow_32(backend):
    gen = torch.Generator().manual_seed(11)
    case = adversarial_case(gen, batch=64, vocab=20)
    a = chain_speculative_sampling(*case, seed=5, offset=7, backend=backend)
    assert same(a, chain_speculative_sampling(*case, seed=5, offset=7 + 2**32, backend=backend))
    assert not same(a, chain_speculative_sampling(*case, seed=5, offset=7 + 4, backend=backend))  # g + 1 further
    seed, offset = torch.tensor([5], device=DEV), torch.tensor([7], device=DEV)  # tensors: all 64 bits
    b = chain_speculative_sampling(*case, seed=seed, offset=offset, backend=backend)
    assert not same(b, chain_speculative_sampling(*case, seed=seed, offset=offset + 2**32, backend=backend))


@pytest.mark.parametrize("backend", FAST)
def test_generator_mode_is_one_torch_rand(backend):
    """Without both seed and offset: one torch.rand(B, g + 1, float64) from the generator (coins,
    then the final draw), advancing it by exactly that call; a lone seed or offset is unused, as in
    FlashInfer."""
    gen = torch.Generator().manual_seed(12)
    draft, drafts, target = adversarial_case(gen)
    batch, g = drafts.shape
    source = torch.Generator(DEV).manual_seed(13)
    u = torch.rand(batch, g + 1, dtype=torch.float64, generator=source, device=DEV)
    after_one_call = source.get_state()
    source.manual_seed(13)
    got = chain_speculative_sampling(draft, drafts, target, generator=source, backend=backend)
    assert torch.equal(source.get_state(), after_one_call)
    out, num_accepted = ops.rejection_sample(target, draft, drafts, uniforms=u, backend=backend)
    assert torch.equal(got[0], out.int()) and torch.equal(got[2], num_accepted.int())
    torch.manual_seed(14)
    default = chain_speculative_sampling(draft, drafts, target, backend=backend)
    torch.manual_seed(14)
    assert same(default, chain_speculative_sampling(draft, drafts, target, seed=99, backend=backend))
    torch.manual_seed(14)
    assert same(default, chain_speculative_sampling(draft, drafts, target, offset=3, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_counters_are_updated_in_place(backend):
    draft, target = torch.tensor(DOC_DRAFT, device=DEV), torch.tensor(DOC_TARGET, device=DEV)
    ids = torch.tensor([[2, 1]], device=DEV)
    accepted = torch.tensor([10], dtype=torch.int64, device=DEV)
    emitted = torch.tensor([20], dtype=torch.int64, device=DEV)
    _, acc, emi = chain_speculative_sampling(draft, ids, target, accepted, emitted, seed=1, offset=0, backend=backend)
    assert acc is accepted and emi is emitted
    assert accepted.tolist() == [11] and emitted.tolist() == [21]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_acceptance_test_is_exact(backend):
    """u * q < p decided exactly: with p = float32(u * q) rounded up, FlashInfer's float32 product
    equals p and rejects, ours accepts. And u < 1: a draft with p == q passes even at the largest
    uniform below 1; a uniform of 1.0 (or NaN) is refused."""
    gen = torch.Generator().manual_seed(16)
    u32 = torch.rand(4096, generator=gen)
    q32 = torch.rand(4096, generator=gen)
    product = u32 * q32  # float32, rounded to nearest
    up = product.double() > u32.double() * q32.double()
    u, q = float(u32[up][0]), float(q32[up][0])
    p = float(product[up][0])
    assert not np.float32(u) * np.float32(q) < np.float32(p)  # FlashInfer's float32 test rejects
    draft = torch.tensor([[[q, 1 - q]]], device=DEV)
    target = torch.tensor([[[p, 1 - p], [0.5, 0.5]]], device=DEV)
    drafts = torch.zeros(1, 1, dtype=torch.int64, device=DEV)
    _, accepted, emitted = chain_speculative_sampling_legacy(draft, drafts, torch.tensor([[u, 0.5]], device=DEV),
                                                             target, backend=backend)
    assert accepted.tolist() == [1] and emitted.tolist() == [1]
    same_pq = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]], device=DEV)
    for top in (torch.tensor([[1 - 2**-24, 0.5]]), torch.tensor([[1 - 2**-53, 0.5]], dtype=torch.float64)):
        _, accepted, _ = chain_speculative_sampling_legacy(same_pq[:, :1], drafts, top.to(DEV), same_pq,
                                                           backend=backend)
        assert accepted.tolist() == [1]
    if DEV.type == "cpu":
        for bad in (1.0, float("nan")):
            with pytest.raises(ValueError, match="`uniform_samples` must lie in"):
                chain_speculative_sampling_legacy(same_pq[:, :1], drafts, torch.tensor([[bad, 0.5]]), same_pq)


@pytest.mark.parametrize("backend", BACKENDS)
def test_residual_entries_below_2_pow_40_count_as_zero(backend):
    """The only residual mass is 1e-13 on id 5 (< 2**-40): FlashInfer's float residual would draw
    id 5; ours finds the residual empty and draws from the target row (ids 0 and 1)."""
    draft = torch.tensor([[[0.5, 0.5] + [0.0] * 6]], device=DEV)
    target_row = [0.25, 0.5, 0, 0, 0, 1e-13, 0, 0]
    target = torch.tensor([[target_row, [1.0] + [0.0] * 7]], device=DEV)
    drafts = torch.zeros(1, 1, dtype=torch.int64, device=DEV)
    for final in (0.1, 0.5, 0.9):
        u = torch.tensor([[0.75, final]], device=DEV)  # 0.75 * 0.5 >= 0.25: draft 0 rejected
        out, _, _ = chain_speculative_sampling_legacy(draft, drafts, u, target, backend=backend)
        assert flashinfer_model(draft, drafts, u, target)[0][0, 0] == 5
        assert out[0, 0].item() in (0, 1) and out[0, 1].item() == -1


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_residual_gives_an_in_range_token(backend):
    """An all-zero (or NaN) target row at the rejected position: the draft is rejected and the
    token is 0 (FlashInfer's kernel returns an uninitialised id there)."""
    draft = torch.full((2, 1, 6), 1 / 6, device=DEV)
    target = torch.full((2, 2, 6), 1 / 6, device=DEV)
    target[0, 0] = 0.0
    target[1, 0] = float("nan")
    drafts = torch.full((2, 1), 3, device=DEV)
    out, accepted, emitted = chain_speculative_sampling(draft, drafts, target, seed=1, offset=0, backend=backend)
    assert out.tolist() == [[0, -1], [0, -1]]
    assert accepted.tolist() == [0, 0] and emitted.tolist() == [0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_draft_ids_are_rejected_drafts(backend):
    """-1 is a rejected draft, not counted in accepted; on CPU an id below -1 or >= V raises."""
    draft = torch.full((1, 3, 5), 0.2, device=DEV)
    target = torch.full((1, 4, 5), 0.2, device=DEV)  # p == q: every valid draft passes
    drafts = torch.tensor([[1, -1, 2]], device=DEV)
    out, accepted, emitted = chain_speculative_sampling(draft, drafts, target, seed=0, offset=0, backend=backend)
    assert out[0, 0].item() == 1 and 0 <= out[0, 1].item() < 5 and out[0, 2].item() == -1
    assert accepted.tolist() == [2] and emitted.tolist() == [1]
    if DEV.type == "cpu":
        for bad in (5, -2):
            with pytest.raises(ValueError, match="`draft_token_ids` holds ids outside"):
                chain_speculative_sampling(draft, torch.tensor([[1, bad, 2]]), target)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_changes_nothing(backend):
    gen = torch.Generator().manual_seed(17)
    case = adversarial_case(gen)
    assert same(chain_speculative_sampling(*case, deterministic=True, seed=3, offset=1, backend=backend),
                chain_speculative_sampling(*case, deterministic=False, seed=3, offset=1, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtypes_and_strides(backend):
    """Half inputs give what their float32 upcast gives; float64, mixed dtypes, int16 ids and
    strided views are accepted with the same result."""
    gen = torch.Generator().manual_seed(18)
    draft, drafts, target = adversarial_case(gen, vocab=24)
    kwargs = dict(seed=4, offset=2, backend=backend)
    for half in (torch.bfloat16, torch.float16):
        d, t = draft.to(half), target.to(half)
        assert same(chain_speculative_sampling(d, drafts, t, **kwargs),
                    chain_speculative_sampling(d.float(), drafts, t.float(), **kwargs))
    want = chain_speculative_sampling(draft, drafts, target, **kwargs)
    assert same(want, chain_speculative_sampling(draft.double(), drafts, target.double(), **kwargs))
    assert same(want, chain_speculative_sampling(draft, drafts, target.double(), **kwargs))
    assert same(want, chain_speculative_sampling(draft, drafts.to(torch.int16), target, **kwargs))
    wide_d = torch.full((*draft.shape[:2], 2 * draft.shape[2]), float("nan"), device=DEV)
    wide_d[..., ::2] = draft  # a strided vocabulary dimension
    wide_t = torch.full((target.shape[1], target.shape[0], target.shape[2]), float("nan"), device=DEV)
    wide_t = wide_t.transpose(0, 1)
    wide_t.copy_(target)  # batch and position dims swapped in memory
    ids_t = drafts.t().contiguous().t()
    assert same(want, chain_speculative_sampling(wide_d[..., ::2], ids_t, wide_t, **kwargs))


@pytest.mark.parametrize("backend", BACKENDS)
def test_accepted_uses_the_ops_own_coins(backend):
    """accepted_num counts common.draws.draft_passes, the test the reference op accepts a prefix of, on
    the op's own uniforms: its leading run is exactly what the op emitted, in every randomness mode."""
    gen = torch.Generator().manual_seed(19)
    batch, g, vocab = (4, 3, 12) if backend in INTERPRETED else (256, 4, 12)
    q, drafts, p = sampled_case(gen, batch, g, vocab)
    calls = [dict(seed=21, offset=5), dict(seed=torch.arange(batch, device=DEV), offset=torch.tensor([9], device=DEV)),
             dict(generator=torch.Generator(DEV).manual_seed(22))]
    for kwargs in calls:
        seed = kwargs.get("seed")
        if "generator" in kwargs:
            coins = torch.rand(batch, g + 1, dtype=torch.float64, generator=torch.Generator(DEV).manual_seed(22),
                               device=DEV)[:, :g]
        else:
            seeds, offsets = fi._seeds_and_offsets(seed, kwargs["offset"], batch, DEV)
            coins = rng.philox_uniform(seeds[:, None], offsets[:, None] + torch.arange(g, device=DEV), 0,
                                       rng.SALT_ACCEPT)
        passes = draft_passes(p, q, drafts, coins)
        out, accepted, emitted = chain_speculative_sampling(q, drafts, p, backend=backend, **kwargs)
        assert torch.equal(accepted, passes.sum(dim=1).int())
        assert torch.equal(emitted, torch.cumprod(passes.int(), dim=1).sum(dim=1).int())
        if batch > 100:
            assert bool((accepted > emitted).any())  # some rows pass a test after their first rejection


BAD_ARGUMENTS = [
    (dict(draft_probs=torch.rand(2, 3)), ValueError, "`draft_probs` must have shape"),
    (dict(draft_probs=torch.ones(2, 3, 5, dtype=torch.int32)), TypeError, "`draft_probs` must have dtype"),
    (dict(draft_token_ids=torch.zeros(2, 4, dtype=torch.int64)), ValueError, "`draft_token_ids` must have shape"),
    (dict(draft_token_ids=torch.zeros(2, 3)), TypeError, "`draft_token_ids` must have dtype"),
    (dict(target_probs=torch.rand(2, 3, 5)), ValueError, "`target_probs` must have shape"),
    (dict(maybe_output_accepted_token_num=torch.zeros(3, dtype=torch.int32)), ValueError,
     "`maybe_output_accepted_token_num` must have shape"),
    (dict(maybe_output_emitted_draft_token_num=torch.zeros(2)), TypeError,
     "`maybe_output_emitted_draft_token_num` must have dtype"),
    (dict(deterministic=1), TypeError, "`deterministic` must be a bool"),
    (dict(generator=5), TypeError, "`generator` must be a torch.Generator"),
    (dict(seed=1, offset=torch.zeros(1, dtype=torch.int64)), ValueError, "both be tensors or both be ints"),
    (dict(seed=torch.zeros(1, dtype=torch.int32), offset=torch.zeros(1, dtype=torch.int32)), TypeError,
     "`seed` must have dtype int64 or uint64"),
    (dict(seed=torch.zeros(3, dtype=torch.int64), offset=torch.zeros(1, dtype=torch.int64)), ValueError,
     "`seed` must be a 1-D tensor of length 1 or 2"),
    (dict(seed=torch.zeros(1, dtype=torch.int64), offset=torch.zeros(1, 1, dtype=torch.int64)), ValueError,
     "`offset` must be a 1-D tensor"),
    (dict(seed=1.5, offset=0), TypeError, "`seed` must be an int"),
    (dict(seed=1, offset=-1), ValueError, r"`offset` must lie in \[0, 2\*\*64\)"),
    (dict(seed=2**64, offset=0), ValueError, "`seed` must lie in"),
    (dict(backend="gpu"), ValueError, "`backend` must be one of"),
]


@pytest.mark.parametrize("bad, error, message", BAD_ARGUMENTS)
def test_validation_names_the_argument(bad, error, message):
    args = dict(draft_probs=torch.full((2, 3, 5), 0.2), draft_token_ids=torch.zeros(2, 3, dtype=torch.int32),
                target_probs=torch.full((2, 4, 5), 0.2))
    args.update(bad)
    with pytest.raises(error, match=message) as info:
        chain_speculative_sampling(**args)
    assert str(info.value).startswith("chain_speculative_sampling: ") and "\n" not in str(info.value)


def test_legacy_validation_names_the_argument():
    draft, target = torch.full((2, 3, 5), 0.2), torch.full((2, 4, 5), 0.2)
    ids = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="`uniform_samples` must have shape"):
        chain_speculative_sampling_legacy(draft, ids, torch.rand(2, 3), target)
    with pytest.raises(TypeError, match="`uniform_samples` must have dtype"):
        chain_speculative_sampling_legacy(draft, ids, torch.rand(2, 4).half(), target)
    with pytest.raises(TypeError, match="`maybe_output_emitted_token_num` must have dtype"):
        chain_speculative_sampling_legacy(draft, ids, torch.rand(2, 4), target, None, torch.zeros(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_no_drafts(backend):
    gen = torch.Generator().manual_seed(20)
    out, accepted, emitted = chain_speculative_sampling(torch.zeros(0, 2, 5, device=DEV),
                                                        torch.zeros(0, 2, dtype=torch.int64, device=DEV),
                                                        torch.zeros(0, 3, 5, device=DEV), seed=1, offset=0,
                                                        backend=backend)
    assert out.shape == (0, 3) and accepted.shape == emitted.shape == (0,)
    target = normalized(gen, 3, 1, 5)
    for got in (chain_speculative_sampling(torch.zeros(3, 0, 5, device=DEV), torch.zeros(3, 0, dtype=torch.int64,
                                                                                           device=DEV),
                                           target, seed=1, offset=0, backend=backend),
                chain_speculative_sampling_legacy(torch.zeros(3, 0, 5, device=DEV),
                                                  torch.zeros(3, 0, dtype=torch.int64, device=DEV),
                                                  torch.rand(3, 1, generator=gen).to(DEV), target, backend=backend)):
        out, accepted, emitted = got
        assert out.shape == (3, 1) and bool((out >= 0).all()) and bool((out < 5).all())
        assert accepted.tolist() == [0, 0, 0] and emitted.tolist() == [0, 0, 0]
