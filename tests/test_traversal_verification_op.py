"""ops.tree_rejection_sample(verification="traversal"): the option of the op (checked first, run by the
reference on the torch backend, refused by the kernel backends) and its custom op. The rule's law:
test_traversal_verification_law.py; through `generate`: test_sampling_loops.py."""

import pytest
import torch

from specdec_kernels import ops, reference

B, V = 3, 6
PARENTS = [[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, -1], [-1, 0, 0, 0, 1, 4]]  # bushy, a chain with a free slot, mixed
SIBLINGS = ["independent", "without_replacement"]


def tree_inputs(seed: int = 0, dtype=torch.float32):
    """(target_probs [B, 6, V], draft_probs [B, 6, V], tree_tokens [B, 6], parents [B, 6]): drafts drawn from
    the draft rows so that a good share of them is accepted."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(B, 6, V, generator=gen) * 2, -1)
    draft = torch.softmax(torch.log(target) + torch.randn(B, 6, V, generator=gen), -1)
    tokens = torch.multinomial(draft.flatten(0, 1), 1, generator=gen).view(B, 6)
    return target.to(dtype), draft.to(dtype), tokens, torch.tensor(PARENTS)


@pytest.mark.parametrize("siblings", SIBLINGS)
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_the_torch_backend_is_the_reference(siblings, backend):
    target, draft, tokens, parents = tree_inputs()
    uniforms = torch.rand(B, 6, generator=torch.Generator().manual_seed(1))
    randomness = [dict(uniforms=uniforms), dict(seed=11, offsets=torch.tensor([0, 4, 9])),
                  dict(seed=torch.tensor([3, 5, 7]))]
    for given in randomness:
        got = ops.tree_rejection_sample(target, draft, tokens, parents, siblings=siblings, verification="traversal",
                                        backend=backend, **given)
        want = reference.tree_traversal_sample(target, draft, tokens, parents, max_depth=4, siblings=siblings,
                                               **given)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), given


def test_token_stays_the_default_and_traversal_differs_somewhere():
    target, draft, tokens, parents = tree_inputs(seed=2)
    rows = 200
    inputs = [x.repeat(rows, *[1] * (x.dim() - 1)) for x in (target, draft, tokens, parents)]
    default = ops.tree_rejection_sample(*inputs, seed=5)
    token = ops.tree_rejection_sample(*inputs, seed=5, verification="token")
    traversal = ops.tree_rejection_sample(*inputs, seed=5, verification="traversal")
    assert all(torch.equal(a, b) for a, b in zip(default, token))
    assert not torch.equal(token[2], traversal[2])  # another rule: other paths on some of 600 rows


def test_verification_is_checked_first_in_one_line():
    target, draft, tokens, parents = tree_inputs()
    with pytest.raises(ValueError) as error:  # a bad siblings and a bad backend too: verification is named
        ops.tree_rejection_sample(target, draft, tokens, parents, seed=0, verification="block", siblings="top",
                                  backend="tpu")
    message = str(error.value)
    assert message.startswith("tree_rejection_sample: `verification` must be one of ('token', 'traversal')")
    assert "'block'" in message and "\n" not in message


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_kernel_backends_refuse_traversal(backend, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the refusal is the rule's, not the device's
    target, draft, tokens, parents = tree_inputs()
    with pytest.raises(ValueError) as error:
        ops.tree_rejection_sample(target, draft, tokens, parents, seed=0, verification="traversal", backend=backend)
    message = str(error.value)
    assert message.startswith(f"tree_rejection_sample: verification='traversal' has no kernel yet on the "
                              f"{backend!r} backend")
    assert "\n" not in message


def test_an_unknown_backend_is_still_refused_with_traversal():
    target, draft, tokens, parents = tree_inputs()
    with pytest.raises(ValueError, match="backend must be one of"):
        ops.tree_rejection_sample(target, draft, tokens, parents, seed=0, verification="traversal", backend="tpu")


def test_inputs_are_checked_as_for_token_verification():
    target, draft, tokens, parents = tree_inputs()
    with pytest.raises(ValueError, match="draft_probs.*shape"):
        ops.tree_rejection_sample(target, draft[:, :5], tokens, parents, seed=0, verification="traversal")
    with pytest.raises(ValueError, match="uniforms|seed"):
        ops.tree_rejection_sample(target, draft, tokens, parents, verification="traversal")


@pytest.mark.parametrize("siblings", SIBLINGS)
def test_the_custom_op_passes_opcheck(siblings):
    """Schema, fake tensor and dispatch: the per-row loop stays inside the opaque custom op."""
    target, draft, tokens, parents = tree_inputs()
    uniforms = torch.rand(B, 6, generator=torch.Generator().manual_seed(3))
    for randomness in ((uniforms, None, None, None), (None, 3, None, torch.tensor([4, 9, 0]))):
        torch.library.opcheck(torch.ops.specdec.tree_rejection_sample.default,
                              (target, draft, tokens, parents, 4, *randomness, "torch", siblings, "traversal"))
