"""tree_attention's shapes, tolerances and cases: contiguous and paged KV (NHD pools, HND pools
seen through a transpose, page sizes from 1 to past a tile), trees, chains and hand-made parents,
GQA groups, head dims, node counts, ragged and cache-filling prefixes, strided inputs, sm_scale,
empty batches. The Triton interpreter tests (tiny), the GPU tests and the selftest draw from here.

Cache slots a row must not read (past seq_lens[b] + N, unused pages, spare pages) hold NaN in the
edge cases, so a stray read reaches the output. At "tiny" most cases carry `triton_overrides`
(num_splits, block_n, block_m): the Triton backend is then launched with them so that the
interpreter's few keys still span several tiles, M blocks and splits; every other backend (and
every case at "quick" / "full") runs the op with its own choices."""

import math
from functools import partial

import torch

from .compare import close, expect, with_checks
from .inputs import seeded_generator, random_parents
from .model import DTYPES, Row, cases
from .tiles import run_with_tiles


# (out atol = rtol, lse atol) per dtype: the looser of the two backends' GPU-test tolerances
# (tests/test_gpu_tree_attention_{triton,cuda}.py); lse rtol 1e-5.
ATTENTION_TOL = {torch.float32: (1e-4, 2e-4), torch.float16: (1e-2, 2e-4), torch.bfloat16: (2e-2, 2e-4)}
# the interpreter tests' tolerances (tiny): fp32 dots are IEEE; half inputs round p for P @ V
TINY_TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-2, 1e-4), torch.bfloat16: (2e-2, 1e-4)}


def attention_shapes(profile):
    """(prefix lengths, N, Hq, Hkv, D, dtypes, tree, page size or None)."""
    if profile == "tiny":
        return [([9, 3], 4, 2, 1, 16, (torch.float32,), True, None), ([5, 0], 3, 2, 2, 16, (torch.float32,), True, 4)]
    small = []
    for d in (64, 128):
        for page_size in (None, 16):
            small.append(([100, 333], 16, 8, 2, d, DTYPES, True, page_size))
    small.append(([37, 1, 200], 8, 4, 4, 64, (torch.float16,), False, None))
    if profile == "quick":
        return small
    prefixes = [4096, 3000, 17, 4095, 0, 2500, 4000, 1]
    production = []
    for n in (8, 32, 64):
        for tree in (False, True):
            for page_size in (None, 16):
                production.append((prefixes, n, 32, 8, 128, (torch.bfloat16,), tree, page_size))
    production += [(prefixes, 32, 32, 8, 128, (torch.float16,), True, None),
                   (prefixes, 32, 32, 8, 64, (torch.bfloat16,), True, 16),
                   ([4096], 32, 32, 4, 128, (torch.bfloat16, torch.float32), True, 1),
                   ([1000, 4000], 16, 8, 1, 64, (torch.float32,), True, 64),
                   ([1000, 333], 16, 32, 8, 64, (torch.float16, torch.float32), True, None),
                   ([1000, 333], 16, 32, 8, 128, (torch.float16, torch.float32), True, None)]
    return small + production


# the crafted cases per profile (every size choice in one place). forced_tiles: the Triton launcher
# gets the case's tiles; minus_one: table entries past a row's last page are -1 (else NaN pages);
# split_counts, block_ms: the forced split counts and M blocks; gpu_matrix: (head dims, (Hq, Hkv),
# (N, prefixes)) of the CUDA test's matrix; gpu_rows: the other large cases; paged_matrix: (page
# size, layouts); long_prefixes: the 4K-32K prefix cases
_FULL_MATRIX = dict(d=(64, 128), heads=((32, 8), (8, 8), (28, 4)), nodes=((8, [0, 777, 2048]), (32, [1500, 3, 64])))
EDGE_TIERS = {"tiny": dict(forced_tiles=True, minus_one=True, split_counts=(1, 2, 5, 12), block_ms=(16, 32),
                           gpu_matrix=None, gpu_rows=False, paged_matrix=(), long_prefixes=False),
              "quick": dict(forced_tiles=False, minus_one=False, split_counts=(), block_ms=(),
                            gpu_matrix=dict(d=(128,), heads=((28, 4),), nodes=_FULL_MATRIX["nodes"][:1]),
                            gpu_rows=True, paged_matrix=((16, ("paged",)), (48, ("hnd",))), long_prefixes=False),
              "full": dict(forced_tiles=False, minus_one=False, split_counts=(), block_ms=(), gpu_matrix=_FULL_MATRIX,
                           gpu_rows=True, paged_matrix=tuple((page_size, ("paged", "hnd"))
                                                             for page_size in (1, 16, 64, 48)),
                           long_prefixes=True)}


