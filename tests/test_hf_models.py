"""Logits through SpecCache + the specdec_tree attention equal HF's own (default cache, SDPA) within
1e-5 in fp32, for every supported family: ragged prefill, decode, chain verification and rollback,
tree verification (each node against HF over its own root-to-node path) and compaction, dropped and
reordered rows, early exit. Tiny models saved to disk and loaded back; nothing downloads."""

import pytest
import torch

from specdec_kernels import hf

from hf_support import FAMILIES, SCENARIOS, TREES, Session, load_pair, one_thread, save_tiny_model

TOLERANCE = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=FAMILIES)
def family_models(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    save_tiny_model(request.param, directory)
    return (request.param, *load_pair(request.param, directory))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_logits_equal_hf(family_models, scenario):
    _, reference, adapter = family_models
    compared = 0
    for label, ours, (theirs,) in SCENARIOS[scenario](Session(adapter, reference)):
        torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0, msg=lambda m: f"{label}: {m}")
        compared += 1
    assert compared > 0


def test_a_wrong_tree_would_be_caught(family_models):
    """The comparison has teeth: treating a tree as a chain moves sibling logits far beyond the tolerance."""
    _, reference, adapter = family_models
    session = Session(adapter, reference)
    list(session.prefill([5, 4, 6]))
    tokens = session.randint(*TREES.shape)
    as_tree = adapter.verify(tokens, session.cache, TREES)
    as_chain = adapter.verify(tokens, session.cache)
    assert (as_tree[:, 2] - as_chain[:, 2]).abs().max() > 1e-2  # node 2 is node 1's sibling in every tree


def test_early_exit_then_continue(family_models):
    family, reference, adapter = family_models
    session = Session(adapter, reference)
    list(session.prefill([5, 4, 6]))
    tokens = session.randint(3, 4)
    full = adapter.verify(tokens, session.cache)
    state = adapter.forward_to_layer(tokens, session.cache, 1)
    assert state.layer == 1
    for b, history in enumerate(session.history):
        expected = session.reference.hidden(b, history + tokens[b].tolist(), 1)[-4:]
        torch.testing.assert_close(state.hidden[b], expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(adapter.continue_from(state), full, atol=TOLERANCE, rtol=0)


def test_plain_model_forward_runs_the_tree_kernel(family_models):
    """No adapter loop: the model's own forward with cache.forward_kwargs(...) gives the same logits."""
    family, reference, adapter = family_models
    if family == "bart":
        pytest.skip("BART's decoder forward derives positions from one cache length; adapters drive it")
    session = Session(adapter, reference)
    list(session.prefill([5, 4, 6]))
    tokens = session.randint(*TREES.shape)
    expected = adapter.verify(tokens, session.cache, TREES)
    with torch.no_grad():
        got = adapter.model(input_ids=tokens, **session.cache.forward_kwargs(TREES.shape[1], TREES)).logits
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)


def test_decoder_self_attention_without_spec_cache_is_an_error(family_models):
    family, reference, adapter = family_models
    if family == "bart":
        pytest.skip("BART's decoder forward derives positions from one cache length; adapters drive it")
    with pytest.raises(ValueError, match="runs only on a SpecCache"):
        adapter.model(input_ids=torch.tensor([[3, 4, 5]]))


def test_unsupported_model_type_names_the_supported_ones():
    from transformers import OPTConfig, OPTForCausalLM
    model = OPTForCausalLM(OPTConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                     num_attention_heads=2, word_embed_proj_dim=16))
    with pytest.raises(ValueError, match="'opt' is not supported; supported: bart, ernie4_5_moe, glm4_moe, gpt2, llama, mistral, qwen2, qwen3"):
        hf.adapt(model)


def test_mismatched_batch_and_cache_errors(family_models):
    _, reference, adapter = family_models
    session = Session(adapter, reference)
    with pytest.raises(ValueError, match="has 2 rows but the cache holds 3"):
        adapter.verify(session.randint(2, 4), session.cache)
    with pytest.raises(ValueError, match="parents"):
        adapter.verify(session.randint(3, 4), session.cache, torch.tensor([[-1, 0, 1, 5]] * 3))
    with pytest.raises(TypeError, match="must be a SpecCache"):
        adapter.verify(session.randint(3, 4), None)
    with pytest.raises(ValueError, match="exceeds max_length=48"):
        adapter.prefill(session.randint(3, 49), session.cache)
    limit = adapter.max_positions() or getattr(adapter.config, "sliding_window", None)
    if limit is not None:  # learned positions (GPT-2, BART) or a sliding window (this Mistral)
        with pytest.raises(ValueError, match=rf"max_length={limit + 1} exceeds the model's"):
            adapter.new_cache(1, limit + 1)
