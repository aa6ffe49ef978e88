"""The Triton verify ops are one launch each (rejection_sample_logits two: softmax statistics,
then the chain kernel) and hand their ticket workspace back zeroed.

The chain ops (and tree_greedy_verify at small B) split rows over V and let the program
that draws a row's last ticket finish the row (`specdec_kernels/triton/_tickets.py`).
Here, with tiles small enough to force 13 splits per row:
- each op equals the torch reference (bit for bit where the contract is exact);
- the ticket counters it used are all zero after the call, and a second call on the same
  workspace gives the same result (a counter left non-zero would elect no last program);
  a mutation check shows that a kernel without the reset fails this;
- a public op call makes exactly one Triton kernel launch (rejection_sample_logits: two).
On the CPU the kernels run under the interpreter. On a GPU the same tests run, plus (marked
`gpu`) real shapes with the default split plans called 20 times back to back, and a
CUDA-graph capture and replay of every op.
"""

import pytest
import torch
import triton
import triton.language as tl  # noqa: F401  (a jit'd function must see triton.language)

from specdec_kernels import ops, reference
from specdec_kernels.common import workspace as _workspace
from specdec_kernels.triton import block_verification, logit_verify, rejection_sampling, rejection_sampling_logits, tree_verify

pytestmark = [
    # NaN/inf rows are intended (they follow the reference); the interpreter's numpy warns
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SPLIT_MODULES = (logit_verify, rejection_sampling, tree_verify, block_verification)  # rejection_sample_logits: the chain kernel
OPS = ("greedy_verify", "relaxed_verify", "bild_verify", "max_prob", "rejection_sample", "rejection_sample_logits",
       "tree_greedy_verify", "block_verify")
EXACT = {"greedy_verify", "relaxed_verify", "rejection_sample", "tree_greedy_verify", "tree_rejection_sample",
         "block_verify"}
BATCH, G, VOCAB = 3, 3, 200
PARENTS = [[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, -1, 0]]  # a branch, a chain, an unused slot


def make_case(op: str, seed: int = 0, batch: int = BATCH, vocab: int = VOCAB) -> dict:
    """Inputs of `op` (g = 3) with ragged rows, a padding draft and hostile rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, G + 1, vocab, generator=gen) * 2
    drafts = logits[:, :G].argmax(-1)
    drafts = torch.where(torch.rand(batch, G, generator=gen) < 0.3, torch.randint(0, vocab, (batch, G), generator=gen),
                         drafts)
    drafts[-1, -1] = -1
    logits[-1, 1, ::3] = float("nan")
    logits[0, 2, vocab - 1] = float("inf")
    counts = torch.tensor([3, 1, 2] * batch)[:batch]
    if op == "max_prob":
        inputs = dict(logits=logits)
    elif op in ("rejection_sample", "block_verify"):
        p = torch.softmax(logits.nan_to_num(0.0, 50.0), -1)
        q = torch.softmax(logits[:, :G].nan_to_num(0.0, 50.0) + torch.randn(batch, G, vocab, generator=gen), -1)
        q[0, 1] = p[0, 1]  # p == q: an empty residual falls back to p
        inputs = dict(target_probs=p, draft_probs=q, draft_tokens=drafts, num_draft_tokens=counts,
                      uniforms=torch.rand(batch, G + 1, generator=gen, dtype=torch.float64))
    elif op == "rejection_sample_logits":
        inputs = dict(target_logits=logits, draft_logits=logits[:, :G] + torch.randn(batch, G, vocab, generator=gen),
                      draft_tokens=drafts, num_draft_tokens=counts, temperature=0.8, seed=1234,
                      offsets=torch.randint(0, 2**40, (batch,), generator=gen))
    elif op.startswith("tree_"):
        parents = torch.tensor([PARENTS[b % len(PARENTS)] for b in range(batch)])
        tokens = logits.argmax(-1).gather(1, parents.clamp(min=0))  # mostly each parent's argmax
        tokens[0, 2] = 7
        inputs = dict(tree_tokens=tokens, parents=parents, max_depth=2)
        if op == "tree_greedy_verify":
            inputs.update(target_logits=logits)
        else:
            inputs.update(target_probs=torch.softmax(logits.nan_to_num(0.0, 50.0), -1),
                          draft_probs=torch.softmax(torch.randn(batch, G + 1, vocab, generator=gen), -1), seed=5)
    else:
        inputs = dict(target_logits=logits, draft_tokens=drafts, num_draft_tokens=counts)
        if op == "relaxed_verify":
            inputs.update(top_beta=3, tau=1.5)
        if op == "bild_verify":
            inputs.update(rollback_threshold=2.0)
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def forced_split_call(op: str, inputs: dict):
    """The op's Triton launcher with 16-wide tiles, one per program: V = 200 in 13 splits."""
    if op == "max_prob":
        return logit_verify._launch_max_prob(inputs["logits"], block_v=16, tiles_per_program=1)
    if op == "rejection_sample":
        return rejection_sampling._launch(**inputs, block_v=16, min_tiles=1)
    if op == "rejection_sample_logits":
        return rejection_sampling_logits._launch(**inputs, block_v=16, tiles_per_program=1)
    if op == "block_verify":  # a program per (row, position, split): 3 splits of 5 tiles keep the interpreter quick
        return block_verification._launch(**inputs, block_v=16, min_tiles=4)
    if op == "tree_greedy_verify":
        return tree_verify._launch_greedy(**inputs, split=True, block_v=16, tiles_per_program=1)
    if op == "tree_rejection_sample":  # 16-wide tiles, two per chunk: V = 200 in 7 chunks
        return tree_verify._launch_rejection(**inputs, block_v=16)
    rule = dict(greedy_verify={}, relaxed_verify=dict(top_beta=inputs.get("top_beta"), tau=inputs.get("tau")),
                bild_verify=dict(threshold=inputs.get("rollback_threshold")))[op]
    mode = dict(greedy_verify=logit_verify.GREEDY, relaxed_verify=logit_verify.RELAXED, bild_verify=logit_verify.BILD)
    return logit_verify._launch_chain(inputs["target_logits"], inputs["draft_tokens"], inputs["num_draft_tokens"],
                                      mode=mode[op].value, block_v=16, tiles_per_program=1, **rule)


def as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def assert_matches_reference(op: str, got, inputs: dict):
    want = as_tuple(getattr(reference, op)(**inputs))
    for g_, w_ in zip(as_tuple(got), want):
        g_, w_ = g_.cpu(), w_.cpu()
        if op in EXACT or g_.dtype == torch.int64:
            assert torch.equal(g_, w_), f"{op}: {g_.tolist()} != {w_.tolist()}"
        else:
            torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-6)


