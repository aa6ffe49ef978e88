"""tree_rejection_sample's CUDA launch plan, residual arithmetic and split-V walk, host builds
checked on the CPU (no GPU needed; runs wherever _C is built): the launcher allocates nothing that
grows with V, the per-id residual the kernel recomputes is the reference's, and the kernel's walk
(csrc/tree_walk.cuh: the claim protocol, the chunk sums, the completer's serial part, the one-chunk
rescan) emulated on the host with CTAs interleaved by a seeded scheduler gives the reference's
outputs bit for bit over the case catalog, both sibling rules and every randomness mode. The sm_90
form (one thread-block cluster per row, fixed slices, rank 0's serial part, decisions through
distributed shared memory) is emulated in lockstep phases and checked the same way."""

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.common.sampling import to_weights

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None, reason="specdec_kernels._C is not built here")

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("arch", (80, 90))
def test_plan_splits_vocab_with_buffers_that_do_not_grow_with_it(arch):
    """grid (B, chunks): the chunks cover V exactly (every CTA owns ids, none past V), hold 2048..8192
    ids (fewer for a small V), and at most 128, so the scratch (state, rank table 2N, 128 chunk sums)
    and the zeroed ticket words (32 bytes a row) depend on B and N only. The old kernel ran one
    512-thread CTA per row (grid (B,)); before it, the launcher held an int64 [B, V] residual."""
    sms = {80: 108, 90: 132}[arch]
    for batch, vocab in ((1, 128256), (64, 128256), (256, 151936), (3, 40), (1, 1), (2, 2**23 - 1), (1, 2**20 + 5)):
        plan = _C.tree_rejection_sample_plan(batch, 16, vocab, arch, 1)  # the split form (sm_90 picks clusters)
        assert plan["form"] == "split" and plan["cluster"] == 0
        chunks, chunk = plan["chunks"], plan["chunk"]
        assert plan["grid"] == (batch, chunks) and plan["threads"] == 256
        assert chunk % 8 == 0 and (chunks - 1) * chunk < vocab <= chunks * chunk, (batch, vocab)
        assert 1 <= chunks <= 128
        if vocab <= 128 * 8192:
            assert chunk <= max(8192, -(-vocab // 8 * 8)), (batch, vocab)
        assert plan["workspace_bytes"] == batch * (8 + 2 * 16 + 128 * 3) * 8
        assert plan["zeroed_bytes"] == batch * 128  # a 128-byte line of ticket words a row
        launched = _C.launch_plan("tree_rejection_sample", dict(B=batch, N=16, V=vocab, form=1), arch)
        assert [launch["grid"] for launch in launched["launches"]] == [(batch, chunks, 1)]
        assert (launched["chunks"], launched["chunk"]) == (chunks, chunk)
    # B = 1 at the bench's V: 62 chunks of >= 2048 ids (the old kernel: 1 CTA); B = 64: 8192-id chunks at most
    assert _C.tree_rejection_sample_plan(1, 16, 128256, arch, 1)["chunks"] == 62
    assert _C.tree_rejection_sample_plan(64, 16, 128256, arch, 1)["chunk"] <= 8192
    assert _C.tree_rejection_sample_plan(64, 16, 128256, arch, 1)["chunks"] * 64 >= 3 * sms  # one wave or more
    small, large = (_C.tree_rejection_sample_plan(256, 64, v, arch, 1) for v in (40, 151936))
    assert small["workspace_bytes"] == large["workspace_bytes"] and small["zeroed_bytes"] == large["zeroed_bytes"]
    assert _C.tree_rejection_sample_plan(0, 64, 151936, arch, 1)["workspace_bytes"] == 0
    with pytest.raises(ValueError):
        _C.tree_rejection_sample_plan(-1, 64, 10, arch, 0)
    with pytest.raises(ValueError, match="2\\^23"):
        _C.tree_rejection_sample_plan(1, 8, 2**23, arch, 0)


@pytest.mark.parametrize("arch", (80, 90))
def test_plan_picks_the_cluster_form_on_sm90_only(arch):
    """sm_90: one cluster of C <= 16 CTAs per row (> 8 only as the non-portable size), grid B * C, slices of a
    multiple of 8 ids covering V exactly (none empty), <= 8192 ids where 16 slices allow it, scratch of the
    state and rank table only, no zeroed words, the static shared memory far below the 48 KiB default.
    sm_80 never gets it (forcing it is refused); past 16 slices of 16384 ids, or where the B clusters do not
    fit on the device at once (3 CTAs on each of 132 SMs), sm_90 runs the split form."""
    for batch, vocab in ((1, 128256), (64, 128256), (256, 151936), (3, 40), (1, 1), (2, 32000), (10**5, 262144),
                         (1, 262145), (2, 2**23 - 1)):
        plan = _C.tree_rejection_sample_plan(batch, 16, vocab, arch, 0)
        launched = _C.launch_plan("tree_rejection_sample", dict(B=batch, N=16, V=vocab), arch)
        fewest = -(-vocab // 16384)
        fits = arch == 90 and fewest <= 16 and batch * fewest <= 3 * 132
        assert plan["form"] == ("cluster" if fits else "split"), (arch, batch, vocab)
        assert launched["cluster"] == plan["cluster"] and launched["form"] == (2 if fits else 1)
        if not fits:
            continue
        c, chunk = plan["cluster"], plan["chunk"]
        assert 1 <= c <= 16 and plan["chunks"] == c and launched["portable"] == (c <= 8)
        assert plan["grid"] == (batch * c,) and [l["grid"] for l in launched["launches"]] == [(batch * c, 1, 1)]
        assert launched["launches"][0]["kernel"] == "tree_rejection_cluster_kernel"
        assert chunk % 8 == 0 and (c - 1) * chunk < vocab <= c * chunk, (batch, vocab)
        one_wave = batch * -(-vocab // 8192) <= 3 * 132  # short slices while the rows fit one wave
        assert chunk <= (8192 if vocab <= 16 * 8192 and one_wave else 16384)
        assert plan["workspace_bytes"] == batch * (8 + 2 * 16) * 8 and plan["zeroed_bytes"] == 0
        launch = launched["launches"][0]
        assert launch["static_smem"] + launch["dynamic_smem"] < 48 * 1024 and not launch["opt_in"]
    # the bench's V: 16 slices of 8016 ids at B = 1; at B = 64 the 8 CTAs of 16032 ids a row would take two
    # rounds of rows (512 CTAs, 396 slots): the split form; a small V at B = 1 still fills 15 CTAs of >= 2048 ids
    if arch == 90:
        assert _C.tree_rejection_sample_plan(1, 16, 128256, 90, 0)["chunk"] == 8016
        assert _C.tree_rejection_sample_plan(1, 16, 128256, 90, 0)["cluster"] == 16
        assert _C.tree_rejection_sample_plan(64, 16, 128256, 90, 0)["form"] == "split"
        b32 = _C.tree_rejection_sample_plan(32, 16, 128256, 90, 0)  # the most CTAs whose 32 clusters fit at once
        assert b32["cluster"] == 12 and 32 * 12 <= 396 < 32 * 13 and b32["chunk"] == 10688
        assert _C.tree_rejection_sample_plan(1, 16, 32000, 90, 0)["cluster"] == 15
        assert _C.tree_rejection_sample_plan(64, 16, 32000, 90, 0)["cluster"] <= 8  # portable when B fills the device
        assert _C.tree_rejection_sample_plan(1, 16, 128256, 90, 1)["form"] == "split"  # forced
        with pytest.raises(ValueError, match="16384"):
            _C.tree_rejection_sample_plan(1, 16, 262145, 90, 2)
    else:
        with pytest.raises(ValueError, match="sm_90"):
            _C.tree_rejection_sample_plan(1, 16, 128256, 80, 2)
    with pytest.raises(ValueError, match="form"):
        _C.tree_rejection_sample_plan(1, 16, 128256, arch, 3)


def test_launcher_form_from_the_environment(monkeypatch):
    from specdec_kernels.cuda.tree_verify import tree_form

    for name, code in (("", 0), ("auto", 0), ("split", 1), ("Cluster", 2)):
        monkeypatch.setenv("SPECDEC_TREE_FORM", name)
        assert tree_form() == code
    monkeypatch.delenv("SPECDEC_TREE_FORM")
    assert tree_form() == 0
    monkeypatch.setenv("SPECDEC_TREE_FORM", "coop")
    with pytest.raises(ValueError, match="SPECDEC_TREE_FORM"):
        tree_form()


def reference_residual(p, qs):
    """R_k and [S_1..S_k] with the expressions of reference/tree_verify.py (float32 rows)."""
    weights = to_weights(p - qs[0])
    totals = [int(weights.sum())]
    for q in qs[1:]:
        total = weights.sum().double()
        q_clean = torch.nan_to_num(q, nan=1.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0).double()
        weights = (weights - torch.floor(total * q_clean).to(torch.int64)).clamp(min=0)
        totals.append(int(weights.sum()))
    return weights, totals


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_host_residual_is_the_reference(dtype):
    """Ten rejected siblings over V = 3000, with NaN, +-inf, negatives, values > 1,
    subnormals and an all-zero q row; the kernel widens every dtype to float32 first."""
    gen = torch.Generator().manual_seed(7)
    vocab, siblings = 3000, 10
    p = torch.softmax(4 * torch.randn(vocab, generator=gen), -1)
    p[:5] = torch.tensor([NAN, INF, -INF, -0.5, 1.5])
    p[5:20] = 1e-40 if dtype == torch.float32 else 1e-6
    qs = torch.softmax(4 * torch.randn(siblings, vocab, generator=gen), -1)
    qs[1, ::7] = NAN
    qs[2, 3:9] = INF
    qs[3, 10:30] = -INF
    qs[4] = 0.0
    qs[5, 100:200] = 2.0
    qs[6, 40:60] = -1.0
    qs[7] *= 1e-3  # small cuts: R stays non-empty for the later siblings
    p, qs = p.to(dtype).float(), qs.to(dtype).float()
    for k in (1, 2, siblings):
        want_r, want_totals = reference_residual(p, qs[:k])
        got_r, got_totals = _C.host_tree_residual(p.tolist(), qs[:k].tolist())
        assert torch.equal(torch.tensor(got_r, dtype=torch.int64), want_r), k
        assert got_totals == want_totals, k
    assert want_totals[-1] > 0 and want_totals[-1] < want_totals[0]  # the cuts acted, R not emptied


# ------------------------------------------------------------------ siblings="without_replacement"

def reference_sampled_residual(p, q, rejected):
    """R after the rejected tokens, [S_1..S_k] and the scales, with the expressions of
    reference/tree_verify.py `_WithoutReplacement` (float32 rows, one q for all siblings)."""
    q_weights = to_weights(q)
    weights = to_weights(p - q)
    q_left = int(q_weights.sum())
    removed = torch.zeros(p.shape[0], dtype=torch.bool)
    totals, scales = [], []
    for i, x in enumerate(rejected):
        scale = torch.tensor(0.0, dtype=torch.float64)
        if i > 0:
            scale = torch.tensor(totals[-1], dtype=torch.float64) / torch.tensor(q_left, dtype=torch.float64)
            cut = torch.floor((scale * q_weights.double()).clamp(max=2.0**41)).to(torch.int64)
            weights = (weights - torch.where(removed, 0, cut)).clamp(min=0)
        removed[x] = True
        q_left -= int(q_weights[x])
        totals.append(int(weights.sum()))
        scales.append(float(scale))
    return weights, totals, scales


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_host_sampled_residual_is_the_reference(dtype):
    """Up to ten rejected siblings of one q over V = 3000 (NaN, +-inf, negatives, values > 1,
    subnormals in p and q); the kernel widens every dtype to float32 first."""
    gen = torch.Generator().manual_seed(11)
    vocab = 3000
    p = torch.softmax(3 * torch.randn(vocab, generator=gen), -1)
    q = torch.softmax(3 * torch.randn(vocab, generator=gen), -1)
    p[:5] = torch.tensor([NAN, INF, -INF, -0.5, 1.5])
    q[5:10] = torch.tensor([NAN, INF, -INF, -0.5, 1.5])
    p[20:40] = 1e-40 if dtype == torch.float32 else 1e-6
    p, q = p.to(dtype).float(), q.to(dtype).float()
    order = torch.argsort(q[10:], descending=True)[:10] + 10  # real siblings: distinct, Q > 0
    for k in (1, 2, 5, 10):
        rejected = order[:k].tolist()
        want_r, want_totals, want_scales = reference_sampled_residual(p, q, rejected)
        got_r, got_totals, got_scales = _C.host_sampled_residual(p.tolist(), q.tolist(), rejected)
        assert torch.equal(torch.tensor(got_r, dtype=torch.int64), want_r), k
        assert got_totals == want_totals and got_scales == want_scales, k
    assert 0 < want_totals[-1] < want_totals[1]  # the later cuts acted, R not emptied
    with pytest.raises(ValueError, match="real sibling"):
        _C.host_sampled_residual(p.tolist(), q.tolist(), [order[0].item()] * 2)  # a repeat is no sibling


def test_host_sampled_accept_order():
    """u * (c * Q(x)) < R(x), in that float64 order (not (u * c) * Q(x))."""
    gen = torch.Generator().manual_seed(5)
    u = torch.rand(2000, generator=gen, dtype=torch.float64)
    scale = torch.rand(2000, generator=gen, dtype=torch.float64) * 3
    q_weight = torch.randint(1, 2**40, (2000,), generator=gen)
    r = (u * (scale * q_weight.double())).round().to(torch.int64)  # near the boundary on purpose
    want = u * (scale * q_weight.double()) < r.double()
    got = [_C.host_sampled_accept(*args) for args in zip(u.tolist(), scale.tolist(), q_weight.tolist(), r.tolist())]
    assert got == want.tolist()


# ------------------------------------------------------------------ the split-V walk, emulated on the host

def _rejection_cases(profile):
    from specdec_kernels import selftest

    cpu = torch.device("cpu")
    return [case for family in selftest.CASE_FAMILIES for case in family(profile, cpu)
            if case.op == "tree_rejection_sample"]


def _emulate(x, **knobs):
    from specdec_kernels import reference
    from specdec_kernels.cuda.tree_verify import emulate_rejection_on_host

    x = {k: v for k, v in x.items() if k not in ("triton_overrides", "unvalidated")}
    if x.get("max_depth") is None:
        x["max_depth"] = reference.max_tree_depth(x["parents"])
    return emulate_rejection_on_host(**x, **knobs)


def _same(got, want):
    return all(torch.equal(g, w.to(g.device)) for g, w in zip(got, want))


# (chunk, CTAs running at once, schedule): one CTA at a time (it claims every chunk itself), a few
# (waits and hand-offs between CTAs), all of them; chunks of 4 ids make the passes and the final
# draw cross many chunk boundaries on the catalog's small vocabularies.
SCHEDULES = ((4, 1, 0), (8, 3, 1), (16, 64, 2), (2048, 2, 3))


def tiny_cases():
    """(case, inputs, the reference's outputs) of every non-empty tiny-profile case (more than 50)."""
    cases = _rejection_cases("tiny")
    assert len(cases) > 50
    for case in cases:
        x = case.build(0)
        if x["tree_tokens"].shape[0]:
            yield case, x, case.run(dict(x), "torch")


@pytest.mark.parametrize("chunk, resident, schedule", SCHEDULES)
def test_split_walk_emulation_is_the_reference_over_the_catalog(chunk, resident, schedule):
    """Every tiny-profile tree_rejection_sample case (both sibling rules, uniforms float32/64, seeds,
    per-row seeds and offsets, int32 and strided indices and strides, NaN/inf/zero/negative rows,
    ids outside [0, V), depth cuts): the emulated kernel's outputs equal the reference's."""
    ran, waits, passes, wr = 0, 0, 0, 0
    for case, x, want in tiny_cases():
        vocab = x["target_probs"].shape[-1]
        if -(-vocab // chunk) > 128:
            continue
        got, stats = _emulate(x, chunk=chunk, resident=resident, schedule_seed=schedule)
        assert _same(got, want), (case.name, got, want)
        ran += 1
        waits += stats["waits"]
        passes += stats["chunk_passes"]
        wr += x.get("siblings") == "without_replacement"
    assert ran > 50 and wr > 10 and passes > 100
    # a lone CTA per row (one at a time, or one chunk per row: V <= 300 here) never waits; several do
    assert (waits > 0) == (resident > 1 and chunk < 300)


def production_cases():
    """(case, inputs, the reference's outputs, (B, N, V)) of the quick profile at V from 1000 up to 32000
    (B * N * V up to 4 * 16 * 32000)."""
    for case in _rejection_cases("quick"):
        x = case.build(1)
        batch, n = x["tree_tokens"].shape
        vocab = x["target_probs"].shape[-1]
        if batch and batch * n * vocab <= 4 * 16 * 32000 and vocab >= 1000:
            yield case, x, case.run(dict(x), "torch"), (batch, n, vocab)


def test_split_walk_emulation_at_production_vocabularies():
    """The quick profile's cases at V up to 32000 (B up to 4, N up to 16), the plan's chunk size."""
    checked = 0
    for case, x, want, (batch, n, vocab) in production_cases():
        chunk = _C.tree_rejection_sample_plan(batch, n, vocab, 90, 1)["chunk"]
        got, _ = _emulate(x, chunk=chunk, resident=7, schedule_seed=checked)
        assert _same(got, want), case.name
        checked += 1
    assert checked >= 10


def flat_root_rows(batch, siblings):
    """B root-only trees over a flat p of V = 64: row b's final uniform b / 64 + 1e-9 draws id b."""
    vocab = 64
    flat = torch.full((batch, 1, vocab), 1.0 / vocab)
    return dict(target_probs=flat, draft_probs=flat.clone(), tree_tokens=torch.zeros(batch, 1, dtype=torch.int64),
                parents=torch.full((batch, 1), -1, dtype=torch.int64), max_depth=0, siblings=siblings,
                uniforms=(torch.arange(batch, dtype=torch.float64) / vocab + 1e-9).unsqueeze(1))


@pytest.mark.parametrize("siblings", ("independent", "without_replacement"))
def test_final_draw_crosses_chunk_boundaries(siblings):
    """A root-only tree over a flat p of V = 64 in chunks of 8: u = k / 64 + 1e-9 draws id k, so the
    draw's chunk search and rescan land on every chunk and every offset inside one."""
    from specdec_kernels import reference

    batch = 64
    x = flat_root_rows(batch, siblings)
    got, stats = _emulate(x, chunk=8, resident=5, schedule_seed=9)
    want = reference.tree_rejection_sample(**x)
    assert _same(got, want) and got[0][:, 0].tolist() == list(range(batch))
    assert stats["chunk_passes"] == batch * 8  # one p pass of 8 chunks a row


def test_split_walk_emulation_catches_a_wrong_walk():
    """The comparison has teeth: the same case with the other sibling rule, or another uniform for the
    final draw, gives other tokens than the reference's."""
    case = next(c for c in _rejection_cases("tiny") if "star of 7 siblings far from p" in c.name
                and "uniforms64" in c.name)
    x = case.build(0)
    want = case.run(dict(x), "torch")
    got, _ = _emulate(dict(x, siblings="without_replacement"), chunk=8, resident=3, schedule_seed=0)
    assert not _same(got, want)
    shifted = dict(x, uniforms=(x["uniforms"] + 0.37) % 1.0)
    got, _ = _emulate(shifted, chunk=8, resident=3, schedule_seed=0)
    assert not _same(got, want)


def test_split_walk_emulation_rejects_bad_knobs():
    x = dict(target_probs=torch.ones(1, 1, 8) / 8, draft_probs=torch.ones(1, 1, 8) / 8,
             tree_tokens=torch.zeros(1, 1, dtype=torch.int64), parents=torch.full((1, 1), -1), max_depth=0,
             uniforms=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="multiple of 4"):
        _emulate(x, chunk=6)
    with pytest.raises(ValueError, match="resident"):
        _emulate(x, chunk=4, resident=0)


# ------------------------------------------------------------------ the sm_90 cluster walk, emulated on the host

def _emulate_cluster(x, **knobs):
    from specdec_kernels import reference
    from specdec_kernels.cuda.tree_verify import emulate_cluster_on_host

    x = {k: v for k, v in x.items() if k not in ("triton_overrides", "unvalidated")}
    if x.get("max_depth") is None:
        x["max_depth"] = reference.max_tree_depth(x["parents"])
    return emulate_cluster_on_host(**x, **knobs)


def _slices(vocab, cluster, spread):
    """(chunk, cluster): slices of a multiple of 8 ids over `spread` of the `cluster` CTAs (the rest empty)."""
    return -(-(-(-vocab // spread)) // 8) * 8, cluster


# (CTAs a row, CTAs that own ids, schedule): one CTA, a few, 16 (the non-portable size), 16 with
# trailing CTAs owning nothing (the plan never does that; the kernel must still be right).
CLUSTER_SETTINGS = ((1, 1, 0), (3, 3, 1), (8, 8, 2), (16, 16, 3), (16, 5, 4))


@pytest.mark.parametrize("cluster, spread, schedule", CLUSTER_SETTINGS)
def test_cluster_walk_emulation_is_the_reference_over_the_catalog(cluster, spread, schedule):
    """The split emulator's catalog (both sibling rules, uniforms float32/64, seeds, per-row seeds and
    offsets, int32 and strided inputs, NaN/inf/zero/negative rows, ids outside [0, V), depth cuts) through
    the cluster protocol with fixed slices: the outputs equal the reference's."""
    ran, passes, wr, rescans = 0, 0, 0, 0
    for case, x, want in tiny_cases():
        chunk, c = _slices(x["target_probs"].shape[-1], cluster, spread)
        got, stats = _emulate_cluster(x, chunk=chunk, cluster=c, schedule_seed=schedule)
        assert _same(got, want), (case.name, got, want)
        ran += 1
        passes += stats["slice_passes"]
        rescans += stats["rescans"]
        wr += x.get("siblings") == "without_replacement"
        assert stats["slice_passes"] == cluster * (stats["stages"] - x["tree_tokens"].shape[0])  # every CTA, every pass
    assert ran > 50 and wr > 10 and passes > 100 and rescans > 50


def test_cluster_walk_emulation_at_production_vocabularies():
    """The quick profile's cases at V up to 32000 with the sm_90 plan's cluster size and slices."""
    checked = multi = 0
    for case, x, want, (batch, n, vocab) in production_cases():
        plan = _C.tree_rejection_sample_plan(batch, n, vocab, 90, 0)
        assert plan["form"] == "cluster"
        got, _ = _emulate_cluster(x, chunk=plan["chunk"], cluster=plan["cluster"], schedule_seed=checked)
        assert _same(got, want), case.name
        checked += 1
        multi += plan["cluster"] > 1
    assert checked >= 10 and multi >= 5


@pytest.mark.parametrize("siblings", ("independent", "without_replacement"))
def test_cluster_final_draw_crosses_slice_boundaries(siblings):
    """A root-only tree over a flat p of V = 64 in 8 slices of 8: id k is drawn for u = k / 64 + 1e-9, so the
    owner search and the owner's rescan land on every slice and every offset inside one."""
    from specdec_kernels import reference

    batch = 64
    x = flat_root_rows(batch, siblings)
    got, stats = _emulate_cluster(x, chunk=8, cluster=8, schedule_seed=9)
    want = reference.tree_rejection_sample(**x)
    assert _same(got, want) and got[0][:, 0].tolist() == list(range(batch))
    assert stats["slice_passes"] == batch * 8 and stats["rescans"] == batch


@pytest.mark.parametrize("mutate", (1, 2))
def test_cluster_walk_emulation_catches_a_broken_protocol(mutate):
    """The comparison has teeth: rank 0 reading the partials of the stage before (a missing barrier), or
    a slice that no CTA sums, gives other tokens than the reference's on the catalog."""
    wrong = 0
    for case in _rejection_cases("tiny"):
        x = case.build(0)
        if x["tree_tokens"].shape[0] == 0:
            continue
        want = case.run(dict(x), "torch")
        chunk, c = _slices(x["target_probs"].shape[-1], 4, 4)
        got, _ = _emulate_cluster(x, chunk=chunk, cluster=c, schedule_seed=0, mutate=mutate)
        wrong += not _same(got, want)
    assert wrong >= 5


def test_cluster_walk_emulation_rejects_bad_knobs():
    x = dict(target_probs=torch.ones(1, 1, 40) / 40, draft_probs=torch.ones(1, 1, 40) / 40,
             tree_tokens=torch.zeros(1, 1, dtype=torch.int64), parents=torch.full((1, 1), -1), max_depth=0,
             uniforms=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="multiple of 4"):
        _emulate_cluster(x, chunk=6, cluster=8)
    for cluster in (0, 17):
        with pytest.raises(ValueError, match="cluster"):
            _emulate_cluster(x, chunk=40, cluster=cluster)
    with pytest.raises(ValueError, match="cover"):
        _emulate_cluster(x, chunk=8, cluster=4)


# ------------------------------------------------------------------ on a GPU: the kernel itself

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form", ("split", "cluster"))
def test_kernel_matches_its_host_emulation_and_hands_back_zeroed_tickets(form, monkeypatch):
    """The quick profile's cases on the CUDA kernel, in each form (SPECDEC_TREE_FORM), equal the reference
    (a hang here is a protocol deadlock: the kernel never returns), and after each split-form call the
    stream's zeroed buffer is zero again (the cluster form uses none)."""
    from specdec_kernels.common.workspace import zeroed_workspace

    device = torch.device("cuda")
    if form == "cluster" and torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    monkeypatch.setenv("SPECDEC_TREE_FORM", form)
    checked = 0
    for family_case in _rejection_cases("quick"):
        x = family_case.build(0)
        batch, n = x["tree_tokens"].shape
        if batch == 0:
            continue
        x = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
        want = family_case.run(dict(x), "torch")
        got = family_case.run(dict(x), "cuda")
        torch.cuda.synchronize()
        assert _same(got, want), (form, family_case.name)
        zeroed = _C.tree_rejection_sample_plan(batch, n, x["target_probs"].shape[-1], 0, 1)["zeroed_bytes"]
        assert not zeroed_workspace(device, zeroed)[:zeroed].any(), family_case.name
        checked += 1
    assert checked >= 10
