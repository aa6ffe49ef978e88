"""The Triton rejection_sample backend (and its Philox / fixed-point helpers) against the
torch reference, bit for bit.

Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported); on a machine without triton the module is skipped.
"""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import ops, reference
from specdec_kernels.reference import rng
from specdec_kernels.triton import _philox
from specdec_kernels.triton import rejection_sample as triton_module

pytestmark = [
    # the interpreter evaluates 0 * inf and NaN arithmetic with numpy, which warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731


# ------------------------------------------------------------------ Philox

@triton.jit
def _philox_words_kernel(in_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    c0 = tl.load(in_ptr + i * 6 + 0).to(tl.uint32)
    c1 = tl.load(in_ptr + i * 6 + 1).to(tl.uint32)
    c2 = tl.load(in_ptr + i * 6 + 2).to(tl.uint32)
    c3 = tl.load(in_ptr + i * 6 + 3).to(tl.uint32)
    k0 = tl.load(in_ptr + i * 6 + 4).to(tl.uint32)
    k1 = tl.load(in_ptr + i * 6 + 5).to(tl.uint32)
    x0, x1, x2, x3 = _philox.philox4x32(c0, c1, c2, c3, k0, k1)
    tl.store(out_ptr + i * 4 + 0, x0.to(tl.int64))
    tl.store(out_ptr + i * 4 + 1, x1.to(tl.int64))
    tl.store(out_ptr + i * 4 + 2, x2.to(tl.int64))
    tl.store(out_ptr + i * 4 + 3, x3.to(tl.int64))


@triton.jit
def _philox_uniform_kernel(seed_ptr, pos_ptr, key_ptr, extra_ptr, out_ptr, salt, N: tl.constexpr):
    i = tl.arange(0, N)
    u = _philox.philox_uniform(tl.load(seed_ptr + i), tl.load(pos_ptr + i), tl.load(key_ptr + i), salt,
                               tl.load(extra_ptr + i))
    tl.store(out_ptr + i, u)


def test_philox_known_answers():
    """Random123 known-answer vectors for Philox-4x32-10 (counter words, then the 2 key words)."""
    m = 0xFFFFFFFF
    cases = [((0, 0, 0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((m, m, m, m, m, m), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
             ((0, 0, 0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8))]  # pad to 4 lanes
    inputs = torch.tensor([c for c, _ in cases], dtype=torch.int64)
    out = torch.empty(len(cases), 4, dtype=torch.int64)
    _philox_words_kernel[(1,)](inputs, out, N=len(cases))
    assert out.tolist() == [list(w) for _, w in cases]


def test_philox_uniform_matches_reference():
    gen = torch.Generator().manual_seed(0)
    n = 256
    seeds = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)
    seeds[:6] = torch.tensor([0, 1, -1, 2**32, 2**32 - 1, -2**63])
    positions = torch.randint(-2**40, 2**40, (n,), generator=gen)  # only the low 32 bits count
    positions[:4] = torch.tensor([0, 2**32 - 1, 2**32, -1])
    keys = torch.randint(0, 2**33, (n,), generator=gen)
    extras = torch.randint(0, 1000, (n,), generator=gen)
    for salt in (rng.SALT_ACCEPT, rng.SALT_FINAL, 7):
        out = torch.empty(n, dtype=torch.float64)
        _philox_uniform_kernel[(1,)](seeds, positions, keys, extras, out, salt, N=n)
        want = rng.philox_uniform(seeds, positions, keys, salt, extras)
        assert torch.equal(out, want), salt
        assert bool(((out >= 0) & (out < 1)).all())


# ------------------------------------------------------------------ helpers

def assert_matches(target, draft, drafts, **kwargs):
    got = ops.rejection_sample(target, draft, drafts, backend="triton", **kwargs)
    want = ops.rejection_sample(target, draft, drafts, backend="torch", **kwargs)
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape, name
        assert torch.equal(g_, w_), f"{name}: triton {g_.tolist()} != torch {w_.tolist()} ({sorted(kwargs)})"
    out, accepted = got
    vocab = target.shape[-1]
    emitted = out.gather(1, accepted.unsqueeze(1)).squeeze(1)
    assert bool(((emitted >= 0) & (emitted < vocab)).all()), emitted
    return got


def make_inputs(batch, g, vocab, dtype, gen, *, zero_frac=0.2):
    """Target/draft distributions that are close (so drafts are often accepted), with some
    zero target entries (so some are rejected), and drafts sampled from the draft rows."""
    target = torch.rand(batch, g + 1, vocab, generator=gen) ** 4
    target = torch.where(torch.rand(target.shape, generator=gen) < zero_frac, 0.0, target)
    target[..., 0] += 1e-3  # no all-zero row by accident
    target = target / target.sum(-1, keepdim=True)
    noise = torch.rand(batch, g, vocab, generator=gen)
    draft = 0.7 * target[:, :g] + 0.3 * noise / noise.sum(-1, keepdim=True)
    drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    return target.to(dtype), draft.to(dtype), drafts


def uniforms(batch, g, gen, dtype, zero_frac=0.15):
    u = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64).to(dtype)
    return torch.where(torch.rand(u.shape, generator=gen) < zero_frac, torch.zeros_like(u), u)


def all_modes(batch, g, gen):
    """kwargs for each randomness mode: float32/float64 uniforms (with exact 0.0 coins), int
    seed with offsets (crossing 2^32 in the counter), per-row seeds without offsets."""
    return [
        dict(uniforms=uniforms(batch, g, gen, torch.float32)),
        dict(uniforms=uniforms(batch, g, gen, torch.float64)),
        dict(seed=int(torch.randint(-2**62, 2**62, (1,), generator=gen)),
             offsets=torch.tensor([0, 2**32 - 2, 17, -5, 2**40] * 2)[:batch]),
        dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)),
    ]


# ------------------------------------------------------------------ shapes, dtypes, modes

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("vocab", (1, 7, 300, 1100))
@pytest.mark.parametrize("batch", (1, 4))
@pytest.mark.parametrize("g", (1, 3))
def test_matches_reference(dtype, vocab, batch, g):
    gen = torch.Generator().manual_seed(vocab * 100 + batch * 10 + g)
    target, draft, drafts = make_inputs(batch, g, vocab, dtype, gen)
    ragged = torch.tensor([0, g, 1, g - 1])[:batch]
    for i, kwargs in enumerate(all_modes(batch, g, gen)):
        assert_matches(target, draft, drafts, **kwargs)
        if i % 2 == 0:
            assert_matches(target, draft, drafts, num_draft_tokens=ragged, **kwargs)


@pytest.mark.parametrize("vocab", (7, 300, 1100))
def test_small_tiles(vocab):
    """BLOCK_V = 16 / 64: many tiles, so the int64 cdf carries across tile boundaries, and
    the final row split into chunks of 1 or 3 tiles (up to 69 programs per row) or kept whole."""
    gen = torch.Generator().manual_seed(vocab)
    target, draft, drafts = make_inputs(3, 2, vocab, torch.float32, gen, zero_frac=0.6)
    counts = torch.tensor([2, 1, 0])
    plans = (dict(block_v=16, min_tiles=1), dict(block_v=16, min_tiles=3), dict(block_v=64, target_programs=1))
    for kwargs in all_modes(3, 2, gen):
        want = reference.rejection_sample(target, draft, drafts, num_draft_tokens=counts, **kwargs)
        for plan in plans:
            got = triton_module._launch(target, draft, drafts, num_draft_tokens=counts, **plan, **kwargs)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (plan, sorted(kwargs))


def test_split_plan_uses_static_shapes_only():
    """Many programs per row at small B, chunks of at most MAX_TILES tiles at large B."""
    block_v, tiles, splits = triton_module._split_plan(1, 151936)
    assert block_v == 1024 and splits * tiles * block_v >= 151936 and (splits - 1) * tiles * block_v < 151936
    assert splits >= 32 and tiles >= triton_module.MIN_TILES
    _, tiles, splits = triton_module._split_plan(256, 151936)
    assert tiles <= triton_module.MAX_TILES and splits * tiles * 1024 >= 151936
    assert triton_module._split_plan(4, 300) == (512, 1, 1)  # a small V is one chunk
    assert triton_module._split_plan(1, 300, block_v=16, min_tiles=1) == (16, 1, 19)


def test_no_drafts_and_empty_batch():
    gen = torch.Generator().manual_seed(3)
    target, draft, drafts = make_inputs(2, 0, 50, torch.float16, gen)
    for kwargs in all_modes(2, 0, gen):
        out, accepted = assert_matches(target, draft, drafts, **kwargs)
        assert accepted.tolist() == [0, 0]
    out, accepted = ops.rejection_sample(torch.rand(0, 3, 10), torch.rand(0, 2, 10),
                                         torch.zeros(0, 2, dtype=torch.int64), seed=1, backend="triton")
    assert out.shape == (0, 3) and accepted.shape == (0,)


@pytest.mark.parametrize("seed", (0, 1, -1, 2**32, 2**63 - 1, -2**63))
def test_int_seed_values(seed):
    """Seeds that Triton would specialise (1) or that need both 32-bit key words."""
    gen = torch.Generator().manual_seed(5)
    target, draft, drafts = make_inputs(3, 2, 20, torch.float32, gen)
    assert_matches(target, draft, drafts, seed=seed)
    assert_matches(target, draft, drafts, seed=seed, offsets=torch.tensor([2**32 - 1, 0, -1]))


# ------------------------------------------------------------------ edge rows

def edge_case_inputs(dtype):
    """One crafted row per edge case, V = 300, g = 3."""
    vocab, g = 300, 3
    gen = torch.Generator().manual_seed(11)
    target, draft, drafts = make_inputs(9, g, vocab, torch.float32, gen)
    # 0: p == q everywhere and a draft on a zero-mass id -> rejected, empty residual -> draw from p
    target[0, :g] = draft[0]
    target[0, :, 5] = 0.0
    draft[0, :, 5] = 0.0
    drafts[0] = torch.tensor([drafts[0, 0], 5, 6])
    # 1: q == 0 < p at the drafts -> accepted whatever the coin; bonus from p[g]
    draft[1, :, 9] = 0.0
    target[1, :, 9] = 0.25
    drafts[1] = 9
    # 2: one-hot target rows: the residual is the hot id whenever the draft misses it
    target[2] = 0.0
    target[2, torch.arange(g + 1), torch.tensor([3, 4, 299, 0])] = 1.0
    drafts[2] = torch.tensor([3, 7, 299])
    # 3: all-zero target row at the first rejection -> residual and p empty -> id 0
    target[3, 1] = 0.0
    # 4: all-NaN row (p_x NaN rejects; NaN weighs 0) and a partly NaN bonus row
    target[4, 0] = NAN
    target[4, 3, ::2] = NAN
    # 5: +inf entries in p (weight 1) and in q (u * inf is never < a finite p; 0 * inf is NaN)
    target[5, 0, drafts[5, 0]] = INF
    target[5, 1, 100:103] = INF
    draft[5, 1, drafts[5, 1]] = INF
    draft[5, 2, 7] = INF
    target[5, 3, 250] = INF
    # 6: -1 padding in the middle of the drafts
    drafts[6, 1] = -1
    # 7: a residual with mass only at the last id
    target[7, 0] = 0.0
    target[7, 0, vocab - 1] = 0.5
    draft[7, 0] = 0.01
    drafts[7, 0] = 0
    # 8: NaN in q (residual NaN weighs 0) and negative / tiny subnormal values
    draft[8, 0, :150] = NAN
    target[8, 0, 10] = -0.5
    target[8, 1, 20:30] = 1e-30 if dtype == torch.float32 else 1e-7
    return target.to(dtype), draft.to(dtype), drafts


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_edge_rows(dtype):
    target, draft, drafts = edge_case_inputs(dtype)
    batch, g = drafts.shape
    gen = torch.Generator().manual_seed(12)
    modes = all_modes(batch, g, gen)
    modes.append(dict(uniforms=torch.zeros(batch, g + 1)))  # every coin and the final draw at exactly 0
    modes.append(dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-53, dtype=torch.float64)))  # largest u
    modes.append(dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-24, dtype=torch.float32)))
    for kwargs in modes:
        out, accepted = assert_matches(target, draft, drafts, **kwargs)
        assert accepted[1] == g and accepted[3] <= 1 and accepted[4] == 0 and accepted[6] <= 1
        if accepted[3] == 1:
            assert out[3, 1] == 0  # no mass at all -> id 0
        assert out[4, 0] == 0
        assert out[2, accepted[2]] == torch.tensor([3, 4, 299, 0])[accepted[2]]
    for counts in ([0] * batch, [3, 2, 1, 0, 3, 2, 1, 0, 3]):
        for kwargs in modes[:4]:
            assert_matches(target, draft, drafts, num_draft_tokens=torch.tensor(counts), **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_edge_rows_with_split_final_rows(dtype):
    """The edge rows again with V = 300 in 19 chunks of 16: empty residuals, no mass, NaN
    and inf rows, and mass only in the last chunk go through the chunk search."""
    target, draft, drafts = edge_case_inputs(dtype)
    batch, g = drafts.shape
    gen = torch.Generator().manual_seed(13)
    modes = all_modes(batch, g, gen) + [dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-53, dtype=torch.float64))]
    for kwargs in modes:
        want = reference.rejection_sample(target, draft, drafts, **kwargs)
        got = triton_module._launch(target, draft, drafts, block_v=16, min_tiles=1, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), sorted(kwargs)


