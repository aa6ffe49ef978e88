"""A drafter reads the target's hidden states of the layers it names (decoding/hidden_states.py): before each
step, the states of the positions the last target forward committed (the prompt's after the prefill; the
root and the accepted drafts after a step, a tree's accepted path moved to the front). Every state read
equals the target's own forward over the row's final text (HF's model alone, no padding, hooks on the same
modules), for chains and token trees, eager and under kept (fake) CUDA graphs, batched with left padding,
with no target forward beyond the engine's own. A compaction that forgets a tree's path fails the check."""

import pytest
import torch

from specdec_kernels.decoding import FINAL_NORM, ChainSpeculative, PlainDecoder, TreeSpeculative
from specdec_kernels.decoding import clear_graph_cache, graphs
from specdec_kernels.decoding.hidden_states import TargetStates

from decoding_support import left_padded, make_pair
from hf_support import one_thread
from test_graph_sessions import FakeGraphs

NEW = 10


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair("llama", tmp_path_factory.mktemp("hidden"))


def layers(target) -> tuple:
    """The first and the last decoder layer, and the final norm's output."""
    return (0, target.config.num_hidden_layers - 1, FINAL_NORM)


def recording(base):
    """`base` drafter class that names `layers` and records, at each propose, what engine.hidden holds: per
    output row, (first position, states {layer: [count, H]})."""

    class Recording(base):
        def target_layers(self):
            return self.read

        def propose(self, engine, first):
            hidden, lengths = engine.hidden, engine.cache.seq_lens
            for b, row in enumerate(engine.row_ids.tolist()):
                count = int(hidden.count[b])
                if count:
                    states = {layer: hidden.states(layer)[b, :count].clone() for layer in self.read}
                    self.seen.append((row, int(lengths[b]) - count, states))
            return super().propose(engine, first)

    return Recording


def make(kind, pair):
    target, draft = pair
    if kind == "plain":
        drafter = recording(PlainDecoder)(target)
    elif kind == "chain":
        drafter = recording(ChainSpeculative)(target, draft, num_draft_tokens=3)
    else:
        drafter = recording(TreeSpeculative)(target, draft, num_draft_tokens=3, tree_topk=2, tree_nodes=6)
    drafter.read, drafter.seen = layers(target), []
    return drafter


def reference_states(target, tokens: torch.Tensor, read: tuple) -> dict:
    """{layer: [T, H]}: the target's own forward over one row's tokens, read by hooks on the same modules."""
    found, handles = {}, []
    modules = {layer: target.model.norm if layer == FINAL_NORM else target.model.layers[layer] for layer in read}
    for layer, module in modules.items():
        handles.append(module.register_forward_hook(
            lambda m, a, out, layer=layer: found.__setitem__(layer, (out[0] if isinstance(out, tuple) else out)[0])))
    try:
        with torch.no_grad():
            target(tokens.unsqueeze(0))
    finally:
        for handle in handles:
            handle.remove()
    return found


def check_against_reference(target, drafter, out, ids, mask):
    assert drafter.seen, "the drafter never read a state"
    width = ids.shape[1]
    references = {}
    for row, start, states in drafter.seen:
        if row not in references:
            text = torch.cat([ids[row, mask[row].bool()], out.sequences[row, width:]])
            references[row] = reference_states(target, text, drafter.read)
        for layer, got in states.items():
            want = references[row][layer][start:start + got.shape[0]]
            assert got.shape == want.shape, (row, start, layer)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m: f"row {row} from {start} "
                                                                                     f"layer {layer}: {m}")


@pytest.mark.parametrize("graphs_on", [False, True], ids=["eager", "fake_graphs"])
@pytest.mark.parametrize("kind", ["plain", "chain", "tree"])
def test_states_read_are_the_targets_own(pair, kind, graphs_on):
    target = pair[0]
    ids, mask = left_padded([5, 2, 7], seed=3)
    drafter = make(kind, pair)
    backend = FakeGraphs()
    clear_graph_cache()
    try:
        with one_thread(), graphs.use_backend(backend):
            out = drafter.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=[],
                                   cuda_graphs=graphs_on)
    finally:
        clear_graph_cache()
    if graphs_on and kind != "plain":
        assert backend.replays > 0  # the states of replayed steps were read too
    check_against_reference(target, drafter, out, ids, mask)
    starts = {row: {start for r, start, _ in drafter.seen if r == row} for row in range(ids.shape[0])}
    assert all(len(s) > 2 for s in starts.values())  # every row read the prefill's states and several steps'
    if kind == "tree":
        assert out.stats.accepted_tokens > 0