def run_attention(x, backend):
    return run_with_tiles("tree_attention", "attention", x, backend, _attention_with_tiles)


def _attention_with_tiles(launcher, x, tiles):
    scale = x.get("sm_scale") or 1.0 / math.sqrt(x["q"].shape[-1])
    return launcher(x["q"], x["k_cache"], x["v_cache"], x["seq_lens"], x.get("parents"), x.get("block_table"),
                    sm_scale=scale, **tiles)


def random_attention(seed, *, device, prefixes, n, hq, hkv, d, dtype, tree, page_size):
    """Random q, K, V (rows in a random order of `prefixes`), paged in a random page order when page_size."""
    from ..reference.attention import paged_from_contiguous

    gen = seeded_generator(device, seed)
    batch = len(prefixes)
    s_max = max(prefixes) + n
    order = torch.randperm(batch, generator=torch.Generator().manual_seed(seed)).tolist()
    seq_lens = torch.tensor([prefixes[i] for i in order], dtype=torch.int64, device=device)
    q = torch.randn(batch, n, hq, d, generator=gen, device=device).to(dtype)
    k = torch.randn(batch, hkv, s_max, d, generator=gen, device=device).to(dtype)
    v = torch.randn(batch, hkv, s_max, d, generator=gen, device=device).to(dtype)
    block_table = None
    if page_size is not None:
        k, block_table = paged_from_contiguous(k, page_size, generator=torch.Generator().manual_seed(seed),
                                               spare_pages=7)
        v, _ = paged_from_contiguous(v, page_size, generator=torch.Generator().manual_seed(seed), spare_pages=7)
    parents = random_parents(batch, n, seed).to(device) if tree else None
    return dict(q=q, k_cache=k, v_cache=v, seq_lens=seq_lens, parents=parents, block_table=block_table)


def poisoned_inputs(prefixes, n, hq, hkv, d, dtype, device, *, seed=0, layout="contiguous", page_size=4, tree=True,
                    spare=0, boost=1.0, index_dtype=torch.int64, parents=None, minus_one=True):
    """q, K/V (NaN wherever a row must not read; draft keys scaled by `boost`), seq_lens, parents
    (random tree, None for a chain, or given) and, paged, a pool in a random page order with the
    table entries past a row's last page -1 (never read; `minus_one`) or pointing at NaN pages;
    layout "hnd": a [P, Hkv, ps, D] pool passed as .transpose(1, 2)."""
    from ..reference.attention import paged_from_contiguous

    gen = seeded_generator(device, seed)
    batch = len(prefixes)
    seq_lens = torch.tensor(prefixes, dtype=torch.int64, device=device)
    s_max = max(prefixes) + n + spare
    q = torch.randn(batch, n, hq, d, generator=gen, device=device).to(dtype)
    pos = torch.arange(s_max, device=device).view(1, 1, s_max, 1)
    start, end = seq_lens.view(batch, 1, 1, 1), (seq_lens + n).view(batch, 1, 1, 1)
    caches = []
    for scale in (boost, 1.0):
        cache = torch.randn(batch, hkv, s_max, d, generator=gen, device=device)
        cache = torch.where((pos >= start) & (pos < end), cache * scale, cache)
        caches.append(cache.masked_fill(pos >= end, math.nan).to(dtype))
    block_table = None
    if layout != "contiguous":
        paged = [paged_from_contiguous(c, page_size, generator=torch.Generator().manual_seed(seed), spare_pages=3)
                 for c in caches]
        caches, block_table = [p for p, _ in paged], paged[0][1].to(device)
        used_pages = (seq_lens + n + page_size - 1) // page_size
        unread = torch.arange(block_table.shape[1], device=device).unsqueeze(0) >= used_pages.unsqueeze(1)
        block_table = (block_table.masked_fill(unread, -1) if minus_one else block_table).to(index_dtype)
        if layout == "hnd":
            caches = [c.transpose(1, 2).contiguous().transpose(1, 2) for c in caches]
    if parents is None and tree:
        parents = random_parents(batch, n, seed).to(device)
    elif parents is not None:
        parents = torch.as_tensor(parents, device=device)
    if parents is not None:
        parents = parents.to(index_dtype)
    return dict(q=q, k_cache=caches[0], v_cache=caches[1], seq_lens=seq_lens.to(index_dtype), parents=parents,
                block_table=block_table)


