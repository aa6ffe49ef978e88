"""tree_attention's shapes, tolerances and cases (contiguous and paged KV, trees and chains)."""

import torch

from .compare import close
from .inputs import _gen, random_parents
from .model import DTYPES, Case


# (out atol = rtol, lse atol) per dtype: the looser of the two backends' GPU-test tolerances
# (tests/test_gpu_tree_attention_{triton,cuda}.py); lse rtol 1e-5.
ATTENTION_TOL = {torch.float32: (1e-4, 2e-4), torch.float16: (1e-2, 2e-4), torch.bfloat16: (2e-2, 2e-4)}


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
    for n in (8, 64):
        for tree in (False, True):
            for page_size in (None, 16):
                production.append((prefixes, n, 32, 8, 128, (torch.bfloat16,), tree, page_size))
    production += [(prefixes, 32, 32, 8, 128, (torch.float16,), True, None),
                   (prefixes, 32, 32, 8, 64, (torch.bfloat16,), True, 16),
                   ([4096], 32, 32, 4, 128, (torch.bfloat16, torch.float32), True, 1),
                   ([1000, 4000], 16, 8, 1, 64, (torch.float32,), True, 64)]
    return small + production


def attention_cases(profile, device):
    from .. import ops
    from ..reference.attention import paged_from_contiguous

    cases = []
    for index, (prefixes, n, hq, hkv, d, dtypes, tree, page_size) in enumerate(attention_shapes(profile)):
        layout = "contiguous" if page_size is None else f"paged{page_size}"
        shape = (f"B={len(prefixes)} P<={max(prefixes)} N={n} Hq={hq} Hkv={hkv} D={d} "
                 f"{'tree' if tree else 'chain'} {layout}")
        for dtype in dtypes:
            def build(seed, prefixes=prefixes, n=n, hq=hq, hkv=hkv, d=d, dtype=dtype, tree=tree, page_size=page_size):
                gen = _gen(device, seed)
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
                    v, _ = paged_from_contiguous(v, page_size, generator=torch.Generator().manual_seed(seed),
                                                 spare_pages=7)
                parents = random_parents(batch, n, seed).to(device) if tree else None
                return dict(q=q, k_cache=k, v_cache=v, seq_lens=seq_lens, parents=parents, block_table=block_table)

            out_tol, lse_tol = ATTENTION_TOL[dtype]
            cases.append(Case("tree_attention", shape, dtype, build, lambda x, be: ops.tree_attention(**x, backend=be),
                              close(("out", "lse"), ((out_tol, out_tol), (lse_tol, 1e-5))),
                              graph=index in (0, 1) and dtype == dtypes[-1]))
    return cases