def test_no_extra_target_forward(pair):
    """Reading states costs no forward: the same call without a drafter that reads counts the same."""
    target, draft = pair
    ids, mask = left_padded([4, 6], seed=4)
    reading = make("tree", pair)
    plain_tree = TreeSpeculative(target, draft, num_draft_tokens=3, tree_topk=2, tree_nodes=6)
    common = dict(attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=[], cuda_graphs=False)
    with one_thread():
        a, b = reading.generate(ids, **common), plain_tree.generate(ids, **common)
    assert torch.equal(a.sequences, b.sequences) and a.stats.target_forwards == b.stats.target_forwards


def test_hooks_are_removed_after_the_call(pair):
    target = pair[0]
    drafter = make("chain", pair)
    before = [len(layer._forward_hooks) for layer in target.model.layers] + [len(target.model.norm._forward_hooks)]
    ids, mask = left_padded([3, 4], seed=5)
    with one_thread():
        drafter.generate(ids, attention_mask=mask, max_new_tokens=3, pad_token_id=0, cuda_graphs=False)
    after = [len(layer._forward_hooks) for layer in target.model.layers] + [len(target.model.norm._forward_hooks)]
    assert after == before


def test_mutation_tree_path_not_compacted_fails(pair, monkeypatch):
    """A keep_accepted that leaves a tree's states in node order (no gather of the accepted path) is caught."""
    target = pair[0]
    real = TargetStates.keep_accepted
    monkeypatch.setattr(TargetStates, "keep_accepted",
                        lambda self, nodes, num_accepted, finished: real(self, None, num_accepted, finished))
    ids, mask = left_padded([5, 2, 7], seed=3)
    drafter = make("tree", pair)
    with one_thread():
        out = drafter.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=[],
                               cuda_graphs=False)
    with pytest.raises(AssertionError):
        check_against_reference(target, drafter, out, ids, mask)


@pytest.mark.parametrize("bad", [-1, 99, "norm", True])
def test_a_bad_layer_is_refused_by_name(pair, bad):
    target, draft = pair
    drafter = recording(ChainSpeculative)(target, draft, num_draft_tokens=2)
    drafter.read, drafter.seen = (bad,), []
    last = target.config.num_hidden_layers - 1
    with pytest.raises(ValueError, match=rf"target_layers\(\) must name decoder layers in \[0, {last}\] or 'final_norm'"):
        drafter.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, cuda_graphs=False)


def test_reading_an_unnamed_layer_is_refused(pair):
    target, draft = pair
    drafter = recording(ChainSpeculative)(target, draft, num_draft_tokens=2)
    drafter.read, drafter.seen = (0,), []
    real = drafter.propose

    def propose(engine, first):
        engine.hidden.states(1)
        return real(engine, first)

    drafter.propose = propose
    with pytest.raises(ValueError, match=r"reads target layer 1 but did not name it in target_layers\(\)"):
        drafter.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, cuda_graphs=False)



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_states_under_real_cuda_graphs(pair, kind):
    """On a GPU the verify step's hook copies and the path's compaction are captured and replayed: the states
    read after replayed steps are the target's own (fp32), and a second call replays the first one's graphs."""
    from specdec_kernels import ops

    if not any(b in ops.implemented_backends("tree_attention") for b in ("triton", "cuda")):
        pytest.skip("CUDA graphs need a GPU backend of ops.tree_attention")
    target, draft = (model.to("cuda") for model in pair)
    try:
        ids, mask = (t.to("cuda") for t in left_padded([5, 2, 7], seed=3))
        drafter = make(kind, (target, draft))  # one object: the second call finds its kept graphs
        clear_graph_cache()
        for call in range(2):
            drafter.seen = []
            out = drafter.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=[],
                                   cuda_graphs=True)
            captured = out.stats.extra["cuda_graphs_captured"]
            assert captured >= 1 if call == 0 else captured == 0
            check_against_reference(target, drafter, out, ids, mask)
    finally:
        clear_graph_cache()
        for model in pair:
            model.to("cpu")
