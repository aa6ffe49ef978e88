"""Batched adversarial fuzzing of every verification op (issue 25, "Fuzzing every verify op").

A case is a row. Every op call carries a batch of B rows and the ops treat rows
independently, so each row is one case with its own class: a call with B = 128 counts as
128 cases (for max_prob, a case is one [V] row of the logits). Generation is fixed-seed torch
(one generator per batch, keyed by op, backend and batch index), not per-example
hypothesis: one op call per batch keeps 10,000+ cases within seconds on the reference and
1,000+ within the Triton interpreter's budget. `PLAN` holds the batches;
`test_case_budget` checks the totals. Rows per op (torch / triton): rejection_sample,
rejection_sample_logits, greedy_verify, relaxed_verify, bild_verify 2,048 each / 100, 48,
100, 96, 96; tree_greedy_verify, tree_rejection_sample 1,536 each / 260, 96; max_prob
3,072 / 252 [V] rows: 16,384 / 1,048 in all, plus 128 / 12 unvalidated rows per op.

Row classes (`CLASSES`, spread evenly over each batch; hostile values hit a random subset
of the row's positions, in the target scores and, for the sampling ops, in q too):
clean; NaN entries; all-NaN rows; no mass (all-zero probabilities, all -inf logits); +inf
entries; half the row zero / -inf; one-hot rows (sampling: q one-hot at the draft too);
unnormalised (probabilities scaled by 1e-3..1e3, so rows do not sum to 1 and entries pass
1; logits shifted by up to +-3e4); ties (constant rows); p == q (empty residual; logit ops:
every draft the argmax); tiny values (float32 subnormals, 0 in 16 bits); huge values
(1e30: inf in float16). Independently of the class, per element: drafts (the argmax, rank
1-3, a random id, -1 padding) and caller uniforms (random, exactly 0, the largest value
below 1, 2^-60; an eighth of the rows get all coins 0); per batch: dtype (fp32/fp16/bf16),
V (1 to 4500), g (0 to 7), ragged num_draft_tokens or none, index tensors (drafts, counts,
seeds, offsets, tree tokens, parents) int32 or int64, contiguous or strided (interleaved,
transposed, storage offset), float tensors contiguous or padded views of a NaN-filled
allocation, randomness (float32 / float64 uniforms, an int seed, per-request seeds, with or
without offsets), op parameters (top_beta 1..V+5, tau 0..inf, thresholds 0..inf, float or
per-row temperatures). Trees: random topologies with unused slots (plus chains, stars and
root-only trees), duplicate sibling tokens, -1 and garbage root ids, max_depth default or 0..N.

Properties, on every backend: output shapes and int64 dtypes; num_accepted within [0, n_b]
(tree: [0, max_depth]); the accepted prefix equals the drafts (tree: tokens of a
parent-to-child path from the root); the emitted id in [0, V); -1 padding after it; and
per op: greedy/relaxed/bild emit the target argmax (NaN as -inf, ties low); greedy accepts
only argmax drafts; bild only drafts with a finite logit; rejection sampling accepts only
drafts with p(x) > 0, emits an id with target mass (id 0 for a row with none), and with
coins of 0 accepts every in-range draft with p > 0 and finite q; relaxed with top_beta=1 or
tau=0 equals greedy; tree greedy follows the first matching child and stops only where no
child matches; max_prob is in [0, 1] and fallback_check is max_prob < threshold. Triton
against the reference: bit for bit on every row for the bit-exact ops (rejection_sample,
greedy, relaxed, both tree ops), on rows decided outside the documented 1e-5 band for
bild_verify and rejection_sample_logits, within 1e-5 for max_prob.

Input errors (`test_documented_input_errors`): what the ops' validation rejects on CPU
tensors (draft / tree ids outside [-1, V), counts outside [0, g], uniforms of 1, NaN,
negative or > 1, bad temperatures / parameters / parents / max_depth) raises ValueError
whose message is one line starting with the op's name, on every backend. Past that
validation (`test_unvalidated_values_stay_in_bounds`: the kernels called directly, as a GPU
call reaches them uninspected) ids outside [0, V) behave exactly like -1, and uniforms of
1.0 / NaN / inf / negative and counts outside [0, g] still give well-formed outputs, Triton
equal to the reference.
"""

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

from specdec_kernels import ops, reference
from specdec_kernels.common import registry
from specdec_kernels.common import rng
from specdec_kernels.common.sampling import gather_token_values, nan_to_neg_inf, safe_argmax, to_weights
from specdec_kernels.common.draws import seed_and_row_key

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")  # interpreter NaN/inf math

NAN, INF = float("nan"), float("inf")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CLASSES = ("clean", "nan_entry", "all_nan", "no_mass", "pos_inf", "half_masked", "one_hot", "unnormalised", "ties",
           "p_eq_q", "tiny", "huge")
CHAIN_OPS = ("rejection_sample", "rejection_sample_logits", "greedy_verify", "relaxed_verify", "bild_verify")
TREE_OPS = ("tree_greedy_verify", "tree_rejection_sample")
SAMPLING = ("rejection_sample", "rejection_sample_logits", "tree_rejection_sample")
BIT_EXACT = ("rejection_sample", "greedy_verify", "relaxed_verify", "tree_greedy_verify", "tree_rejection_sample")
SCORES = {"rejection_sample": ("target_probs", "draft_probs"),
          "rejection_sample_logits": ("target_logits", "draft_logits"),
          "greedy_verify": ("target_logits",), "relaxed_verify": ("target_logits",), "bild_verify": ("target_logits",),
          "tree_greedy_verify": ("target_logits",), "tree_rejection_sample": ("target_probs", "draft_probs")}
MARGIN = 1e-5  # the documented band of the exp/log-based ops (bild_verify, rejection_sample_logits)


def _triton_runs() -> bool:
    return registry.triton_importable() and (torch.cuda.is_available() or registry.triton_interpreting())


BACKENDS = ("torch", "triton") if _triton_runs() else ("torch",)


# ----------------------------------------------------------------------------- the plan

