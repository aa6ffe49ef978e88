"""GPU tests of tree_greedy_verify / tree_rejection_sample on the cuda (csrc/tree_verify.cu)
and triton backends.

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_tree_verify.py, the "full"
tier, the one `specdec-kernels selftest` runs), bit for bit against the torch reference on the
same GPU tensors: random trees with garbage and out-of-range ids over B in {1, 4, 16} and V in
{32000, 128256} at every dtype, randomness mode and depth cut; adversarial logit and probability
rows; wide trees with long rejection chains (shared-q, one-hot top-k and sampled siblings, NaN /
inf / zero rows); non-contiguous unaligned inputs; siblings="without_replacement" at production
vocabularies; the interpreter tests' crafted edge rows; and CUDA-graph captures replayed on new
inputs. What the catalog cannot express stays here: chain-shaped trees reproduce the chain ops,
the greedy workspace is handed back zeroed, auto's choice, and no [B, V] allocation.
Everything skips cleanly without CUDA or without a built _C.
"""

import pytest

torch = pytest.importorskip("torch")

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402
from gpu_support import CUDA_KERNEL_MARKS  # noqa: E402

pytestmark = CUDA_KERNEL_MARKS

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.reference import chain_parents  # noqa: E402
from specdec_kernels.common.sampling import safe_argmax  # noqa: E402
from specdec_kernels.selftest.tree_inputs import biased_parents, garbage_tokens, gpu_randomness  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = lambda d: str(d).split(".")[-1]  # noqa: E731
NAN, INF = float("nan"), float("inf")
RANDOMNESS = ["uniforms32", "uniforms64", "seed", "seeds"]


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------
def random_logits(B, N, V, cgen, ties=True):
    """[B, N, V] float32 logits on the GPU (cgen: a CUDA generator); half the rows repeat
    their max at a second random index, so ties (lowest id wins) show up in every dtype."""
    x = torch.randn(B, N, V, generator=cgen, device="cuda") * 3
    if ties:
        flat = x.view(-1, V)
        rows = torch.arange(flat.shape[0], device="cuda")
        at = torch.randint(0, V, (flat.shape[0],), generator=cgen, device="cuda")
        keep = torch.rand(flat.shape[0], generator=cgen, device="cuda") < 0.5
        flat[rows[keep], at[keep]] = flat.max(dim=-1).values[keep]
    return x


def probs_pair(B, N, V, cgen, sharp=2.0):
    """(target, draft) float32 probabilities on the GPU, the draft a noisy copy of the target."""
    logits = torch.randn(B, N, V, generator=cgen, device="cuda") * sharp
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + torch.randn(B, N, V, generator=cgen, device="cuda"), -1)
    return target, draft


def randomness(mode, B, N, gen):
    """kwargs of the randomness argument of tree_rejection_sample: the catalog's draws (this file's
    mode "seed" is the catalog's "seed+offsets"; any other unknown mode, per-row seeds)."""
    return gpu_randomness("seed+offsets" if mode == "seed" else mode, B, N, gen, "cuda")


def assert_same(got, want):
    for name, g, w in zip(("output_tokens", "num_accepted", "accepted_nodes"), got, want):
        assert g.dtype == torch.int64 and g.shape == w.shape, name
        assert torch.equal(g, w), f"{name}:\ncuda {g.tolist()}\ntorch {w.tolist()}"


def run_greedy(logits, tokens, parents, max_depth=None):
    got = ops.tree_greedy_verify(logits, tokens, parents, max_depth=max_depth, backend="cuda")
    want = ops.tree_greedy_verify(logits, tokens, parents, max_depth=max_depth, backend="torch")
    assert_same(got, want)
    return got


def run_rejection(target, draft, tokens, parents, max_depth=None, **rnd):
    got = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend="cuda", **rnd)
    want = ops.tree_rejection_sample(target, draft, tokens, parents, max_depth=max_depth, backend="torch", **rnd)
    assert_same(got, want)
    return got


def rejection_tokens(target, draft, parents, V, gen):
    """Children drafted like a real system: the parent's target argmax, the child's own
    draft argmax (likely accepted), random ids (likely rejected) and out-of-range ids."""
    top_p = safe_argmax(target).cpu()
    top_q = safe_argmax(draft).cpu()
    parents = parents.cpu()
    B, N = parents.shape
    tokens = garbage_tokens(parents, top_p, V, gen, match_frac=0.3)
    for b in range(B):
        for i in range(1, N):
            if int(parents[b, i]) >= 0 and float(torch.rand(1, generator=gen)) < 0.3:
                tokens[b, i] = int(top_q[b, i])
    return tokens


