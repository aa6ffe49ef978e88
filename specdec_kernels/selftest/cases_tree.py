"""The tree verification ops' shapes and cases."""

import torch

from .compare import exact
from .inputs import _gen, random_logits, random_parents
from .model import DTYPES, Case


def tree_shapes(profile):
    """(B, N, V) of the tree verification ops."""
    if profile == "tiny":
        return [(2, 7, 40)]
    small = [(1, 8, 1000), (4, 16, 32000)]
    if profile == "quick":
        return small
    return small + [(8, 64, 151936), (64, 16, 151936), (256, 8, 32000)]


def tree_cases(profile, device):
    from .. import ops
    from ..reference._sampling import safe_argmax

    outputs = ("output_tokens", "num_accepted", "accepted_nodes")
    cases = []
    for index, (batch, n, vocab) in enumerate(tree_shapes(profile)):
        shape = f"B={batch} N={n} V={vocab}"
        for dtype in DTYPES:
            graph = index == 0 and dtype == torch.bfloat16

            def greedy_inputs(seed, batch=batch, n=n, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed)
                parents = random_parents(batch, n, seed).to(device)
                logits = random_logits(batch, n, vocab, dtype, gen, device)
                parent_top = safe_argmax(logits).gather(1, parents.clamp(min=0))
                tokens = torch.where(torch.rand(batch, n, generator=gen, device=device) < 0.6, parent_top,
                                     torch.randint(0, vocab, (batch, n), generator=gen, device=device))
                tokens = torch.where(parents < 0, -1, tokens)
                tokens[:, 0] = 0
                return dict(target_logits=logits, tree_tokens=tokens, parents=parents, max_depth=n - 1)

            cases.append(Case("tree_greedy_verify", shape, dtype, greedy_inputs,
                              lambda x, be: ops.tree_greedy_verify(**x, backend=be), exact(outputs), graph))

            def sampling_inputs(seed, batch=batch, n=n, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed)
                parents = random_parents(batch, n, seed).to(device)
                logits = torch.randn(batch, n, vocab, generator=gen, device=device) * 2
                target = torch.softmax(logits, -1)
                draft = torch.softmax(logits + torch.randn(batch, n, vocab, generator=gen, device=device), -1)
                # children as a real drafter proposes them: the parent's target argmax, the draft's own
                # argmax (likely accepted), random ids (likely rejected)
                parent = parents.clamp(min=0)
                choice = torch.rand(batch, n, generator=gen, device=device)
                tokens = torch.where(choice < 0.4, safe_argmax(target).gather(1, parent),
                                     torch.where(choice < 0.7, safe_argmax(draft).gather(1, parent),
                                                 torch.randint(0, vocab, (batch, n), generator=gen, device=device)))
                tokens = torch.where(parents < 0, -1, tokens)
                tokens[:, 0] = 0
                return dict(target_probs=target.to(dtype), draft_probs=draft.to(dtype), tree_tokens=tokens,
                            parents=parents, max_depth=n - 1,
                            uniforms=torch.rand(batch, n, generator=gen, device=device, dtype=torch.float64))

            cases.append(Case("tree_rejection_sample", f"{shape} uniforms", dtype, sampling_inputs,
                              lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs), graph))
            if dtype == torch.float32:
                def seeded(seed, sampling_inputs=sampling_inputs, batch=batch):
                    x = sampling_inputs(seed)
                    del x["uniforms"]
                    x["seed"] = torch.randint(-(2**62), 2**62, (batch,), generator=_gen(device, seed + 1), device=device)
                    x["offsets"] = torch.randint(0, 5000, (batch,), generator=_gen(device, seed + 2), device=device)
                    return x

                cases.append(Case("tree_rejection_sample", f"{shape} per-row seeds", dtype, seeded,
                                  lambda x, be: ops.tree_rejection_sample(**x, backend=be), exact(outputs)))
    return cases
