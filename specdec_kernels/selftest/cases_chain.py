"""The chain verification and sampling ops' shapes and cases."""

import zlib

import torch

from .compare import (bild_threshold, boundary_excused, chain_structure, close, compare_bild, compare_logits_sampling,
                      exact, expect, with_checks)
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
    edges = logit_edge_cases(profile, device) + probs_edge_cases(profile, device) + logits_sampling_edge_cases(
        profile, device)
    return cases + (one_dtype_each(edges) if profile == "tiny" else edges)


def one_dtype_each(cases):
    """At "tiny" (the Triton interpreter on a CPU, where every call costs seconds) an edge case
    that exists in every dtype keeps one, picked by its name so the dtypes rotate over the cases;
    a GPU runs them all. The edge values are what the case checks; the dtypes' loads and
    conversions are checked by the random-shape cases in every dtype."""
    by_name = {}
    for case in cases:
        by_name.setdefault((case.op, case.name), []).append(case)
    kept = []
    for (op, name), group in by_name.items():
        dtypes = [case.dtype for case in group]
        if len(group) < 2 or len(set(dtypes)) != len(group):
            kept += group
            continue
        keep = dtypes[zlib.crc32(f"{op} {name}".encode()) % len(dtypes)]
        kept += [case for case in group if case.dtype == keep]
    return kept


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


compare_block_logits = boundary_excused(_block_boundary_explains)


# ---------------------------------------------------------------------------------------------
# Edge cases: crafted rows (NaN / inf / ties / padding / V = 1 / g = 0 / empty batches), strided
# and non-contiguous inputs, out-of-range ids (through the backend itself: the op refuses them
# where it can look, a GPU call cannot), every randomness mode. Small at "tiny" (the Triton
# interpreter in CI), production vocabularies on a GPU. One catalog for the CPU tests, the GPU
# tests and the selftest (issue 29).

INF, NAN = float("inf"), float("nan")
CHAIN_OUTPUTS = ("output_tokens", "num_accepted")
BETA_TAU = ((1, 0.0), (1, 5.0), (3, 0.0), (2, 0.7), (5, 1.5), (50, 3.0))


def _edge_vocabs(profile, tiny, gpu):
    """The vocabularies of an edge case: `tiny` on the CPU, `gpu` (quick: the first) on a GPU."""
    if profile == "tiny":
        return list(tiny)
    return list(gpu[:1]) if profile == "quick" else list(gpu)


def _impl(op):
    """Run `op` through the backend's own function (no value checks: ids >= V reach the kernel,
    as on a GPU, where the op cannot look at them); the torch backend is the reference."""
    from ..common import registry

    return lambda x, be: registry.implementation(op, be)(**x)


def _sweep(call, settings):
    """One case over several settings: run(x, be) concatenates call(x, be, s) over settings
    along the batch dimension (one comparison for a whole beta/tau or threshold sweep)."""
    def run(x, be):
        outs = [call(x, be, s) for s in (settings(x) if callable(settings) else settings)]
        return tuple(torch.cat(parts) for parts in zip(*outs))
    return run


