"""Strategy `lookup` (drafts copied from the row's own text, a chain or a token tree): greedy identity with HF,
row by row at batch 4 (decoder-only and BART), rows without a match, EOS inside a draft, the LookupCache,
CUDA-graph mode (through the CPU fake of tests/test_graph_sessions.py), and mutations that the identity
checks must catch. The sampled laws are tested in tests/test_sampling_loops.py, HF's arguments in
tests/test_custom_generate_lookup.py."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec_kernels
from specdec_kernels.decoding import LookupCache, LookupDecoder, clear_graph_cache, graphs
from specdec_kernels.decoding import lookup as lookup_module
from specdec_kernels.decoding.engine import Engine
from specdec_kernels.decoding.step import Accepted
from specdec_kernels.decoding.verifier import Verifier
from specdec_kernels.decoding.lookup_match import chain, scan
from specdec_kernels.decoding.lookup_tree import tree

from decoding_support import left_padded, make_pair
from hf_support import VOCAB, one_thread

NEW = 20
VARIANTS = {"chain": {}, "chain recent": dict(match="recent", num_draft_tokens=4), "tree": dict(tree_nodes=6)}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return {name: make_pair(name, tmp_path_factory.mktemp(name))[0] for name in ("llama", "bart")}


@pytest.fixture(params=["llama", "bart"])
def family(request, targets):
    return request.param, targets[request.param]


def repeating_batch(family: str):
    """Four padded prompts: two repeat a phrase (matches from the start), two are random. Left-padded for a
    decoder-only model; right-padded encoder inputs for BART (its learned positions count left padding)."""
    ids, mask = left_padded([12, 4, 11, 6], seed=2, pad=1 if family == "bart" else 0)
    ids[0, -12:] = torch.tensor([5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10])
    ids[2, -11:] = torch.tensor([20, 21, 22, 23, 24, 25, 26, 20, 21, 22, 23])
    if family == "bart":
        order = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True)  # tokens first
        ids, mask = ids.gather(1, order), mask.gather(1, order)
    return ids, mask


def hf_alone(target, ids, mask, new=NEW, **kwargs):
    """HF greedy of each row decoded alone (no padding), its new tokens (BART's forced BOS/EOS off)."""
    rows = []
    for row in range(ids.shape[0]):
        alone = ids[row:row + 1][mask[row:row + 1] != 0].unsqueeze(0)
        out = target.generate(alone, max_new_tokens=new, do_sample=False, forced_bos_token_id=None,
                              forced_eos_token_id=None, pad_token_id=0, **kwargs)
        rows.append(out[0, 1 if target.config.is_encoder_decoder else alone.shape[1]:])
    return rows


def new_tokens(out, ids, target):
    return out.sequences[:, 1 if target.config.is_encoder_decoder else ids.shape[1]:]


def assert_rows_equal(ours, references):
    for row, reference in enumerate(references):
        assert torch.equal(ours[row, :len(reference)], reference), (row, ours[row].tolist(), reference.tolist())


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_equals_hf_row_by_row(family, variant):
    name, target = family
    ids, mask = repeating_batch(name)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="lookup", max_new_tokens=NEW,
                                   pad_token_id=0, **VARIANTS[variant])
    assert_rows_equal(new_tokens(out, ids, target), hf_alone(target, ids, mask))
    stats = out.stats
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # drafts were accepted and rejected
    assert stats.target_forwards < stats.emitted_tokens  # fewer forwards than tokens
    assert 0 < stats.extra["match_rate"] < 1


def test_the_encoder_input_is_looked_up(targets, monkeypatch):
    """BART: the text a row drafts from starts with its encoder input, so the first step's draft is what
    followed the decoder's start token (2) inside the source."""
    target = targets["bart"]
    proposals = []
    real = LookupDecoder.draft
    monkeypatch.setattr(LookupDecoder, "draft",
                        lambda self, engine: proposals.append(real(self, engine)) or proposals[-1])
    source = torch.tensor([[9, 2, 17, 18, 19, 20, 21]])
    out = specdec_kernels.generate(target, source, strategy="lookup", max_new_tokens=8, num_draft_tokens=4)
    first, _ = proposals[0]  # (the proposal, each row's draft count)
    assert first.tokens[0, :int(first.num_draft[0])].tolist() == [17, 18, 19, 20]
    assert_rows_equal(new_tokens(out, source, target), hf_alone(target, source, torch.ones_like(source), new=8))


