"""Property-based fuzzing of every verification op on every backend this machine runs.

For random shapes, dtypes, ragged rows, padding ids and adversarial rows (NaN, +-inf, all
zero, p == q, one-hot), every backend must return well-formed outputs: emitted ids in
[0, V), -1 padding after the emitted tokens, the accepted prefix equal to the drafts (or
to the tree nodes on a parent-to-child path), num_accepted within the row's drafts; and
the ops with an exact contract must equal the torch reference bit for bit. On the CPU the
triton backend runs under the interpreter (small shapes); on a GPU the cuda backend joins.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_kernels import ops
from gpu_support import backends_here

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# exp/log-based ops may differ from the reference at a decision boundary (see their docs)
BIT_EXACT = {"rejection_sample", "greedy_verify", "relaxed_verify", "tree_greedy_verify", "tree_rejection_sample"}
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def adversarial(scores: torch.Tensor, kinds: list[int], logits: bool) -> torch.Tensor:
    """Overwrite some [V] rows of scores [R, V] with hostile values, one kind per row."""
    scores = scores.clone()
    for row, kind in enumerate(kinds[: scores.shape[0]]):
        if kind == 1:
            scores[row, row % scores.shape[1]] = float("nan")
        elif kind == 2:
            scores[row] = float("-inf") if logits else 0.0
        elif kind == 3:
            scores[row, -1] = float("inf")
        elif kind == 4:  # all mass (or the max) in the last element: the last tile matters
            scores[row] = float("-inf") if logits else 0.0
            scores[row, -1] = 1.0
        elif kind == 5:  # ties everywhere
            scores[row] = 0.5
    return scores


def small_int(gen: torch.Generator, low: int, high: int) -> int:
    return int(torch.randint(low, high + 1, (), generator=gen))


def hostile_kinds(gen: torch.Generator, rows: int) -> list[int]:
    """Row kinds for `adversarial`: about half the rows clean (0), the rest hostile."""
    kinds = torch.randint(1, 6, (rows,), generator=gen)
    return torch.where(torch.rand(rows, generator=gen) < 0.5, 0, kinds).tolist()


# Hypothesis draws a seed and a dtype; the shapes and values come from the seed. Its first
# examples are its simplest, so drawing the shapes themselves would mostly test B=1, g=0.
@st.composite
def chain_case(draw):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, g, vocab = small_int(gen, 1, 4), small_int(gen, 0, 4), small_int(gen, 2, 40)
    ragged = bool(small_int(gen, 0, 1))
    return batch, g, vocab, gen, hostile_kinds(gen, batch * (g + 1)), ragged, draw(st.sampled_from(DTYPES))


def chain_inputs(op: str, batch, g, vocab, gen, kinds, ragged, dtype) -> dict:
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * 2
    # drafts: the argmax, a token of rank 1..3 (the top-beta and tau boundaries), or any id
    ranked = logits[:, :g].argsort(dim=-1, descending=True, stable=True)
    rank = torch.randint(0, min(4, vocab), (batch, g, 1), generator=gen)
    near_top = ranked.gather(-1, rank).squeeze(-1)
    choice = torch.rand(batch, g, generator=gen)
    drafts = torch.where(choice < 0.7, near_top, torch.randint(0, vocab, (batch, g), generator=gen))
    if g:
        drafts[0, -1] = -1  # padding id: always rejected
    counts = torch.randint(0, g + 1, (batch,), generator=gen) if ragged else None
    if op == "max_prob":
        return {"logits": adversarial(logits[:, 0], kinds, True).to(dtype)}
    if op in ("greedy_verify", "relaxed_verify", "bild_verify", "rejection_sample_logits"):
        target = adversarial(logits.reshape(-1, vocab), kinds, True).reshape(logits.shape).to(dtype)
        inputs = {"target_logits": target, "draft_tokens": drafts, "num_draft_tokens": counts}
        if op == "relaxed_verify":
            inputs.update(top_beta=int(torch.randint(1, 4, (), generator=gen)), tau=float(torch.rand((), generator=gen) * 3))
        if op == "bild_verify":
            inputs["rollback_threshold"] = float(torch.rand((), generator=gen) * 5)
        if op == "rejection_sample_logits":
            inputs.update(draft_logits=(logits[:, :g] + torch.randn(batch, g, vocab, generator=gen)).to(dtype),
                          temperature=0.7, seed=int(torch.randint(0, 2**31, (), generator=gen)))
        return inputs
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :g] + torch.randn(batch, g, vocab, generator=gen), -1)
    if g:
        q[0, 0] = p[0, 0]  # p == q: empty residual
    return {"target_probs": adversarial(p.reshape(-1, vocab), kinds, False).reshape(p.shape).to(dtype),
            "draft_probs": q.to(dtype), "draft_tokens": drafts, "num_draft_tokens": counts,
            "uniforms": torch.rand(batch, g + 1, generator=gen)}


def check_chain_outputs(out, num_accepted, inputs, vocab):
    drafts = inputs["draft_tokens"].cpu()
    batch, g = drafts.shape
    counts = inputs.get("num_draft_tokens")
    counts = torch.full((batch,), g) if counts is None else counts.cpu()
    out, num_accepted = out.cpu(), num_accepted.cpu()
    assert out.shape == (batch, g + 1) and out.dtype == torch.int64 and num_accepted.dtype == torch.int64
    for b in range(batch):
        n = int(num_accepted[b])
        assert 0 <= n <= int(counts[b])
        assert torch.equal(out[b, :n], drafts[b, :n])
        assert 0 <= int(out[b, n]) < vocab
        assert bool((out[b, n + 1:] == -1).all())


def to_device(inputs: dict) -> dict:
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def run_all(op: str, inputs: dict) -> dict:
    return {backend: getattr(ops, op)(**inputs, backend=backend) for backend in backends_here(op)}


@pytest.mark.parametrize("op", ["rejection_sample", "rejection_sample_logits", "greedy_verify", "relaxed_verify",
                                "bild_verify"])
@SETTINGS
@given(case=chain_case())
def test_chain_ops_are_well_formed_on_every_backend(op, case):
    vocab = case[2]
    inputs = to_device(chain_inputs(op, *case))
    results = run_all(op, inputs)
    for backend, (out, num_accepted) in results.items():
        check_chain_outputs(out, num_accepted, inputs, vocab)
        if op in BIT_EXACT and backend != "torch":
            assert torch.equal(out, results["torch"][0]), backend
            assert torch.equal(num_accepted, results["torch"][1]), backend


@SETTINGS
@given(case=chain_case())
def test_max_prob_is_a_probability_on_every_backend(case):
    inputs = to_device(chain_inputs("max_prob", *case))
    results = run_all("max_prob", inputs)
    for backend, prob in results.items():
        assert prob.dtype == torch.float32 and bool(((prob >= 0) & (prob <= 1)).all()), backend
        assert torch.allclose(prob, results["torch"], rtol=1e-5, atol=1e-6), backend


@st.composite
def tree_case(draw):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, n, vocab = small_int(gen, 1, 4), small_int(gen, 1, 8), small_int(gen, 2, 30)
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for i in range(1, n):  # parent in [0, i), or -1 (an unused slot) now and then
        parents[:, i] = torch.randint(0, i, (batch,), generator=gen)
        parents[torch.rand(batch, generator=gen) < 0.15, i] = -1
    parents = torch.where(parents >= 0, parents, -1)
    return batch, n, vocab, gen, parents, hostile_kinds(gen, batch * n), draw(st.sampled_from(DTYPES)), small_int(gen, 0, 4)


def valid_parents(parents: torch.Tensor) -> torch.Tensor:
    """A used slot's parent must itself be used (the ops reject a tree that is not)."""
    parents = parents.clone()
    for i in range(1, parents.shape[1]):
        p = parents[:, i]
        dead = (p > 0) & (parents.gather(1, p.clamp(min=0).unsqueeze(1)).squeeze(1) < 0)
        parents[dead, i] = -1
    return parents


