"""GPU tests of greedy_verify: the case catalog on every GPU backend, and the raw _C contract.

The kernel cases are the catalog's (selftest/cases_logit_verify.py: a sample per op; `--gpu-tier full`: all of "full":
V up to 151936, B up to 256, every dtype, ragged and clamped counts, NaN / inf / tie rows at
every position, ties across CUDA chunks, out-of-range ids, strided and unaligned logits, g = 0,
empty batches, CUDA-graph replays), run through the public op on backend "cuda" and "triton"
and judged as `specdec-kernels selftest` judges them. Here besides, the extension called
directly (raw pointers + stream), which pins the C++ contract independently of the Python
wrappers: the workspace it re-zeroes, a raw graph capture, and its argument checks.
Everything skips cleanly without CUDA or without a built extension.
"""

import pytest

torch = pytest.importorskip("torch")

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402
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
# The catalog, through the public op
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("case,backend", gpu_catalog("cuda", ("greedy_verify",)))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, "cuda")
    check_case(case, backend, "cuda", profile=gpu_profile(), graphs=True)


def test_auto_backend_follows_the_measurements():
    """common/auto_table.py: Triton measured the faster at B=1, CUDA at B=64."""
    from specdec_kernels import ops

    sizes = dict(G=4, V=128256, dtype=torch.bfloat16)
    assert ops.resolve("greedy_verify", "auto", torch.device("cuda"), sizes=dict(B=1, **sizes)) == "triton"
    assert ops.resolve("greedy_verify", "auto", torch.device("cuda"), sizes=dict(B=64, **sizes)) == "cuda"


# ----------------------------------------------------------------------------
# The raw _C contract
# ----------------------------------------------------------------------------
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

