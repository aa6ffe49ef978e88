"""The launch plan of every CUDA kernel (csrc/launch_plan.h, the function its launcher
launches) on the sm_80 and sm_90 limit tables, over the whole shape space the public ops
accept: each plan is a launch that fits every limit (grid, block, static + dynamic shared
memory against 48 KiB unless opted in, the opt-in maximum, registers of the compiled kernels
from cuobjdump) or a refusal, and a refused shape goes to another backend under "auto".
Runs in CPU-only CI whenever _C is built; no GPU is touched.

Regression guards of issue 16: finding 1 (tree_attention fp16/bf16 D = 64: 48 KiB dynamic +
128 B static without the opt-in), finding 2 (early_exit_topk: the static kept sets not counted
in the opt-in, and H > 6976 refused at B >= 7) and finding 7 (verify kernels with B in grid
y/z: B > 65535 failed)."""

import functools
import os
import re
import subprocess

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.common.auto_table import auto_order
from specdec_kernels.common import registry

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "launch_plan"),
                                reason="specdec_kernels._C (with launch plans) is not built here")

ARCHS = (80, 90)
KiB = 1024
NO_OPT_IN = 48 * KiB
OPT_IN_MAX = {80: 166912, 90: 232448}  # 163 KiB, 227 KiB
GRID_X, GRID_YZ = 2**31 - 1, 65535
FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2
EARLY_EXIT_STATIC = 8 * 8 * 8 * 16  # kept[8 warps][8 rows][16] u64
# derandomize: CI sees the same examples every run (a failure reproduces); @example pins the found ones
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------- cuobjdump
@pytest.fixture(scope="module")
def compiled() -> dict:
    """{(arch, kernel family): (most registers, SHARED)} of the built _C (cuobjdump, shipped with triton)."""
    triton = pytest.importorskip("triton")
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("no cuobjdump in this triton install")
    dump = subprocess.run([tool, "--dump-resource-usage", _C.__file__], capture_output=True, text=True,
                          check=True).stdout
    rows, arch, name = {}, None, None
    for line in dump.splitlines():
        if found := re.search(r"arch = sm_(\d+)", line):
            arch = int(found.group(1))
        elif found := re.search(r"Function (\S+):", line):
            name = found.group(1)
        elif (found := re.search(r"REG:(\d+) STACK:\d+ SHARED:(\d+)", line)) and name:
            family = re.search(r"\d+([a-z_]+_kernel)[IE]", name)
            if family:
                reg, shared = int(found.group(1)), int(found.group(2))
                old = rows.get((arch, family.group(1)), (0, set()))
                rows[(arch, family.group(1))] = (max(old[0], reg), old[1] | {shared})
    return rows


def static_smem_seen(compiled, arch, kernel):
    """The kernel's static shared memory as compiled: cuobjdump adds the 1 KiB reserved block on sm_90."""
    _, shared = compiled[(arch, kernel)]
    return {s - (KiB if arch == 90 else 0) for s in shared}


