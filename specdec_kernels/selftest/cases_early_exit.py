"""early_exit_topk's shapes and cases: random rows at every norm, dtype and k, and the edge cases
(ties that go to the lower id, NaN / inf rows, strided rows, k = V, k past the fused kernels,
an empty batch). The Triton interpreter tests (tiny), the GPU tests and the selftest draw from here.

At "tiny" some cases also carry `triton_overrides` (num_splits, block_v, block_h): the Triton
backend is then called with those tiles so that the interpreter's small shapes still cross tile
and split boundaries; every other backend (and every case at "quick" / "full") runs the op."""

import math

import torch

from .compare import _short, exact, expect, with_checks
from .model import DTYPES, Case

NORMS = ("rms", "layer", "none")
REL_TOL = 3e-5  # of max_v sum_h |norm(h)_h * W[v, h]|: float32 sums of H terms in another order


def early_exit_shapes(profile):
    """(B, H, V, k, norm, dtypes): random rows (min_exact 0.8 on the CPU, 0.5 on a GPU)."""
    if profile == "tiny":
        return [(3, 80, 300, k, norm, DTYPES) for k in (1, 5, 16) for norm in NORMS]
    small = [(5, 520, 3001, k, norm, DTYPES) for k in (1, 5, 16) for norm in NORMS]
    if profile == "quick":
        return small
    benchmark = [(b, h, v, 8, "rms", (torch.bfloat16,)) for v in (32000, 128256) for h in (2048, 4096)
                 for b in (1, 8, 64)]
    return small + benchmark + [(b, 4096, 151936, 8, "rms", (torch.bfloat16,)) for b in (1, 64)] + \
        [(8, 2048, 32000, 8, "rms", (torch.float16,))]


def random_inputs(batch, hidden_size, vocab, dtype, device, *, norm="rms", seed=0):
    """hidden, norm_weight, lm_head_weight (and norm_bias for layer norm), as tests/early_exit_support.py."""
    gen = torch.Generator().manual_seed(seed)
    x = dict(hidden=torch.randn(batch, hidden_size, generator=gen) * 3 + 0.5,
             norm_weight=1 + 0.2 * torch.randn(hidden_size, generator=gen),
             lm_head_weight=torch.randn(vocab, hidden_size, generator=gen) * hidden_size ** -0.5)
    if norm == "layer":
        x["norm_bias"] = 0.1 * torch.randn(hidden_size, generator=gen)
    return {name: t.to(dtype=dtype, device=device) for name, t in x.items()}