def special_logit_rows(vocab):
    """[V] float32 rows hitting NaN / inf / tie corner cases (the argmax, rank and lse paths)."""
    v = vocab
    base = -5.0 - torch.arange(v, dtype=torch.float32) / v  # strictly decreasing, < 0
    idx = torch.arange(v)
    rows = []

    def row(fill=None, **_):
        return base.clone() if fill is None else torch.full((v,), fill)

    r = row(); r[v - 1] = 10.0; rows.append(r)  # max only at the last id
    r = row(); r[max(v - 2, 0)] = 10.0; r[v - 1] = 10.0; rows.append(r)  # tie ending at the last id
    r = row(); r[v // 2:] = 10.0; rows.append(r)  # tie spanning every later chunk
    r = row(); r[(idx >= v // 3) & ((idx % 8 == 0) | (idx % 8 == 7))] = 10.0; rows.append(r)  # chunk edges
    r = row(); r[(idx % 4096 == 4095) | ((idx % 4096 == 0) & (idx > 0))] = 10.0; rows.append(r)  # 4095 | 4096
    rows.append(row(1.5))  # constant row -> 0
    rows.append(row(NAN))  # all NaN -> 0
    rows.append(row(-INF))  # all -inf -> 0
    r = row(-INF); r[::2] = NAN; rows.append(r)  # NaN / -inf mix -> 0
    r = row(); r[0] = NAN; r[v - 1] = NAN; r[v // 2] = 100.0; rows.append(r)  # NaN never wins
    r = row(); r[v // 3] = INF; r[v - 1] = INF; r[0] = NAN; rows.append(r)  # the first +inf
    r = row(NAN); r[v - 1] = -INF; rows.append(r)  # NaN ties -inf -> 0
    r = row(-1.0); r[min(1, v - 1)] = -0.0; r[min(2, v - 1)] = 0.0; rows.append(r)  # -0 == +0
    r = row(-1.0); r[min(1, v - 1)] = 0.0; r[min(2, v - 1)] = -0.0; rows.append(r)
    r = row(); r[::3] = -INF; rows.append(r)  # -inf holes in a finite row
    r = row(-INF); r[v - 1] = 1.0; rows.append(r)  # one finite logit: NLL 0
    r = row(); r[v - 1] = 60000.0; r[v // 2] = 60000.0; rows.append(r)  # large, float16-representable
    return rows


def _special_logits(vocab, g, dtype, device, seed):
    """Row b: pattern b at position 0, random patterns elsewhere (every position a corner case)."""
    rows = special_logit_rows(vocab)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.empty(len(rows), g + 1, vocab)
    for b in range(len(rows)):
        logits[b, 0] = rows[b]
        for p in range(1, g + 1):
            logits[b, p] = rows[int(torch.randint(0, len(rows), (1,), generator=gen))]
    return logits.to(dtype).to(device)


def _cuda_split_chunk(rows, vocab, device):
    """The CUDA chain kernels' V-chunk for `rows` rows (chain_common.cuh: plan_splits); the
    Triton tile (1024) elsewhere."""
    if device.type != "cuda":
        return 1024
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    splits = max(1, min(-(-4 * sms // rows), vocab // 4096))
    return -(-(-(-vocab // splits)) // 8) * 8


def _tie_sets(vocab, device):
    """Tied maxima across tile / chunk boundaries, in the last chunk and at V - 1."""
    if vocab == 4099:  # BLOCK_V 1024, 4 tiles per program: tiles end at 1023, 2047, 3071, a split at 4095
        return [(0, 1), (3, 4098), (1023, 1024), (1024, 2048), (4095, 4096), (4096, 4098), (4098,),
                (7, 1500, 3071, 3072, 4098)]
    if vocab == 1100:
        return [(0, 1), (1023, 1024), (5, 1099), (1024, 1099), (3, 700, 1023, 1024)]
    chunk = _cuda_split_chunk(2 * 8 * 5, vocab, device)  # 8 sets of 2 rows, g = 4: the chunk of 80 rows
    last = (-(-vocab // chunk) - 1) * chunk
    sets = []
    for tie in ((chunk - 1, chunk), (chunk, vocab - 1), (last - 1, last, vocab - 1), (3, 2 * chunk - 1, last),
                (last, vocab - 1), (vocab - 2, vocab - 1), (1023, 1024), (4095, 4096)):
        tie = tuple(sorted({t for t in tie if 0 <= t < vocab}))
        if len(tie) >= 2 and tie not in sets:
            sets.append(tie)
    return (sets * 8)[:8]  # always 8 sets: the row count the chunk was planned for


def _tie_inputs(vocab, g, dtype, device, seed):
    """Two rows per tie set: the lowest tied id as every draft, and [lowest, next tied id, ...]."""
    sets = _tie_sets(vocab, device)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2 * len(sets), g + 1, vocab, generator=gen).clamp(-3, 3)
    drafts = torch.zeros(2 * len(sets), g, dtype=torch.int64)
    for k, tie in enumerate(sets):
        logits[2 * k:2 * k + 2, :, list(tie)] = 5.0
        logits[2 * k + 1, 1, list(tie)] = INF  # +inf ties too
        first = tie[0]
        second = tie[1] if len(tie) > 1 else (first + 1) % vocab  # a tied id that is not the lowest (or none)
        drafts[2 * k] = first
        drafts[2 * k + 1] = torch.tensor([first, second, second, tie[-1]][:g])
    return dict(target_logits=logits.to(dtype).to(device), draft_tokens=drafts.to(device), num_draft_tokens=None), sets


def _crafted_greedy(vocab, dtype, device):
    """Rows of known argmax: all NaN, all -inf, NaN with -inf, NaN never wins, two +inf, one finite."""
    g = 4
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, g + 1, vocab, generator=gen)
    hi, mid = vocab - 1, (9 * vocab) // 10
    logits[0, 0] = NAN
    logits[0, 1] = -INF
    logits[0, 2, :] = NAN
    logits[0, 2, hi] = -INF
    logits[0, 3, ::2] = NAN
    logits[0, 3, 1] = 100.0
    logits[1, :, 10] = INF
    logits[1, :, mid] = INF
    logits[1, 2, 5] = NAN
    logits[2, 0, :] = -INF
    logits[2, 0, hi] = -60000.0 if dtype == torch.float16 else -1e30  # one finite logit
    drafts = torch.tensor([[0, 0, 0, 1], [10, 10, 10, mid], [hi, -1, 3, 4]])
    return logits.to(dtype).to(device), drafts.to(device)


def _crafted_logit(vocab, dtype, device):
    """NaN / inf / padding rows of the relaxed and BiLD rules (a draft on a -inf logit of a finite row)."""
    g = 4
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, g + 1, vocab, generator=gen)
    hi, a, b = vocab - 1, vocab // 2, (2 * vocab) // 3
    logits[0, 0] = NAN  # all NaN: argmax 0, the draft 0 logit counts as -inf
    logits[0, 1] = -INF
    logits[0, 2, ::2] = NAN
    logits[0, 2, 7] = 4.0
    logits[0, 3, :] = -INF
    logits[0, 3, hi] = 1.0  # one finite logit: NLL exactly 0
    logits[1, :, 10] = INF
    logits[1, :, b] = INF
    logits[1, 2, 5] = NAN
    logits[2, 1, :] = NAN
    logits[2, 1, a] = -INF
    logits[3, :, ::3] = -INF
    drafts = torch.tensor([[0, 0, 7, hi], [10, b, 10, 11], [-1, 0, 3, 4], [3, 1, 0, -1]])
    return logits.to(dtype).to(device), drafts.to(device)


def _strided_logits(batch, g, vocab, dtype, device, seed, layout):
    """Non-contiguous [B, g+1, V] logits: a slice of positions (batch stride (g+3) V), a
    position-major view, or rows offset by one element (not 16-byte aligned)."""
    gen = _gen(device, seed)
    if layout == "sliced":
        return (torch.randn(batch, g + 3, vocab, generator=gen, device=device) * 3).to(dtype)[:, 1:g + 2]
    if layout == "position-major":
        return (torch.randn(g + 1, batch, vocab, generator=gen, device=device) * 3).to(dtype).transpose(0, 1)
    big = (torch.randn(batch, g + 3, vocab + 1, generator=gen, device=device) * 3).to(dtype)
    return big[:, 2:g + 3, 1:]


def _fuzz_logits(batch, g, vocab, dtype, gen, device, special):
    """Small-integer logits (ties everywhere) with a `special` fraction of NaN / +inf / -inf."""
    logits = torch.randint(-3, 4, (batch, g + 1, vocab), generator=gen, device=device).float() * 0.5
    specials = torch.tensor([NAN, INF, -INF], device=device)[torch.randint(0, 3, logits.shape, generator=gen,
                                                                           device=device)]
    keep = torch.rand(logits.shape, generator=gen, device=device) >= special
    return torch.where(keep, logits, specials).to(dtype)


def _relaxed_sweep(settings):
    from .. import ops

    return _sweep(lambda x, be, s: ops.relaxed_verify(x["target_logits"], x["draft_tokens"], top_beta=s[0], tau=s[1],
                                                      num_draft_tokens=x.get("num_draft_tokens"), backend=be),
                  settings)


def _bild_sweep(candidates, fixed=()):
    """BiLD over thresholds: `fixed` ones, and each candidate moved clear of every draft NLL's
    logsumexp rounding band (the backends sum in another order)."""
    from .. import ops

    def settings(x):
        return list(fixed) + [bild_threshold(x["target_logits"], x["draft_tokens"], t) for t in candidates]

    return _sweep(lambda x, be, t: ops.bild_verify(x["target_logits"], x["draft_tokens"], rollback_threshold=t,
                                                   num_draft_tokens=x.get("num_draft_tokens"), backend=be), settings)


def _lossless_corner(settings):
    """relaxed_verify with top_beta = 1 or tau = 0 is exactly greedy decoding (every backend)."""
    from ..reference import greedy_verify

    def check(got, inputs):
        want = greedy_verify(inputs["target_logits"], inputs["draft_tokens"],
                             num_draft_tokens=inputs.get("num_draft_tokens"))
        batch = inputs["draft_tokens"].shape[0]
        for k, (beta, tau) in enumerate(settings):
            if beta == 1 or tau == 0:
                part = (got[0][k * batch:(k + 1) * batch], got[1][k * batch:(k + 1) * batch])
                if not (torch.equal(part[0].cpu(), want[0].cpu()) and torch.equal(part[1].cpu(), want[1].cpu())):
                    return f"top_beta={beta} tau={tau} differs from greedy decoding"
        return None
    return check


def compare_fallback(got, want, inputs):
    """max_prob within (1e-6, 1e-5); fallback_check's flags equal wherever the reference's
    probability is farther than 1e-5 from the threshold (or both probabilities are equal)."""
    error, problem = close(("max_prob",), ((1e-6, 1e-5),))(got[:1], want[:1], inputs)
    if problem:
        return error, problem
    for flags, want_flags, threshold in zip(got[1:], want[1:], inputs["thresholds"]):
        clear = ((want[0].reshape(-1) - threshold).abs() > 1e-5) | (got[0].reshape(-1) == want[0].reshape(-1))
        if not torch.equal(flags[clear], want_flags[clear]):
            return error, f"fallback_check at threshold {threshold}: flags differ away from the threshold"
    return error, None


def logit_edge_cases(profile, device):
    """greedy_verify, relaxed_verify, bild_verify, max_prob (and fallback_check): edge cases."""
    from .. import ops

    tiny = profile == "tiny"
    cases = []
    structure = chain_structure()

    def add(op, name, dtype, build, run, compare, *checks):
        if op != "max_prob":
            checks = (structure, *checks)
        cases.append(Case(op, name, dtype, build, run, with_checks(compare, *checks) if checks else compare))

    greedy = lambda x, be: ops.greedy_verify(**x, backend=be)  # noqa: E731
    counts_sweep = _sweep(lambda x, be, c: ops.greedy_verify(x["target_logits"], x["draft_tokens"],
                                                             num_draft_tokens=c, backend=be),
                          lambda x: [None, *x["count_sets"]])
    for dtype in DTYPES:
        # special rows: every argmax / rank / lse corner case, at every position
        for vocab in _edge_vocabs(profile, (300,), (32000, 151936)):
            def special(seed, vocab=vocab, dtype=dtype, accept_all=False):
                g = 4
                logits = _special_logits(vocab, g, dtype, device, vocab + seed)
                from ..reference.chain_verify import safe_argmax
                top = safe_argmax(logits)[:, :g].contiguous()
                gen = _gen(device, seed)
                drafts = top if accept_all else near_top_drafts(logits, gen, wild=0.2)
                return dict(target_logits=logits, draft_tokens=drafts,
                            num_draft_tokens=ragged(logits.shape[0], g, gen, device))

            name = f"special rows V={vocab}"
            add("greedy_verify", name + " accept-all", dtype, lambda s, f=special: {**f(s, accept_all=True),
                                                                                 "num_draft_tokens": None},
                greedy, exact(CHAIN_OUTPUTS), expect("every draft accepted", lambda got, x: bool((got[1] == 4).all())))
            add("greedy_verify", name + " ragged", dtype, special, greedy, exact(CHAIN_OUTPUTS))
            settings = [(b, t, i % 2 == 1) for i, (b, t) in enumerate(BETA_TAU)]  # ragged on every other
            add("relaxed_verify", name + " beta/tau sweep", dtype, special,
                _sweep(lambda x, be, s: ops.relaxed_verify(x["target_logits"], x["draft_tokens"], top_beta=s[0],
                                                           tau=s[1], num_draft_tokens=x["num_draft_tokens"] if s[2]
                                                           else None, backend=be), settings), exact(CHAIN_OUTPUTS))
            add("bild_verify", name + " thresholds 0, inf, 1, 6", dtype, special,
                _bild_sweep((1.0, 6.0), fixed=(0.0, INF)), exact(CHAIN_OUTPUTS))
            add("max_prob", name, dtype, lambda s, f=special: dict(logits=f(s)["target_logits"]),
                lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)),
                expect("0 for the all-NaN / all -inf rows, 1 for two +inf logits",
                       lambda got, x: got[0][6, 0].item() == 0.0 and got[0][7, 0].item() == 0.0
                       and got[0][10, 0].item() == 1.0))

        # crafted rows of known answers
        vocab = 1000 if tiny else 32000

        def crafted_greedy(seed, vocab=vocab, dtype=dtype):
            logits, drafts = _crafted_greedy(vocab, dtype, device)
            return dict(target_logits=logits, draft_tokens=drafts, num_draft_tokens=None,
                        count_sets=[torch.tensor(c, device=device) for c in ([0, 0, 0], [2, 4, 1], [4, 3, 2])])

        add("greedy_verify", f"NaN/inf rows V={vocab} counts none/0/ragged", dtype, crafted_greedy, counts_sweep,
            exact(CHAIN_OUTPUTS),
            expect("num_accepted [4, 3, 1] and row 0 [0, 0, 0, 1, ...]",
                   lambda got, x: got[1][:3].tolist() == [4, 3, 1] and got[0][0, :4].tolist() == [0, 0, 0, 1]
                   and got[0][1, 3].item() == 10))

        def crafted_logit(seed, vocab=300 if tiny else 32000, dtype=dtype, counts=None):
            logits, drafts = _crafted_logit(vocab, dtype, device)
            return dict(target_logits=logits, draft_tokens=drafts,
                        num_draft_tokens=None if counts is None else torch.tensor(counts, device=device))

        for counts in (None, [4, 2, 0, 3], [1, 4, 4, 0]):
            build = lambda s, f=crafted_logit, c=counts: f(s, counts=c)  # noqa: E731
            label = f"NaN/inf/padding rows counts={counts}"
            add("relaxed_verify", label, dtype, build, _relaxed_sweep(BETA_TAU), exact(CHAIN_OUTPUTS),
                _lossless_corner(BETA_TAU))
            add("bild_verify", label + " thresholds 0, 1, 6", dtype, build, _bild_sweep((1.0, 6.0), fixed=(0.0,)),
                exact(CHAIN_OUTPUTS),
                *(() if counts is not None else (expect("an all-NaN row never passes (NaN NLL) at threshold 0",
                                                        lambda got, x: got[1][0].item() == 0),)))
        add("max_prob", "NaN/inf/padding rows", dtype, lambda s, f=crafted_logit: dict(logits=f(s)["target_logits"]),
            lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)),
            expect("[0, 0, ., 1] in row 0 and 1 in row 1",
                   lambda got, x: got[0][0, :2].tolist() == [0.0, 0.0] and got[0][0, 3].item() == 1.0
                   and bool((got[0][1] == 1.0).all())))

        # ties across tiles / chunks (under the interpreter: V = 4099 for greedy, 1100 for the others)
        for vocab in _edge_vocabs(profile, (4099, 1100), (32000, 128256)):
            def ties(seed, vocab=vocab, dtype=dtype):
                return _tie_inputs(vocab, 3 if vocab in (4099, 1100) else 4, dtype, device, seed)[0]

            def lowest_wins(got, x):
                g = x["draft_tokens"].shape[1]
                for k in range(0, got[0].shape[0], 2):
                    first = int(x["draft_tokens"][k, 0])
                    if got[0][k].tolist() != [first] * (g + 1) or got[1][k].item() != g or got[1][k + 1].item() != 1 \
                            or got[0][k + 1, :2].tolist() != [first, first]:
                        return f"tie set {k // 2}: the lowest tied id must win"
                return None

            add("greedy_verify", f"ties across tiles V={vocab}", dtype, ties, greedy, exact(CHAIN_OUTPUTS),
                lowest_wins)
            if vocab == 4099:
                continue
            settings = BETA_TAU + ((2, 0.5), (4, 0.5), (1, 5.0))
            add("relaxed_verify", f"ties across tiles V={vocab}", dtype, ties, _relaxed_sweep(settings),
                exact(CHAIN_OUTPUTS), _lossless_corner(settings))
            add("bild_verify", f"ties across tiles V={vocab}", dtype, ties, _bild_sweep((0.3, 1.5, 4.0, 9.0)),
                exact(CHAIN_OUTPUTS))
            add("max_prob", f"ties across tiles V={vocab}", dtype, lambda s, f=ties: dict(logits=f(s)["target_logits"]),
                lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)))

        # strided and non-contiguous inputs, column-major drafts, strided counts
        vocab = 300 if tiny else 32001
        for layout in ("sliced", "position-major", "unaligned"):
            def strided(seed, layout=layout, vocab=vocab, dtype=dtype):
                logits = _strided_logits(3, 4, vocab, dtype, device, seed, layout)
                assert not logits.is_contiguous()
                drafts = near_top_drafts(logits, _gen(device, seed + 1)).t().contiguous().t()  # column-major
                counts = torch.tensor([4, 0, 1, 2, 3, 0], device=device)[::2]  # strided counts [4, 1, 3]
                return dict(target_logits=logits, draft_tokens=drafts, num_draft_tokens=counts)

            label = f"{layout} logits, column-major drafts, strided counts V={vocab}"
            add("greedy_verify", label, dtype, strided, greedy, exact(CHAIN_OUTPUTS))
            add("relaxed_verify", label, dtype, strided, _relaxed_sweep(((3, 0.0), (2, 0.7), (50, 3.0))),
                exact(CHAIN_OUTPUTS))
            add("bild_verify", label, dtype, strided, _bild_sweep((1.0, 5.0)), exact(CHAIN_OUTPUTS))
            add("max_prob", f"{layout} [3,5,{vocab}]", dtype, lambda s, f=strided: dict(logits=f(s)["target_logits"]),
                lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)))

        # no drafts (g = 0), an empty batch, every count 0 / clamped, out-of-range ids (the backend itself)
        vocab = 50 if tiny else 32000

        def no_drafts(seed, vocab=vocab, dtype=dtype, batch=3):
            logits = random_logits(batch, 1, vocab, dtype, _gen(device, seed), device)
            return dict(target_logits=logits, draft_tokens=torch.zeros(batch, 0, dtype=torch.int64, device=device),
                        num_draft_tokens=None)

        bonus_only = expect("only the bonus token", lambda got, x: bool((got[1] == 0).all()))
        add("greedy_verify", f"g=0 V={vocab}", dtype, no_drafts, greedy, exact(CHAIN_OUTPUTS), bonus_only)
        add("relaxed_verify", f"g=0 V={vocab}", dtype, no_drafts, _relaxed_sweep(((2, 0.7),)), exact(CHAIN_OUTPUTS),
            bonus_only)
        add("bild_verify", f"g=0 V={vocab}", dtype, no_drafts, _bild_sweep((), fixed=(1.0,)), exact(CHAIN_OUTPUTS))

        def empty(seed, vocab=vocab, dtype=dtype):
            return dict(target_logits=torch.randn(0, 4, vocab, device=device).to(dtype),
                        draft_tokens=torch.zeros(0, 3, dtype=torch.int64, device=device), num_draft_tokens=None)

        add("greedy_verify", "B=0", dtype, empty, greedy, exact(CHAIN_OUTPUTS))
        add("relaxed_verify", "B=0", dtype, empty, _relaxed_sweep(((2, 1.0),)), exact(CHAIN_OUTPUTS))
        add("bild_verify", "B=0", dtype, empty, _bild_sweep((), fixed=(1.0,)), exact(CHAIN_OUTPUTS))
        add("max_prob", "[0,4,V]", dtype, lambda s, f=empty: dict(logits=f(s)["target_logits"]),
            lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)))

        def clamped(seed, vocab=vocab, dtype=dtype):
            g = 4
            logits = random_logits(5, g + 1, vocab, dtype, _gen(device, seed), device)
            from ..reference.chain_verify import safe_argmax
            return dict(target_logits=logits, draft_tokens=safe_argmax(logits)[:, :g].contiguous(),
                        num_draft_tokens=torch.tensor([0, -3, 2, g, g + 9], device=device))

        cases.append(Case("greedy_verify", f"counts 0, -3, 2, g, g+9 (clamped; the backend itself) V={vocab}", dtype,
                          clamped, _impl("greedy_verify"),
                          with_checks(exact(CHAIN_OUTPUTS), structure, expect(
                              "num_accepted [0, 0, 2, 4, 4]", lambda got, x: got[1].tolist() == [0, 0, 2, 4, 4])),
                          reference=lambda x: ops.greedy_verify(x["target_logits"], x["draft_tokens"],
                                                                num_draft_tokens=x["num_draft_tokens"].clamp(0, 4),
                                                                backend="torch")))

        def out_of_range(seed, vocab=vocab, dtype=dtype):
            g = 5
            logits = torch.full((6, g + 1, vocab), NAN, device=device).to(dtype)  # argmax 0 everywhere
            drafts = torch.zeros(6, g, dtype=torch.int64)
            for b, bad in enumerate((-1, vocab, vocab + 1, -vocab, 2**40, -(2**62))):
                drafts[b, b % g] = bad
            return dict(target_logits=logits, draft_tokens=drafts.to(device), num_draft_tokens=None)

        stops = expect("acceptance stops at the bad id",
                       lambda got, x: got[1].tolist() == [b % 5 for b in range(6)] * (got[1].shape[0] // 6))
        label = f"out-of-range ids -1, V, V+1, -V, 2^40, -2^62 (the backend itself) V={vocab}"
        add("greedy_verify", label, dtype, out_of_range, _impl("greedy_verify"), exact(CHAIN_OUTPUTS), stops)
        from ..common import registry
        add("relaxed_verify", label, dtype, lambda s, f=out_of_range: {**f(s), "target_logits": f(s)[
            "target_logits"].nan_to_num(0.0)},
            _sweep(lambda x, be, s: registry.implementation("relaxed_verify", be)(**x, top_beta=s[0], tau=s[1]),
                   ((vocab, 1.0), (1, 0.0))), exact(CHAIN_OUTPUTS), stops)
        add("bild_verify", label, dtype, lambda s, f=out_of_range: {**f(s), "target_logits": f(s)[
            "target_logits"].nan_to_num(0.0)},
            _sweep(lambda x, be, t: registry.implementation("bild_verify", be)(**x, rollback_threshold=t),
                   (INF, 20.0)), exact(CHAIN_OUTPUTS))

        # fuzz: small-integer logits (ties) with NaN / inf, V = 1 and g = 0 included (was a hypothesis test)
        for k, (batch, g, vocab, special) in enumerate(((1, 0, 1, 0.3), (3, 4, 70, 0.2), (2, 3, 1, 0.0),
                                                        (3, 2, 17, 0.5), (2, 4, 5, 0.05))):
            if DTYPES[k % len(DTYPES)] != dtype:
                continue  # each fuzz shape in one dtype
            if not tiny:
                vocab = max(vocab, 1) if vocab < 8 else vocab * 1000 + 1
            def fuzz(seed, batch=batch, g=g, vocab=vocab, special=special, dtype=dtype, k=k):
                gen = _gen(device, seed * 31 + k)
                logits = _fuzz_logits(batch, g, vocab, dtype, gen, device, special)
                return dict(target_logits=logits, draft_tokens=near_top_drafts(logits, gen, wild=0.15),
                            num_draft_tokens=ragged(batch, g, gen, device) if k % 2 else None)

            label = f"fuzz B={batch} g={g} V={vocab} specials={special}"
            add("greedy_verify", label, dtype, fuzz, greedy, exact(CHAIN_OUTPUTS))
            settings = ((1, 0.0), (3, 0.5), (8, 2.0), (2, INF))
            add("relaxed_verify", label, dtype, fuzz, _relaxed_sweep(settings), exact(CHAIN_OUTPUTS),
                _lossless_corner(settings))
            add("bild_verify", label, dtype, fuzz, _bild_sweep((0.5, 3.0)), exact(CHAIN_OUTPUTS))
            add("max_prob", label, dtype, lambda s, f=fuzz: dict(logits=f(s)["target_logits"]),
                lambda x, be: (ops.max_prob(**x, backend=be),), close(("max_prob",), ((1e-6, 1e-5),)))

    # dtype-independent crafted cases (float32)
    f32 = torch.float32

    def padding(seed, vocab):
        return dict(target_logits=torch.full((2, 4, vocab), -INF, device=device),
                    draft_tokens=torch.tensor([[-1, 0, 0], [0, 0, -1]], device=device), num_draft_tokens=None)

    padded = expect("[[0,-1,-1,-1],[0,0,0,-1]], [0, 2]", lambda got, x: got[0].tolist() == [[0, -1, -1, -1], [0, 0, 0, -1]]
                    and got[1].tolist() == [0, 2])
    for vocab in (7, 1):
        add("greedy_verify", f"-1 padding never matches, all -inf V={vocab}", f32, lambda s, v=vocab: padding(s, v),
            greedy, exact(CHAIN_OUTPUTS), padded)
        add("relaxed_verify", f"-1 padding never matches, all -inf V={vocab}", f32, lambda s, v=vocab: padding(s, v),
            _relaxed_sweep(BETA_TAU + ((3, 1.0),)), exact(CHAIN_OUTPUTS), _lossless_corner(BETA_TAU))
    add("bild_verify", "V=1 finite, -1 padding", f32,
        lambda s: {**padding(s, 1), "target_logits": torch.zeros(2, 4, 1, device=device)},
        _bild_sweep((), fixed=(0.0, 1.0)), exact(CHAIN_OUTPUTS),
        expect("num_accepted [0, 2] at threshold 0", lambda got, x: got[1][:2].tolist() == [0, 2]))

    def boundaries(seed, vocab=32000 if not tiny else 300):
        g = 3
        logits = torch.full((4, g + 1, vocab), -4.0)
        logits[:, :, 100] = 1.0  # top
        logits[:, :, [50, 200]] = 0.5  # rank 1 (id 50) and rank 2 (id 200): gap 0.5, tie broken by id
        logits[:, :, 7] = 0.25  # rank 3: gap 0.75
        drafts = torch.tensor([[100, 50, 200], [50, 200, 7], [200, 50, 100], [7, 100, 100]])
        return dict(target_logits=logits.to(device), draft_tokens=drafts.to(device), num_draft_tokens=None)

    grid = [(beta, tau) for beta in (1, 2, 3, 4, 5) for tau in (0.0, 0.25, 0.5, 0.5000001, 0.75, 0.7500001, 1.0)]
    known = {(3, 0.5): [1, 0, 0, 0], (3, 0.5000001): [3, 2, 3, 0], (4, 0.7500001): [3, 3, 3, 3]}

    def at_boundaries(got, x):
        for k, setting in enumerate(grid):
            if setting in known and got[1][4 * k:4 * k + 4].tolist() != known[setting]:
                return f"top_beta={setting[0]} tau={setting[1]}: num_accepted {got[1][4 * k:4 * k + 4].tolist()}, " \
                       f"want {known[setting]}"
        return None

    for dtype in DTYPES:
        add("relaxed_verify", "ranks at top_beta - 1 / top_beta, gaps at tau", dtype,
            lambda s, d=dtype: {k: (v.to(d) if k == "target_logits" else v) for k, v in boundaries(s).items()},
            _relaxed_sweep(grid), exact(CHAIN_OUTPUTS), at_boundaries, _lossless_corner(grid))

    def float32_tau(seed, vocab=32000 if not tiny else 50):
        logits = torch.full((1, 2, vocab), -4.0, device=device)
        logits[0, :, 10] = 1.0
        logits[0, :, 20] = 0.3  # 1.0f - 0.3f == float32(0.7) < 0.7 in float64
        return dict(target_logits=logits, draft_tokens=torch.tensor([[20]], device=device), num_draft_tokens=None)

    add("relaxed_verify", "tau compared in float32 (gap == float32(0.7))", f32, float32_tau,
        _relaxed_sweep(((5, 0.7),)), exact(CHAIN_OUTPUTS), expect("a rejection", lambda got, x: got[1].item() == 0))

    # max_prob shapes and rows, and fallback_check (its threshold through max_prob)
    big = not tiny

    def shaped(shape, dtype, view=None, scale=3.0):
        def build(seed):
            x = (torch.randn(*shape, generator=_gen(device, seed), device=device) * scale).to(dtype)
            return dict(logits=x if view is None else view(x))
        return build

    mp = lambda x, be: (ops.max_prob(**x, backend=be),)  # noqa: E731
    mp_close = close(("max_prob",), ((1e-6, 1e-5),))
    shapes = [((151936,) if big else (1100,), f32, None, "[V]"),
              ((3, 128256 if big else 1100), torch.bfloat16, None, "[B,V]"),
              ((2, 3, 32000 if big else 5), torch.float16, None, "[B,P,V]"),
              ((2, 3, 4, 4000 if big else 40), f32, lambda x: x[:, :, 1:], "[2,3,3,V] leading dims that do not collapse"),
              ((5, 7), f32, None, "tiny V"), ((4, 1), f32, None, "V=1"),
              ((3, 4, 9 if tiny else 32001), f32, lambda x: x[:, 2], "[B,V] row stride 4V")]
    if big:
        shapes.append(((2048, 32000), torch.bfloat16, None, "R >= 4 x SMs: one block per row"))
    for shape, dtype, view, label in shapes:
        add("max_prob", f"{label} {list(shape)}", dtype, shaped(shape, dtype, view), mp, mp_close)

    def special_probs(seed, vocab=40000 if big else 40):
        x = torch.randn(6, vocab, generator=_gen(device, seed), device=device) * 3
        x[0] = NAN
        x[1] = -INF
        x[2, 3] = INF
        x[3, :] = -INF
        x[3, vocab - 1] = 2.0
        x[4, ::2] = NAN
        x[5, 100 % vocab] = 40.0  # one dominant logit
        return dict(logits=x)

    add("max_prob", "NaN / -inf / +inf / one-finite rows", f32, special_probs, mp, mp_close,
        expect("[0, 0, 1, 1] in the first rows", lambda got, x: got[0][:4].tolist() == [0.0, 0.0, 1.0, 1.0]))
    add("max_prob", "lse rounds to the max: 1", f32, lambda s: dict(logits=torch.tensor([[1e30, 1e30, 0.0]],
                                                                                         device=device)), mp, mp_close)

    def fallback(build, thresholds):
        def with_thresholds(seed):
            return {**build(seed), "thresholds": thresholds}
        return with_thresholds

    def fallback_run(x, be):
        return (ops.max_prob(x["logits"], backend=be),
                *(ops.fallback_check(x["logits"], t, backend=be) for t in x["thresholds"]))

    add("max_prob", "fallback_check thresholds 0, 0.3, 0.5, 0.9, 1 on special rows", f32,
        fallback(special_probs, (0.0, 0.3, 0.5, 0.9, 1.0)), fallback_run, compare_fallback)
    add("max_prob", "fallback_check thresholds 0.01, 0.05, 0.5", torch.bfloat16,
        fallback(shaped((64, 151936) if big else (8, 300), torch.bfloat16), (0.01, 0.05, 0.5)), fallback_run,
        compare_fallback)
    return cases


def sampling_modes(batch, g, gen, device, *, extremes=False):
    """(label, kwargs) of every randomness mode: float32 / float64 uniforms with exact 0.0 coins,
    an int seed with offsets (the counter crosses 2^32; a negative offset), per-row seeds without
    and with offsets; `extremes`: every coin at 0, and the largest float64 / float32 uniforms."""
    def u(dtype):
        x = torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64).to(dtype)
        return torch.where(torch.rand(x.shape, generator=gen, device=device) < 0.15, torch.zeros_like(x), x)

    offsets = torch.tensor([0, 2**32 - 2, 17, -5, 2**40, 3, 2**31 - 1], device=device).repeat(batch)[:batch]
    modes = [("f32 uniforms", dict(uniforms=u(torch.float32))),
             ("f64 uniforms", dict(uniforms=u(torch.float64))),
             ("seed+offsets", dict(seed=int(torch.randint(-2**62, 2**62, (1,), generator=gen, device=device)),
                                   offsets=offsets)),
             ("row seeds", dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen, device=device))),
             ("row seeds+offsets", dict(seed=torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen, device=device),
                                        offsets=offsets.flip(0)))]
    if extremes:
        modes += [("u=0", dict(uniforms=torch.zeros(batch, g + 1, device=device))),
                  ("u=1-2^-53", dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-53, dtype=torch.float64,
                                                         device=device))),
                  ("u=1-2^-24", dict(uniforms=torch.full((batch, g + 1), 1.0 - 2**-24, device=device)))]
    return modes


