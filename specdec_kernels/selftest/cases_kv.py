"""The KV cache ops' shapes and cases (kv_compact over both cache layouts, kv_rollback)."""

import torch

from .compare import exact
from .inputs import _gen
from .model import DTYPES, Case


def kv_shapes(profile):
    """(layers, B, Hkv, S_max, D, N tree nodes, one allocation?)."""
    if profile == "tiny":
        return [(2, 3, 2, 24, 16, 6, True), (2, 2, 1, 16, 8, 4, False)]
    small = [(4, 3, 2, 100, 64, 8, True), (3, 4, 2, 80, 128, 16, False)]
    if profile == "quick":
        return small
    return small + [(32, 8, 8, 1088, 128, 64, True), (32, 32, 8, 272, 128, 8, False)]


def kv_cases(profile, device):
    from .. import ops

    cases = []
    for index, (layers, batch, hkv, s_max, d, n, one) in enumerate(kv_shapes(profile)):
        shape = f"L={layers} B={batch} Hkv={hkv} S={s_max} D={d} N={n} {'one allocation' if one else 'per-layer tensors'}"
        for dtype in DTYPES:
            def build(seed, layers=layers, batch=batch, hkv=hkv, s_max=s_max, d=d, n=n, one=one, dtype=dtype):
                gen = _gen(device, seed)
                shape = (layers, batch, hkv, s_max, d)
                pristine = [torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(2)]
                if one:  # SpecCache's layout: the layers are views of one [L, B, Hkv, S, D] tensor
                    work = [torch.empty(shape, dtype=dtype, device=device) for _ in range(2)]
                    layers_k, layers_v = list(work[0].unbind(0)), list(work[1].unbind(0))
                else:
                    layers_k = [torch.empty(shape[1:], dtype=dtype, device=device) for _ in range(layers)]
                    layers_v = [torch.empty(shape[1:], dtype=dtype, device=device) for _ in range(layers)]
                seq_lens = torch.randint(0, s_max - n + 1, (batch,), generator=gen, device=device)
                # accepted paths: the root, then increasing node ids, then -1 (a tree verify op's output)
                width = min(n, 9)
                cpu = torch.Generator().manual_seed(seed)
                rows = []
                for _ in range(batch):
                    m = int(torch.randint(0, width, (), generator=cpu))
                    nodes = sorted((torch.randperm(n - 1, generator=cpu)[:m] + 1).tolist())
                    rows.append([0] + nodes + [-1] * (width - 1 - m))
                accepted = torch.tensor(rows, dtype=torch.int64, device=device)
                return dict(pristine_k=pristine[0], pristine_v=pristine[1], k_caches=layers_k, v_caches=layers_v,
                            seq_lens=seq_lens, accepted_nodes=accepted)

            def run(x, backend):
                # start every run from the same cache contents (the op works in place); copy_ is capturable
                for pristine, caches in ((x["pristine_k"], x["k_caches"]), (x["pristine_v"], x["v_caches"])):
                    for layer, cache in enumerate(caches):
                        cache.copy_(pristine[layer])
                lens = ops.kv_compact(x["k_caches"], x["v_caches"], x["seq_lens"], x["accepted_nodes"], backend=backend)
                return lens, torch.stack(x["k_caches"]), torch.stack(x["v_caches"])

            cases.append(Case("kv_compact", shape, dtype, build, run, exact(("new_seq_lens", "k_caches", "v_caches")),
                              graph=index == 0 and dtype == torch.bfloat16))
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
