"""The KV cache ops' shapes and cases: kv_compact over every cache layout (one allocation: stacked,
K and V interleaved, an NHD view; per-layer tensors: contiguous, NHD, padded / mixed strides,
misaligned views), random accepted paths (a random tree's path, a chain, the root alone, nothing),
the edge rows (chains move nothing, M = 0 / 1, no layers, int32 lengths, long paths), and
kv_rollback. The Triton interpreter tests (tiny), the GPU tests and the selftest draw from here.

kv_compact works in place: a case's inputs hold the pristine contents of every allocation, and
each run first copies them back, so every backend and the reference start from the same caches
and the whole caches (untouched slots included) are compared."""

import torch

from .compare import exact, expect, with_checks
from .inputs import _gen
from .model import DTYPES, Case

OUTPUTS = ("new_seq_lens", "k_caches", "v_caches")
LAYOUT_NAMES = {"stacked": "one allocation [L, B, Hkv, S, D]", "kv_interleaved": "one allocation [L, 2, B, Hkv, S, D]",
                "nhd": "one allocation, NHD view", "separate": "per-layer tensors",
                "separate_nhd": "per-layer tensors, every other NHD",
                "mixed_strides": "per-layer tensors, mixed strides (NHD, padded, contiguous)"}


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


def run_compact(x, backend):
    """Restore every allocation, compact in place; (new lengths, all K caches, all V caches)."""
    from .. import ops

    for owner, pristine in zip(x["owners"], x["pristine"]):
        owner.copy_(pristine)  # copy_ is capturable
    lens = ops.kv_compact(x["k_caches"], x["v_caches"], x["seq_lens"], x["accepted_nodes"], backend=backend)
    stacked = [c.clone() if isinstance(c, torch.Tensor) else torch.stack(c) if c else torch.empty(0, device=lens.device)
               for c in (x["k_caches"], x["v_caches"])]
    return (lens, *stacked)