def _probs_sweep(op, direct=False):
    """op(target, draft, drafts, **mode, num_draft_tokens=counts) over x["settings"]: (mode, counts) pairs."""
    from .. import ops
    from ..common import registry

    def call(x, be, setting):
        kwargs, counts = setting
        fn = registry.implementation(op, be) if direct else (lambda *a, **k: getattr(ops, op)(*a, **k, backend=be))
        return fn(x["target_probs"], x["draft_probs"], x["draft_tokens"], num_draft_tokens=counts, **kwargs)
    return _sweep(call, lambda x: x["settings"])


def _chunked(check):
    """check(out, accepted, inputs) on each setting's rows of a sweep (inputs["setting"]: its setting)."""
    def wrapped(got, inputs):
        batch = inputs["draft_tokens"].shape[0]
        for k, (label, _) in enumerate(inputs["labels"]):
            problem = check(got[0][k * batch:(k + 1) * batch], got[1][k * batch:(k + 1) * batch],
                            {**inputs, "setting": inputs["settings"][k]})
            if problem:
                return f"{label}: {problem}"
        return None
    return wrapped


def _with_settings(x, modes, counts_sets=(None,)):
    """x with a sweep over every (mode, counts) pair (settings) and their labels."""
    settings, labels = [], []
    for label, kwargs in modes:
        for counts in counts_sets:
            settings.append((kwargs, counts))
            labels.append((f"{label} counts={None if counts is None else counts.tolist()}", None))
    return {**x, "settings": settings, "labels": labels}


