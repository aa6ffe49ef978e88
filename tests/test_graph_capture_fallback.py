"""A CUDA-graph capture that raises does not fail `generate`: one RuntimeWarning, and the call
finishes eagerly with the eager path's tokens (decoding/graphs.py's module docstring).

On the CPU through the fake of test_graph_sessions.py, whose capture, like CUDA's, runs nothing: here
it raises instead of recording, at a chosen capture of the call (the first: the draft step; the
second: the verify step, after the draft step's graph was captured and replayed). Rows finish at
different steps (an EOS id), so the eager rest of a graph-mode call meets finished rows that stay in
the batch. A GPU test makes torch itself refuse a capture (a host sync while capturing).
"""

import warnings

import pytest
import torch

import specdec_kernels
from specdec_kernels.decoding import clear_graph_cache
from specdec_kernels.decoding import graphs

from decoding_support import left_padded, make_pair
from hf_support import one_thread
from test_graph_sessions import FakeGraphs

NEW = 12
MESSAGE = "capturing the CUDA graph of step"


class FailingCapture(FakeGraphs):
    """FakeGraphs whose captures number `fail` (0-based, counted over the backend's life) raise as
    torch does for an op a capturing stream refuses."""

    def __init__(self, *fail: int):
        super().__init__()
        self.fail, self.attempts = set(fail), 0

    def capture(self, stream, fn, inputs):
        self.attempts += 1
        if self.attempts - 1 in self.fail:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\n"
                               "CUDA kernel errors might be asynchronously reported")
        return super().capture(stream, fn, inputs)


def hf_greedy(target, ids, mask, **options):
    return target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, **options)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(autouse=True)
def _no_kept_sessions():
    clear_graph_cache()
    yield
    clear_graph_cache()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair("llama", tmp_path_factory.mktemp("capture_fallback"))


@pytest.fixture(scope="module")
def prompts(pair):
    """(ids, mask, eos): row 0 meets `eos` after 4 new tokens, the others later or never."""
    ids, mask = left_padded([7, 3, 5], seed=21)
    eos = int(hf_greedy(pair[0], ids, mask)[0, ids.shape[1] + 3])
    return ids, mask, eos


OPTIONS = {
    "plain": lambda pair: {},
    "speculative": lambda pair: {"draft_model": pair[1], "num_draft_tokens": 3},
}


def generate(pair, prompts, strategy, **options):
    ids, mask, eos = prompts
    return specdec_kernels.generate(pair[0], ids, attention_mask=mask, strategy=strategy, max_new_tokens=NEW,
                                    pad_token_id=0, eos_token_id=eos, **OPTIONS[strategy](pair), **options)


def with_warnings(run):
    """(run(), the fallback's warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count every one, repeats included
        out = run()
    return out, [w for w in caught if issubclass(w.category, RuntimeWarning) and MESSAGE in str(w.message)]


# plain's first capture is its verify step: its draft step is empty and never captured
@pytest.mark.parametrize("strategy, fail, step", [("plain", 0, "verify"), ("speculative", 0, "draft"),
                                                  ("speculative", 1, "verify")])
def test_a_failed_capture_warns_once_and_the_call_runs_eagerly(pair, prompts, strategy, fail, step):
    eager = generate(pair, prompts, strategy, cuda_graphs=False)
    backend = FailingCapture(fail)
    with graphs.use_backend(backend):
        out, caught = with_warnings(lambda: generate(pair, prompts, strategy, cuda_graphs=True))
    assert torch.equal(out.sequences, eager.sequences)
    assert torch.equal(out.sequences, hf_greedy(pair[0], *prompts[:2], eos_token_id=prompts[2]))
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert "operation not permitted when stream is capturing" in message and "eagerly" in message
    assert "\n" not in message and f"'{step}'" in message  # the step that failed
    assert backend.attempts == fail + 1  # eager after the failure: no further capture, no further warning
    assert backend.replays > 0 if fail else backend.replays == 0  # the draft graph replayed before the verify capture
    assert out.stats.extra["cuda_graphs_kept"] == 0 and graphs.kept_sessions() == 0  # half made: not kept


def test_the_next_call_captures_again(pair, prompts):
    """The failed call's session is discarded: the next call of the same key captures afresh and keeps
    its graphs, and the one after replays them."""
    backend = FailingCapture(0)  # only the first capture fails (a transient failure)
    want = hf_greedy(pair[0], *prompts[:2], eos_token_id=prompts[2])
    with graphs.use_backend(backend):
        first, caught = with_warnings(lambda: generate(pair, prompts, "speculative", cuda_graphs=True))
        assert len(caught) == 1 and graphs.kept_sessions() == 0
        second, caught = with_warnings(lambda: generate(pair, prompts, "speculative", cuda_graphs=True))
        assert not caught and graphs.kept_sessions() == 1
        captured = len(backend.captures)
        assert captured >= 2 and second.stats.extra["cuda_graphs_captured"] == captured
        third, caught = with_warnings(lambda: generate(pair, prompts, "speculative", cuda_graphs=True))
        assert not caught and len(backend.captures) == captured and third.stats.extra["cuda_graphs_kept"] == captured
    for out in (first, second, third):
        assert torch.equal(out.sequences, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_torch_refusing_a_capture_on_the_gpu():
    """A host sync while capturing: torch raises, the runner warns and reruns the step eagerly; the
    step's in-place write ran once per call (the failed capture ran nothing), and the caller's stream
    is current again."""
    runner = graphs.GraphRunner(True, torch.device("cuda"))
    state = torch.zeros((), device="cuda")

    def step(x):
        state.add_(1)
        return x * int(state.item())  # .item() syncs: a capturing stream refuses it

    x = torch.arange(4.0, device="cuda")
    assert torch.equal(runner("step", step, x), x)  # warm-up, eager
    out, caught = with_warnings(lambda: runner("step", step, x))  # the capture fails, the step runs eagerly
    assert len(caught) == 1 and runner.failed and not runner.graphs
    assert torch.equal(out, x * 2) and int(state.item()) == 2
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert torch.equal(runner("step", step, x), x * 3)  # later steps: eager, no capture, no warning
