"""The logit_verify family: greedy_verify, relaxed_verify, bild_verify, max_prob (and fallback_check,
judged with max_prob). Random shapes in every dtype, then edges: crafted rows (NaN / inf / ties /
padding / V = 1 / g = 0 / empty batches), strided inputs, out-of-range ids (through the backend
itself: a GPU call cannot look at them). Sizes in TIERS: the interpreter's at "tiny", production
vocabularies on a GPU."""

import functools

import torch

from .chain_inputs import (CHAIN_OUTPUTS, CRAFTED_GREEDY, CRAFTED_LOGIT, INF, NAN, chain_catalog, crafted_greedy,
                           crafted_logit, impl, op_run, random_shapes, special_accept_all, special_inputs,
                           special_logit_index, sweep, tie_inputs)
from .compare import bild_threshold, chain_structure, close, compare_bild, exact, expect, with_checks
from .inputs import near_top_drafts, ragged, random_logits, seeded_generator
from .model import DTYPES, Row

F32, BF16 = torch.float32, torch.bfloat16
STRUCTURE = chain_structure()
MAX_PROB_CLOSE = close(("max_prob",), ((1e-6, 1e-5),))
BETA_TAU = ((1, 0.0), (1, 5.0), (3, 0.0), (2, 0.7), (5, 1.5), (50, 3.0))
RANDOM_BETA_TAU = ((1, 0.0), (3, 0.7), (50, 3.0), (2, 0.0))  # rotated over the random (shape, dtype) pairs
RANDOM_BILD_START = (1.5, 4.0, 9.0)  # rotated over the random shapes
TIE_SETTINGS = BETA_TAU + ((2, 0.5), (4, 0.5), (1, 5.0))
FUZZ_SETTINGS = ((1, 0.0), (3, 0.5), (8, 2.0), (2, INF))
# top_beta x tau around the crafted ranks (1, 2, 3 at gaps 0.5, 0.5, 0.75) of boundary_logits
BOUNDARY_GRID = [(beta, tau) for beta in (1, 2, 3, 4, 5) for tau in (0.0, 0.25, 0.5, 0.5000001, 0.75, 0.7500001, 1.0)]
BOUNDARY_KNOWN = {(3, 0.5): [1, 0, 0, 0], (3, 0.5000001): [3, 2, 3, 0], (4, 0.7500001): [3, 3, 3, 3]}
FUZZ = ((1, 0, 1, 0.3), (3, 4, 70, 0.2), (2, 3, 1, 0.0), (3, 2, 17, 0.5), (2, 4, 5, 0.05))  # (B, g, V, specials)
GPU_FUZZ = tuple((batch, g, vocab if vocab < 8 else vocab * 1000 + 1, special) for batch, g, vocab, special in FUZZ)
GPU_MAX_PROB = ((151936,), (3, 128256), (2, 3, 32000), (2, 3, 4, 4000), (5, 7), (4, 1), (3, 4, 32001), (2048, 32000))

TIERS = {  # the sizes of the edge cases: the Triton interpreter at "tiny", production vocabularies on a GPU
    "special": dict(tiny=(300,), quick=(32000,), full=(32000, 151936)),
    "crafted greedy": dict(tiny=1000, quick=32000, full=32000),
    "crafted": dict(tiny=300, quick=32000, full=32000),
    # under the interpreter: V = 4099 for greedy (4 tiles per program, a split at 4095), 1100 for the others
    "ties": dict(tiny=(4099, 1100), quick=(32000,), full=(32000, 128256)),
    "strided": dict(tiny=300, quick=32001, full=32001),
    "small": dict(tiny=50, quick=32000, full=32000),
    "boundaries": dict(tiny=300, quick=32000, full=32000),
    "float32 tau": dict(tiny=50, quick=32000, full=32000),
    "special probs": dict(tiny=40, quick=40000, full=40000),
    "fallback": dict(tiny=((8, 300),), quick=((64, 151936),), full=((64, 151936),)),
    "fuzz": dict(tiny=FUZZ, quick=GPU_FUZZ, full=GPU_FUZZ),  # production vocabularies on a GPU (V < 8 kept)
    "max_prob shapes": dict(tiny=((1100,), (3, 1100), (2, 3, 5), (2, 3, 4, 40), (5, 7), (4, 1), (3, 4, 9)),
                            quick=GPU_MAX_PROB, full=GPU_MAX_PROB),
}


