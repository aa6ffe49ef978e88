"""What the chain families (cases_logit_verify.py, cases_rejection_sampling.py,
cases_block_verification.py) share: their (op, run, Row) entries made Cases, the random shapes
every chain op runs at, sweeps and the randomness modes of the sampling ops, and the crafted rows
(NaN / inf / ties / padding / out-of-range ids) their edge cases are built from."""

import functools
import zlib
from typing import NamedTuple

import torch

from .inputs import near_top_drafts, ragged, random_probs, seeded_generator
from .model import DTYPES, cases

INF, NAN = float("inf"), float("nan")
CHAIN_OUTPUTS = ("output_tokens", "num_accepted")


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


# ---------------------------------------------------------------------------------------------
# The random shapes: every chain op at each (B, g, V) in every dtype, ragged counts on every other
# (shape, dtype), the first shape in bfloat16 also captured in a CUDA graph.

CHAIN_SHAPES = {"tiny": [(3, 3, 50), (2, 1, 300)],
                "quick": [(1, 4, 1000), (3, 5, 32000), (64, 1, 4099)],
                "full": [(1, 4, 1000), (3, 5, 32000), (64, 1, 4099), (1, 8, 151936), (64, 4, 128256),
                         (256, 4, 151936), (256, 8, 32000)]}


class RandomShape(NamedTuple):
    """One (B, g, V) shape in one dtype; `turn` (shape + dtype index) rotates the per-case settings."""
    index: int
    batch: int
    g: int
    vocab: int
    dtype: torch.dtype
    turn: int

    @property
    def name(self):
        return f"B={self.batch} g={self.g} V={self.vocab}"

    @property
    def suffix(self):
        return " ragged" if self.turn % 2 else ""

    @property
    def graph(self):
        return self.index == 0 and self.dtype == torch.bfloat16

    @property
    def settings(self):
        return dict(batch=self.batch, g=self.g, vocab=self.vocab, dtype=self.dtype, use_ragged=self.turn % 2 == 1)


def random_shapes(profile):
    """Each shape (outer) in each dtype."""
    return [RandomShape(index, batch, g, vocab, dtype, index + k)
            for index, (batch, g, vocab) in enumerate(CHAIN_SHAPES[profile]) for k, dtype in enumerate(DTYPES)]


def chain_cases(entries, device):
    """The Cases of (op, run, Row) entries, in order (a chain family runs each row its own way: a sweep)."""
    return [case for op, run, row in entries for case in cases(op, run, [row], device)]


def chain_catalog(random, edges, profile, device):
    """A family's cases from (op, run, Row) entries: the random shapes, then the edges (one dtype each at "tiny")."""
    edges = chain_cases(edges, device)
    return chain_cases(random, device) + (one_dtype_each(edges) if profile == "tiny" else edges)


def probs_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged):
    """Close target / draft probabilities, caller uniforms (a tenth of them exactly 0)."""
    gen = seeded_generator(device, seed)
    target, draft, drafts = random_probs(batch, g, vocab, dtype, gen, device)
    u = torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64)
    u = torch.where(torch.rand(u.shape, generator=gen, device=device) < 0.1, torch.zeros_like(u), u)
    return dict(target_probs=target, draft_probs=draft, draft_tokens=drafts, uniforms=u,
                num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)


def seeded_probs_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged):
    """probs_inputs with an int seed's offsets (run with seed=1234) instead of uniforms."""
    x = probs_inputs(seed, device=device, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged)
    del x["uniforms"]
    x["offsets"] = torch.randint(0, 2**40, (batch,), generator=seeded_generator(device, seed + 1), device=device)
    return x


def sampling_logits_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged):
    """Target logits and close draft logits at T = 0.8, drafts sampled from the draft, caller uniforms."""
    gen = seeded_generator(device, seed)
    t = torch.randn(batch, g + 1, vocab, generator=gen, device=device) * 3
    q = t[:, :g] + torch.randn(batch, g, vocab, generator=gen, device=device) * 0.7
    temperature = 0.8
    drafts = torch.multinomial(torch.softmax(q.to(dtype).float() / temperature, -1).reshape(-1, vocab), 1,
                               generator=gen).reshape(batch, g)
    return dict(target_logits=t.to(dtype), draft_logits=q.to(dtype), draft_tokens=drafts, temperature=temperature,
                uniforms=torch.rand(batch, g + 1, generator=gen, device=device, dtype=torch.float64),
                num_draft_tokens=ragged(batch, g, gen, device) if use_ragged else None)