def tie_inputs(batch, hidden_size, vocab, dtype, device, copies, *, seed=0):
    """Integer-valued hidden and LM head (dot products exact in any order) where the rows `copies`
    of the head are one repeated row that wins every logit of row 0: ties that go to the lower id."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randint(-3, 4, (batch, hidden_size), generator=gen).float()
    weight = torch.randint(-2, 3, (vocab, hidden_size), generator=gen).float()
    weight[list(copies)] = 3 * hidden.sign()[0]
    return hidden.to(dtype=dtype, device=device), weight.to(dtype=dtype, device=device)


def reference_logits(inputs):
    """[B, V] float32 logits of the reference (NaN -> -inf) and the per-row tolerance [B, 1]."""
    from ..reference._sampling import nan_to_neg_inf
    from ..reference.early_exit import normalize

    norm = inputs.get("norm", "rms")
    weight, bias = (None, None) if norm == "none" else (inputs.get("norm_weight"), inputs.get("norm_bias"))
    h = normalize(inputs["hidden"], weight, bias, eps=inputs.get("eps", 1e-6), norm=norm)
    w = inputs["lm_head_weight"].float()
    logits = nan_to_neg_inf(h @ w.t())
    scale = torch.nan_to_num(h.abs() @ w.abs().t(), nan=0.0, posinf=0.0).amax(dim=1, keepdim=True)
    return logits, REL_TOL * scale + 1e-6


def topk_compare(min_exact=0.0):
    """As tests/early_exit_support.assert_topk_matches: values within float rounding, descending,
    distinct ids that carry their values, ids exact where the reference's logits are separated (and
    at -inf), and at least `min_exact` of the ids separated enough to be compared exactly (the case
    can fail). Uses the case's eps."""
    def compare(got, want, inputs):
        values, indices = got
        k = inputs["k"]
        batch, vocab = inputs["hidden"].shape[0], inputs["lm_head_weight"].shape[0]
        if values.shape != (batch, k) or indices.shape != (batch, k) or values.dtype != torch.float32 \
                or indices.dtype != torch.int64:
            return None, (f"got {values.dtype} {list(values.shape)} and {indices.dtype} {list(indices.shape)}, "
                          f"want float32 and int64 [{batch}, {k}]")
        if batch == 0:
            return 0.0, None
        logits, tol = reference_logits(inputs)
        ref_vals, ref_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
        want_vals = ref_vals[:, :k]
        finite = torch.isfinite(want_vals)
        error = float((values - want_vals).abs()[finite].max()) if bool(finite.any()) else 0.0
        if not bool(((indices >= 0) & (indices < vocab)).all()):
            return error, f"ids outside [0, {vocab}): {_short(indices)}"
        if any(len(set(row)) != k for row in indices.tolist()):
            return error, f"repeated ids: {_short(indices)}"
        if not bool((values[:, 1:] <= values[:, :-1]).all()):
            return error, f"values not descending: {_short(values)}"
        if not torch.equal(values[~finite], want_vals[~finite]):
            return error, "non-finite values differ from the reference's"
        if not bool(((values - want_vals).abs() <= tol)[finite].all()):
            return error, f"values off by up to {error:.3g} (tolerance {float(tol.max()):.3g})"
        carried = logits.gather(1, indices)
        if not torch.equal(torch.isfinite(carried), finite) or \
                not bool(((carried - values).abs() <= tol)[finite].all()):
            return error, "an id does not carry the logit reported beside it"
        padded = torch.cat([torch.full((batch, 1), math.inf, device=logits.device), ref_vals,
                            torch.full((batch, 1), -math.inf, device=logits.device)], 1)
        separated = (padded[:, :k] - padded[:, 1:k + 1] > tol) & (padded[:, 1:k + 1] - padded[:, 2:k + 2] > tol)
        must_match = (want_vals == -math.inf) | separated
        if not torch.equal(indices[must_match], ref_ids[:, :k][must_match]):
            rows = (must_match & (indices != ref_ids[:, :k])).any(1).nonzero().flatten()[:2].tolist()
            return error, "; ".join(f"row {r}: ids {_short(indices[r])} want {_short(ref_ids[r, :k])}" for r in rows)
        fraction = float(must_match.float().mean())
        if fraction < min_exact:
            return error, f"only {fraction:.2f} of the ids were separated enough to compare (want {min_exact})"
        return error, None
    return compare


def run_topk(x, backend):
    """The op; the Triton launcher with the case's tiles when it carries `triton_overrides`."""
    from .. import ops

    x = dict(x)
    overrides = x.pop("triton_overrides", None)
    if overrides is not None and backend == "triton":
        from ..common.registry import implementation
        from ..triton import early_exit_topk as triton_module

        if implementation("early_exit_topk", "triton") is not triton_module.early_exit_topk:
            return ops.early_exit_topk(**x, backend=backend)  # the registered backend was replaced (a mutation test)
        norm = x.get("norm", "rms")
        return triton_module.early_exit_topk(x["hidden"], None if norm == "none" else x.get("norm_weight"),
                                             x["lm_head_weight"], x["k"], eps=x.get("eps", 1e-6), norm=norm,
                                             norm_bias=x.get("norm_bias"), **overrides)
    return ops.early_exit_topk(**x, backend=backend)


