"""The KV cache ops' shapes and cases: kv_compact over every cache layout (one allocation: stacked,
K and V interleaved, an NHD view; per-layer tensors: contiguous, NHD, padded / mixed strides,
misaligned views), random accepted paths (a random tree's path, a chain, the root alone, nothing),
the edge rows (chains move nothing, M = 0 / 1, no layers, int32 lengths, long paths), and
kv_rollback. The Triton interpreter tests (tiny), the GPU tests and the selftest draw from here.

kv_compact works in place: a case's inputs hold the pristine contents of every allocation, and
each run first copies them back, so every backend and the reference start from the same caches
and the whole caches (untouched slots included) are compared."""

from functools import partial

import torch

from .compare import exact, expect, with_checks
from .inputs import seeded_generator
from .model import DTYPES, Row, cases

OUTPUTS = ("new_seq_lens", "k_caches", "v_caches")
LAYOUT_NAMES = {"stacked": "one allocation [L, B, Hkv, S, D]", "kv_interleaved": "one allocation [L, 2, B, Hkv, S, D]",
                "nhd": "one allocation, NHD view", "separate": "per-layer tensors",
                "separate_nhd": "per-layer tensors, every other NHD",
                "mixed_strides": "per-layer tensors, mixed strides (NHD, padded, contiguous)"}


# ------------------------------------------------------------------ the size tiers (the only place)

def kv_shapes(profile):
    """(layers, B, Hkv, S_max, D, N tree nodes, layout, dtypes, seq_lens dtype)."""
    if profile == "tiny":  # every layout and dtype, each with the others (the interpreter is slow)
        combos = [(torch.bfloat16, layout) for layout in ("stacked", "kv_interleaved", "nhd", "separate",
                                                           "mixed_strides")]
        combos += [(torch.float32, "stacked"), (torch.float16, "separate"), (torch.float32, "mixed_strides"),
                   (torch.float16, "nhd")]
        return [(3, 4, 2, 17, 16, 9, layout, (dtype,), torch.int64) for dtype, layout in combos]
    small = [(4, 3, 2, 100, 64, 8, "stacked", DTYPES, torch.int64),
             (3, 4, 2, 80, 128, 16, "separate", DTYPES, torch.int64)]
    small += [(4, 6, 4, 48, 64, 31, layout, (torch.float32, torch.float16), torch.int32)
              for layout in ("kv_interleaved", "separate_nhd")]
    if profile == "quick":
        return small
    production = [(32, 8, 8, 1088, 128, 64, "stacked", (torch.bfloat16,), torch.int64),
                  (32, 32, 8, 272, 128, 8, "separate", (torch.bfloat16,), torch.int64)]
    production += [(32, b, 8, 256 + n, 128, n, layout, (torch.bfloat16,), torch.int64) for layout in
                   ("kv_interleaved", "separate_nhd") for n in (8, 64) for b in (1, 8, 32)]
    return small + production


# the crafted cases' sizes: misaligned views (D, offset), their dtypes and (L, B, Hkv, S), fixed
# or random paths; (Hkv, D) of the long paths (GPU tiers only); kv_rollback's batches
_GPU_EDGES = dict(misaligned_views=((3, 1), (5, 0), (12, 2), (64, 1)),
                  misaligned_dtypes=(torch.float32, torch.bfloat16), misaligned_shape=(3, 5, 3, 40),
                  misaligned_random_rows=True, long_paths=((1, 8), (8, 128)), rollback_batches=(1, 256))
EDGE_TIERS = {"tiny": dict(misaligned_views=((3, 1),), misaligned_dtypes=(torch.float16, torch.float32),
                           misaligned_shape=(2, 3, 2, 12), misaligned_random_rows=False, long_paths=(),
                           rollback_batches=(3,)),
              "quick": _GPU_EDGES, "full": _GPU_EDGES}


# ------------------------------------------------------------------ inputs

def make_caches(layout, layers, batch, heads, seq, dim, dtype, device, gen):
    """(k_caches, v_caches, owners): per-layer [B, Hkv, S, D] views in `layout`; the owners are
    what a run restores (the allocations, or the views themselves)."""
    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    if layout == "stacked":
        k, v = rand(layers, batch, heads, seq, dim), rand(layers, batch, heads, seq, dim)
        return list(k.unbind(0)), list(v.unbind(0)), [k, v]
    if layout == "kv_interleaved":
        kv = rand(layers, 2, batch, heads, seq, dim)
        return list(kv[:, 0].unbind(0)), list(kv[:, 1].unbind(0)), [kv]
    if layout == "nhd":  # [L, B, S, Hkv, D] storage seen as [B, Hkv, S, D]
        k, v = rand(layers, batch, seq, heads, dim), rand(layers, batch, seq, heads, dim)
        return list(k.transpose(2, 3).unbind(0)), list(v.transpose(2, 3).unbind(0)), [k, v]
    caches = []
    for i in range(2 * layers):
        if layout == "separate" or (layout == "separate_nhd" and i % 2 == 0):
            caches.append(rand(batch, heads, seq, dim))
        elif layout == "separate_nhd" or i % 3 == 0:
            caches.append(rand(batch, seq, heads, dim).transpose(1, 2))
        elif i % 3 == 1:
            caches.append(rand(batch + 1, heads, seq + 3, dim + 2)[1:, :, 3:, 1:dim + 1])
        else:
            caches.append(rand(batch, heads, seq, dim))
    return caches[:layers], caches[layers:], caches