# ----------------------------------------------------------------------------
# the catalog's cases, on both GPU backends; the CUDA tree sampler in each of its forms
# ----------------------------------------------------------------------------
FORMS = ("split", "cluster")  # SPECDEC_TREE_FORM: auto picks one per shape, so each is forced here


def in_forms(params):
    """Each CUDA tree_rejection_sample case once per form, every other case as it is (form None)."""
    out = []
    for param in params:
        case, backend = param.values
        forms = FORMS if case.op == "tree_rejection_sample" and backend == "cuda" else (None,)
        out += [pytest.param(case, backend, form, id=param.id + ("" if form is None else f"-{form} form"))
                for form in forms]
    return out


def force_form(monkeypatch, form):
    """SPECDEC_TREE_FORM=form for the test; the cluster form where the device has clusters (sm_90 and later)."""
    if form == "cluster" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the cluster form needs sm_90 (thread-block clusters)")
    if form is not None:
        monkeypatch.setenv("SPECDEC_TREE_FORM", form)


@pytest.mark.parametrize("case,backend,form",
                         in_forms(gpu_catalog("cuda", ("tree_greedy_verify", "tree_rejection_sample"))))
def test_catalog_case(case, backend, form, monkeypatch):
    skip_unless_backend(case.op, backend, "cuda")
    force_form(monkeypatch, form)
    try:
        check_case(case, backend, "cuda", profile=gpu_profile(), graphs=True)
    except ValueError as error:
        if form is None or "the cluster form" not in str(error):
            raise
        pytest.skip(f"the plan refuses the {form} form for this shape: {error}")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("siblings", ["independent", "without_replacement"])
@pytest.mark.parametrize("B,V", [(8, 32000), (49, 128256)])  # 49 rows of 8-CTA clusters: one wave, nearly full
def test_rejection_repeated_calls_agree_and_hand_back_zeroed_words(monkeypatch, form, siblings, B, V):
    """200 back-to-back calls on long rejection chains (many stages a row, CTAs waiting on each other at each):
    every call equals the reference, and the split form's ticket words are handed back zeroed each time."""
    from specdec_kernels.common import workspace

    force_form(monkeypatch, form)
    gen = torch.Generator().manual_seed(B + V)
    parents = torch.tensor([-1] + [0] * 10 + [1] * 8 + [2] * 5).expand(B, -1).clone()
    N = parents.shape[1]
    target, draft = probs_pair(B, N, V, torch.Generator(device="cuda").manual_seed(B), sharp=1.0)
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    tokens = torch.randint(0, V, (B, N), generator=gen).cuda()  # random ids: rejection after rejection
    parents = parents.cuda()
    seeds = [randomness("seeds", B, N, gen) for _ in range(4)]
    wants = [ops.tree_rejection_sample(target, draft, tokens, parents, backend="torch", siblings=siblings, **rnd)
             for rnd in seeds]
    got = [ops.tree_rejection_sample(target, draft, tokens, parents, backend="cuda", siblings=siblings,
                                     **seeds[i % 4]) for i in range(200)]
    torch.cuda.synchronize()
    for i, out in enumerate(got):
        assert_same(out, wants[i % 4])
    for buf in workspace._zeroed_workspaces.values():
        assert int(buf.count_nonzero()) == 0


def test_the_cluster_facts_are_the_drivers_view_of_this_build():
    """The plan's inputs on this device: the code arch the driver runs (the runtime's answer) is the one
    runnable_code_arch derives from the build's archs, and an sm_90 device schedules clusters of 8."""
    from gpu_support import _C

    major, minor = torch.cuda.get_device_capability()
    facts = _C.tree_cluster_facts()
    assert facts["code_arch"] == _C.runnable_code_arch(10 * major + minor, _C.compiled_archs())
    if facts["code_arch"] >= 90:
        assert all(n > 0 for n in facts["active"][1:9]), facts


