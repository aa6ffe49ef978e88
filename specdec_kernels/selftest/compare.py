"""How a backend's answer is judged against the reference's: exact and within tolerance, and the
op-specific comparisons that excuse only decisions a float rounding may flip (bild_verify,
rejection_sample_logits, early_exit_topk)."""

import math

import torch


def shortened(x: torch.Tensor, limit: int = 12) -> str:
    values = x.flatten().tolist()
    text = ", ".join(str(v) for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"


def exact(names: tuple[str, ...]):
    """Outputs must be equal bit for bit; the problem names the first differing rows."""
    def compare(got, want, inputs):
        for name, g, w in zip(names, got, want):
            if g.shape != w.shape or g.dtype != w.dtype:
                return None, f"{name}: got {g.dtype} {list(g.shape)}, want {w.dtype} {list(w.shape)}"
            differ = g != w
            if g.is_floating_point():
                differ &= ~(torch.isnan(g) & torch.isnan(w))
            count = int(differ.sum())
            if count:
                rows = differ.reshape(differ.shape[0], -1).any(1).nonzero().flatten()[:3].tolist() if g.dim() else []
                detail = "; ".join(f"row {r}: got {shortened(g[r])} want {shortened(w[r])}" for r in rows)
                return float(count), f"{name}: {count} entries differ ({detail})"
        return 0.0, None
    return compare


def close(names: tuple[str, ...], tolerances: tuple[tuple[float, float], ...]):
    """Float outputs within (atol, rtol) each; NaN must meet NaN."""
    def compare(got, want, inputs):
        worst = 0.0
        for name, g, w, (atol, rtol) in zip(names, got, want, tolerances):
            if g.shape != w.shape or g.dtype != w.dtype:
                return None, f"{name}: got {g.dtype} {list(g.shape)}, want {w.dtype} {list(w.shape)}"
            g, w = g.double(), w.double()
            both_nan = torch.isnan(g) & torch.isnan(w)
            same_inf = torch.isinf(g) & (g == w)
            diff = torch.where(both_nan | same_inf, torch.zeros_like(g), (g - w).abs())
            diff = torch.nan_to_num(diff, nan=math.inf)
            error = float(diff.max()) if diff.numel() else 0.0
            worst = max(worst, error)
            bad = diff > atol + rtol * w.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
            if bool(bad.any()):
                at = tuple(bad.nonzero()[0].tolist())
                return worst, (f"{name}: {int(bad.sum())} of {bad.numel()} values off by more than atol {atol:g} + "
                               f"rtol {rtol:g} (max {error:.3g}; first at {list(at)}: got {float(g[at]):.6g}, "
                               f"want {float(w[at]):.6g})")
        return worst, None
    return compare


def draft_nll_band(logits, drafts, margin):
    """Finite -log softmax(logits[:, i])[draft_i] as the reference computes it (float32), and the band
    around each where another logsumexp rounding may land: `margin`, widened by a few ulps of lse."""
    from ..common.sampling import gather_token_values, nan_to_neg_inf

    body = nan_to_neg_inf(logits[:, :drafts.shape[1]])
    value, in_range = gather_token_values(body, drafts)
    lse = torch.logsumexp(body, dim=-1)
    nll = lse - value
    keep = in_range & torch.isfinite(nll)
    return nll[keep], margin + 8 * torch.finfo(torch.float32).eps * lse[keep].abs()


def bild_threshold(logits, drafts, start, margin=1e-3):
    """A rollback threshold at least `margin` (nats) from every draft's NLL: the backends sum
    the logsumexp in another order, so a threshold inside that band may go either way."""
    nll, band = draft_nll_band(logits, drafts, margin)
    t = start
    while nll.numel() and bool(((nll - t).abs() < band).any()):
        t += 2.5 * margin
    return t


def compare_bild(got, want, inputs):
    """Equal rows, except rows with a draft NLL within the logsumexp rounding band of the
    threshold (none at the thresholds the cases pick; a graph replay reuses the captured
    threshold on new logits, where one may land in the band)."""
    error, problem = exact(("output_tokens", "num_accepted"))(got, want, inputs)
    if problem is None or got[0].shape != want[0].shape:
        return error, problem
    logits, drafts, threshold = inputs["target_logits"], inputs["draft_tokens"], inputs["rollback_threshold"]
    rows = ((got[0] != want[0]).any(1) | (got[1] != want[1])).nonzero().flatten().tolist()
    for b in rows:
        nll, band = draft_nll_band(logits[b:b + 1], drafts[b:b + 1], 1e-3)
        if not bool(((nll - threshold).abs() < band).any()):
            return float(len(rows)), f"row {b} differs with every draft NLL clear of the threshold: {problem}"
    return float(len(rows)), None


def _row_uniforms(inputs, b, accepted):
    """Row b's float64 uniforms [g+1] as the op read them: its coins, then the final draw (seeded mode:
    the Philox draws of common/draws.py, the final one keyed by the number of accepted drafts)."""
    from ..common.draws import ChainCoins

    drafts = inputs["draft_tokens"]
    if inputs.get("uniforms") is not None:
        return inputs["uniforms"][b].double()
    batch, g = drafts.shape
    coins = ChainCoins(None, inputs["seed"], inputs.get("offsets"), batch, g, drafts.device)
    final = coins.final(torch.full((batch,), accepted, dtype=torch.int64, device=drafts.device))
    return torch.cat([coins.accept[b], final[b].reshape(1)])


def _row_laws(inputs, b):
    """Row b's target and draft softmax in float64 at its temperature (one, or one per row), and
    its number of drafts."""
    temperature, counts = inputs.get("temperature", 1.0), inputs.get("num_draft_tokens")
    g = inputs["draft_tokens"].shape[1]
    if isinstance(temperature, torch.Tensor):
        temperature = float(temperature[b])
    p = torch.softmax(inputs["target_logits"][b].double() / temperature, -1)
    q = torch.softmax(inputs["draft_logits"][b].double() / temperature, -1)
    return p, q, g if counts is None else int(counts[b].clamp(0, g))


def _chain_coin_near(inputs, b, p, q, j, margin):
    """Rejection sampling's coin at draft j: u_j q_j(x_j) against p_j(x_j), within `margin` relative."""
    tok = int(inputs["draft_tokens"][b, j])
    if not 0 <= tok < p.shape[-1]:
        return False
    u = _row_uniforms(inputs, b, j)
    lhs, rhs = float(u[j]) * float(q[j, tok]), float(p[j, tok])
    return abs(lhs - rhs) <= margin * max(abs(rhs), abs(lhs), 1e-30)


def _block_ratios(p, q, drafts, n):
    """Block verification's ratios of the accepted prefixes: 1, then min(1, ratio * p_i(x_i) / q_i(x_i))."""
    ratios = [1.0]
    for i in range(n):
        tok = int(drafts[i])
        ok = 0 <= tok < p.shape[-1] and float(q[i, tok]) > 0
        ratios.append(min(1.0, ratios[-1] * float(p[i, tok]) / float(q[i, tok])) if ok else 0.0)
    return ratios


def _block_coin_near(ratios, p, q, u, n, margin):
    """Any of block verification's coins within `margin` of its threshold h_i."""
    mass = [float((ratios[j] * p[j] - q[j]).clamp(min=0).sum()) for j in range(n)]
    for i in range(1, n + 1):
        h = ratios[i] if i == n else (mass[i] / (mass[i] + 1 - ratios[i]) if mass[i] + 1 - ratios[i] > 0 else 1.0)
        if abs(float(u[i - 1]) - h) <= margin:
            return True
    return False


def near_boundary_explains(b, inputs, got, want, margin=1e-4, *, block=False):
    """True when row b's difference comes from a decision within `margin` of its boundary,
    recomputed in float64 (the backend reduces its softmax in another order): an acceptance coin,
    an almost empty residual, or the final draw's threshold against a cdf boundary. The one
    near-boundary rule of the catalog and the GPU tests: caller uniforms or seeds, one temperature
    or one per row. What differs is the acceptance rule: rejection sampling's coin u q(x) < p(x)
    where the accepted counts differ, or (`block`) block verification's coins against their
    thresholds h_i, any of them (its residual then weighs p by the accepted prefix's ratio)."""
    p, q, n = _row_laws(inputs, b)
    a_got, a_want = int(got[1][b]), int(want[1][b])
    if not block and a_got != a_want:
        return _chain_coin_near(inputs, b, p, q, min(a_got, a_want), margin)
    u = _row_uniforms(inputs, b, a_got)
    if block:
        ratios = _block_ratios(p, q, inputs["draft_tokens"][b], n)
        if _block_coin_near(ratios, p, q, u, n, margin):
            return True
        if a_got != a_want:
            return False
        residual = (ratios[a_got] * p[a_got] - q[a_got]).clamp(min=0) if a_got < n else p[a_got]
    else:
        residual = (p[a_got] - q[a_got]).clamp(min=0) if a_got < n else p[a_got]
    if float(residual.sum()) < margin:
        return True  # a nearly empty residual: the fallback decision itself is marginal
    cdf = residual.cumsum(0)
    lo = min(int(got[0][b, a_got]), int(want[0][b, a_got]))
    g = inputs["draft_tokens"].shape[1]
    return abs(float(cdf[lo]) - float(u[g]) * float(cdf[-1])) <= margin * float(cdf[-1])


def boundary_excused(explains):
    """A comparison of sampled tokens: equal rows, except at most max(1, 2%) rows whose difference
    explains(b, inputs, got, want) attributes to a decision within its margin of a boundary (the
    backend reduces its softmax in another order than the reference)."""
    def compare(got, want, inputs):
        problem = exact(("output_tokens", "num_accepted"))(got[:2], want[:2], inputs)[1]
        if problem is None:
            return 0.0, None
        if got[0].shape != want[0].shape:
            return None, problem
        rows = ((got[0] != want[0]).any(1) | (got[1] != want[1])).nonzero().flatten().tolist()
        if len(rows) > max(1, 0.02 * got[0].shape[0]):
            return float(len(rows)), f"{len(rows)} rows differ (more than 2%): {problem}"
        unexplained = [b for b in rows if not explains(b, inputs, got, want)]
        if unexplained:
            b = unexplained[0]
            return float(len(rows)), (f"row {b} differs away from any decision boundary: got {shortened(got[0][b])} "
                                      f"want {shortened(want[0][b])}")
        return float(len(rows)), None
    return compare


compare_logits_sampling = boundary_excused(near_boundary_explains)


def with_checks(compare, *checks):
    """`compare`, then (when it passes) each check(got, inputs) -> problem or None: known answers
    of a crafted case (an all-NaN row emits id 0, ...) that every backend must give, not only
    the same answer as the reference."""
    def wrapped(got, want, inputs):
        error, problem = compare(got, want, inputs)
        for check in checks:
            if problem is not None:
                break
            problem = check(got, inputs)
        return error, problem
    # what tests/catalog_fingerprint.py reads to judge each check apart from the compare it follows
    wrapped.checks = getattr(compare, "checks", ()) + checks
    return wrapped


def chain_structure(vocab_key="target_logits"):
    """The chain outputs' shape of an answer: every entry in [-1, V), the emitted token (at
    num_accepted) in [0, V), and only -1 after it."""
    def check(got, inputs):
        out, accepted = got[0], got[1]
        vocab = inputs[vocab_key].shape[-1]
        if out.numel() == 0:
            return None
        emitted = out.gather(1, accepted.clamp(0, out.shape[1] - 1).unsqueeze(1)).squeeze(1)
        if not bool(((emitted >= 0) & (emitted < vocab)).all()):
            return f"an emitted token is outside [0, {vocab}): {shortened(emitted)}"
        pos = torch.arange(out.shape[1], device=out.device).unsqueeze(0)
        if not bool((out[pos > accepted.unsqueeze(1)] == -1).all()):
            return "entries after the emitted token are not -1"
        return None
    return check


def expect(description, predicate):
    """A known answer: predicate(got, inputs) -> bool, reported with `description` when False."""
    def check(got, inputs):
        return None if predicate(got, inputs) else f"expected {description}; got {shortened(got[0])} {shortened(got[1])}"
    return check
