"""The Triton tree_rejection_sample with siblings="without_replacement" against the torch
reference, bit for bit (TRITON_INTERPRET=1 on the CPU, see conftest.py; shapes stay small).

The kernel cases come from the case catalog (specdec_kernels/selftest/cases_tree_verify.py, the "tiny"
tier, the cases named "sampled siblings"): trees where each node's children really are draws
without replacement from that node's draft row, coins skewed high so that several siblings get
rejected, plus the siblings the rule skips (repeated tokens, zero draft weight, -1 padding), NaN /
inf / zero rows, every randomness mode, int32 and strided index tensors, a V spread over several
tiles, and max_depth cuts. What the catalog cannot express stays here: that those cases really
reject siblings (on the reference), and that single children reproduce the independent kernel.
"""

import pytest
import torch
from catalog_support import catalog_cases, check_case

from specdec_kernels import ops
from specdec_kernels.selftest.cases_tree_verify import tree_verify_cases

from test_triton_tree_verify import check_outputs

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

WR = "without_replacement"


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("tree_rejection_sample",),
                                               where=lambda case: "sampled siblings" in case.name))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


def _reference_answers(prefix):
    cases = [c for c in tree_verify_cases("tiny", torch.device("cpu")) if c.name.startswith(prefix)]
    assert cases, prefix
    return [c.run(c.build(0), "torch") for c in cases]


def test_the_catalog_cases_reject_siblings():
    """The random sampled trees reject a first child somewhere; the 7-sibling star rejects more
    than three siblings in some row (a later one accepted, or none of the 7)."""
    assert any(bool((nodes[:, 1] > 0).any()) for _, _, nodes in _reference_answers("sampled siblings B=4"))
    assert any(bool(((nodes[:, 1] > 3) | (nodes[:, 1] == -1)).any())
               for _, _, nodes in _reference_answers("sampled siblings: 7 and 3"))


def high_coins(batch, n, gen, dtype=torch.float64):
    return (torch.rand(batch, n, generator=gen, dtype=torch.float64) ** 0.25).to(dtype)


def test_single_children_reproduce_the_independent_kernel():
    """A chain-shaped tree: the without-replacement kernel gives the independent one's outputs
    (with the draft rows moved from the parent to the child)."""
    gen = torch.Generator().manual_seed(5)
    batch, n, vocab = 4, 5, 29
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, -1)
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, -1)
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    parents = torch.arange(-1, n - 1).expand(batch, n)
    for kwargs in (dict(uniforms=high_coins(batch, n, gen)), dict(seed=3)):
        got = ops.tree_rejection_sample(target, draft, tokens, parents, backend="triton", siblings=WR, **kwargs)
        want = ops.tree_rejection_sample(target, torch.roll(draft, 1, 1), tokens, parents, backend="triton",
                                         **kwargs)
        check_outputs(got, want, vocab)
