"""early_exit_topk's shapes and cases: random rows at every norm, dtype and k, and the edge cases
(ties that go to the lower id, NaN / inf rows, strided rows, k = V, k past the fused kernels,
an empty batch). The Triton interpreter tests (tiny), the GPU tests and the selftest draw from here.

At "tiny" some cases also carry `triton_overrides` (num_splits, block_v, block_h): the Triton
backend is then called with those tiles so that the interpreter's small shapes still cross tile
and split boundaries; every other backend (and every case at "quick" / "full") runs the op."""

import math
from functools import partial

import torch

from ..common.limits import FUSED_MAX_K
from .compare import shortened, exact, expect, with_checks
from .model import DTYPES, Row, cases
from .tiles import run_with_tiles

NORMS = ("rms", "layer", "none")
REL_TOL = 3e-5  # of max_v sum_h |norm(h)_h * W[v, h]|: float32 sums of H terms in another order
TIE_ROW = 0  # the row whose every logit the repeated head rows of tie_inputs win


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


# the crafted cases' sizes, (B, H, V) or (H, V): the interpreter (tiny) is slow, the GPU tiers are not.
# min_exact: of the random rows' ids (CPU / GPU); forced_tiles: the Triton launcher gets the case's
# tiles (small shapes still cross tile and split boundaries); partial_tiles: one case per entry, None =
# the launcher's own tiles; all_k: (B, H, dtype) of the k=V and k>FUSED_MAX_K cases, k_over (V, k)
_GPU_EDGES = dict(min_exact=0.5, forced_tiles=False, partial_tiles=(None,), partial_shape=(5, 1000, 50021),
                  layer_norm=(2048, 32000), strided=(4, 1000, 32000), ties=(9, 136, 5003),
                  tie_copies=(4000, 7, 2500, 8), tie_dtypes=(torch.bfloat16,), rms_ties=(2, 256, 5003),
                  nan_rows=(4, 256, 1000), nan_rows_16_ks=(1, 5, 16), all_k=(3, 64, torch.bfloat16),
                  k_is_v_vocab=16, k_over=(100, 40), all_k_min_exact=0.0)
EDGE_TIERS = {"tiny": dict(min_exact=0.8, forced_tiles=True,
                           partial_tiles=tuple(dict(num_splits=s, block_v=v, block_h=h)
                                               for s, v, h in ((None, 16, 16), (19, 16, 32), (1, 64, 16), (7, 32, 64))),
                           partial_shape=(5, 72, 301), layer_norm=(40, 130), strided=(4, 48, 100), ties=(4, 40, 150),
                           tie_copies=(65, 3, 64, 17), tie_dtypes=DTYPES, rms_ties=(2, 32, 90), nan_rows=(4, 40, 120),
                           nan_rows_16_ks=(), all_k=(2, 24, torch.float32), k_is_v_vocab=13,
                           k_over=(40, FUSED_MAX_K + 4), all_k_min_exact=0.8),
              "quick": _GPU_EDGES, "full": _GPU_EDGES}


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
    of the head are one repeated row that wins every logit of TIE_ROW: ties that go to the lower id."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randint(-3, 4, (batch, hidden_size), generator=gen).float()
    weight = torch.randint(-2, 3, (vocab, hidden_size), generator=gen).float()
    weight[list(copies)] = 3 * hidden.sign()[TIE_ROW]
    return hidden.to(dtype=dtype, device=device), weight.to(dtype=dtype, device=device)


def reference_logits(inputs):
    """[B, V] float32 logits of the reference (NaN -> -inf) and the per-row tolerance [B, 1]."""
    from ..common.sampling import nan_to_neg_inf
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
            return error, f"ids outside [0, {vocab}): {shortened(indices)}"
        if any(len(set(row)) != k for row in indices.tolist()):
            return error, f"repeated ids: {shortened(indices)}"
        if not bool((values[:, 1:] <= values[:, :-1]).all()):
            return error, f"values not descending: {shortened(values)}"
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
            return error, "; ".join(f"row {r}: ids {shortened(indices[r])} want {shortened(ref_ids[r, :k])}" for r in rows)
        fraction = float(must_match.float().mean())
        if fraction < min_exact:
            return error, f"only {fraction:.2f} of the ids were separated enough to compare (want {min_exact})"
        return error, None
    return compare