def _ops():
    from .. import ops

    return ops


# ---------------------------------------------------------------------------------------------
# Builders: inputs(seed, *, device, <the row's settings>)

def logits_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged):
    gen = seeded_generator(device, seed)
    logits = random_logits(batch, g + 1, vocab, dtype, gen, device)
    return dict(target_logits=logits, draft_tokens=near_top_drafts(logits, gen),
                num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)


def bild_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged, index):
    x = logits_inputs(seed, device=device, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged)
    start = RANDOM_BILD_START[index % len(RANDOM_BILD_START)]
    x["rollback_threshold"] = bild_threshold(x["target_logits"], x["draft_tokens"], start)
    return x


def random_max_prob_inputs(seed, *, device, batch, g, vocab, dtype):
    return dict(logits=random_logits(batch, g + 1, vocab, dtype, seeded_generator(device, seed), device))


def logits_only(build):
    """A builder of max_prob's inputs: the target logits of `build`'s."""
    return functools.partial(_logits_only, build)


def _logits_only(build, seed, **settings):
    return dict(logits=build(seed, **settings)["target_logits"])


def strided_inputs(seed, *, device, dtype, vocab, layout):
    """Non-contiguous [3, 5, V] logits: a slice of positions (batch stride (g+3) V), a
    position-major view, or rows offset by one element (not 16-byte aligned); column-major
    drafts, strided counts [4, 1, 3]."""
    batch, g = 3, 4
    gen = seeded_generator(device, seed)
    if layout == "sliced":
        logits = (torch.randn(batch, g + 3, vocab, generator=gen, device=device) * 3).to(dtype)[:, 1:g + 2]
    elif layout == "position-major":
        logits = (torch.randn(g + 1, batch, vocab, generator=gen, device=device) * 3).to(dtype).transpose(0, 1)
    else:
        logits = (torch.randn(batch, g + 3, vocab + 1, generator=gen, device=device) * 3).to(dtype)[:, 2:g + 3, 1:]
    assert not logits.is_contiguous()
    drafts = near_top_drafts(logits, seeded_generator(device, seed + 1)).t().contiguous().t()  # column-major
    counts = torch.tensor([4, 0, 1, 2, 3, 0], device=device)[::2]
    return dict(target_logits=logits, draft_tokens=drafts, num_draft_tokens=counts)


def no_drafts(seed, *, device, dtype, vocab):
    logits = random_logits(3, 1, vocab, dtype, seeded_generator(device, seed), device)
    return dict(target_logits=logits, draft_tokens=torch.zeros(3, 0, dtype=torch.int64, device=device),
                num_draft_tokens=None)


def empty_batch(seed, *, device, dtype, vocab):
    return dict(target_logits=torch.randn(0, 4, vocab, device=device).to(dtype),
                draft_tokens=torch.zeros(0, 3, dtype=torch.int64, device=device), num_draft_tokens=None)


def clamped_counts(seed, *, device, dtype, vocab):
    """The argmax as every draft, counts 0, -3, 2, g, g + 9 (the backend clamps them)."""
    from ..common.sampling import safe_argmax

    g = 4
    logits = random_logits(5, g + 1, vocab, dtype, seeded_generator(device, seed), device)
    return dict(target_logits=logits, draft_tokens=safe_argmax(logits)[:, :g].contiguous(),
                num_draft_tokens=torch.tensor([0, -3, 2, g, g + 9], device=device))


