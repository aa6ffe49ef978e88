"""Strategy `eagle`: an EAGLE-3 head drafts from the target's states at three layers, as a chain or EAGLE-2's
dynamic tree, verified by the engine's one verifier.

Checked: a left-padded batch of 4 gives each row's greedy tokens (chain and tree, eager and under kept fake
CUDA graphs, rows ending at EOS at different steps); every step reads the last committed pair as the head reads
the row's whole text from scratch (so its cache holds exactly the committed pairs at their positions; a cache
that forgets them fails, and so does a tree that commits a pair it did not hold back); sampling follows the
target's law (chi-square of the first two tokens through `generate`, token-wise and block chains, trees of
sampled and top siblings, 24,000 rows), and the same test fails when every step draws the same uniforms;
custom_generate runs it with assistant_model=head; bad options are refused in one line."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdec_kernels
from specdec_kernels import custom_generate
from specdec_kernels.decoding.eagle import EagleDecoder
from specdec_kernels.decoding.engine import Engine
from specdec_kernels.training.eagle3 import new_head, target_pass

from decoding_support import left_padded
from hf_support import one_thread
from sampling_support import loop_ids, loop_joint, loop_pair, loop_pvalue

NEW = 12
VOCAB = 64
AUX = (1, 2, 4)  # the states entering layers 1 and 2 and the last layer's output
CHAIN, TREE = dict(num_draft_tokens=3), dict(num_draft_tokens=3, tree_topk=2, tree_nodes=5)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def make_head(target, aux, *, drop: int = 4, noise: float = 0.3, seed: int = 0):
    """A head for `target` over all ids but the last `drop` (so d2t is not the identity), started from the
    target's LM head and norm, every weight then perturbed: it agrees with the target often, not always."""
    vocab = target.config.vocab_size
    head = new_head(target, aux_layers=aux, draft_ids=torch.arange(vocab - drop))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(noise * parameter.std().clamp(min=0.1) * torch.randn(parameter.shape, generator=gen))
    return head.eval()


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    target = LlamaForCausalLM(config).eval()
    return target, make_head(target, AUX)


def greedy(model, ids, new=NEW, **kwargs):
    model.set_attn_implementation("sdpa")
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                          pad_token_id=0, **kwargs)


def assert_greedy_rows(target, ids, mask, out, **kwargs):
    for row in range(ids.shape[0]):
        alone = ids[row, mask[row].bool()].unsqueeze(0)
        want = greedy(target, alone, **kwargs)[0, alone.shape[1]:]
        got = out.sequences[row, ids.shape[1]:]
        assert torch.equal(got[:len(want)], want) and bool((got[len(want):] == 0).all()), row


@pytest.mark.parametrize("options", [CHAIN, dict(num_draft_tokens=1), TREE, dict(num_draft_tokens=4, tree_topk=3,
                                                                                  tree_nodes=9)],
                         ids=["chain3", "chain1", "tree_k2", "tree_k3"])
def test_left_padded_batch_of_four_is_greedy_row_by_row(pair, options):
    target, head = pair
    ids, mask = left_padded([5, 1, 7, 3], seed=3)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="eagle", draft_model=head,
                                   max_new_tokens=NEW, eos_token_id=[], pad_token_id=0, **options)
    assert_greedy_rows(target, ids, mask, out)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # drafts were taken and refused


@pytest.mark.parametrize("options", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("graphs_on", [False, True], ids=["eager", "fake_graphs"])
def test_rows_ending_at_eos_and_kept_graphs(pair, options, graphs_on):
    """Rows finish at different steps (eager drops them, the head's cache and fed tokens with them; kept graphs
    freeze them), and a second call replays the kept graphs: every row is still its greedy output, cut at EOS."""
    from specdec_kernels.decoding import clear_graph_cache, graphs
    from test_graph_sessions import FakeGraphs

    target, head = pair
    backend = FakeGraphs()
    clear_graph_cache()
    try:
        with graphs.use_backend(backend):
            for seed, lengths in ((3, [5, 1, 7, 3]), (4, [2, 6, 4, 4])):
                ids, mask = left_padded(lengths, seed=seed)
                alone = ids[0, mask[0].bool()].unsqueeze(0)
                eos = int(greedy(target, alone)[0, alone.shape[1] + 3])  # row 0 ends by its 4th new token
                out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="eagle", draft_model=head,
                                               max_new_tokens=NEW, pad_token_id=0, eos_token_id=eos,
                                               cuda_graphs=graphs_on, **options)
                assert_greedy_rows(target, ids, mask, out, eos_token_id=eos)
        if graphs_on:
            assert backend.captures and backend.replays > 2
    finally:
        clear_graph_cache()


