"""The per-element arithmetic of the logits sampling ops (rejection_sample_logits,
block_verify_logits) against torch.softmax(x.float() / T), on the CPU.

Both backends compute p(x) = exp(z - M) / S without a division per element (csrc/logit_math.cuh
softmax_prob, specdec_kernels/triton/_split_v_sampling.py softmax_prob): z = x / T from one
multiply and a Markstein fma step, exp as exp2 of (z - M) log2 e, and a multiply by 1 / S.
This file proves on the CPU what that costs:
- z is bit-identical to torch's x / T for every normal temperature and normal x (host build of
  the CUDA arithmetic; the Triton helper under the interpreter), ±inf and NaN included (a
  subnormal x or quotient, below 1.2e-38, is within 2^-23 of torch's z);
- over random rows (fp32 / fp16 / bf16, |x| up to 1e4, T from 0.05 to 100) and every
  p >= 2^-40 (a nonzero fixed-point weight), the relative error of the per-element term
  exp(z - M) is at most MAX_REL_ERR and that of p against the float32 reference (which adds
  the normaliser's summation order, here one sequential float32 sum) below the 1e-5 band of docs/ops.md
  "Numerics". The host build runs std::exp2 and the interpreter numpy's exp2 where a GPU runs
  ex2.approx.f32 (relative error about 2^-22 = 2.4e-7 more), which the bounds leave room for;
- over many seeds of such rows, every token that differs from the reference is explained by a
  decision within the band (the rule of tests/test_triton_rejection_sample_logits.py, on the
  reference's own float32 z).
"""

import math

import pytest
import torch

from specdec_kernels import ops, reference

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

INF, NAN = float("inf"), float("nan")
MIN_WEIGHT_P = 2.0 ** -40  # below this a probability has fixed-point weight 0
MAX_REL_ERR = 3e-6  # measured on the CPU (host exp2): about 2e-6; + 2.4e-7 for ex2.approx on a GPU
BAND = 1e-5
TEMPERATURES = (0.05, 0.3, 0.7, 1.0, 1.7, 10.0, 100.0)
SCALES = (1.0, 10.0, 100.0, 1e4)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _c():
    from specdec_kernels import _C  # noqa: PLC0415
    if not hasattr(_C, "host_softmax_probs"):
        pytest.skip("the CUDA module was built without the host softmax arithmetic")
    return _C


def logit_row(dtype, scale, vocab, gen):
    """One row of logits at `scale` (fp16 saturates at 65504: 1e4 stays finite)."""
    x = torch.randn(vocab, generator=gen) * scale
    x[: vocab // 16] -= scale * 3  # a tail of small probabilities
    return x.to(dtype).float()


def rel_error(p, want):
    """Max relative error of p against the float32 reference over ids with want >= 2^-40."""
    keep = want >= MIN_WEIGHT_P
    return float(((p.double() - want.double()).abs()[keep] / want.double()[keep]).max())


def reference_p(x, temperature):
    return torch.softmax(x / temperature, dim=-1)


# ------------------------------------------------------------------ x / T is torch's division

SPECIAL_T = (0.05, 0.3, 0.7, 1.0, 1.3, 1.7, 2.0, 0.001, 123.4, 1e-30, 1e30, 2.0 ** 127 * 1.5, 2.0 ** -126, -0.7)


def quotient_inputs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=gen) * torch.tensor([1.0, 10.0, 1e3, 1e4, 1e30])[torch.randint(0, 5, (20000,),
                                                                                                  generator=gen)]
    return torch.cat([x, torch.tensor([0.0, -0.0, INF, -INF, NAN, 3.4e38, -3.4e38, 1e-40, 1.0, -1.0])])


def same_floats(x, a, b):
    """a == b bit for bit (NaN == NaN) wherever x and the quotient b are normal. Where x is
    subnormal (|x| < 2^-126, so x / t is too) the quotient keeps only subnormal precision: a
    stays within 2^-149 2^-e <= 2^-23 of b (T = t 2^e >= 2^-126); a subnormal quotient may
    differ in its last bit (2^-149). Both are exponent errors no exp resolves in the band."""
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    tiny = (x.abs() < 2.0 ** -126) | (b.abs() < 2.0 ** -126)
    return bool((same | (tiny & ((a - b).abs() <= 2.0 ** -23))).all())


@pytest.mark.parametrize("temperature", SPECIAL_T + (INF,))
def test_host_quotient_is_the_division(temperature):
    _C = _c()
    x = quotient_inputs()
    got = torch.tensor(_C.host_scaled_logits(x.tolist(), temperature), dtype=torch.float32)
    want = x / torch.tensor(temperature, dtype=torch.float32)
    assert same_floats(x, got, want), (got[got != want][:5], want[got != want][:5])


