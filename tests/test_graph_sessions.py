"""Engine graphs kept between `generate` calls, on the CPU through a fake capture backend.

FakeGraphs stands in for decoding.graphs.CudaGraphs: capture runs nothing (as CUDA stream capture
does not) and records the step; replay re-runs the function captured in the FIRST call, on that
call's objects and captured inputs, and copies the results into the outputs of its first replay
(graph outputs are fixed buffers). A real graph replays fixed addresses, so every replay also checks
(a dispatch mode watching every op) that it reads no tensor its first replay did not read or make:
a step reaching a tensor that a later call allocated afresh (not kept) fails loudly here, where a
CUDA graph would silently read the stale one. The tests compare each call's tokens with the target's
greedy generate (or with the eager path for sampled settings) and count captures: a second call with
the same shapes captures nothing.
"""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import specdec_kernels
from specdec_kernels.decoding import SpeculativeDecoder, clear_graph_cache
from specdec_kernels.decoding import graphs
from specdec_kernels.demo import lossless_options, rows
from specdec_kernels.models import SpecDecDrafter
from specdec_kernels.models.specdec_drafter import SpecDecDrafterConfig

from decoding_support import left_padded, make_pair
from hf_support import VOCAB, one_thread

NEW = 12


def copy_into(kept, fresh):
    if isinstance(kept, torch.Tensor):
        if kept is not fresh:
            kept.copy_(fresh)
    elif dataclasses.is_dataclass(kept):
        for field in dataclasses.fields(kept):
            copy_into(getattr(kept, field.name), getattr(fresh, field.name))
    elif isinstance(kept, tuple):
        for a, b in zip(kept, fresh):
            copy_into(a, b)
    else:
        assert kept is None and fresh is None, (kept, fresh)


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Touched(TorchDispatchMode):
    """Storages an op read before any op of this run made them (`read`), and those made (`made`)."""

    FRESH = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)  # torch.tensor(data)

    def __init__(self):
        super().__init__()
        self.read, self.made = set(), set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.FRESH:
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and t.numel() and storage(t) not in self.made:
                    self.read.add(storage(t))
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel():
                self.made.add(storage(t))
        return out


class FakeGraphs:
    def __init__(self):
        self.captures, self.warm_ups, self.replays = [], 0, 0

    def available(self):
        return True

    def stream(self, device):
        return "capture stream"

    def warm_up(self, stream, fn, inputs):
        self.warm_ups += 1
        return fn(*inputs)

    def capture(self, stream, fn, inputs):
        graph = {"fn": fn, "inputs": inputs, "out": None}
        self.captures.append(graph)
        return graph

    def replay(self, graph):
        self.replays += 1
        with Touched() as touched:
            fresh = graph["fn"](*graph["inputs"])
        if graph["out"] is None:
            graph["out"] = fresh
            graph["fixed"] = touched.read | touched.made  # the addresses a captured graph would hold
        else:
            stray = touched.read - graph["fixed"]
            assert not stray, f"a replay read {len(stray)} tensor(s) its graph never held (not kept between calls)"
            copy_into(graph["out"], fresh)
        return graph["out"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture
def fake():
    backend = FakeGraphs()
    clear_graph_cache()
    with graphs.use_backend(backend):
        yield backend
    clear_graph_cache()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair("llama", tmp_path_factory.mktemp("sessions"))


def hf_greedy(target, ids, mask, new=NEW):
    return target.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)


def speculative(pair, ids, mask, **options):
    target, draft = pair
    options = {"max_new_tokens": NEW, "num_draft_tokens": 3, "cuda_graphs": True, **options}
    return specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative", draft_model=draft,
                                    pad_token_id=0, **options)


def test_plain_captures_only_its_verify_step(pair, fake):
    """plain's draft step makes an empty proposal: no kernel, so no graph (torch warns at an empty one;
    the H100 run printed that warning for plain)."""
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    out = specdec_kernels.generate(pair[0], ids, attention_mask=mask, strategy="plain", max_new_tokens=NEW,
                                   cuda_graphs=True, pad_token_id=0)
    assert torch.equal(out.sequences, hf_greedy(pair[0], ids, mask))
    assert out.stats.extra["cuda_graphs_captured"] == len(fake.captures) == 1 and fake.replays > 0