def random_accepted(batch, n, gen):
    """[B, n] accepted paths of random trees of n nodes (parents before children), padded with -1;
    rows cycle through a random tree's path, a chain, the root alone and (from row 4) nothing."""
    paths = []
    for b in range(batch):
        kind = b % 4
        if kind == 1:
            paths.append(list(range(int(torch.randint(1, n + 1, (), generator=gen)))))
        elif kind == 2:
            paths.append([0])
        elif kind == 3 and b > 3:
            paths.append([])
        else:
            parents = [-1] + [int(torch.randint(max(0, i - 4), i, (), generator=gen)) for i in range(1, n)]
            node = int(torch.randint(0, n, (), generator=gen))
            path = []
            while node >= 0:
                path.append(node)
                node = parents[node]
            paths.append(path[::-1])
    # padded to n columns (the longest possible path): every seed gives the same shape (graph replays)
    return torch.tensor([p + [-1] * (n - len(p)) for p in paths], dtype=torch.int64).reshape(batch, n)


def _inputs(owners, k_caches, v_caches, seq_lens, accepted):
    return dict(owners=owners, pristine=[o.clone() for o in owners], k_caches=k_caches, v_caches=v_caches,
                seq_lens=seq_lens, accepted_nodes=accepted)


def random_compact(seed, *, device, layers, batch, hkv, s_max, d, n, layout, dtype, lens_dtype):
    """Caches in `layout`, random lengths leaving room for n nodes, random accepted paths."""
    k, v, owners = make_caches(layout, layers, batch, hkv, s_max, d, dtype, device, seeded_generator(device, seed))
    cpu = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(0, s_max - n + 1, (batch,), generator=cpu).to(device, lens_dtype)
    return _inputs(owners, k, v, seq_lens, random_accepted(batch, n, cpu).to(device))


# chains, the root alone and empty rows: nothing moves; CHAIN_LENGTHS is what kv_compact returns
CHAIN_ACCEPTED = [[0, 1, 2, 3, -1], [0, -1, -1, -1, -1], [-1, -1, -1, -1, -1], [0, 1, 2, 3, 4], [0, 1, 2, -1, -1]]
CHAIN_SEQ_LENS = [3, 0, 7, 11, 2]
CHAIN_LENGTHS = [7, 1, 7, 16, 5]
# the row whose path leaves the chain: nodes 5, 7 (slots 3 + 5, 3 + 7) move to slots 6, 7
JUMP_ROW = 0
JUMP_PATH = [0, 1, 2, 5, 7]
JUMP_MOVES = {6: CHAIN_SEQ_LENS[JUMP_ROW] + 5, 7: CHAIN_SEQ_LENS[JUMP_ROW] + 7}


def chain_rows(seed, *, device, layout):
    k, v, owners = make_caches(layout, 2, 5, 2, 16, 8, torch.bfloat16, device, seeded_generator(device, 3 + seed))
    accepted = torch.tensor(CHAIN_ACCEPTED, device=device)
    seq_lens = torch.tensor(CHAIN_SEQ_LENS, dtype=torch.int32, device=device)
    return _inputs(owners, k, v, seq_lens, accepted)


def jump_rows(seed, *, device, layout):
    """The chain rows' caches; JUMP_ROW takes JUMP_PATH, every other row the root alone."""
    x = chain_rows(seed, device=device, layout=layout)
    rows = [[0, -1, -1, -1, -1]] * len(CHAIN_ACCEPTED)
    rows[JUMP_ROW] = JUMP_PATH
    x["accepted_nodes"] = torch.tensor(rows, device=device)
    return x


def short_paths(seed, *, device, m):
    """M = m columns of accepted nodes (0: nothing accepted, 1: the root or nothing)."""
    k, v, owners = make_caches("separate", 2, 3, 2, 8, 4, torch.float16, device, seeded_generator(device, 4 + seed))
    return _inputs(owners, k, v, torch.tensor([1, 2, 3], device=device),
                   torch.tensor([[0], [-1], [0]], device=device)[:, :m])