@pytest.fixture
def used_counters(monkeypatch):
    """Every ticket-counter tensor the Triton launchers take from the workspace."""
    taken = []

    def spy(device, count):
        counters = _workspace.zeroed_counters(device, count)
        taken.append(counters)
        return counters

    for module in SPLIT_MODULES:
        monkeypatch.setattr(module, "zeroed_counters", spy)
    return taken


@pytest.mark.parametrize("op", OPS)
def test_forced_splits_match_the_reference(op):
    for seed in range(2):
        inputs = make_case(op, seed)
        assert_matches_reference(op, forced_split_call(op, inputs), inputs)


@pytest.mark.parametrize("op", OPS)
def test_counters_are_zero_after_a_call_and_calls_repeat(op, used_counters):
    inputs = make_case(op)
    first = as_tuple(forced_split_call(op, inputs))
    second = as_tuple(forced_split_call(op, inputs))
    public = as_tuple(getattr(ops, op)(**inputs, backend="triton"))
    assert len(used_counters) == 3  # every call took its counters from the shared workspace
    for counters in used_counters:
        assert counters.dtype == torch.int32 and int(counters.count_nonzero()) == 0
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert_matches_reference(op, public, inputs)


def workspaces_zeroed() -> bool:
    """Every shared zeroed workspace with data is all zeros (other tests may leave meta-device ones behind,
    e.g. from tracing, which hold no values)."""
    return all(int(buffer.count_nonzero()) == 0 for buffer in _workspace._zeroed_workspaces.values()
               if not buffer.is_meta)


def test_tree_sampling_hands_its_claim_words_back_zeroed():
    """tree_rejection_sample splits each pass over V across a row's programs, which claim V-chunks
    from per-row words in the zeroed workspace (triton/tree_verify_sampling.py): the row's last program to
    leave zeroes them, so calls repeat exactly, forced to 7 chunks or at the default plan."""
    inputs = make_case("tree_rejection_sample")
    first = forced_split_call("tree_rejection_sample", inputs)
    assert workspaces_zeroed()
    second = forced_split_call("tree_rejection_sample", inputs)
    public = ops.tree_rejection_sample(**inputs, backend="triton")
    assert workspaces_zeroed()
    for a, b, c in zip(first, second, public):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert_matches_reference("tree_rejection_sample", first, inputs)


@triton.jit
def _no_reset(counter_ptr):
    """A broken `_tickets.reset_ticket` that leaves the counter as it is."""
    pass


