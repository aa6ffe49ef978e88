"""The Triton kv_compact backend against the torch reference, bit for bit (it is a copy).

Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported). Every case compares whole cache tensors, so a slot the reference leaves alone
must be left alone by the kernel too. Layouts: one allocation ([L, B, Hkv, S, D], K and V
interleaved [L, 2, ...], a permuted NHD [L, B, S, Hkv, D] view: the no-table fast path)
and separate tensors with mixed strides (the device-table path).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.common import kv_layout as _kv_layout
from specdec_kernels.triton import kv_compact as triton_module

ROOT = Path(__file__).resolve().parents[1]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("stacked", "kv_interleaved", "nhd", "separate", "mixed_strides")
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731


# ------------------------------------------------------------------ inputs

def random_path(gen, n: int) -> list[int]:
    """Root-to-node path of a random tree of n nodes (parents before children): increasing."""
    parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
    node = int(torch.randint(0, n, (), generator=gen))
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def accepted_from(paths: list[list[int]], m: int) -> torch.Tensor:
    return torch.tensor([path + [-1] * (m - len(path)) for path in paths], dtype=torch.int64)


def make_caches(layout: str, layers: int, batch: int, heads: int, seq: int, dim: int, dtype, gen):
    """(k_caches, v_caches, owners): per-layer [B, Hkv, S, D] views in `layout`; owners are
    the allocations (a clone of them is the untouched original)."""
    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if layout == "stacked":  # separate K and V allocations [L, B, Hkv, S, D]
        k, v = rand(layers, batch, heads, seq, dim), rand(layers, batch, heads, seq, dim)
        return list(k), list(v), [k, v]
    if layout == "kv_interleaved":  # one allocation [L, 2, B, Hkv, S, D]
        kv = rand(layers, 2, batch, heads, seq, dim)
        return list(kv[:, 0]), list(kv[:, 1]), [kv]
    if layout == "nhd":  # [L, B, S, Hkv, D] storage seen as [B, Hkv, S, D]: non-default strides
        k, v = rand(layers, batch, seq, heads, dim), rand(layers, batch, seq, heads, dim)
        return list(k.transpose(2, 3)), list(v.transpose(2, 3)), [k, v]
    if layout == "separate":  # one tensor per cache, contiguous
        caches = [rand(batch, heads, seq, dim) for _ in range(2 * layers)]
        return caches[:layers], caches[layers:], caches
    assert layout == "mixed_strides"  # per-cache strides differ: NHD, padded, contiguous
    caches = []
    for i in range(2 * layers):
        kind = i % 3
        if kind == 0:
            caches.append(rand(batch, seq, heads, dim).transpose(1, 2))
        elif kind == 1:
            caches.append(rand(batch + 1, heads, seq + 3, dim + 2)[1:, :, 3:, 1:dim + 1])
        else:
            caches.append(rand(batch, heads, seq, dim))
    return caches[:layers], caches[layers:], caches


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


# ------------------------------------------------------------------ against the reference

CASES = [(torch.bfloat16, layout) for layout in LAYOUTS] + [
    (torch.float32, "stacked"), (torch.float16, "separate"), (torch.float32, "mixed_strides"),
    (torch.float16, "nhd")]


@pytest.mark.parametrize("dtype, layout", CASES, ids=[f"{dtype_id(d)}-{lay}" for d, lay in CASES])
def test_random_tree_paths_match_reference(dtype, layout):
    gen = torch.Generator().manual_seed(11 + LAYOUTS.index(layout))
    layers, batch, heads, dim, n = 3, 4, 2, 16, 9
    seq_lens = torch.randint(0, 6, (batch,), generator=gen)
    paths = [random_path(gen, n) for _ in range(batch)]
    accepted = accepted_from(paths, max(len(p) for p in paths) + 1)
    k, v, _ = make_caches(layout, layers, batch, heads, 6 + n + 2, dim, dtype, gen)
    table = _kv_layout.cache_layout(k, v).table
    if layout in ("stacked", "kv_interleaved", "nhd"):
        assert table is None  # one allocation, constant layer step: no table
    if layout == "mixed_strides":
        assert table is not None  # per-cache strides differ: only a table describes them
    new = run_both(k, v, seq_lens, accepted)
    assert torch.equal(new, seq_lens + torch.tensor([len(p) for p in paths]))


@pytest.mark.parametrize("layout", ["stacked", "separate"])
def test_chain_root_only_and_empty_rows(layout):
    """A chain-shaped path moves nothing; a path that leaves the chain moves only its tail;
    the root alone, or nothing at all, moves nothing; int32 lengths stay int32."""
    gen = torch.Generator().manual_seed(3)
    k, v, _ = make_caches(layout, 2, 5, 2, 16, 8, torch.bfloat16, gen)
    before = [c.clone() for c in (*k, *v)]
    accepted = torch.tensor([[0, 1, 2, 3, -1], [0, -1, -1, -1, -1], [-1, -1, -1, -1, -1], [0, 1, 2, 3, 4],
                             [0, 1, 2, -1, -1]])
    seq_lens = torch.tensor([3, 0, 7, 11, 2], dtype=torch.int32)
    new = run_both(k, v, seq_lens, accepted)
    assert new.tolist() == [7, 1, 7, 16, 5]
    assert all(torch.equal(c, old) for c, old in zip((*k, *v), before))  # nothing moved at all

    jump = torch.tensor([[0, 1, 2, 5, 7]] + [[0, -1, -1, -1, -1]] * 4)  # row 0: slots 6, 7 <- 8, 10
    run_both(k, v, seq_lens, jump)
    changed = torch.zeros(5, 16, dtype=torch.bool)
    changed[0, [6, 7]] = True
    for c, old in zip((*k, *v), before):
        assert torch.equal(c[0, :, 6], old[0, :, 8]) and torch.equal(c[0, :, 7], old[0, :, 10])
        assert torch.equal(c.transpose(1, 2)[~changed], old.transpose(1, 2)[~changed])


@pytest.mark.parametrize("m", [0, 1])
def test_m_zero_and_one(m):
    gen = torch.Generator().manual_seed(4)
    k, v, _ = make_caches("separate", 2, 3, 2, 8, 4, torch.float16, gen)
    accepted = torch.tensor([[0], [-1], [0]])[:, :m]
    new = run_both(k, v, torch.tensor([1, 2, 3]), accepted)
    assert new.tolist() == ([1, 2, 3] if m == 0 else [2, 2, 4])


def test_no_layers_still_returns_lengths():
    seq_lens = torch.tensor([4, 0])
    new = ops.kv_compact([], [], seq_lens, torch.tensor([[0, 2, -1], [0, 1, 3]]), backend="triton")
    assert new.tolist() == [6, 3]
    assert ops.kv_compact([], [], seq_lens[:0], torch.empty(0, 3, dtype=torch.int64), backend="triton").numel() == 0


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
def test_unaligned_caches_take_the_narrow_path(dtype):
    """Odd D and views starting one element into their storage: no 16-byte access is legal."""
    gen = torch.Generator().manual_seed(6)
    layers, batch, heads, seq, dim = 2, 3, 2, 12, 3
    flat = torch.randn(2 * layers * batch * heads * seq * dim + 1, generator=gen).to(dtype)
    caches = list(flat[1:].view(2 * layers, batch, heads, seq, dim))
    layout = _kv_layout.cache_layout(caches[:layers], caches[layers:])
    assert layout.table is None and layout.vector_bytes == flat.element_size()
    accepted = accepted_from([[0, 2, 3], [0, 1, 4], [0]], 3)
    run_both(caches[:layers], caches[layers:], torch.tensor([0, 5, 8]), accepted)


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


def test_evenly_spaced_separate_tensors_use_the_fast_path():
    """Any constant step between layers (here every other slice of one block, K forwards
    and V backwards) needs no table; an uneven spacing does."""
    gen = torch.Generator().manual_seed(9)
    block = torch.randn(5, 2, 2, 6, 4, generator=gen)
    k, v = [block[0], block[2]], [block[3], block[1]]
    layout = _kv_layout.cache_layout(k, v)
    assert layout.table is None and layout.k_step == 2 * block[0].numel() and layout.v_step == -2 * block[0].numel()
    assert layout.vector_bytes == 16  # aligned allocation, 16-byte rows
    assert _kv_layout.cache_layout([*k, block[3]], [block[1], block[4], block[0]]).table is not None
    run_both(k, v, torch.tensor([0, 1]), accepted_from([[0, 2, 3], [0, 1, 3]], 3))


def test_aliased_caches_are_rejected():
    cache = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="kv_compact: `k_caches` and `v_caches` must be distinct"):
        ops.kv_compact([cache], [cache], torch.tensor([0]), torch.tensor([[0, 1]]), backend="triton")


# ------------------------------------------------------------------ generated code

COMPILE_CHECK = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_kernels.triton import kv_compact as kc

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
