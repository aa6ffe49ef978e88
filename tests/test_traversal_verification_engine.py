"""verification="traversal" in the engine: every tree drafter takes it (speculative, EAGLE and lookup trees)
and the one verifier hands it to ops.tree_rejection_sample; a chain takes it as block verification (the
same rule there); greedy decoding is unchanged; custom_generate and the CLI pass it through; the kernel
backends refuse it in one line before any step; and it keeps CUDA graphs off by default (a host loop).
The law of what it emits through `generate`: test_sampling_loops.py; the op: test_traversal_verification_op.py."""

import pytest
import torch

import specdec_kernels
from specdec_kernels import custom_generate, ops
from specdec_kernels.decoding import EagleDecoder, LookupDecoder, SpeculativeDecoder
from specdec_kernels.decoding import engine as engine_module
from specdec_kernels.generate_command import parse_options

from hf_support import one_thread
from sampling_support import loop_ids, loop_pair
from test_decoding_eagle import make_head

TREE = dict(num_draft_tokens=2, tree_topk=2, tree_nodes=4)
SAMPLED = dict(max_new_tokens=4, do_sample=True, seed=5, eos_token_id=[])
LOOKUP_IDS = torch.tensor([[3, 5, 3, 8, 3]]).repeat(8, 1)  # 3 was followed by 5 and by 8: a tree of both


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def pair():
    return loop_pair()


@pytest.fixture(scope="module")
def head(pair):
    return make_head(pair[0], (1, 1, 2), drop=1, noise=0.5)


@pytest.fixture
def rules(monkeypatch):
    """The `verification` of every ops.tree_rejection_sample call made while the test runs."""
    seen, real = [], ops.tree_rejection_sample

    def spy(*args, **kwargs):
        seen.append(kwargs.get("verification", "token"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "tree_rejection_sample", spy)
    return seen


def tree_drafter(name: str, pair, head, **options):
    target, draft = pair
    if name == "eagle":
        return EagleDecoder(target, head, **TREE, **options)
    if name == "lookup":
        return LookupDecoder(target, num_draft_tokens=2, tree_nodes=4, **options)
    return SpeculativeDecoder(target, draft, **TREE, tree_siblings=name.removeprefix("speculative_"), **options)


@pytest.mark.parametrize("name", ["speculative_top", "speculative_sampled", "eagle", "lookup"])
def test_every_tree_drafter_verifies_by_traversal(pair, head, rules, name):
    drafter = tree_drafter(name, pair, head, verification="traversal")
    assert drafter.verification.tree == "traversal" and not drafter.verification.capturable
    ids = LOOKUP_IDS if name == "lookup" else loop_ids(8)
    out = specdec_kernels.generate(pair[0], ids, strategy=drafter, **SAMPLED)
    assert out.stats.drafted_tokens > 0 and rules and set(rules) == {"traversal"}
    assert tree_drafter(name, pair, head).verification.tree == "token"  # the default stays token-level


@pytest.mark.parametrize("name", ["speculative", "eagle", "lookup"])
def test_a_chain_takes_traversal_as_block_verification(pair, head, name):
    target, draft = pair
    make = dict(speculative=lambda **o: SpeculativeDecoder(target, draft, num_draft_tokens=3, **o),
                eagle=lambda **o: EagleDecoder(target, head, num_draft_tokens=3, **o),
                lookup=lambda **o: LookupDecoder(target, num_draft_tokens=3, **o))[name]
    assert make(verification="traversal").verification == make(verification="block").verification
    if name == "speculative":  # and the tokens are block verification's, draw for draw
        runs = [specdec_kernels.generate(target, loop_ids(16), strategy="speculative", draft_model=draft,
                                         num_draft_tokens=3, verification=rule, **SAMPLED) for rule in ("traversal",
                                                                                                        "block")]
        assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_greedy_decoding_is_the_same_with_traversal(pair):
    target, draft = pair
    outs = [specdec_kernels.generate(target, loop_ids(4), strategy="speculative", draft_model=draft, **TREE,
                                     max_new_tokens=6, eos_token_id=[], verification=rule) for rule in ("token",
                                                                                                         "traversal")]
    assert torch.equal(outs[0].sequences, outs[1].sequences)


@pytest.mark.parametrize("name", ["speculative_sampled", "eagle", "lookup"])
def test_bad_values_fail_in_one_line(pair, head, name):
    for value, needle in (("block", "(block verification is for chains)"), ("traverse", "(got 'traverse')")):
        with pytest.raises(ValueError) as error:
            tree_drafter(name, pair, head, verification=value)
        message = str(error.value)
        assert message.startswith("generate: `verification` of a token tree must be one of 'token', 'traversal'")
        assert needle in message and "\n" not in message


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_kernel_backends_refuse_traversal_before_any_step(pair, backend, monkeypatch):
    def no_step(*args, **kwargs):
        raise AssertionError("a step ran")

    monkeypatch.setattr(engine_module.Engine, "run", no_step)
    with pytest.raises(ValueError) as error:
        specdec_kernels.generate(pair[0], loop_ids(2), strategy="speculative", draft_model=pair[1], **TREE,
                                 verification="traversal", backend=backend, **SAMPLED)
    assert str(error.value).startswith(f"generate: verification='traversal' has no kernel yet on the {backend!r} "
                                       "backend")
    assert "\n" not in str(error.value)


def test_traversal_keeps_cuda_graphs_off_by_default(pair, monkeypatch):
    """As if on a GPU with graph-capable kernels: token-level trees would capture (here: refused for want of
    CUDA), traversal's host loop runs eagerly; greedy decoding never runs it, so it would capture."""
    monkeypatch.setattr(engine_module, "graphs_supported", lambda device, backend="auto": True)
    run = dict(strategy="speculative", draft_model=pair[1], **TREE, **SAMPLED)
    out = specdec_kernels.generate(pair[0], loop_ids(2), verification="traversal", **run)
    assert out.stats.extra["cuda_graphs_captured"] == 0
    for options in (dict(), dict(verification="traversal", do_sample=False)):
        with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
            specdec_kernels.generate(pair[0], loop_ids(2), **{**run, **options})


def test_custom_generate_and_the_cli_pass_it_through(pair, rules):
    target, draft = pair
    ids = loop_ids(4)
    target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=custom_generate, assistant_model=draft,
                    **TREE, verification="traversal", max_new_tokens=4, do_sample=True, pad_token_id=0)
    assert rules and set(rules) == {"traversal"}
    assert parse_options(["verification=traversal", "tree_topk=2"], "speculative") == dict(verification="traversal",
                                                                                           tree_topk=2)