def attention_compare(dtype, profile):
    out_tol, lse_tol = (TINY_TOL if profile == "tiny" else ATTENTION_TOL)[dtype]
    return close(("out", "lse"), ((out_tol, out_tol), (lse_tol, 1e-5)))


def tree_matters(dtype, profile):
    """The case can fail: the reference's tree answer is farther from its chain answer than 10x the
    tolerance, so a wrong ancestor bit cannot hide inside it."""
    out_tol = (TINY_TOL if profile == "tiny" else ATTENTION_TOL)[dtype][0]

    def check(got, x):
        from .. import ops

        chain = ops.tree_attention(**{k: v for k, v in x.items() if k != "triton_overrides"} | {"parents": None},
                                   backend="torch")[0]
        return float((got[0].float() - chain.float()).abs().nan_to_num(0.0).max()) > 10 * out_tol
    return expect("the tree's answer far from the chain's", check)


# ------------------------------------------------------------------ the crafted inputs

def poisoned(seed, *, device, dtype, minus_one, overrides=None, sm_scale=None, base_seed=0, **shape):
    """poisoned_inputs at seed base_seed + seed, with the case's sm_scale and Triton tiles."""
    x = poisoned_inputs(dtype=dtype, device=device, minus_one=minus_one, seed=base_seed + seed, **shape)
    if sm_scale is not None:
        x["sm_scale"] = sm_scale
    if overrides is not None:
        x["triton_overrides"] = overrides
    return x


def strided_views(seed, *, device, d, overrides, nhd=False):
    """q and the caches as views with padded strides (only the last dim contiguous); on a GPU also
    K/V as a [B, S, Hkv, D] buffer seen through transpose(1, 2) and strided int32 lengths / parents."""
    prefixes = [8, 26] if d == 16 else [10, 600, 1234]
    n, hq, hkv = (5, 4, 2) if d == 16 else (12, 32, 8)
    x = poisoned_inputs(prefixes, n, hq, hkv, d, torch.float32 if d == 16 else torch.bfloat16, device, seed=8 + seed)
    q, k, v = x["q"], x["k_cache"], x["v_cache"]
    wide = torch.full(q.shape[:-1] + (2 * d,), math.nan, dtype=q.dtype, device=device)
    wide[..., :d] = q
    x["q"] = wide[..., :d]
    if nhd:
        x["k_cache"] = k.transpose(1, 2).contiguous().transpose(1, 2)
        x["v_cache"] = v.transpose(1, 2).contiguous().transpose(1, 2)
        x["seq_lens"] = torch.stack([x["seq_lens"].int(), x["seq_lens"].int()], 1)[:, 0]
        x["parents"] = torch.stack([x["parents"], x["parents"]], 2)[..., 1]
    else:
        for name, cache in (("k_cache", k), ("v_cache", v)):
            big = torch.full((cache.shape[0], cache.shape[1] + 1, cache.shape[2] + 14, d), math.nan,
                             dtype=cache.dtype, device=device)
            big[:, 1:, :cache.shape[2]] = cache
            x[name] = big[:, 1:, :cache.shape[2]]
    if overrides is not None:
        x["triton_overrides"] = overrides
    return x