def no_layers(seed, *, device, batch):
    return _inputs([], [], [], torch.tensor([4, 0], device=device)[:batch],
                   torch.tensor([[0, 2, -1], [0, 1, 3]], device=device)[:batch])


def misaligned_views(seed, *, device, dim, offset, dtype, shape, random_rows):
    """Every cache a view of one flat buffer starting `offset` elements in (D odd or offset: no
    16-byte access is legal); fixed paths, or random ones."""
    layers, batch, heads, seq = shape
    gen = seeded_generator(device, dim + seed)
    flat = torch.randn(2 * layers * batch * heads * seq * dim + offset, generator=gen, device=device).to(dtype)
    caches = list(flat[offset:].view(2 * layers, batch, heads, seq, dim).unbind(0))
    if random_rows:
        cpu = torch.Generator().manual_seed(dim + seed)
        seq_lens = torch.randint(0, 9, (batch,), generator=cpu).to(device)
        accepted = random_accepted(batch, 30, cpu).to(device)
    else:
        seq_lens = torch.tensor([0, 5, 8], device=device)
        accepted = torch.tensor([[0, 2, 3], [0, 1, 4], [0, -1, -1]], device=device)
    return _inputs([flat], caches[:layers], caches[layers:], seq_lens, accepted)


def evenly_spaced(seed, *, device):
    """Every other slice of one block (K forwards, V backwards): a constant step, no table."""
    block = torch.randn(5, 2, 2, 6, 4, generator=seeded_generator(device, 9 + seed), device=device)
    return _inputs([block], [block[0], block[2]], [block[3], block[1]], torch.tensor([0, 1], device=device),
                   torch.tensor([[0, 2, 3], [0, 1, 3]], device=device))


def whole_tensors(seed, *, device, layout):
    """The op's other form: K and V as [L, B, Hkv, S, D] tensors (the launchers see every layer through one)."""
    _, _, owners = make_caches(layout, 3, 4, 2, 12, 8, torch.bfloat16, device, seeded_generator(device, 5 + seed))
    k, v = owners if layout == "stacked" else (owner.transpose(2, 3) for owner in owners)
    cpu = torch.Generator().manual_seed(5 + seed)
    return _inputs(owners, k, v, torch.randint(0, 4, (4,), generator=cpu).to(device),
                   random_accepted(4, 8, cpu).to(device))


def long_paths(seed, *, device, heads, dim):
    """Paths far longer than one block of entries (CUDA stages blockDim entries at a time)."""
    k, v, owners = make_caches("stacked", 2, 2, heads, 2000, dim, torch.bfloat16, device,
                               seeded_generator(device, 3 + seed))
    cpu = torch.Generator().manual_seed(3 + seed)
    picks = (torch.randperm(1500, generator=cpu)[:1100] + 1).sort().values
    accepted = torch.full((2, 1200), -1, dtype=torch.int64)
    accepted[0, 0], accepted[0, 1:1101] = 0, picks
    accepted[1, :700] = torch.arange(700) * 2  # a chain for 1 entry, then every other node
    return _inputs(owners, k, v, torch.tensor([7, 300], device=device), accepted.to(device))


def rollback_inputs(seed, *, device, batch):
    gen = seeded_generator(device, seed)
    return dict(seq_lens=torch.randint(0, 4096, (batch,), generator=gen, device=device),
                num_accepted=torch.randint(0, 9, (batch,), generator=gen, device=device))


# ------------------------------------------------------------------ running and judging

def run_compact(x, backend):
    """Restore every allocation, compact in place; (new lengths, all K caches, all V caches)."""
    from .. import ops

    for owner, pristine in zip(x["owners"], x["pristine"]):
        owner.copy_(pristine)  # copy_ is capturable
    lens = ops.kv_compact(x["k_caches"], x["v_caches"], x["seq_lens"], x["accepted_nodes"], backend=backend)
    stacked = [c.clone() if isinstance(c, torch.Tensor) else torch.stack(c) if c else torch.empty(0, device=lens.device)
               for c in (x["k_caches"], x["v_caches"])]
    return (lens, *stacked)


def run_rollback(x, backend):
    from .. import ops

    return (ops.kv_rollback(**x, backend=backend),)


def rollback_arithmetic(x):
    return (x["seq_lens"] + x["num_accepted"] + 1,)


def _unmoved(got, x):
    """The compacted caches equal the pristine ones (nothing moved)."""
    for owner, pristine in zip(x["owners"], x["pristine"]):
        owner.copy_(pristine)
    return torch.equal(got[1], torch.stack(x["k_caches"])) and torch.equal(got[2], torch.stack(x["v_caches"]))


