"""The Triton relaxed_verify, bild_verify and max_prob backends against the torch reference.

relaxed_verify is compared bit for bit. bild_verify computes logsumexp with an online
(split, rescaled) sum, which differs from torch.logsumexp by rounding, so every threshold
used here is first moved at least MARGIN away from every finite draft NLL of the inputs
(`thresholds_with_margin`); away from that band the outputs must be identical. max_prob is
compared with rtol 1e-5 / atol 1e-6. Runs on CPU tensors under the Triton interpreter.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import ops
from specdec_kernels.reference._sampling import gather_token_values, nan_to_neg_inf
from specdec_kernels.triton import logit_verify as triton_module

pytestmark = [
    # inf - inf and log(0) on NaN/inf rows are intended (they follow the reference); the
    # interpreter evaluates them with numpy, which warns
    pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"),
]

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731
BETA_TAU = ((1, 0.0), (1, 5.0), (3, 0.0), (2, 0.7), (50, 3.0))
MARGIN = 1e-3  # bild thresholds stay this far (nats) from every draft NLL


def assert_same(got, want):
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape, name
        assert torch.equal(g_, w_), f"{name}: triton {g_.tolist()} != torch {w_.tolist()}"


def check_relaxed(logits, drafts, counts=None, beta_tau=BETA_TAU):
    for beta, tau in beta_tau:
        kw = dict(top_beta=beta, tau=tau, num_draft_tokens=counts)
        got = ops.relaxed_verify(logits, drafts, backend="triton", **kw)
        assert_same(got, ops.relaxed_verify(logits, drafts, backend="torch", **kw))
        if beta == 1 or tau == 0:  # lossless corner: exactly greedy decoding
            assert_same(got, ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="torch"))


def draft_nll(logits, drafts):
    """Finite -log softmax(logits[:, i])[draft_i] as the reference computes it (float32)."""
    body = nan_to_neg_inf(logits[:, :drafts.shape[1]])
    value, in_range = gather_token_values(body, drafts)
    nll = torch.logsumexp(body, dim=-1) - value
    return nll[in_range & torch.isfinite(nll)]


def thresholds_with_margin(logits, drafts, candidates=(0.3, 1.5, 4.0, 9.0)):
    nll = draft_nll(logits, drafts)
    out = []
    for t in candidates:
        while nll.numel() and bool(((nll - t).abs() < MARGIN).any()):
            t += 2.5 * MARGIN
        assert not nll.numel() or float((nll - t).abs().min()) >= MARGIN
        out.append(t)
    return out


def check_bild(logits, drafts, counts=None, thresholds=None):
    for t in thresholds_with_margin(logits, drafts) if thresholds is None else thresholds:
        kw = dict(rollback_threshold=t, num_draft_tokens=counts)
        assert_same(ops.bild_verify(logits, drafts, backend="triton", **kw),
                    ops.bild_verify(logits, drafts, backend="torch", **kw))


def near_top_drafts(logits, gen):
    """Per slot: the argmax, a token of rank 1..4 (ties by lower id), a random id, or -1."""
    batch, n_pos, vocab = logits.shape
    g = n_pos - 1
    order = torch.sort(nan_to_neg_inf(logits[:, :g]), dim=-1, descending=True, stable=True).indices
    rank = torch.randint(0, min(vocab, 5), (batch, g), generator=gen)
    rank = torch.where(torch.rand(batch, g, generator=gen) < 0.5, torch.zeros_like(rank), rank)
    drafts = order.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    wild = torch.rand(batch, g, generator=gen) < 0.15
    return torch.where(wild, torch.randint(-1, vocab, (batch, g), generator=gen), drafts)


def check_max_prob(x):
    got = ops.max_prob(x, backend="triton")
    want = ops.max_prob(x, backend="torch")
    assert got.dtype == torch.float32 and got.shape == want.shape == x.shape[:-1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("vocab", (1, 5, 300, 1100))
@pytest.mark.parametrize("batch", (1, 3))
@pytest.mark.parametrize("g", (0, 1, 4))
def test_random_drafts_and_ragged(dtype, vocab, batch, g):
    gen = torch.Generator().manual_seed(vocab * 100 + batch * 10 + g)
    logits = (2.0 * torch.randn(batch, g + 1, vocab, generator=gen)).to(dtype)
    drafts = near_top_drafts(logits, gen)
    ragged = torch.randint(0, g + 1, (batch,), generator=gen)
    if g == 0:  # no drafts: every setting just emits the bonus argmax
        check_relaxed(logits, drafts, beta_tau=((2, 0.7),))
        check_bild(logits, drafts, thresholds=(1.0,))
    else:
        check_relaxed(logits, drafts)
        check_relaxed(logits, drafts, ragged, beta_tau=((50, 3.0),))
        check_bild(logits, drafts, thresholds=thresholds_with_margin(logits, drafts, (0.3, 2.0, 6.0)))
        check_bild(logits, drafts, ragged, thresholds=thresholds_with_margin(logits, drafts, (4.0,)))
    check_max_prob(logits)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("tie", [(0, 1), (1023, 1024), (5, 1099), (1024, 1099), (3, 700, 1023, 1024)])
def test_ties(dtype, tie):
    """V = 1100: tiles of 1024, so 1023 | 1024 is a tile boundary."""
    vocab, g = 1100, 3
    gen = torch.Generator().manual_seed(len(tie) * 7 + tie[-1])
    logits = torch.randn(2, g + 1, vocab, generator=gen).clamp(-3, 3).to(dtype)
    logits[:, :, list(tie)] = 5.0
    logits[1, 1, list(tie)] = INF  # +inf ties too
    first, second = tie[0], tie[1]
    # row 0: the lowest tied id everywhere; row 1: the next tied id (rank 1, zero logit gap)
    drafts = torch.tensor([[first] * g, [first, second, second]])
    check_relaxed(logits, drafts)
    check_bild(logits, drafts)
    out, acc = ops.relaxed_verify(logits, drafts, top_beta=2, tau=0.5, backend="triton")
    assert acc.tolist() == [3, 1]  # the +inf tie at position 1 has an infinite minus infinite gap: NaN < tau fails
    out, acc = ops.relaxed_verify(logits, drafts, top_beta=1, tau=5.0, backend="triton")
    assert acc.tolist() == [3, 1] and out[1, 1].item() == first
    check_max_prob(logits)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_inf_and_padding(dtype):
    vocab, g = 300, 4
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, g + 1, vocab, generator=gen).to(dtype)
    logits[0, 0] = NAN  # all NaN: argmax 0, the draft 0 logit counts as -inf
    logits[0, 1] = -INF  # all -inf
    logits[0, 2, ::2] = NAN  # NaN never wins nor ranks ahead
    logits[0, 2, 7] = 4.0
    logits[0, 3, :] = -INF
    logits[0, 3, 299] = 1.0  # one finite logit: NLL exactly 0
    logits[1, :, 10] = INF
    logits[1, :, 200] = INF
    logits[1, 2, 5] = NAN
    logits[2, 1, :] = NAN
    logits[2, 1, 150] = -INF
    logits[3, :, ::3] = -INF  # draft on a -inf logit in a finite row
    drafts = torch.tensor([[0, 0, 7, 299], [10, 200, 10, 11], [-1, 0, 3, 4], [3, 1, 0, -1]])
    for counts in (None, torch.tensor([4, 2, 0, 3]), torch.tensor([1, 4, 4, 0])):
        check_relaxed(logits, drafts, counts)
        check_bild(logits, drafts, counts, thresholds=(0.0, *thresholds_with_margin(logits, drafts, (1.0, 6.0))))
    out, acc = ops.bild_verify(logits, drafts, rollback_threshold=0.0, backend="triton")
    assert acc[0].item() == 0  # an all-NaN row has lse = -inf: NaN NLL never passes
    probs = check_max_prob(logits)
    assert probs[0, :2].tolist() == [0.0, 0.0] and probs[0, 3].item() == 1.0 and bool((probs[1] == 1.0).all())


def test_padding_and_single_token_vocab():
    logits = torch.full((2, 4, 1), -INF)
    drafts = torch.tensor([[-1, 0, 0], [0, 0, -1]])
    check_relaxed(logits, drafts)
    check_bild(logits, drafts, thresholds=(0.0, 1.0))
    out, acc = ops.relaxed_verify(logits, drafts, top_beta=3, tau=1.0, backend="triton")
    assert out.tolist() == [[0, -1, -1, -1], [0, 0, 0, -1]] and acc.tolist() == [0, 2]
    finite = torch.zeros(2, 4, 1)
    out, acc = ops.bild_verify(finite, drafts, rollback_threshold=0.0, backend="triton")
    assert acc.tolist() == [0, 2]
    assert check_max_prob(finite).eq(1.0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_inputs(dtype):
    batch, g, vocab = 3, 4, 300
    gen = torch.Generator().manual_seed(2)
    big = torch.randn(batch, g + 3, vocab, generator=gen).to(dtype)
    logits = big[:, 1:g + 2]  # batch stride (g+3) * V
    assert not logits.is_contiguous()
    drafts = near_top_drafts(logits, gen)
    check_relaxed(logits, drafts, beta_tau=((3, 0.0), (2, 0.7)))
    check_bild(logits, drafts, thresholds=thresholds_with_margin(logits, drafts, (1.0, 5.0)))
    swapped = torch.randn(g + 1, batch, vocab, generator=gen).to(dtype).transpose(0, 1)  # position-major storage
    drafts_t = near_top_drafts(swapped, gen).t().contiguous().t()  # column-major drafts
    counts = torch.tensor([4, 0, 1, 2, 3, 0])[::2]  # strided counts [4, 1, 3]
    check_relaxed(swapped, drafts_t, counts, beta_tau=((50, 3.0),))
    check_bild(swapped, drafts_t, counts, thresholds=thresholds_with_margin(swapped, drafts_t, (5.0,)))
    check_max_prob(logits)
    check_max_prob(swapped)
    check_max_prob(big[:, 2])  # [B, V] with row stride (g+3) * V


def test_max_prob_shapes():
    gen = torch.Generator().manual_seed(4)
    check_max_prob(torch.randn(1100, generator=gen))  # [V]
    check_max_prob(torch.randn(3, 1100, generator=gen).to(torch.bfloat16))  # [B, V]
    check_max_prob(torch.randn(2, 3, 5, generator=gen).to(torch.float16))  # [B, P, V]
    four = torch.randn(2, 3, 4, 40, generator=gen)[:, :, 1:]  # leading dims that do not collapse
    check_max_prob(four)
    assert ops.max_prob(torch.randn(0, 3, 7), backend="triton").shape == (0, 3)
    special = torch.randn(5, 40, generator=gen)
    special[0] = NAN
    special[1] = -INF
    special[2, 3] = INF
    special[3, :] = -INF
    special[3, 9] = 2.0
    special[4, ::2] = NAN
    probs = check_max_prob(special)
    assert probs[:4].tolist() == [0.0, 0.0, 1.0, 1.0]
    huge = torch.tensor([[1e30, 1e30, 0.0]])  # lse rounds to the max: the reference says 1, and so do we
    check_max_prob(huge)
    flags = [ops.fallback_check(special, 0.5, backend=backend) for backend in ("triton", "torch")]
    assert torch.equal(*flags)


@pytest.mark.parametrize("vocab", (1, 17, 95, 160))
def test_many_splits(vocab):
    """Small tiles force several tiles per program, many splits and the split cap."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-2, 3, (3, 4, vocab), generator=gen).float()  # heavy ties across splits
    logits[0, 1] = -INF
    logits[1, 2, ::3] = NAN
    logits[2, 0, vocab // 2] = INF
    drafts = near_top_drafts(logits, gen)
    counts = torch.tensor([3, 1, 2])
    thresholds = thresholds_with_margin(logits, drafts, (1.5,))
    for block_v, tiles, max_splits in ((16, 1, 64), (16, 2, 3), (32, 4, 1)):
        plan = dict(block_v=block_v, tiles_per_program=tiles, max_splits=max_splits)
        for beta, tau in ((1, 5.0), (2, 0.7), (50, 3.0)):
            got = triton_module._launch_chain(logits, drafts, counts, mode=triton_module.RELAXED.value, top_beta=beta, tau=tau, **plan)
            assert_same(got, ops.relaxed_verify(logits, drafts, top_beta=beta, tau=tau, num_draft_tokens=counts,
                                                backend="torch"))
        for t in thresholds:
            got = triton_module._launch_chain(logits, drafts, counts, mode=triton_module.BILD.value, threshold=t, **plan)
            assert_same(got, ops.bild_verify(logits, drafts, rollback_threshold=t, num_draft_tokens=counts,
                                             backend="torch"))
        torch.testing.assert_close(triton_module._launch_max_prob(logits, **plan),
                                   ops.max_prob(logits, backend="torch"), rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 3), g=st.integers(0, 4), vocab=st.integers(1, 70), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31 - 1), special=st.floats(0.0, 0.4), ragged=st.booleans(),
       beta=st.integers(1, 8), tau=st.sampled_from((0.0, 0.5, 1.0, 2.0, INF)), threshold=st.floats(0.0, 6.0))
def test_property_matches_reference(batch, g, vocab, dtype, seed, special, ragged, beta, tau, threshold):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (batch, g + 1, vocab), generator=gen).float() * 0.5  # ties are common
    specials = torch.tensor([NAN, INF, -INF])[torch.randint(0, 3, logits.shape, generator=gen)]
    logits = torch.where(torch.rand(logits.shape, generator=gen) < special, specials, logits).to(dtype)
    drafts = near_top_drafts(logits, gen)
    counts = torch.randint(0, g + 1, (batch,), generator=gen) if ragged else None
    out, accepted = ops.relaxed_verify(logits, drafts, top_beta=beta, tau=tau, num_draft_tokens=counts,
                                       backend="triton")
    assert_same((out, accepted), ops.relaxed_verify(logits, drafts, top_beta=beta, tau=tau,
                                                    num_draft_tokens=counts, backend="torch"))
    emitted = out.gather(1, accepted.unsqueeze(1)).squeeze(1)  # the correction / bonus token
    assert bool(((emitted >= 0) & (emitted < vocab)).all())
    (t,) = thresholds_with_margin(logits, drafts, (threshold,))
    check_bild(logits, drafts, counts, thresholds=(t,))
    check_max_prob(logits)