def _plan(backend: str, op: str) -> list[tuple[int, int, int]]:
    """(B, g or N, V) per batch. Torch: 10,000+ rows in all; Triton (interpreter): 1,000+,
    small g (its grid is B * (g + 1) programs) and small V, with one multi-tile V."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"plan/{backend}/{op}".encode()))
    pick = lambda seq: seq[int(torch.randint(len(seq), (), generator=gen))]  # noqa: E731
    tree = op in TREE_OPS
    if backend == "torch":
        vocabs = (1, 2, 3, 7, 31, 64, 100, 257, 1030, 2100)
        batches, rows = {"tree_rejection_sample": 6, "tree_greedy_verify": 6, "max_prob": 4}.get(op, 8), 256
        plan = [(rows, pick(range(1, 13)) if tree else pick(range(1, 8)), pick(vocabs)) for _ in range(batches)]
        if not tree:
            plan[-1] = (rows, 0, plan[-1][2])  # one batch with no drafts (the bonus alone)
        return plan + [(0, 2, 5)]  # and an empty batch
    vocabs = (1, 2, 5, 17, 33, 100)
    rows = {"rejection_sample": (48, 48), "rejection_sample_logits": (32, 16),
            "greedy_verify": (48, 48), "relaxed_verify": (48, 48), "bild_verify": (48, 48),
            "tree_greedy_verify": (64, 64, 64, 64), "tree_rejection_sample": (48, 48),
            "max_prob": (48, 32)}[op]
    plan = [(b, pick(range(2, 9)) if tree else pick(range(1 if i == 0 else 0, 4)), pick(vocabs))
            for i, b in enumerate(rows)]
    if op in ("rejection_sample", "greedy_verify", "tree_greedy_verify", "max_prob"):
        plan.append((4, 2 if tree else 1, 4500))  # V split over several programs per row (BLOCK_V = 1024)
    return plan + [(0, 2, 5)]  # and an empty batch


PLAN = {(backend, op): _plan(backend, op) for backend in BACKENDS for op in (*CHAIN_OPS, *TREE_OPS, "max_prob")}


def planned_rows(backend: str, op: str) -> int:
    if op == "max_prob":  # [B, 2, V] logits and [B, V] draft logits: 3B rows of V per batch
        return sum(3 * b for b, _, _ in PLAN[(backend, op)])
    return sum(b for b, _, _ in PLAN[(backend, op)])


def generator(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def choice(gen: torch.Generator, seq):
    return seq[int(torch.randint(len(seq), (), generator=gen))]


def rand(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.rand(shape, generator=gen)


# ----------------------------------------------------------------------------- layouts

def index_tensor(x: torch.Tensor, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """x's values as `dtype`, contiguous or as a strided view (the storage around it holds 0)."""
    x = x.to(dtype)
    if layout == "contiguous" or x.dim() == 0:
        return x.contiguous()
    if layout == "interleaved":  # stride 2 in the last dim, storage offset 1
        big = torch.zeros((*x.shape[:-1], 2 * x.shape[-1] + 1), dtype=dtype)
        view = big[..., 1::2]
    elif layout == "transposed" and x.dim() == 2:  # column-major
        view = torch.zeros(tuple(reversed(x.shape)), dtype=dtype).t()
    else:  # "offset" (and 1-D "transposed"): a view starting past its storage's first element
        view = torch.zeros(x.numel() + 3, dtype=dtype)[3:].view(x.shape)
    view.copy_(x)
    return view


def float_tensor(x: torch.Tensor, dtype: torch.dtype, padded: bool) -> torch.Tensor:
    """x as `dtype`, contiguous or as a padded view (every dim padded, NaN around it)."""
    x = x.to(dtype)
    if not padded:
        return x.contiguous()
    big = torch.full(tuple(s + 2 for s in x.shape), NAN, dtype=dtype)
    view = big[tuple(slice(1, 1 + s) for s in x.shape)]
    view.copy_(x)
    return view


# ----------------------------------------------------------------------------- hostile rows

def hostile(scores: torch.Tensor, classes: torch.Tensor, logits: bool, gen: torch.Generator) -> torch.Tensor:
    """scores [B, P, V] float32 with each row's class applied at a random subset of its positions."""
    batch, n_pos, vocab = scores.shape
    if n_pos == 0:
        return scores.clone()
    hit = rand(gen, batch, n_pos) < 0.6
    hit[torch.arange(batch), torch.randint(n_pos, (batch,), generator=gen)] = True  # at least one position
    low = -INF if logits else 0.0
    out = scores.clone()
    for name in CLASSES[1:]:
        rows, pos = (hit & (classes == CLASSES.index(name)).unsqueeze(1)).nonzero(as_tuple=True)
        k = len(rows)
        if k == 0 or name == "p_eq_q":  # p == q is made by the callers
            continue
        x = out[rows, pos]  # [k, V]: only the hit rows are built
        one = F.one_hot(torch.randint(vocab, (k,), generator=gen), vocab).bool()
        if name in ("nan_entry", "pos_inf"):  # one or two entries
            two = F.one_hot(torch.randint(vocab, (k,), generator=gen), vocab).bool() & (rand(gen, k, 1) < 0.5)
            x = x.masked_fill(one | two, NAN if name == "nan_entry" else INF)
        elif name in ("all_nan", "no_mass", "ties"):
            x = torch.full_like(x, {"all_nan": NAN, "no_mass": low, "ties": 0.5}[name])
        elif name == "half_masked":
            x = x.masked_fill(rand(gen, k, vocab) < 0.5, low)
        elif name == "one_hot":
            x = torch.where(one, 0.0 if logits else 1.0, low)
        elif name == "unnormalised":
            x = x + (rand(gen, k, 1) * 2 - 1) * 3e4 if logits else x * 10.0 ** (rand(gen, k, 1) * 6 - 3)
        else:  # tiny, huge
            x = x * {"tiny": 1e-30 if logits else 1e-39, "huge": 1e30}[name]
        out[rows, pos] = x
    return out


def row_classes(gen: torch.Generator, batch: int) -> torch.Tensor:
    """Each row's class index: every class equally often (a small batch gets a random few)."""
    return (torch.randperm(batch, generator=gen) + int(torch.randint(len(CLASSES), (), generator=gen))) % len(CLASSES)