def empty_batch(seed, *, device, batch, n):
    q = torch.randn(batch, n, 2, 16, device=device)
    cache = torch.randn(batch, 1, 8, 16, device=device)
    return dict(q=q, k_cache=cache, v_cache=cache.clone(), seq_lens=torch.zeros(batch, dtype=torch.int64,
                                                                                 device=device))


def _scale_matters(got, x):
    from .. import ops

    plain = {k: v for k, v in x.items() if k not in ("sm_scale", "triton_overrides")}
    return not torch.allclose(got[1], ops.tree_attention(**plain, backend="torch")[1])


# ------------------------------------------------------------------ the case table

def _shape_rows(profile):
    rows = []
    for index, (prefixes, n, hq, hkv, d, dtypes, tree, page_size) in enumerate(attention_shapes(profile)):
        layout = "contiguous" if page_size is None else f"paged{page_size}"
        name = (f"B={len(prefixes)} P<={max(prefixes)} N={n} Hq={hq} Hkv={hkv} D={d} "
                f"{'tree' if tree else 'chain'} {layout}")
        rows += [Row(name, dtype, random_attention, dict(prefixes=prefixes, n=n, hq=hq, hkv=hkv, d=d, dtype=dtype,
                                                          tree=tree, page_size=page_size),
                     attention_compare(dtype, profile), graph=index in (0, 1) and dtype == dtypes[-1])
                 for dtype in dtypes]
    return rows


def _poisoned_row(profile, name, dtype, overrides=None, checks=(), **settings):
    """A case of poisoned inputs; `overrides` (the Triton tiles) apply where the tier forces tiles."""
    tier = EDGE_TIERS[profile]
    compare = attention_compare(dtype, profile)
    return Row(name, dtype, poisoned, dict(settings, dtype=dtype, minus_one=tier["minus_one"],
                                           overrides=overrides if tier["forced_tiles"] else None),
               with_checks(compare, *checks) if checks else compare)


# the interpreter's cases: every dtype, layout and mask kind, each with the others (not the full
# product: the interpreter is slow); (dtype, layout, tree)
_MASK_COMBOS = ((torch.float32, "contiguous", False), (torch.float32, "contiguous", True),
                (torch.float16, "contiguous", True), (torch.bfloat16, "contiguous", False),
                (torch.float32, "paged", False), (torch.float16, "paged", True), (torch.bfloat16, "paged", True),
                (torch.bfloat16, "hnd", True), (torch.float32, "hnd", False))
_SPLIT, _TWO = dict(num_splits=3, block_n=16), dict(num_splits=2, block_n=16)


