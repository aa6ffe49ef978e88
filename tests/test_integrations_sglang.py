"""specdec_kernels.integrations.sglang: SGLang's tree kernels with SGLang's layout, on our ops.

Ported facts (our own code and data, the assertions of SGLang's kernel tests):
- sgl-kernel tests/speculative/test_eagle_utils.py::test_verify_tree_greedy: the two-row tree's
  exact predicts / accept_index / accept_token_num.
- sgl-kernel tests/speculative/test_speculative_sampling.py, at the thresholds the adapter runs (1, 1):
  test_tree_speculative_sampling_target_only (near one-hot targets, any coins: exact outputs); the
  rejection-mask tests (a rejected token never comes back as the new token; a near one-hot chain
  accepts every draft); the k-ary / star / random-shape grids (logit scales 0 to 10; root-only and
  one-node trees; `deterministic` True and False give the same outputs) are checked here against a
  plain model of SGLang's kernel (tests/sglang_support.py). Lower thresholds (SGLang's lossy rule,
  restated in tests/sglang_rule.py) are refused: a test shows why (lossy).
Plus: chi-square tests of the threshold-1 path (target-only and real draft probabilities), the
positional parameters pinned to sgl-kernel's (TRACKS), and one test per difference listed in
docs/flashinfer-sglang.md (each named after its difference).
"""

import inspect

import pytest
import torch
from scipy import stats
from torch.utils._python_dispatch import TorchDispatchMode

from specdec_kernels import ops
from specdec_kernels.integrations import sglang as sg
from specdec_kernels.integrations import sglang_layout
from specdec_kernels.common import sampling
from sglang_support import (distinct_sibling_tokens, kary_children, outputs, random_children, sglang_example,
                                  sglang_greedy_model, sglang_sampling_model, star_children, tree_tensors)
from gpu_support import backends_here
import sglang_rule


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


BACKENDS = backends_here("tree_rejection_sample")


def moved(backend, tensors):
    """The torch backend runs on CPU tensors, the others on DEVICE's."""
    device = torch.device("cpu") if backend == "torch" else DEVICE
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


def sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, steps, draft=None, *,
           backend="torch", out_dtype=torch.int32, **thresholds):
    out = moved(backend, outputs(*candidates.shape, steps, out_dtype))
    *inputs, draft = moved(backend, (candidates, retrive_index, next_token, next_sibling, coins, final, probs, draft))
    sg.tree_speculative_sampling_target_only(*out, *inputs, draft_probs=draft, backend=backend, **thresholds)
    return [t.tolist() for t in out]


def lossy_sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, steps, *,
                 threshold_single, threshold_acc):
    """SGLang's rule at any thresholds (tests/sglang_rule.py), written back in SGLang's layout as `sample`."""
    out = outputs(*candidates.shape, steps)
    tree = sglang_layout.Tree(next_token, next_sibling, steps - 1)
    path, num, emitted = sglang_rule.threshold_rule(tree, candidates, probs, None, coins, final, threshold_single,
                                                    threshold_acc, steps, "torch")
    sglang_layout.write_back(*out, retrive_index, path, num, emitted)
    return [t.tolist() for t in out]


def greedy(candidates, retrive_index, next_token, next_sibling, target, steps, *, backend="torch",
           out_dtype=torch.int32, slots=None):
    out = moved(backend, outputs(*candidates.shape, steps, out_dtype, slots))
    sg.verify_tree_greedy(*out, *moved(backend, (candidates, retrive_index, next_token, next_sibling, target)),
                          backend=backend)
    return [t.cpu() for t in out]


def model(candidates, retrive_index, next_token, next_sibling, coins, final, probs, steps, draft=None, **thresholds):
    out = sglang_sampling_model(*outputs(*candidates.shape, steps), candidates, retrive_index, next_token,
                                next_sibling, coins, final, probs, draft, **thresholds)
    return [t.tolist() for t in out[:3]]