def _edge_cases(profile, device):
    """(name, dtype, build(seed), compare) of the crafted kv_compact cases (cheap: every tier)."""
    tiny = profile == "tiny"
    cases = []
    base = exact(OUTPUTS)
    for layout in ("stacked", "separate"):
        def chain_rows(seed, layout=layout):
            k, v, owners = make_caches(layout, 2, 5, 2, 16, 8, torch.bfloat16, device, _gen(device, 3 + seed))
            accepted = torch.tensor([[0, 1, 2, 3, -1], [0, -1, -1, -1, -1], [-1, -1, -1, -1, -1], [0, 1, 2, 3, 4],
                                     [0, 1, 2, -1, -1]], device=device)
            seq_lens = torch.tensor([3, 0, 7, 11, 2], dtype=torch.int32, device=device)
            return _inputs(owners, k, v, seq_lens, accepted)

        cases.append((f"chain, root-only and empty rows move nothing, int32 lengths, {LAYOUT_NAMES[layout]}",
                      torch.bfloat16, chain_rows, with_checks(
                          base, expect("lengths [7, 1, 7, 16, 5] (int32) and no slot moved",
                                       lambda got, x: got[0].tolist() == [7, 1, 7, 16, 5]
                                       and got[0].dtype == torch.int32 and _unmoved(got, x)))))

        def jump(seed, layout=layout):
            x = chain_rows(seed, layout)
            x["accepted_nodes"] = torch.tensor([[0, 1, 2, 5, 7]] + [[0, -1, -1, -1, -1]] * 4, device=device)
            return x

        cases.append((f"a path leaving the chain moves only its tail, {LAYOUT_NAMES[layout]}", torch.bfloat16, jump,
                      with_checks(base, expect("row 0: slots 6, 7 <- 8, 10 and nothing else moved", _jumped))))
    for m in (0, 1):
        def short(seed, m=m):
            k, v, owners = make_caches("separate", 2, 3, 2, 8, 4, torch.float16, device, _gen(device, 4 + seed))
            return _inputs(owners, k, v, torch.tensor([1, 2, 3], device=device),
                           torch.tensor([[0], [-1], [0]], device=device)[:, :m])

        want = [1, 2, 3] if m == 0 else [2, 2, 4]
        cases.append((f"M={m}", torch.float16, short, with_checks(
            base, expect(f"lengths {want}", lambda got, x, want=want: got[0].tolist() == want))))
    for batch in (2, 0):
        def no_layers(seed, batch=batch):
            return _inputs([], [], [], torch.tensor([4, 0], device=device)[:batch],
                           torch.tensor([[0, 2, -1], [0, 1, 3]], device=device)[:batch])

        want = [6, 3][:batch]
        cases.append((f"no layers, B={batch}", torch.float32, no_layers, with_checks(
            base, expect(f"lengths {want}", lambda got, x, want=want: got[0].tolist() == want))))
    # odd D and views starting one (or more) elements into their storage: no 16-byte access is legal
    aligned = [(3, 1)] if tiny else [(3, 1), (5, 0), (12, 2), (64, 1)]
    for dim, offset in aligned:
        for dtype in ((torch.float16, torch.float32) if tiny else (torch.float32, torch.bfloat16)):
            def misaligned(seed, dim=dim, offset=offset, dtype=dtype):
                layers, batch, heads, seq = (2, 3, 2, 12) if tiny else (3, 5, 3, 40)
                gen = _gen(device, dim + seed)
                flat = torch.randn(2 * layers * batch * heads * seq * dim + offset, generator=gen,
                                   device=device).to(dtype)
                caches = list(flat[offset:].view(2 * layers, batch, heads, seq, dim).unbind(0))
                if tiny:
                    seq_lens = torch.tensor([0, 5, 8], device=device)
                    accepted = torch.tensor([[0, 2, 3], [0, 1, 4], [0, -1, -1]], device=device)
                else:
                    cpu = torch.Generator().manual_seed(dim + seed)
                    seq_lens = torch.randint(0, 9, (batch,), generator=cpu).to(device)
                    accepted = random_accepted(batch, 30, cpu).to(device)
                return _inputs([flat], caches[:layers], caches[layers:], seq_lens, accepted)

            cases.append((f"misaligned views D={dim} offset={offset}", dtype, misaligned, base))

    # evenly spaced separate tensors (every other slice of one block, K forwards, V backwards): no table
    def evenly_spaced(seed):
        block = torch.randn(5, 2, 2, 6, 4, generator=_gen(device, 9 + seed), device=device)
        return _inputs([block], [block[0], block[2]], [block[3], block[1]], torch.tensor([0, 1], device=device),
                       torch.tensor([[0, 2, 3], [0, 1, 3]], device=device))

    cases.append(("evenly spaced layers, K forwards and V backwards", torch.float32, evenly_spaced, base))
    # the op's other form: K and V as [L, B, Hkv, S, D] tensors (the launchers see every layer through one)
    for layout in ("stacked", "nhd"):
        def whole_tensors(seed, layout=layout):
            _, _, owners = make_caches(layout, 3, 4, 2, 12, 8, torch.bfloat16, device, _gen(device, 5 + seed))
            k, v = owners if layout == "stacked" else (owner.transpose(2, 3) for owner in owners)
            cpu = torch.Generator().manual_seed(5 + seed)
            return _inputs(owners, k, v, torch.randint(0, 4, (4,), generator=cpu).to(device),
                           random_accepted(4, 8, cpu).to(device))

        cases.append((f"K and V as two [L, B, Hkv, S, D] tensors, {LAYOUT_NAMES[layout]}", torch.bfloat16,
                      whole_tensors, base))
    if not tiny:  # paths far longer than one block of entries (CUDA stages blockDim entries at a time)
        for heads, dim in ((1, 8), (8, 128)):
            def long_paths(seed, heads=heads, dim=dim):
                k, v, owners = make_caches("stacked", 2, 2, heads, 2000, dim, torch.bfloat16, device,
                                           _gen(device, 3 + seed))
                cpu = torch.Generator().manual_seed(3 + seed)
                picks = (torch.randperm(1500, generator=cpu)[:1100] + 1).sort().values
                accepted = torch.full((2, 1200), -1, dtype=torch.int64)
                accepted[0, 0], accepted[0, 1:1101] = 0, picks
                accepted[1, :700] = torch.arange(700) * 2  # a chain for 1 entry, then every other node
                return _inputs(owners, k, v, torch.tensor([7, 300], device=device), accepted.to(device))

            cases.append((f"long paths M=1200 Hkv={heads} D={dim}", torch.bfloat16, long_paths, base))
    return cases