def _interpreter_rows(profile):
    """Cheap at every tier (their forced tiles apply at "tiny" only)."""
    tier, row = EDGE_TIERS[profile], partial(_poisoned_row, profile)
    splits = ", 3 splits" if tier["forced_tiles"] else ""
    rows = [row(f"B=3 ragged N=7 {'tree' if tree else 'chain'} {layout} NaN past each row{splits}", dtype, _SPLIT,
                prefixes=[0, 21, 70], n=7, hq=4, hkv=2, d=16, layout=layout, tree=tree, spare=5)
            for dtype, layout, tree in _MASK_COMBOS]
    rows += [row(f"GQA Hq={hq} Hkv={hkv}", torch.float32, _TWO, prefixes=[9, 33], n=5, hq=hq, hkv=hkv, d=16,
                 base_seed=hq * 10 + hkv) for hq, hkv in ((1, 1), (4, 4), (8, 1), (6, 2))]
    # 12 splits of at most 6 tiles leave splits empty: the merge ignores them
    rows += [row(f"{splits} splits", torch.float32, dict(num_splits=splits, block_n=16), prefixes=[0, 17, 90], n=5,
                 hq=4, hkv=2, d=16, base_seed=3) for splits in tier["split_counts"]]
    # N * group = 36 packed rows: 3 (or 2) programs per KV head
    rows += [row(f"block_m={block_m}, 36 packed rows", torch.float16, dict(num_splits=2, block_m=block_m, block_n=16),
                 prefixes=[4, 50], n=9, hq=8, hkv=2, d=16, base_seed=4) for block_m in tier["block_ms"]]
    # below the 16-wide dot minimum, and a non-power of two: padded and masked
    rows += [row(f"D={d}", torch.float32, _TWO, prefixes=[6, 30], n=4, hq=4, hkv=2, d=d, base_seed=d)
             for d in (8, 24, 64)]
    # smaller than, not dividing, equal to and larger than a tile
    rows += [row(f"page size {page_size}", torch.bfloat16, _TWO, prefixes=[5, 47, 0], n=6, hq=4, hkv=2, d=16,
                 layout="paged", page_size=page_size, base_seed=page_size) for page_size in (1, 3, 16, 32)]
    # from the root alone to more nodes than one 32-bit word of ancestor bits
    rows += [row(f"N={n}", torch.float32, _TWO, prefixes=[11, 0], n=n, hq=2, hkv=1, d=16, base_seed=n)
             for n in (1, 2, 17, 33)]
    rows += [row("unused slots see the prefix and themselves", torch.float32, _TWO, prefixes=[12, 3], n=6, hq=2,
                 hkv=1, d=16, base_seed=2, parents=[[-1, 0, -1, 1, -1, 3], [-1, -1, -1, -1, -1, -1]]),
             row("a row filling the cache, an empty prefix (the op's own plan)", torch.bfloat16, None,
                 prefixes=[0, 13, 45], n=4, hq=4, hkv=2, d=16, base_seed=6),
             row("sm_scale=0.05", torch.float32, _TWO, prefixes=[10, 20], n=4, hq=2, hkv=1, d=16, base_seed=12,
                 sm_scale=0.05, checks=(expect("sm_scale to change lse", _scale_matters),)),
             Row("strided q and caches (only the last dim contiguous)", torch.float32, strided_views,
                 dict(d=16, overrides=_TWO if tier["forced_tiles"] else None), attention_compare(torch.float32, profile))]
    return rows


def _gpu_matrix_rows(profile):
    """The CUDA GPU test's matrix: heads, head dims, dtypes, chain / tree, boosted draft keys."""
    matrix, row = EDGE_TIERS[profile]["gpu_matrix"], partial(_poisoned_row, profile)
    if matrix is None:
        return []
    return [row(f"Hq={hq} Hkv={hkv} D={d} N={n} {'tree' if tree else 'chain'} boosted draft keys, NaN past each row",
                dtype, prefixes=prefixes, n=n, hq=hq, hkv=hkv, d=d, tree=tree, spare=37, boost=3.0, base_seed=n + d,
                checks=(tree_matters(dtype, profile),) if tree else ())
            for dtype in DTYPES for d in matrix["d"] for hq, hkv in matrix["heads"] for tree in (False, True)
            for n, prefixes in matrix["nodes"]]