def out_of_range(seed, *, device, dtype, vocab, finite=False):
    """NaN rows (argmax 0 everywhere; `finite`: 0 instead) with one bad id per row, at b % g."""
    g = 5
    logits = torch.full((6, g + 1, vocab), NAN, device=device).to(dtype)
    drafts = torch.zeros(6, g, dtype=torch.int64)
    for b, bad in enumerate((-1, vocab, vocab + 1, -vocab, 2**40, -(2**62))):
        drafts[b, b % g] = bad
    return dict(target_logits=logits.nan_to_num(0.0) if finite else logits, draft_tokens=drafts.to(device),
                num_draft_tokens=None)


def fuzz_inputs(seed, *, device, dtype, batch, g, vocab, special, k):
    """Small-integer logits (ties everywhere) with a `special` fraction of NaN / +inf / -inf."""
    gen = seeded_generator(device, seed * 31 + k)
    logits = torch.randint(-3, 4, (batch, g + 1, vocab), generator=gen, device=device).float() * 0.5
    specials = torch.tensor([NAN, INF, -INF], device=device)[torch.randint(0, 3, logits.shape, generator=gen,
                                                                           device=device)]
    keep = torch.rand(logits.shape, generator=gen, device=device) >= special
    logits = torch.where(keep, logits, specials).to(dtype)
    return dict(target_logits=logits, draft_tokens=near_top_drafts(logits, gen, wild=0.15),
                num_draft_tokens=ragged(batch, g, gen, device) if k % 2 else None)


def padding(seed, *, device, vocab):
    return dict(target_logits=torch.full((2, 4, vocab), -INF, device=device),
                draft_tokens=torch.tensor([[-1, 0, 0], [0, 0, -1]], device=device), num_draft_tokens=None)


def finite_padding(seed, *, device):
    return {**padding(seed, device=device, vocab=1), "target_logits": torch.zeros(2, 4, 1, device=device)}


def boundary_logits(seed, *, device, dtype, vocab):
    """Ranks 1 (id 50) and 2 (id 200) at gap 0.5 from the top (id 100), tie broken by id; rank 3
    (id 7) at gap 0.75."""
    g = 3
    logits = torch.full((4, g + 1, vocab), -4.0)
    logits[:, :, 100] = 1.0
    logits[:, :, [50, 200]] = 0.5
    logits[:, :, 7] = 0.25
    drafts = torch.tensor([[100, 50, 200], [50, 200, 7], [200, 50, 100], [7, 100, 100]])
    return dict(target_logits=logits.to(device).to(dtype), draft_tokens=drafts.to(device), num_draft_tokens=None)


def float32_tau(seed, *, device, vocab):
    logits = torch.full((1, 2, vocab), -4.0, device=device)
    logits[0, :, 10] = 1.0
    logits[0, :, 20] = 0.3  # 1.0f - 0.3f == float32(0.7) < 0.7 in float64
    return dict(target_logits=logits, draft_tokens=torch.tensor([[20]], device=device), num_draft_tokens=None)


def shaped(seed, *, device, dtype, shape, view=None):
    x = (torch.randn(*shape, generator=seeded_generator(device, seed), device=device) * 3.0).to(dtype)
    return dict(logits=x if view is None else view(x))


SPECIAL_PROBS_ROWS = ("all NaN", "all -inf", "one +inf", "one finite", "NaN every other", "one dominant")


def special_probs(seed, *, device, vocab):
    x = torch.randn(6, vocab, generator=seeded_generator(device, seed), device=device) * 3
    row = SPECIAL_PROBS_ROWS.index
    x[row("all NaN")] = NAN
    x[row("all -inf")] = -INF
    x[row("one +inf"), 3] = INF
    x[row("one finite"), :] = -INF
    x[row("one finite"), vocab - 1] = 2.0
    x[row("NaN every other"), ::2] = NAN
    x[row("one dominant"), 100 % vocab] = 40.0
    return dict(logits=x)


