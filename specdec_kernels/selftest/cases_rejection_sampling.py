"""The rejection_sampling family: rejection_sample and rejection_sample_logits. Random shapes in
every dtype, then edges: every randomness mode, crafted rows, strided inputs, out-of-range ids
(through the backend itself), g = 0, empty batches. Block verification takes the same inputs under
the same contract: cases_block_verification.py runs probs_edges / logits_edges for its ops too."""

import functools
import operator

import torch

from .chain_inputs import (ADVERSARIAL_LOGITS_ROWS, CHAIN_OUTPUTS, EDGE_PROBS_ROWS, adversarial_logits,
                           adversarial_probs, alternate_ragged, chain_catalog, chunked, edge_probs, fuzz_probs,
                           hostile_block_probs, keep_settings, op_run, probs_inputs, random_shapes,
                           sampling_logits_inputs, sampling_modes, seeded_probs_inputs, sweep)
from .compare import chain_structure, compare_logits_sampling, exact, with_checks
from .inputs import ragged, random_probs, seeded_generator
from .model import DTYPES, Row

F32 = torch.float32
EXACT = exact(CHAIN_OUTPUTS)
PROBS_STRUCTURE = chain_structure("target_probs")
LOGITS_STRUCTURE = chain_structure()
PROBS_FUZZ = ((1, 0, 1, 0.3), (4, 4, 70, 0.2), (2, 3, 1, 0.0), (3, 2, 17, 0.3), (4, 1, 5, 0.05), (2, 4, 33, 0.1))
GPU_PROBS_FUZZ = tuple((batch, g, vocab * 1000 + 1 if vocab > 8 else vocab, special)
                       for batch, g, vocab, special in PROBS_FUZZ)

TIERS = {  # the sizes of the edge cases: the Triton interpreter at "tiny", production vocabularies on a GPU
    "probs modes": dict(tiny=((4, 3, 300), (4, 1, 7), (1, 3, 1)), quick=((3, 4, 32000), (64, 8, 2049)),
                        full=((1, 4, 32000), (3, 8, 128256), (64, 1, 151936), (300, 2, 2047), (5, 1, 2048),
                              (1, 3, 8200), (300, 2, 50000), (5, 3, 1), (64, 4, 7))),
    "edge rows": dict(tiny="edge rows (p == q, q = 0, one-hot, no mass, NaN, inf, -1, last id, NaN q) V=300",
                      quick="edge rows V=300", full="edge rows V=300"),
    "adversarial": dict(tiny=(300,), quick=(32000,), full=(32000, 151936)),  # at "tiny": float32 only
    "strided": dict(tiny=300, quick=128256, full=128256),
    "small": dict(tiny=50, quick=32000, full=32000),
    "empty residual": dict(tiny=300, quick=128256, full=128256),
    "expanded": dict(tiny=(), quick=(128256,), full=(128256,)),
    "probs fuzz": dict(tiny=PROBS_FUZZ, quick=GPU_PROBS_FUZZ, full=GPU_PROBS_FUZZ),  # (B, g, V, specials)
    # at "tiny": one shape per dtype (float32, float16, bfloat16)
    "logits modes": dict(tiny=((4, 3, 64), (3, 2, 300), (2, 2, 1)), quick=((3, 4, 32000),),
                         full=((1, 4, 32000), (3, 8, 151936), (64, 4, 32000), (64, 1, 151936))),
    "logits adversarial": dict(tiny=64, quick=32000, full=32000),
    "identical": dict(tiny=40, quick=32000, full=32000),
    "logits strided": dict(tiny=100, quick=128256, full=128256),
}


# ---------------------------------------------------------------------------------------------
# The sampling ops' sweeps: (randomness mode, counts[, temperature]) settings, judged setting by setting

