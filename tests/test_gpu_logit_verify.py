"""GPU tests of relaxed_verify, bild_verify and max_prob (csrc/logit_verify.cu, and Triton).

The kernel cases are the catalog's (selftest/cases_logit_verify.py: a sample per op; `--gpu-tier full`: all of "full":
random shapes up to V = 151936 / B = 256 in every dtype, beta / tau sweeps and boundaries, tau
in float32, BiLD thresholds 0 / inf / clear of the logsumexp band, NaN / inf / tie rows at
every position, ties across CUDA chunks, out-of-range ids, strided and unaligned logits, g = 0,
empty batches, max_prob's shapes (R >= 4 x SMs, V = 1, leading dims that do not collapse) and
fallback_check, CUDA-graph replays), through the public ops on backend "cuda" and "triton",
judged as `specdec-kernels selftest` judges them (relaxed bit for bit, bild bit for bit away
from the logsumexp rounding band, max_prob within 1e-6 absolute / 1e-5 relative). Here
besides: the per-stream workspace left zeroed across interleaved calls, one CUDA graph holding
every op, max_prob's determinism, and the raw _C argument checks.
Everything skips cleanly without CUDA or without the built extension.
"""

import pytest

torch = pytest.importorskip("torch")

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402
from gpu_support import CUDA_KERNEL_MARKS, _C  # noqa: E402

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.common.sampling import nan_to_neg_inf  # noqa: E402
from specdec_kernels.selftest.compare import draft_nll_band  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731
BETA_TAU = ((1, 0.0), (1, 5.0), (3, 0.0), (2, 0.7), (5, 1.5), (50, 3.0))
MARGIN = 1e-3  # bild thresholds stay this far (nats) from every draft NLL


# ----------------------------------------------------------------------------- helpers

def assert_same(got, want, what=""):
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape and g_.device == w_.device, (what, name)
        assert torch.equal(g_, w_), f"{what} {name}: cuda {g_.tolist()} != torch {w_.tolist()}"


def check_relaxed(logits, drafts, counts=None, beta_tau=BETA_TAU):
    for beta, tau in beta_tau:
        kw = dict(top_beta=beta, tau=tau, num_draft_tokens=counts)
        got = ops.relaxed_verify(logits, drafts, backend="cuda", **kw)
        assert_same(got, ops.relaxed_verify(logits, drafts, backend="torch", **kw), f"relaxed beta={beta} tau={tau}")
        if beta == 1 or tau == 0:  # lossless corner: exactly greedy decoding
            assert_same(got, ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="torch"), "greedy")
            assert_same(got, ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="cuda"), "greedy cuda")
    return got


def draft_nll(logits, drafts):
    """Finite draft NLLs as the reference computes them and the band (MARGIN + a few ulps of lse)
    where another logsumexp rounding may land: the selftest's own rule."""
    return draft_nll_band(logits, drafts, MARGIN)


def bild_thresholds(logits, drafts, candidates=(0.3, 1.5, 4.0, 9.0, 12.0)):
    nll, band = draft_nll(logits, drafts)
    out = []
    for t in candidates:
        while nll.numel() and bool(((nll - t).abs() < band).any()):
            t += 2.5 * MARGIN
        out.append(t)
    return out


def check_bild(logits, drafts, counts=None, thresholds=None):
    for t in bild_thresholds(logits, drafts) if thresholds is None else thresholds:
        kw = dict(rollback_threshold=t, num_draft_tokens=counts)
        assert_same(ops.bild_verify(logits, drafts, backend="cuda", **kw),
                    ops.bild_verify(logits, drafts, backend="torch", **kw), f"bild threshold={t}")


def check_max_prob(x):
    got = ops.max_prob(x, backend="cuda")
    want = ops.max_prob(x, backend="torch")
    assert got.dtype == torch.float32 and got.shape == want.shape == x.shape[:-1] and got.device == x.device
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ops.max_prob(x, backend="cuda"), got), "max_prob is not deterministic"
    return got


def check_fallback(x, threshold):
    """fallback_check through the CUDA max_prob: equal wherever the probability is not within
    the max_prob rounding band of the threshold, or where both backends' probabilities are equal
    (a row at exactly 1.0 with threshold 1.0 is compared too)."""
    got = ops.fallback_check(x, threshold, backend="cuda")
    want = ops.fallback_check(x, threshold, backend="torch")
    assert got.dtype == torch.bool and got.shape == want.shape
    ref = ops.max_prob(x, backend="torch")
    clear = ((ref - threshold).abs() > 1e-5) | (ops.max_prob(x, backend="cuda") == ref)
    assert torch.equal(got[clear], want[clear])
    assert bool(clear.float().mean() > 0.5)  # the band is rare: most rows are really compared


def near_top_drafts(logits, gen, wild=0.1):
    """Per slot: the argmax (half the slots), a token of rank 1..4 (ties by lower id), or a
    random id / invalid id (-1, V) in a `wild` fraction."""
    batch, n_pos, vocab = logits.shape
    g = n_pos - 1
    dev = logits.device
    order = torch.sort(nan_to_neg_inf(logits[:, :g]), dim=-1, descending=True, stable=True).indices
    rank = torch.randint(0, min(vocab, 5), (batch, g), generator=gen, device=dev)
    rank = torch.where(torch.rand(batch, g, generator=gen, device=dev) < 0.5, torch.zeros_like(rank), rank)
    drafts = order.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    noise = torch.randint(-1, vocab + 1, (batch, g), generator=gen, device=dev)
    return torch.where(torch.rand(batch, g, generator=gen, device=dev) < wild, noise, drafts)