def test_host_zero_temperature_rows_are_nan_as_torch():
    """T = 0 (validation refuses it; only an unchecked per-row GPU tensor can carry it): x / 0 is
    +inf for x > 0 where the kernels give NaN, otherwise the same; either way the row has a NaN
    or a +inf or no finite value, so torch's softmax row and the kernels' are all NaN."""
    _C = _c()
    x = quotient_inputs()
    got = torch.tensor(_C.host_scaled_logits(x.tolist(), 0.0), dtype=torch.float32)
    want = x / 0.0
    assert same_floats(x[want != INF], got[want != INF], want[want != INF])
    assert bool(torch.isnan(got[want == INF]).all())
    assert _C.host_softmax_stats([-1.0, 2.0], 0.0, 4)[2] and _C.host_softmax_stats([-1.0, 0.0], 0.0, 4)[2]


# ------------------------------------------------------------------ p against the reference (host build)

@pytest.mark.parametrize("dtype", DTYPES)
def test_host_probability_error_is_far_inside_the_band(dtype):
    _C = _c()
    gen = torch.Generator().manual_seed(1)
    slot = 4 if dtype == torch.float32 else 8  # the kernels' 16-byte vectors
    worst = worst_elem = 0.0
    for scale in SCALES:
        for temperature in TEMPERATURES:
            x = logit_row(dtype, scale, 4096, gen)
            m, s, bad = _C.host_softmax_stats(x.tolist(), temperature, slot)
            assert not bad
            assert m == float((x / temperature).max())  # the row max is the reference's, bit for bit
            p = torch.tensor(_C.host_softmax_probs(x.tolist(), temperature, m, s))
            want = reference_p(x, temperature)
            # the per-element arithmetic alone: exp(z - M) = p S against float64 on torch's z
            numer = p.double() * s
            exact = torch.exp((x / temperature).double() - m)
            elem = rel_error(numer, exact)
            err = rel_error(p, want)  # + the normaliser's summation order (here one sequential sum)
            worst_elem, worst = max(worst_elem, elem), max(worst, err)
            assert elem <= MAX_REL_ERR, (scale, temperature, elem)
            assert err < BAND, (scale, temperature, err)  # one sequential sum here; the kernels sum in a tree
            assert abs(float(p.double().sum()) - 1.0) < 1e-5
    print(f"host build, {dtype}: max relative error of exp(z - M) {worst_elem:.3g}, of p {worst:.3g} (band {BAND})")


def test_host_special_rows():
    _C = _c()
    row = [0.5, -INF, 2.0, -1.0, -INF, 3.0]
    m, s, bad = _C.host_softmax_stats(row, 0.7, 4)
    assert not bad and m == float(torch.tensor(3.0) / 0.7)
    p = _C.host_softmax_probs(row, 0.7, m, s)
    assert p[1] == 0.0 and p[4] == 0.0  # -inf logits weigh exactly 0, as in torch
    assert rel_error(torch.tensor(p), reference_p(torch.tensor(row), 0.7)) <= MAX_REL_ERR
    for poisoned in ([0.5, NAN, 1.0], [0.5, INF, 1.0], [NAN] * 9, [1.0] * 7 + [INF]):
        assert _C.host_softmax_stats(poisoned, 0.7, 8)[2]  # torch's row is all NaN: bad
    m, s, bad = _C.host_softmax_stats([-INF] * 5, 1.0, 4)
    assert m == -INF and s == 0.0 and not bad  # no finite logit: the merge makes the row NaN
    assert all(math.isnan(v) for v in _C.host_softmax_probs([1.0, -INF], 1.0, NAN, NAN))  # a NaN row stays NaN


# ------------------------------------------------------------------ the Triton helpers (interpreter)

try:
    import triton
    import triton.language as tl

    from specdec_kernels.triton._split_v_sampling import chunk_softmax_stats, div_mantissa, softmax_prob, temp_scale
except ImportError:  # pragma: no cover - no Triton: the Triton checks skip
    triton = None

if triton is not None:
    @triton.jit
    def _probe_kernel(x_ptr, p_ptr, z_ptr, stats_ptr, temp, vocab, BLOCK_V: tl.constexpr, TILES: tl.constexpr):
        """One row: its statistics (chunk_softmax_stats), p by softmax_prob and z = x / T."""
        temp = tl.full((), 0.0, tl.float32) + temp  # a float32 scalar, as row_temperature gives it
        best, total = chunk_softmax_stats(x_ptr, 0, vocab, temp, BLOCK_V, TILES)
        inv = 1.0 / total
        t, r, scale = temp_scale(temp)
        lanes = tl.arange(0, BLOCK_V)
        for k in range(TILES):
            offs = k * BLOCK_V + lanes
            x = tl.load(x_ptr + offs, mask=offs < vocab, other=0.0)
            tl.store(p_ptr + offs, softmax_prob(x, temp, best, inv), mask=offs < vocab)
            tl.store(z_ptr + offs, div_mantissa(x.to(tl.float32), t, r) * scale, mask=offs < vocab)
        tl.store(stats_ptr, best)
        tl.store(stats_ptr + 1, total)


