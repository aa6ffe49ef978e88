"""block_verify's CUDA arithmetic (csrc/block_verification_math.cuh), its kernel's steps and its launch
plans, built for the host and checked against the torch specification
(reference/block_verification.py) on the CPU: runs wherever _C is built, no GPU touched.

What this proves without a GPU: the float64 -> float32 prefix ratios, the 2^-40 residual weights,
the thresholds h_i and tau are the reference's bit for bit (the very functions the kernels call);
the kernel's step structure (per-chunk totals, tau from the summed chunks, the chunk search and the
rescan of one chunk) gives the reference's outputs for any chunking; the launch plans cover V with
at most 64 splits and a workspace that does not grow with V; the launcher's argument lists match
the bindings. What it cannot prove: the device code's barriers, tickets and memory ordering
(tests/test_gpu_block_verify.py and the selftest run those on a GPU)."""

import inspect

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.reference import block_verification as ref
from specdec_kernels.common.sampling import WEIGHT_SCALE

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "host_block_verify"),
                                reason="specdec_kernels._C (with block_verify) is not built here")

NAN, INF = float("nan"), float("inf")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SPECIAL = [0.0, -0.0, 1.0, 1.5, -1.0, NAN, INF, -INF, 1e-45, 1e-38, 2.0**-40, 2.0**-41, 1.0 - 2.0**-24, 0.5, 3e-13,
           0.3, 0.7, 1e-7]