def lse_rounds_to_max(seed, *, device):
    return dict(logits=torch.tensor([[1e30, 1e30, 0.0]], device=device))


def with_thresholds(build, thresholds):
    """`build`'s inputs and fallback_check's thresholds."""
    return functools.partial(_with_thresholds, build, thresholds)


def _with_thresholds(build, thresholds, seed, **settings):
    return {**build(seed, **settings), "thresholds": thresholds}

# ---------------------------------------------------------------------------------------------
# Runs and sweeps

run_greedy, run_bild = op_run("greedy_verify"), op_run("bild_verify")


def run_max_prob(x, be):
    return (_ops().max_prob(**x, backend=be),)


def _relaxed_call(x, be, s):
    """s: (top_beta, tau) or (top_beta, tau, ragged): the counts only where ragged."""
    counts = x.get("num_draft_tokens") if len(s) == 2 else (x["num_draft_tokens"] if s[2] else None)
    return _ops().relaxed_verify(x["target_logits"], x["draft_tokens"], top_beta=s[0], tau=s[1],
                                 num_draft_tokens=counts, backend=be)


def relaxed_sweep(settings):
    return sweep(_relaxed_call, settings)


def _bild_call(x, be, t):
    return _ops().bild_verify(x["target_logits"], x["draft_tokens"], rollback_threshold=t,
                              num_draft_tokens=x.get("num_draft_tokens"), backend=be)


def _bild_thresholds(x, candidates, fixed):
    return list(fixed) + [bild_threshold(x["target_logits"], x["draft_tokens"], t) for t in candidates]


def bild_sweep(candidates, fixed=()):
    """BiLD over thresholds: `fixed` ones, and each candidate moved clear of every draft NLL's
    logsumexp rounding band (the backends sum in another order)."""
    return sweep(_bild_call, functools.partial(_bild_thresholds, candidates=candidates, fixed=fixed))


def _greedy_counts_call(x, be, counts):
    return _ops().greedy_verify(x["target_logits"], x["draft_tokens"], num_draft_tokens=counts, backend=be)


def _greedy_count_sets(x):
    return [None, *x["count_sets"]]


def _relaxed_impl_call(x, be, s):
    from ..common import registry

    return registry.implementation("relaxed_verify", be)(**x, top_beta=s[0], tau=s[1])


def _bild_impl_call(x, be, t):
    from ..common import registry

    return registry.implementation("bild_verify", be)(**x, rollback_threshold=t)


def clamped_reference(x):
    return _ops().greedy_verify(x["target_logits"], x["draft_tokens"],
                                num_draft_tokens=x["num_draft_tokens"].clamp(0, 4), backend="torch")


def fallback_run(x, be):
    ops = _ops()
    return (ops.max_prob(x["logits"], backend=be),
            *(ops.fallback_check(x["logits"], t, backend=be) for t in x["thresholds"]))


# ---------------------------------------------------------------------------------------------
# Judging: known answers of the crafted rows

def lossless_corner(settings):
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


def _special_max_prob(got, x):
    row = special_logit_index
    return (got[0][row("all NaN"), 0].item() == 0.0 and got[0][row("all -inf"), 0].item() == 0.0
            and got[0][row("the first +inf"), 0].item() == 1.0)


def _crafted_greedy_answers(got, x):
    nan, inf = CRAFTED_GREEDY.index("NaN rows"), CRAFTED_GREEDY.index("+inf ties")
    return (got[1][:len(CRAFTED_GREEDY)].tolist() == [4, 3, 1] and got[0][nan, :4].tolist() == [0, 0, 0, 1]
            and got[0][inf, 3].item() == 10)


_NAN_NEVER_PASSES = expect("an all-NaN row never passes (NaN NLL) at threshold 0",
                           lambda got, x: got[1][CRAFTED_LOGIT.index("NaN rows")].item() == 0)