def random_logits(batch, g, vocab, dtype, gen, scale=3.0):
    """randn * scale with the row max duplicated at a random second id in about half the rows."""
    x = torch.randn(batch, g + 1, vocab, generator=gen, device="cuda") * scale
    flat = x.view(-1, vocab)
    rows = torch.rand(flat.shape[0], generator=gen, device="cuda") < 0.5
    ids = torch.randint(0, vocab, (flat.shape[0],), generator=gen, device="cuda")
    top = flat.max(dim=-1).values
    flat[rows, ids[rows]] = top[rows]
    return x.to(dtype)




def cached_workspaces_are_zero():
    from specdec_kernels.common import workspace

    torch.cuda.synchronize()
    return all(int(buf.count_nonzero()) == 0 for buf in workspace._zeroed_workspaces.values())


# ----------------------------------------------------------------------------- the catalog

CATALOG_OPS = ("relaxed_verify", "bild_verify", "max_prob")


@pytest.mark.parametrize("case,backend", gpu_catalog("cuda", CATALOG_OPS))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, "cuda")
    check_case(case, backend, "cuda", profile=gpu_profile(), graphs=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_max_prob_is_deterministic(dtype):
    gen = torch.Generator(device="cuda").manual_seed(4)
    for shape in ((151936,), (3, 128256), (2048, 32000)):
        check_max_prob((torch.randn(*shape, generator=gen, device="cuda") * 3).to(dtype))


# ----------------------------------------------------------------------------- workspace and graphs

def test_repeated_calls_leave_the_workspace_zeroed():
    """Interleaved relaxed/bild/greedy/max_prob calls share one zeroed buffer per stream."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    for step in range(4):
        batch, g, vocab = (1, 8, 151936) if step % 2 else (7, 3, 32000)
        logits = random_logits(batch, g, vocab, torch.bfloat16, gen)
        drafts = near_top_drafts(logits, gen)
        counts = torch.randint(0, g + 1, (batch,), generator=gen, device="cuda")
        check_relaxed(logits, drafts, counts, beta_tau=((3, 1.0),))
        check_bild(logits, drafts, counts, thresholds=bild_thresholds(logits, drafts, (2.0,)))
        check_max_prob(logits[:, 0])
        assert_same(ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="cuda"),
                    ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend="torch"))
        assert cached_workspaces_are_zero(), step


def test_cuda_graph_capture_and_replay():
    batch, g, vocab = 3, 4, 128256
    gen = torch.Generator(device="cuda").manual_seed(6)
    logits = random_logits(batch, g, vocab, torch.float16, gen)
    drafts = near_top_drafts(logits, gen)
    counts = torch.tensor([4, 2, 0], device="cuda")

    def step():
        return (ops.relaxed_verify(logits, drafts, top_beta=3, tau=1.0, num_draft_tokens=counts, backend="cuda"),
                ops.bild_verify(logits, drafts, rollback_threshold=2.0, num_draft_tokens=counts, backend="cuda"),
                ops.max_prob(logits, backend="cuda"),
                ops.fallback_check(logits[:, 0], 0.2, backend="cuda"))

    side = torch.cuda.Stream()  # warm up off the default stream, as torch recommends
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        relaxed, bild, probs, flags = step()

    for _ in range(3):
        logits.copy_(random_logits(batch, g, vocab, torch.float16, gen))
        drafts.copy_(near_top_drafts(logits, gen))
        counts.copy_(torch.randint(0, g + 1, (batch,), generator=gen, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert_same(relaxed, eager[0], "graph relaxed")
        assert_same(relaxed, ops.relaxed_verify(logits, drafts, top_beta=3, tau=1.0, num_draft_tokens=counts,
                                                backend="torch"), "graph relaxed vs torch")
        assert_same(bild, eager[1], "graph bild")  # same kernel, same order: bit-identical
        assert torch.equal(probs, eager[2]) and torch.equal(flags, eager[3])
        check_fallback(logits[:, 0], 0.2)
        torch.testing.assert_close(probs, ops.max_prob(logits, backend="torch"), rtol=1e-5, atol=1e-6)
    assert cached_workspaces_are_zero()


# ----------------------------------------------------------------------------- raw _C arguments

def test_bad_arguments_raise():
    x = torch.zeros(1, 2, 10, device="cuda")
    d = torch.zeros(1, 1, dtype=torch.int64, device="cuda")
    ws = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def relaxed(**kw):
        args = dict(logits=x.data_ptr(), logits_stride_b=20, logits_stride_g=10, draft_tokens=d.data_ptr(),
                    num_draft_tokens=0, out_tokens=d.data_ptr(), num_accepted=d.data_ptr(), workspace=ws.data_ptr(),
                    workspace_bytes=ws.numel(), B=1, G=1, V=10, dtype=0, top_beta=1, tau=0.0, stream=stream)
        args.update(kw)
        _C.relaxed_verify(**args)

    for bad, message in ((dict(dtype=9), "dtype"), (dict(V=0), "V must be"), (dict(top_beta=0), "top_beta"),
                         (dict(tau=-1.0), "tau"), (dict(tau=NAN), "tau"), (dict(workspace_bytes=8), "workspace"),
                         (dict(G=65535), "65535"), (dict(logits=0), "null")):
        with pytest.raises(ValueError, match=message):
            relaxed(**bad)
    with pytest.raises(ValueError, match="rollback_threshold"):
        _C.bild_verify(x.data_ptr(), 20, 10, d.data_ptr(), 0, d.data_ptr(), d.data_ptr(), ws.data_ptr(), ws.numel(),
                       1, 1, 10, 0, -0.5, stream)
    with pytest.raises(ValueError, match="dtype"):
        _C.max_prob(x.data_ptr(), 10, x.data_ptr(), ws.data_ptr(), ws.numel(), 2, 10, 5, stream)
    with pytest.raises(ValueError, match="V must be"):
        _C.max_prob_workspace_bytes(2, 0)
