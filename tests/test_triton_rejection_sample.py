"""The Triton rejection_sample backend (and its Philox helpers) against the torch reference,
bit for bit.

The cases are the catalog's (specdec_kernels/selftest/cases_rejection_sampling.py at profile "tiny": every
randomness mode (float32 / float64 uniforms with exact 0 coins, the extreme uniforms, an int
seed with offsets across 2^32, per-row seeds with and without offsets), ragged and zero
counts, V = 1 / 7 / 300, g = 0, an empty batch, crafted edge rows (p == q, q = 0, one-hot,
no mass, NaN, inf, -1 padding, mass at the last id, NaN q), the adversarial row patterns,
out-of-range ids, strided / int32 / column-major inputs, int seeds Triton would specialise,
fuzz), judged as `specdec-kernels selftest` judges them; the GPU tests run the same catalog at
production sizes. Here besides: Philox known answers, the launch plans (small tiles, split
final rows) the catalog cannot pick, and batch invariance with per-row seeds.

Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported); on a machine without triton the module is skipped.
"""

import pytest
import torch
import triton
import triton.language as tl
from catalog_support import catalog_cases, check_case

from specdec_kernels import ops, reference
from specdec_kernels.common import draws, rng
from specdec_kernels.selftest.chain_inputs import edge_probs
from specdec_kernels.triton import _philox, _split_plans
from specdec_kernels.triton import rejection_sampling as triton_module

pytestmark = [
    # the interpreter evaluates 0 * inf and NaN arithmetic with numpy, which warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("rejection_sample",)))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


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


# ------------------------------------------------------------------ launch plans

# 300 and 1100 take 40-100 s each under the interpreter: `slow`, run by CI's main leg (7 covers the carry)
@pytest.mark.parametrize("vocab", (7, pytest.param(300, marks=pytest.mark.slow), pytest.param(1100, marks=pytest.mark.slow)))
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
    block_v, tiles, splits = _split_plans.sampling_plan(1, 151936)
    assert block_v == 1024 and splits * tiles * block_v >= 151936 and (splits - 1) * tiles * block_v < 151936
    assert splits >= 32 and tiles >= _split_plans.MIN_TILES
    _, tiles, splits = _split_plans.sampling_plan(256, 151936)
    assert tiles <= _split_plans.MAX_TILES and splits * tiles * 1024 >= 151936
    assert _split_plans.sampling_plan(4, 300) == (512, 1, 1)  # a small V is one chunk
    assert _split_plans.sampling_plan(1, 300, block_v=16, min_tiles=1) == (16, 1, 19)


@pytest.mark.slow  # 40-60 s per dtype under the interpreter (the catalog's edge rows cover one-chunk rows)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_edge_rows_with_split_final_rows(dtype):
    """The edge rows again with V = 300 in 19 chunks of 16: empty residuals, no mass, NaN
    and inf rows, and mass only in the last chunk go through the chunk search."""
    target, draft, drafts = edge_probs(dtype, torch.device("cpu"))
    batch, g = drafts.shape
    gen = torch.Generator().manual_seed(13)
    modes = all_modes(batch, g, gen) + [dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-53, dtype=torch.float64))]
    for kwargs in modes:
        want = reference.rejection_sample(target, draft, drafts, **kwargs)
        got = triton_module._launch(target, draft, drafts, block_v=16, min_tiles=1, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), sorted(kwargs)


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


# ------------------------------------------------------------------ the per-draft output

def passes_inputs(batch, g, vocab):
    """make_inputs with -1 padding, ids at V and beyond (the backends, unlike the op on a CPU, take
    them: a GPU's ids are not inspected), a NaN target row and ragged counts."""
    gen = torch.Generator().manual_seed(batch * 100 + vocab)
    target, draft, drafts = make_inputs(batch, g, vocab, torch.float32, gen, zero_frac=0.4)
    drafts[0, 1], drafts[2, 0], drafts[3, g - 1] = -1, vocab, vocab + 40
    target[4] = float("nan")
    counts = torch.tensor([g, g, 1, g, g, 0, g - 1][:batch])
    return gen, target, draft, drafts, counts