def _values(n, gen, dtype):
    x = torch.cat([torch.tensor(SPECIAL), torch.rand(n, generator=gen), torch.rand(n // 4, generator=gen) * 1e-6,
                   torch.randn(n // 8, generator=gen)]).float()
    return x.to(dtype).float()  # the kernels widen fp16 / bf16 to fp32 exactly


# ---------------------------------------------------------------------------------- scalar arithmetic
@pytest.mark.parametrize("dtype", DTYPES)
def test_host_prefix_ratios_are_the_reference(dtype):
    """Chains of g = 6 drafts over every pair of special and random (P, Q), invalid drafts included."""
    gen = torch.Generator().manual_seed(11)
    g, rows = 6, 3000
    vals = _values(rows * g * 2, gen, dtype)
    pick = torch.randint(0, vals.numel(), (2, rows, g), generator=gen)
    p_tok, q_tok = vals[pick[0]], vals[pick[1]]
    p_tok[:50] = p_tok[:50].abs()  # many chains with long positive prefixes
    q_tok[:50] = p_tok[:50] * torch.rand(50, g, generator=gen)  # ratio >= 1: clamps to 1
    valid = torch.rand(rows, g, generator=gen) > 0.1
    # the reference gathers from [B, g(+1), V] rows: a V = 1 row per position holding the value
    target = torch.cat([p_tok, torch.zeros(rows, 1)], dim=1).unsqueeze(-1)
    draft = q_tok.unsqueeze(-1)
    tokens = torch.zeros(rows, g, dtype=torch.int64)
    want = ref.prefix_ratios(target, draft, tokens, valid)
    for r in range(rows):
        got = _C.host_block_prefix_ratios(p_tok[r].tolist(), q_tok[r].tolist(), valid[r].tolist())
        assert torch.equal(torch.tensor(got, dtype=torch.float32), want[r]), (r, p_tok[r], q_tok[r], valid[r])
    assert bool((want[:, 1:] == 1).any()) and bool(((want > 0) & (want < 1)).any()) and bool((want == 0).any())


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_residual_weights_are_the_reference(dtype):
    gen = torch.Generator().manual_seed(5)
    p = _values(20000, gen, dtype)
    q = p[torch.randperm(p.numel(), generator=gen)]
    scales = [1.0, 0.0, 0.5, 0.999999940395, 1e-30, 0.3333333432674408, 2.0**-20]
    scales += torch.rand(4, generator=gen).tolist()
    for scale in scales:
        s = torch.tensor(scale, dtype=torch.float32)
        want = ref.residual_weights(s, p, q)
        got = torch.tensor(_C.host_block_residual_weights(float(s), p.tolist(), q.tolist()), dtype=torch.int64)
        assert torch.equal(got, want), scale
    assert int(want.max()) == 2**40 and int(want.min()) == 0


def test_host_thresholds_and_tau_are_the_reference():
    """h_i = Z / (Z + 1 - p_i) (zero denominator -> 1), h_n = p_n, 0 past n; tau = max passing i."""
    gen = torch.Generator().manual_seed(3)
    g, rows = 5, 4000
    ratios = torch.rand(rows, g + 1, generator=gen).float()
    ratios[:, 0] = 1.0
    ratios[::3, 1:] = 1.0  # Z = 0 with p_i = 1: denominator 0 -> h = 1
    ratios[1::7, 2:] = 0.0
    totals = torch.randint(0, 2**52, (rows, g), generator=gen)
    totals[::3] = 0
    totals[2::11] = 151936 * 2**40  # the largest mass a row can have (rounds in float64)
    totals[5::13] = 2**53 + 1
    n = torch.randint(0, g + 1, (rows,), generator=gen)
    want_h = ref.acceptance_thresholds(ratios, totals.double() / WEIGHT_SCALE, n)
    eta = torch.rand(rows, g, generator=gen, dtype=torch.float64)
    eta[::5] = want_h[::5]  # exactly at the threshold: strict test, never passes
    eta[1::17] = 0.0
    eta[2::9] = -0.25  # a caller's coin below 0 passes only where p_i > 0 (the reference's rule)
    for r in range(rows):
        h = _C.host_block_thresholds(ratios[r].tolist(), totals[r].tolist(), int(n[r]))
        assert torch.equal(torch.tensor(h, dtype=torch.float64), want_h[r]), r
        passed = (eta[r] < want_h[r]) & (ratios[r, 1:] > 0)
        want_tau = int((passed.long() * torch.arange(1, g + 1)).max())
        assert _C.host_block_tau(h, eta[r].tolist(), ratios[r].tolist()) == want_tau, r


# ---------------------------------------------------------------------------------- the kernel's steps
def _case(gen, B, g, V, dtype, *, one_hot=False, ragged=True, bad_rows=True):
    target = torch.softmax(3 * torch.randn(B, g + 1, V, generator=gen), -1)
    draft = torch.softmax(3 * torch.randn(B, g, V, generator=gen), -1)
    draft = 0.5 * draft + 0.5 * target[:, :g]  # drafts close enough to the target to accept often
    tokens = torch.multinomial(draft.reshape(-1, V), 1, generator=gen).reshape(B, g) if g else \
        torch.zeros(B, 0, dtype=torch.int64)
    if one_hot:
        draft = torch.nn.functional.one_hot(tokens, V).float()
    if bad_rows and B >= 6:
        target[0, 0] = NAN  # a NaN row
        target[1, :] = 0.0  # no mass anywhere: the lowest index
        draft[2, :, 3:7] = INF
        target[3, -1, ::2] = -1.0
        if g:
            tokens[4, 0] = -1  # padding / out of range: never kept
            tokens[5, -1] = V + 3
    target, draft = target.to(dtype).float(), draft.to(dtype).float()
    counts = torch.randint(0, g + 1, (B,), generator=gen) if ragged else None
    uniforms = torch.rand(B, g + 1, generator=gen, dtype=torch.float64)
    if B >= 8:
        uniforms[6, -1] = 1.0  # out-of-contract uniforms stay inside the row
        uniforms[7, -1] = NAN
    return target, draft, tokens, counts, uniforms


def _host(target, draft, tokens, counts, uniforms, chunk):
    B, g1, V = target.shape
    out, acc = _C.host_block_verify(target.flatten().tolist(), draft.flatten().tolist(), tokens.flatten().tolist(),
                                    [] if counts is None else counts.tolist(), uniforms.flatten().tolist(), B, g1 - 1, V,
                                    chunk)
    return torch.tensor(out, dtype=torch.int64).reshape(B, g1), torch.tensor(acc, dtype=torch.int64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("g", [0, 1, 2, 4])
@pytest.mark.parametrize("one_hot", [False, True])
def test_host_kernel_steps_are_the_reference(dtype, g, one_hot):
    """Any chunking of V gives the reference's outputs bit for bit (caller uniforms)."""
    gen = torch.Generator().manual_seed(100 * g + one_hot)
    B, V = 12, 203
    target, draft, tokens, counts, uniforms = _case(gen, B, g, V, dtype, one_hot=one_hot)
    want = ref.block_verify(target, draft, tokens, uniforms=uniforms, num_draft_tokens=counts)
    for chunk in (8, 24, 64, V, 4096):
        got = _host(target, draft, tokens, counts, uniforms, chunk)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), chunk
    assert bool(((want[0] >= -1) & (want[0] < V)).all())


def test_host_kernel_steps_accept_more_than_one_prefix_and_rescue():
    """Long accepted prefixes, tau = n (bonus rows) and tau = 0 all occur; the reference agrees."""
    gen = torch.Generator().manual_seed(9)
    B, g, V = 64, 4, 37
    target, draft, tokens, counts, uniforms = _case(gen, B, g, V, torch.float32, ragged=False, bad_rows=False)
    draft = 0.9 * target[:, :g] + 0.1 * draft
    want = ref.block_verify(target, draft, tokens, uniforms=uniforms)
    got = _host(target, draft, tokens, None, uniforms, 16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert {0, g} <= set(want[1].tolist()) and len(set(want[1].tolist())) >= 3


# ---------------------------------------------------------------------------------- launch plans
MAX_CHUNK = 8192  # launch_plan.h kSamplingMaxChunk: the block kernel's last block rescans one chunk


def slots(rows, vocab):
    """Workspace slots per position: ~4 CTAs per SM of a 256-SM device (at most 64), or the
    8192-element chunks' count when a large V needs more."""
    return max(min(64, max(1, -(-1024 // rows))), -(-vocab // MAX_CHUNK))


@pytest.mark.parametrize("arch", (80, 90))
@pytest.mark.parametrize("B, G", [(1, 1), (1, 4), (3, 7), (64, 4), (256, 8), (4096, 2)])
def test_plan_chunks_and_workspace(arch, B, G):
    """Chunks of at most 8192 ids (the last block rescans one at any B), and the workspace
    grows with V only through their count."""
    sizes = [1, 7, 2048, 32000, 151936, 2**23 - 1]
    for kernel, nbytes in (("block_verify", _C.block_verify_workspace_bytes),
                           ("block_verify_logits", _C.block_verify_logits_workspace_bytes)):
        plans = [_C.launch_plan(kernel, dict(B=B, G=G, V=V), arch) for V in sizes]
        for V, p in zip(sizes, plans):
            assert p["refusal"] is None
            assert p["workspace_bytes"] == nbytes(B, G, V) and p["ws_stride"] == slots(B * (G + 1), V)
            assert [launch["block"] for launch in p["launches"]] == [256] * len(p["launches"])
            verify = p["launches"][-1]
            assert verify["kernel"] == ("block_verify_kernel" if kernel == "block_verify" else "block_verify_logits_kernel")
            assert verify["grid"] == (B, G + 1, p["splits"]) and verify["dynamic_smem"] == 0
            assert 1 <= p["splits"] <= p["ws_stride"]
            assert (p["splits"] - 1) * p["chunk"] < V <= p["splits"] * p["chunk"] and p["chunk"] <= MAX_CHUNK
            assert p["chunk"] % 8 == 0 and (p["splits"] == 1 or p["chunk"] >= 2048)
            if kernel == "block_verify_logits":
                stats = p["launches"][0]
                assert stats["kernel"] == "softmax_stats_kernel"
                assert stats["grid"] == (B, 2 * G + 1, p["stats_splits"]) and p["stats_splits"] <= p["stats_stride"]
                assert (p["stats_splits"] - 1) * p["stats_chunk"] < V <= p["stats_splits"] * p["stats_chunk"]
        small = [p["workspace_bytes"] for V, p in zip(sizes, plans) if V <= MAX_CHUNK * slots(B * (G + 1), 1)]
        assert len(set(small)) == 1  # below the chunk cap the workspace does not follow V


def test_plan_workspace_layout():
    """totals [B(G+1)][ws_stride] longlong2, ratios [B(G+1)] float, tickets [B] (16-byte aligned pieces)."""
    for B, G in [(1, 0), (1, 4), (5, 3), (256, 8), (10**5, 4)]:
        p = _C.launch_plan("block_verify", dict(B=B, G=G, V=151936), 90)
        rows = B * (G + 1)
        align = lambda n: -(-n // 16) * 16  # noqa: E731
        assert p["ws_stride"] == slots(rows, 151936)
        assert p["ratios_offset"] == rows * p["ws_stride"] * 16
        assert p["counters_offset"] == p["ratios_offset"] + align(4 * rows)
        assert p["workspace_bytes"] == p["counters_offset"] + align(4 * B)
        lg = _C.launch_plan("block_verify_logits", dict(B=B, G=G, V=151936), 90)
        stat_rows = B * (2 * G + 1)
        assert lg["partials_offset"] == p["workspace_bytes"]
        assert lg["merged_offset"] == lg["partials_offset"] + stat_rows * lg["stats_stride"] * 8
        assert lg["workspace_bytes"] == lg["merged_offset"] + align(8 * stat_rows) + align(4 * B)
    # B = 1, g = 4, Qwen's V: 5 KiB; B = 256, g = 8: 19 chunk totals (8192 ids each) per position
    assert _C.block_verify_workspace_bytes(1, 4, 151936) == 5168
    assert _C.block_verify_workspace_bytes(256, 8, 151936) == 256 * 9 * (19 * 16 + 4) + 1024
    assert _C.block_verify_workspace_bytes(0, 4, 151936) == 0


def test_plan_small_batches_split_the_vocabulary():
    """B = 1: enough CTAs to cover the GPU (~3 per SM, the kernel's residency), chunks of >= 2048
    ids; B = 1024: chunks of at most 8192 ids, so the last block rescans one small chunk."""
    p = _C.launch_plan("block_verify", dict(B=1, G=4, V=151936), 90)
    assert p["launches"][0]["grid"] == (1, 5, 64) and p["chunk"] == 2376
    big = _C.launch_plan("block_verify", dict(B=1024, G=4, V=151936), 90)
    assert big["splits"] == 19 and big["chunk"] == 8000


def test_plan_refusals():
    assert _C.launch_plan("block_verify", dict(B=1, G=4, V=2**23), 90)["refusal"].startswith("V >= 2^23")
    assert _C.launch_plan("block_verify", dict(B=1, G=65534, V=100), 90)["refusal"] is None
    assert "grid y" in _C.launch_plan("block_verify", dict(B=1, G=65535, V=100), 90)["refusal"]
    assert _C.launch_plan("block_verify_logits", dict(B=1, G=32767, V=100), 90)["refusal"] is None
    assert "grid y" in _C.launch_plan("block_verify_logits", dict(B=1, G=32768, V=100), 90)["refusal"]
    assert _C.launch_plan("block_verify", dict(B=0, G=4, V=100), 90)["launches"] == []
    with pytest.raises(ValueError):
        _C.launch_plan("block_verify", dict(B=-1, G=4, V=100), 90)
    with pytest.raises(ValueError):
        _C.block_verify_workspace_bytes(1, 4, 2**23)


# ---------------------------------------------------------------------------------- launcher
def _params(name):
    first = getattr(_C, name).__doc__.splitlines()[0]
    return [part.split(":")[0].strip() for part in first[len(name) + 1:first.rindex(") ->")].split(", ")]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seeded", [False, True])
def test_launcher_arguments_match_the_bindings(index_dtype, seeded):
    """The launchers pass every argument the bindings take, index tensors as they are (no
    int64 copy, strides kept), on CPU tensors (the arguments are only addresses and numbers)."""
    from specdec_kernels.cuda import block_verification as launcher

    B, g, V = 3, 4, 50
    target = torch.rand(B, g + 1, V)
    draft = torch.rand(B, g, V)
    tokens = torch.randint(0, V, (g, B), dtype=index_dtype).t()  # non-contiguous
    counts = torch.tensor([4, 0, 2], dtype=index_dtype)
    out_tokens = torch.empty(B, g + 1, dtype=torch.int64)
    num_accepted = torch.empty(B, dtype=torch.int64)
    workspace = torch.empty(64, dtype=torch.uint8)
    if seeded:
        uniforms, seed, offsets = None, torch.arange(B, dtype=index_dtype), torch.arange(0, 2 * B, 2, dtype=index_dtype)
    else:
        uniforms, seed, offsets = torch.rand(g + 1, B, dtype=torch.float64).t(), None, None
    args, keep = launcher.block_verify_args(target, draft, tokens, uniforms, seed, offsets, counts, out_tokens,
                                            num_accepted, workspace, 0)
    params = _params("block_verify")
    assert len(args) == len(params)
    named = dict(zip(params, args))
    assert named["draft_tokens"] == tokens.data_ptr() and named["draft_tokens_int64"] == (index_dtype == torch.int64)
    assert (named["draft_tokens_stride_b"], named["draft_tokens_stride_g"]) == tokens.stride()
    assert named["num_draft_tokens"] == counts.data_ptr()
    if seeded:
        assert named["seeds"] == seed.data_ptr() and named["offsets"] == offsets.data_ptr() and named["uniforms"] == 0
    else:
        assert named["uniforms"] == uniforms.data_ptr() and named["uniforms_float64"]
        assert (named["uniforms_stride_b"], named["uniforms_stride_g"]) == uniforms.stride()
    assert (named["B"], named["G"], named["V"], named["dtype"]) == (B, g, V, 0)

    temps = torch.rand(2 * B)[::2]
    args, keep = launcher.block_verify_logits_args(target, draft, tokens, temps, uniforms, seed, offsets, counts,
                                                   out_tokens, num_accepted, workspace, 0)
    params = _params("block_verify_logits")
    assert len(args) == len(params)
    named = dict(zip(params, args))
    assert named["temperatures"] == temps.data_ptr() and named["temperatures_stride"] == 2
    args, _ = launcher.block_verify_logits_args(target, draft, tokens, 0.7, uniforms, seed, offsets, None,
                                                out_tokens, num_accepted, workspace, 0)
    named = dict(zip(params, args))
    assert named["temperature"] == 0.7 and named["temperatures"] == 0 and named["num_draft_tokens"] == 0


def test_cuda_backends_are_registered_with_limits():
    import specdec_kernels.ops  # noqa: F401  (registers every backend)
    from specdec_kernels.common import registry

    for op in ("block_verify", "block_verify_logits"):
        assert "cuda" in registry.implemented_backends(op)
        assert (op, "cuda") in registry._LIMITS
    from specdec_kernels.cuda import block_verification as launcher

    assert "num_draft_tokens" in inspect.signature(launcher.block_verify).parameters
