"""`generate(backend=...)` reaches every op a decoding step runs: the verify ops, and also the
attention of every target and draft forward (ops.tree_attention through the SpecCache, prefill
included), kv_compact and kv_rollback, and PPD's early-exit top-k. So the selftest and the
benchmarks run the backend they name.

A spy wraps `resolve` in every specdec_kernels.ops module (each imports it by name) and records,
for every op call of one generate, the op and the backend it resolved to. For every strategy on
the tiny default models (tests/default_models_support.py): backend="triton" (the interpreter on
the CPU) resolves every call to "triton" (kv_rollback, one add that only torch implements, to
"torch"), runs tree_attention and the strategy's cache op, and gives backend="torch"'s tokens;
backend="torch" resolves nothing elsewhere. Under the CPU fake of CUDA graphs, a kept session of
one backend is never replayed for another. A cache's backend is validated with a one-line error.
"""

import importlib
import os
import pkgutil

import pytest
import torch

import specdec_kernels
from specdec_kernels import ops
from specdec_kernels.common import registry
from specdec_kernels.decoding import LookupCache, clear_graph_cache, graphs
from specdec_kernels.decoding.engine import graphs_supported
from specdec_kernels.decoding.strategies import STRATEGIES as STRATEGY_TABLE
from specdec_kernels.demo import rows
from specdec_kernels.hf import SpecCache

from default_models_support import make_tiny_default_models
from hf_support import one_thread
from test_graph_sessions import FakeGraphs

NEW = 3  # tokens per call: the first step is already a whole step (draft, verify, rollback/compact)