def probs_sweep(op, direct=False):
    """op(target, draft, drafts, **mode, num_draft_tokens=counts) over x["settings"]: (mode, counts) pairs."""
    from .. import ops
    from ..common import registry

    def call(x, be, setting):
        kwargs, counts = setting
        fn = registry.implementation(op, be) if direct else functools.partial(getattr(ops, op), backend=be)
        return fn(x["target_probs"], x["draft_probs"], x["draft_tokens"], num_draft_tokens=counts, **kwargs)
    return sweep(call, operator.itemgetter("settings"))


def with_settings(x, modes, counts_sets=(None,)):
    """x with a sweep over every (mode, counts) pair (settings) and their labels."""
    settings, labels = [], []
    for label, kwargs in modes:
        for counts in counts_sets:
            settings.append((kwargs, counts))
            labels.append((f"{label} counts={None if counts is None else counts.tolist()}", None))
    return {**x, "settings": settings, "labels": labels}


def effective_uniforms(inputs, accepted):
    """[B, g+1] float64: the coins and the final draw a call used (seeded mode: the counter-based
    draws, the final one at the reference's number of accepted drafts)."""
    from ..common.draws import ChainCoins

    drafts = inputs["draft_tokens"]
    batch, g = drafts.shape
    if inputs.get("uniforms") is not None:
        return inputs["uniforms"].double()
    coins = ChainCoins(None, inputs["seed"], inputs.get("offsets"), batch, g, drafts.device)
    return torch.cat([coins.accept.reshape(batch, g), coins.final(accepted).reshape(batch, 1)], 1)


def sampling_sweep_compare(base):
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
            x["uniforms"] = effective_uniforms(x, w_part[1])
            error, problem = base(g_part, w_part, x)
            if problem:
                return error, f"{label[0]}: {problem}"
            worst = max(worst, error or 0.0)
        return worst, None
    return compare


def logits_sweep(op):
    from .. import ops

    def call(x, be, setting):
        kwargs, counts, temperature = setting
        return getattr(ops, op)(x["target_logits"], x["draft_logits"], x["draft_tokens"], temperature=temperature,
                                num_draft_tokens=counts, backend=be, **kwargs)
    return sweep(call, operator.itemgetter("settings"))


def logits_settings(x, modes, counts_sets, temperatures):
    """x with a sweep over every (mode, counts) pair, the temperatures rotated over them."""
    settings, labels = [], []
    for i, (label, kwargs) in enumerate(modes):
        for j, counts in enumerate(counts_sets):
            t = temperatures[(i + j) % len(temperatures)]
            settings.append((kwargs, counts, t))
            labels.append((f"{label} counts={'-' if counts is None else counts.tolist()} "
                           f"T={'rows' if isinstance(t, torch.Tensor) else t}", None))
    return {**x, "settings": settings, "labels": labels}


def _probs(target, draft, drafts):
    return dict(target_probs=target, draft_probs=draft, draft_tokens=drafts)


# ---------------------------------------------------------------------------------------------
# The probabilities' edge inputs: inputs(seed, *, device, <the row's settings>), each a sweep over
# (randomness mode, counts) settings

def probs_modes(seed, *, device, dtype, profile, batch, g, vocab):
    """Every randomness mode, without and with ragged counts (0, g, 1, g - 1)."""
    gen = seeded_generator(device, seed + vocab)
    target, draft, drafts = random_probs(batch, g, vocab, dtype, gen, device)
    counts = torch.tensor([0, g, 1, g - 1], device=device).repeat(batch)[:batch].clamp(0, g)
    x = with_settings(_probs(target, draft, drafts), sampling_modes(batch, g, gen, device), (None, counts))
    return alternate_ragged(x) if profile == "tiny" else x


def probs_edge_rows(seed, *, device, dtype, profile):
    """The crafted rows (chain_inputs.edge_probs) under every mode, the extreme uniforms, zero / ragged counts."""
    target, draft, drafts = edge_probs(dtype, device)
    batch, g = drafts.shape
    counts = (None, torch.zeros(batch, dtype=torch.int64, device=device),
              torch.tensor([3, 2, 1, 0, 3, 2, 1, 0, 3], device=device))
    x = with_settings(_probs(target, draft, drafts),
                      sampling_modes(batch, g, seeded_generator(device, seed + 12), device, extremes=True), counts)
    if profile == "tiny":  # every mode without counts, the first four with the zero / ragged counts
        return keep_settings(x, [k for k in range(len(x["settings"])) if k % 3 == 0 or k < 12])
    return x


