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


def sampled_sibling_tokens(draft, parents, gen):
    """Each node's children as draws WITHOUT replacement from the parent's draft row (Gumbel-top-k
    over the row; the child of sibling rank j takes the j-th key), as siblings="without_replacement"
    expects. Vectorised: a [B, N, N - 1] key table, no per-node loop."""
    batch, n, vocab = draft.shape
    gumbel = -torch.log(-torch.log(torch.rand(batch, n, vocab, generator=gen, device=draft.device).clamp(min=1e-12)))
    keys = torch.log(draft.float()) + gumbel  # -inf where q = 0: never drawn while mass is left
    ranked = torch.topk(keys, max(1, min(n - 1, vocab)), dim=-1).indices  # [B, N, K] per parent, draw order
    parent = parents.clamp(min=0)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & torch.ones(n, n, dtype=torch.bool, device=draft.device).tril(-1)
    rank = same.sum(dim=2).clamp(max=ranked.shape[2] - 1)  # earlier siblings
    tokens = ranked.gather(1, parent.unsqueeze(2).expand(-1, -1, ranked.shape[2])).gather(2, rank.unsqueeze(2)).squeeze(2)
    return torch.where(parents < 0, -1, tokens)


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
            def sampled_sibling_inputs(seed, sampling_inputs=sampling_inputs):
                # siblings drawn from the parent's row without replacement (draft row v = the q
                # of v's children), verified with q updated after each rejected sibling
                x = sampling_inputs(seed)
                tokens = sampled_sibling_tokens(x["draft_probs"], x["parents"], _gen(device, seed + 3))
                tokens[:, 0] = 0
                x.update(tree_tokens=tokens, siblings="without_replacement")
                return x

            cases.append(Case("tree_rejection_sample", f"{shape} sampled siblings", dtype, sampled_sibling_inputs,
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

                def seeded_sampled(seed, seeded=seeded, sampled_sibling_inputs=sampled_sibling_inputs):
                    x = seeded(seed)
                    y = sampled_sibling_inputs(seed)
                    x.update(tree_tokens=y["tree_tokens"], siblings="without_replacement")
                    return x

                cases.append(Case("tree_rejection_sample", f"{shape} sampled siblings, per-row seeds", dtype,
                                  seeded_sampled, lambda x, be: ops.tree_rejection_sample(**x, backend=be),
                                  exact(outputs)))
    return cases
