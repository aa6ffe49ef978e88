"""GPU tests of specdec_kernels._C.greedy_verify against a plain-torch reference.

The extension is called directly (raw pointers + stream) so these tests pin the
C++ contract independently of the Python wrappers. Everything skips cleanly
without CUDA or without a built extension.
"""

import pytest

torch = pytest.importorskip("torch")

from gpu_support import CUDA_KERNEL_MARKS, _C  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DTYPES = list(DTYPE_CODES)
INF = float("inf")
NAN = float("nan")


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------
def run_greedy_verify(logits, draft, num_drafts=None, out=None, num_accepted=None, workspace=None):
    """Call the raw kernel; allocates whatever output/workspace is not given."""
    B, G1, V = logits.shape
    G = G1 - 1
    dev = logits.device
    assert logits.stride(2) == 1 and draft.is_contiguous() and draft.dtype == torch.int64
    if out is None:
        out = torch.full((B, G + 1), -7, dtype=torch.int64, device=dev)  # garbage: all must be written
    if num_accepted is None:
        num_accepted = torch.full((B,), -7, dtype=torch.int64, device=dev)
    if workspace is None:
        workspace = torch.zeros(_C.greedy_verify_workspace_bytes(B, G), dtype=torch.uint8, device=dev)
    _C.greedy_verify(
        logits.data_ptr(),
        logits.stride(0),
        logits.stride(1),
        draft.data_ptr(),
        0 if num_drafts is None else num_drafts.data_ptr(),
        out.data_ptr(),
        num_accepted.data_ptr(),
        workspace.data_ptr(),
        B,
        G,
        V,
        DTYPE_CODES[logits.dtype],
        torch.cuda.current_stream().cuda_stream,
    )
    return out, num_accepted, workspace


def reference_argmax(logits):
    """argmax over the last dim in fp32, NaN as -inf, ties -> lowest index."""
    x = logits.detach().float().cpu()
    x = torch.where(torch.isnan(x), torch.full_like(x, -INF), x)
    return torch.argmax(x, dim=-1)


def reference_greedy_verify(logits, draft, num_drafts=None):
    B, G1, _ = logits.shape
    G = G1 - 1
    am = reference_argmax(logits)
    draft = draft.cpu()
    out = torch.full((B, G + 1), -1, dtype=torch.int64)
    acc = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        n = G if num_drafts is None else min(max(int(num_drafts[b]), 0), G)
        a = 0
        while a < n and int(draft[b, a]) == int(am[b, a]):
            a += 1
        out[b, :a] = draft[b, :a]
        out[b, a] = am[b, a]
        acc[b] = a
    return out, acc


def check(logits, draft, num_drafts=None):
    out, acc, ws = run_greedy_verify(logits, draft, num_drafts)
    torch.cuda.synchronize()
    ref_out, ref_acc = reference_greedy_verify(logits, draft, num_drafts)
    V = logits.shape[-1]
    out, acc = out.cpu(), acc.cpu()
    assert torch.equal(acc, ref_acc)
    assert torch.equal(out, ref_out)
    emitted = out[torch.arange(out.shape[1]).unsqueeze(0) <= acc.unsqueeze(1)]
    assert bool(((emitted >= 0) & (emitted < V)).all()), "token id outside [0, V)"
    return out, acc, ws


def make_drafts(am, V, gen, invalid_frac=0.15):
    """Accept a random-length prefix (copy the argmax), then random/invalid ids."""
    B, G1 = am.shape
    G = G1 - 1
    draft = torch.randint(0, V, (B, G), generator=gen)
    keep = torch.randint(0, G + 1, (B,), generator=gen)
    pos = torch.arange(G).unsqueeze(0)
    draft = torch.where(pos < keep.unsqueeze(1), am[:, :G], draft)
    invalid = (torch.rand(B, G, generator=gen) < invalid_frac) & (pos >= keep.unsqueeze(1))
    bad_ids = torch.tensor([-1, V, V + 17, -V, 2**40])
    bad = bad_ids[torch.randint(0, len(bad_ids), (B, G), generator=gen)]
    return torch.where(invalid, bad, draft)


def random_logits(B, G, V, dtype, gen, device="cuda"):
    x = torch.randn(B, G + 1, V, generator=gen) * 3
    # Duplicate the row max at a second random index in ~half the rows so ties
    # (lowest index must win) show up for every dtype, not just by luck.
    flat = x.view(-1, V)
    rows = torch.nonzero(torch.rand(flat.shape[0], generator=gen) < 0.5).flatten()
    for r in rows.tolist():
        flat[r, int(torch.randint(0, V, (1,), generator=gen))] = flat[r].max()
    return x.to(dtype).to(device)


# ----------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("G", [1, 5])
@pytest.mark.parametrize("B", [1, 3, 64])
@pytest.mark.parametrize("V", [7, 1000, 32000, 128256, 151936])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_random_matches_reference(dtype, V, B, G):
    gen = torch.Generator().manual_seed(V * 131 + B * 7 + G)
    logits = random_logits(B, G, V, dtype, gen)
    am = reference_argmax(logits)
    draft = make_drafts(am, V, gen).cuda()
    check(logits, draft)  # every row has G drafts
    ragged = torch.randint(-2, G + 3, (B,), generator=gen).cuda()  # clamping included
    check(logits, draft, ragged)