# each demo row's options, and the ops (by the kernel that runs them) it must reach besides tree_attention:
# the one list of strategy names the tests keep (tests/test_strategy_table.py), checked to cover every row
STRATEGIES = {
    "plain": ({}, ()),
    "speculative": ({"num_draft_tokens": 2}, ("greedy_verify", "kv_rollback")),
    "speculative tree": ({"num_draft_tokens": 2, "tree_topk": 2, "tree_nodes": 3}, ("tree_greedy_verify", "kv_compact")),
    "specdec": ({"block_size": 2}, ("relaxed_verify", "kv_rollback")),
    # threshold 0: the small model never falls back, so every step drafts (max_prob) and verifies
    "bild": ({"fallback_threshold": 0.0, "max_small_run": 2}, ("max_prob", "bild_verify", "kv_rollback")),
    "ppd": ({"k": 2}, ("early_exit_topk", "kv_compact")),
    # random prompts never repeat themselves: the torch call's output, kept in the row's LookupCache, is
    # what the triton call (same prompts) drafts from; one earlier continuation makes a tree of one path,
    # which lookup verifies with the chain ops
    "lookup": ({"num_draft_tokens": 2, "lookup_cache": LookupCache()}, ("greedy_verify", "kv_rollback")),
    "lookup tree": ({"num_draft_tokens": 2, "tree_nodes": 3, "lookup_cache": LookupCache()},
                    ("greedy_verify", "kv_rollback")),
    # the head's own cache runs on the call's backend too (its attention is tree_attention)
    "eagle": ({"num_draft_tokens": 2}, ("greedy_verify", "kv_rollback")),
    "eagle tree": ({"num_draft_tokens": 2, "tree_topk": 2, "tree_nodes": 3}, ("tree_greedy_verify", "kv_compact")),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def device():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors need TRITON_INTERPRET=1 set before triton is imported")
    return torch.device("cpu")


@pytest.fixture(scope="module")
def models(device):
    made = make_tiny_default_models()
    for model in (made.target, made.draft, made.specdec_drafter, made.eagle3):
        model.to(device)
    return made


@pytest.fixture(scope="module")
def prompts(models, device):
    """Two left-padded rows of random ids (below the vocabulary, never EOS: the calls pass eos_token_id=[])."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, models.target.config.vocab_size, (2, 5), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids.to(device), mask.to(device)


class Spy:
    """(op, kernel op, resolved backend) of every resolve() call; `kernel` is the registered op that
    does the work (runs_as: fallback_check runs max_prob's kernels)."""

    def __init__(self):
        self.calls: list[tuple[str, str, str]] = []
        self.modules: list[str] = []

    def wrap(self, real):
        def resolve(op, backend, device, *, runs_as=None, sizes=None):
            chosen = real(op, backend, device, runs_as=runs_as, sizes=sizes)
            self.calls.append((op, runs_as or op, chosen))
            return chosen
        return resolve

    def kernels(self) -> set[str]:
        return {kernel for _, kernel, _ in self.calls}


@pytest.fixture
def spy(monkeypatch):
    spy = Spy()
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        if getattr(module, "resolve", None) is registry.resolve:
            monkeypatch.setattr(module, "resolve", spy.wrap(registry.resolve))
            spy.modules.append(info.name)
    # every module that defines an op: a new one must be found here too, not silently unwatched
    assert {"attention", "block_verification", "early_exit", "kv_cache", "logit_verify", "rejection_sampling",
            "tree_verify"} <= set(spy.modules)
    return spy


def expected_backend(kernel: str, backend: str) -> str:
    """What a call of `kernel` must resolve to under generate(backend=backend): that backend, or
    "torch" for an op it has no form of (kv_rollback: an add on the device, torch's form only)."""
    return backend if backend in ops.implemented_backends(kernel) else "torch"


def test_cases_cover_every_row():
    assert set(STRATEGIES) == set(rows())


def run(models, prompts, name: str, backend: str, **kwargs):
    options, _ = STRATEGIES[name]
    strategy = rows()[name][0]
    needs = STRATEGY_TABLE[strategy].partner  # the second model it cannot run without, from the tiny set
    partner = {needs.keyword: getattr(models, needs.part)} if needs is not None and needs.required else {}
    ids, mask = prompts
    return specdec_kernels.generate(models.target, ids, attention_mask=mask, strategy=strategy, max_new_tokens=NEW,
                                    eos_token_id=[], backend=backend, **partner, **options, **kwargs)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_op_of_a_step_runs_on_the_named_backend(models, prompts, spy, name):
    torch_out = run(models, prompts, name, "torch", cuda_graphs=False)
    stray = [call for call in spy.calls if call[2] != "torch"]
    assert spy.calls and not stray, f"backend='torch' resolved elsewhere: {stray}"

    spy.calls.clear()
    out = run(models, prompts, name, "triton", cuda_graphs=False)
    stray = [call for call in spy.calls if call[2] != expected_backend(call[1], "triton")]
    assert not stray, f"backend='triton' did not reach these calls (op, kernel, resolved): {sorted(set(stray))}"
    required = {"tree_attention", *STRATEGIES[name][1]}
    assert required <= spy.kernels(), f"never called: {sorted(required - spy.kernels())}"
    assert out.stats.drafted_tokens > 0 or not STRATEGIES[name][1]  # the ops ran on drafts, not on empty steps
    assert torch.equal(out.sequences, torch_out.sequences)


def test_kept_graphs_are_never_replayed_for_another_backend(models, prompts, spy):
    """CUDA graphs (the CPU fake of tests/test_graph_sessions.py: a replay re-runs the captured step):
    a torch call after a triton one gets its own session and caches, and a second triton call
    replays the first one's graphs, on triton, capturing nothing."""
    clear_graph_cache()
    try:
        with graphs.use_backend(FakeGraphs()):
            first = run(models, prompts, "speculative", "triton", cuda_graphs=True)
            assert first.stats.extra["cuda_graphs_captured"] >= 1
            spy.calls.clear()
            torch_out = run(models, prompts, "speculative", "torch", cuda_graphs=True)
            assert spy.calls and {backend for *_, backend in spy.calls} == {"torch"}
            spy.calls.clear()
            again = run(models, prompts, "speculative", "triton", cuda_graphs=True)
            assert again.stats.extra["cuda_graphs_captured"] == 0
            assert {"tree_attention", "kv_rollback"} <= spy.kernels()
            assert all(backend == expected_backend(kernel, "triton") for _, kernel, backend in spy.calls)
    finally:
        clear_graph_cache()
    assert torch.equal(first.sequences, torch_out.sequences) and torch.equal(again.sequences, torch_out.sequences)


def test_graphs_default_off_for_the_torch_backend():
    """The torch attention reads the rows' lengths back (a sync capture forbids): backend='torch' on
    a GPU decodes eagerly by default; the others keep graphs (no GPU needed to ask)."""
    gpu = torch.device("cuda")
    assert not graphs_supported(gpu, "torch") and not graphs_supported(torch.device("cpu"), "triton")
    assert graphs_supported(gpu, "auto") == graphs_supported(gpu, "triton") == graphs_supported(gpu)


def test_cache_backend_is_validated_and_carried(models):
    with pytest.raises(ValueError, match=r"^SpecCache: `backend` must be one of 'auto', 'torch', 'triton', 'cuda' "
                                         r"\(got 'gpu'\)$"):
        SpecCache(1, 1, 1, 4, 8, backend="gpu")
    assert SpecCache(1, 1, 1, 4, 8).backend == "auto"
    adapter = specdec_kernels.hf.adapt(models.draft)
    try:
        assert adapter.new_cache(2, 8, backend="triton").backend == "triton"
    finally:
        models.draft.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match=r"^generate: backend must be one of 'auto', 'torch', 'triton', 'cuda' "
                                         r"\(got 'gpu'\)$"):
        specdec_kernels.generate(models.target, torch.tensor([[5, 6]]), strategy="plain", max_new_tokens=1,
                                 backend="gpu")
