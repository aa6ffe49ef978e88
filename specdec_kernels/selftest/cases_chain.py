"""The chain verification and sampling ops' shapes and cases."""

import torch

from .compare import bild_threshold, close, compare_bild, compare_logits_sampling, exact
from .inputs import _gen, near_top_drafts, ragged, random_logits, random_probs
from .model import DTYPES, Case


def chain_shapes(profile):
    """(B, g, V) of the chain verification and sampling ops."""
    if profile == "tiny":
        return [(3, 3, 50), (2, 1, 300)]
    small = [(1, 4, 1000), (3, 5, 32000), (64, 1, 4099)]
    if profile == "quick":
        return small
    return small + [(1, 8, 151936), (64, 4, 128256), (256, 4, 151936), (256, 8, 32000)]


def chain_cases(profile, device):
    from .. import ops

    verify_outputs = ("output_tokens", "num_accepted")
    cases = []
    for index, (batch, g, vocab) in enumerate(chain_shapes(profile)):
        shape = f"B={batch} g={g} V={vocab}"
        for dtype in DTYPES:
            use_ragged = (index + DTYPES.index(dtype)) % 2 == 1
            suffix = " ragged" if use_ragged else ""
            graph = index == 0 and dtype == torch.bfloat16

            def logits_inputs(seed, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged):
                gen = _gen(device, seed)
                logits = random_logits(batch, g + 1, vocab, dtype, gen, device)
                return dict(target_logits=logits, draft_tokens=near_top_drafts(logits, gen),
                            num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)

            cases.append(Case("greedy_verify", shape + suffix, dtype, logits_inputs,
                              lambda x, be: ops.greedy_verify(**x, backend=be), exact(verify_outputs), graph))
            beta, tau = ((1, 0.0), (3, 0.7), (50, 3.0), (2, 0.0))[(index + DTYPES.index(dtype)) % 4]
            cases.append(Case("relaxed_verify", f"{shape} top_beta={beta} tau={tau}{suffix}", dtype, logits_inputs,
                              lambda x, be, beta=beta, tau=tau: ops.relaxed_verify(**x, top_beta=beta, tau=tau, backend=be),
                              exact(verify_outputs), graph))

            def bild_inputs(seed, logits_inputs=logits_inputs, index=index):
                x = logits_inputs(seed)
                x["rollback_threshold"] = bild_threshold(x["target_logits"], x["draft_tokens"], (1.5, 4.0, 9.0)[index % 3])
                return x

            cases.append(Case("bild_verify", shape + suffix, dtype, bild_inputs,
                              lambda x, be: ops.bild_verify(**x, backend=be), compare_bild, graph))
            cases.append(Case("max_prob", f"[{batch},{g + 1},{vocab}]", dtype,
                              lambda seed, batch=batch, g=g, vocab=vocab, dtype=dtype: dict(
                                  logits=random_logits(batch, g + 1, vocab, dtype, _gen(device, seed), device)),
                              lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)),
                              graph))

            def probs_inputs(seed, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged):
                gen = _gen(device, seed)
                target, draft, drafts = random_probs(batch, g, vocab, dtype, gen, device)
                u = torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64)
                u = torch.where(torch.rand(u.shape, generator=gen, device=device) < 0.1, torch.zeros_like(u), u)
                return dict(target_probs=target, draft_probs=draft, draft_tokens=drafts, uniforms=u,
                            num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)

            cases.append(Case("rejection_sample", f"{shape} uniforms{suffix}", dtype, probs_inputs,
                              lambda x, be: ops.rejection_sample(**x, backend=be), exact(verify_outputs), graph))

            def seeded_inputs(seed, probs_inputs=probs_inputs, batch=batch):
                x = probs_inputs(seed)
                del x["uniforms"]
                x["offsets"] = torch.randint(0, 2**40, (batch,), generator=_gen(device, seed + 1), device=device)
                return x

            cases.append(Case("rejection_sample", f"{shape} seed+offsets{suffix}", dtype, seeded_inputs,
                              lambda x, be: ops.rejection_sample(**x, seed=1234, backend=be), exact(verify_outputs),
                              graph))

            def sampling_logits_inputs(seed, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged):
                gen = _gen(device, seed)
                t = torch.randn(batch, g + 1, vocab, generator=gen, device=device) * 3
                q = t[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=device) * 0.7
                temperature = 0.8
                drafts = torch.multinomial(torch.softmax(q.to(dtype).float() / temperature, -1).reshape(-1, vocab), 1,
                                           generator=gen).reshape(batch, g)
                return dict(target_logits=t.to(dtype), draft_logits=q.to(dtype), draft_tokens=drafts,
                            temperature=temperature,
                            uniforms=torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64),
                            num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)

            cases.append(Case("rejection_sample_logits", f"{shape} T=0.8 uniforms{suffix}", dtype,
                              sampling_logits_inputs, lambda x, be: ops.rejection_sample_logits(**x, backend=be),
                              compare_logits_sampling, graph))

            # block verification: the same inputs (exact with uniforms and seeds; logits within
            # the documented margin), per-row temperatures on every other shape
            cases.append(Case("block_verify", f"{shape} uniforms{suffix}", dtype, probs_inputs,
                              lambda x, be: ops.block_verify(**x, backend=be), exact(verify_outputs), graph))
            cases.append(Case("block_verify", f"{shape} seed+offsets{suffix}", dtype, seeded_inputs,
                              lambda x, be: ops.block_verify(**x, seed=1234, backend=be), exact(verify_outputs),
                              graph))

            def block_logits_inputs(seed, sampling_logits_inputs=sampling_logits_inputs, batch=batch, index=index):
                x = sampling_logits_inputs(seed)
                if index % 2:
                    x["temperature"] = torch.full((batch,), 0.8, device=device)  # per-row temperatures
                return x

            cases.append(Case("block_verify_logits", f"{shape} T=0.8 uniforms{suffix}", dtype, block_logits_inputs,
                              lambda x, be: ops.block_verify_logits(**x, backend=be), compare_block_logits, graph))
    return cases