def check_tree_outputs(outputs, tokens, parents, vocab, max_depth):
    out, num_accepted, nodes = (t.cpu() for t in outputs)
    batch = tokens.shape[0]
    assert out.shape == (batch, max_depth + 1) and nodes.shape == (batch, max_depth + 1)
    for b in range(batch):
        n = int(num_accepted[b])
        assert 0 <= n <= max_depth and int(nodes[b, 0]) == 0
        for k in range(1, n + 1):  # a parent-to-child path from the root
            node = int(nodes[b, k])
            assert int(parents[b, node]) == int(nodes[b, k - 1]) and node > 0
            assert int(out[b, k - 1]) == int(tokens[b, node])
        assert 0 <= int(out[b, n]) < vocab
        assert bool((out[b, n + 1:] == -1).all()) and bool((nodes[b, n + 1:] == -1).all())


@pytest.mark.parametrize("op", ["tree_greedy_verify", "tree_rejection_sample"])
@SETTINGS
@given(case=tree_case())
def test_tree_ops_are_well_formed_on_every_backend(op, case):
    batch, n, vocab, gen, parents, kinds, dtype, depth_cap = case
    parents = valid_parents(parents)
    logits = torch.randn(batch, n, vocab, generator=gen) * 2
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    parent_top = logits.argmax(-1).gather(1, parents.clamp(min=0))
    tokens = torch.where(torch.rand(batch, n, generator=gen) < 0.5, parent_top, tokens)
    tokens[parents < 0] = -1
    max_depth = min(depth_cap, n - 1)
    if op == "tree_greedy_verify":
        scores = adversarial(logits.reshape(-1, vocab), kinds, True).reshape(logits.shape).to(dtype)
        inputs = {"target_logits": scores}
    else:
        p = adversarial(torch.softmax(logits, -1).reshape(-1, vocab), kinds, False).reshape(logits.shape)
        q = torch.softmax(logits.gather(1, parents.clamp(min=0).unsqueeze(-1).expand(-1, -1, vocab)), -1)
        inputs = {"target_probs": p.to(dtype), "draft_probs": q.to(dtype), "uniforms": torch.rand(batch, n, generator=gen)}
    inputs = to_device({**inputs, "tree_tokens": tokens, "parents": parents, "max_depth": max_depth})
    results = run_all(op, inputs)
    for backend, outputs in results.items():
        check_tree_outputs(outputs, tokens, parents, vocab, max_depth)
        if backend != "torch":
            for got, want in zip(outputs, results["torch"]):
                assert torch.equal(got, want), backend