def run_topk(x, backend):
    return run_with_tiles("early_exit_topk", "early_exit", x, backend, _topk_with_tiles)


def _topk_with_tiles(launcher, x, tiles):
    norm = x.get("norm", "rms")
    return launcher(x["hidden"], None if norm == "none" else x.get("norm_weight"), x["lm_head_weight"], x["k"],
                    eps=x.get("eps", 1e-6), norm=norm, norm_bias=x.get("norm_bias"), **tiles)


# ------------------------------------------------------------------ the crafted inputs

def _with_tiles(x, tiles):
    return x if tiles is None else dict(x, triton_overrides=tiles)


def random_rows(seed, *, device, batch, hidden, vocab, k, norm, dtype):
    x = random_inputs(batch, hidden, vocab, dtype, device, norm=norm, seed=k + seed)
    return dict(x, k=k, norm=norm)


def partial_tiles(seed, *, device, shape, tiles):
    """H, V not multiples of the tiles, and many splits forced by small tiles."""
    x = _with_tiles(random_inputs(*shape, torch.bfloat16, device, seed=3 + seed), tiles)
    return dict(x, k=16)


def layer_norm_rows(seed, *, device, batch, hidden, vocab):
    """Batch 1, or a batch over one block of rows (two BLOCK_B programs per split); eps 1e-5."""
    x = random_inputs(batch, hidden, vocab, torch.float16, device, norm="layer", seed=batch + seed)
    return dict(x, k=4, norm="layer", eps=1e-5)


def strided_rows(seed, *, device, batch, hidden, vocab):
    """Row stride H + 32 and no norm weight."""
    x = random_inputs(batch, hidden, vocab, torch.float32, device, seed=2 + seed)
    rows = x["hidden"]
    wide = torch.zeros(rows.shape[0], rows.shape[1] + 32, device=device)
    wide[:, :rows.shape[1]] = rows
    return dict(hidden=wide[:, :rows.shape[1]], norm_weight=None, lm_head_weight=x["lm_head_weight"], k=6)


def ties(seed, *, device, batch, hidden, vocab, copies, dtype, k, tiles):
    """Integer data (every backend's logits exact); TIE_ROW's winner is a repeated head row."""
    hidden_rows, weight = tie_inputs(batch, hidden, vocab, dtype, device, copies, seed=k + seed)
    return _with_tiles(dict(hidden=hidden_rows, norm_weight=None, lm_head_weight=weight, k=k, norm="none"), tiles)


def rms_ties(seed, *, device, batch, hidden, vocab, tiles):
    """|hidden| constant per row, so the rms norm maps it to exactly +-1 (eps 0)."""
    hidden_rows, weight = tie_inputs(batch, hidden, vocab, torch.bfloat16, device, (40, 8), seed=1 + seed)
    hidden_rows = 2 * hidden_rows.sign() + (hidden_rows == 0).to(hidden_rows.dtype) * 2
    return _with_tiles(dict(hidden=hidden_rows, norm_weight=None, lm_head_weight=weight, k=5, norm="rms", eps=0.0),
                       tiles)


# nan_rows: a NaN in a hidden row (the whole row's logits -inf: ids 0..k-1), NaN head rows (-inf in
# every row), an inf weight (+-inf or NaN by the sign of norm(h))
NAN_HIDDEN = (1, 7)  # (row, entry)
NAN_HEAD_ROWS = [0, 2, 50]
INF_WEIGHT = (9, 3)  # (head row, entry)
NAN_ROWS_K = 8
# the GPU tests' NaN rows (float16)
NAN16_HIDDEN = (2, 3)
NAN16_HEAD_ROWS = [1, 500]
# inf_hidden: inf in hidden without a norm, and a head row that is 0 at that entry: inf * 0 = NaN ranks as -inf
INF_HIDDEN = (0, 4)  # (row, entry)
INF_TIMES_ZERO_ID = 5