def probs_adversarial(seed, *, device, dtype, profile, vocab):
    target, draft, drafts = adversarial_probs(vocab, dtype, device, vocab + 1)
    batch, g = drafts.shape
    ragged_rows = torch.arange(batch, device=device) % (g + 1)
    x = with_settings(_probs(target, draft, drafts), sampling_modes(batch, g, seeded_generator(device, seed), device),
                      (None, ragged_rows))
    return alternate_ragged(x) if profile == "tiny" else x


def probs_strided(seed, *, device, dtype, vocab, layout):
    """Target rows of batch stride (g+3) V (`unaligned`: offset by one element), position-major q,
    column-major ids, strided counts / uniforms / seeds / offsets (`int32`: int32 ids, counts, seeds, offsets)."""
    batch, g = 3, 3
    gen = seeded_generator(device, seed + 2)
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
    offsets = torch.tensor([5, 0, 9, 0, 2**20 if layout == "int32" else 2**33, 0], device=device, dtype=index)[::2]
    modes = [("strided uniforms", dict(uniforms=u)), ("strided seeds+offsets", dict(seed=seeds, offsets=offsets)),
             ("int seed, strided offsets", dict(seed=99, offsets=offsets))]
    return with_settings(_probs(target, draft, drafts), modes, (None, counts))


def probs_no_drafts(seed, *, device, dtype, vocab):
    gen = seeded_generator(device, seed + 3)
    target, draft, drafts = random_probs(3, 0, vocab, dtype, gen, device)
    return with_settings(_probs(target, draft, drafts), sampling_modes(3, 0, gen, device))


def probs_one_hot(seed, *, device, dtype, vocab):
    gen = seeded_generator(device, seed + 6)
    target, _, drafts = random_probs(4, 3, vocab, dtype, gen, device)
    draft = torch.nn.functional.one_hot(drafts, vocab).to(dtype)  # deterministic (n-gram) drafts
    return with_settings(_probs(target, draft, drafts), sampling_modes(4, 3, gen, device)[1:3])


def probs_hostile(seed, *, device, dtype):
    p, q, drafts = hostile_block_probs(dtype, device)
    gen = seeded_generator(device, seed + 13)
    return with_settings(_probs(p, q, drafts), sampling_modes(5, 3, gen, device)[1:4],
                         (None, torch.tensor([3, 3, 2, 3, 1], device=device)))


def probs_empty(seed, *, device):
    return with_settings(_probs(torch.rand(0, 3, 10, device=device), torch.rand(0, 2, 10, device=device),
                                torch.zeros(0, 2, dtype=torch.int64, device=device)),
                         [("seed", dict(seed=1)), ("uniforms", dict(uniforms=torch.rand(0, 3, device=device)))])


def probs_int_seeds(seed, *, device):
    gen = seeded_generator(device, 5)
    target, draft, drafts = random_probs(3, 2, 20, F32, gen, device)
    offsets = torch.tensor([2**32 - 1, 0, -1], device=device)
    modes = [(f"seed={s}{' +offsets' if o is not None else ''}", dict(seed=s, offsets=o))
             for s in (0, 1, -1, 2**32, 2**63 - 1, -2**63) for o in (None, offsets)]
    return with_settings(_probs(target, draft, drafts), modes)


def probs_out_of_range(seed, *, device):
    gen = seeded_generator(device, 4)
    target, draft, _ = random_probs(4, 3, 40, F32, gen, device)
    target[..., 0] = 1.0  # an in-range id 0 would be accepted
    drafts = torch.tensor([[40, 0, 0], [0, 2**40, 0], [0, 0, -7], [-2**62, 0, 0]], device=device)
    return with_settings(_probs(target, draft, drafts),
                         [("uniforms", dict(uniforms=torch.rand(4, 4, generator=gen, device=device)))])