@torch.no_grad()
def head_reading(target, head, text: torch.Tensor) -> torch.Tensor:
    """The head's output state [H] for the last pair of `text` [1, n] (its last token the root), from scratch:
    the target's states of every position, the pairs (state t, token t + 1) through the head under a causal mask."""
    target.set_attn_implementation("sdpa")
    states, _ = target_pass(target, text[:, :-1], head.aux_layers)
    n = text.shape[1] - 1
    mask = torch.ones(n, n, dtype=torch.bool).tril().view(1, 1, n, n)
    return head(head.combine(states), text[:, 1:], torch.arange(n).view(1, n), attention_mask=mask)[0, -1]


class Recording(EagleDecoder):
    """Records, each step, every row's output state for its last committed pair (what its first draft comes
    from) with the row and the length of its text (root included)."""

    def chain(self, engine, last):
        self.record(engine, last)
        return super().chain(engine, last)

    def grow(self, engine, root_state, root_out):
        self.record(engine, root_out)
        return super().grow(engine, root_state, root_out)

    def record(self, engine, out):
        for b, row in enumerate(engine.row_ids.tolist()):
            self.seen.append((row, int(engine.cache.seq_lens[b]) + 1, out[b, -1].clone()))


def first_drafts_are_the_heads(pair, options, forget: bool = False) -> bool:
    """Every step's reading of the last committed pair equals the head's reading of the row's whole text from
    scratch (1e-4): the head's cache holds exactly the committed pairs, at their positions."""
    target, head = pair
    ids, mask = left_padded([6, 1, 5], seed=8)  # a one-token row has no committed pair at its first step
    drafter = Recording(target, head, **options)
    drafter.seen = []
    if forget:  # every forward starts from an empty head cache: the committed pairs are lost
        original = drafter.forward

        def forgetful(states, tokens, parents=None):
            drafter.cache.seq_lens.zero_()
            return original(states, tokens, parents)

        drafter.forward = forgetful
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy=drafter, max_new_tokens=NEW,
                                   eos_token_id=[], pad_token_id=0)
    texts = [out.sequences[row, ids.shape[1] - int(mask[row].sum()):] for row in range(3)]
    checked = [(row, length, state) for row, length, state in drafter.seen if length > 1]
    assert len(checked) >= 6 and {row for row, _, _ in checked} == {0, 1, 2}
    return all(torch.allclose(state, head_reading(target, head, texts[row][:length].unsqueeze(0)), atol=1e-4)
               for row, length, state in checked)


@pytest.mark.parametrize("options", [CHAIN, TREE], ids=["chain", "tree"])
def test_each_step_reads_the_committed_text_as_the_head_does_from_scratch(pair, options):
    assert first_drafts_are_the_heads(pair, options)


@pytest.mark.parametrize("options", [CHAIN, TREE], ids=["chain", "tree"])
def test_mutation_a_head_cache_that_forgets_the_committed_pairs_fails(pair, options):
    assert not first_drafts_are_the_heads(pair, options, forget=True)


def test_mutation_a_tree_that_commits_a_pair_it_did_not_hold_fails(pair, monkeypatch):
    """A row without a committed pair at its first step (a one-token prompt beside longer ones) held nothing back:
    committing one there after the verdict shifts every later pair by a position."""
    monkeypatch.setattr(EagleDecoder, "commit", lambda self, engine, proposal, accepted: (
        self.fed[:, :accepted.tokens.shape[1]].copy_(accepted.tokens.clamp(min=0)),
        self.cache.commit((engine.hidden.count > 0).to(torch.int64))))
    assert not first_drafts_are_the_heads(pair, TREE)


# ---------------------------------------------------------------- sampling: the target's law