# ----------------------------------------------------------------------------
# tree_greedy_verify
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("V", [1000, 32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_greedy_chain_equals_greedy_verify(dtype, V):
    cgen = torch.Generator(device="cuda").manual_seed(V + 1)
    B, g = 6, 7
    logits = random_logits(B, g + 1, V, cgen).to(dtype)
    top1 = safe_argmax(logits)
    drafts = top1[:, :g].clone()
    for b in range(B):  # row b rejects at draft b (row 6 and up accept everything)
        if b < g:
            drafts[b, b] = (drafts[b, b] + 1) % V if b % 2 else -1
    tokens = torch.cat([torch.full((B, 1), -1, device="cuda", dtype=torch.int64), drafts], dim=1)
    parents = chain_parents(B, g + 1, device="cuda")
    out, acc, nodes = run_greedy(logits, tokens, parents, max_depth=g)
    want_out, want_acc = ops.greedy_verify(logits, drafts, backend="cuda")
    assert torch.equal(out, want_out) and torch.equal(acc, want_acc)
    positions = torch.arange(g + 1, device="cuda").unsqueeze(0)
    assert torch.equal(nodes, torch.where(positions <= acc.unsqueeze(1), positions, -1))


def test_greedy_workspace_left_zeroed_over_repeated_calls():
    from specdec_kernels.common import workspace

    gen = torch.Generator().manual_seed(4)
    cgen = torch.Generator(device="cuda").manual_seed(4)
    for step in range(4):
        B, N, V = (3, 17, 32000) if step % 2 else (16, 32, 128256)
        parents = biased_parents(B, N, gen)
        logits = random_logits(B, N, V, cgen)
        tokens = garbage_tokens(parents, safe_argmax(logits), V, gen)
        run_greedy(logits, tokens.cuda(), parents.cuda())
        torch.cuda.synchronize()
        for buf in workspace._zeroed_workspaces.values():
            assert int(buf.count_nonzero()) == 0, step


# ----------------------------------------------------------------------------
# tree_rejection_sample
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", RANDOMNESS)
@pytest.mark.parametrize("V", [1000, 32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rejection_chain_equals_rejection_sample(dtype, V, mode):
    gen = torch.Generator().manual_seed(V + 7 + RANDOMNESS.index(mode))
    B, g = 8, 5
    target, q = probs_pair(B, g + 1, V, torch.Generator(device="cuda").manual_seed(V))
    target, draft = target.to(dtype), q[:, :g].to(dtype)
    drafts = safe_argmax(draft)
    drafts[::3, 2] = torch.randint(0, V, (len(drafts[::3]),), generator=gen).cuda()  # likely rejections
    drafts[1, 1] = -1
    tree_draft = torch.cat([torch.full_like(draft[:, :1], NAN), draft], dim=1)  # row 0 unused
    tokens = torch.cat([torch.full((B, 1), -1, device="cuda", dtype=torch.int64), drafts], dim=1)
    parents = chain_parents(B, g + 1, device="cuda")
    rnd = randomness(mode, B, g + 1, gen)
    if "uniforms" in rnd:  # chain: coins then the final draw; tree: column 0 is the final draw
        chain_rnd = {"uniforms": rnd["uniforms"]}
        rnd = {"uniforms": torch.cat([rnd["uniforms"][:, g:], rnd["uniforms"][:, :g]], dim=1)}
    else:
        chain_rnd = dict(rnd)
    out, acc, nodes = run_rejection(target, tree_draft, tokens, parents, max_depth=g, **rnd)
    want_out, want_acc = ops.rejection_sample(target, draft, drafts, backend="torch", **chain_rnd)
    assert torch.equal(out, want_out) and torch.equal(acc, want_acc)
    positions = torch.arange(g + 1, device="cuda").unsqueeze(0)
    assert torch.equal(nodes, torch.where(positions <= acc.unsqueeze(1), positions, -1))


def test_auto_picks_cuda():
    device = torch.device("cuda")
    assert ops.resolve("tree_greedy_verify", "auto", device) == "cuda"
    assert ops.resolve("tree_rejection_sample", "auto", device) == "cuda"


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_rejection_allocates_nothing_of_size_batch_times_vocab(backend):
    """The launchers used to allocate an int64 [B, V] residual scratch per call (311 MB at
    B = 256, V = 151936); now the residual is recomputed and the only buffer is the rank
    table (B * N * 2 int64). Rows with several rejected siblings keep the recomputation
    busy, and the outputs stay bit-exact."""
    if backend == "triton":
        pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(16)
    B, V = 256, 151936
    parents = torch.tensor([-1, 0, 0, 0, 1, 1]).expand(B, -1).clone()
    N = parents.shape[1]
    target, draft = probs_pair(B, N, V, torch.Generator(device="cuda").manual_seed(16), sharp=1.0)
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    tokens = torch.randint(0, V, (B, N), generator=gen).cuda()  # random ids: mostly rejected
    parents = parents.cuda()
    rnd = randomness("seeds", B, N, gen)
    ops.tree_rejection_sample(target, draft, tokens, parents, backend=backend, **rnd)  # compile / warm up
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = ops.tree_rejection_sample(target, draft, tokens, parents, backend=backend, **rnd)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak < B * V, f"{backend}: {peak} bytes allocated by one call"  # the scratch alone was 8 * B * V
    want = ops.tree_rejection_sample(target, draft, tokens, parents, backend="torch", **rnd)
    assert_same(got, want)