def all_nan_never_passes(got, x, *, counts):
    """Without counts only (the rows with counts do not check it)."""
    return None if counts is not None else _NAN_NEVER_PASSES(got, x)


def _crafted_max_prob(got, x):
    nan, inf = CRAFTED_LOGIT.index("NaN rows"), CRAFTED_LOGIT.index("+inf ties")
    return (got[0][nan, :2].tolist() == [0.0, 0.0] and got[0][nan, 3].item() == 1.0
            and bool((got[0][inf] == 1.0).all()))


def lowest_wins(got, x):
    g = x["draft_tokens"].shape[1]
    for k in range(0, got[0].shape[0], 2):
        first = int(x["draft_tokens"][k, 0])
        if got[0][k].tolist() != [first] * (g + 1) or got[1][k].item() != g or got[1][k + 1].item() != 1 \
                or got[0][k + 1, :2].tolist() != [first, first]:
            return f"tie set {k // 2}: the lowest tied id must win"
    return None


def at_boundaries(got, x):
    rows = x["draft_tokens"].shape[0]
    for k, setting in enumerate(BOUNDARY_GRID):
        if setting in BOUNDARY_KNOWN and got[1][rows * k:rows * (k + 1)].tolist() != BOUNDARY_KNOWN[setting]:
            return (f"top_beta={setting[0]} tau={setting[1]}: num_accepted "
                    f"{got[1][rows * k:rows * (k + 1)].tolist()}, want {BOUNDARY_KNOWN[setting]}")
    return None


def _special_probs_answers(got, x):
    rows = [SPECIAL_PROBS_ROWS.index(name) for name in ("all NaN", "all -inf", "one +inf", "one finite")]
    return got[0][rows].tolist() == [0.0, 0.0, 1.0, 1.0]