def test_rows_without_a_match_run_plain_steps(family, monkeypatch):
    """Prompts of distinct tokens and 3-gram matches only: no row ever drafts, every step feeds one token
    (no target width wasted) and the output is greedy's; in a batch with a repeating row the others draft
    nothing (num_draft 0) while it drafts."""
    name, target = family
    ids = torch.stack([torch.randperm(VOCAB - 3, generator=torch.Generator().manual_seed(s))[:10] + 3 for s in (4, 5)])
    proposals = []  # what each step feeds after the root (its width) and each row's draft count
    propose = LookupDecoder.propose
    monkeypatch.setattr(LookupDecoder, "propose",
                        lambda self, engine, first: proposals.append(propose(self, engine, first)) or proposals[-1])
    out = specdec_kernels.generate(target, ids, strategy="lookup", max_new_tokens=3, max_ngram=3, min_ngram=3,
                                   pad_token_id=0)
    assert_rows_equal(new_tokens(out, ids, target), hf_alone(target, ids, torch.ones_like(ids), new=3))
    assert out.stats.drafted_tokens == 0 and out.stats.extra["match_rate"] == 0
    assert proposals and all(int(p.num_draft.max()) == 0 and p.tokens.shape[1] == 0 for p in proposals)
    assert out.stats.target_forwards == out.stats.emitted_tokens  # one token per target forward

    if name == "bart":
        return  # BART's first step ends with the decoder's start token, which its sources lack: no match yet
    mixed, mask = repeating_batch(name)  # sampling: the first step drafts from the prompt alone
    proposals.clear()
    specdec_kernels.generate(target, mixed, attention_mask=mask, strategy="lookup", max_new_tokens=4, min_ngram=3,
                             do_sample=True, seed=0)
    first = proposals[0]  # rows 0 and 2 end by repeating a phrase, 1 and 3 are random
    assert first.tokens.shape[1] == int(first.num_draft.max()) > 0
    assert int(first.num_draft[0]) > 0 and int(first.num_draft[2]) > 0
    assert int(first.num_draft[1]) == int(first.num_draft[3]) == 0


def test_eos_inside_a_draft_ends_the_row_there(targets):
    """The target's own continuation, stored in a LookupCache behind the prompt's last three tokens, is
    drafted whole in the first step; with EOS set to a later new token the row stops there, as HF's does."""
    target = targets["llama"]
    ids = (torch.randperm(VOCAB - 3, generator=torch.Generator().manual_seed(6))[:8] + 3).unsqueeze(0)
    reference = hf_alone(target, ids, torch.ones_like(ids), new=8, eos_token_id=None)[0]
    first = next(j for j in range(2, 8) if int(reference[j]) not in reference[:j].tolist())
    eos = int(reference[first])
    cache = LookupCache(max_tokens=64)
    cache.add(torch.cat([ids[0, -3:], reference]))
    out = specdec_kernels.generate(target, ids, strategy="lookup", max_new_tokens=8, eos_token_id=eos, pad_token_id=0,
                                   lookup_cache=cache)
    expected = target.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    assert out.sequences[0, ids.shape[1] + first] == eos and out.stats.emitted_tokens == first + 1
    assert out.stats.target_forwards == 1  # one step: the prompt's end matched, every draft up to EOS accepted


def test_the_cache_drafts_from_earlier_outputs_within_its_bound(targets):
    target = targets["llama"]
    ids, mask = repeating_batch("llama")
    cache = LookupCache(max_tokens=200)
    first = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="lookup", max_new_tokens=NEW,
                                     pad_token_id=0, eos_token_id=[], lookup_cache=cache)
    assert cache.documents == 4 and cache.contents() == [row.tolist() for row in new_tokens(first, ids, target)]
    again = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="lookup", max_new_tokens=NEW,
                                     pad_token_id=0, eos_token_id=[], lookup_cache=cache)
    assert torch.equal(again.sequences, first.sequences)
    assert again.stats.target_forwards < first.stats.target_forwards  # the repeated request drafts its old output
    assert again.stats.extra["lookup_cache_tokens"] == cache.used == 8 * (NEW + 1)
    # bounded: first in, first out, the tail of a partly evicted document kept
    small = LookupCache(max_tokens=12)  # 12 slots: tokens and one separator after each document
    small.add([1, 2, 3, 4])
    small.add([[5, 6, 7, -1, -1], [8, 9, 10, 11]])  # 9 more slots: the two oldest go
    assert small.contents() == [[3, 4], [5, 6, 7], [8, 9, 10, 11]] and small.tokens.numel() == 13
    small.add(list(range(20, 40)))  # longer than the cache: its last 11 tokens
    assert small.contents() == [list(range(29, 40))] and small.used == 12
    with pytest.raises(ValueError, match="LookupCache: `max_tokens`"):
        LookupCache(max_tokens=1)