def nan_rows(seed, *, device, batch, hidden, vocab, tiles):
    x = random_inputs(batch, hidden, vocab, torch.float32, device, seed=5 + seed)
    x["hidden"][NAN_HIDDEN] = math.nan
    x["lm_head_weight"][NAN_HEAD_ROWS] = math.nan
    x["lm_head_weight"][INF_WEIGHT] = math.inf
    return _with_tiles(dict(x, k=NAN_ROWS_K), tiles)


def nan_rows_16(seed, *, device, k):
    x = random_inputs(4, 256, 1000, torch.float16, device, seed=seed)
    x["hidden"][NAN16_HIDDEN] = math.nan
    x["lm_head_weight"][NAN16_HEAD_ROWS] = math.nan
    return dict(x, k=k)


def inf_hidden(seed, *, device, tiles):
    x = random_inputs(2, 32, 64, torch.float16, device, seed=6 + seed)
    x["hidden"][INF_HIDDEN] = math.inf
    x["lm_head_weight"][INF_TIMES_ZERO_ID, INF_HIDDEN[1]] = 0.0
    return _with_tiles(dict(x, k=5, norm="none"), tiles)


def k_is_v(seed, *, device, batch, hidden, dtype, vocab, tiles):
    """k = V: the fused kernels when V <= FUSED_MAX_K."""
    x = random_inputs(batch, hidden, vocab, dtype, device, seed=7 + seed)
    return _with_tiles(dict(x, k=x["lm_head_weight"].shape[0]), tiles)


def k_over(seed, *, device, batch, hidden, dtype, vocab, k):
    """k past FUSED_MAX_K: the materialised path."""
    x = random_inputs(batch, hidden, vocab, dtype, device, seed=8 + seed)
    return dict(x, k=k)


def empty(seed, *, device):
    x = random_inputs(1, 16, 20, torch.float32, device, seed=seed)
    return dict(x, hidden=torch.empty(0, 16, device=device), k=3)


# ------------------------------------------------------------------ known answers of the crafted cases

def _lowest_copies_first(winners, got, x):
    return got[1][TIE_ROW, :len(winners)].tolist() == winners


def _lowest_ids(row, k, got, x):
    return got[1][row].tolist() == list(range(k))


def _lowest_ids_at_minus_inf(row, k, got, x):
    return _lowest_ids(row, k, got, x) and bool((got[0][row] == -math.inf).all())


def _inf_times_zero_ranks_last(got, x):
    return float(reference_logits(x)[0][INF_HIDDEN[0], INF_TIMES_ZERO_ID]) == -math.inf


# ------------------------------------------------------------------ the case table

def _shape_rows(profile):
    min_exact = EDGE_TIERS[profile]["min_exact"]
    rows = []
    for index, (batch, hidden, vocab, k, norm, dtypes) in enumerate(early_exit_shapes(profile)):
        rows += [Row(f"B={batch} H={hidden} V={vocab} k={k} norm={norm}", dtype, random_rows,
                     dict(batch=batch, hidden=hidden, vocab=vocab, k=k, norm=norm, dtype=dtype),
                     topk_compare(min_exact), graph=index == 0 and dtype == dtypes[-1]) for dtype in dtypes]
    return rows


def _tiles(tier, **tiles):
    return tiles if tier["forced_tiles"] else None


def _tie_rows(tier):
    """Values and ids equal the reference's everywhere; TIE_ROW's ids start with the lowest copies."""
    batch, hidden, vocab = tier["ties"]
    tiles = _tiles(tier, num_splits=5, block_v=16)
    rows = []
    for dtype in tier["tie_dtypes"]:
        for k in (1, 5, 16):
            winners = sorted(tier["tie_copies"])[:min(k, 4)]
            rows.append(Row(f"ties k={k} (lower id wins)", dtype, ties,
                            dict(batch=batch, hidden=hidden, vocab=vocab, copies=tier["tie_copies"], dtype=dtype, k=k,
                                 tiles=tiles),
                            with_checks(exact(("values", "indices")), expect(
                                f"row {TIE_ROW} ids {winners} first", partial(_lowest_copies_first, winners)))))
    return rows