def _gpu_rows(profile):
    """Large head dims and node counts, sm_scale, GQA, paged pools of NaN pages, NHD caches."""
    tier, row = EDGE_TIERS[profile], partial(_poisoned_row, profile)
    if not tier["gpu_rows"]:
        return []
    rows = [row("a row filling the cache, empty prefixes, int32 lengths", torch.float16,
                prefixes=[0, 3000 - 24, 0, 3000 - 25], n=24, hq=8, hkv=8, d=64, base_seed=11, index_dtype=torch.int32)]
    rows += [row(f"D={d} (no tensor-core kernel)", dtype, prefixes=[700, 5], n=10, hq=8, hkv=2, d=d, base_seed=d)
             for dtype, d in ((torch.float16, 80), (torch.bfloat16, 256), (torch.float16, 32), (torch.float32, 256))]
    rows += [row("N=130, sm_scale=0.05", torch.bfloat16, prefixes=[333, 2100], n=130, hq=2, hkv=2, d=128,
                 base_seed=130, sm_scale=0.05),
             row("N=130 chain, sm_scale=0.2", torch.bfloat16, prefixes=[333, 2100], n=130, hq=2, hkv=2, d=128,
                 base_seed=130, tree=False, sm_scale=0.2)]
    rows += [row(f"GQA Hq={hq} Hkv={hkv} sm_scale=0.5/sqrt(D)", torch.bfloat16, prefixes=[700, 1300], n=24, hq=hq,
                 hkv=hkv, d=128, base_seed=hq + hkv, sm_scale=0.5 / math.sqrt(128))
             for hq, hkv in ((32, 32), (32, 4), (8, 1))]
    rows += [row(f"{layout} page size {page_size} {str(index_dtype)[6:]} indices, NaN pages", dtype,
                 prefixes=[0, 1000, 2500, 63], n=16, hq=32, hkv=8, d=128, layout=layout, page_size=page_size,
                 index_dtype=index_dtype, base_seed=page_size)
             for dtype in (torch.bfloat16, torch.float32) for page_size, layouts in tier["paged_matrix"]
             for index_dtype in (torch.int32, torch.int64) for layout in layouts]
    rows.append(Row("strided q, NHD caches, strided int32 lengths and parents", torch.bfloat16, strided_views,
                    dict(d=128, overrides=None, nhd=True), attention_compare(torch.bfloat16, profile)))
    return rows


def _ragged_32k_prefixes(batch, n, ragged):
    cpu = torch.Generator().manual_seed(batch * n)
    return [int(torch.randint(16384, 32769, (1,), generator=cpu)) if ragged else 32768 for _ in range(batch)]


def _long_prefix_rows(profile):
    """Draft sizes and batches at 4K-32K prefixes: many prefix splits per row and the LSE merge."""
    row = partial(_poisoned_row, profile)
    if not EDGE_TIERS[profile]["long_prefixes"]:
        return []
    rows = [row(f"B={batch} N={n} ragged 4K {'tree' if tree else 'chain'}", torch.bfloat16,
                prefixes=[4096 - 97 * b for b in range(batch)], n=n, hq=32, hkv=8, d=128, tree=tree, spare=37,
                boost=3.0, base_seed=n * batch)
            for batch in (1, 3, 8) for n in (1, 8, 32, 64) for tree in (True, False)]
    rows += [row(f"B={batch} N={n} {'ragged' if ragged else 'uniform'} 32K prefixes", dtype,
                 prefixes=_ragged_32k_prefixes(batch, n, ragged), n=n, hq=32, hkv=8, d=128, base_seed=batch + n,
                 boost=3.0)
             for dtype in (torch.bfloat16, torch.float16) for batch in (1, 8) for n in (8, 64)
             for ragged in (False, True)]
    rows += [row(f"B=1 32K prefix {'contiguous' if page_size is None else f'paged{page_size}'}", torch.bfloat16,
                 prefixes=[32768], n=32, hq=32, hkv=8, d=128, base_seed=3,
                 layout="contiguous" if page_size is None else "paged", page_size=page_size or 16)
             for page_size in (None, 1, 16, 64)]  # one long row: split KV
    rows.append(row("paged16 rows of 32K and 20K", torch.bfloat16, prefixes=[32768 - 5, 20000], n=32, hq=32, hkv=8,
                    d=128, base_seed=7, layout="paged", page_size=16))
    return rows


def _empty_rows(profile):
    """B = 0 only: at N = 0 the torch reference's CPU path dies with SIGFPE (reference/attention.py
    _rows_attention_flash_cpu), which would take the whole selftest (or a mutation test that wraps the
    reference) down; tests/test_triton_tree_attention.py checks N = 0 on its own."""
    return [Row("B=0 N=3 (empty)", torch.float32, empty_batch, dict(batch=0, n=3),
                attention_compare(torch.float32, profile))]


def attention_cases(profile, device):
    rows = _shape_rows(profile)
    for group in (_interpreter_rows, _gpu_matrix_rows, _gpu_rows, _long_prefix_rows, _empty_rows):
        rows += group(profile)
    return cases("tree_attention", run_attention, rows, device)