def _block_boundary_explains(b, inputs, got, want, margin=1e-4):
    """True when row b's difference comes from a decision within `margin` of its boundary,
    recomputed in float64: a coin against its threshold h_i, an almost empty residual, or
    the final draw's threshold against a cdf boundary (the softmax differs in the last ulps)."""
    drafts, u = inputs["draft_tokens"][b], inputs["uniforms"][b].double()
    temperature, counts = inputs["temperature"], inputs.get("num_draft_tokens")
    t = float(temperature[b]) if isinstance(temperature, torch.Tensor) else temperature
    p = torch.softmax(inputs["target_logits"][b].double() / t, -1)
    q = torch.softmax(inputs["draft_logits"][b].double() / t, -1)
    g, vocab = drafts.shape[0], p.shape[-1]
    n = g if counts is None else int(counts[b].clamp(0, g))
    ratios = [1.0]
    for i in range(n):
        tok = int(drafts[i])
        ok = 0 <= tok < vocab and float(q[i, tok]) > 0
        ratios.append(min(1.0, ratios[-1] * float(p[i, tok]) / float(q[i, tok])) if ok else 0.0)
    mass = [float((ratios[j] * p[j] - q[j]).clamp(min=0).sum()) for j in range(n)]
    for i in range(1, n + 1):
        h = ratios[i] if i == n else (mass[i] / (mass[i] + 1 - ratios[i]) if mass[i] + 1 - ratios[i] > 0 else 1.0)
        if abs(float(u[i - 1]) - h) <= margin:
            return True
    tau = int(got[1][b])
    if tau != int(want[1][b]):
        return False
    residual = (ratios[tau] * p[tau] - q[tau]).clamp(min=0) if tau < n else p[tau]
    if float(residual.sum()) < margin:
        return True  # a nearly empty residual: the fallback decision itself is marginal
    cdf = residual.cumsum(0)
    lo = min(int(got[0][b, tau]), int(want[0][b, tau]))
    return abs(float(cdf[lo]) - float(u[g]) * float(cdf[-1])) <= margin * float(cdf[-1])


def compare_block_logits(got, want, inputs):
    """Equal rows, except at most max(1, 2%) rows that a near-boundary decision explains."""
    problem = exact(("output_tokens", "num_accepted"))(got[:2], want[:2], inputs)[1]
    if problem is None or got[0].shape != want[0].shape:
        return (0.0 if problem is None else None), problem
    rows = ((got[0] != want[0]).any(1) | (got[1] != want[1])).nonzero().flatten().tolist()
    if len(rows) > max(1, 0.02 * got[0].shape[0]):
        return float(len(rows)), f"{len(rows)} rows differ (more than 2%): {problem}"
    unexplained = [b for b in rows if not _block_boundary_explains(b, inputs, got, want)]
    if unexplained:
        b = unexplained[0]
        return float(len(rows)), f"row {b} differs away from any decision boundary: {problem}"
    return float(len(rows)), None