def probs_empty_residual(seed, *, device, vocab):
    gen = seeded_generator(device, seed + 9)
    p = torch.softmax(torch.randn(8, 2, vocab, generator=gen, device=device), -1)
    p[..., 0] = 0.0
    return with_settings(_probs(p, p[:, :1].clone(), torch.zeros(8, 1, dtype=torch.int64, device=device)),
                         [("uniforms", dict(uniforms=torch.rand(8, 2, generator=gen, device=device))),
                          ("seed", dict(seed=4))])


def probs_expanded(seed, *, device, vocab):
    gen = seeded_generator(device, seed + 7)
    target, draft, drafts = random_probs(1, 4, vocab, F32, gen, device)
    return with_settings(_probs(target.expand(3, -1, -1), draft.expand(3, -1, -1), drafts.expand(3, -1).contiguous()),
                         [("seed", dict(seed=3))])


def probs_fuzz(seed, *, device, dtype, batch, g, vocab, special, k):
    """NaN / inf / 0 / -1 entries and -1 drafts, one randomness mode (rotated), ragged or not."""
    gen = seeded_generator(device, seed * 31 + k)
    target, draft, drafts = fuzz_probs(batch, g, vocab, dtype, gen, device, special)
    modes = sampling_modes(batch, g, gen, device)
    return with_settings(_probs(target, draft, drafts), [modes[k % 4]], (None, ragged(batch, g, gen, device)))


def probs_edge_answers(out, accepted, x):
    g = x["draft_tokens"].shape[1]
    row = EDGE_PROBS_ROWS.index
    nan, no_mass, padding, hot, q_zero = (row(name) for name in ("NaN", "no mass", "-1 padding", "one-hot", "q = 0"))
    if accepted[nan] != 0 or out[nan, 0] != 0:
        return "an all-NaN row must reject at 0 and emit id 0"
    if accepted[no_mass] > 1 or (accepted[no_mass] == 1 and out[no_mass, 1] != 0):
        return "a row without mass emits id 0"
    if accepted[padding] > 1:
        return "-1 padding is never accepted"
    hot_id = [3, 4, x["target_probs"].shape[-1] - 1, 0][int(accepted[hot])]
    if int(out[hot, accepted[hot]]) != hot_id:
        return "a one-hot target row emits its hot id"
    counts = x["setting"][1]
    if int(accepted[q_zero]) != (g if counts is None else min(int(counts[q_zero]), g)):
        return "q == 0 < p accepts every draft"
    return None


def rejects_out_of_range(out, accepted, x):
    return None if accepted.tolist() == [0, 1, 2, 0] else "num_accepted must be [0, 1, 2, 0]"


def draws_from_p(out, accepted, x):
    return None if bool((accepted == 0).all() & (out[:, 0] > 0).all()) else "must draw from p"


# ---------------------------------------------------------------------------------------------
# The logits' edge inputs: sweeps over (randomness mode, counts, temperature) settings

def _logits(target, draft, drafts):
    return dict(target_logits=target, draft_logits=draft, draft_tokens=drafts)


def logits_modes(seed, *, device, dtype, profile, batch, g, vocab):
    """Every randomness mode, ragged or not, T 1 / 0.6 / 1.7 / per row, a tenth of the drafts -1."""
    gen = seeded_generator(device, seed + vocab)
    t = torch.randn(batch, g + 1, vocab, generator=gen, device=device) * 3
    q = t[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=device) * 0.7
    drafts = torch.multinomial(torch.softmax(q.to(dtype).float(), -1).reshape(-1, vocab), 1,
                               generator=gen).reshape(batch, g)
    drafts = torch.where(torch.rand(batch, g, generator=gen, device=device) < 0.1, -1, drafts)
    temps = (1.0, 0.6, 1.7, 0.3 + 2 * torch.rand(batch, generator=gen, device=device))
    counts = ragged(batch, g, gen, device)
    x = logits_settings(_logits(t.to(dtype), q.to(dtype), drafts), sampling_modes(batch, g, gen, device),
                        (None, counts), temps)
    return alternate_ragged(x) if profile == "tiny" else x