@pytest.mark.parametrize("bad_u", [1.0, 1.5, float("nan")])
@pytest.mark.parametrize("op", ["rejection_sample", "tree_rejection_sample"])
def test_unvalidated_bad_uniforms_still_draw_inside_the_row(op, bad_u):
    """On a GPU the ops cannot inspect caller uniforms without a sync, so a 1.0 (a float64
    near 1 rounded to float32), a value above 1 or a NaN reaches the kernels. Called past
    the validation here, every backend must still emit ids in [0, V) and agree."""
    from specdec_kernels.common.registry import implementation

    vocab, gen = 24, torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(2, 2, vocab, generator=gen), -1)
    p[1, 0, 5:] = 0  # a row whose last ids have no mass: a threshold of `total` would pass them
    q = torch.softmax(torch.randn(2, 1, vocab, generator=gen), -1)
    u = torch.full((2, 2), bad_u, dtype=torch.float64)
    if op == "rejection_sample":
        args = (p, q, torch.tensor([[3], [4]]))
    else:
        args = (p, torch.cat([q, q], dim=1), torch.tensor([[0, 3], [0, 4]]), torch.tensor([[-1, 0], [-1, 0]]))
    results = {}
    for backend in backends_here(op):
        kwargs = {"uniforms": u.to(DEVICE)} | ({"max_depth": 1} if op.startswith("tree") else {})
        results[backend] = implementation(op, backend)(*(a.to(DEVICE) for a in args), **kwargs)
        tokens = results[backend][0].cpu()
        emitted = tokens[tokens >= 0]
        assert bool(((emitted >= 0) & (emitted < vocab)).all()), (backend, tokens)
        assert int(tokens[1, 0]) < 5 or int(results[backend][1][1]) > 0, backend  # never a zero-mass id
        for got, want in zip(results[backend], results["torch"]):
            assert torch.equal(got.cpu(), want.cpu()), backend