@pytest.fixture(scope="module")
def loop():
    """sampling_support's loop target (vocabulary 10, 2 layers) with a head reading its states at ids 1, 1, 2."""
    target, _ = loop_pair()
    return target, make_head(target, (1, 1, 2), drop=1, noise=0.5)


PATHS = {"token": dict(verification="token"), "block": dict(verification="block"),
         "tree_sampled": dict(tree_topk=2, tree_nodes=4, tree_siblings="sampled"),
         "tree_top": dict(tree_topk=2, tree_nodes=4, tree_siblings="top")}


def sampled(loop, path: str, temperature: float):
    target, head = loop
    return specdec_kernels.generate(target, loop_ids(), strategy="eagle", draft_model=head, num_draft_tokens=2,
                                    max_new_tokens=2, do_sample=True, temperature=temperature, seed=1234,
                                    eos_token_id=[], **PATHS[path])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("path", list(PATHS))
def test_first_two_sampled_tokens_follow_the_target(loop, path, temperature):
    out = sampled(loop, path, temperature)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both paths ran
    assert loop_pvalue(out.sequences, loop_joint(loop[0], temperature)) > 1e-3


@pytest.mark.parametrize("path", ["block", "tree_sampled"])
def test_the_same_test_fails_when_every_step_draws_the_same_uniforms(loop, monkeypatch, path):
    monkeypatch.setattr(Engine, "advance_cursor", lambda engine: None)
    out = sampled(loop, path, 1.0)
    assert loop_pvalue(out.sequences, loop_joint(loop[0], 1.0)) < 1e-6


# ---------------------------------------------------------------- entry points and refusals


def test_custom_generate_runs_it_with_the_head_as_assistant(pair):
    target, head = pair
    ids, mask = left_padded([5, 2, 4], seed=6)
    common = dict(attention_mask=mask, max_new_tokens=8, pad_token_id=0)
    hooked = target.generate(ids, custom_generate=custom_generate, assistant_model=head, strategy="eagle",
                             num_assistant_tokens=2, return_dict_in_generate=True, **common)
    ours = specdec_kernels.generate(target, ids, strategy="eagle", draft_model=head, num_draft_tokens=2,
                                    eos_token_id=[], **common)
    assert torch.equal(hooked.sequences, ours.sequences)
    assert len(hooked.stats.per_position_acceptance) == 2
    assert head.config._attn_implementation == "sdpa"  # switched to ours for each call, then given back
    implied = target.generate(ids, custom_generate=custom_generate, assistant_model=head, num_assistant_tokens=2,
                              **common)  # a head as assistant means strategy eagle
    assert torch.equal(implied, ours.sequences)
    with pytest.raises(ValueError, match=r"an EAGLE-3 head drafts in strategy 'eagle', not 'speculative'"):
        target.generate(ids, custom_generate=custom_generate, assistant_model=head, strategy="speculative", **common)


def test_bad_options_and_partners_are_refused_in_one_line(pair):
    target, head = pair
    ids = torch.tensor([[3, 4, 5]])
    run = dict(strategy="eagle", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"strategy 'eagle' needs an EAGLE-3 head as draft_model .*LlamaForCausalLM"):
        specdec_kernels.generate(target, ids, draft_model=target, **run)
    with pytest.raises(ValueError, match=r"num_draft_tokens"):
        specdec_kernels.generate(target, ids, draft_model=head, num_draft_tokens=0, **run)
    with pytest.raises(ValueError, match=r"`tree_siblings` applies to trees"):
        specdec_kernels.generate(target, ids, draft_model=head, tree_siblings="top", **run)
    with pytest.raises(ValueError, match=r"`verification` of a token tree must be one of 'token', 'traversal' "
                                         r"\(block verification is for chains\)"):
        specdec_kernels.generate(target, ids, draft_model=head, verification="block", **TREE, **run)
    with pytest.raises(ValueError, match=r"`tree_nodes` must be <="):
        specdec_kernels.generate(target, ids, draft_model=head, num_draft_tokens=2, tree_topk=2, tree_nodes=99, **run)
    shallow = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2)).eval()
    with pytest.raises(ValueError, match=r"reads target layers \[1, 2, 4\], past this target's 2"):
        specdec_kernels.generate(shallow, ids, draft_model=head, **run)