ADVERSARIAL_TEMPERATURES = (0.5, 1.0, 2.0, 0.7, 1.3, 1.0, 0.9, 1.1, 3.0, 0.25, 1.0, 0.8, 1.2)  # one per crafted row


def logits_adversarial(seed, *, device, dtype, vocab):
    target, draft, drafts = adversarial_logits(dtype, device, vocab)
    batch, g = drafts.shape
    gen = seeded_generator(device, seed + 22)
    modes = [m for m in sampling_modes(batch, g, gen, device, extremes=True)
             if m[0] in ("f64 uniforms", "u=1-2^-53", "u=0", "row seeds")]
    rows = torch.tensor(ADVERSARIAL_TEMPERATURES, device=device)
    return logits_settings(_logits(target, draft, drafts), modes, (None,), (1.0, rows))


def logits_identical(seed, *, device, dtype, vocab):
    """Identical logits, the first four ids -inf at position 0 and the drafts there."""
    gen = torch.Generator().manual_seed(31)
    batch, g = 6, 2
    target = torch.randn(batch, g + 1, vocab, generator=gen)
    target[:, 0, :4] = -float("inf")
    draft = target[:, :g].clone()
    drafts = torch.stack([torch.arange(batch) % 4, torch.zeros(batch, dtype=torch.int64)], 1)
    u = torch.rand(batch, g + 1, generator=gen, dtype=torch.float64)
    return logits_settings(_logits(target.to(dtype).to(device), draft.to(dtype).to(device), drafts.to(device)),
                           [("f64 uniforms", dict(uniforms=u.to(device)))], (None,), (0.7,))


def logits_strided(seed, *, device, dtype, vocab):
    batch, g = 3, 2
    gen = seeded_generator(device, seed + 41)
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
    return logits_settings(_logits(target, draft, drafts),
                           [("strided row seeds", dict(seed=seeds)), ("strided f32 uniforms", dict(uniforms=u))],
                           (counts, None), (temps, 0.8))


def logits_no_drafts(seed, *, device, vocab):
    gen = seeded_generator(device, seed + 3)
    t = torch.randn(3, 1, vocab, generator=gen, device=device).to(torch.float16)
    return logits_settings(_logits(t, t[:, :0], torch.zeros(3, 0, dtype=torch.int64, device=device)),
                           sampling_modes(3, 0, gen, device), (None,), (0.8, 1.3))


def logits_empty(seed, *, device):
    return logits_settings(_logits(torch.rand(0, 3, 10, device=device), torch.rand(0, 2, 10, device=device),
                                   torch.zeros(0, 2, dtype=torch.int64, device=device)),
                           [("seed", dict(seed=1))], (None,), (1.0,))


def logits_adversarial_answers(out, accepted, x):
    g = x["draft_tokens"].shape[1]
    row = ADVERSARIAL_LOGITS_ROWS.index
    nan, inf, no_mass, same, nan_q, no_q = (row(name) for name in ("NaN target", "+inf target", "all -inf target",
                                                                    "p == q, a -inf draft", "NaN q", "all -inf q"))
    nan_bonus, half = row("NaN bonus row"), row("-inf second half")
    checks = [(accepted[nan] == 0 and out[nan, 0] == 0, "a NaN target row rejects and emits id 0"),
              (accepted[inf] == 1 and out[inf, 1] == 0, "+inf at position 1: an all-NaN row emits id 0"),
              (accepted[no_mass] == 0 and out[no_mass, 0] == 0, "an all -inf target row emits id 0"),
              (accepted[same] == 1, "p == q accepts, p = q = 0 rejects"),
              (accepted[nan_q] == 0 and accepted[no_q] == 0, "NaN q rows reject"),
              (accepted[nan_bonus] == g and out[nan_bonus, g] == 0, "an all-NaN bonus row emits id 0"),
              (accepted[half] == 0 and 0 <= int(out[half, 0]) < x["target_logits"].shape[-1] // 2,
               "the residual only where p > 0")]
    for ok, message in checks:
        if not bool(ok):
            return message
    return None


