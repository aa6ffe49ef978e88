"""The Triton block_verify and block_verify_logits backends against the torch reference.

The cases are the catalog's (specdec_kernels/selftest/cases_block_verification.py at profile "tiny"):
block_verify bit for bit (every randomness mode, fp32/fp16/bf16, ragged rows, int32 and
strided index tensors, NaN/inf/zero/p == q/-0.0 rows, invalid ids, g = 0, one-hot drafts,
fuzz); block_verify_logits equal up to decisions within ~1e-4 of a boundary (every mode,
per-row temperatures, adversarial and strided rows), judged as `specdec-kernels selftest`
judges them. Here besides: several split plans (the catalog runs the default one), the launch
plans at serving shapes (host side), launch counts, ticket counters, negative uniforms past
validation, and that the test data exercise block verification's rescue (a later pass keeping
drafts an earlier failure would have dropped).

CPU tensors under the Triton interpreter: shapes stay small (a program costs ~0.1 s).
"""

import pytest
import torch
from catalog_support import catalog_cases, check_case

from specdec_kernels import ops, reference
from specdec_kernels.common import workspace as _workspace
from specdec_kernels.reference import block_verification as spec
from specdec_kernels.selftest.chain_inputs import hostile_block_probs
from specdec_kernels.triton import _split_plans
from specdec_kernels.triton import block_verification as probs_module
from specdec_kernels.triton import block_verification_logits as logits_module

