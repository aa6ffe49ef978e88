"""GPU tests of the CUDA relaxed_verify, bild_verify and max_prob (csrc/logit_verify.cu).

Every check goes through the public ops with backend="cuda" and compares with
backend="torch" on the same GPU tensors. relaxed_verify must match bit for bit. bild_verify
computes logsumexp in another order than torch, so each threshold is first moved at least
MARGIN away from every finite draft NLL (`bild_thresholds`); away from that band the outputs
must be identical. max_prob: within 1e-6 absolute / 1e-5 relative (a few float32 ulps).
Everything skips cleanly without CUDA or without the built extension.
"""

import pytest

torch = pytest.importorskip("torch")

from gpu_support import CUDA_KERNEL_MARKS, _C  # noqa: E402

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.reference._sampling import nan_to_neg_inf  # noqa: E402
from specdec_kernels.selftest.compare import draft_nll_band  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

INF, NAN = float("inf"), float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = lambda d: str(d).replace("torch.", "")  # noqa: E731
VOCABS = (32000, 128256, 151936)
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


def split_chunk(rows: int, vocab: int) -> int:
    """The kernels' V-chunk for `rows` rows (chain_common.cuh: plan_splits)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    splits = max(1, min(-(-4 * sms // rows), vocab // 4096))
    return -(-(-(-vocab // splits)) // 8) * 8


def cached_workspaces_are_zero():
    from specdec_kernels.cuda import _launch

    torch.cuda.synchronize()
    return all(int(buf.count_nonzero()) == 0 for buf in _launch._zeroed_workspaces.values())


# ----------------------------------------------------------------------------- random shapes

@pytest.mark.parametrize("g", (1, 4, 8))
@pytest.mark.parametrize("batch", (1, 3, 64))
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_random_matches_torch(dtype, vocab, batch, g):
    gen = torch.Generator(device="cuda").manual_seed(vocab + 1000 * batch + g)
    logits = random_logits(batch, g, vocab, dtype, gen)
    drafts = near_top_drafts(logits, gen)
    ragged = torch.randint(0, g + 1, (batch,), generator=gen, device="cuda")
    check_relaxed(logits, drafts)
    check_relaxed(logits, drafts, ragged, beta_tau=((1, 2.0), (3, 0.7), (50, 3.0)))
    check_bild(logits, drafts)
    check_bild(logits, drafts, ragged, thresholds=bild_thresholds(logits, drafts, (2.0, 6.0)))
    check_max_prob(logits)
    assert cached_workspaces_are_zero()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_no_drafts_and_empty_rows(dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    logits = random_logits(3, 0, 32000, dtype, gen)
    drafts = torch.empty(3, 0, dtype=torch.int64, device="cuda")
    check_relaxed(logits, drafts, beta_tau=((2, 0.7),))
    check_bild(logits, drafts, thresholds=(1.0,))
    logits = random_logits(5, 4, 32000, dtype, gen)
    drafts = logits[:, :4].float().argmax(-1)  # every draft would pass
    counts = torch.tensor([0, 4, 0, 2, 1], device="cuda")
    out, acc = check_relaxed(logits, drafts, counts, beta_tau=((2, 0.7),))
    assert acc.tolist() == [0, 4, 0, 2, 1] and out[0, 1:].tolist() == [-1] * 4
    check_bild(logits, drafts, counts, thresholds=(INF, 0.0, *bild_thresholds(logits, drafts, (3.0,))))
    empty = torch.empty(0, 4, 32000, dtype=dtype, device="cuda")
    assert ops.max_prob(empty, backend="cuda").shape == (0, 4)
    out, acc = ops.relaxed_verify(empty, torch.empty(0, 3, dtype=torch.int64, device="cuda"), top_beta=2, tau=1.0,
                                  backend="cuda")
    assert out.shape == (0, 4) and acc.shape == (0,)


# ----------------------------------------------------------------------------- ties, specials, boundaries

@pytest.mark.parametrize("vocab", (32000, 128256))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ties_across_chunks(dtype, vocab):
    """Equal max logits on both sides of a chunk boundary, in the last chunk and at V-1."""
    batch, g = 2, 4
    chunk = split_chunk(batch * (g + 1), vocab)
    last = (-(-vocab // chunk) - 1) * chunk  # first id of the last chunk
    for tie in ((chunk - 1, chunk), (chunk, vocab - 1), (last - 1, last, vocab - 1), (3, 2 * chunk - 1, last),
                (last, vocab - 1), (vocab - 2, vocab - 1)):
        tie = sorted({t for t in tie if 0 <= t < vocab})
        if len(tie) < 2:
            continue
        gen = torch.Generator(device="cuda").manual_seed(tie[-1] + len(tie))
        logits = torch.randn(batch, g + 1, vocab, generator=gen, device="cuda").clamp(-3, 3).to(dtype)
        logits[:, :, tie] = 5.0
        logits[1, 1, tie] = INF  # +inf ties too
        first, second = tie[0], tie[1]
        # row 0: the lowest tied id everywhere; row 1: the next tied id (rank 1, zero logit gap)
        drafts = torch.tensor([[first] * g, [first, second, second, tie[-1]]], device="cuda")
        check_relaxed(logits, drafts)
        check_relaxed(logits, drafts, beta_tau=((len(tie), 0.5), (len(tie) - 1, 0.5)))
        check_bild(logits, drafts)
        out, acc = ops.relaxed_verify(logits, drafts, top_beta=2, tau=0.5, backend="cuda")
        assert acc.tolist() == [g, 1]  # +inf tie at position 1: inf - inf is NaN, NaN < tau fails
        out, acc = ops.relaxed_verify(logits, drafts, top_beta=1, tau=5.0, backend="cuda")
        assert acc.tolist() == [g, 1] and out[1, 1].item() == first
        assert out[0, g].item() == first  # bonus argmax: the lowest tied id
        check_max_prob(logits)


def special_rows(vocab):
    """[V] float32 rows hitting NaN/inf/tie corner cases."""
    base = -5.0 - torch.arange(vocab, dtype=torch.float32) / vocab  # strictly decreasing, < 0
    idx = torch.arange(vocab)
    rows = []
    r = base.clone(); r[vocab - 1] = 10.0; rows.append(r)  # max only at the last id
    r = base.clone(); r[vocab // 2:] = 10.0; rows.append(r)  # tie spanning every later chunk
    r = base.clone(); r[(idx >= vocab // 3) & ((idx % 8 == 0) | (idx % 8 == 7))] = 10.0; rows.append(r)
    rows.append(torch.full((vocab,), 1.5))  # constant row
    rows.append(torch.full((vocab,), NAN))  # all NaN
    rows.append(torch.full((vocab,), -INF))  # all -inf
    r = torch.full((vocab,), -INF); r[::2] = NAN; rows.append(r)  # NaN/-inf mix
    r = base.clone(); r[0] = NAN; r[vocab - 1] = NAN; r[vocab // 2] = 100.0; rows.append(r)  # NaN never wins
    r = base.clone(); r[vocab // 3] = INF; r[vocab - 1] = INF; r[0] = NAN; rows.append(r)  # two +inf
    r = base.clone(); r[::3] = -INF; rows.append(r)  # -inf holes in a finite row
    r = torch.full((vocab,), -1.0); r[1] = -0.0; r[2] = 0.0; rows.append(r)  # -0 == +0
    r = torch.full((vocab,), -INF); r[vocab - 1] = 1.0; rows.append(r)  # one finite logit: NLL 0
    r = base.clone(); r[vocab - 1] = 60000.0; r[vocab // 2] = 60000.0; rows.append(r)  # large, fp16-representable
    return rows


@pytest.mark.parametrize("vocab", (32000, 151936))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_inf_rows(dtype, vocab):
    g = 4
    rows = special_rows(vocab)
    gen = torch.Generator().manual_seed(vocab)
    batch = len(rows)
    logits = torch.empty(batch, g + 1, vocab)
    for b in range(batch):
        logits[b, 0] = rows[b]
        for p in range(1, g + 1):
            logits[b, p] = rows[int(torch.randint(0, batch, (1,), generator=gen))]
    logits = logits.to(dtype).cuda()
    drafts = near_top_drafts(logits, torch.Generator(device="cuda").manual_seed(vocab), wild=0.2)
    drafts[:, 0] = torch.tensor([vocab - 1, 0, 5, 0, 0, 0, 1, vocab // 2, vocab // 3, 3, 1, vocab - 1, vocab // 2],
                                device="cuda")[:batch]
    counts = torch.randint(0, g + 1, (batch,), generator=gen).cuda()
    for cnt in (None, counts):
        check_relaxed(logits, drafts, cnt)
        check_bild(logits, drafts, cnt, thresholds=(0.0, INF, *bild_thresholds(logits, drafts, (1.0, 6.0))))
    probs = check_max_prob(logits)
    assert probs[4, 0].item() == 0.0 and probs[5, 0].item() == 0.0 and probs[8, 0].item() == 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_top_beta_and_tau_boundaries(dtype):
    """Drafts exactly at rank top_beta - 1 / top_beta, and logit gaps exactly at tau."""
    vocab, g = 32000, 3
    logits = torch.full((4, g + 1, vocab), -4.0)
    logits[:, :, 100] = 1.0  # top
    logits[:, :, [50, 200]] = 0.5  # rank 1 (id 50) and rank 2 (id 200): gap 0.5, tie broken by id
    logits[:, :, 7] = 0.25  # rank 3: gap 0.75
    logits = logits.to(dtype).cuda()
    drafts = torch.tensor([[100, 50, 200], [50, 200, 7], [200, 50, 100], [7, 100, 100]], device="cuda")
    for beta in (1, 2, 3, 4, 5):
        for tau in (0.0, 0.25, 0.5, 0.5000001, 0.75, 0.7500001, 1.0):
            check_relaxed(logits, drafts, beta_tau=((beta, tau),))
    out, acc = ops.relaxed_verify(logits, drafts, top_beta=3, tau=0.5, backend="cuda")
    assert acc.tolist() == [1, 0, 0, 0]  # gap 0.5 is not < 0.5
    out, acc = ops.relaxed_verify(logits, drafts, top_beta=3, tau=0.5000001, backend="cuda")
    assert acc.tolist() == [3, 2, 3, 0]  # rank 2 passes top_beta=3, rank 3 does not
    out, acc = ops.relaxed_verify(logits, drafts, top_beta=4, tau=0.7500001, backend="cuda")
    assert acc.tolist() == [3, 3, 3, 3]


def test_tau_is_compared_in_float32():
    """gap == float32(0.7) < 0.7 in float64: torch compares in float32 (reject), and so must we."""
    vocab = 32000
    logits = torch.full((1, 2, vocab), -4.0, device="cuda")
    logits[0, :, 10] = 1.0
    logits[0, :, 20] = 0.3  # 1.0f - 0.3f == float32(0.7) exactly
    drafts = torch.tensor([[20]], device="cuda")
    gap = (logits[0, 0, 10] - logits[0, 0, 20]).item()
    assert gap == torch.tensor(0.7, dtype=torch.float32).item() and gap < 0.7
    want = ops.relaxed_verify(logits, drafts, top_beta=5, tau=0.7, backend="torch")
    assert want[1].item() == 0
    assert_same(ops.relaxed_verify(logits, drafts, top_beta=5, tau=0.7, backend="cuda"), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_of_range_drafts_reject(dtype):
    vocab, g = 32000, 4
    logits = torch.zeros(6, g + 1, vocab, dtype=dtype, device="cuda")  # constant: argmax 0, every gap 0
    drafts = torch.zeros(6, g, dtype=torch.int64)
    for b, bad in enumerate((-1, vocab, vocab + 1, -vocab, 2**40, -(2**62))):
        drafts[b, b % g] = bad
    drafts = drafts.cuda()
    for beta, tau in ((vocab, 1.0), (1, 0.0)):
        out, acc = check_relaxed(logits, drafts, beta_tau=((beta, tau),))
        assert acc.tolist() == [b % g for b in range(6)]
    check_bild(logits, drafts, thresholds=(INF, 20.0))
    out, acc = ops.bild_verify(logits, drafts, rollback_threshold=INF, backend="cuda")
    assert acc.tolist() == [b % g for b in range(6)]


# ----------------------------------------------------------------------------- layouts

@pytest.mark.parametrize("vocab", (32000, 32001, 151936))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_non_contiguous_inputs(dtype, vocab):
    batch, g = 3, 4
    gen = torch.Generator(device="cuda").manual_seed(vocab + 7)
    big = random_logits(batch, g + 2, vocab + 1, dtype, gen)  # [B, g+3, V+1]
    view = big[:, 1:g + 2, :vocab]  # stride_b (g+3)(V+1), stride_g V+1: rows not 16-byte aligned
    shifted = big[:, 2:g + 3, 1:]  # offset by one element: the scalar path
    swapped = random_logits(g + 1, batch - 1, vocab, dtype, gen).transpose(0, 1)  # position-major storage
    assert swapped.shape == (batch, g + 1, vocab)
    for logits in (view, shifted, swapped):
        assert not logits.is_contiguous()
        drafts = near_top_drafts(logits, gen).t().contiguous().t()  # column-major drafts
        counts = torch.tensor([4, 0, 1, 2, 3, 0], device="cuda")[::2]  # strided counts [4, 1, 3]
        check_relaxed(logits, drafts, beta_tau=((3, 0.0), (2, 0.7), (50, 3.0)))
        check_relaxed(logits, drafts, counts, beta_tau=((50, 3.0),))
        check_bild(logits, drafts, thresholds=bild_thresholds(logits, drafts, (1.0, 5.0)))
        check_bild(logits, drafts, counts, thresholds=bild_thresholds(logits, drafts, (5.0,)))
        check_max_prob(logits)
    check_max_prob(big[:, 2])  # [B, V+1] with row stride (g+3)(V+1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_max_prob_shapes(dtype):
    gen = torch.Generator(device="cuda").manual_seed(4)
    randn = lambda *shape: (torch.randn(*shape, generator=gen, device="cuda") * 3).to(dtype)  # noqa: E731
    check_max_prob(randn(151936))  # [V]
    check_max_prob(randn(3, 128256))  # [B, V]: many splits per row
    check_max_prob(randn(2, 3, 32000))  # [B, P, V]
    check_max_prob(randn(2, 3, 4, 4000)[:, :, 1:])  # leading dims that do not collapse (copied)
    check_max_prob(randn(2048, 32000))  # R >= 4 * SMs: one block per row
    check_max_prob(randn(5, 7))  # tiny V
    check_max_prob(randn(4, 1))  # V = 1: probability 1
    special = randn(6, 40000)
    special[0] = NAN
    special[1] = -INF
    special[2, 3] = INF
    special[3, :] = -INF
    special[3, 39999] = 2.0
    special[4, ::2] = NAN
    special[5, 100] = 40.0  # one dominant logit
    probs = check_max_prob(special)
    assert probs[:4].tolist() == [0.0, 0.0, 1.0, 1.0]
    huge = torch.tensor([[1e30, 1e30, 0.0]], device="cuda")  # lse rounds to the max: the reference says 1
    check_max_prob(huge)
    for threshold in (0.0, 0.3, 0.9, 1.0):
        check_fallback(special, threshold)
    wide = randn(64, 151936)
    for threshold in (0.01, 0.05, 0.5):
        check_fallback(wide, threshold)


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