def test_out_of_range_ids_are_rejected():
    """Ids >= V or < -1 (possible on a GPU, where values are not validated) read nothing and reject."""
    gen = torch.Generator().manual_seed(4)
    target, draft, drafts = make_inputs(4, 3, 40, torch.float32, gen)
    target[..., 0] = 1.0  # an in-range id 0 would be accepted
    drafts = torch.tensor([[40, 0, 0], [0, 2**40, 0], [0, 0, -7], [-2**62, 0, 0]])
    u = torch.rand(4, 4, generator=gen)
    got = triton_module.rejection_sample(target, draft, drafts, uniforms=u)
    want = reference.rejection_sample(target, draft, drafts, uniforms=u)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[1].tolist() == [0, 1, 2, 0]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_inputs(dtype):
    batch, g, vocab = 3, 3, 300
    gen = torch.Generator().manual_seed(2)
    target, draft, drafts = make_inputs(batch, g, vocab, dtype, gen)
    big = torch.zeros(batch, g + 3, vocab, dtype=dtype)
    big[:, 1:g + 2] = target
    target_view = big[:, 1:g + 2]  # batch stride (g+3) * V
    draft_view = draft.transpose(0, 1).contiguous().transpose(0, 1)  # position-major storage
    drafts_view = drafts.t().contiguous().t()  # column-major ids
    assert not (target_view.is_contiguous() or draft_view.is_contiguous() or drafts_view.is_contiguous())
    counts = torch.tensor([3, 0, 1, 2, 2, 0])[::2]  # strided counts [3, 1, 2]
    u = uniforms(batch, g, gen, torch.float64).t().contiguous().t()
    seeds = torch.randint(0, 2**40, (2 * batch,), generator=gen)[::2]
    offsets = torch.tensor([5, 0, 9, 0, 2**33, 0])[::2]
    for kwargs in (dict(uniforms=u), dict(seed=seeds, offsets=offsets), dict(seed=99, offsets=offsets)):
        assert_matches(target_view, draft_view, drafts_view, **kwargs)
        assert_matches(target_view, draft_view, drafts_view, num_draft_tokens=counts, **kwargs)