def _sweep_structure(vocab_key):
    """The chain outputs' structure (chain_structure) of every row of a sweep."""
    inner = chain_structure(vocab_key)
    return lambda got, inputs: inner(got, inputs)


def edge_probs(dtype, device, vocab=300):
    """One crafted row per edge case, g = 3 (rejection_sample's and block_verify's hostile rows)."""
    g = 3
    target, draft, drafts = random_probs(9, g, vocab, torch.float32, torch.Generator().manual_seed(11), "cpu")
    target, draft = target.float(), draft.float()
    target[0, :g] = draft[0]  # p == q everywhere and a draft on a zero-mass id: empty residual, draw from p
    target[0, :, 5] = 0.0
    draft[0, :, 5] = 0.0
    drafts[0] = torch.tensor([drafts[0, 0], 5, 6])
    draft[1, :, 9] = 0.0  # q == 0 < p at the drafts: accepted whatever the coin; bonus from p[g]
    target[1, :, 9] = 0.25
    drafts[1] = 9
    target[2] = 0.0  # one-hot target rows: the residual is the hot id whenever the draft misses it
    target[2, torch.arange(g + 1), torch.tensor([3, 4, vocab - 1, 0])] = 1.0
    drafts[2] = torch.tensor([3, 7, vocab - 1])
    target[3, 1] = 0.0  # all-zero target row at the first rejection: residual and p empty -> id 0
    target[4, 0] = NAN  # all-NaN row (NaN rejects; NaN weighs 0) and a partly NaN bonus row
    target[4, 3, ::2] = NAN
    target[5, 0, drafts[5, 0]] = INF  # +inf in p (weight 1) and in q (u * inf never < a finite p)
    target[5, 1, 100:103] = INF
    draft[5, 1, drafts[5, 1]] = INF
    draft[5, 2, 7] = INF
    target[5, 3, vocab - 50] = INF
    drafts[6, 1] = -1  # -1 padding in the middle of the drafts
    target[7, 0] = 0.0  # a residual with mass only at the last id
    target[7, 0, vocab - 1] = 0.5
    draft[7, 0] = 0.01
    drafts[7, 0] = 0
    draft[8, 0, :vocab // 2] = NAN  # NaN in q (the residual's NaN weighs 0), negative and tiny values
    target[8, 0, 10] = -0.5
    target[8, 1, 20:30] = 1e-30 if dtype == torch.float32 else 1e-7
    return target.to(dtype).to(device), draft.to(dtype).to(device), drafts.to(device)


def adversarial_probs(vocab, dtype, device, seed):
    """(target, draft) row patterns rotated over positions (every pattern meets every position):
    p == q, NaN rows, no mass, mass only at the last id / in the last chunk, one-hot p == q, +inf,
    -inf and negative entries, unnormalised rows, mass below the 2^-40 weight grid, one unit each;
    first drafts at V - 1 and 0, out-of-range ids (the backend itself sees them) in every third row."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(vocab, generator=gen) ** 3
    base /= base.sum()
    other = torch.rand(vocab, generator=gen)
    other /= other.sum()
    zeros = torch.zeros(vocab)
    tail = max(1, min(3000, vocab // 10))
    rows = [(base, base), (base, other), (torch.full((vocab,), NAN), base), (base, torch.full((vocab,), NAN)),
            (zeros, base), (zeros, zeros)]
    r = zeros.clone(); r[-1] = 1.0; rows.append((r, base))
    r = zeros.clone(); r[-tail:] = 1 / tail; rows.append((r, zeros))
    r = zeros.clone(); r[vocab // 2] = 1.0; rows.append((r, r.clone()))
    r = base.clone(); r[::7] = INF; rows.append((r, base))
    r = base.clone(); r[1::5] = -INF; rows.append((r, -other))
    rows.append((torch.ones(vocab), torch.full((vocab,), 0.5)))
    r = base.clone(); r[:vocab - 1] = 0; r[-1] = 1e-30; rows.append((r, zeros))
    r = zeros.clone(); r[0] = 2.0**-40; r[-1] = 2.0**-40; rows.append((r, zeros))
    n, g = len(rows), 3
    batch = 2 * n
    target = torch.stack([torch.stack([rows[(b + k) % n][0] for k in range(g + 1)]) for b in range(batch)])
    draft = torch.stack([torch.stack([rows[(b + k) % n][1] for k in range(g)]) for b in range(batch)])
    drafts = torch.randint(0, vocab, (batch, g), generator=gen)
    drafts[:, 0] = vocab - 1
    drafts[n:, 0] = 0
    bad = torch.tensor([-1, vocab, vocab + 3, -(2**40), 2**40, 2**62])
    drafts[::3, 1] = bad[torch.arange(0, batch, 3) % len(bad)]
    return target.to(dtype).to(device), draft.to(dtype).to(device), drafts.to(device)


def _fuzz_probs(batch, g, vocab, dtype, gen, device, special):
    """random_probs with a `special` fraction of NaN / +inf / 0 / -1 entries and -1 drafts."""
    target, draft, drafts = random_probs(batch, g, vocab, torch.float32, gen, device)
    target, draft = target.float(), draft.float()
    specials = torch.tensor([NAN, INF, 0.0, -1.0], device=device)
    out = []
    for x in (target, draft):
        pick = specials[torch.randint(0, 4, x.shape, generator=gen, device=device)]
        out.append(torch.where(torch.rand(x.shape, generator=gen, device=device) < special, pick, x).to(dtype))
    drafts = torch.where(torch.rand(drafts.shape, generator=gen, device=device) < special, -1, drafts)
    return out[0], out[1], drafts


def probs_edge_cases(profile, device):
    """rejection_sample and block_verify (the same inputs and contract: bit for bit): edge cases."""
    tiny = profile == "tiny"
    cases = []
    both = ("rejection_sample", "block_verify")
    structure = _sweep_structure("target_probs")

    def add(name, dtype, build, *, direct=False, known=None, ops_=both, block_on_cpu=True):
        for op in ops_:
            if tiny and op == "block_verify" and not block_on_cpu:
                continue  # the block kernel is slow under the interpreter: these run for it on a GPU
            checks = [structure]
            if known is not None and op == "rejection_sample":
                checks.append(_chunked(known))
            cases.append(Case(op, name, dtype, build, _probs_sweep(op, direct), with_checks(exact(CHAIN_OUTPUTS),
                                                                                         *checks)))

    for dtype in DTYPES:
        # every randomness mode, ragged rows, V = 1 / small / odd vocabularies
        shapes = [(4, 3, 300), (4, 1, 7), (1, 3, 1)] if tiny else \
            ([(3, 4, 32000), (64, 8, 2049)] if profile == "quick" else
             [(1, 4, 32000), (3, 8, 128256), (64, 1, 151936), (300, 2, 2047), (5, 1, 2048), (1, 3, 8200),
              (300, 2, 50000), (5, 3, 1), (64, 4, 7)])
        for k, (batch, g, vocab) in enumerate(shapes):
            def modes(seed, batch=batch, g=g, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed + vocab)
                target, draft, drafts = random_probs(batch, g, vocab, dtype, gen, device)
                counts = torch.tensor([0, g, 1, g - 1], device=device).repeat(batch)[:batch].clamp(0, g)
                x = _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                                   sampling_modes(batch, g, gen, device), (None, counts))
                if tiny:  # under the interpreter: ragged on every other mode
                    keep = [k for k in range(len(x["settings"])) if k % 2 == (k // 2) % 2]
                    x["settings"] = [x["settings"][k] for k in keep]
                    x["labels"] = [x["labels"][k] for k in keep]
                return x

            add(f"every mode x ragged B={batch} g={g} V={vocab}", dtype, modes)

        # crafted edge rows under every mode, the extreme uniforms and ragged / zero counts
        def edges(seed, dtype=dtype):
            target, draft, drafts = edge_probs(dtype, device)
            batch, g = drafts.shape
            counts = (None, torch.zeros(batch, dtype=torch.int64, device=device),
                      torch.tensor([3, 2, 1, 0, 3, 2, 1, 0, 3], device=device))
            x = _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                               sampling_modes(batch, g, _gen(device, seed + 12), device, extremes=True), counts)
            if tiny:  # every mode without counts, the first four with the zero / ragged counts
                keep = [k for k in range(len(x["settings"])) if k % 3 == 0 or k < 12]
                x["settings"] = [x["settings"][k] for k in keep]
                x["labels"] = [x["labels"][k] for k in keep]
            return x

        def edge_answers(out, accepted, x):
            g = x["draft_tokens"].shape[1]
            if accepted[4] != 0 or out[4, 0] != 0:
                return "an all-NaN row must reject at 0 and emit id 0"
            if accepted[3] > 1 or (accepted[3] == 1 and out[3, 1] != 0):
                return "a row without mass emits id 0"
            if accepted[6] > 1:
                return "-1 padding is never accepted"
            hot = [3, 4, x["target_probs"].shape[-1] - 1, 0][int(accepted[2])]
            if int(out[2, accepted[2]]) != hot:
                return "a one-hot target row emits its hot id"
            counts = x["setting"][1]
            if int(accepted[1]) != (g if counts is None else min(int(counts[1]), g)):
                return "q == 0 < p accepts every draft"
            return None

        add("edge rows (p == q, q = 0, one-hot, no mass, NaN, inf, -1, last id, NaN q) V=300" if tiny else
            "edge rows V=300", dtype, edges, known=edge_answers, block_on_cpu=False)

        # adversarial row patterns, out-of-range ids, through the backend itself
        for vocab in _edge_vocabs(profile, (300,) if dtype == torch.float32 else (), (32000, 151936)):
            def adversarial(seed, vocab=vocab, dtype=dtype):
                target, draft, drafts = adversarial_probs(vocab, dtype, device, vocab + 1)
                batch, g = drafts.shape
                ragged_rows = torch.arange(batch, device=device) % (g + 1)
                x = _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                                   sampling_modes(batch, g, _gen(device, seed), device), (None, ragged_rows))
                if tiny:  # under the interpreter: float32 only, ragged on every other mode
                    keep = [k for k in range(len(x["settings"])) if k % 2 == (k // 2) % 2]
                    x["settings"] = [x["settings"][k] for k in keep]
                    x["labels"] = [x["labels"][k] for k in keep]
                return x

            add(f"adversarial rows, ids -1 / >= V / < -1 (the backend itself) V={vocab}", dtype, adversarial,
                direct=True, block_on_cpu=False)

        # strided and non-contiguous: target rows (batch stride (g+3) V), position-major q, column-major
        # ids, strided counts / uniforms / seeds / offsets, int32 ids / counts / seeds / offsets, unaligned rows
        vocab = 300 if tiny else 128256
        for layout in ("sliced", "unaligned", "int32"):
            def strided(seed, layout=layout, vocab=vocab, dtype=dtype):
                batch, g = 3, 3
                gen = _gen(device, seed + 2)
                target, draft, drafts = random_probs(batch, g, vocab, dtype, gen, device)
                cols = slice(1, vocab + 1) if layout == "unaligned" else slice(0, vocab)
                big = torch.zeros(batch, g + 3, vocab + 5, dtype=dtype, device=device)
                big[:, 1:g + 2, cols] = target
                target = big[:, 1:g + 2, cols]
                draft = draft.transpose(0, 1).contiguous().transpose(0, 1)  # position-major storage
                if layout == "int32":
                    drafts = torch.stack([drafts.int(), drafts.int()], dim=-1)[..., 0]  # int32, strides (2g, 2)
                else:
                    drafts = drafts.t().contiguous().t()  # column-major ids
                index = torch.int32 if layout == "int32" else torch.int64
                counts = torch.tensor([3, 0, 1, 2, 2, 0], device=device, dtype=index)[::2]  # strided [3, 1, 2]
                u = torch.rand(batch, 2 * (g + 1), generator=gen, device=device, dtype=torch.float64)[:, ::2]
                seeds = torch.randint(0, 2**30, (2 * batch,), generator=gen, device=device)[::2].to(index)
                offsets = torch.tensor([5, 0, 9, 0, 2**20 if layout == "int32" else 2**33, 0], device=device,
                                       dtype=index)[::2]
                modes = [("strided uniforms", dict(uniforms=u)), ("strided seeds+offsets", dict(seed=seeds, offsets=offsets)),
                         ("int seed, strided offsets", dict(seed=99, offsets=offsets))]
                return _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts), modes,
                                      (None, counts))

            add(f"{layout} target rows, position-major q, strided ids / counts / randomness V={vocab}", dtype, strided)

        # no drafts (g = 0), an empty batch, deterministic (one-hot) drafts
        vocab = 50 if tiny else 32000

        def no_drafts(seed, vocab=vocab, dtype=dtype):
            gen = _gen(device, seed + 3)
            target, draft, drafts = random_probs(3, 0, vocab, dtype, gen, device)
            return _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                                  sampling_modes(3, 0, gen, device))

        add(f"g=0 V={vocab}", dtype, no_drafts)

        def one_hot(seed, vocab=vocab, dtype=dtype):
            gen = _gen(device, seed + 6)
            target, _, drafts = random_probs(4, 3, vocab, dtype, gen, device)
            draft = torch.nn.functional.one_hot(drafts, vocab).to(dtype)  # deterministic (n-gram) drafts
            return _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                                  sampling_modes(4, 3, gen, device)[1:3])

        add(f"one-hot draft rows (n-gram drafts) V={vocab}", dtype, one_hot)

        def hostile(seed, dtype=dtype):
            p, q, drafts = hostile_block_probs(dtype, device)
            gen = _gen(device, seed + 13)
            return _with_settings(dict(target_probs=p, draft_probs=q, draft_tokens=drafts),
                                  sampling_modes(5, 3, gen, device)[1:4],
                                  (None, torch.tensor([3, 3, 2, 3, 1], device=device)))

        add("hostile rows (p == q, no mass, NaN, inf q, one-hot q, -0.0 q, -1, id >= V; the backend itself)", dtype,
            hostile, direct=True)

    f32 = torch.float32

    def empty(seed):
        return _with_settings(dict(target_probs=torch.rand(0, 3, 10, device=device),
                                   draft_probs=torch.rand(0, 2, 10, device=device),
                                   draft_tokens=torch.zeros(0, 2, dtype=torch.int64, device=device)),
                              [("seed", dict(seed=1)), ("uniforms", dict(uniforms=torch.rand(0, 3, device=device)))])

    add("B=0", f32, empty)

    def seeds(seed):
        gen = _gen(device, 5)
        target, draft, drafts = random_probs(3, 2, 20, f32, gen, device)
        offsets = torch.tensor([2**32 - 1, 0, -1], device=device)
        modes = [(f"seed={s}{' +offsets' if o is not None else ''}", dict(seed=s, offsets=o))
                 for s in (0, 1, -1, 2**32, 2**63 - 1, -2**63) for o in (None, offsets)]
        return _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts), modes)

    add("int seeds Triton would specialise (1) or that need both key words", f32, seeds, block_on_cpu=False)

    def out_of_range(seed):
        gen = _gen(device, 4)
        target, draft, _ = random_probs(4, 3, 40, f32, gen, device)
        target[..., 0] = 1.0  # an in-range id 0 would be accepted
        drafts = torch.tensor([[40, 0, 0], [0, 2**40, 0], [0, 0, -7], [-2**62, 0, 0]], device=device)
        return _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                              [("uniforms", dict(uniforms=torch.rand(4, 4, generator=gen, device=device)))])

    add("ids >= V or < -1 read nothing and reject (the backend itself)", f32, out_of_range, direct=True,
        known=lambda out, acc, x: None if acc.tolist() == [0, 1, 2, 0] else "num_accepted must be [0, 1, 2, 0]")

    def empty_residual(seed, vocab=128256 if not tiny else 300):
        gen = _gen(device, seed + 9)
        p = torch.softmax(torch.randn(8, 2, vocab, generator=gen, device=device), -1)
        p[..., 0] = 0.0
        return _with_settings(dict(target_probs=p, draft_probs=p[:, :1].clone(),
                                   draft_tokens=torch.zeros(8, 1, dtype=torch.int64, device=device)),
                              [("uniforms", dict(uniforms=torch.rand(8, 2, generator=gen, device=device))),
                               ("seed", dict(seed=4))])

    add("p == q, draft on a zero-probability id: an empty residual draws from p", f32, empty_residual,
        known=lambda out, acc, x: None if bool((acc == 0).all() & (out[:, 0] > 0).all()) else "must draw from p",
        block_on_cpu=False)

    if not tiny:
        def expanded(seed, vocab=128256):
            gen = _gen(device, seed + 7)
            target, draft, drafts = random_probs(1, 4, vocab, f32, gen, device)
            return _with_settings(dict(target_probs=target.expand(3, -1, -1), draft_probs=draft.expand(3, -1, -1),
                                       draft_tokens=drafts.expand(3, -1).contiguous()), [("seed", dict(seed=3))])

        add("expanded (stride 0) batch", f32, expanded)

    # fuzz: NaN / inf / 0 / -1 entries and -1 drafts (was a hypothesis test)
    for k, (batch, g, vocab, special) in enumerate(((1, 0, 1, 0.3), (4, 4, 70, 0.2), (2, 3, 1, 0.0),
                                                    (3, 2, 17, 0.3), (4, 1, 5, 0.05), (2, 4, 33, 0.1))):
        dtype = DTYPES[k % len(DTYPES)]
        if not tiny and vocab > 8:
            vocab = vocab * 1000 + 1

        def fuzz(seed, batch=batch, g=g, vocab=vocab, special=special, dtype=dtype, k=k):
            gen = _gen(device, seed * 31 + k)
            target, draft, drafts = _fuzz_probs(batch, g, vocab, dtype, gen, device, special)
            modes = sampling_modes(batch, g, gen, device)
            return _with_settings(dict(target_probs=target, draft_probs=draft, draft_tokens=drafts),
                                  [modes[k % 4]], (None, ragged(batch, g, gen, device)))

        add(f"fuzz B={batch} g={g} V={vocab} specials={special}", dtype, fuzz, block_on_cpu=k < 2)
    return cases


def hostile_block_probs(dtype, device, vocab=40):
    """NaN, inf, all-zero and p == q rows, a one-hot draft row, a -0.0 q (p / -0.0 = -inf: a
    kernel that loses the sign gets 1), -1 and out-of-range drafts (block verification's rows)."""
    gen = torch.Generator().manual_seed(3)
    batch, g = 5, 3
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * 2.5
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :g] + torch.randn(batch, g, vocab, generator=gen), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    p[0, 1] = q[0, 1]
    q[0, 0] = p[0, 0]
    p[1, 0] = 0.0
    p[1, 3, ::4] = NAN
    q[2, 0, 5] = INF
    q[2, 1] = torch.nn.functional.one_hot(drafts[2, 1], vocab).float()
    drafts[3, 1] = -1
    q[3, 0, drafts[3, 0]] = -0.0
    drafts[4, 0] = vocab + 3
    p[4, 2] = NAN
    q[4, 2, :7] = NAN
    return p.to(dtype).to(device), q.to(dtype).to(device), drafts.to(device)


def _effective_uniforms(inputs, accepted):
    """[B, g+1] float64: the coins and the final draw a call used (seeded mode: the counter-based
    draws, the final one at the reference's number of accepted drafts)."""
    from ..reference.chain_verify import Coins

    drafts = inputs["draft_tokens"]
    batch, g = drafts.shape
    if inputs.get("uniforms") is not None:
        return inputs["uniforms"].double()
    coins = Coins(None, inputs["seed"], inputs.get("offsets"), batch, g, drafts.device)
    return torch.cat([coins.accept.reshape(batch, g), coins.final(accepted).reshape(batch, 1)], 1)


def _sampling_sweep_compare(base):
    """A sweep's rows judged setting by setting with `base` (compare_logits_sampling or
    compare_block_logits: equal rows, or at most 2% explained by a near-boundary decision),
    on the uniforms each setting used."""
    def compare(got, want, inputs):
        batch = inputs["draft_tokens"].shape[0]
        worst = 0.0
        for k, (label, (kwargs, counts, temperature)) in enumerate(zip(inputs["labels"], inputs["settings"])):
            rows = slice(k * batch, (k + 1) * batch)
            g_part, w_part = (got[0][rows], got[1][rows]), (want[0][rows], want[1][rows])
            x = dict(target_logits=inputs["target_logits"], draft_logits=inputs["draft_logits"],
                     draft_tokens=inputs["draft_tokens"], temperature=temperature, num_draft_tokens=counts, **kwargs)
            x["uniforms"] = _effective_uniforms(x, w_part[1])
            error, problem = base(g_part, w_part, x)
            if problem:
                return error, f"{label[0]}: {problem}"
            worst = max(worst, error or 0.0)
        return worst, None
    return compare


def _logits_sweep(op):
    from .. import ops

    def call(x, be, setting):
        kwargs, counts, temperature = setting
        return getattr(ops, op)(x["target_logits"], x["draft_logits"], x["draft_tokens"], temperature=temperature,
                                num_draft_tokens=counts, backend=be, **kwargs)
    return _sweep(call, lambda x: x["settings"])


def _logits_settings(x, modes, counts_sets, temperatures):
    settings, labels = [], []
    for i, (label, kwargs) in enumerate(modes):
        for j, counts in enumerate(counts_sets):
            t = temperatures[(i + j) % len(temperatures)]
            settings.append((kwargs, counts, t))
            labels.append((f"{label} counts={'-' if counts is None else counts.tolist()} "
                           f"T={'rows' if isinstance(t, torch.Tensor) else t}", None))
    return {**x, "settings": settings, "labels": labels}


def adversarial_logits(dtype, device, vocab=64):
    """One crafted row per case, g = 3: NaN / +inf / all -inf target rows (all-NaN softmax), huge
    logits, identical logits with a draft on a -inf id, NaN / +inf / all -inf q, an all-NaN bonus
    row, a draft on a -inf target id, a uniform target against a one-hot-ish draft, -inf chunks,
    a very peaked target."""
    batch, g = 13, 3
    gen = torch.Generator().manual_seed(21)
    target = torch.randn(batch, g + 1, vocab, generator=gen) * 2.0
    draft = target[:, :g] + 0.7 * torch.randn(batch, g, vocab, generator=gen)
    drafts = torch.multinomial(torch.softmax(draft.double(), -1).reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    target[0, 0, 7] = NAN
    target[1, 1, 9] = INF
    target[1, 0] = draft[1, 0]
    target[2, 0] = -INF
    target[3] = torch.randn(g + 1, vocab, generator=gen) * 1e4  # huge logits (float16 holds +-6e4)
    draft[3] = target[3, :g] + torch.randn(g, vocab, generator=gen) * 1e3
    drafts[3] = torch.argmax(draft[3], -1)
    target[4, :g] = draft[4]
    target[4, 1, 5] = draft[4, 1, 5] = -INF
    drafts[4, 1] = 5
    draft[5, 0, 3] = NAN
    target[6, 0] = draft[6, 0]
    draft[6, 1, 11] = INF
    draft[7, 0] = -INF
    target[8, :g] = draft[8]
    target[8, g, ::3] = NAN
    target[9, 0, vocab // 2:] = -INF
    drafts[9, 0] = vocab // 2 + 8
    target[10] = 0.0
    draft[10] = -1e4
    draft[10, torch.arange(g), drafts[10]] = 0.0
    target[11, :, :(2 * vocab) // 3] = -INF  # -inf chunks: mass only in the last third
    target[12] *= 50  # very peaked
    return target.to(dtype).to(device), draft.to(dtype).to(device), drafts.to(device)


def _adversarial_answers(out, accepted, x):
    g = x["draft_tokens"].shape[1]
    checks = [(accepted[0] == 0 and out[0, 0] == 0, "a NaN target row rejects and emits id 0"),
              (accepted[1] == 1 and out[1, 1] == 0, "+inf at position 1: an all-NaN row emits id 0"),
              (accepted[2] == 0 and out[2, 0] == 0, "an all -inf target row emits id 0"),
              (accepted[4] == 1, "p == q accepts, p = q = 0 rejects"),
              (accepted[5] == 0 and accepted[7] == 0, "NaN q rows reject"),
              (accepted[8] == g and out[8, g] == 0, "an all-NaN bonus row emits id 0"),
              (accepted[9] == 0 and 0 <= int(out[9, 0]) < x["target_logits"].shape[-1] // 2,
               "the residual only where p > 0")]
    for ok, message in checks:
        if not bool(ok):
            return message
    return None


def logits_sampling_edge_cases(profile, device):
    """rejection_sample_logits and block_verify_logits: edge cases (equal rows, up to decisions
    within a tiny margin of their boundary, on the uniforms each call used)."""
    tiny = profile == "tiny"
    cases = []
    pairs = (("rejection_sample_logits", compare_logits_sampling), ("block_verify_logits", compare_block_logits))
    structure = chain_structure()

    def add(name, dtype, build, known=None):
        for op, base in pairs:
            checks = [structure]
            if known is not None and op == "rejection_sample_logits":
                checks.append(_chunked(known))
            cases.append(Case(op, name, dtype, build, _logits_sweep(op),
                              with_checks(_sampling_sweep_compare(base), *checks)))

    for dtype in DTYPES:
        shapes = [[(4, 3, 64), (3, 2, 300), (2, 2, 1)][DTYPES.index(dtype)]] if tiny else \
            ([(3, 4, 32000)] if profile == "quick" else [(1, 4, 32000), (3, 8, 151936), (64, 4, 32000), (64, 1, 151936)])
        for batch, g, vocab in shapes:  # under the interpreter: one shape per dtype, ragged on every other mode
            def modes(seed, batch=batch, g=g, vocab=vocab, dtype=dtype):
                gen = _gen(device, seed + vocab)
                t = torch.randn(batch, g + 1, vocab, generator=gen, device=device) * 3
                q = t[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=device) * 0.7
                drafts = torch.multinomial(torch.softmax(q.to(dtype).float(), -1).reshape(-1, vocab), 1,
                                           generator=gen).reshape(batch, g)
                drafts = torch.where(torch.rand(batch, g, generator=gen, device=device) < 0.1, -1, drafts)
                temps = (1.0, 0.6, 1.7, 0.3 + 2 * torch.rand(batch, generator=gen, device=device))
                counts = ragged(batch, g, gen, device)
                x = _logits_settings(dict(target_logits=t.to(dtype), draft_logits=q.to(dtype), draft_tokens=drafts),
                                     sampling_modes(batch, g, gen, device), (None, counts), temps)
                if tiny:
                    keep = [k for k in range(len(x["settings"])) if k % 2 == (k // 2) % 2]
                    x["settings"] = [x["settings"][k] for k in keep]
                    x["labels"] = [x["labels"][k] for k in keep]
                return x

            add(f"every mode x ragged x T 1 / 0.6 / 1.7 / per row, -1 drafts B={batch} g={g} V={vocab}", dtype, modes)

        def adversarial(seed, dtype=dtype, vocab=64 if tiny else 32000):
            target, draft, drafts = adversarial_logits(dtype, device, vocab)
            batch, g = drafts.shape
            gen = _gen(device, seed + 22)
            modes = [m for m in sampling_modes(batch, g, gen, device, extremes=True)
                     if m[0] in ("f64 uniforms", "u=1-2^-53", "u=0", "row seeds")]
            rows = torch.tensor([0.5, 1.0, 2.0, 0.7, 1.3, 1.0, 0.9, 1.1, 3.0, 0.25, 1.0, 0.8, 1.2], device=device)
            return _logits_settings(dict(target_logits=target, draft_logits=draft, draft_tokens=drafts), modes, (None,),
                                    (1.0, rows))

        add("adversarial rows (NaN / inf / -inf / huge / p == q / NaN q / NaN bonus)", dtype, adversarial,
            known=_adversarial_answers)

        def identical(seed, dtype=dtype, vocab=40 if tiny else 32000):
            gen = torch.Generator().manual_seed(31)
            batch, g = 6, 2
            target = torch.randn(batch, g + 1, vocab, generator=gen)
            target[:, 0, :4] = -INF
            draft = target[:, :g].clone()
            drafts = torch.stack([torch.arange(batch) % 4, torch.zeros(batch, dtype=torch.int64)], 1)
            u = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
            return _logits_settings(dict(target_logits=target.to(dtype).to(device), draft_logits=draft.to(dtype).to(device),
                                         draft_tokens=drafts.to(device)),
                                    [("f64 uniforms", dict(uniforms=u.to(device)))], (None,), (0.7,))

        add("identical logits, drafts on -inf ids: an empty residual draws from p", dtype, identical,
            known=lambda out, acc, x: None if acc.tolist() == [0] * 6 and bool((out[:, 0] >= 4).all())
            else "must reject and draw from p (ids >= 4)")

        def strided(seed, dtype=dtype, vocab=100 if tiny else 128256):
            batch, g = 3, 2
            gen = _gen(device, seed + 41)
            big_t = (torch.randn(batch, g + 3, vocab + 1, generator=gen, device=device) * 2).to(dtype)
            target = big_t[:, 1:g + 2, 1:]  # batch stride (g+3)(V+1), rows offset by one element
            draft = (target[:, :g].float() + 0.7 * torch.randn(batch, g, vocab, generator=gen, device=device)).to(dtype)
            draft = draft.transpose(0, 1).contiguous().transpose(0, 1)  # position-major
            drafts = torch.multinomial(torch.softmax(draft.float(), -1).reshape(-1, vocab), 1,
                                       generator=gen).reshape(batch, g).t().contiguous().t()
            temps = torch.tensor([0.5, 0.0, 1.5, 0.0, 1.0, 0.0], device=device)[::2]  # strided per-row temperatures
            counts = torch.tensor([2, 9, 1, 9, 0, 9], device=device)[::2]
            seeds = torch.tensor([5, 0, 6, 0, 7, 0], device=device)[::2]
            u = torch.rand(batch, 2 * (g + 1), generator=gen, device=device)[:, ::2]
            return _logits_settings(dict(target_logits=target, draft_logits=draft, draft_tokens=drafts),
                                    [("strided row seeds", dict(seed=seeds)), ("strided f32 uniforms", dict(uniforms=u))],
                                    (counts, None), (temps, 0.8))

        add("strided / unaligned logits, position-major q, column-major ids, strided T / counts / seeds", dtype,
            strided)

    def no_drafts(seed, vocab=50 if tiny else 32000):
        gen = _gen(device, seed + 3)
        t = torch.randn(3, 1, vocab, generator=gen, device=device).to(torch.float16)
        return _logits_settings(dict(target_logits=t, draft_logits=t[:, :0],
                                     draft_tokens=torch.zeros(3, 0, dtype=torch.int64, device=device)),
                                sampling_modes(3, 0, gen, device), (None,), (0.8, 1.3))

    add("g=0", torch.float16, no_drafts, known=lambda out, acc, x: None if acc.tolist() == [0, 0, 0] else "no drafts")

    def empty(seed):
        return _logits_settings(dict(target_logits=torch.rand(0, 3, 10, device=device),
                                     draft_logits=torch.rand(0, 2, 10, device=device),
                                     draft_tokens=torch.zeros(0, 2, dtype=torch.int64, device=device)),
                                [("seed", dict(seed=1))], (None,), (1.0,))

    add("B=0", torch.float32, empty)
    return cases