# ---------------------------------------------------------------------------------------------
# Sweeps: one case over several settings (a beta/tau grid, thresholds, randomness modes), the
# outputs concatenated along the batch dimension.

def sweep(call, settings):
    """run(x, be) concatenating call(x, be, s) over settings (or settings(x)) along the batch dimension."""
    def run(x, be):
        outs = [call(x, be, s) for s in (settings(x) if callable(settings) else settings)]
        return tuple(torch.cat(parts) for parts in zip(*outs))
    return run


def op_run(op, **fixed):
    """run(x, be): the public op on the inputs and the `fixed` keywords."""
    return functools.partial(_run_op, op, fixed)


def _run_op(op, fixed, x, be):
    from .. import ops

    return getattr(ops, op)(**x, **fixed, backend=be)


def impl(op):
    """Run `op` through the backend's own function (no value checks: ids >= V reach the kernel,
    as on a GPU, where the op cannot look at them); the torch backend is the reference."""
    from ..common import registry

    return lambda x, be: registry.implementation(op, be)(**x)


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


def keep_settings(x, keep):
    """x with only the settings (and their labels) at the indices `keep` of its sweep."""
    return {**x, "settings": [x["settings"][k] for k in keep], "labels": [x["labels"][k] for k in keep]}


def alternate_ragged(x):
    """Under the interpreter: of (mode, counts) pairs in order, counts None and ragged on alternate modes."""
    return keep_settings(x, [k for k in range(len(x["settings"])) if k % 2 == (k // 2) % 2])


def chunked(check):
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


# ---------------------------------------------------------------------------------------------
# Crafted rows of rejection sampling and block verification (the same inputs and contract)

EDGE_PROBS_ROWS = ("p == q", "q = 0", "one-hot", "no mass", "NaN", "+inf", "-1 padding", "last id", "NaN q")


def edge_probs(dtype, device, vocab=300):
    """One crafted row per edge case, g = 3 (rejection_sample's and block_verify's hostile rows)."""
    g = 3
    same, q_zero, hot, no_mass, nan, inf, padding, last, nan_q = range(len(EDGE_PROBS_ROWS))
    gen = torch.Generator().manual_seed(11)
    target, draft, drafts = random_probs(len(EDGE_PROBS_ROWS), g, vocab, torch.float32, gen, "cpu")
    target, draft = target.float(), draft.float()
    target[same, :g] = draft[same]  # p == q everywhere and a draft on a zero-mass id: empty residual, draw from p
    target[same, :, 5] = 0.0
    draft[same, :, 5] = 0.0
    drafts[same] = torch.tensor([drafts[same, 0], 5, 6])
    draft[q_zero, :, 9] = 0.0  # q == 0 < p at the drafts: accepted whatever the coin; bonus from p[g]
    target[q_zero, :, 9] = 0.25
    drafts[q_zero] = 9
    target[hot] = 0.0  # one-hot target rows: the residual is the hot id whenever the draft misses it
    target[hot, torch.arange(g + 1), torch.tensor([3, 4, vocab - 1, 0])] = 1.0
    drafts[hot] = torch.tensor([3, 7, vocab - 1])
    target[no_mass, 1] = 0.0  # all-zero target row at the first rejection: residual and p empty -> id 0
    target[nan, 0] = NAN  # all-NaN row (NaN rejects; NaN weighs 0) and a partly NaN bonus row
    target[nan, 3, ::2] = NAN
    target[inf, 0, drafts[inf, 0]] = INF  # +inf in p (weight 1) and in q (u * inf never < a finite p)
    target[inf, 1, 100:103] = INF
    draft[inf, 1, drafts[inf, 1]] = INF
    draft[inf, 2, 7] = INF
    target[inf, 3, vocab - 50] = INF
    drafts[padding, 1] = -1  # -1 padding in the middle of the drafts
    target[last, 0] = 0.0  # a residual with mass only at the last id
    target[last, 0, vocab - 1] = 0.5
    draft[last, 0] = 0.01
    drafts[last, 0] = 0
    draft[nan_q, 0, :vocab // 2] = NAN  # NaN in q (the residual's NaN weighs 0), negative and tiny values
    target[nan_q, 0, 10] = -0.5
    target[nan_q, 1, 20:30] = 1e-30 if dtype == torch.float32 else 1e-7
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


def fuzz_probs(batch, g, vocab, dtype, gen, device, special):
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


def hostile_block_probs(dtype, device, vocab=40):
    """NaN, inf, all-zero and p == q rows, a one-hot draft row, a -0.0 q (p / -0.0 = -inf: a
    kernel that loses the sign gets 1), -1 and out-of-range drafts (block verification's rows)."""
    gen = torch.Generator().manual_seed(3)
    batch, g = 5, 3
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * 2.5
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :g] + torch.randn(batch, g, vocab, generator=gen), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    same, no_mass, inf_q, signed_zero, bad_id = range(batch)
    p[same, 1] = q[same, 1]  # p == q at the first two positions
    q[same, 0] = p[same, 0]
    p[no_mass, 0] = 0.0  # no target mass, a partly NaN bonus row
    p[no_mass, 3, ::4] = NAN
    q[inf_q, 0, 5] = INF  # +inf in q, a one-hot draft row
    q[inf_q, 1] = torch.nn.functional.one_hot(drafts[inf_q, 1], vocab).float()
    drafts[signed_zero, 1] = -1  # -1 padding after a draft of q = -0.0
    q[signed_zero, 0, drafts[signed_zero, 0]] = -0.0
    drafts[bad_id, 0] = vocab + 3  # an id >= V, NaN rows in p and q
    p[bad_id, 2] = NAN
    q[bad_id, 2, :7] = NAN
    return p.to(dtype).to(device), q.to(dtype).to(device), drafts.to(device)


ADVERSARIAL_LOGITS_ROWS = ("NaN target", "+inf target", "all -inf target", "huge logits", "p == q, a -inf draft",
                           "NaN q", "+inf q", "all -inf q", "NaN bonus row", "-inf second half",
                           "uniform p, one-hot-ish q", "-inf chunks", "very peaked")


def adversarial_logits(dtype, device, vocab=64):
    """One crafted row per case, g = 3: NaN / +inf / all -inf target rows (all-NaN softmax), huge
    logits, identical logits with a draft on a -inf id, NaN / +inf / all -inf q, an all-NaN bonus
    row, a draft on a -inf target id, a uniform target against a one-hot-ish draft, -inf chunks,
    a very peaked target."""
    batch, g = len(ADVERSARIAL_LOGITS_ROWS), 3
    nan, inf, no_mass, huge, same, nan_q, inf_q, no_q, nan_bonus, half, uniform, chunks, peaked = range(batch)
    gen = torch.Generator().manual_seed(21)
    target = torch.randn(batch, g + 1, vocab, generator=gen) * 2.0
    draft = target[:, :g] + 0.7 * torch.randn(batch, g, vocab, generator=gen)
    drafts = torch.multinomial(torch.softmax(draft.double(), -1).reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    target[nan, 0, 7] = NAN
    target[inf, 1, 9] = INF
    target[inf, 0] = draft[inf, 0]
    target[no_mass, 0] = -INF
    target[huge] = torch.randn(g + 1, vocab, generator=gen) * 1e4  # huge logits (float16 holds +-6e4)
    draft[huge] = target[huge, :g] + torch.randn(g, vocab, generator=gen) * 1e3
    drafts[huge] = torch.argmax(draft[huge], -1)
    target[same, :g] = draft[same]
    target[same, 1, 5] = draft[same, 1, 5] = -INF
    drafts[same, 1] = 5
    draft[nan_q, 0, 3] = NAN
    target[inf_q, 0] = draft[inf_q, 0]
    draft[inf_q, 1, 11] = INF
    draft[no_q, 0] = -INF
    target[nan_bonus, :g] = draft[nan_bonus]
    target[nan_bonus, g, ::3] = NAN
    target[half, 0, vocab // 2:] = -INF
    drafts[half, 0] = vocab // 2 + 8
    target[uniform] = 0.0
    draft[uniform] = -1e4
    draft[uniform, torch.arange(g), drafts[uniform]] = 0.0
    target[chunks, :, :(2 * vocab) // 3] = -INF  # -inf chunks: mass only in the last third
    target[peaked] *= 50  # very peaked
    return target.to(dtype).to(device), draft.to(dtype).to(device), drafts.to(device)


# ---------------------------------------------------------------------------------------------
# Crafted logits of logit verification: corner-case rows, rows of known answers, tied maxima across tiles

def special_rows(vocab):
    """{name: [V] float32 row} hitting NaN / inf / tie corner cases (the argmax, rank and lse paths)."""
    v = vocab
    base = -5.0 - torch.arange(v, dtype=torch.float32) / v  # strictly decreasing, < 0
    idx = torch.arange(v)

    def row(fill=None):
        return base.clone() if fill is None else torch.full((v,), fill)

    rows = {}
    r = rows["max only at the last id"] = row(); r[v - 1] = 10.0
    r = rows["tie ending at the last id"] = row(); r[max(v - 2, 0)] = 10.0; r[v - 1] = 10.0
    r = rows["tie spanning every later chunk"] = row(); r[v // 2:] = 10.0
    r = rows["chunk edges"] = row(); r[(idx >= v // 3) & ((idx % 8 == 0) | (idx % 8 == 7))] = 10.0
    r = rows["4095 | 4096"] = row(); r[(idx % 4096 == 4095) | ((idx % 4096 == 0) & (idx > 0))] = 10.0
    rows["constant"] = row(1.5)  # -> 0
    rows["all NaN"] = row(NAN)  # -> 0
    rows["all -inf"] = row(-INF)  # -> 0
    r = rows["NaN / -inf mix"] = row(-INF); r[::2] = NAN  # -> 0
    r = rows["NaN never wins"] = row(); r[0] = NAN; r[v - 1] = NAN; r[v // 2] = 100.0
    r = rows["the first +inf"] = row(); r[v // 3] = INF; r[v - 1] = INF; r[0] = NAN
    r = rows["NaN ties -inf"] = row(NAN); r[v - 1] = -INF  # -> 0
    r = rows["-0 == +0"] = row(-1.0); r[min(1, v - 1)] = -0.0; r[min(2, v - 1)] = 0.0
    r = rows["+0 == -0"] = row(-1.0); r[min(1, v - 1)] = 0.0; r[min(2, v - 1)] = -0.0
    r = rows["-inf holes in a finite row"] = row(); r[::3] = -INF
    r = rows["one finite logit"] = row(-INF); r[v - 1] = 1.0  # NLL 0
    r = rows["large, float16-representable"] = row(); r[v - 1] = 60000.0; r[v // 2] = 60000.0
    return rows


def special_logit_index(name):
    """The batch row whose position 0 is the special row `name` (special_inputs)."""
    return list(special_rows(1)).index(name)


def special_inputs(seed, *, device, dtype, vocab, accept_all=False):
    """Row b: special row b at position 0, random special rows elsewhere (every position a corner
    case); drafts near the top (or the argmax: accept_all), ragged counts."""
    from ..common.sampling import safe_argmax

    g = 4
    rows = list(special_rows(vocab).values())
    gen = torch.Generator().manual_seed(vocab + seed)
    logits = torch.empty(len(rows), g + 1, vocab)
    for b in range(len(rows)):
        logits[b, 0] = rows[b]
        for p in range(1, g + 1):
            logits[b, p] = rows[int(torch.randint(0, len(rows), (1,), generator=gen))]
    logits = logits.to(dtype).to(device)
    top = safe_argmax(logits)[:, :g].contiguous()
    gen = seeded_generator(device, seed)
    drafts = top if accept_all else near_top_drafts(logits, gen, wild=0.2)
    return dict(target_logits=logits, draft_tokens=drafts, num_draft_tokens=ragged(logits.shape[0], g, gen, device))


def special_accept_all(seed, *, device, dtype, vocab):
    return {**special_inputs(seed, device=device, dtype=dtype, vocab=vocab, accept_all=True), "num_draft_tokens": None}


CRAFTED_GREEDY = ("NaN rows", "+inf ties", "one finite")  # the rows of crafted_greedy


def crafted_greedy(seed, *, device, dtype, vocab):
    """Rows of known argmax: all NaN, all -inf, NaN with -inf, NaN never wins, two +inf, one
    finite; counts None, then each of count_sets (a sweep)."""
    g = 4
    nan, inf, finite = (CRAFTED_GREEDY.index(name) for name in CRAFTED_GREEDY)
    logits = torch.randn(3, g + 1, vocab, generator=torch.Generator().manual_seed(1))
    hi, mid = vocab - 1, (9 * vocab) // 10
    logits[nan, 0] = NAN
    logits[nan, 1] = -INF
    logits[nan, 2, :] = NAN
    logits[nan, 2, hi] = -INF
    logits[nan, 3, ::2] = NAN
    logits[nan, 3, 1] = 100.0
    logits[inf, :, 10] = INF
    logits[inf, :, mid] = INF
    logits[inf, 2, 5] = NAN
    logits[finite, 0, :] = -INF
    logits[finite, 0, hi] = -60000.0 if dtype == torch.float16 else -1e30  # one finite logit
    drafts = torch.tensor([[0, 0, 0, 1], [10, 10, 10, mid], [hi, -1, 3, 4]])
    return dict(target_logits=logits.to(dtype).to(device), draft_tokens=drafts.to(device), num_draft_tokens=None,
                count_sets=[torch.tensor(c, device=device) for c in ([0, 0, 0], [2, 4, 1], [4, 3, 2])])


CRAFTED_LOGIT = ("NaN rows", "+inf ties", "NaN with one -inf", "-inf holes")  # the rows of crafted_logit


def crafted_logit(seed, *, device, dtype, vocab, counts=None):
    """NaN / inf / padding rows of the relaxed and BiLD rules (a draft on a -inf logit of a finite row)."""
    g = 4
    nan, inf, nan_inf, holes = (CRAFTED_LOGIT.index(name) for name in CRAFTED_LOGIT)
    logits = torch.randn(4, g + 1, vocab, generator=torch.Generator().manual_seed(3))
    hi, a, b = vocab - 1, vocab // 2, (2 * vocab) // 3
    logits[nan, 0] = NAN  # all NaN: argmax 0, the draft 0 logit counts as -inf
    logits[nan, 1] = -INF
    logits[nan, 2, ::2] = NAN
    logits[nan, 2, 7] = 4.0
    logits[nan, 3, :] = -INF
    logits[nan, 3, hi] = 1.0  # one finite logit: NLL exactly 0
    logits[inf, :, 10] = INF
    logits[inf, :, b] = INF
    logits[inf, 2, 5] = NAN
    logits[nan_inf, 1, :] = NAN
    logits[nan_inf, 1, a] = -INF
    logits[holes, :, ::3] = -INF
    drafts = torch.tensor([[0, 0, 7, hi], [10, b, 10, 11], [-1, 0, 3, 4], [3, 1, 0, -1]])
    return dict(target_logits=logits.to(dtype).to(device), draft_tokens=drafts.to(device),
                num_draft_tokens=None if counts is None else torch.tensor(counts, device=device))


def _cuda_split_chunk(rows, vocab, device):
    """The CUDA chain kernels' V-chunk for `rows` rows (chain_common.cuh: plan_splits); the
    Triton tile (1024) elsewhere."""
    if device.type != "cuda":
        return 1024
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    splits = max(1, min(-(-4 * sms // rows), vocab // 4096))
    return -(-(-(-vocab // splits)) // 8) * 8


def tie_sets(vocab, device):
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


def tie_inputs(seed, *, device, dtype, vocab):
    """Two rows per tie set: the lowest tied id as every draft, and [lowest, next tied id, ...]
    (g = 3 at the interpreter's vocabularies, 4 on a GPU)."""
    g = 3 if vocab in (4099, 1100) else 4
    sets = tie_sets(vocab, device)
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
    return dict(target_logits=logits.to(dtype).to(device), draft_tokens=drafts.to(device), num_draft_tokens=None)