# ------------------------------------------------------------------ properties

def test_batch_invariance_with_row_seeds():
    """With per-request seeds a row's result depends on that row only: permuting the batch
    permutes the outputs, and a row run alone gives the same tokens."""
    batch, g, vocab = 6, 3, 50
    gen = torch.Generator().manual_seed(8)
    target, draft, drafts = make_inputs(batch, g, vocab, torch.bfloat16, gen)
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)
    offsets = torch.randint(0, 1000, (batch,), generator=gen)
    counts = torch.randint(0, g + 1, (batch,), generator=gen)
    out, accepted = ops.rejection_sample(target, draft, drafts, seed=seeds, offsets=offsets, num_draft_tokens=counts,
                                         backend="triton")
    perm = torch.randperm(batch, generator=gen)
    out_p, accepted_p = ops.rejection_sample(target[perm], draft[perm], drafts[perm], seed=seeds[perm],
                                             offsets=offsets[perm], num_draft_tokens=counts[perm], backend="triton")
    assert torch.equal(out_p, out[perm]) and torch.equal(accepted_p, accepted[perm])
    b = int(perm[0])
    one = ops.rejection_sample(target[b:b + 1], draft[b:b + 1], drafts[b:b + 1], seed=seeds[b:b + 1],
                               offsets=offsets[b:b + 1], num_draft_tokens=counts[b:b + 1], backend="triton")
    assert torch.equal(one[0][0], out[b]) and int(one[1][0]) == int(accepted[b])


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 4), g=st.integers(0, 4), vocab=st.integers(1, 70), dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(("u32", "u64", "seed", "seeds")), seed=st.integers(0, 2**31 - 1),
       special=st.floats(0.0, 0.3), ragged=st.booleans())