def class_rows(classes: torch.Tensor, *names: str) -> torch.Tensor:
    return torch.isin(classes, torch.tensor([CLASSES.index(n) for n in names]))


def pick_drafts(scores: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """int64 [B, P] per slot: the argmax (NaN as -inf), rank 1..3, a random id, or -1."""
    batch, n_pos, vocab = scores.shape
    ranked = nan_to_neg_inf(scores).topk(min(4, vocab), dim=-1).indices
    rank = torch.randint(0, min(4, vocab), (batch, n_pos, 1), generator=gen)
    near_top = ranked.gather(-1, rank).squeeze(-1)
    c = rand(gen, batch, n_pos)
    drafts = torch.where(c < 0.45, safe_argmax(scores), near_top)
    drafts = torch.where(c >= 0.65, torch.randint(0, vocab, (batch, n_pos), generator=gen), drafts)
    return torch.where(c >= 0.9, -1, drafts)


def caller_uniforms(gen: torch.Generator, batch: int, cols: int, dtype: torch.dtype, coin_cols: slice):
    """[B, cols] in [0, 1) with exact 0s, the largest value below 1 and 2^-60 mixed in; an eighth
    of the rows get every coin (the columns in coin_cols) 0. Returns (uniforms, zero-coin rows)."""
    u = rand(gen, batch, cols).double()
    c = rand(gen, batch, cols)
    top = 1 - 2.0**-24 if dtype == torch.float32 else 1 - 2.0**-53
    u = torch.where(c < 0.1, 0.0, torch.where(c < 0.2, top, torch.where(c < 0.25, 2.0**-60, u)))
    zero_rows = rand(gen, batch) < 0.125
    u[:, coin_cols] = torch.where(zero_rows.unsqueeze(1), 0.0, u[:, coin_cols])
    return u.to(dtype), zero_rows


def index_kind(gen: torch.Generator) -> tuple[torch.dtype, str]:
    """An index tensor's dtype and layout, drawn for each tensor on its own."""
    return choice(gen, (torch.int64, torch.int32)), choice(gen, ("contiguous", "interleaved", "transposed", "offset"))


def randomness(gen: torch.Generator, batch: int, cols: int, coin_cols: slice) -> tuple[dict, torch.Tensor]:
    """kwargs of one randomness mode, and the rows whose coins are all 0 (uniforms modes only)."""
    mode = choice(gen, ("uniforms32", "uniforms64", "seed_int", "seed_tensor"))
    none = torch.zeros(batch, dtype=torch.bool)
    if mode.startswith("uniforms"):
        dtype = torch.float32 if mode == "uniforms32" else torch.float64
        u, zero_rows = caller_uniforms(gen, batch, cols, dtype, coin_cols)
        return {"uniforms": u if rand(gen, 1) < 0.7 else u.t().contiguous().t()}, zero_rows  # column-major now and then
    (seed_dtype, seed_layout), (offset_dtype, offset_layout) = index_kind(gen), index_kind(gen)
    wide = seed_dtype == torch.int64
    if wide:
        seeds = torch.randint(-(2**62), 2**62, (batch,), generator=gen) * 2
    else:
        seeds = torch.randint(-(2**31), 2**31, (batch,), generator=gen)
    wide = offset_dtype == torch.int64
    offsets = torch.randint(0, 2**62 if wide else 2**31 - 64, (batch,), generator=gen)
    kwargs = {"seed": int(torch.randint(-(2**62), 2**62, (), generator=gen)) * 2 if mode == "seed_int"
              else index_tensor(seeds, seed_dtype, seed_layout)}
    if rand(gen, 1) < 0.7:
        kwargs["offsets"] = index_tensor(offsets, offset_dtype, offset_layout)
    return kwargs, none


# ----------------------------------------------------------------------------- chain cases

class Case(dict):
    """An op's kwargs (minus backend), with the row classes and generation facts as attributes."""
    classes: torch.Tensor
    zero_coin_rows: torch.Tensor


def chain_case(op: str, key: tuple, batch: int, g: int, vocab: int) -> Case:
    gen = generator(*key)
    dtype = choice(gen, DTYPES)
    classes = row_classes(gen, batch)
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * (0.5 + 3.5 * float(rand(gen, 1)))
    noise = torch.randn(batch, g, vocab, generator=gen) * float(rand(gen, 1))
    is_logits = op != "rejection_sample"
    if is_logits:
        target, draft = logits, logits[:, :g] + noise
    else:
        target, draft = torch.softmax(logits, -1), torch.softmax(logits[:, :g] + noise, -1)
    target = hostile(target, classes, is_logits, gen).to(dtype).float()  # what the op will see
    drafts = pick_drafts(target[:, :g], gen)
    same = class_rows(classes, "p_eq_q")
    if op in SAMPLING:
        draft_classes = torch.where(rand(gen, batch) < 0.5, classes, 0)  # hostile q in half the hostile rows
        draft = hostile(draft, draft_classes, is_logits, gen)
        draft = torch.where(same.view(-1, 1, 1), target[:, :g], draft)
        if not is_logits:  # one-hot rows: deterministic drafts, q one-hot at the drafted id
            one_hot_q = F.one_hot(drafts.clamp(min=0), vocab).float()
            deterministic = class_rows(classes, "one_hot") & (rand(gen, batch) < 0.5)
            draft = torch.where(deterministic.view(-1, 1, 1), one_hot_q, draft)
    else:
        drafts = torch.where(same.unsqueeze(1), safe_argmax(target[:, :g]), drafts)  # every draft the argmax
    case = Case({SCORES[op][0]: float_tensor(target, dtype, bool(rand(gen, 1) < 0.3)),
                 "draft_tokens": index_tensor(drafts, *index_kind(gen))})
    case.classes, case.zero_coin_rows = classes, torch.zeros(batch, dtype=torch.bool)
    if rand(gen, 1) < 0.7:
        case["num_draft_tokens"] = index_tensor(torch.randint(0, g + 1, (batch,), generator=gen), *index_kind(gen))
    if op in SAMPLING:
        case[SCORES[op][1]] = float_tensor(draft, dtype, bool(rand(gen, 1) < 0.3))
        random_kwargs, case.zero_coin_rows = randomness(gen, batch, g + 1, slice(0, g))
        case.update(random_kwargs)
    if op == "rejection_sample_logits":
        if rand(gen, 1) < 0.5:
            case["temperature"] = choice(gen, (0.3, 1.0, 2.5))
        else:
            temps = (0.05 + 3 * rand(gen, batch)).float()
            case["temperature"] = temps if rand(gen, 1) < 0.5 else index_tensor(temps, torch.float32, "interleaved")
    if op == "relaxed_verify":
        case["top_beta"] = choice(gen, (1, 1, 2, 3, vocab + 5))
        case["tau"] = choice(gen, (0.0, 0.0, 0.5, 3.0, INF))
    if op == "bild_verify":
        case["rollback_threshold"] = choice(gen, (0.0, 0.5, 2.0, 8.0, INF))
    return case


def counts_of(case: dict, batch: int, g: int) -> torch.Tensor:
    counts = case.get("num_draft_tokens")
    return torch.full((batch,), g) if counts is None else counts.long().clamp(0, g)


def row_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x[torch.arange(x.shape[0]), index]


def per_row(x: torch.Tensor) -> torch.Tensor:
    """x [B, ...] as [B, rest] (also for B = 0)."""
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


def fail_rows(name: str, bad: torch.Tensor, classes: torch.Tensor | None, detail=None):
    if bool(bad.any()):
        rows = bad.nonzero().flatten()[:6].tolist()
        names = [CLASSES[int(classes[r])] for r in rows] if classes is not None else None
        raise AssertionError(f"{name}: rows {rows} (classes {names}) {detail(rows) if detail else ''}")


def check_chain(op: str, case: Case, result) -> None:
    """Every property of a chain op's outputs that holds whatever the scores and the coins."""
    out, accepted = result
    drafts = case["draft_tokens"].long()
    batch, g = drafts.shape
    target = case[SCORES[op][0]]
    vocab = target.shape[-1]
    assert out.dtype == torch.int64 and accepted.dtype == torch.int64, (out.dtype, accepted.dtype)
    assert out.shape == (batch, g + 1) and accepted.shape == (batch,), (out.shape, accepted.shape)
    counts = counts_of(case, batch, g)
    classes = case.classes
    def show(rows):
        return f"out {out[rows].tolist()} num_accepted {accepted[rows].tolist()} counts {counts[rows].tolist()}"

    fail_rows("num_accepted outside [0, n_b]", (accepted < 0) | (accepted > counts), classes, show)
    n = accepted.clamp(0, g)
    pos = torch.arange(g + 1)
    prefix = pos < n.unsqueeze(1)
    padded_drafts = torch.cat([drafts, torch.full((batch, 1), -1)], dim=1)
    fail_rows("accepted tokens differ from the drafts", (prefix & (out != padded_drafts)).any(1), classes, show)
    fail_rows("accepted id outside [0, V)", (prefix & ((out < 0) | (out >= vocab))).any(1), classes, show)
    final = out.gather(1, n.unsqueeze(1)).squeeze(1)
    fail_rows("emitted id outside [0, V)", (final < 0) | (final >= vocab), classes, show)
    fail_rows("not -1 after the emitted id", ((pos > n.unsqueeze(1)) & (out != -1)).any(1), classes, show)
    body = prefix[:, :g]
    if op in ("greedy_verify", "relaxed_verify", "bild_verify"):
        top1 = safe_argmax(target)
        fail_rows("emitted id is not the target argmax", final != top1.gather(1, n.unsqueeze(1)).squeeze(1), classes,
                  show)
        if op == "greedy_verify":
            fail_rows("accepted a draft that is not the argmax", (body & (drafts != top1[:, :g])).any(1), classes, show)
        if op == "bild_verify":
            logits = nan_to_neg_inf(target[:, :g])
            value, _ = gather_token_values(logits, drafts)
            if math.isfinite(case["rollback_threshold"]):
                fail_rows("accepted a draft with no finite logit", (body & ~torch.isfinite(value)).any(1), classes,
                          show)
            else:  # an infinite NLL does not exceed an infinite threshold; an undefined one (inf - inf) rejects
                nll = torch.logsumexp(logits, dim=-1) - value
                fail_rows("accepted a draft with an undefined NLL", (body & torch.isnan(nll)).any(1), classes, show)
    if op == "rejection_sample":
        p_tok, in_range = gather_token_values(target[:, :g], drafts)
        fail_rows("accepted a draft with p(x) <= 0 or NaN", (body & ~(p_tok > 0)).any(1), classes, show)
        weights = to_weights(row_at(target, n))
        mass = weights.gather(1, final.clamp(0, vocab - 1).unsqueeze(1)).squeeze(1)
        empty = weights.sum(1) == 0
        fail_rows("emitted id has no target mass (or a massless row did not give 0)",
                  torch.where(empty, final != 0, mass <= 0), classes, show)
        q_tok, _ = gather_token_values(case["draft_probs"], drafts)
        ok = in_range & (p_tok > 0) & torch.isfinite(q_tok) & (pos[:g] < counts.unsqueeze(1))
        expected = torch.cumprod(ok.long(), dim=1).sum(1)
        fail_rows("coins of 0 did not accept every draft with p > 0", case.zero_coin_rows & (accepted != expected),
                  classes, show)


def call(op: str, case: dict, backend: str):
    return getattr(ops, op)(**case, backend=backend)


# ----------------------------------------------------------------------------- Triton vs reference

def effective_uniforms(case: dict, batch: int, g: int, ref_accepted: torch.Tensor) -> torch.Tensor:
    """[B, g+1] float64: the coins and the final draw the reference used."""
    if case.get("uniforms") is not None:
        return case["uniforms"].double()
    offsets = case.get("offsets")
    offsets = torch.zeros(batch, dtype=torch.int64) if offsets is None else offsets.long()
    seeds, row_key = seed_and_row_key(case["seed"], batch, "cpu")
    coins = rng.philox_uniform(seeds[:, None], offsets[:, None] + torch.arange(g), row_key[:, None], rng.SALT_ACCEPT)
    final = rng.philox_uniform(seeds, offsets + ref_accepted, row_key, rng.SALT_FINAL)
    return torch.cat([coins, final[:, None]], dim=1)


def logits_sampling_decided(case: dict, ref) -> torch.Tensor:
    """bool [B]: rows of rejection_sample_logits whose every decision (coins and the final draw)
    lies outside the documented band, computed from float64 softmaxes."""
    target, draft, drafts = case["target_logits"], case["draft_logits"], case["draft_tokens"].long()
    batch, g = drafts.shape
    vocab = target.shape[-1]
    temperature = case.get("temperature", 1.0)
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.float().view(-1, 1, 1)
    p64 = torch.softmax((target.float() / temperature).double(), dim=-1)
    q64 = torch.softmax((draft.float() / temperature).double(), dim=-1)
    accepted = ref[1]
    u = effective_uniforms(case, batch, g, accepted)
    counts = counts_of(case, batch, g)
    decided = torch.ones(batch, dtype=torch.bool)
    for b in range(batch):
        a, n = int(accepted[b]), int(counts[b])
        for j in range(min(a + 1, n)):
            x = int(drafts[b, j])
            if not 0 <= x < vocab:
                continue
            p, q = float(p64[b, j, x]), float(q64[b, j, x])
            if p != p or q != q or p == q:
                continue
            scale = max(p, q)
            if 0 < scale < 1e-30 or abs(float(u[b, j]) * q - p) < 10 * MARGIN * scale:
                decided[b] = False
        p_row = p64[b, a]
        if bool(torch.isnan(p_row).any()):
            continue
        r = p_row
        if a < n and not bool(torch.isnan(q64[b, a]).any()):
            r = (p_row - q64[b, a]).clamp(min=0)
            if float(r.sum()) == 0:
                r = p_row
            elif float(r.sum()) < 100 * MARGIN:
                decided[b] = False
        cdf = torch.cumsum(r, 0)
        steps = cdf[(r > 0) & (cdf < cdf[-1])]
        if bool(((steps - float(u[b, g]) * float(cdf[-1])).abs() < 10 * MARGIN).any()):
            decided[b] = False
    return decided


def bild_decided(case: dict) -> torch.Tensor:
    """bool [B]: rows where no finite draft NLL lies within the band of the threshold."""
    logits, drafts = nan_to_neg_inf(case["target_logits"]), case["draft_tokens"].long()
    g = drafts.shape[1]
    value, in_range = gather_token_values(logits[:, :g], drafts)
    nll = torch.logsumexp(logits[:, :g], dim=-1) - value
    threshold = case["rollback_threshold"]
    near = in_range & torch.isfinite(nll) & ((nll - threshold).abs() < 10 * MARGIN * (1 + abs(nll)))
    return ~near.any(1)


def compare_with_reference(op: str, case: Case, got, want) -> int:
    """Asserts Triton == reference on the rows the op's contract makes exact; returns how many."""
    if op in BIT_EXACT:
        rows = torch.ones(got[0].shape[0], dtype=torch.bool)
    elif op == "bild_verify":
        rows = bild_decided(case)
    else:
        rows = logits_sampling_decided(case, want)
    for name, a, b in zip(("output_tokens", "num_accepted", "accepted_nodes"), got, want):
        mismatch = rows & per_row(a != b).any(1)
        fail_rows(f"triton != reference ({name})", mismatch, case.classes,
                  lambda r: f"triton {a[r].tolist()} reference {b[r].tolist()}")
    return int(rows.sum())


# ----------------------------------------------------------------------------- tree cases

def random_parents(gen: torch.Generator, batch: int, n: int) -> torch.Tensor:
    """Random topologies (unused slots now and then), and some chains, stars and root-only rows."""
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (batch,), generator=gen)
        parents[rand(gen, batch) < 0.15, i] = -1
        dead = (parents[:, i] > 0) & (parents.gather(1, parents[:, i:i + 1].clamp(min=0)).squeeze(1) < 0)
        parents[dead, i] = -1  # a used slot's parent must be used
    shape = rand(gen, batch)
    chain = reference.tree.chain_parents(batch, n)
    star = torch.where(torch.arange(n) > 0, 0, -1).expand(batch, n)
    parents = torch.where((shape < 0.1).unsqueeze(1), chain, parents)
    parents = torch.where(((shape >= 0.1) & (shape < 0.2)).unsqueeze(1), star, parents)
    return torch.where(((shape >= 0.2) & (shape < 0.25)).unsqueeze(1), -1, parents)