def own_tests(target, draft, drafts, counts, kwargs):
    """What the output must hold: common.draws.draft_passes on the call's coins, only on existing slots."""
    batch, g = drafts.shape
    coins = draws.ChainCoins(kwargs.get("uniforms"), kwargs.get("seed"), kwargs.get("offsets"), batch, g, "cpu")
    return draws.draft_passes(target, draft, drafts, coins.accept) & (torch.arange(g) < counts.unsqueeze(1))


def passes_of(sample, target, draft, drafts, **kwargs):
    passes = torch.ones(drafts.shape, dtype=torch.bool)  # every slot must be written, False ones too
    return sample(target, draft, drafts, draft_passes=passes, **kwargs), passes


def test_draft_passes_output():
    """The Triton kernel's per-draft output equals the reference's and common.draws.draft_passes on the
    same coins (drafts after the first rejection tested too; False on missing slots, out-of-range ids and
    the NaN row), in every randomness mode and on a final row split over 3 programs (split 0 writes);
    asking for it leaves the other outputs (the reference's too) as they were."""
    batch, g, vocab = 7, 4, 40
    gen, target, draft, drafts, counts = passes_inputs(batch, g, vocab)
    for kwargs in all_modes(batch, g, gen):
        plain = reference.rejection_sample(target, draft, drafts, num_draft_tokens=counts, **kwargs)
        want_out, want = passes_of(reference.rejection_sample, target, draft, drafts, num_draft_tokens=counts,
                                   **kwargs)
        assert torch.equal(want, own_tests(target, draft, drafts, counts, kwargs)), sorted(kwargs)
        assert all(torch.equal(a, b) for a, b in zip(want_out, plain))
        for plan in (dict(), dict(block_v=16, min_tiles=1)):
            got_out, got = passes_of(triton_module._launch, target, draft, drafts, num_draft_tokens=counts, **plan,
                                     **kwargs)
            assert torch.equal(got, want), (plan, sorted(kwargs), got.int().tolist(), want.int().tolist())
            assert all(torch.equal(a, b) for a, b in zip(got_out, plain)), (plan, sorted(kwargs))
        # the cases tell positions apart: a pass moved by one draft would be caught
        assert not torch.equal(want.roll(1, dims=1), want)
        # a draft past the first rejection that passes: what only the per-draft output shows
        assert bool((want & (torch.arange(g) > plain[1].unsqueeze(1))).any()), sorted(kwargs)
    assert not bool(want[4].any()) and not bool(want[5].any())  # the NaN row, the row without drafts


def test_draft_passes_output_through_the_op():
    """ops.rejection_sample(backend="triton", draft_passes=...) with the op's checks: -1 padding, ragged
    rows, g = 0 (an empty output)."""
    batch, g, vocab = 6, 3, 19
    gen = torch.Generator().manual_seed(5)
    target, draft, drafts = make_inputs(batch, g, vocab, torch.bfloat16, gen)
    drafts[1, 0] = -1
    counts = torch.tensor([3, 3, 2, 0, 1, 3])
    for kwargs in (dict(uniforms=uniforms(batch, g, gen, torch.float32)), dict(seed=11, offsets=torch.arange(batch))):
        got_out, got = passes_of(ops.rejection_sample, target, draft, drafts, num_draft_tokens=counts,
                                 backend="triton", **kwargs)
        want_out, want = passes_of(ops.rejection_sample, target, draft, drafts, num_draft_tokens=counts,
                                   backend="torch", **kwargs)
        assert torch.equal(got, want) and all(torch.equal(a, b) for a, b in zip(got_out, want_out)), sorted(kwargs)
    empty = torch.ones(batch, 0, dtype=torch.bool)
    ops.rejection_sample(target[:, :1], draft[:, :0], drafts[:, :0], uniforms=torch.rand(batch, 1),
                         draft_passes=empty, backend="triton")