def special_rows(V):
    """Rows hitting NaN/inf/tie corner cases; each is a [V] fp32 tensor."""
    base = -5.0 - torch.arange(V, dtype=torch.float32) / V  # strictly decreasing, < 0
    rows = []

    r = base.clone(); r[V - 1] = 10.0; rows.append(r)                      # max only at the last index
    r = base.clone(); r[max(V - 2, 0)] = 10.0; r[V - 1] = 10.0; rows.append(r)  # tie ending at the last index
    r = base.clone(); r[V // 2:] = 10.0; rows.append(r)                    # tie spanning every later chunk
    r = base.clone(); idx = torch.arange(V)
    r[(idx >= V // 3) & ((idx % 8 == 0) | (idx % 8 == 7))] = 10.0; rows.append(r)  # both sides of any chunk boundary
    r = base.clone(); r[(idx % 4096 == 4095) | ((idx % 4096 == 0) & (idx > 0))] = 10.0; rows.append(r)  # 4095 | 4096 | ...
    rows.append(torch.full((V,), 1.5))                                     # constant row -> 0
    rows.append(torch.full((V,), NAN))                                     # all NaN -> 0
    rows.append(torch.full((V,), -INF))                                    # all -inf -> 0
    r = torch.full((V,), -INF); r[::2] = NAN; rows.append(r)               # NaN/-inf mix -> 0
    r = base.clone(); r[0] = NAN; r[V - 1] = NAN; r[V // 2] = 100.0; rows.append(r)  # NaN never wins
    r = base.clone(); r[V // 3] = INF; r[V - 1] = INF; r[0] = NAN; rows.append(r)    # first +inf
    r = torch.full((V,), NAN); r[V - 1] = -INF; rows.append(r)             # NaN ties -inf -> 0
    r = torch.full((V,), -1.0); r[min(1, V - 1)] = -0.0; r[min(2, V - 1)] = 0.0; rows.append(r)  # -0 == +0
    r = torch.full((V,), -1.0); r[min(1, V - 1)] = 0.0; r[min(2, V - 1)] = -0.0; rows.append(r)
    r = base.clone(); r[V - 1] = 60000.0; r[V // 2] = 60000.0; rows.append(r)  # large, fp16-representable
    return rows


@pytest.mark.parametrize("V", [7, 1000, 32000, 151936])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_special_rows(dtype, V):
    G = 3
    rows = special_rows(V)
    gen = torch.Generator().manual_seed(V)
    # Each batch row b uses pattern b at every position, plus shuffled
    # patterns, so every position of every row is a corner case.
    B = len(rows)
    logits = torch.empty(B, G + 1, V)
    for b in range(B):
        logits[b, 0] = rows[b]
        for g in range(1, G + 1):
            logits[b, g] = rows[int(torch.randint(0, B, (1,), generator=gen))]
    logits = logits.to(dtype).cuda()
    am = reference_argmax(logits)
    # Accept-all drafts expose the argmax of every position in out_tokens.
    out, acc, _ = check(logits, am[:, :G].contiguous().cuda())
    assert bool((acc == G).all())
    check(logits, make_drafts(am, V, gen).cuda())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_out_of_range_drafts_never_match(dtype):
    V, G, B = 1000, 5, 6
    logits = torch.full((B, G + 1, V), NAN, dtype=dtype, device="cuda")  # argmax 0 everywhere
    bad = torch.tensor([-1, V, V + 1, -V, 2**40, -(2**62)], dtype=torch.int64)
    draft = torch.zeros(B, G, dtype=torch.int64)
    for b in range(B):
        draft[b, b % G] = bad[b]  # valid "0" drafts are accepted up to the bad one
    out, acc, _ = check(logits, draft.cuda())
    assert acc.tolist() == [b % G for b in range(B)]


@pytest.mark.parametrize("V", [1000, 1001, 32000, 151936])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_non_contiguous_logits(dtype, V):
    B, G = 3, 5
    gen = torch.Generator().manual_seed(V + 1)
    big = random_logits(B, G + 2, V + 1, dtype, gen)  # [B, G+3, V+1]
    # Slice of positions: stride_b = (G+3)*(V+1), stride_g = V+1.
    view = big[:, 1 : G + 2, :V]
    assert not view.is_contiguous()
    am = reference_argmax(view)
    check(view, make_drafts(am, V, gen).cuda())
    # Offset by one element: row pointers are no longer 16-byte aligned, which
    # forces the scalar path (and mixes aligned/unaligned rows).
    shifted = big[:, 2 : G + 3, 1:]
    am = reference_argmax(shifted)
    check(shifted, make_drafts(am, V, gen).cuda(), torch.tensor([0, G, 2]).cuda())


def test_zero_and_clamped_num_drafts():
    B, G, V = 5, 4, 32000
    gen = torch.Generator().manual_seed(3)
    logits = random_logits(B, G, V, torch.float32, gen)
    am = reference_argmax(logits)
    draft = am[:, :G].contiguous().cuda()  # all would be accepted
    nd = torch.tensor([0, -3, 2, G, G + 9]).cuda()
    out, acc, _ = check(logits, draft, nd)
    assert acc.tolist() == [0, 0, 2, G, G]
    assert out[0, 1:].tolist() == [-1] * G


def test_no_drafts_G0():
    B, V = 4, 1000
    gen = torch.Generator().manual_seed(4)
    logits = random_logits(B, 0, V, torch.float16, gen)
    draft = torch.empty(B, 0, dtype=torch.int64, device="cuda")
    out, acc, _ = check(logits, draft)
    assert acc.tolist() == [0] * B


def test_workspace_reused_and_left_zeroed():
    """The kernel re-zeroes its workspace, so one buffer serves many calls."""
    B, G, V = 7, 5, 32000
    gen = torch.Generator().manual_seed(5)
    ws = None
    for step in range(3):
        logits = random_logits(B, G, V, torch.bfloat16, gen)
        am = reference_argmax(logits)
        draft = make_drafts(am, V, gen).cuda()
        out, acc, ws = run_greedy_verify(logits, draft, workspace=ws)
        torch.cuda.synchronize()
        ref_out, ref_acc = reference_greedy_verify(logits, draft)
        assert torch.equal(out.cpu(), ref_out) and torch.equal(acc.cpu(), ref_acc), step
        assert int(ws.count_nonzero()) == 0


def test_cuda_graph_capture_and_replay():
    B, G, V = 2, 5, 128256
    gen = torch.Generator().manual_seed(6)
    static_logits = random_logits(B, G, V, torch.float16, gen)
    static_draft = make_drafts(reference_argmax(static_logits), V, gen).cuda()
    out = torch.empty(B, G + 1, dtype=torch.int64, device="cuda")
    acc = torch.empty(B, dtype=torch.int64, device="cuda")
    ws = torch.zeros(_C.greedy_verify_workspace_bytes(B, G), dtype=torch.uint8, device="cuda")

    side = torch.cuda.Stream()  # warm up off the default stream, as torch recommends
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_greedy_verify(static_logits, static_draft, out=out, num_accepted=acc, workspace=ws)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_greedy_verify(static_logits, static_draft, out=out, num_accepted=acc, workspace=ws)

    for _ in range(3):
        new_logits = random_logits(B, G, V, torch.float16, gen)
        new_draft = make_drafts(reference_argmax(new_logits), V, gen).cuda()
        static_logits.copy_(new_logits)
        static_draft.copy_(new_draft)
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_acc = reference_greedy_verify(new_logits, new_draft)
        assert torch.equal(out.cpu(), ref_out)
        assert torch.equal(acc.cpu(), ref_acc)


def test_bad_arguments_raise():
    x = torch.zeros(1, 2, 10, device="cuda")
    d = torch.zeros(1, 1, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError):
        _C.greedy_verify(x.data_ptr(), 20, 10, d.data_ptr(), 0, d.data_ptr(), d.data_ptr(),
                         d.data_ptr(), 1, 1, 10, 9, torch.cuda.current_stream().cuda_stream)
    with pytest.raises(ValueError):
        _C.greedy_verify(x.data_ptr(), 20, 10, d.data_ptr(), 0, d.data_ptr(), d.data_ptr(),
                         d.data_ptr(), 1, 1, 0, 0, torch.cuda.current_stream().cuda_stream)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_public_op_backends_match_torch_reference(backend, dtype):
    """The whole pipeline: ops.greedy_verify -> backend choice -> kernel, against the reference."""
    from specdec_kernels import ops, reference

    gen = torch.Generator(device="cuda").manual_seed(7)
    for batch, g, vocab in [(1, 4, 32000), (8, 5, 128256), (32, 3, 151936)]:
        logits = torch.randn(batch, g + 1, vocab, device="cuda", generator=gen).to(dtype)
        drafts = logits[:, :g].float().argmax(-1)
        drafts[batch // 2:, g // 2] = -1
        counts = torch.randint(0, g + 1, (batch,), device="cuda", generator=gen)
        want = reference.greedy_verify(logits, drafts, num_draft_tokens=counts)
        got = ops.greedy_verify(logits, drafts, num_draft_tokens=counts, backend=backend)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if backend == "auto":
        assert ops.resolve("greedy_verify", "auto", logits.device) == "cuda"


@pytest.mark.gpu
def test_public_op_captures_in_a_cuda_graph():
    from specdec_kernels import ops

    logits = torch.randn(4, 6, 32000, device="cuda")
    drafts = logits[:, :5].argmax(-1)
    ops.greedy_verify(logits, drafts, backend="cuda")  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = ops.greedy_verify(logits, drafts, backend="cuda")
    logits.copy_(torch.randn_like(logits))
    drafts.copy_(logits[:, :5].argmax(-1))
    drafts[:, 2] = -1
    graph.replay()
    want = ops.greedy_verify(logits, drafts, backend="torch")
    assert torch.equal(static_out[0], want[0]) and torch.equal(static_out[1], want[1])