def tree_case(op: str, key: tuple, batch: int, n: int, vocab: int) -> Case:
    gen = generator(*key)
    dtype = choice(gen, DTYPES)
    classes = row_classes(gen, batch)
    parents = random_parents(gen, batch, n)
    logits = torch.randn(batch, n, vocab, generator=gen) * (0.5 + 3.5 * float(rand(gen, 1)))
    sampling = op == "tree_rejection_sample"
    target = torch.softmax(logits, -1) if sampling else logits
    target = hostile(target, classes, not sampling, gen).to(dtype).float()
    at_parent = lambda x: x.gather(1, parents.clamp(min=0))  # noqa: E731
    tokens = pick_drafts(target, gen)  # [B, N]: slot i's candidates are scored at its own position ...
    parent_top = at_parent(safe_argmax(target))  # ... so mix in the argmax at the parent (an accepted node)
    tokens = torch.where(rand(gen, batch, n) < 0.5, parent_top, tokens)
    previous = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)  # a duplicate of the previous sibling now and then
    same_parent = torch.cat([torch.zeros(batch, 1, dtype=torch.bool), parents[:, 1:] == parents[:, :-1]], dim=1)
    tokens = torch.where(same_parent & (rand(gen, batch, n) < 0.3), previous, tokens)
    garbage = torch.randint(-(2**30), 2**30, (batch,), generator=gen)
    tokens[:, 0] = torch.where(rand(gen, batch) < 0.3, garbage, -1)  # the root's id is ignored
    tokens = torch.where((parents < 0) & (torch.arange(n) > 0) & (rand(gen, batch, n) < 0.5), -1, tokens)
    case = Case({SCORES[op][0]: float_tensor(target, dtype, bool(rand(gen, 1) < 0.3)),
                 "tree_tokens": index_tensor(tokens, *index_kind(gen)),
                 "parents": index_tensor(parents, *index_kind(gen))})
    case.classes, case.zero_coin_rows = classes, torch.zeros(batch, dtype=torch.bool)
    if rand(gen, 1) < 0.5:
        case["max_depth"] = int(torch.randint(0, n + 1, (), generator=gen))
    if sampling:
        noise = torch.randn(batch, n, vocab, generator=gen) * float(rand(gen, 1))
        q = torch.softmax(at_parent_rows(logits, parents) + noise, -1)  # node i drafted from near p at its parent
        q = hostile(q, torch.where(rand(gen, batch) < 0.5, classes, 0), False, gen)
        q = torch.where(class_rows(classes, "p_eq_q").view(-1, 1, 1), at_parent_rows(target, parents), q)
        one_hot_q = F.one_hot(tokens.clamp(0, vocab - 1), vocab).float()  # deterministic (top-k style) drafts
        q = torch.where((class_rows(classes, "one_hot") & (rand(gen, batch) < 0.5)).view(-1, 1, 1), one_hot_q, q)
        case["draft_probs"] = float_tensor(q, dtype, bool(rand(gen, 1) < 0.3))
        random_kwargs, _ = randomness(gen, batch, n, slice(1, n))
        case.update(random_kwargs)
    return case


