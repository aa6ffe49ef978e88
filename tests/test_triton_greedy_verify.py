"""The Triton greedy_verify backend against the torch reference, bit for bit.

Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported); on a machine without triton the module is skipped.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import ops, reference
from specdec_kernels.triton import logit_verify as triton_module

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def assert_matches(logits, drafts, num_drafts=None):
    got = ops.greedy_verify(logits, drafts, num_draft_tokens=num_drafts, backend="triton")
    want = ops.greedy_verify(logits, drafts, num_draft_tokens=num_drafts, backend="torch")
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape, name
        assert torch.equal(g_, w_), f"{name}: triton {g_.tolist()} != torch {w_.tolist()}"
    return got


def drafts_with_prefix(logits, gen, *, pad=False):
    """Drafts equal to the argmax for a random prefix of each row, then one mismatch
    (another valid id, or -1 padding when V == 1 or `pad`), then random ids."""
    batch, n_pos, vocab = logits.shape
    g = n_pos - 1
    top = reference.chain_verify.safe_argmax(logits)[:, :g]
    drafts = torch.randint(-1, vocab, (batch, g), generator=gen)
    for b in range(batch):
        k = int(torch.randint(0, g + 1, (1,), generator=gen))  # k == g: all drafts match
        drafts[b, :k] = top[b, :k]
        if k < g:
            drafts[b, k] = -1 if (vocab == 1 or pad) else (top[b, k] + 1) % vocab
    return drafts


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("vocab", (1, 5, 1000, 4099))
@pytest.mark.parametrize("batch", (1, 3))
@pytest.mark.parametrize("g", (0, 1, 4))
def test_random_prefix_and_ragged(dtype, vocab, batch, g):
    gen = torch.Generator().manual_seed(vocab * 100 + batch * 10 + g)
    logits = torch.randn(batch, g + 1, vocab, generator=gen).to(dtype)
    drafts = drafts_with_prefix(logits, gen, pad=vocab == 5)
    _, accepted = assert_matches(logits, drafts)
    ragged = torch.randint(0, g + 1, (batch,), generator=gen)
    assert_matches(logits, drafts, ragged)
    if g:
        assert_matches(logits, drafts, torch.zeros(batch, dtype=torch.int64))  # nothing to verify: bonus at 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("tie", [(0, 1), (3, 4098), (1023, 1024), (1024, 2048), (4095, 4096), (4096, 4098),
                                 (4098,), (7, 1500, 3071, 3072, 4098)])
def test_ties_go_to_the_lowest_index(dtype, tie):
    # V = 4099 with BLOCK_V = 1024 and 4 tiles per program: tiles end at 1023, 2047, 3071,
    # the first split at 4095, and the last tile holds 4096..4098.
    vocab, g = 4099, 2
    gen = torch.Generator().manual_seed(len(tie))
    logits = torch.randn(2, g + 1, vocab, generator=gen).clamp(-3, 3).to(dtype)
    logits[:, :, list(tie)] = 5.0
    logits[1, 1, list(tie)] = INF  # +inf ties too
    first = tie[0]
    drafts = torch.tensor([[first, first], [first, (first + 1) % vocab]])  # row 1: a tied id that is not the lowest
    out, accepted = assert_matches(logits, drafts)
    assert out[0].tolist() == [first, first, first] and accepted.tolist() == [2, 1]
    assert out[1].tolist() == [first, first, -1]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_nan_and_infinite_rows(dtype):
    vocab, g = 1000, 4
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, g + 1, vocab, generator=gen).to(dtype)
    logits[0, 0] = NAN  # all-NaN row: argmax 0
    logits[0, 1] = -INF  # all -inf row: argmax 0
    logits[0, 2, :] = NAN
    logits[0, 2, 999] = -INF  # NaN and -inf only: still 0
    logits[0, 3, ::2] = NAN  # NaN never wins
    logits[0, 3, 1] = 100.0
    logits[1, :, 10] = INF
    logits[1, :, 900] = INF
    logits[1, 2, 5] = NAN
    logits[2, 0, :] = -INF
    logits[2, 0, 999] = -60000.0 if dtype == torch.float16 else -1e30  # one finite logit
    drafts = torch.tensor([[0, 0, 0, 1], [10, 10, 10, 900], [999, -1, 3, 4]])
    out, accepted = assert_matches(logits, drafts)
    assert accepted.tolist() == [4, 3, 1]
    assert out[0].tolist() == [0, 0, 0, 1, int(reference.chain_verify.safe_argmax(logits[0, 4]))]
    assert out[1, 3].item() == 10
    for counts in ([0, 0, 0], [2, 4, 1], [4, 3, 2]):
        assert_matches(logits, drafts, torch.tensor(counts))


def test_padding_drafts_never_match():
    logits = torch.full((2, 4, 7), -INF)  # every argmax is 0
    drafts = torch.tensor([[-1, 0, 0], [0, 0, -1]])
    out, accepted = assert_matches(logits, drafts)
    assert out.tolist() == [[0, -1, -1, -1], [0, 0, 0, -1]] and accepted.tolist() == [0, 2]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_strided_inputs(dtype):
    batch, g, vocab = 3, 4, 1000
    gen = torch.Generator().manual_seed(2)
    big = torch.randn(batch, g + 3, vocab, generator=gen).to(dtype)
    logits = big[:, 1:g + 2]  # batch stride (g+3) * V
    assert not logits.is_contiguous()
    drafts = drafts_with_prefix(logits, gen)
    assert_matches(logits, drafts)
    swapped = torch.randn(g + 1, batch, vocab, generator=gen).to(dtype).transpose(0, 1)  # position-major storage
    drafts_t = drafts_with_prefix(swapped, gen).t().contiguous().t()  # column-major drafts
    counts = torch.tensor([4, 0, 1, 2, 3, 0])[::2]  # strided counts [4, 1, 3]
    assert_matches(swapped, drafts_t, counts)
    assert_matches(swapped, drafts_t)


def test_empty_batch():
    out, accepted = ops.greedy_verify(torch.randn(0, 3, 10), torch.zeros(0, 2, dtype=torch.int64), backend="triton")
    assert out.shape == (0, 3) and accepted.shape == (0,)


@pytest.mark.parametrize("vocab", (1, 17, 95, 160, 300))
def test_many_splits(vocab):
    """Small tiles force several tiles per program and many splits (and the split cap)."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-2, 3, (3, 4, vocab), generator=gen).float()  # heavy ties
    logits[0, 1] = -INF
    logits[1, 2, ::3] = NAN
    drafts = drafts_with_prefix(logits, gen)
    counts = torch.tensor([3, 1, 2])
    want = reference.greedy_verify(logits, drafts, num_draft_tokens=counts)
    for block_v, tiles, max_splits in ((16, 1, 64), (16, 2, 3), (32, 4, 1)):
        got = triton_module._launch_chain(logits, drafts, counts, mode=triton_module.GREEDY.value, block_v=block_v,
                                          tiles_per_program=tiles, max_splits=max_splits)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (block_v, tiles, max_splits)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), g=st.integers(0, 4), vocab=st.integers(1, 70), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31 - 1), special=st.floats(0.0, 0.5), ragged=st.booleans())
def test_property_matches_reference(batch, g, vocab, dtype, seed, special, ragged):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (batch, g + 1, vocab), generator=gen).float()  # ties are common
    specials = torch.tensor([NAN, INF, -INF])[torch.randint(0, 3, logits.shape, generator=gen)]
    logits = torch.where(torch.rand(logits.shape, generator=gen) < special, specials, logits).to(dtype)
    drafts = drafts_with_prefix(logits, gen)
    counts = torch.randint(0, g + 1, (batch,), generator=gen) if ragged else None
    out, accepted = ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="triton")
    want_out, want_acc = reference.greedy_verify(logits, drafts, num_draft_tokens=counts)
    assert torch.equal(out, want_out) and torch.equal(accepted, want_acc)
    emitted = out.gather(1, accepted.unsqueeze(1)).squeeze(1)  # the correction / bonus token
    assert bool(((emitted >= 0) & (emitted < vocab)).all())
    assert bool(((out >= -1) & (out < vocab)).all())