def _nan_rows(tier):
    batch, hidden, vocab = tier["nan_rows"]
    row, _ = NAN_HIDDEN
    rows = [Row("NaN and inf rows", torch.float32, nan_rows,
                dict(batch=batch, hidden=hidden, vocab=vocab, tiles=_tiles(tier, num_splits=4, block_v=16)),
                with_checks(topk_compare(), expect(f"row {row} (NaN hidden): ids 0..{NAN_ROWS_K - 1} at -inf",
                                                   partial(_lowest_ids_at_minus_inf, row, NAN_ROWS_K))))]
    row, _ = NAN16_HIDDEN
    rows += [Row(f"NaN rows k={k}", torch.float16, nan_rows_16, dict(k=k), with_checks(
        topk_compare(), expect(f"row {row} (NaN hidden): ids 0..{k - 1}", partial(_lowest_ids, row, k))))
        for k in tier["nan_rows_16_ks"]]
    return rows


def _edge_rows(profile):
    """The crafted cases, at this profile's size."""
    tier = EDGE_TIERS[profile]
    loose = topk_compare(tier["min_exact"])
    rows = [Row(f"B={tier['partial_shape'][0]} H={tier['partial_shape'][1]} V={tier['partial_shape'][2]} k=16 "
                "partial tiles" + ("" if tiles is None else
                                   " splits={num_splits} block_v={block_v} block_h={block_h}".format(**tiles)),
                torch.bfloat16, partial_tiles, dict(shape=tier["partial_shape"], tiles=tiles), loose)
            for tiles in tier["partial_tiles"]]
    hidden, vocab = tier["layer_norm"]
    rows += [Row(f"B={batch} layer norm eps=1e-5", torch.float16, layer_norm_rows,
                 dict(batch=batch, hidden=hidden, vocab=vocab), loose) for batch in (1, 70)]
    batch, hidden, vocab = tier["strided"]
    rows.append(Row("strided rows, no norm weight", torch.float32, strided_rows,
                    dict(batch=batch, hidden=hidden, vocab=vocab), loose))
    rows += _tie_rows(tier)
    batch, hidden, vocab = tier["rms_ties"]
    rows.append(Row("ties after rms norm, eps=0", torch.bfloat16, rms_ties,
                    dict(batch=batch, hidden=hidden, vocab=vocab, tiles=_tiles(tier, num_splits=3, block_v=16)),
                    exact(("values", "indices"))))
    rows += _nan_rows(tier)
    rows.append(Row("inf hidden, no norm", torch.float16, inf_hidden, dict(tiles=_tiles(tier, block_v=16)), with_checks(
        topk_compare(), expect(f"id {INF_TIMES_ZERO_ID} of row {INF_HIDDEN[0]} at -inf in the reference logits",
                               _inf_times_zero_ranks_last))))
    batch, hidden, dtype = tier["all_k"]
    over_vocab, over_k = tier["k_over"]
    all_k = topk_compare(tier["all_k_min_exact"])
    rows += [Row("k=V", dtype, k_is_v, dict(batch=batch, hidden=hidden, dtype=dtype, vocab=tier["k_is_v_vocab"],
                                             tiles=_tiles(tier, block_v=16)), all_k),
             Row(f"k>{FUSED_MAX_K} (materialised path)", dtype, k_over,
                 dict(batch=batch, hidden=hidden, dtype=dtype, vocab=over_vocab, k=over_k), all_k),
             Row("empty batch", torch.float32, empty, {}, topk_compare())]
    return rows


def early_exit_cases(profile, device):
    return cases("early_exit_topk", run_topk, _shape_rows(profile) + _edge_rows(profile), device)