def identical_answers(out, accepted, x):
    return None if accepted.tolist() == [0] * 6 and bool((out[:, 0] >= 4).all()) else \
        "must reject and draw from p (ids >= 4)"


def no_drafts_answers(out, accepted, x):
    return None if accepted.tolist() == [0, 0, 0] else "no drafts"


# ---------------------------------------------------------------------------------------------
# The tables: (op, run, Row) entries

STRIDED = "{} target rows, position-major q, strided ids / counts / randomness V={}"
HOSTILE = "hostile rows (p == q, no mass, NaN, inf q, one-hot q, -0.0 q, -1, id >= V; the backend itself)"


def probs_edges(op, profile, block=False):
    """The probabilities' edges as `op`'s rows: exact outputs and their structure, and the sampling op's known
    answers; `block`: none, and under the interpreter not the edges too slow for the block kernel."""
    entries = []

    def edge(name, dtype, build, settings, known=None, direct=False, block_on_cpu=True):
        if block and profile == "tiny" and not block_on_cpu:
            return
        checks = (PROBS_STRUCTURE, chunked(known)) if known and not block else (PROBS_STRUCTURE,)
        entries.append((op, probs_sweep(op, direct), Row(name, dtype, build, settings, with_checks(EXACT, *checks))))

    for dtype in DTYPES:
        for batch, g, vocab in TIERS["probs modes"][profile]:
            edge(f"every mode x ragged B={batch} g={g} V={vocab}", dtype, probs_modes,
                 dict(dtype=dtype, profile=profile, batch=batch, g=g, vocab=vocab))
        edge(TIERS["edge rows"][profile], dtype, probs_edge_rows, dict(dtype=dtype, profile=profile),
             known=probs_edge_answers, block_on_cpu=False)
        for vocab in TIERS["adversarial"][profile] if profile != "tiny" or dtype == F32 else ():
            edge(f"adversarial rows, ids -1 / >= V / < -1 (the backend itself) V={vocab}", dtype, probs_adversarial,
                 dict(dtype=dtype, profile=profile, vocab=vocab), direct=True, block_on_cpu=False)
        vocab = TIERS["strided"][profile]
        for layout in ("sliced", "unaligned", "int32"):
            edge(STRIDED.format(layout, vocab), dtype, probs_strided, dict(dtype=dtype, vocab=vocab, layout=layout))
        vocab = TIERS["small"][profile]
        edge(f"g=0 V={vocab}", dtype, probs_no_drafts, dict(dtype=dtype, vocab=vocab))
        edge(f"one-hot draft rows (n-gram drafts) V={vocab}", dtype, probs_one_hot, dict(dtype=dtype, vocab=vocab))
        edge(HOSTILE, dtype, probs_hostile, dict(dtype=dtype), direct=True)
    edge("B=0", F32, probs_empty, {})
    edge("int seeds Triton would specialise (1) or that need both key words", F32, probs_int_seeds, {},
         block_on_cpu=False)
    edge("ids >= V or < -1 read nothing and reject (the backend itself)", F32, probs_out_of_range, {},
         known=rejects_out_of_range, direct=True)
    edge("p == q, draft on a zero-probability id: an empty residual draws from p", F32, probs_empty_residual,
         dict(vocab=TIERS["empty residual"][profile]), known=draws_from_p, block_on_cpu=False)
    for vocab in TIERS["expanded"][profile]:
        edge("expanded (stride 0) batch", F32, probs_expanded, dict(vocab=vocab))
    for k, (batch, g, vocab, special) in enumerate(TIERS["probs fuzz"][profile]):  # each shape in one dtype
        dtype = DTYPES[k % len(DTYPES)]
        edge(f"fuzz B={batch} g={g} V={vocab} specials={special}", dtype, probs_fuzz,
             dict(dtype=dtype, batch=batch, g=g, vocab=vocab, special=special, k=k), block_on_cpu=k < 2)
    return entries


