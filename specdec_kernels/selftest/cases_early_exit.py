"""early_exit_topk's shapes and cases."""

import torch

from .compare import compare_topk
from .inputs import _gen
from .model import DTYPES, Case


def early_exit_shapes(profile):
    """(B, H, V, k, norm, dtypes)."""
    if profile == "tiny":
        return [(3, 64, 300, 5, "rms", (torch.float32,)), (2, 32, 100, 1, "layer", (torch.float32,))]
    small = [(5, 520, 3001, k, norm, DTYPES) for k, norm in ((1, "rms"), (5, "layer"), (16, "none"))]
    if profile == "quick":
        return small
    return small + [(b, 4096, v, 8, "rms", (torch.bfloat16,)) for b in (1, 64) for v in (128256, 151936)] + \
        [(8, 2048, 32000, 8, "rms", (torch.float16,))]


def early_exit_cases(profile, device):
    from .. import ops

    cases = []
    for index, (batch, hidden, vocab, k, norm, dtypes) in enumerate(early_exit_shapes(profile)):
        for dtype in dtypes:
            def build(seed, batch=batch, hidden=hidden, vocab=vocab, k=k, norm=norm, dtype=dtype):
                gen = _gen(device, seed)
                x = dict(hidden=torch.randn(batch, hidden, generator=gen, device=device) * 3 + 0.5,
                         norm_weight=1 + 0.2 * torch.randn(hidden, generator=gen, device=device),
                         lm_head_weight=torch.randn(vocab, hidden, generator=gen, device=device) * hidden ** -0.5)
                if norm == "layer":
                    x["norm_bias"] = 0.1 * torch.randn(hidden, generator=gen, device=device)
                x = {name: t.to(dtype) for name, t in x.items()}
                return dict(x, k=k, norm=norm)

            cases.append(Case("early_exit_topk", f"B={batch} H={hidden} V={vocab} k={k} norm={norm}", dtype, build,
                              lambda x, be: ops.early_exit_topk(**x, backend=be), compare_topk,
                              graph=index == 0 and dtype == dtypes[-1]))
    return cases