pytestmark = [
    # NaN/inf rows are intended (they follow the reference); the interpreter's numpy warns
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

INF, NAN = float("inf"), float("nan")
FORCED = dict(block_v=16, min_tiles=1, max_tiles=1)  # V = 40: 3 splits of one 16-wide tile
TWO_TILES = dict(block_v=16, min_tiles=2, max_tiles=2)  # V = 40: 2 splits of two tiles


def make_probs(seed: int, batch: int = 4, g: int = 3, vocab: int = 40, dtype=torch.float32):
    """Peaked target rows and nearby draft rows (so drafts are often kept), drafts sampled from q."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * 2.5
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :g] + torch.randn(batch, g, vocab, generator=gen), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g) if g else \
        torch.zeros(batch, 0, dtype=torch.int64)
    return p.to(dtype), q.to(dtype), drafts, gen


def randomness(mode: str, batch: int, g: int, gen) -> dict:
    if mode == "uniforms":
        return dict(uniforms=torch.rand(batch, g + 1, generator=gen, dtype=torch.float64))
    if mode == "seed":
        return dict(seed=1234)
    return dict(seed=torch.randint(0, 2**62, (batch,), generator=gen),
                offsets=torch.randint(0, 2**40, (batch,), generator=gen))


def assert_same(got, want, vocab):
    (out, acc), (want_out, want_acc) = got, want
    assert torch.equal(acc, want_acc), (acc.tolist(), want_acc.tolist())
    assert torch.equal(out, want_out), (out.tolist(), want_out.tolist())
    final = out.gather(1, acc.unsqueeze(1))
    assert bool(((final >= 0) & (final < vocab)).all())


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("block_verify", "block_verify_logits")))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


# ------------------------------------------------------------------ block_verify (probs)


@pytest.mark.parametrize("plan", [FORCED, TWO_TILES, dict(block_v=16, min_tiles=1, target_programs=10**6)],
                         ids=["3-splits", "2-splits-of-2", "most-splits"])
def test_probs_every_split_plan_matches(plan):
    p, q, drafts, gen = make_probs(2, batch=3, g=2)
    for mode in ("uniforms", "row-seeds"):
        kwargs = randomness(mode, 3, 2, gen)
        kwargs["num_draft_tokens"] = torch.tensor([2, 1, 2])
        want = reference.block_verify(p, q, drafts, **kwargs)
        assert_same(probs_module._launch(p, q, drafts, **kwargs, **plan), want, 40)


def test_probs_hostile_rows_split_v():
    """The catalog's hostile rows (the default plan there, every dtype) through three splits of one tile."""
    p, q, drafts = hostile_block_probs(torch.float32, torch.device("cpu"))
    kwargs = dict(seed=7, num_draft_tokens=torch.tensor([3, 3, 2, 3, 1]))
    assert_same(probs_module._launch(p, q, drafts, **kwargs, **FORCED), reference.block_verify(p, q, drafts, **kwargs),
                40)


def test_the_cases_exercise_the_rescue():
    """Sanity of the data above: over a few of these batches block verification keeps more
    than the first-failure prefix somewhere (a later eta_i < h_i after an earlier failure),
    and the Triton kernel agrees on those rows."""
    rescued = 0
    for seed in range(3):
        p, q, drafts, gen = make_probs(10 + seed, batch=8, g=3)
        uniforms = torch.rand(8, 4, generator=gen, dtype=torch.float64)
        exists = torch.ones(8, 3, dtype=torch.bool)
        p_cum = spec.prefix_ratios(p, q, drafts, exists)
        h = spec.acceptance_thresholds(p_cum, spec.residual_masses(p_cum, p, q), exists.sum(1))
        passed = uniforms[:, :3] < h
        first_fail = (~passed).int().argmax(1)  # first failing threshold (0 when all pass: unused)
        got = ops.block_verify(p, q, drafts, uniforms=uniforms, backend="triton")
        assert_same(got, reference.block_verify(p, q, drafts, uniforms=uniforms), 40)
        rescued += int(((~passed).any(1) & (got[1] > first_fail)).sum())
    assert rescued > 0


# ------------------------------------------------------------------ block_verify_logits

def make_logits(seed: int, batch: int = 4, g: int = 3, vocab: int = 40, dtype=torch.float32, temperature=0.8):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, g + 1, vocab, generator=gen) * 2.5
    draft = target[:, :g] + torch.randn(batch, g, vocab, generator=gen)
    temp = temperature.view(-1, 1, 1) if isinstance(temperature, torch.Tensor) else temperature
    q = torch.softmax(draft / temp, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    return target.to(dtype), draft.to(dtype), drafts, gen


def test_logits_forced_splits_hostile_rows_and_g0():
    """Both launches split (3 statistics chunks, 3 block chunks); a NaN row, a +inf logit, an
    all -inf row, identical target and draft rows (an exactly empty residual), a -1 draft."""
    target, draft, drafts, gen = make_logits(8, batch=3, g=2)
    target[0, 1, 4] = NAN
    draft[1, 0, 9] = INF
    target[2, 2] = -INF
    draft[2, 0] = target[2, 0]
    drafts[1, 1] = -1
    forced = dict(stats_block_v=16, tiles_per_program=1, **FORCED)
    for kwargs in (randomness("uniforms", 3, 2, gen), dict(seed=3, num_draft_tokens=torch.tensor([2, 2, 1]))):
        got = logits_module._launch(target, draft, drafts, temperature=0.7, **kwargs, **forced)
        assert_same(got, reference.block_verify_logits(target, draft, drafts, temperature=0.7, **kwargs), 40)
    target, draft, drafts, gen = make_logits(9, batch=2, g=0)
    got = ops.block_verify_logits(target, draft, drafts, temperature=1.3, seed=4, backend="triton")
    assert_same(got, reference.block_verify_logits(target, draft, drafts, temperature=1.3, seed=4), 40)


# ------------------------------------------------------------------ launches, plans, workspace

@pytest.fixture
def launched(monkeypatch):
    """Names of the Triton kernels launched, and the ticket counters handed out."""
    names, counters = [], []
    kernel_class = type(probs_module._block_verify_kernel)
    original = kernel_class.run

    def counting_run(self, *args, **kwargs):
        names.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    def spy(device, count):
        taken = _workspace.zeroed_counters(device, count)
        counters.append(taken)
        return taken

    monkeypatch.setattr(kernel_class, "run", counting_run)
    monkeypatch.setattr(probs_module, "zeroed_counters", spy)
    return names, counters


def test_launch_counts_and_counters_handed_back(launched):
    names, counters = launched
    p, q, drafts, gen = make_probs(11, batch=2, g=2)
    first = probs_module._launch(p, q, drafts, seed=5, **FORCED)
    assert names == ["_block_verify_kernel"]
    again = probs_module._launch(p, q, drafts, seed=5, **FORCED)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    target, draft, drafts, gen = make_logits(12, batch=2, g=2)
    ops.block_verify_logits(target, draft, drafts, seed=5, backend="triton")
    assert names[2:] == ["_softmax_stats_kernel", "_block_verify_kernel"]  # statistics, then the block kernel
    assert len(counters) == 3 and all(int(c.count_nonzero()) == 0 and c.dtype == torch.int32 for c in counters)


@pytest.mark.parametrize("batch, g, vocab", [(1, 4, 151936), (8, 4, 32000), (64, 7, 151936), (1, 0, 128256),
                                             (512, 15, 32000), (4, 3, 2**24)])
def test_split_plans(batch, g, vocab):
    """Plans at serving shapes: every split owns a tile, chunks stay within MAX_TILES, the
    split count fits BLOCK_S (sized for B = 1, g = 0) and grid y, small B * (g + 1) spreads
    over about TARGET_PROGRAMS programs, and the workspace is
    16 * B * (g + 1) * splits bytes of int64 chunk totals (+ 4 B of tickets)."""
    rows = batch * (g + 1)
    block_v, tiles, splits = _split_plans.sampling_plan(rows, vocab)
    most = _split_plans.most_sampling_splits(vocab)
    num_tiles = -(-vocab // block_v)
    assert (splits - 1) * tiles < num_tiles <= splits * tiles  # every split owns at least one tile
    assert tiles <= _split_plans.MAX_TILES and splits <= most < 65535
    workspace = rows * splits * 2 * 8
    expected = {(1, 4, 151936): (3, 50, 4000),  # 250 programs of 3 tiles; 4 KB of chunk totals
                (64, 7, 151936): (8, 19, 155648)}  # 9728 programs of 8 tiles; 152 KB
    if (batch, g, vocab) in expected:
        assert (tiles, splits, workspace) == expected[(batch, g, vocab)]


def test_launch_limits():
    assert probs_module.launch_limits(dict(B=2**20, G=2047)) is not None  # B * (g + 1) = 2^31
    assert probs_module.launch_limits(dict(B=10**6, G=8)) is None
    assert logits_module.launch_limits(dict(B=2**20, G=1024)) is not None  # B * (2g + 1) > 2^31 - 1
    assert logits_module.launch_limits(dict(B=10**6, G=8)) is None


def test_negative_uniforms_past_validation_keep_the_contract():
    """A GPU call cannot inspect caller uniforms: a negative coin must not keep a slot past n_b
    or a -1 / out-of-range draft (h = 0 there). The kernel keeps num_accepted <= n_b and the
    kept prefix valid; elsewhere it equals the reference."""
    p, q, drafts, gen = make_probs(13, batch=3, g=3)
    drafts[1, 0] = -1
    drafts[2, 1] = 40 + 5
    uniforms = torch.tensor([[0.9, -0.25, 0.5, 0.3], [-0.25, 0.9, 0.9, 0.3], [0.99, -0.5, -0.5, 0.3]],
                            dtype=torch.float64)
    counts = torch.tensor([1, 3, 3])
    out, accepted = probs_module.block_verify(p, q, drafts, uniforms=uniforms, num_draft_tokens=counts)
    assert accepted.tolist()[0] <= 1 and accepted.tolist()[1] == 0 and accepted.tolist()[2] <= 1
    final = out.gather(1, accepted.unsqueeze(1))
    assert bool(((final >= 0) & (final < 40)).all())
    valid = torch.tensor([[0.9, 0.5, 0.5, 0.3], [0.9, 0.9, 0.9, 0.3], [0.99, 0.5, 0.5, 0.3]], dtype=torch.float64)
    assert_same(probs_module.block_verify(p, q, drafts, uniforms=valid, num_draft_tokens=counts),
                reference.block_verify(p, q, drafts, uniforms=valid, num_draft_tokens=counts), 40)