def logits_edges(op, profile, base_compare, block=False):
    """The logits' edges as `op`'s rows: each setting judged by base_compare on the uniforms it used, the
    structure, and the sampling op's known answers (`block`: none)."""
    entries = []

    def edge(name, dtype, build, settings, known=None):
        checks = (LOGITS_STRUCTURE, chunked(known)) if known and not block else (LOGITS_STRUCTURE,)
        compare = with_checks(sampling_sweep_compare(base_compare), *checks)
        entries.append((op, logits_sweep(op), Row(name, dtype, build, settings, compare)))

    for dtype in DTYPES:
        shapes = TIERS["logits modes"][profile]
        for batch, g, vocab in shapes[DTYPES.index(dtype):][:1] if profile == "tiny" else shapes:
            edge(f"every mode x ragged x T 1 / 0.6 / 1.7 / per row, -1 drafts B={batch} g={g} V={vocab}", dtype,
                 logits_modes, dict(dtype=dtype, profile=profile, batch=batch, g=g, vocab=vocab))
        edge("adversarial rows (NaN / inf / -inf / huge / p == q / NaN q / NaN bonus)", dtype, logits_adversarial,
             dict(dtype=dtype, vocab=TIERS["logits adversarial"][profile]), known=logits_adversarial_answers)
        edge("identical logits, drafts on -inf ids: an empty residual draws from p", dtype, logits_identical,
             dict(dtype=dtype, vocab=TIERS["identical"][profile]), known=identical_answers)
        edge("strided / unaligned logits, position-major q, column-major ids, strided T / counts / seeds", dtype,
             logits_strided, dict(dtype=dtype, vocab=TIERS["logits strided"][profile]))
    edge("g=0", torch.float16, logits_no_drafts, dict(vocab=TIERS["small"][profile]), known=no_drafts_answers)
    edge("B=0", F32, logits_empty, {})
    return entries


def block_logits_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged, index):
    """sampling_logits_inputs, per-row temperatures (all 0.8) on every other shape (block verification's)."""
    x = sampling_logits_inputs(seed, device=device, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged)
    if index % 2:
        x["temperature"] = torch.full((batch,), 0.8, device=device)
    return x


def random_rows(profile, op, logits_op, logits_compare, block=False):
    """Each random shape and dtype: `op` with uniforms and with a seed, `logits_op` at T = 0.8 (`block`: per-row
    temperatures on every other shape)."""
    entries = []
    for s in random_shapes(profile):
        logits = (block_logits_inputs, dict(s.settings, index=s.index)) if block else (sampling_logits_inputs,
                                                                                         s.settings)
        for row_op, run, label, build, settings, compare in (
                (op, op_run(op), "uniforms", probs_inputs, s.settings, EXACT),
                (op, op_run(op, seed=1234), "seed+offsets", seeded_probs_inputs, s.settings, EXACT),
                (logits_op, op_run(logits_op), "T=0.8 uniforms", *logits, logits_compare)):
            entries.append((row_op, run, Row(f"{s.name} {label}{s.suffix}", s.dtype, build, settings, compare,
                                             s.graph)))
    return entries


def rejection_sampling_cases(profile, device):
    """rejection_sample and rejection_sample_logits: the random shapes, then the edges."""
    edges = probs_edges("rejection_sample", profile) + logits_edges("rejection_sample_logits", profile,
                                                                    compare_logits_sampling)
    random = random_rows(profile, "rejection_sample", "rejection_sample_logits", compare_logits_sampling)
    return chain_catalog(random, edges, profile, device)