def _unmoved(got, x):
    """The compacted caches equal the pristine ones (nothing moved)."""
    for owner, pristine in zip(x["owners"], x["pristine"]):
        owner.copy_(pristine)
    return torch.equal(got[1], torch.stack(x["k_caches"])) and torch.equal(got[2], torch.stack(x["v_caches"]))


def _jumped(got, x):
    """Row 0: slots 6, 7 hold what 8, 10 held; every other slot unchanged."""
    for owner, pristine in zip(x["owners"], x["pristine"]):
        owner.copy_(pristine)
    for new, old in ((got[1], torch.stack(x["k_caches"])), (got[2], torch.stack(x["v_caches"]))):
        if not (torch.equal(new[:, 0, :, 6], old[:, 0, :, 8]) and torch.equal(new[:, 0, :, 7], old[:, 0, :, 10])):
            return False
        changed = torch.zeros(new.shape[1], new.shape[3], dtype=torch.bool, device=new.device)
        changed[0, [6, 7]] = True
        if not torch.equal(new.transpose(2, 3)[:, ~changed], old.transpose(2, 3)[:, ~changed]):
            return False
    return True


def kv_cases(profile, device):
    from .. import ops

    cases = []
    for index, (layers, batch, hkv, s_max, d, n, layout, dtypes, lens_dtype) in enumerate(kv_shapes(profile)):
        shape = f"L={layers} B={batch} Hkv={hkv} S={s_max} D={d} N={n} {LAYOUT_NAMES[layout]}"
        if lens_dtype != torch.int64:
            shape += " int32 lengths"
        for dtype in dtypes:
            def build(seed, layers=layers, batch=batch, hkv=hkv, s_max=s_max, d=d, n=n, layout=layout, dtype=dtype,
                      lens_dtype=lens_dtype):
                k, v, owners = make_caches(layout, layers, batch, hkv, s_max, d, dtype, device, _gen(device, seed))
                cpu = torch.Generator().manual_seed(seed)
                seq_lens = torch.randint(0, s_max - n + 1, (batch,), generator=cpu).to(device, lens_dtype)
                return _inputs(owners, k, v, seq_lens, random_accepted(batch, n, cpu).to(device))

            cases.append(Case("kv_compact", shape, dtype, build, run_compact, exact(OUTPUTS),
                              graph=index == 0 and dtype == dtypes[-1]))
    for name, dtype, build, compare in _edge_cases(profile, device):
        cases.append(Case("kv_compact", name, dtype, build, run_compact, compare))
    # kv_rollback is one add on the device (no kernel): the torch backend on the device against the arithmetic
    for batch in ((3,) if profile == "tiny" else (1, 256)):
        def rollback_inputs(seed, batch=batch):
            gen = _gen(device, seed)
            return dict(seq_lens=torch.randint(0, 4096, (batch,), generator=gen, device=device),
                        num_accepted=torch.randint(0, 9, (batch,), generator=gen, device=device))

        cases.append(Case("kv_rollback", f"B={batch}", None, rollback_inputs,
                          lambda x, be: (ops.kv_rollback(**x, backend=be),), exact(("new_seq_lens",)), graph=True,
                          reference=lambda x: (x["seq_lens"] + x["num_accepted"] + 1,), backends=("torch",)))
    return cases
