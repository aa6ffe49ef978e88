"""The Triton kv_compact backend against the torch reference, bit for bit (it is a copy).

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_kv_cache.py, the "tiny"
tier, judged as `specdec-kernels selftest` judges them): every cache layout (one allocation
[L, B, Hkv, S, D], K and V interleaved [L, 2, ...], a permuted NHD view: the no-table fast path;
separate tensors with mixed strides: the device-table path) and dtype, random accepted paths,
chains / root-only / empty rows that move nothing, M = 0 and 1, no layers, int32 lengths,
misaligned views and evenly spaced layers. Each case compares whole cache tensors, so a slot the
reference leaves alone must be left alone by the kernel too. What the catalog cannot express
stays here: which layouts take the table, the launch plan (forced tiles), unvalidated rows,
aliasing, and the generated PTX.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from catalog_support import catalog_cases, check_case

from specdec_kernels import ops
from specdec_kernels.common import kv_layout as _kv_layout
from specdec_kernels.selftest import cases_kv_cache
from specdec_kernels.triton import kv_cache as triton_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("kv_compact",)))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


def _tiny_case(name_part):
    return next(c for c in cases_kv_cache.kv_cases("tiny", torch.device("cpu")) if name_part in c.name)


@pytest.mark.parametrize("layout", ["stacked", "kv_interleaved", "nhd", "mixed_strides"])
def test_which_layouts_need_a_table(layout):
    """One allocation with a constant layer step needs no table; per-cache strides that differ do."""
    k, v, _ = cases_kv_cache.make_caches(layout, 3, 4, 2, 17, 16, torch.bfloat16, "cpu",
                                         torch.Generator().manual_seed(0))
    assert (_kv_layout.cache_layout(k, v).table is None) == (layout != "mixed_strides")


def test_misaligned_and_evenly_spaced_cases_take_the_intended_paths():
    """The catalog's misaligned views get narrow accesses and no table; its evenly spaced layers need
    no table (16-byte rows), while an uneven spacing does."""
    for dtype in (torch.float16, torch.float32):
        x = next(c for c in cases_kv_cache.kv_cases("tiny", torch.device("cpu"))
                 if c.name.startswith("misaligned") and c.dtype == dtype).build(0)
        layout = _kv_layout.cache_layout(x["k_caches"], x["v_caches"])
        assert layout.table is None and layout.vector_bytes == x["owners"][0].element_size()
    x = _tiny_case("evenly spaced").build(0)
    block = x["owners"][0]
    layout = _kv_layout.cache_layout(x["k_caches"], x["v_caches"])
    assert layout.table is None and layout.k_step == 2 * block[0].numel() and layout.v_step == -2 * block[0].numel()
    assert layout.vector_bytes == 16
    assert _kv_layout.cache_layout([*x["k_caches"], block[3]], [block[1], block[4], block[0]]).table is not None


# ------------------------------------------------------------------ helpers of the tests below

def accepted_from(paths: list[list[int]], m: int) -> torch.Tensor:
    return torch.tensor([path + [-1] * (m - len(path)) for path in paths], dtype=torch.int64)


def make_caches(layout, layers, batch, heads, seq, dim, dtype, gen):
    return cases_kv_cache.make_caches(layout, layers, batch, heads, seq, dim, dtype, "cpu", gen)


def run_both(k_caches, v_caches, seq_lens, accepted):
    """Triton on the caches in place, the reference on clones; both results must agree bit for bit."""
    ref_k = [c.clone() for c in k_caches]
    ref_v = [c.clone() for c in v_caches]
    want = ops.kv_compact(ref_k, ref_v, seq_lens, accepted, backend="torch")
    got = ops.kv_compact(k_caches, v_caches, seq_lens, accepted, backend="triton")
    assert got.dtype == seq_lens.dtype and torch.equal(got, want), (got, want)
    for name, caches, refs in (("k", k_caches, ref_k), ("v", v_caches, ref_v)):
        for layer, (c, r) in enumerate(zip(caches, refs)):
            assert torch.equal(c, r), f"{name}_caches[{layer}] differs from the reference"
    return got


# ------------------------------------------------------------------ launch plans and unvalidated values

def test_long_paths_and_split_programs(monkeypatch):
    """Paths longer than one metadata tile and than one row chunk, heads and head-dim split
    over programs: the multi-step loops of the kernel."""
    monkeypatch.setattr(triton_module, "MAX_BLOCK_A", 8)
    monkeypatch.setattr(triton_module, "INTERPRETER_TARGET_PROGRAMS", 10**6)  # split down to MIN_BLOCK_D
    monkeypatch.setattr(triton_module, "MIN_BLOCK_D", 4)
    gen = torch.Generator().manual_seed(5)
    layers, batch, heads, dim = 1, 2, 3, 8
    paths = [[0] + (torch.randperm(59, generator=gen)[:36] + 1).sort().values.tolist(), [0] + list(range(3, 40, 2))]
    accepted = accepted_from(paths, 40)
    k, v, _ = make_caches("mixed_strides", layers, batch, heads, 70, dim, torch.float32, gen)
    run_both(k, v, torch.tensor([5, 9]), accepted)
    block_m, block_h, block_d, col_blocks = triton_module._plan(batch, 2 * layers, heads, dim, 40, 10**6)
    assert (block_h, block_d, col_blocks) == (1, 4, 6) and block_m == 16
    # the GPU plan at the benchmark's shape: whole heads for B = 32, heads split for B = 1
    assert triton_module._plan(32, 64, 8, 128, 9, triton_module.TARGET_PROGRAMS) == (8, 8, 128, 1)
    assert triton_module._plan(1, 64, 8, 128, 9, triton_module.TARGET_PROGRAMS) == (16, 1, 64, 16)


def test_unvalidated_out_of_range_rows_are_skipped():
    """Called without the op's checks (as on a GPU, where values are not inspected): rows
    whose source or destination lies outside [0, S_max) are skipped and nothing outside the
    caches is written; the other rows still move."""
    gen = torch.Generator().manual_seed(7)
    layers, batch, heads, seq, dim = 2, 3, 2, 8, 4
    guard = torch.randn(2 * layers + 2, batch, heads, seq, dim, generator=gen)  # caches 1..2L, guards at 0 and -1
    before = guard.clone()
    caches = list(guard[1:-1])
    accepted = torch.tensor([[0, 3, 9], [0, 1, 2], [0, 2, 5]])
    seq_lens = torch.tensor([2, -3, 4])  # row 0: node 9 is past S_max; row 1: negative; row 2: 4 + 5 past S_max
    new = triton_module.kv_compact(caches[:layers], caches[layers:], seq_lens, accepted)
    assert new.tolist() == [5, 0, 7]
    assert torch.equal(guard[0], before[0]) and torch.equal(guard[-1], before[-1])
    for cache, old in zip(caches, before[1:-1]):
        assert torch.equal(cache[0, :, 3], old[0, :, 5])  # 2 + 1 <- 2 + 3 moved; 2 + 2 <- 11 skipped
        assert torch.equal(cache[0, :, 4], old[0, :, 4])
        assert torch.equal(cache[1], old[1])
        assert torch.equal(cache[2, :, 5], old[2, :, 6]) and torch.equal(cache[2, :, 6], old[2, :, 6])
        assert torch.equal(cache[:, :, :3], old[:, :, :3])


# ------------------------------------------------------------------ the layout and its table

def test_table_is_cached_per_set_of_tensors():
    gen = torch.Generator().manual_seed(8)
    k, v, _ = make_caches("mixed_strides", 2, 2, 1, 6, 4, torch.float32, gen)
    first = _kv_layout.cache_layout(k, v).table
    assert first.shape == (4, 4) and first[:, 0].tolist() == [c.data_ptr() for c in [*k, *v]]
    assert first[:, 1:].tolist() == [list(c.stride()[:3]) for c in [*k, *v]]
    assert _kv_layout.cache_layout(k, v).table is first  # steady state: no new table
    k2 = [k[1], k[0]]
    assert _kv_layout.cache_layout(k2, v).table is not first


def test_aliased_caches_are_rejected():
    cache = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="kv_compact: `k_caches` and `v_caches` must be distinct"):
        ops.kv_compact([cache], [cache], torch.tensor([0]), torch.tensor([[0, 1]]), backend="triton")


# ------------------------------------------------------------------ generated code

COMPILE_CHECK = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_kernels.triton import kv_cache as kc

names = kc._kv_compact_kernel.arg_names
pointers = {"k_ptr": "*bf16", "v_ptr": "*bf16", "table_ptr": "*i64", "seq_lens_ptr": "*i64",
            "accepted_ptr": "*i64", "new_lens_ptr": "*i64"}
aligned = set(pointers)  # sizes and strides carry no divisibility: the kernel's own ALIGN hints must do
for table in (False, True):
    constants = dict(TABLE=table, VEC_BYTES=16, ALIGN=8, BLOCK_M=8, BLOCK_H=8, BLOCK_D=128, BLOCK_A=64)
    signature = {n: pointers.get(n, "constexpr" if n in constants else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(fn=kc._kv_compact_kernel, signature=signature, constexprs=constants, attrs=attrs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    loads = sum("ld.global.v4.b32" in line for line in ptx.splitlines())
    stores = sum("st.global.v4.b32" in line for line in ptx.splitlines())
    print(table, loads, stores)
"""


def test_generated_ptx_moves_16_byte_vectors():
    """Compile the kernel for sm_90 (no GPU needed) at the benchmark's shape, bf16 D=128, with
    no divisibility known for any size or stride (only the host-checked ALIGN hint): both
    address paths must load and store whole 16-byte vectors (8 per thread)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE_CHECK], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode and "ptxas" in done.stderr.lower():
        pytest.skip(f"no usable ptxas here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "8", "8", "True", "8", "8"], done.stdout