# ---------------------------------------------------------------------------------- plan checks
def assert_fits(plan, arch, compiled=None):
    """A plan is a refusal (no launches) or launches that fit every limit of `arch`."""
    if plan["refusal"] is not None:
        assert isinstance(plan["refusal"], str) and plan["refusal"] and plan["launches"] == [], plan
        return
    lim = _C.launch_limits(arch)
    for launch in plan["launches"]:
        gx, gy, gz = launch["grid"]
        assert 1 <= gx <= GRID_X and 1 <= gy <= GRID_YZ and 1 <= gz <= GRID_YZ, launch
        assert 32 <= launch["block"] <= 1024 and launch["block"] % 32 == 0, launch
        smem = launch["static_smem"] + launch["dynamic_smem"]
        assert launch["opt_in"] == (smem > NO_OPT_IN), launch  # the rule the runtime applies
        assert smem <= OPT_IN_MAX[arch], launch
        assert smem + lim["reserved_smem_per_block"] <= lim["smem_per_sm"], launch  # >= 1 CTA per SM
        if compiled is not None:
            regs, _ = compiled[(arch, launch["kernel"])]
            per_thread = -(-regs // 8) * 8  # registers are allocated 8 per thread at a time
            assert per_thread * launch["block"] <= lim["regs_per_block"], (launch, regs)


def plan(kernel, arch, **sizes):
    return _C.launch_plan(kernel, sizes, arch)


def served(p):
    return p["refusal"] is None


# ---------------------------------------------------------------------------------- the limit tables
def test_limit_tables_are_the_published_ones():
    for arch in ARCHS:
        lim = _C.launch_limits(arch)
        assert lim["smem_per_block"] == NO_OPT_IN and lim["smem_per_block_optin"] == OPT_IN_MAX[arch]
        assert lim["grid_x"] == GRID_X and lim["grid_yz"] == GRID_YZ and lim["threads_per_block"] == 1024
        assert lim["regs_per_block"] == 65536
    with pytest.raises(ValueError, match="arch must be 80 or 90"):
        _C.launch_limits(75)
    with pytest.raises(ValueError, match="kernel must be one of"):
        _C.launch_plan("nope", {}, 90)
    with pytest.raises(ValueError, match="sizes needs 'V'"):
        _C.launch_plan("greedy_verify", {"B": 1, "G": 1}, 90)


# One small plan per kernel family: the static shared memory mirrored in launch_plan.h.
SAMPLES = [
    ("greedy_verify", dict(B=2, G=3, V=32000)),
    ("logit_verify", dict(B=2, G=3, V=32000)),
    ("max_prob", dict(R=4, V=32000)),
    ("tree_greedy_verify", dict(B=2, N=7, V=32000)),
    ("rejection_sample", dict(B=2, G=3, V=32000)),
    ("tree_rejection_sample", dict(B=2, N=7, V=32000)),  # sm_80: the split form, sm_90: the cluster form
    ("tree_rejection_sample", dict(B=2, N=7, V=32000, form=1)),  # the split form on sm_90 too
    ("rejection_sample_logits", dict(B=2, G=3, V=32000)),
    ("block_verify", dict(B=2, G=3, V=32000)),
    ("block_verify_logits", dict(B=2, G=3, V=32000)),
    ("kv_compact", dict(B=2, L=4, Hkv=8, S_max=64, D=128, elem_size=2, vector_bytes=16)),
    ("early_exit_topk", dict(B=2, H=512, V=32000, k=4)),
    ("early_exit_topk", dict(B=2, H=512, V=32000, k=4, dtype=BFLOAT16)),  # the tensor-core path
    ("tree_attention", dict(B=2, N=8, Hq=8, Hkv=2, D=128, capacity=512, dtype=BFLOAT16)),
    ("tree_attention", dict(B=2, N=8, Hq=8, Hkv=2, D=96, capacity=512, dtype=FLOAT32)),
]


SM90_ONLY = {"tree_rejection_cluster_kernel"}  # thread-block clusters: its body is built for sm_90 only


def test_every_kernel_has_a_plan():
    assert set(_C.launch_plan_kernels()) == {name for name, _ in SAMPLES}


@pytest.mark.parametrize("arch", ARCHS)
def test_static_shared_memory_mirrors_the_compiled_kernels(compiled, arch):
    """launch_plan.h's static shared memory of each kernel is what the compiler laid out:
    a __shared__ declaration added to a kernel without updating the mirror fails here."""
    kernels = set()
    for name, sizes in SAMPLES:
        for launch in plan(name, arch, **sizes)["launches"]:
            kernels.add(launch["kernel"])
            assert static_smem_seen(compiled, arch, launch["kernel"]) == {launch["static_smem"]}, launch
    families = {family for (a, family) in compiled if a == arch}
    if arch < 90:  # sm_90-only kernels are empty stubs below sm_90, never planned there
        assert all(compiled[(arch, f)] == (compiled[(arch, f)][0], {0}) for f in SM90_ONLY)
        families -= SM90_ONLY
    assert families == kernels  # every launched kernel has a plan


# ---------------------------------------------------------------------------------- chain / tree verifies
BATCH = st.integers(0, 10**6)
VOCAB = st.one_of(st.integers(1, 2**20), st.integers(2**20, 2**31 + 5))


@SETTINGS
@given(arch=st.sampled_from(ARCHS), kernel=st.sampled_from(["greedy_verify", "logit_verify"]), B=BATCH,
       G=st.integers(0, 70000), V=VOCAB)
@example(arch=90, kernel="greedy_verify", B=65536, G=4, V=32000)
@example(arch=80, kernel="logit_verify", B=10**6, G=0, V=151936)
def test_chain_verify_plans(compiled, arch, kernel, B, G, V):
    p = plan(kernel, arch, B=B, G=G, V=V)
    assert_fits(p, arch, compiled)
    # finding 7: B rides in grid x, so any batch is served; only G + 1 > 65535 (grid y) or a
    # V without a free "no element" index are refused
    assert served(p) == (G + 1 <= GRID_YZ and V < 2**31 - 1), p
    if served(p) and B:
        assert p["launches"][0]["grid"] == (B, G + 1, p["splits"])
        assert (p["splits"] - 1) * p["chunk"] < V <= p["splits"] * p["chunk"]  # every CTA owns elements


@SETTINGS
@given(arch=st.sampled_from(ARCHS), B=BATCH, N=st.integers(1, 70000), V=VOCAB)
@example(arch=90, B=100000, N=64, V=32000)
def test_tree_greedy_verify_plans(compiled, arch, B, N, V):
    p = plan("tree_greedy_verify", arch, B=B, N=N, V=V)
    assert_fits(p, arch, compiled)
    assert served(p) == (N <= GRID_YZ and V < 2**31 - 1), p


@SETTINGS
@given(arch=st.sampled_from(ARCHS), R=st.integers(0, 2**33), V=VOCAB)
def test_max_prob_plans(compiled, arch, R, V):
    p = plan("max_prob", arch, R=R, V=V)
    assert_fits(p, arch, compiled)
    if served(p) and R:
        assert p["launches"][0]["grid"][0] == R * p["splits"]  # one CTA per (row, split) in grid x
    sms = _C.launch_limits(arch)["sms"]
    if V < 2**31 - 1 and R * 4 * sms <= GRID_X:  # splits <= 4 per SM
        assert served(p), p
    if R > GRID_X or V >= 2**31 - 1:
        assert not served(p), p


MAX_CHUNK = 8192  # launch_plan.h kSamplingMaxChunk: the most elements a sampling kernel's last block rescans


def assert_residency(compiled, arch, p):
    """The sampling kernel's registers let `ctas_per_sm` CTAs share an SM: the residency its split
    plan fills in one wave (at 80 registers rejection_sample fit 3 of the 4 it planned)."""
    lim = _C.launch_limits(arch)
    launch = p["launches"][-1]
    regs, _ = compiled[(arch, launch["kernel"])]
    per_thread = -(-regs // 8) * 8
    assert per_thread * launch["block"] * p["ctas_per_sm"] <= lim["regs_per_sm"], (launch, regs, p["ctas_per_sm"])


@SETTINGS
@given(arch=st.sampled_from(ARCHS), kernel=st.sampled_from(["rejection_sample", "rejection_sample_logits"]),
       B=BATCH, G=st.integers(0, 2**20 + 2), V=st.integers(1, 2**23 + 2))
@example(arch=90, kernel="rejection_sample", B=70000, G=4, V=151936)
@example(arch=80, kernel="rejection_sample_logits", B=70000, G=32767, V=2**23 - 1)
@example(arch=80, kernel="rejection_sample_logits", B=3, G=32768, V=100)
def test_rejection_sample_plans(compiled, arch, kernel, B, G, V):
    p = plan(kernel, arch, B=B, G=G, V=V)
    assert_fits(p, arch, compiled)
    # the logits op's statistics launch has a CTA row per target and draft row in grid y
    rows_ok = 2 * G + 1 <= GRID_YZ if kernel == "rejection_sample_logits" else True
    assert served(p) == (G <= 2**20 and rows_ok and V < 2**23), p
    if served(p) and B:
        assert 1 <= p["splits"] <= p["ws_stride"]  # the workspace holds every split
        assert (p["splits"] - 1) * p["chunk"] < V <= p["splits"] * p["chunk"] and p["chunk"] <= MAX_CHUNK
        assert p["launches"][-1]["grid"] == (B, p["splits"], 1)
        assert_residency(compiled, arch, p)
        if kernel == "rejection_sample_logits":  # statistics, then sampling: two launches
            assert [launch["kernel"] for launch in p["launches"]] == ["softmax_stats_kernel",
                                                                     "rejection_sample_logits_kernel"]
            assert p["launches"][0]["grid"] == (B, 2 * G + 1, p["stats_splits"])
            assert 1 <= p["stats_splits"] <= p["stats_stride"]
            assert p["workspace_bytes"] == _C.rejection_sample_logits_workspace_bytes(B, G, V)


@SETTINGS
@given(arch=st.sampled_from(ARCHS), kernel=st.sampled_from(["block_verify", "block_verify_logits"]),
       B=BATCH, G=st.integers(0, 70000), V=st.integers(1, 2**23 + 2))
@example(arch=90, kernel="block_verify", B=70000, G=4, V=151936)
@example(arch=90, kernel="block_verify", B=64, G=4, V=128256)  # was one 64K-element chunk per CTA
@example(arch=80, kernel="block_verify_logits", B=1, G=32767, V=2**23 - 1)
def test_block_verify_plans(compiled, arch, kernel, B, G, V):
    p = plan(kernel, arch, B=B, G=G, V=V)
    assert_fits(p, arch, compiled)
    rows = G + 1 if kernel == "block_verify" else 2 * G + 1  # grid y of the widest launch
    assert served(p) == (rows <= GRID_YZ and V < 2**23), p
    if served(p) and B:
        # the workspace holds every split: 64 slots, or more where 8192-element chunks need them
        assert 1 <= p["splits"] <= p["ws_stride"] <= max(64, -(-V // MAX_CHUNK))
        assert p["launches"][-1]["grid"] == (B, G + 1, p["splits"])
        assert (p["splits"] - 1) * p["chunk"] < V <= p["splits"] * p["chunk"]  # every CTA owns elements
        assert p["chunk"] <= MAX_CHUNK  # the last block's rescan is one small chunk at any B
        assert_residency(compiled, arch, p)
        if kernel == "block_verify_logits":
            assert p["launches"][0]["kernel"] == "softmax_stats_kernel"


# ---------------------------------------------------------------------------------- kv_compact
@SETTINGS
@given(arch=st.sampled_from(ARCHS), B=BATCH, L=st.integers(0, 40000), Hkv=st.integers(0, 128),
       S_max=st.integers(0, 2**20), D=st.integers(0, 512), elem_size=st.sampled_from([2, 4]),
       vector_bytes=st.sampled_from([2, 4, 8, 16]))
@example(arch=80, B=1, L=0, Hkv=65, S_max=0, D=1, elem_size=2, vector_bytes=2)  # found by CI: a 24-thread block
def test_kv_compact_plans(compiled, arch, B, L, Hkv, S_max, D, elem_size, vector_bytes):
    if (D * elem_size) % vector_bytes:
        vector_bytes = 2
    p = plan("kv_compact", arch, B=B, L=L, Hkv=Hkv, S_max=S_max, D=D, elem_size=elem_size, vector_bytes=vector_bytes)
    assert_fits(p, arch, compiled)
    layers = L if Hkv and S_max and D else 0
    if 2 * layers <= GRID_YZ and B * Hkv * D <= 2**31 // 8:
        assert served(p), p


# ---------------------------------------------------------------------------------- early_exit_topk
def early_exit_servable(arch, H):
    """One normalised row (4H bytes) next to the static kept sets within the opt-in maximum."""
    return EARLY_EXIT_STATIC + 4 * H <= OPT_IN_MAX[arch]


@SETTINGS
@given(arch=st.sampled_from(ARCHS), B=st.integers(0, 10**6), H=st.integers(1, 65536), V=st.integers(16, 2**20),
       k=st.integers(1, 16))
@example(arch=80, B=7, H=16384, V=151936, k=8)
@example(arch=90, B=8, H=8192, V=32000, k=16)
def test_early_exit_topk_plans(compiled, arch, B, H, V, k):
    p = plan("early_exit_topk", arch, B=B, H=H, V=V, k=k)
    assert_fits(p, arch, compiled)
    # finding 2: fewer rows per CTA when 8 do not fit, so every H one row fits is served
    assert served(p) == early_exit_servable(arch, H), p
    if served(p) and B:
        split = p["launches"][0]
        rows = p["rows_per_cta"]
        assert 1 <= rows <= min(B, 8) and split["dynamic_smem"] == 4 * H * rows
        assert split["grid"][0] * rows >= B > (split["grid"][0] - 1) * rows  # the row groups cover B
        assert p["workspace_bytes"] == 8 * B * p["splits"] * k


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("B, H", [(3, 4096), (4, 3072), (8, 1536), (64, 1536), (1, 10240), (2, 5120), (7, 6976),
                                  (7, 6977), (8, 8192), (16, 16384), (1, 12288), (3, 2048)])
def test_early_exit_topk_counts_the_static_kept_sets(compiled, arch, B, H):
    """Dynamic rows in (40 KiB, 48 KiB] plus the 8 KiB static kept sets need the opt-in."""
    p = plan("early_exit_topk", arch, B=B, H=H, V=151936, k=8)
    assert_fits(p, arch, compiled)
    assert served(p)
    split = p["launches"][0]
    assert split["static_smem"] == EARLY_EXIT_STATIC
    assert split["opt_in"] == (EARLY_EXIT_STATIC + split["dynamic_smem"] > NO_OPT_IN)


@SETTINGS
@given(arch=st.sampled_from(ARCHS), B=st.integers(0, 10**5), H=st.integers(1, 2**17).map(lambda h: 8 * h),
       V=st.integers(16, 2**20), k=st.integers(1, 16), dtype=st.sampled_from([FLOAT16, BFLOAT16]))
@example(arch=90, B=64, H=4096, V=128256, k=16, dtype=BFLOAT16)
@example(arch=80, B=8, H=4096, V=128256, k=16, dtype=FLOAT16)
@example(arch=90, B=1, H=65536, V=151936, k=8, dtype=BFLOAT16)
def test_early_exit_topk_tensor_core_plans(compiled, arch, B, H, V, k, dtype):
    """fp16/bf16 with H % 8 == 0: normalize (B), mma (column groups, splits), merge (B), every H
    served (k-blocks of hn staged when all of H does not fit), splits in whole vocabulary tiles."""
    p = plan("early_exit_topk", arch, B=B, H=H, V=V, k=k, dtype=dtype)
    assert_fits(p, arch, compiled)
    assert served(p), p
    if not B:
        return
    assert [l["kernel"] for l in p["launches"]] == ["early_exit_normalize_kernel", "early_exit_mma_kernel",
                                                    "early_exit_merge_kernel"]
    norm, mma, merge = p["launches"]
    nt = p["n_tiles"]
    bn = 8 * nt
    assert nt == min(t for t in (1, 2, 4, 8) if 8 * t >= min(B, 64))  # B <= 8: one n-tile, no padded columns read
    assert mma["grid"][0] == -(-B // bn) and norm["grid"][0] == B == merge["grid"][0]
    tile = 128 * (2 if nt >= 4 else 1)
    assert p["per_split"] % tile == 0 and (p["splits"] - 1) * p["per_split"] < V <= p["splits"] * p["per_split"]
    hs = -(-H // 32) * 32
    kb = p["k_block"]
    assert p["hn_stride"] == hs and kb % 32 == 0 and 32 <= kb <= hs
    stride = kb + 32 if kb % 64 == 0 else kb
    assert mma["dynamic_smem"] == 8 * bn * (k + 1) * 8 + 4 * bn * stride
    if H <= 4096 and nt == 1:
        assert kb == hs  # the hidden state stays resident: one staging per CTA
    assert p["hn_offset"] % 16 == 0 and p["hn_offset"] >= 8 * B * p["splits"] * k
    assert p["workspace_bytes"] == p["hn_offset"] + 4 * p["hn_rows"] * hs and p["hn_rows"] == mma["grid"][0] * bn
    # float32, an H that is not a multiple of 8 or an unaligned LM head: the SIMT kernel
    for other in (dict(dtype=FLOAT32), dict(dtype=dtype, aligned=0)):
        q = plan("early_exit_topk", arch, B=B, H=H, V=V, k=k, **other)
        assert "mma" not in q and (not served(q) or q["launches"][0]["kernel"] == "early_exit_split_kernel")
    q = plan("early_exit_topk", arch, B=B, H=H + 3, V=V, k=k, dtype=dtype)
    assert "mma" not in q


# ---------------------------------------------------------------------------------- tree_attention
@SETTINGS
@given(arch=st.sampled_from(ARCHS), B=st.integers(0, 10**5), N=st.integers(1, 1024), Hkv=st.sampled_from([1, 2, 4, 8, 32]),
       group=st.sampled_from([1, 2, 4, 7, 8]), D=st.one_of(st.sampled_from([64, 128, 256, 257]), st.integers(1, 300)),
       extra=st.one_of(st.integers(0, 2**16), st.integers(0, 2**31)), dtype=st.sampled_from([FLOAT32, FLOAT16, BFLOAT16]))
@example(arch=90, B=1, N=8, Hkv=8, group=4, D=64, extra=2048, dtype=FLOAT16)
@example(arch=80, B=4, N=64, Hkv=8, group=4, D=64, extra=4096, dtype=BFLOAT16)
def test_tree_attention_plans(compiled, arch, B, N, Hkv, group, D, extra, dtype):
    capacity = N + extra
    p = plan("tree_attention", arch, B=B, N=N, Hq=Hkv * group, Hkv=Hkv, D=D, capacity=capacity, dtype=dtype)
    assert_fits(p, arch, compiled)
    if D <= 256 and capacity < 2**31 - 64 and B * Hkv * N * group <= 2**30:
        assert served(p), p
    if D > 256:
        assert not served(p)
    if served(p) and B:
        launch = p["launches"][0]
        mma = dtype != FLOAT32 and D in (64, 128)
        assert launch["kernel"] == ("tree_attention_mma_kernel" if mma else "tree_attention_simt_kernel")
        assert launch["grid"][0] == B * Hkv * p["splits"] * p["m_tiles"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16])
@pytest.mark.parametrize("rows", [8, 64, 65, 512])
def test_tree_attention_d64_opts_in(compiled, arch, dtype, rows):
    """finding 1: 48 KiB of K/V stages + 128 B static is past 48 KiB: the MMA kernel must opt in."""
    p = plan("tree_attention", arch, B=2, N=rows, Hq=8, Hkv=8, D=64, capacity=4096, dtype=dtype)
    assert_fits(p, arch, compiled)
    launch = p["launches"][0]
    assert launch["dynamic_smem"] == NO_OPT_IN and launch["static_smem"] == 128 and launch["opt_in"]


@SETTINGS
@given(arch=st.sampled_from(ARCHS), B=BATCH, N=st.integers(1, 2**29 + 2), V=st.integers(1, 2**23 + 2),
       form=st.sampled_from([0, 1, 2]))
@example(arch=90, B=1, N=8, V=128256, form=0)
@example(arch=80, B=64, N=16, V=128256, form=0)
@example(arch=90, B=3, N=4, V=2**23 - 1, form=0)
@example(arch=90, B=64, N=16, V=128256, form=1)
@example(arch=90, B=10**6, N=16, V=262144, form=2)
def test_tree_rejection_sample_plans(compiled, arch, B, N, V, form):
    """Split form, grid (B, chunks): every CTA of a row owns ids of each pass, the chunks' sums fit the 128
    slots of the scratch, a row's ticket words fill a 128-byte line. Cluster form (sm_90 only; auto picks it
    there when the slices of a cluster of at most 16 CTAs cover V and the B clusters fit on the device at once:
    past one wave the split form runs), grid (B * C) in clusters of C <= 16: the slices cover V exactly, scratch
    of state and rank table only, no zeroed words. Both: the kernel's registers give the planned CTAs per SM,
    the buffers never grow with V, a tree of <= 256 nodes is copied into 16 bytes a node of dynamic shared
    memory."""
    p = plan("tree_rejection_sample", arch, B=B, N=N, V=V, form=form)
    assert_fits(p, arch, compiled)
    wave = 3 * _C.launch_limits(arch)["sms"]
    fewest = -(-V // 16384)  # the fewest CTAs whose slices cover V
    cluster_fits = arch == 90 and fewest <= 16 and B * fewest <= wave
    assert served(p) == (V < 2**23 and N < 2**29 and (form != 2 or cluster_fits)), p
    if not served(p):
        return
    cluster = form != 1 and cluster_fits
    assert p["form"] == (2 if cluster else 1)
    if cluster:
        assert p["scratch_bytes"] == B * (8 + 2 * N) * 8 and p["zeroed_bytes"] == 0
    else:
        assert p["scratch_bytes"] == B * (8 + 2 * N + 128 * 3) * 8 and p["zeroed_bytes"] == B * 128
    if B:
        assert_residency(compiled, arch, p)
        assert p["chunk"] % 8 == 0 and (p["chunks"] - 1) * p["chunk"] < V <= p["chunks"] * p["chunk"]
        assert p["launches"][0]["dynamic_smem"] == (16 * N if N <= 256 else 0) and p["tree_in_smem"] == (N <= 256)
    if B and cluster:
        assert 1 <= p["cluster"] == p["chunks"] <= 16 and p["portable"] == (p["cluster"] <= 8)
        assert B * p["cluster"] <= wave  # every row's cluster on the device at once: no second round
        one_wave = B * -(-V // MAX_CHUNK) <= wave  # short slices while rows fit a wave
        assert p["chunk"] <= (MAX_CHUNK if V <= 16 * MAX_CHUNK and one_wave else 16384)
        assert p["launches"][0]["grid"] == (B * p["cluster"], 1, 1)
        assert p["launches"][0]["kernel"] == "tree_rejection_cluster_kernel"
    elif B:
        assert 1 <= p["chunks"] <= 128 and p["cluster"] == 0
        assert p["chunk"] <= max(MAX_CHUNK, -(-V // 128 // 8) * 8)  # past V = 2^20 the 128 slots set the chunk
        assert p["launches"][0]["grid"] == (B, p["chunks"], 1)


def test_the_cluster_form_leaves_the_split_form_past_one_wave():
    """B = 64 at V = 128256 took 8-CTA clusters (512 CTAs against 396 slots on an H100): two rounds of rows,
    each waiting on its own CTAs. Now one wave or the split form."""
    assert plan("tree_rejection_sample", 90, B=64, N=16, V=128256)["form"] == 1
    assert plan("tree_rejection_sample", 90, B=49, N=16, V=128256)["cluster"] == 8  # 49 x 8 = 392 <= 396
    refused = plan("tree_rejection_sample", 90, B=64, N=16, V=128256, form=2)["refusal"]
    assert "do not fit one wave" in refused


def facts(arch, **changes):
    """The nominal cluster facts of `arch`, changed: code_arch=..., or active=[...] (sizes 0..16)."""
    return {**_C.nominal_cluster_facts(arch), **changes}


def test_a_cluster_the_device_cannot_schedule_falls_back():
    """MIG, MPS and green contexts shrink what a GPC holds: a refused cluster size is a smaller cluster or the
    split form, never a launch error (the launcher asks cudaOccupancyMaxActiveClusters once per device)."""
    nominal = facts(90)["active"]
    eight = [n if c <= 8 else 0 for c, n in enumerate(nominal)]  # no non-portable sizes
    p = plan("tree_rejection_sample", 90, B=1, N=8, V=32000, **facts(90, active=eight))
    assert p["form"] == 2 and p["cluster"] <= 8
    wide = plan("tree_rejection_sample", 90, B=1, N=8, V=200000, **facts(90, active=eight))  # needs 13 of 16384
    assert wide["form"] == 1
    none = plan("tree_rejection_sample", 90, B=1, N=8, V=32000, **facts(90, active=[0] * 17))
    assert none["form"] == 1 and "cannot" not in str(none["refusal"])
    forced = plan("tree_rejection_sample", 90, B=1, N=8, V=32000, form=2, **facts(90, active=[0] * 17))
    assert forced["refusal"] and "cluster" in forced["refusal"]
    two = [min(n, 2) for n in nominal]  # two clusters at once: B = 3 rows take the split form
    assert plan("tree_rejection_sample", 90, B=2, N=8, V=32000, **facts(90, active=two))["form"] == 2
    assert plan("tree_rejection_sample", 90, B=3, N=8, V=32000, **facts(90, active=two))["form"] == 1


# Device capability x the archs `_C` was built for (setup.py: SASS of each, PTX of the highest).
BUILDS = (["80"], ["90"], ["80", "90"], ["86"], ["90a"], ["80", "90", "100"], ["80", "86", "89"])
CAPABILITIES = (80, 86, 89, 90, 100, 120)


def test_the_code_a_device_runs_from_a_build():
    runs = _C.runnable_code_arch
    assert runs(90, ["80", "90"]) == 90 and runs(80, ["80", "90"]) == 80 and runs(86, ["80", "90"]) == 80
    assert runs(90, ["80"]) == 80  # SPECDEC_CUDA_ARCHS=80 on an H100: sm_80 PTX, JIT-compiled
    assert runs(100, ["80", "90"]) == 90 and runs(120, ["80", "90"]) == 90  # the PTX of sm_90
    assert runs(80, ["90"]) == 0 and runs(89, ["90"]) == 0  # nothing this device can run
    assert runs(90, ["90a"]) == 90 and runs(100, ["90a"]) == 0  # arch-specific code runs on its arch alone
    assert runs(89, ["80", "86", "89"]) == 89 and runs(90, ["80", "86", "89"]) == 89


@pytest.mark.parametrize("built", BUILDS, ids=";".join)
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_no_device_and_build_launches_the_cluster_stub(compiled, capability, built):
    """Over device capability x built archs, no plan launches the cluster kernel where the device runs code
    below sm_90 (there it is a stub that traps: the compiled sm_80 kernel holds no work, see below); and a
    device running sm_90 code does take the cluster form where it fits."""
    code = _C.runnable_code_arch(capability, built)
    table = 90 if capability >= 90 else 80  # the limits: the published table of its generation
    for B, V in ((1, 1000), (1, 128256), (4, 32000), (64, 128256), (1, 262144)):
        for form in (0, 2):
            p = plan("tree_rejection_sample", table, B=B, N=8, V=V, form=form, **facts(table, code_arch=code))
            kernels = [launch["kernel"] for launch in p["launches"]]
            if code < 90:
                assert "tree_rejection_cluster_kernel" not in kernels, (capability, built, B, V, form)
                assert form == 0 or p["refusal"], p
            elif table == 90 and (B, V) in ((1, 1000), (1, 128256), (4, 32000)):
                assert kernels == ["tree_rejection_cluster_kernel"], (capability, built, B, V, form)
    # the stub the plans avoid: compiled below sm_90 the cluster kernel is a handful of registers, no shared
    # memory, and traps (cuobjdump -sass shows its BPT.TRAP)
    regs, shared = compiled[(80, "tree_rejection_cluster_kernel")]
    assert regs <= 8 and shared == {0}


def test_the_cluster_stub_traps():
    triton = pytest.importorskip("triton")
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("no cuobjdump in this triton install")
    sass = subprocess.run([tool, "-sass", "-arch", "sm_80", _C.__file__], capture_output=True, text=True).stdout
    bodies = re.split(r"\n\s*Function : ", sass)
    stubs = [body for body in bodies if "tree_rejection_cluster_kernel" in body.split("\n", 1)[0]]
    assert len(stubs) == 6, len(stubs)  # float, half, bfloat16 x both sibling rules
    assert all("BPT.TRAP" in body for body in stubs)


# ---------------------------------------------------------------------------------- routing
@pytest.fixture(params=ARCHS)
def pretend_gpu(request, monkeypatch):
    """resolve() on a pretend GPU of one arch: the CUDA limits plan on that arch's table."""
    from specdec_kernels.cuda import _launch

    monkeypatch.setattr(registry._cuda_module, "load", lambda: _C)
    monkeypatch.setattr(registry, "triton_importable", lambda: True)
    monkeypatch.setattr(_launch, "device_plan", lambda kernel, sizes: _C.launch_plan(kernel, sizes, request.param))
    return request.param


GPU = torch.device("cuda")  # resolve() only reads the device type
# (op, sizes as the op passes them, served?) for each CUDA backend
ROUTES = [
    ("greedy_verify", dict(B=10**6, G=4, V=32000, dtype=torch.float16), True),
    ("greedy_verify", dict(B=2, G=65535, V=32000, dtype=torch.float16), False),
    ("relaxed_verify", dict(B=70000, G=4, V=32000, dtype=torch.bfloat16), True),
    ("bild_verify", dict(B=2, G=4, V=2**31, dtype=torch.float32), False),
    ("max_prob", dict(R=2**31, V=32000, dtype=torch.float32), False),
    ("max_prob", dict(R=8, V=32000, dtype=torch.float32), True),
    ("tree_greedy_verify", dict(B=10**5, N=64, V=32000, depth=8, dtype=torch.float16), True),
    ("tree_greedy_verify", dict(B=1, N=70000, V=32000, depth=8, dtype=torch.float16), False),
    ("rejection_sample", dict(B=10**5, G=4, V=32000, dtype=torch.float32), True),
    ("rejection_sample", dict(B=1, G=4, V=2**23, dtype=torch.float32), False),
    ("rejection_sample_logits", dict(B=1, G=2048, V=32000, dtype=torch.float32), True),
    ("rejection_sample_logits", dict(B=1, G=32768, V=32000, dtype=torch.float32), False),  # 2G + 1 > grid y
    ("block_verify", dict(B=10**5, G=4, V=151936, dtype=torch.bfloat16), True),
    ("block_verify", dict(B=1, G=4, V=2**23, dtype=torch.float32), False),
    ("block_verify_logits", dict(B=2, G=4, V=151936, dtype=torch.float16), True),
    ("block_verify_logits", dict(B=1, G=40000, V=32000, dtype=torch.float32), False),
    ("tree_rejection_sample", dict(B=1, N=8, V=2**23, depth=4, dtype=torch.float32), False),
    ("tree_rejection_sample", dict(B=10**5, N=8, V=151936, depth=4, dtype=torch.bfloat16), True),
    ("early_exit_topk", dict(B=8, H=16384, V=151936, k=8, dtype=torch.bfloat16), True),
    ("early_exit_topk", dict(B=1, H=60000, V=151936, k=8, dtype=torch.bfloat16), True),  # tensor-core k-blocks
    ("early_exit_topk", dict(B=1, H=60000, V=151936, k=8, dtype=torch.float32), False),  # one SIMT row too big
    ("early_exit_topk", dict(B=1, H=60001, V=151936, k=8, dtype=torch.bfloat16), False),  # H % 8: SIMT
    ("early_exit_topk", dict(B=1, H=60000, V=151936, k=32, dtype=torch.bfloat16), True),  # k > 16: the op's torch path
    ("tree_attention", dict(B=2, N=8, Hq=8, Hkv=8, D=64, capacity=4096, paged=False, dtype=torch.float16), True),
    ("tree_attention", dict(B=2, N=8, Hq=8, Hkv=8, D=512, capacity=4096, paged=True, dtype=torch.float16), False),
    ("kv_compact", dict(B=4, M=8, L=32, dtype=torch.bfloat16, Hkv=8, S_max=4096, D=128), True),
    ("kv_compact", dict(B=4, M=8, L=40000, dtype=torch.bfloat16, Hkv=8, S_max=4096, D=128), False),
    ("kv_compact", dict(B=4, M=8, L=0, dtype=None), True),
]


@pytest.mark.parametrize("op, sizes, ok", ROUTES, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROUTES)])
def test_auto_routes_a_refused_shape_elsewhere(pretend_gpu, op, sizes, ok):
    import specdec_kernels.ops  # noqa: F401  (registers every backend)

    chosen = registry.resolve(op, "auto", GPU, sizes=sizes)
    order = auto_order(op, sizes)  # the kernel backends the GPU measurements rank for this op and batch
    if ok:
        assert registry.resolve(op, "cuda", GPU, sizes=sizes) == "cuda"
        assert chosen == next((b for b in order if registry.refusal(op, b, sizes) is None), "torch")
    else:
        assert chosen != "cuda" and chosen in (*order, "torch")
        with pytest.raises(ValueError, match="the 'cuda' backend cannot serve this call"):
            registry.resolve(op, "cuda", GPU, sizes=sizes)


def test_every_cuda_backend_has_limits():
    import specdec_kernels.ops  # noqa: F401

    cuda_ops = {op for op in registry.registered_ops() if "cuda" in registry.implemented_backends(op)}
    assert cuda_ops == {op for op, backend in registry._LIMITS if backend == "cuda"}


# ---------------------------------------------------------------------------------- on a GPU
# The plans above are what the launchers launch; these run the shapes of findings 1, 2 and 7
# through the kernels (skipped without CUDA).
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_limits_are_the_devices():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    lim = _C.device_launch_limits()
    assert lim["sms"] == props.multi_processor_count
    assert lim["smem_per_block"] == NO_OPT_IN
    if lim["arch"] in ARCHS:
        assert lim["smem_per_block_optin"] == OPT_IN_MAX[lim["arch"]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tree_attention_d64_runs(dtype):
    from specdec_kernels import ops

    gen = torch.Generator(device="cuda").manual_seed(1)
    B, N, Hq, Hkv, D, S = 2, 8, 8, 2, 64, 256
    q = torch.randn(B, N, Hq, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=gen)
    seq_lens = torch.tensor([100, 7], device="cuda")
    out, lse = ops.tree_attention(q, k, v, seq_lens, backend="cuda")
    want_out, want_lse = ops.tree_attention(q, k, v, seq_lens, backend="torch")
    torch.testing.assert_close(out.float(), want_out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, want_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B, H", [(3, 4096), (4, 3072), (8, 1536), (7, 8192), (8, 16384)])
def test_early_exit_topk_runs_wide_hidden_sizes_at_batch_7_and_above(B, H):
    from specdec_kernels import ops

    gen = torch.Generator(device="cuda").manual_seed(B * H)
    hidden = torch.randn(B, H, device="cuda", generator=gen)
    weight = torch.randn(H, device="cuda", generator=gen)
    lm_head = torch.randn(4096, H, device="cuda", generator=gen) / H**0.5
    values, ids = ops.early_exit_topk(hidden, weight, lm_head, 8, backend="cuda")
    want_values, want_ids = ops.early_exit_topk(hidden, weight, lm_head, 8, backend="torch")
    torch.testing.assert_close(values, want_values, rtol=1e-4, atol=1e-4)
    assert (ids == want_ids).float().mean() > 0.99  # near-ties may swap under another summation order


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_verifies_take_more_than_65535_rows():
    from specdec_kernels import ops

    gen = torch.Generator(device="cuda").manual_seed(7)
    B, G, V = 70000, 2, 64
    logits = torch.randn(B, G + 1, V, device="cuda", generator=gen)
    draft = torch.randint(0, V, (B, G), device="cuda", generator=gen)
    draft[::3] = logits[::3, :G].argmax(-1)  # some rows accept
    relaxed = functools.partial(ops.relaxed_verify, top_beta=2, tau=0.5)
    for op in (ops.greedy_verify, relaxed):
        got = op(logits, draft, backend="cuda")
        want = op(logits, draft, backend="torch")
        assert all(torch.equal(a, b) for a, b in zip(got, want)), op
    parents = torch.arange(-1, G, device="cuda").expand(B, G + 1).contiguous()
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.int64, device="cuda"), draft], 1)
    got = ops.tree_greedy_verify(logits, tokens, parents, backend="cuda")
    want = ops.tree_greedy_verify(logits, tokens, parents, backend="torch")
    assert all(torch.equal(a, b) for a, b in zip(got, want))