def test_second_call_with_the_same_shapes_captures_nothing(pair, fake):
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    first = speculative(pair, ids, mask)
    assert torch.equal(first.sequences, hf_greedy(pair[0], ids, mask))
    captured = len(fake.captures)
    assert captured >= 2 and first.stats.extra["cuda_graphs_captured"] == captured  # draft and verify steps
    replays = fake.replays

    ids, mask = left_padded([6, 6, 2, 4], seed=3)  # new prompts, same batch, same length bucket
    second = speculative(pair, ids, mask)
    assert len(fake.captures) == captured and second.stats.extra["cuda_graphs_captured"] == 0
    assert second.stats.extra["cuda_graphs_kept"] == captured
    assert fake.replays > replays  # it decoded through the first call's graphs
    assert torch.equal(second.sequences, hf_greedy(pair[0], ids, mask))
    assert torch.equal(second.sequences, speculative(pair, ids, mask, cuda_graphs=False).sequences)
    assert graphs.kept_sessions() == 1

    ids, mask = left_padded([5, 2], seed=4)  # another batch size: a session and graphs of its own
    third = speculative(pair, ids, mask)
    assert third.stats.extra["cuda_graphs_captured"] >= 2 and len(fake.captures) > captured
    assert torch.equal(third.sequences, hf_greedy(pair[0], ids, mask))
    assert graphs.kept_sessions() == 2


def test_a_shorter_budget_in_the_same_bucket_replays(pair, fake):
    """max_new_tokens is a device tensor, not a number baked into the graphs."""
    ids, mask = left_padded([4, 6], seed=5)
    speculative(pair, ids, mask, max_new_tokens=20)
    captured = len(fake.captures)
    short = speculative(pair, ids, mask, max_new_tokens=5)
    assert len(fake.captures) == captured
    assert torch.equal(short.sequences, hf_greedy(pair[0], ids, mask, new=5))
    eager = speculative(pair, ids, mask, max_new_tokens=5, cuda_graphs=False)
    assert (short.stats.steps, short.stats.emitted_tokens) == (eager.stats.steps, eager.stats.emitted_tokens)


def test_what_keys_a_session(pair, fake, monkeypatch):
    ids, mask = left_padded([3, 5], seed=6)
    speculative(pair, ids, mask)
    count = len(fake.captures)
    speculative(pair, ids, mask, num_draft_tokens=2)  # another configuration: new graphs
    assert len(fake.captures) > count
    count = len(fake.captures)
    sampled = speculative(pair, ids, mask, do_sample=True, seed=3, temperature=0.8)  # sampling is baked in
    assert len(fake.captures) > count
    assert torch.equal(sampled.sequences,
                       speculative(pair, ids, mask, do_sample=True, seed=3, temperature=0.8,
                                   cuda_graphs=False).sequences)
    count = len(fake.captures)
    again = speculative(pair, ids, mask, do_sample=True, seed=3, temperature=0.8)  # kept, seeds refilled
    assert len(fake.captures) == count and torch.equal(again.sequences, sampled.sequences)

    # a strategy object is matched by identity: the same one replays, an equal new one captures
    target, draft = pair
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=3)
    decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, cuda_graphs=True)
    count = len(fake.captures)
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, cuda_graphs=True)
    assert len(fake.captures) == count and torch.equal(out.sequences, hf_greedy(target, ids, mask))
    SpeculativeDecoder(target, draft, num_draft_tokens=3).generate(ids, attention_mask=mask, max_new_tokens=NEW,
                                                                   pad_token_id=0, cuda_graphs=True)
    assert len(fake.captures) > count