# ----------------------------------------------------------------------------- ported examples


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_sglang_example(backend):
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    predicts, accept_index, accept_token_num = greedy(candidates, retrive_index, next_token, next_sibling,
                                                      logits.argmax(-1), 4, backend=backend)
    assert predicts.tolist() == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
    assert accept_index.tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]]
    assert accept_token_num.tolist() == [3, 2]
    assert (predicts.dtype, accept_index.dtype, accept_token_num.dtype) == (torch.int32,) * 3


EXAMPLE_EXPECTED = ([3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_sglang_example(backend):
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    probs = torch.softmax(logits / 0.01, -1)  # SGLang's test: temperature 0.01, near one-hot
    gen = torch.Generator().manual_seed(0)
    for _ in range(3 if backend == "torch" else 1):  # any coins give the same outputs
        coins, final = torch.rand(2, 6, generator=gen), torch.rand(2, generator=gen)
        got = sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, 4,
                     torch.zeros_like(probs), backend=backend, deterministic=True)
        assert tuple(got) == EXAMPLE_EXPECTED


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejected_token_never_returns_as_the_new_token(backend):
    # chain root -> 3 -> 5; the root accepts 3 (p 0.95), node 1 rejects 5 (p 0.9, coin 0.99); the
    # final coin 0.5 would pick 5 from p, but 5 is masked: the only token left is 31
    candidates = torch.tensor([[0, 3, 5]])
    retrive_index, next_token, next_sibling = tree_tensors([[[1], [2], []]], 3)
    probs = torch.zeros(1, 3, 32)
    probs[0, 0, 0], probs[0, 0, 3], probs[0, 1, 5], probs[0, 1, 31], probs[0, 2, 0] = 0.05, 0.95, 0.9, 0.1, 1.0
    predicts, _, accept_token_num = sample(candidates, retrive_index, next_token, next_sibling,
                                           torch.tensor([[0.0, 0.99, 0.0]]), torch.tensor([0.5]), probs, 3,
                                           backend=backend)
    assert predicts[0] == 3 and predicts[1] == 31 and accept_token_num == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_near_one_hot_chain_accepts_every_draft(backend):
    candidates = torch.tensor([[0, 3, 5, 7], [0, 4, 6, 8]])
    retrive_index, next_token, next_sibling = tree_tensors([[[1], [2], [3], []]] * 2, 4)
    logits = torch.full((2, 4, 16), -10.0)
    for b in range(2):
        for i in range(3):
            logits[b, i, candidates[b, i + 1]] = 10.0
    probs = torch.softmax(logits, -1)
    gen = torch.Generator().manual_seed(1)
    predicts, accept_index, accept_token_num = sample(candidates, retrive_index, next_token, next_sibling,
                                                      torch.rand(2, 4, generator=gen), torch.rand(2, generator=gen),
                                                      probs, 3, backend=backend)
    assert accept_index == [[0, 1, 2], [4, 5, 6]] and accept_token_num == [2, 2]
    assert predicts[:3] == [3, 5, 7] and predicts[4:7] == [4, 6, 8]  # the bonus after node 2: the target's 7 / 8


# ----------------------------------------------------------------------------- SGLang's rule on random trees


def random_case(kind, batch, n, vocab, k, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    if kind == "kary":
        children = [kary_children(n, k)] * batch
    elif kind == "star":
        children = [star_children(n, k)] * batch
    else:
        children = [random_children(n, k, gen) for _ in range(batch)]
    retrive_index, next_token, next_sibling = tree_tensors(children, n)
    candidates = distinct_sibling_tokens(children, n, vocab, gen)
    probs = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * scale, -1)
    return (candidates, retrive_index, next_token, next_sibling, torch.rand(batch, n, generator=gen),
            torch.rand(batch, generator=gen), probs)


SHAPES = [("kary", 1, 8, 16, 1), ("kary", 4, 16, 64, 4), ("kary", 2, 12, 32, 2), ("star", 2, 9, 31, 4),
          ("random", 1, 1, 7, 2), ("random", 1, 2, 7, 1), ("random", 1, 3, 11, 3), ("random", 3, 9, 31, 3),
          ("random", 4, 12, 24, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_sampling_follows_sglangs_rule_torch(shape):
    kind, batch, n, vocab, k = shape
    for scale in (0.0, 4.0, 10.0):
        for seed in (0, 7):
            case = random_case(kind, batch, n, vocab, k, scale, seed)
            for steps in {n, max(1, n // 2)}:
                expected = model(*case, steps)
                for deterministic in (True, False):
                    got = sample(*case, steps, deterministic=deterministic)
                    assert got == expected, (shape, scale, seed, steps)


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton not runnable here")
def test_sampling_follows_sglangs_rule_triton():
    for shape, seed in ((("random", 3, 9, 17, 3), 3), (("kary", 2, 7, 16, 2), 4)):
        case = random_case(*shape, 4.0, seed)
        assert sample(*case, 4, backend="triton") == model(*case, 4)


def test_threshold_one_our_op_equals_sglangs_walk():
    """At (1, 1) the call runs our op with converted coins; a plain walk of SGLang's rule in SGLang's
    order of tests (tests/sglang_rule.py) at (1, 1) gives the same path and tokens."""
    for seed in range(6):
        candidates, retrive_index, next_token, next_sibling, coins, final, probs = random_case(
            "random", 4, 10, 12, 3, 1.0 + seed, seed)
        tree = sglang_layout.Tree(next_token, next_sibling, 4)
        by_op = sglang_layout.sample_with_op(tree, candidates, probs, None, coins, final, 5, "torch")
        by_walk = sglang_rule.threshold_rule(tree, candidates, probs, None, coins, final, 1.0, 1.0, 5, "torch")
        num = by_op[1]
        assert torch.equal(num, by_walk[1])
        on_path = torch.arange(5) <= num.unsqueeze(1)
        for a, b in zip(by_op[::2], by_walk[::2]):
            assert torch.equal(torch.where(on_path, a, -1), torch.where(on_path, b, -1)), seed


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_follows_sglangs_rule_on_random_trees(backend):
    gen = torch.Generator().manual_seed(5)
    for trial in range(12 if backend == "torch" else 2):
        batch, n, vocab = 3, int(torch.randint(1, 12, (1,), generator=gen)), 5  # small vocab: repeated tokens
        children = [random_children(n, 3, gen) for _ in range(batch)]
        retrive_index, next_token, next_sibling = tree_tensors(children, n)
        candidates = torch.randint(vocab, (batch, n), generator=gen)
        target = torch.randint(vocab, (batch, n), generator=gen)
        for steps in (1, 3, n + 1):
            expected = sglang_greedy_model(*outputs(batch, n, steps), candidates, retrive_index, next_token,
                                           next_sibling, target)
            got = greedy(candidates, retrive_index, next_token, next_sibling, target, steps, backend=backend)
            for a, b in zip(got, expected):
                assert torch.equal(a, b), (trial, steps)


# ----------------------------------------------------------------------------- distributions


def two_token_frequencies(predicts, accept_index, accept_token_num, vocab):
    """Counts of (first token, second token or `vocab` for none) over the rows."""
    predicts, accept_index = torch.tensor(predicts), torch.tensor(accept_index)
    first = predicts[accept_index[:, 0]].long()
    second = torch.where(torch.tensor(accept_token_num) >= 1, predicts[accept_index[:, 1].clamp(min=0)].long(), vocab)
    return torch.bincount(first * (vocab + 1) + second, minlength=vocab * (vocab + 1)).double()


def chi_square_p(counts, expected_probs):
    keep = expected_probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was emitted"
    expected = expected_probs[keep] / expected_probs[keep].sum() * counts.sum()
    return stats.chisquare(counts[keep].numpy(), expected.numpy()).pvalue


def target_only_tree(rows):
    """root's list: node 3 (token 1), node 1 (token 4), node 4 (token 0); node 3 -> [2 (token 2), 5 (token 4)]."""
    children = [[3, 1, 4], [], [], [2, 5], [], []]
    retrive_index, next_token, next_sibling = tree_tensors([children] * rows, 6)
    candidates = torch.tensor([[0, 4, 2, 1, 0, 4]] * rows)
    return candidates, retrive_index, next_token, next_sibling


def joint_two_tokens(p, candidates):
    """P(first, second) of the target: second = `vocab` (none) when first is no child of the root."""
    vocab = p.shape[-1]
    node_of = {int(candidates[0, c]): c for c in (3, 1, 4)}
    joint = torch.zeros(vocab, vocab + 1, dtype=torch.float64)
    for x in range(vocab):
        if x in node_of:
            joint[x, :vocab] = p[0, x].double() * p[node_of[x]].double()
        else:
            joint[x, vocab] = p[0, x].double()
    return joint.reshape(-1)


def test_threshold_one_emits_the_target_distribution_chi_square():
    rows, vocab = 20000, 6
    gen = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(6, vocab, generator=gen) * 1.5, -1)
    candidates, retrive_index, next_token, next_sibling = target_only_tree(rows)
    probs = p.expand(rows, 6, vocab).contiguous()
    coins, final = torch.rand(rows, 6, generator=gen), torch.rand(rows, generator=gen)
    expected = joint_two_tokens(p, candidates)
    counts = two_token_frequencies(*sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, 3,
                                           torch.zeros_like(probs)), vocab)
    assert chi_square_p(counts, expected) > 1e-3
    # the same test has the power to see SGLang's rule below threshold 1 (which the adapter refuses)
    lossy = two_token_frequencies(*lossy_sample(candidates, retrive_index, next_token, next_sibling, coins, final,
                                                probs, 3, threshold_single=0.5, threshold_acc=0.5), vocab)
    assert chi_square_p(lossy, expected) < 1e-9


def test_real_draft_probabilities_emit_the_target_distribution_chi_square():
    """Beyond SGLang: three siblings drawn i.i.d. from q (repeats allowed), verified with q."""
    rows, vocab = 20000, 5
    gen = torch.Generator().manual_seed(12)
    p = torch.softmax(torch.randn(4, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(4, vocab, generator=gen), -1)
    retrive_index, next_token, next_sibling = tree_tensors([star_children(4, 3)] * rows, 4)
    candidates = torch.zeros(rows, 4, dtype=torch.int64)
    candidates[:, 1:] = torch.multinomial(q[0], rows * 3, replacement=True, generator=gen).view(rows, 3)
    probs, draft = p.expand(rows, 4, vocab).contiguous(), q.expand(rows, 4, vocab).contiguous()
    out = sample(candidates, retrive_index, next_token, next_sibling, torch.rand(rows, 4, generator=gen),
                 torch.rand(rows, generator=gen), probs, 2, draft)
    first = torch.tensor(out[0])[torch.tensor(out[1])[:, 0]].long()
    assert chi_square_p(torch.bincount(first, minlength=vocab).double(), p[0].double()) > 1e-3


def test_lower_thresholds_are_lossy_and_refused():
    """(0, 0) accepts every first child whatever its probability (SGLang's lossy rule): here the
    target puts all its mass on token 5, which no child carries, yet token 1 would come out first.
    The adapter refuses such thresholds; at (1, 1) token 5 comes out."""
    candidates, retrive_index, next_token, next_sibling = target_only_tree(4)
    probs = torch.full((4, 6, 6), 1 / 6)
    probs[:, 0] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    case = (candidates, retrive_index, next_token, next_sibling, torch.rand(4, 6), torch.rand(4), probs, 3)
    predicts, accept_index, accept_token_num = lossy_sample(*case, threshold_single=0.0, threshold_acc=0.0)
    assert [predicts[row[0]] for row in accept_index] == [1] * 4 and accept_token_num == [2] * 4
    for thresholds in (dict(threshold_single=0.0, threshold_acc=0.0), dict(threshold_acc=0.9)):
        with pytest.raises(ValueError, match="lossy rule, which this adapter does not run"):
            sample(*case, **thresholds)
    exact = sample(*case)
    assert [exact[0][row[0]] for row in exact[1]] == [5] * 4 and exact[2] == [0] * 4


# ----------------------------------------------------------------------------- the documented differences


def root_with_children(tokens, probs_row, coin, final=0.5, steps=2, vocab=8):
    """One row: the root's children carry `tokens` in list order; returns (ours, SGLang's model)."""
    n = len(tokens) + 1
    retrive_index, next_token, next_sibling = tree_tensors([star_children(n, n)], n)
    candidates = torch.tensor([[0, *tokens]])
    probs = torch.full((1, n, vocab), 1 / vocab)
    probs[0, 0] = torch.tensor(probs_row)
    coins = torch.full((1, n), 0.5)
    coins[0, 0] = coin
    case = (candidates, retrive_index, next_token, next_sibling, coins, torch.tensor([final]), probs, steps)
    return sample(*case), model(*case)


def test_boundaries_zero_probability_and_ties():
    # coin 0, first sibling of target probability 0: SGLang accepts it (0 <= 0, sglang #35771), ours never
    ours, sglang = root_with_children([3, 5], [0, 0, 0, 0, 0, 1.0, 0, 0], coin=0.0)
    assert sglang[1][0][1] == 1 and sglang[0][0] == 3  # SGLang: node 1, token 3 of probability 0
    assert ours[1][0][1] == 2 and ours[0][0] == 5  # ours: node 2, token 5
    # a coin exactly on the cumulative boundary: SGLang's <= accepts, our < rejects
    ours, sglang = root_with_children([3, 5], [0, 0, 0, 0.5, 0, 0.5, 0, 0], coin=0.5)
    assert sglang[0][0] == 3 and ours[0][0] == 5
    # off the boundary both agree
    ours, sglang = root_with_children([3, 5], [0, 0, 0, 0.5, 0, 0.5, 0, 0], coin=0.49)
    assert ours == sglang


def test_duplicate_sibling_tokens_are_not_accepted_twice():
    row = [0.1, 0, 0, 0.5, 0, 0.4, 0, 0]
    ours, sglang = root_with_children([3, 3], row, coin=0.7, final=0.1)
    assert sglang[2] == [1] and sglang[1][0][1] == 2  # SGLang accepts the repeated 3 (0.7 <= 0.5 + 0.5)
    assert ours[2] == [0] and ours[0][0] == 0  # ours: both rejected, new token from p without 3 (0.1 -> token 0)


def test_draft_probs_are_read_only():
    candidates, retrive_index, next_token, next_sibling, coins, final, probs = random_case("kary", 2, 7, 9, 3, 2.0, 1)
    coins = torch.full_like(coins, 0.999)  # every sibling rejected
    draft = torch.zeros_like(probs)
    sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, 3, draft)
    assert not draft.any()
    *_, written = sglang_sampling_model(*outputs(2, 7, 3), candidates, retrive_index, next_token, next_sibling, coins,
                                        final, probs, draft)
    assert written.any()  # SGLang's kernel writes p(x) of the rejected siblings into draft_probs


def test_real_draft_probabilities_per_row():
    case = random_case("random", 3, 8, 10, 3, 2.0, 2)
    candidates, retrive_index, next_token, next_sibling, coins, final, probs = case
    draft = torch.zeros_like(probs)
    draft[1] = torch.softmax(torch.randn(8, 10, generator=torch.Generator().manual_seed(0)), -1)
    mixed = sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, 4, draft)
    target_only = sample(candidates, retrive_index, next_token, next_sibling, coins, final, probs, 4)
    for b in (0, 2):  # the all-zero rows stay target-only
        assert mixed[0][8 * b:8 * b + 8] == target_only[0][8 * b:8 * b + 8]
        assert mixed[1][b] == target_only[1][b] and mixed[2][b] == target_only[2][b]
    # row 1 ran our op with q: the same as calling the op directly in our layout
    tree = sglang_layout.Tree(next_token[1:2], next_sibling[1:2], 3)
    row = dict(tree=tree, tokens=candidates[1:2], target_probs=probs[1:2], draft_probs=draft[1:2],
               uniform_samples=coins[1:2], final_coins=final[1:2], steps=4, backend="torch")
    _, num, _ = sglang_layout.sample_with_op(**row)
    assert mixed[2][1] == int(num)
    inverse = tree.inverse
    q_ours = draft[1:2][:, tree.parent.clamp(min=0).gather(1, inverse)[0]]
    uniforms = coins[1:2].double().gather(1, inverse)
    uniforms[:, 0] = final[1]
    tokens = torch.where(tree.parents >= 0, candidates[1:2].gather(1, inverse), -1)
    _, num_direct, _ = ops.tree_rejection_sample(probs[1:2][:, inverse[0]], q_ours, tokens, tree.parents,
                                                 uniforms=uniforms, max_depth=3, backend="torch")
    assert torch.equal(num, num_direct)


def test_empty_residual_draws_from_p():
    # a row summing to 0.5, all on the only child's token: rejected (coin 0.7), nothing left
    row = [0, 0, 0, 0.5, 0, 0, 0, 0]
    retrive_index, next_token, next_sibling = tree_tensors([star_children(2, 1)], 2)
    probs = torch.zeros(1, 2, 8)
    probs[0, 0] = torch.tensor(row)
    case = (torch.tensor([[0, 3]]), retrive_index, next_token, next_sibling, torch.tensor([[0.7, 0.1]]),
            torch.tensor([0.3]), probs, 2)
    assert model(*case)[0][0] == 7  # SGLang: token V - 1
    assert sample(*case)[0][0] == 3  # ours: a draw from p


def test_greedy_reads_target_predict_by_node():
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    target = logits.argmax(-1)
    shifted = retrive_index + 3  # slots of a larger predicts buffer: SGLang would read target_predict at b*N+i+3
    got = outputs(2, 6, 4, slots=15)
    sg.verify_tree_greedy(*got, candidates, shifted, next_token, next_sibling, target)
    canonical = outputs(2, 6, 4)
    sg.verify_tree_greedy(*canonical, candidates, retrive_index, next_token, next_sibling, target)
    assert got[0][3:].tolist() == canonical[0].tolist() and got[0][:3].tolist() == [-1] * 3
    assert torch.equal(got[1], canonical[1] + torch.where(canonical[1] >= 0, 3, 0))
    assert torch.equal(got[2], canonical[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_and_probability_dtypes(backend):
    case = random_case("random", 2, 7, 11, 3, 3.0, 9)
    reference = sample(*case, 4, backend=backend)
    as_int32 = [t.to(torch.int32) for t in case[:4]] + list(case[4:])
    assert sample(*as_int32, 4, backend=backend, out_dtype=torch.int64) == reference
    half = case[6].to(torch.bfloat16)
    assert sample(*case[:6], half, 4, backend=backend) == sample(*case[:6], half.float(), 4, backend=backend)
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    got = greedy(candidates.int(), retrive_index.int(), next_token.int(), next_sibling.int(), logits.argmax(-1).int(),
                 4, backend=backend, out_dtype=torch.int64)
    assert got[1].tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]]


def test_deterministic_is_ignored():
    case = random_case("kary", 3, 10, 13, 3, 2.0, 4)
    assert sample(*case, 4, deterministic=False) == sample(*case, 4, deterministic=True)


BAD = {
    "link out of range": (dict(next_token=lambda t: t.index_fill(1, torch.tensor([2]), 9)), "is not a node in [0, 6)"),
    "link to the root": (dict(next_sibling=lambda t: t.index_fill(1, torch.tensor([5]), 0)), "links to the root"),
    "node linked twice": (dict(next_sibling=lambda t: t.index_fill(1, torch.tensor([2]), 3)), "linked 2 times"),
    "sibling cycle": (dict(next_sibling=lambda t: t.index_fill(1, torch.tensor([3]), 1)), "linked 2 times"),
    "slot outside predicts": (dict(retrive_index=lambda t: t + 1), "`retrive_index` holds slots outside"),
    "token outside V": (dict(candidates=lambda t: t * 4), "hold ids outside [0, 20)"),
    "coin of 1": (dict(coins=lambda t: torch.ones_like(t)), "`uniform_samples` must lie in [0, 1)"),
    "threshold above 1": (dict(threshold_acc=1.5), "`threshold_acc` must be 1.0, the lossless rule (got 1.5)"),
    "threshold below 1": (dict(threshold_acc=0.5), "select SGLang's lossy rule, which this adapter does not run"),
    "float64 coins": (dict(coins=lambda t: t.double()), "`uniform_samples` must have dtype float32"),
    "wrong shape": (dict(probs=lambda t: t[:, :5]), "`target_probs` must have shape [2, 6, V]"),
    "empty accept_index": (dict(steps=0), "at least one column"),
    "draft_probs a float": (dict(draft=0.5), "`draft_probs` must be a [B, N, V] tensor or None (got float)"),
    # an older sgl-kernel's signature: draft_probs in the place sglang@01fe7c22 gives threshold_single
    "draft_probs by position": (dict(threshold_single=lambda probs: torch.zeros_like(probs)),
                                "`threshold_single` got a tensor: `draft_probs` is keyword-only"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_value_checks_are_one_line_errors(name):
    change, message = BAD[name]
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    args = dict(candidates=candidates, retrive_index=retrive_index, next_token=next_token, next_sibling=next_sibling,
                coins=torch.rand(2, 6), probs=torch.softmax(logits, -1))
    for key, edit in change.items():
        if key in args:
            args[key] = edit(args[key])
    steps = change.get("steps", 4)
    with pytest.raises((ValueError, TypeError)) as error:
        sg.tree_speculative_sampling_target_only(
            *outputs(2, 6, steps), args["candidates"], args["retrive_index"], args["next_token"], args["next_sibling"],
            args["coins"], torch.rand(2), args["probs"],
            change.get("threshold_single", lambda probs: 1.0)(args["probs"]), change.get("threshold_acc", 1.0),
            draft_probs=change.get("draft"))
    text = str(error.value)
    assert message in text and "\n" not in text and text.startswith("sglang.tree_speculative_sampling_target_only: ")


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def test_no_host_sync_when_values_are_not_inspected(monkeypatch):
    """On a GPU the adapter inspects no value: with the value checks off (as there) and our op
    stubbed, the translation and write-back issue no .item() / nonzero (a device-to-host sync)."""
    monkeypatch.setattr(sg.check, "can_inspect", lambda x: False)

    def stub(target, draft, tokens, parents, *, max_depth, **_):
        batch = tokens.shape[0]
        nodes = torch.full((batch, max_depth + 1), -1, dtype=torch.int64)
        nodes[:, 0] = 0
        return nodes.clone(), torch.zeros(batch, dtype=torch.int64), nodes

    monkeypatch.setattr(sg.ops, "tree_rejection_sample", stub)
    monkeypatch.setattr(sg.ops, "tree_greedy_verify", lambda logits, tokens, parents, **kw: stub(None, None, tokens,
                                                                                                  parents, **kw))
    case = random_case("random", 3, 9, 12, 3, 2.0, 0)
    candidates, retrive_index, next_token, next_sibling, coins, final, probs = case
    with _Recorder() as seen:
        sg.tree_speculative_sampling_target_only(*outputs(3, 9, 4), candidates, retrive_index, next_token,
                                                 next_sibling, coins, final, probs, draft_probs=torch.zeros_like(probs))
        sg.verify_tree_greedy(*outputs(3, 9, 4), candidates, retrive_index, next_token, next_sibling, candidates)
    syncs = {name for name in seen.names if "_local_scalar_dense" in name or "nonzero" in name}
    assert not syncs, syncs


# ----------------------------------------------------------------------------- API details


def test_retrieve_spelling_is_accepted_as_keywords():
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    predicts, accept_index, accept_token_num = outputs(2, 6, 4)
    sg.verify_tree_greedy(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
                          candidates=candidates, retrieve_index=retrive_index, retrieve_next_token=next_token,
                          retrieve_next_sibling=next_sibling, target_predict=logits.argmax(-1))
    assert accept_token_num.tolist() == [3, 2]
    with pytest.raises(TypeError, match="not both"):
        sg.verify_tree_greedy(*outputs(2, 6, 4), candidates, retrive_next_token=next_token,
                              retrive_next_sibling=next_sibling, target_predict=logits.argmax(-1),
                              retrive_index=retrive_index, retrieve_index=retrive_index)


def test_untouched_outputs_and_unreachable_nodes():
    """Slots and columns off the accepted path keep the caller's values; nodes that the lists do
    not reach, or deeper than S - 1, are never accepted."""
    candidates, retrive_index, next_token, next_sibling, logits = sglang_example()
    predicts, accept_index = torch.full((12,), 77, dtype=torch.int32), torch.full((2, 4), 66, dtype=torch.int32)
    accept_token_num = torch.zeros(2, dtype=torch.int32)
    cut = next_token.clone()
    cut[0, 3] = -1  # row 0: node 3 keeps its place but loses its child 4 (and 4's child 5)
    sg.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, cut, next_sibling,
                          logits.argmax(-1))
    assert predicts.tolist() == [3, 77, 77, 4, 77, 77, 11, 77, 77, 77, 12, 18]
    assert accept_index.tolist() == [[0, 3, 66, 66], [6, 10, 11, 66]] and accept_token_num.tolist() == [1, 2]


# sgl-kernel's python/sgl_kernel/speculative.py at sglang@01fe7c22 (sglang.TRACKS): each function's parameters
UPSTREAM_PARAMETERS = {
    "verify_tree_greedy": ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index",
                           "retrive_next_token", "retrive_next_sibling", "target_predict"),
    "tree_speculative_sampling_target_only": (
        "predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
        "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
        "threshold_single", "threshold_acc", "deterministic"),
}
UPSTREAM_DEFAULTS = {"threshold_single": 1.0, "threshold_acc": 1.0, "deterministic": True}


@pytest.mark.parametrize("name", list(UPSTREAM_PARAMETERS))
def test_positional_parameters_are_the_tracked_upstreams(name):
    """A call written for sgl-kernel binds every positional argument to the same parameter here, with the
    same defaults; what is ours (draft_probs, backend) is keyword-only."""
    assert "01fe7c22" in sg.TRACKS
    parameters = inspect.signature(inspect.unwrap(getattr(sg, name))).parameters.values()
    positional = tuple(p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert positional == UPSTREAM_PARAMETERS[name]
    assert {p.name: p.default for p in parameters if p.name in UPSTREAM_DEFAULTS} == \
        {k: v for k, v in UPSTREAM_DEFAULTS.items() if k in positional}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters if p.name not in positional)


def test_weight_scale_is_our_ops():
    assert sglang_layout.WEIGHT_SCALE == sampling.WEIGHT_SCALE == 2.0**40


def test_threshold_rule_accepts_by_cumulative_coin_or_single_probability():
    """sglang_rule.threshold_rule, SGLang's lossy rule, on one root with children [3, 5] (p 0.2, 0.5):
    threshold_acc scales the cumulative sums the coin is held to, threshold_single accepts a likely
    sibling whatever the coin; nothing accepted leaves the path at the root."""
    candidates = torch.tensor([[0, 3, 5]])
    next_token, next_sibling = torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 2, -1]])
    probs = torch.full((1, 3, 8), 0.3 / 6)
    probs[0, 0] = torch.tensor([0.1, 0, 0, 0.2, 0, 0.5, 0.2, 0])
    tree = sglang_layout.Tree(next_token, next_sibling, 1)

    def accepted(coin, single, acc):
        coins = torch.tensor([[coin, 0.5, 0.5]])
        path, num, _ = sglang_rule.threshold_rule(tree, candidates, probs, None, coins, torch.tensor([0.5]),
                                                  single, acc, 2, "torch")
        return int(num[0]), int(path[0, 1])

    assert accepted(0.15, 1.0, 1.0) == (1, 1)   # 0.15 <= 0.2: the first sibling
    assert accepted(0.6, 1.0, 1.0) == (1, 2)    # 0.2 < 0.6 <= 0.7: the second
    assert accepted(0.8, 1.0, 1.0) == (0, -1)   # above every cumulative sum: none
    assert accepted(0.8, 1.0, 0.8) == (1, 2)    # 0.8 <= 0.7 / 0.8
    assert accepted(0.8, 0.5, 1.0) == (1, 2)    # p(5) = 0.5 >= threshold_single