def _triton_probe():
    import os  # noqa: PLC0415
    if triton is None:
        pytest.skip("no Triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton arithmetic is checked under TRITON_INTERPRET=1 here")

    def run(x, temperature):
        vocab = x.numel()
        block = 256
        tiles = (vocab + block - 1) // block
        p = torch.empty(vocab)
        z = torch.empty(vocab)
        stats = torch.empty(2)
        _probe_kernel[(1,)](x, p, z, stats, temperature, vocab, BLOCK_V=block, TILES=tiles)
        return p, z, stats

    return run


@pytest.mark.parametrize("temperature", SPECIAL_T + (INF,))
def test_triton_quotient_is_the_division(temperature):
    run = _triton_probe()
    x = quotient_inputs()[-2048:]
    _, z, _ = run(x.contiguous(), temperature)
    assert same_floats(x, z, x / torch.tensor(temperature, dtype=torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_probability_error_is_far_inside_the_band(dtype):
    run = _triton_probe()
    gen = torch.Generator().manual_seed(2)
    worst = 0.0
    for scale in SCALES:
        for temperature in TEMPERATURES:
            x = logit_row(dtype, scale, 2048, gen).to(dtype)
            p, _, stats = run(x, temperature)
            want = reference_p(x.float(), temperature)
            assert float(stats[0]) == float((x.float() / temperature).max())
            err = rel_error(p, want)
            worst = max(worst, err)
            assert err <= MAX_REL_ERR, (scale, temperature, err)
    print(f"triton (interpreter), {dtype}: max relative error of p {worst:.3g} (band {BAND})")


def test_triton_special_rows():
    run = _triton_probe()
    x = torch.tensor([0.5, -INF, 2.0, -1.0, -INF, 3.0])
    p, _, stats = run(x, 0.7)
    assert float(p[1]) == 0.0 and float(p[4]) == 0.0
    assert rel_error(p, reference_p(x, 0.7)) <= MAX_REL_ERR
    for poisoned in ([0.5, NAN, 1.0], [NAN, NAN]):
        _, _, stats = run(torch.tensor(poisoned), 0.7)
        assert math.isnan(float(stats[1]))  # a NaN poisons the chunk sum: the row is all NaN
    _, _, stats = run(torch.tensor([0.5, INF, 1.0]), 0.7)
    assert float(stats[0]) == INF  # +inf max: the merge marks the row unusable


# ------------------------------------------------------------------ tokens: only band decisions differ

def stress_inputs(batch, g, vocab, dtype, scale, temperature, gen):
    target = (torch.randn(batch, g + 1, vocab, generator=gen) * scale).to(dtype)
    draft = (target[:, :g].float() + 0.02 * scale * torch.randn(batch, g, vocab, generator=gen)).to(dtype)
    q = torch.softmax((draft.float() / temperature).double(), -1).reshape(-1, vocab)
    drafts = torch.multinomial(q, 1, generator=gen).reshape(batch, g)
    return target, draft, drafts


@pytest.mark.parametrize("op", ["rejection_sample_logits", "block_verify_logits"])
def test_tokens_differ_only_within_the_band(op):
    pytest.importorskip("triton")
    from specdec_kernels.selftest.compare import near_boundary_explains  # noqa: PLC0415
    gen = torch.Generator().manual_seed(3)
    fn = getattr(ops, op)
    want_fn = getattr(reference, op)
    rows = mismatched = 0
    for dtype in DTYPES:
        for scale, temperature in ((1e4, 0.7), (30.0, 0.05), (3.0, 1.7), (100.0, 100.0)):
            batch, g, vocab = 6, 3, 96
            target, draft, drafts = stress_inputs(batch, g, vocab, dtype, scale, temperature, gen)
            uniforms = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
            kwargs = dict(temperature=temperature, uniforms=uniforms)
            got = fn(target, draft, drafts, backend="triton", **kwargs)
            want = want_fn(target, draft, drafts, **kwargs)
            # the reference's own float32 z = x / T, so the laws are exactly the ones it decided on
            inputs = dict(target_logits=target.float() / temperature, draft_logits=draft.float() / temperature,
                          draft_tokens=drafts, uniforms=uniforms, temperature=1.0)
            for b in range(batch):
                rows += 1
                if torch.equal(got[0][b], want[0][b]) and int(got[1][b]) == int(want[1][b]):
                    continue
                mismatched += 1
                assert near_boundary_explains(b, inputs, got, want, BAND, block=op == "block_verify_logits"), \
                    (op, dtype, scale, temperature, b, got[0][b].tolist(), want[0][b].tolist())
    assert mismatched <= rows // 10, (mismatched, rows)