def test_sessions_are_bounded_and_cleared(pair, fake, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_SESSIONS", 1)
    one, one_mask = left_padded([3, 5], seed=7)
    three, three_mask = left_padded([3, 5, 2], seed=8)
    speculative(pair, one, one_mask)
    speculative(pair, three, three_mask)  # evicts the batch-2 session
    assert graphs.kept_sessions() == 1
    count = len(fake.captures)
    out = speculative(pair, one, one_mask)
    assert len(fake.captures) > count and torch.equal(out.sequences, hf_greedy(pair[0], one, one_mask))
    clear_graph_cache()
    assert graphs.kept_sessions() == 0
    count = len(fake.captures)
    speculative(pair, one, one_mask)
    assert len(fake.captures) > count
    monkeypatch.setattr(graphs, "MAX_SESSIONS", 0)  # keep none: every call captures afresh
    clear_graph_cache()
    for _ in range(2):
        count = len(fake.captures)
        out = speculative(pair, one, one_mask)
        assert len(fake.captures) > count and out.stats.extra["cuda_graphs_kept"] == 0
    assert graphs.kept_sessions() == 0


def test_eager_calls_keep_nothing(pair, fake):
    ids, mask = left_padded([3, 5], seed=9)
    speculative(pair, ids, mask, cuda_graphs=False)
    assert graphs.kept_sessions() == 0 and not fake.captures and not fake.warm_ups


def test_a_failed_call_drops_its_session(pair, fake, monkeypatch):
    ids, mask = left_padded([3, 5], seed=10)
    speculative(pair, ids, mask)
    assert graphs.kept_sessions() == 1

    def broken(self, *args, **kwargs):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(FakeGraphs, "replay", broken)
    with pytest.raises(RuntimeError, match="capture failed"):
        speculative(pair, ids, mask)
    assert graphs.kept_sessions() == 0


def drafter():
    torch.manual_seed(0)
    config = SpecDecDrafterConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  num_layers=1, max_position_embeddings=256, block_size=3, dropout=0.0)
    return SpecDecDrafter(config).eval()


def eagle_head(target):
    from specdec_kernels.training import new_head

    torch.manual_seed(0)
    layers = target.config.num_hidden_layers
    return new_head(target, aux_layers=(1, layers, layers), draft_ids=torch.arange(VOCAB)).eval()


@pytest.mark.parametrize("label", list(rows()))
def test_every_strategy_at_its_lossless_settings_replays_kept_graphs(pair, fake, label):
    """Every row of the demo (each strategy of the table, its tree form too) at its lossless settings."""
    target = pair[0]
    name, form = rows()[label]
    parts = {"draft": pair[1], "specdec_drafter": drafter(), "eagle3": eagle_head(target)}
    options, skipped = lossless_options(parts, target)
    assert name not in skipped  # (mtp, not a demo row, needs a target with MTP layers)
    options = {**options[name], **form}  # one drafter object for both calls (its identity is in the key)

    def run(ids, mask):
        return specdec_kernels.generate(target, ids, attention_mask=mask, strategy=name, max_new_tokens=NEW,
                                        pad_token_id=0, cuda_graphs=True, **options)

    ids, mask = left_padded([7, 3, 5], seed=11)
    first = run(ids, mask)
    assert torch.equal(first.sequences, hf_greedy(target, ids, mask))
    captured = len(fake.captures)
    assert captured >= 1
    ids, mask = left_padded([2, 6, 4], seed=12)
    second = run(ids, mask)
    assert len(fake.captures) == captured
    assert torch.equal(second.sequences, hf_greedy(target, ids, mask))


def test_moved_weights_capture_again(pair, fake):
    """A graph replays weight addresses: parameters re-allocated (same values, new storage) make a
    new key, not a replay of freed memory (the fake's address check would flag that replay)."""
    ids, mask = left_padded([3, 5], seed=13)
    speculative(pair, ids, mask)
    count = len(fake.captures)
    with torch.no_grad():
        for param in pair[1].parameters():  # the draft's
            param.data = param.data.clone()
    out = speculative(pair, ids, mask)
    assert len(fake.captures) > count and torch.equal(out.sequences, hf_greedy(pair[0], ids, mask))