def _edge_cases(profile, device):
    """(name, dtype, build(seed), compare): the crafted cases, at this profile's size."""
    tiny = profile == "tiny"
    tiles = (lambda **kw: dict(triton_overrides=kw)) if tiny else (lambda **kw: {})
    min_exact = 0.8 if tiny else 0.5
    cases = []
    # partial tiles (H, V not multiples of the tiles) and many splits forced by small tiles
    split_configs = [(None, 16, 16), (19, 16, 32), (1, 64, 16), (7, 32, 64)] if tiny else [(None, None, None)]
    shape = (5, 72, 301) if tiny else (5, 1000, 50021)
    for splits, block_v, block_h in split_configs:
        def build(seed, splits=splits, block_v=block_v, block_h=block_h):
            x = random_inputs(*shape, torch.bfloat16, device, seed=3 + seed)
            if tiny:
                x["triton_overrides"] = dict(num_splits=splits, block_v=block_v, block_h=block_h)
            return dict(x, k=16)

        name = f"B={shape[0]} H={shape[1]} V={shape[2]} k=16 partial tiles"
        cases.append((name + (f" splits={splits} block_v={block_v} block_h={block_h}" if tiny else ""),
                      torch.bfloat16, build, topk_compare(min_exact)))
    # batch 1 and a batch over one block of rows (two BLOCK_B programs per split), layer norm, eps 1e-5
    for batch in (1, 70):
        def build(seed, batch=batch):
            x = random_inputs(batch, 40 if tiny else 2048, 130 if tiny else 32000, torch.float16, device,
                              norm="layer", seed=batch + seed)
            return dict(x, k=4, norm="layer", eps=1e-5)

        cases.append((f"B={batch} layer norm eps=1e-5", torch.float16, build, topk_compare(min_exact)))

    # strided rows (row stride 80 > H) and no norm weight
    def strided(seed):
        x = random_inputs(4, 48 if tiny else 1000, 100 if tiny else 32000, torch.float32, device, seed=2 + seed)
        hidden = x["hidden"]
        wide = torch.zeros(hidden.shape[0], hidden.shape[1] + 32, device=device)
        wide[:, :hidden.shape[1]] = hidden
        return dict(hidden=wide[:, :hidden.shape[1]], norm_weight=None, lm_head_weight=x["lm_head_weight"], k=6)

    cases.append(("strided rows, no norm weight", torch.float32, strided, topk_compare(min_exact)))

    # ties on integer data (every backend's logits exact): values and ids equal the reference's
    # everywhere; row 0's winner is a repeated head row, the lowest copy first
    copies = (65, 3, 64, 17) if tiny else (4000, 7, 2500, 8)
    for dtype in (DTYPES if tiny else (torch.bfloat16,)):
        for k in (1, 5, 16):
            def ties(seed, dtype=dtype, k=k):
                hidden, weight = tie_inputs(4 if tiny else 9, 40 if tiny else 136, 150 if tiny else 5003, dtype,
                                            device, copies, seed=k + seed)
                return dict(hidden=hidden, norm_weight=None, lm_head_weight=weight, k=k, norm="none",
                            **tiles(num_splits=5, block_v=16))

            winners = sorted(copies)[:min(k, 4)]
            cases.append((f"ties k={k} (lower id wins)", dtype, ties, with_checks(
                exact(("values", "indices")),
                expect(f"row 0 ids {winners} first", lambda got, x, w=winners: got[1][0, :len(w)].tolist() == w))))

    # ties after rms norm: |hidden| constant per row, so the norm maps it to exactly +-1 (eps 0)
    def rms_ties(seed):
        hidden, weight = tie_inputs(2, 32 if tiny else 256, 90 if tiny else 5003, torch.bfloat16, device, (40, 8),
                                    seed=1 + seed)
        hidden = 2 * hidden.sign() + (hidden == 0).to(hidden.dtype) * 2
        return dict(hidden=hidden, norm_weight=None, lm_head_weight=weight, k=5, norm="rms", eps=0.0,
                    **tiles(num_splits=3, block_v=16))

    cases.append(("ties after rms norm, eps=0", torch.bfloat16, rms_ties, exact(("values", "indices"))))

    # NaN in a hidden row (the whole row's logits -inf: ids 0..k-1), NaN head rows (-inf in every
    # row), an inf weight (+-inf or NaN by the sign of norm(h))
    k_nan = 8

    def nan_rows(seed):
        x = random_inputs(4, 40 if tiny else 256, 120 if tiny else 1000, torch.float32, device, seed=5 + seed)
        x["hidden"][1, 7] = math.nan
        x["lm_head_weight"][[0, 2, 50]] = math.nan
        x["lm_head_weight"][9, 3] = math.inf
        return dict(x, k=k_nan, **tiles(num_splits=4, block_v=16))

    cases.append(("NaN and inf rows", torch.float32, nan_rows, with_checks(
        topk_compare(),
        expect(f"row 1 (NaN hidden): ids 0..{k_nan - 1} at -inf",
               lambda got, x: got[1][1].tolist() == list(range(k_nan)) and bool((got[0][1] == -math.inf).all())))))
    if not tiny:  # the GPU tests' NaN rows: float16, a NaN hidden entry, NaN head rows
        for k in (1, 5, 16):
            def nan_rows_16(seed, k=k):
                x = random_inputs(4, 256, 1000, torch.float16, device, seed=seed)
                x["hidden"][2, 3] = math.nan
                x["lm_head_weight"][[1, 500]] = math.nan
                return dict(x, k=k)

            cases.append((f"NaN rows k={k}", torch.float16, nan_rows_16, with_checks(
                topk_compare(), expect(f"row 2 (NaN hidden): ids 0..{k - 1}",
                                       lambda got, x, k=k: got[1][2].tolist() == list(range(k))))))

    # inf in hidden without a norm: inf * 0 = NaN ranks as -inf
    def inf_hidden(seed):
        x = random_inputs(2, 32, 64, torch.float16, device, seed=6 + seed)
        x["hidden"][0, 4] = math.inf
        x["lm_head_weight"][5, 4] = 0.0
        return dict(x, k=5, norm="none", **tiles(block_v=16))

    cases.append(("inf hidden, no norm", torch.float16, inf_hidden, with_checks(
        topk_compare(), expect("id 5 of row 0 at -inf in the reference logits",
                               lambda got, x: float(reference_logits(x)[0][0, 5]) == -math.inf))))

    # k = V (fused kernels when V <= FUSED_MAX_K), and k past FUSED_MAX_K (the materialised path)
    from ..common.limits import FUSED_MAX_K

    def k_is_v(seed):
        x = random_inputs(2 if tiny else 3, 24 if tiny else 64, 13 if tiny else 16,
                          torch.float32 if tiny else torch.bfloat16, device, seed=7 + seed)
        return dict(x, k=x["lm_head_weight"].shape[0], **tiles(block_v=16))

    def k_over(seed):
        x = random_inputs(2 if tiny else 3, 24 if tiny else 64, 40 if tiny else 100,
                          torch.float32 if tiny else torch.bfloat16, device, seed=8 + seed)
        return dict(x, k=FUSED_MAX_K + 4 if tiny else 40)

    dtype = torch.float32 if tiny else torch.bfloat16
    cases.append(("k=V", dtype, k_is_v, topk_compare(min_exact if tiny else 0.0)))
    cases.append((f"k>{FUSED_MAX_K} (materialised path)", dtype, k_over, topk_compare(min_exact if tiny else 0.0)))

    def empty(seed):
        x = random_inputs(1, 16, 20, torch.float32, device, seed=seed)
        return dict(x, hidden=torch.empty(0, 16, device=device), k=3)

    cases.append(("empty batch", torch.float32, empty, topk_compare()))
    return cases


def early_exit_cases(profile, device):
    cases = []
    min_exact = 0.8 if profile == "tiny" else 0.5
    for index, (batch, hidden, vocab, k, norm, dtypes) in enumerate(early_exit_shapes(profile)):
        for dtype in dtypes:
            def build(seed, batch=batch, hidden=hidden, vocab=vocab, k=k, norm=norm, dtype=dtype):
                x = random_inputs(batch, hidden, vocab, dtype, device, norm=norm, seed=k + seed)
                return dict(x, k=k, norm=norm)

            cases.append(Case("early_exit_topk", f"B={batch} H={hidden} V={vocab} k={k} norm={norm}", dtype, build,
                              run_topk, topk_compare(min_exact), graph=index == 0 and dtype == dtypes[-1]))
    for name, dtype, build, compare in _edge_cases(profile, device):
        cases.append(Case("early_exit_topk", name, dtype, build, run_topk, compare))
    return cases