def test_property_matches_reference(batch, g, vocab, dtype, mode, seed, special, ragged):
    gen = torch.Generator().manual_seed(seed)
    target, draft, drafts = make_inputs(batch, g, vocab, torch.float32, gen, zero_frac=0.5)
    specials = torch.tensor([NAN, INF, 0.0, -1.0])
    for x in (target, draft):
        pick = specials[torch.randint(0, 4, x.shape, generator=gen)]
        x.copy_(torch.where(torch.rand(x.shape, generator=gen) < special, pick, x))
    drafts = torch.where(torch.rand(drafts.shape, generator=gen) < special, -1, drafts)
    target, draft = target.to(dtype), draft.to(dtype)
    kwargs = all_modes(batch, g, gen)[("u32", "u64", "seed", "seeds").index(mode)]
    counts = torch.randint(0, g + 1, (batch,), generator=gen) if ragged else None
    out, accepted = ops.rejection_sample(target, draft, drafts, num_draft_tokens=counts, backend="triton", **kwargs)
    want_out, want_acc = reference.rejection_sample(target, draft, drafts, num_draft_tokens=counts, **kwargs)
    assert torch.equal(out, want_out) and torch.equal(accepted, want_acc)
    emitted = out.gather(1, accepted.unsqueeze(1)).squeeze(1)
    assert bool(((emitted >= 0) & (emitted < vocab)).all())
    assert bool(((out >= -1) & (out < vocab)).all())