BONUS_ONLY = expect("only the bonus token", lambda got, x: bool((got[1] == 0).all()))
STOPS = expect("acceptance stops at the bad id",
               lambda got, x: got[1].tolist() == [b % 5 for b in range(6)] * (got[1].shape[0] // 6))
PADDED = expect("[[0,-1,-1,-1],[0,0,0,-1]], [0, 2]",
                lambda got, x: got[0].tolist() == [[0, -1, -1, -1], [0, 0, 0, -1]] and got[1].tolist() == [0, 2])


# ---------------------------------------------------------------------------------------------
# The tables: (op, run, Row) entries

EXACT = exact(CHAIN_OUTPUTS)
MAX_PROB_SHAPES = (("[V]", F32, None), ("[B,V]", BF16, None), ("[B,P,V]", torch.float16, None),  # (label, dtype, view)
                   ("[2,3,3,V] leading dims that do not collapse", F32, lambda x: x[:, :, 1:]), ("tiny V", F32, None),
                   ("V=1", F32, None), ("[B,V] row stride 4V", F32, lambda x: x[:, 2]),
                   ("R >= 4 x SMs: one block per row", BF16, None))
OUT_OF_RANGE = "out-of-range ids -1, V, V+1, -V, 2^40, -2^62 (the backend itself) V={}"


def entry(op, run, name, dtype, build, settings, compare=EXACT, checks=(STRUCTURE,), reference=None, graph=False):
    """An (op, run, Row) entry judged by `compare` and then `checks` (the chain structure by default)."""
    return op, run, Row(name, dtype, build, settings, with_checks(compare, *checks) if checks else compare, graph,
                        reference)


def max_prob_entry(name, dtype, build, settings, checks=()):
    return entry("max_prob", run_max_prob, name, dtype, build, settings, MAX_PROB_CLOSE, checks)


def verify_rows(name, dtype, build, settings, relaxed, bild, checks=(STRUCTURE,), relaxed_checks=(STRUCTURE,),
                max_prob_name=None):
    """greedy_verify, relaxed_verify (run `relaxed`), bild_verify (run `bild`) on one input set; max_prob on its
    logits when named."""
    rows = [entry("greedy_verify", run_greedy, name, dtype, build, settings, checks=checks),
            entry("relaxed_verify", relaxed, name, dtype, build, settings, checks=relaxed_checks),
            entry("bild_verify", bild, name, dtype, build, settings)]
    return rows + ([max_prob_entry(max_prob_name, dtype, logits_only(build), settings)] if max_prob_name else [])


def _random_rows(profile):
    """Each random shape and dtype, relaxed_verify's (top_beta, tau) and BiLD's start rotated over them."""
    entries = []
    for s in random_shapes(profile):
        beta, tau = RANDOM_BETA_TAU[s.turn % 4]
        entries += [entry("greedy_verify", run_greedy, s.name + s.suffix, s.dtype, logits_inputs, s.settings, EXACT,
                          (), graph=s.graph),
                    entry("relaxed_verify", op_run("relaxed_verify", top_beta=beta, tau=tau),
                          f"{s.name} top_beta={beta} tau={tau}{s.suffix}", s.dtype, logits_inputs, s.settings, EXACT,
                          (), graph=s.graph),
                    entry("bild_verify", run_bild, s.name + s.suffix, s.dtype, bild_inputs,
                          dict(s.settings, index=s.index), compare_bild, (), graph=s.graph),
                    entry("max_prob", run_max_prob, f"[{s.batch},{s.g + 1},{s.vocab}]", s.dtype, random_max_prob_inputs,
                          dict(batch=s.batch, g=s.g, vocab=s.vocab, dtype=s.dtype), MAX_PROB_CLOSE, (),
                          graph=s.graph)]
    return entries


def _crafted_rows(profile, dtype):
    """Special rows (NaN / inf / ties) at every position, rows of known answers, ties across tiles."""
    rows = []
    for vocab in TIERS["special"][profile]:
        name, x = f"special rows V={vocab}", dict(dtype=dtype, vocab=vocab)
        rows += [entry("greedy_verify", run_greedy, name + " accept-all", dtype, special_accept_all, x, checks=(
                     STRUCTURE, expect("every draft accepted", lambda got, x: bool((got[1] == 4).all())))),
                 entry("greedy_verify", run_greedy, name + " ragged", dtype, special_inputs, x),
                 entry("relaxed_verify", relaxed_sweep([(b, t, i % 2 == 1) for i, (b, t) in enumerate(BETA_TAU)]),
                       name + " beta/tau sweep", dtype, special_inputs, x),  # ragged on every other setting
                 entry("bild_verify", bild_sweep((1.0, 6.0), fixed=(0.0, INF)), name + " thresholds 0, inf, 1, 6",
                       dtype, special_inputs, x),
                 max_prob_entry(name, dtype, logits_only(special_inputs), x, (
                     expect("0 for the all-NaN / all -inf rows, 1 for two +inf logits", _special_max_prob),))]
    vocab = TIERS["crafted greedy"][profile]
    rows.append(entry("greedy_verify", sweep(_greedy_counts_call, _greedy_count_sets),
                      f"NaN/inf rows V={vocab} counts none/0/ragged", dtype, crafted_greedy,
                      dict(dtype=dtype, vocab=vocab), checks=(STRUCTURE, expect(
                          "num_accepted [4, 3, 1] and row 0 [0, 0, 0, 1, ...]", _crafted_greedy_answers))))
    vocab = TIERS["crafted"][profile]
    for counts in (None, [4, 2, 0, 3], [1, 4, 4, 0]):
        x = dict(dtype=dtype, vocab=vocab, counts=counts)
        rows += [entry("relaxed_verify", relaxed_sweep(BETA_TAU), f"NaN/inf/padding rows counts={counts}", dtype,
                       crafted_logit, x, checks=(STRUCTURE, lossless_corner(BETA_TAU))),
                 entry("bild_verify", bild_sweep((1.0, 6.0), fixed=(0.0,)),
                       f"NaN/inf/padding rows counts={counts} thresholds 0, 1, 6", dtype, crafted_logit, x,
                       checks=(STRUCTURE, functools.partial(all_nan_never_passes, counts=counts)))]
    rows.append(max_prob_entry("NaN/inf/padding rows", dtype, logits_only(crafted_logit),
                               dict(dtype=dtype, vocab=vocab),
                               (expect("[0, 0, ., 1] in row 0 and 1 in row 1", _crafted_max_prob),)))
    for vocab in TIERS["ties"][profile]:
        name, x = f"ties across tiles V={vocab}", dict(dtype=dtype, vocab=vocab)
        rows.append(entry("greedy_verify", run_greedy, name, dtype, tie_inputs, x, checks=(STRUCTURE, lowest_wins)))
        if vocab != 4099:  # greedy only at the interpreter's 4-tile vocabulary
            rows += [entry("relaxed_verify", relaxed_sweep(TIE_SETTINGS), name, dtype, tie_inputs, x,
                           checks=(STRUCTURE, lossless_corner(TIE_SETTINGS))),
                     entry("bild_verify", bild_sweep((0.3, 1.5, 4.0, 9.0)), name, dtype, tie_inputs, x),
                     max_prob_entry(name, dtype, logits_only(tie_inputs), x)]
    return rows


def _layout_rows(profile, dtype):
    """Strided logits, no drafts, an empty batch, clamped counts, out-of-range ids, small-integer fuzz."""
    rows, vocab = [], TIERS["strided"][profile]
    for layout in ("sliced", "position-major", "unaligned"):
        name, x = f"{layout} logits, column-major drafts, strided counts V={vocab}", dict(dtype=dtype, vocab=vocab,
                                                                                           layout=layout)
        rows += verify_rows(name, dtype, strided_inputs, x, relaxed_sweep(((3, 0.0), (2, 0.7), (50, 3.0))),
                            bild_sweep((1.0, 5.0)), max_prob_name=f"{layout} [3,5,{vocab}]")
    vocab = TIERS["small"][profile]
    x, bonus_only = dict(dtype=dtype, vocab=vocab), (STRUCTURE, BONUS_ONLY)
    rows += verify_rows(f"g=0 V={vocab}", dtype, no_drafts, x, relaxed_sweep(((2, 0.7),)), bild_sweep((), fixed=(1.0,)),
                        checks=bonus_only, relaxed_checks=bonus_only)
    rows += verify_rows("B=0", dtype, empty_batch, x, relaxed_sweep(((2, 1.0),)), bild_sweep((), fixed=(1.0,)),
                        max_prob_name="[0,4,V]")
    rows += [entry("greedy_verify", impl("greedy_verify"),
                   f"counts 0, -3, 2, g, g+9 (clamped; the backend itself) V={vocab}", dtype, clamped_counts, x,
                   checks=(STRUCTURE, expect("num_accepted [0, 0, 2, 4, 4]",
                                             lambda got, x: got[1].tolist() == [0, 0, 2, 4, 4])),
                   reference=clamped_reference),
             entry("greedy_verify", impl("greedy_verify"), OUT_OF_RANGE.format(vocab), dtype, out_of_range, x,
                   checks=(STRUCTURE, STOPS)),
             entry("relaxed_verify", sweep(_relaxed_impl_call, ((vocab, 1.0), (1, 0.0))), OUT_OF_RANGE.format(vocab),
                   dtype, out_of_range, dict(x, finite=True), checks=(STRUCTURE, STOPS)),
             entry("bild_verify", sweep(_bild_impl_call, (INF, 20.0)), OUT_OF_RANGE.format(vocab), dtype,
                   out_of_range, dict(x, finite=True))]
    for k, (batch, g, vocab, special) in enumerate(TIERS["fuzz"][profile]):  # each fuzz shape in one dtype
        if DTYPES[k % len(DTYPES)] == dtype:
            name = f"fuzz B={batch} g={g} V={vocab} specials={special}"
            x = dict(dtype=dtype, batch=batch, g=g, vocab=vocab, special=special, k=k)
            rows += verify_rows(name, dtype, fuzz_inputs, x, relaxed_sweep(FUZZ_SETTINGS), bild_sweep((0.5, 3.0)),
                                relaxed_checks=(STRUCTURE, lossless_corner(FUZZ_SETTINGS)), max_prob_name=name)
    return rows


def _edge_rows(profile):
    rows = []
    for dtype in DTYPES:
        rows += _crafted_rows(profile, dtype) + _layout_rows(profile, dtype)
    for vocab in (7, 1):
        name = f"-1 padding never matches, all -inf V={vocab}"
        rows += [entry("greedy_verify", run_greedy, name, F32, padding, dict(vocab=vocab), checks=(STRUCTURE, PADDED)),
                 entry("relaxed_verify", relaxed_sweep(BETA_TAU + ((3, 1.0),)), name, F32, padding, dict(vocab=vocab),
                       checks=(STRUCTURE, lossless_corner(BETA_TAU)))]
    rows.append(entry("bild_verify", bild_sweep((), fixed=(0.0, 1.0)), "V=1 finite, -1 padding", F32, finite_padding,
                      {}, checks=(STRUCTURE, expect("num_accepted [0, 2] at threshold 0",
                                                    lambda got, x: got[1][:2].tolist() == [0, 2]))))
    rows += [entry("relaxed_verify", relaxed_sweep(BOUNDARY_GRID), "ranks at top_beta - 1 / top_beta, gaps at tau",
                   dtype, boundary_logits, dict(dtype=dtype, vocab=TIERS["boundaries"][profile]),
                   checks=(STRUCTURE, at_boundaries, lossless_corner(BOUNDARY_GRID))) for dtype in DTYPES]
    rows.append(entry("relaxed_verify", relaxed_sweep(((5, 0.7),)), "tau compared in float32 (gap == float32(0.7))",
                      F32, float32_tau, dict(vocab=TIERS["float32 tau"][profile]),
                      checks=(STRUCTURE, expect("a rejection", lambda got, x: got[1].item() == 0))))
    rows += [max_prob_entry(f"{label} {list(shape)}", dtype, shaped, dict(dtype=dtype, shape=shape, view=view))
             for (label, dtype, view), shape in zip(MAX_PROB_SHAPES, TIERS["max_prob shapes"][profile])]
    x = dict(vocab=TIERS["special probs"][profile])
    rows += [max_prob_entry("NaN / -inf / +inf / one-finite rows", F32, special_probs, x,
                            (expect("[0, 0, 1, 1] in the first rows", _special_probs_answers),)),
             max_prob_entry("lse rounds to the max: 1", F32, lse_rounds_to_max, {}),
             entry("max_prob", fallback_run, "fallback_check thresholds 0, 0.3, 0.5, 0.9, 1 on special rows", F32,
                   with_thresholds(special_probs, (0.0, 0.3, 0.5, 0.9, 1.0)), x, compare_fallback, ())]
    rows += [entry("max_prob", fallback_run, "fallback_check thresholds 0.01, 0.05, 0.5", BF16,
                   with_thresholds(shaped, (0.01, 0.05, 0.5)), dict(dtype=BF16, shape=shape), compare_fallback, ())
             for shape in TIERS["fallback"][profile]]
    return rows


def logit_verify_cases(profile, device):
    """greedy_verify, relaxed_verify, bild_verify, max_prob (and fallback_check): the random shapes, then the edges."""
    return chain_catalog(_random_rows(profile), _edge_rows(profile), profile, device)