def test_tree_holds_the_recent_chain_and_ranks_by_frequency():
    """The suffix [1, 2] occurred three times: followed by 3 4 twice, then by 5 7 most recently. The tree
    puts the frequent branch first and keeps every ancestor; the chain of the most recent occurrence is 5 7 1 2,
    of the first 3 4 9 (here cut by a budget of 2)."""
    text = torch.tensor([[1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 5, 7, 1, 2]])
    end = torch.tensor([16])
    found = scan(text, end, 0, max_ngram=3, min_ngram=1)
    assert found.best.tolist() == [2]
    tokens, count = chain(text, end, found, 4, torch.tensor([10]), recent=True)
    assert tokens[0, :int(count[0])].tolist() == [5, 7, 1, 2]
    tokens, count = chain(text, end, found, 4, torch.tensor([2]), recent=False)
    assert tokens[0, :int(count[0])].tolist() == [3, 4]
    drafted = tree(text, end, found, nodes=5, depth=3, max_ngram=3, limit=torch.tensor([10]))
    assert drafted.tokens.tolist() == [[3, 4, 5, 7, 0]] and drafted.parents.tolist() == [[-1, 0, 1, 0, 3, -1]]
    assert drafted.count.tolist() == [4] and drafted.depth.tolist() == [2]  # ceil(3 * 2 / 3) levels
    assert scan(text, end, 0, max_ngram=3, min_ngram=3).best.tolist() == [0]  # no 3-token match: no draft
    # back-off: [1, 2] occurred once (then 3 6), [2] alone once more (then 9): the longer match's branch first,
    # two levels deep, the 1-token match's one level
    text, end = torch.tensor([[4, 2, 9, 1, 2, 3, 6, 1, 2]]), torch.tensor([9])
    drafted = tree(text, end, scan(text, end, 0, max_ngram=3, min_ngram=1), nodes=4, depth=3, max_ngram=3,
                   limit=torch.tensor([10]))
    assert drafted.tokens.tolist() == [[3, 6, 9, 0]] and drafted.parents.tolist() == [[-1, 0, 1, 0, -1]]
    drafted = tree(text, end, scan(text, end, 0, max_ngram=3, min_ngram=2), nodes=4, depth=3, max_ngram=3,
                   limit=torch.tensor([1]))  # min_ngram 2 drops the back-off; a budget of one token
    assert drafted.tokens.tolist() == [[3, 0, 0, 0]] and drafted.depth.tolist() == [1]


class SyncFreeGraphs:
    """FakeGraphs (tests/test_graph_sessions.py) whose draft-step replays fail on any host read."""

    def __new__(cls):
        from test_graph_sessions import FakeGraphs

        class Checked(FakeGraphs):
            def replay(self, graph):
                if getattr(graph["fn"], "__name__", "") != "<lambda>":  # the verify step (torch attention syncs)
                    return super().replay(graph)
                with NoHostReads(), pytest.MonkeyPatch.context() as patch:
                    patch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("tolist in a captured draft step"))
                    return super().replay(graph)

        return Checked()


class NoHostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func is not torch.ops.aten._local_scalar_dense.default, "a host read in a captured draft step"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("variant", ["chain", "tree"])
def test_graph_mode_drafts_without_host_reads_and_replays(targets, variant):
    """Kept graphs need a decoder-only target (encoder-decoder graphs are not kept between calls)."""
    target = targets["llama"]
    backend = SyncFreeGraphs()
    clear_graph_cache()
    try:
        with graphs.use_backend(backend):
            options = dict(strategy="lookup", max_new_tokens=NEW, pad_token_id=0, cuda_graphs=True, **VARIANTS[variant])
            ids, mask = repeating_batch("llama")
            first = specdec_kernels.generate(target, ids, attention_mask=mask, **options)
            assert_rows_equal(new_tokens(first, ids, target), hf_alone(target, ids, mask))
            captured = len(backend.captures)
            assert captured == 2 and backend.replays > 0  # the draft step and the verify step, static widths
            ids, mask = left_padded([5, 9, 3, 7], seed=8)  # other prompts, same batch and length bucket
            second = specdec_kernels.generate(target, ids, attention_mask=mask, **options)
            assert len(backend.captures) == captured
            assert_rows_equal(new_tokens(second, ids, target), hf_alone(target, ids, mask))
    finally:
        clear_graph_cache()


@pytest.mark.parametrize("mutation", ["accept every draft", "commit a tree as a chain"])
def test_mutations_fail_the_identity_check(targets, monkeypatch, mutation):
    """Two bugs the identity checks must catch: rows keeping drafts the target rejected, and a tree step
    keeping the KV of its first nodes in index order instead of the accepted path."""
    target = targets["llama"]
    ids, mask = repeating_batch("llama")
    if mutation == "accept every draft":
        real = Verifier.__call__

        def accept_all(self, proposal, logits, rows):
            out = real(self, proposal, logits, rows).tokens
            count = proposal.num_draft if proposal.num_draft is not None else torch.zeros_like(rows.root)
            drafts = torch.cat([proposal.tokens, out[:, :1]], dim=1)
            keep = torch.arange(proposal.tokens.shape[1] + 1) <= count.unsqueeze(1)
            return Accepted(torch.where(keep, drafts, -1), count)

        monkeypatch.setattr(Verifier, "__call__", accept_all)  # the verifier lookup's steps go through
        options = {}
    else:
        monkeypatch.setattr(Engine, "commit_target",
                            lambda self, proposal, accepted: self.cache.rollback(accepted.num_accepted))
        options = dict(tree_nodes=6)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="lookup", max_new_tokens=NEW,
                                   pad_token_id=0, **options)
    references = hf_alone(target, ids, mask)
    ours = new_tokens(out, ids, target)
    assert any(not torch.equal(ours[row, :len(ref)], ref) for row, ref in enumerate(references))