def at_parent_rows(x: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """x [B, N, V] -> x[b, parents[b, i]] (node 0 and unused slots: row 0)."""
    return x.gather(1, parents.clamp(min=0).unsqueeze(-1).expand_as(x))


def check_tree(op: str, case: Case, result) -> None:
    out, accepted, nodes = result
    tokens, parents = case["tree_tokens"].long(), case["parents"].long()
    batch, n = tokens.shape
    target = case[SCORES[op][0]]
    vocab = target.shape[-1]
    depth = case.get("max_depth")
    depth = reference.max_tree_depth(parents) if depth is None else depth
    assert all(t.dtype == torch.int64 for t in result), [t.dtype for t in result]
    assert out.shape == nodes.shape == (batch, depth + 1) and accepted.shape == (batch,), (out.shape, nodes.shape)
    classes = case.classes
    def show(rows):
        return f"out {out[rows].tolist()} nodes {nodes[rows].tolist()} parents {parents[rows].tolist()}"

    fail_rows("num_accepted outside [0, max_depth]", (accepted < 0) | (accepted > depth), classes, show)
    fail_rows("accepted_nodes[:, 0] is not the root", nodes[:, 0] != 0, classes, show)
    k_acc = accepted.clamp(0, depth)
    top1 = safe_argmax(target)
    node_ids = torch.arange(n)
    for k in range(1, depth + 1):
        active = k <= k_acc
        node, prev = nodes[:, k], nodes[:, k - 1].clamp(0, n - 1)
        safe = node.clamp(0, n - 1)
        token = tokens.gather(1, safe.unsqueeze(1)).squeeze(1)
        off_path = (node <= 0) | (node >= n) | (parents.gather(1, safe.unsqueeze(1)).squeeze(1) != nodes[:, k - 1])
        fail_rows(f"accepted node {k} is not a child of node {k - 1}", active & off_path, classes, show)
        fail_rows(f"output {k - 1} is not the node's token", active & (out[:, k - 1] != token), classes, show)
        fail_rows(f"accepted id {k - 1} outside [0, V)", active & ((token < 0) | (token >= vocab)), classes, show)
        if op == "tree_greedy_verify":
            want = top1.gather(1, prev.unsqueeze(1))
            matches = (parents == prev.unsqueeze(1)) & (node_ids > 0) & (tokens == want)
            first = torch.where(matches.any(1), matches.long().argmax(1), -1)
            fail_rows(f"accepted node {k} is not the first child matching the argmax", active & (node != first),
                      classes, show)
        else:
            p_x, _ = gather_token_values(row_at(target, prev), token.clamp(0, vocab - 1))
            fail_rows(f"accepted node {k} has p(x) <= 0 or NaN", active & ~(p_x > 0), classes, show)
    final = out.gather(1, k_acc.unsqueeze(1)).squeeze(1)
    fail_rows("emitted id outside [0, V)", (final < 0) | (final >= vocab), classes, show)
    pos = torch.arange(depth + 1)
    after = pos > k_acc.unsqueeze(1)
    fail_rows("not -1 after the emitted id", (after & ((out != -1) | (nodes != -1))).any(1), classes, show)
    last = nodes.gather(1, k_acc.unsqueeze(1)).squeeze(1).clamp(0, n - 1)
    if op == "tree_greedy_verify":
        want = top1.gather(1, last.unsqueeze(1)).squeeze(1)
        fail_rows("emitted id is not the argmax at the last node", final != want, classes, show)
        child_matches = ((parents == last.unsqueeze(1)) & (node_ids > 0) & (tokens == want.unsqueeze(1))).any(1)
        fail_rows("stopped although a child matches the argmax", (k_acc < depth) & child_matches, classes, show)
    else:
        weights = to_weights(row_at(target, last))
        mass = weights.gather(1, final.clamp(0, vocab - 1).unsqueeze(1)).squeeze(1)
        fail_rows("emitted id has no target mass (or a massless row did not give 0)",
                  torch.where(weights.sum(1) == 0, final != 0, mass <= 0), classes, show)


# ----------------------------------------------------------------------------- the fuzz tests

def make_case(op: str, key: tuple, batch: int, size: int, vocab: int) -> Case:
    return (tree_case if op in TREE_OPS else chain_case)(op, key, batch, size, vocab)


def check(op: str, case: Case, result) -> None:
    (check_tree if op in TREE_OPS else check_chain)(op, case, result)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", (*CHAIN_OPS, *TREE_OPS))
def test_fuzz_verify_op(op, backend):
    rows = compared = 0
    for index, (batch, size, vocab) in enumerate(PLAN[(backend, op)]):
        case = make_case(op, (op, backend, index), batch, size, vocab)
        result = call(op, case, backend)
        check(op, case, result)
        if backend != "torch":
            want = call(op, case, "torch")
            compared += compare_with_reference(op, case, result, want)
        if op == "relaxed_verify" and (case["top_beta"] == 1 or case["tau"] == 0):  # lossless corner: greedy exactly
            greedy = ops.greedy_verify(case["target_logits"], case["draft_tokens"],
                                       num_draft_tokens=case.get("num_draft_tokens"), backend=backend)
            for a, b in zip(result, greedy):
                fail_rows("relaxed_verify with top_beta=1 or tau=0 != greedy_verify", per_row(a != b).any(1),
                          case.classes)
        rows += batch
    assert rows == planned_rows(backend, op)
    if backend != "torch":  # the band excludes only a few rows
        assert compared >= (rows if op in BIT_EXACT else rows // 2), (compared, rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_max_prob_and_fallback_check(backend):
    rows = 0
    for index, (batch, _, vocab) in enumerate(PLAN[(backend, "max_prob")]):
        gen = generator("max_prob", backend, index)
        dtype = choice(gen, DTYPES)
        classes = row_classes(gen, batch)
        logits = hostile(torch.randn(batch, 2, vocab, generator=gen) * 3, classes, True, gen).to(dtype)
        draft = hostile(torch.randn(batch, 1, vocab, generator=gen) * 3, classes, True, gen)[:, 0].to(dtype)
        if rand(gen, 1) < 0.3:
            logits = float_tensor(logits.float(), dtype, True)
        for x in (logits, draft):
            prob = ops.max_prob(x, backend=backend)
            assert prob.dtype == torch.float32 and prob.shape == x.shape[:-1]
            fail_rows("max_prob outside [0, 1]", per_row(~((prob >= 0) & (prob <= 1))).any(1), classes)
            clean = nan_to_neg_inf(x)
            fail_rows("max_prob of a row with no finite logit is not 0",
                      per_row((clean.amax(-1) == -INF) & (prob != 0)).any(1), classes)
            fail_rows("max_prob of a row with +inf is not 1",
                      per_row((clean.amax(-1) == INF) & (prob != 1)).any(1), classes)
            if backend != "torch":
                want = ops.max_prob(x, backend="torch")
                close = torch.isclose(prob, want, rtol=1e-5, atol=1e-6)
                fail_rows("triton max_prob != reference", ~per_row(close).all(1), classes)
            rows += prob.numel()
        threshold = choice(gen, (0.0, 0.3, 0.9, 1.0))
        fallback = ops.fallback_check(draft, threshold, backend=backend)
        assert fallback.dtype == torch.bool and torch.equal(fallback, ops.max_prob(draft, backend=backend) < threshold)
    assert rows == planned_rows(backend, "max_prob")


def test_case_budget():
    torch_rows = sum(planned_rows("torch", op) for op in (*CHAIN_OPS, *TREE_OPS, "max_prob"))
    assert torch_rows >= 10_000, torch_rows
    if "triton" in BACKENDS:
        triton_rows = sum(planned_rows("triton", op) for op in (*CHAIN_OPS, *TREE_OPS, "max_prob"))
        assert triton_rows >= 1_000, triton_rows


# ----------------------------------------------------------------------------- documented input errors

def bad_inputs(op: str, case: Case, gen: torch.Generator):
    """(what, kwargs) pairs: the case with one value the validation must reject."""
    tree = op in TREE_OPS
    ids_name = "tree_tokens" if tree else "draft_tokens"
    ids = case[ids_name]
    vocab = case[SCORES[op][0]].shape[-1]
    row = int(torch.randint(ids.shape[0], (), generator=gen))
    first = 1 if tree else 0  # a tree's root id is not checked
    col = first + int(torch.randint(ids.shape[1] - first, (), generator=gen))
    low = -(2**31) if ids.dtype == torch.int32 else -(2**40)
    high = 2**31 - 1 if ids.dtype == torch.int32 else 2**40

    def with_value(name, index, value):
        x = case[name].clone()
        x[index] = value
        return {**case, name: x}

    for value in (-2, low, vocab, high):
        yield f"{ids_name} = {value}", ids_name, with_value(ids_name, (row, col), value)
    if not tree:
        g = ids.shape[1]
        counts = case.get("num_draft_tokens")
        counts = torch.full((ids.shape[0],), g, dtype=ids.dtype) if counts is None else counts.clone()
        for value in (-1, g + 1):
            bad = counts.clone()
            bad[row] = value
            yield f"num_draft_tokens = {value}", "num_draft_tokens", {**case, "num_draft_tokens": bad}
    if op in SAMPLING:
        u = case.get("uniforms")
        if u is None:  # a seeded case: valid uniforms [B, g+1] (tree: [B, N]) to spoil
            u = torch.rand(ids.shape[0], ids.shape[1] + (0 if tree else 1), generator=gen)
        base = {k: v for k, v in case.items() if k not in ("seed", "offsets")}
        for value in (1.0, NAN, -0.25, 1.5, INF):
            x = u.clone()
            x[row, col] = value
            yield f"uniforms = {value}", "uniforms", {**base, "uniforms": x}
        yield "both uniforms and seed", "seed", {**base, "uniforms": u, "seed": 1}
    if op == "rejection_sample_logits":
        for value in (0.0, -1.0, NAN):
            yield f"temperature = {value}", "temperature", {**case, "temperature": value}
        temps = torch.full((ids.shape[0],), 0.7)
        temps[row] = 0.0
        yield "temperature[row] = 0", "temperature", {**case, "temperature": temps}
    if op == "relaxed_verify":
        yield "top_beta = 0", "top_beta", {**case, "top_beta": 0}
        for value in (-1.0, NAN):
            yield f"tau = {value}", "tau", {**case, "tau": value}
    if op == "bild_verify":
        for value in (-0.5, NAN):
            yield f"rollback_threshold = {value}", "rollback_threshold", {**case, "rollback_threshold": value}
    if tree:
        parents = case["parents"]
        yield "parents[:, 0] = 0", "parents", with_value("parents", (row, 0), 0)
        n = parents.shape[1]
        if n > 1:
            yield "parent >= node", "parents", with_value("parents", (row, col), col)
            yield "parent = -2", "parents", with_value("parents", (row, col), -2)
            if n > 2:
                x = case["parents"].clone()
                x[row, 1], x[row, 2] = -1, 1  # node 2 hangs off the unused slot 1
                yield "parent is an unused slot", "parents", {**case, "parents": x}
        yield "max_depth = -1", "max_depth", {**case, "max_depth": -1}


@pytest.mark.parametrize("op", (*CHAIN_OPS, *TREE_OPS))
def test_documented_input_errors(op):
    """Every rejected input raises ValueError with a one-line message naming the op and the
    argument, on every backend (validation runs before dispatch, so nothing is launched)."""
    tested = 0
    for index in range(3):
        size = 3 + index
        case = make_case(op, (op, "errors", index), 4, size, 9)
        gen = generator(op, "errors/bad", index)
        call(op, case, "torch")  # valid as generated: each error below comes from the one spoiled value
        for what, argument, bad in bad_inputs(op, case, gen):
            for backend in BACKENDS:
                with pytest.raises(ValueError) as error:
                    call(op, bad, backend)
                message = str(error.value)
                assert "\n" not in message and message.startswith(f"{op}: "), (what, message)
                assert f"`{argument}" in message, (what, message)
                tested += 1
    assert tested > 0
    with pytest.raises(ValueError, match=r"^max_prob: .*vocabulary"):
        ops.max_prob(torch.zeros(2, 0))
    for value in (-0.1, 1.5, NAN):
        with pytest.raises(ValueError, match=r"^fallback_check: "):
            ops.fallback_check(torch.zeros(2, 3), value)


# ----------------------------------------------------------------------------- past the validation

UNVALIDATED = {"torch": (2, 64), "triton": (1, 12)}  # (batches, rows)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", (*CHAIN_OPS, *TREE_OPS))
def test_unvalidated_values_stay_in_bounds(op, backend):
    """The kernels called directly (a GPU call is not inspected: that would sync) with ids
    outside [0, V), counts outside [0, g] and uniforms of 1.0, NaN, inf or < 0: the outputs
    stay well-formed, ids outside [0, V) act exactly as -1, and Triton equals the reference."""
    impl = registry.implementation(op, backend)
    tree = op in TREE_OPS
    batches, batch = UNVALIDATED[backend]
    for index in range(batches):
        case = make_case(op, (op, backend, "unvalidated", index), batch, (5 if tree else 3), 17)
        gen = generator(op, backend, "unvalidated/bad", index)
        ids_name = "tree_tokens" if tree else "draft_tokens"
        ids = case[ids_name].clone()
        vocab = case[SCORES[op][0]].shape[-1]
        wild = [-2, -7, vocab, vocab + 7, -(2**31), 2**31 - 1] + ([-(2**40), 2**40] if ids.dtype == torch.int64 else [])
        wild = torch.tensor(wild)
        hit = rand(gen, *ids.shape) < 0.25
        if tree:
            hit[:, 0] = False  # the root's id is ignored anyway
        ids[hit] = wild[torch.randint(len(wild), (int(hit.sum()),), generator=gen)].to(ids.dtype)
        padded = ids.clone()
        padded[hit] = -1
        bad = {**case, ids_name: ids}
        if tree:
            bad.setdefault("max_depth", reference.max_tree_depth(case["parents"].long()))
        else:
            g = ids.shape[1]
            counts = torch.randint(0, g + 1, (batch,), generator=gen)
            odd = rand(gen, batch)
            counts = torch.where(odd < 0.15, -3, torch.where(odd < 0.3, g + 2, counts))
            counts = torch.where((odd >= 0.3) & (odd < 0.35), 2**31 - 1, counts)
            bad["num_draft_tokens"] = counts.to(ids.dtype)
        if op in SAMPLING:
            u = rand(gen, batch, ids.shape[1] + (0 if tree else 1)).double()
            special = rand(gen, *u.shape)
            u = torch.where(special < 0.1, NAN, torch.where(special < 0.15, INF, torch.where(special < 0.2, -0.5,
                            torch.where(special < 0.25, 1.5, torch.where(special < 0.35, 1.0, u)))))
            bad = {k: v for k, v in bad.items() if k not in ("seed", "offsets")}
            bad["uniforms"] = u.to(choice(gen, (torch.float32, torch.float64)))
        got = impl(**bad)
        checked = Case(bad)
        checked.classes, checked.zero_coin_rows = case.classes, torch.zeros(batch, dtype=torch.bool)
        check(op, checked, got)
        as_padding = registry.implementation(op, "torch")(**{**bad, ids_name: padded})
        if backend == "torch" or op in BIT_EXACT:  # ids outside [0, V) behave exactly as -1
            for a, b in zip(got, as_padding):
                fail_rows("an id outside [0, V) does not act as -1", per_row(a != b).any(1), case.classes,
                          lambda r: f"got {a[r].tolist()} with -1 {b[r].tolist()}")
        else:  # exp/log ops: the same backend with -1 instead
            again = impl(**{**bad, ids_name: padded})
            for a, b in zip(got, again):
                fail_rows("an id outside [0, V) does not act as -1", per_row(a != b).any(1), case.classes)


# ----------------------------------------------------------------------------- the check can fail

def test_property_check_catches_a_mutant(monkeypatch):
    """A greedy_verify that emits V for a row holding NaN must fail the fuzz's properties."""
    honest = registry.implementation("greedy_verify", "torch")

    def mutant(target_logits, draft_tokens, **kwargs):
        out, accepted = honest(target_logits, draft_tokens, **kwargs)
        nan_rows = torch.isnan(target_logits).flatten(1).any(1)
        final = out.gather(1, accepted.unsqueeze(1))
        wrong = torch.where(nan_rows.unsqueeze(1), target_logits.shape[-1], final)
        return out.scatter(1, accepted.unsqueeze(1), wrong), accepted

    monkeypatch.setitem(registry._IMPLS["greedy_verify"], "torch", mutant)
    batch, g, vocab = PLAN[("torch", "greedy_verify")][0]
    case = make_case("greedy_verify", ("greedy_verify", "torch", 0), batch, g, vocab)
    with pytest.raises(AssertionError, match="emitted id outside"):
        check("greedy_verify", case, call("greedy_verify", case, "torch"))