def _jumped(got, x):
    """JUMP_ROW: the JUMP_MOVES slots hold what their sources held; every other slot unchanged."""
    for owner, pristine in zip(x["owners"], x["pristine"]):
        owner.copy_(pristine)
    targets = list(JUMP_MOVES)
    for new, old in ((got[1], torch.stack(x["k_caches"])), (got[2], torch.stack(x["v_caches"]))):
        if not all(torch.equal(new[:, JUMP_ROW, :, dst], old[:, JUMP_ROW, :, src]) for dst, src in JUMP_MOVES.items()):
            return False
        changed = torch.zeros(new.shape[1], new.shape[3], dtype=torch.bool, device=new.device)
        changed[JUMP_ROW, targets] = True
        if not torch.equal(new.transpose(2, 3)[:, ~changed], old.transpose(2, 3)[:, ~changed]):
            return False
    return True


def _chain_answer(got, x):
    return got[0].tolist() == CHAIN_LENGTHS and got[0].dtype == torch.int32 and _unmoved(got, x)


def _has_lengths(want, got, x):
    return got[0].tolist() == want


def lengths_are(want):
    """Exact outputs, and new lengths `want`."""
    return with_checks(exact(OUTPUTS), expect(f"lengths {want}", partial(_has_lengths, want)))


# ------------------------------------------------------------------ the case tables

def _shape_rows(profile):
    rows = []
    for index, (layers, batch, hkv, s_max, d, n, layout, dtypes, lens_dtype) in enumerate(kv_shapes(profile)):
        name = f"L={layers} B={batch} Hkv={hkv} S={s_max} D={d} N={n} {LAYOUT_NAMES[layout]}"
        name += " int32 lengths" if lens_dtype != torch.int64 else ""
        for dtype in dtypes:
            settings = dict(layers=layers, batch=batch, hkv=hkv, s_max=s_max, d=d, n=n, layout=layout, dtype=dtype,
                            lens_dtype=lens_dtype)
            rows.append(Row(name, dtype, random_compact, settings, exact(OUTPUTS),
                            graph=index == 0 and dtype == dtypes[-1]))
    return rows


def _edge_rows(profile):
    """The crafted kv_compact cases (cheap: every tier)."""
    tier, base = EDGE_TIERS[profile], exact(OUTPUTS)
    rows = []
    for layout in ("stacked", "separate"):
        rows += [Row(f"chain, root-only and empty rows move nothing, int32 lengths, {LAYOUT_NAMES[layout]}",
                     torch.bfloat16, chain_rows, dict(layout=layout), with_checks(base, expect(
                         f"lengths {CHAIN_LENGTHS} (int32) and no slot moved", _chain_answer))),
                 Row(f"a path leaving the chain moves only its tail, {LAYOUT_NAMES[layout]}", torch.bfloat16,
                     jump_rows, dict(layout=layout), with_checks(base, expect(
                         f"row {JUMP_ROW}: slots 6, 7 <- 8, 10 and nothing else moved", _jumped)))]
    rows += [Row("M=0", torch.float16, short_paths, dict(m=0), lengths_are([1, 2, 3])),
             Row("M=1", torch.float16, short_paths, dict(m=1), lengths_are([2, 2, 4])),
             Row("no layers, B=2", torch.float32, no_layers, dict(batch=2), lengths_are([6, 3])),
             Row("no layers, B=0", torch.float32, no_layers, dict(batch=0), lengths_are([]))]
    rows += [Row(f"misaligned views D={dim} offset={offset}", dtype, misaligned_views,
                 dict(dim=dim, offset=offset, dtype=dtype, shape=tier["misaligned_shape"],
                      random_rows=tier["misaligned_random_rows"]), base)
             for dim, offset in tier["misaligned_views"] for dtype in tier["misaligned_dtypes"]]
    rows.append(Row("evenly spaced layers, K forwards and V backwards", torch.float32, evenly_spaced, {}, base))
    rows += [Row(f"K and V as two [L, B, Hkv, S, D] tensors, {LAYOUT_NAMES[layout]}", torch.bfloat16, whole_tensors,
                 dict(layout=layout), base) for layout in ("stacked", "nhd")]
    rows += [Row(f"long paths M=1200 Hkv={heads} D={dim}", torch.bfloat16, long_paths, dict(heads=heads, dim=dim),
                 base) for heads, dim in tier["long_paths"]]
    return rows


def _rollback_rows(profile):
    """kv_rollback is one add on the device (no kernel): the torch backend against the arithmetic."""
    return [Row(f"B={batch}", None, rollback_inputs, dict(batch=batch), exact(("new_seq_lens",)), graph=True)
            for batch in EDGE_TIERS[profile]["rollback_batches"]]


def kv_cases(profile, device):
    return (cases("kv_compact", run_compact, _shape_rows(profile) + _edge_rows(profile), device)
            + cases("kv_rollback", run_rollback, _rollback_rows(profile), device, backends=("torch",),
                    reference=rollback_arithmetic))