def test_a_missing_counter_reset_is_caught(monkeypatch, used_counters):
    """Mutation check of the test above: a kernel that skips the reset leaves its counters
    non-zero (the next call on that workspace would elect no last program)."""
    if DEVICE.type != "cpu":
        pytest.skip("patches a device function; only the interpreter looks it up at every call")
    monkeypatch.setattr(rejection_sampling, "reset_ticket", _no_reset)
    try:
        rejection_sampling._launch(**make_case("rejection_sample"), block_v=16, min_tiles=1)
        assert used_counters[-1].tolist() == [13] * BATCH  # one ticket per program: 13 splits of V = 200
    finally:
        for buffer in _workspace._zeroed_workspaces.values():
            buffer.zero_()  # leave the shared workspace as the next test expects it


@pytest.fixture
def triton_launches(monkeypatch):
    """Names of the Triton kernels launched (kernel[grid](...) goes through `run`)."""
    names = []
    kernel_class = type(logit_verify._chain_verify_kernel)
    original = kernel_class.run

    def counting_run(self, *args, **kwargs):
        names.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(kernel_class, "run", counting_run)
    return names


# the launches of a call: one kernel, or the logits op's statistics then its chain kernel
LAUNCHES = dict(rejection_sample_logits=["_softmax_stats_kernel", "_rejection_sample_kernel"])


@pytest.mark.parametrize("op", OPS + ("tree_rejection_sample",))
def test_one_launch_per_call(op, triton_launches):
    inputs = make_case(op)
    getattr(ops, op)(**inputs, backend="triton")
    per_call = len(LAUNCHES.get(op, [None]))
    assert len(triton_launches) == per_call, triton_launches
    if op in LAUNCHES:
        assert triton_launches == LAUNCHES[op]
    forced_split_call(op, inputs)
    assert len(triton_launches) == 2 * per_call, triton_launches


def assert_sampled_rows_agree(got, inputs):
    """rejection_sample_logits at a real V: num_accepted and the accepted prefix equal the
    reference's, and the final token on nearly every row. Its softmax sums round
    differently from torch's (a relative ~1e-7), which moves a cdf boundary across the
    draw threshold on about V * 1e-7 of the rows (~1% at V = 128256)."""
    want = reference.rejection_sample_logits(**inputs)
    out, accepted = (x.cpu() for x in got)
    want_out, want_accepted = (x.cpu() for x in want)
    assert torch.equal(accepted, want_accepted)
    prefix = torch.arange(out.shape[1]) < accepted.unsqueeze(1)
    assert torch.equal(out[prefix], want_out[prefix]) and bool((out[~prefix] < inputs["target_logits"].shape[-1]).all())
    final = out.gather(1, accepted.unsqueeze(1)).squeeze(1)
    assert bool((final >= 0).all())
    assert int((final != want_out.gather(1, accepted.unsqueeze(1)).squeeze(1)).sum()) <= 1 + out.shape[0] // 10


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op", OPS + ("tree_rejection_sample",))
@pytest.mark.parametrize("batch,vocab", [(1, 151936), (8, 32000), (64, 128256)])
def test_real_shapes_repeat_exactly(op, batch, vocab):
    """Real shapes with the default split plans (50 programs per row for rejection_sample
    at B = 1): the reference's answer, then the same answer on each of 20 back-to-back
    calls with the counters zero after each. This is what exercises the cross-program
    ticket protocol (stores, barrier, acq_rel atomic, L2 loads) on real hardware, and
    tree_rejection_sample's chunk claims and stage hand-offs between a row's programs."""
    inputs = make_case(op, batch=batch, vocab=vocab)
    first = as_tuple(getattr(ops, op)(**inputs, backend="triton"))
    if op == "rejection_sample_logits":
        assert_sampled_rows_agree(first, inputs)
    else:
        assert_matches_reference(op, first, inputs)
    for _ in range(20):
        again = as_tuple(getattr(ops, op)(**inputs, backend="triton"))
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        assert workspaces_zeroed()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op", OPS + ("tree_rejection_sample",))
def test_cuda_graph_capture_and_replay(op):
    """Captured once, replayed on new inputs: the same answer as the reference each time."""
    inputs = make_case(op)
    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    getattr(ops, op)(**static, backend="triton")  # warm up: compile, and create the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = as_tuple(getattr(ops, op)(**static, backend="triton"))
    for seed in (1, 2, 3):
        fresh = make_case(op, seed)
        for k, v in fresh.items():
            if isinstance(v, torch.Tensor):
                static[k].copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_reference(op, out, static)
    assert int(_workspace.zeroed_counters(DEVICE, BATCH).count_nonzero()) == 0
