"""GPU tests of block_verify / block_verify_logits on every GPU backend this machine has
(`gpu_support.backends_here`: triton, and cuda once csrc/block_verification*.cu is built and registered).

The kernel cases are the catalog's (selftest/cases_block_verification.py: a sample per op; `--gpu-tier full`:
all of "full": B up to 300, V up to 151936, every dtype and randomness mode, hostile rows with out-of-range
ids, g = 0, one-hot drafts, strided and int32 inputs, per-row temperatures, CUDA-graph
replays), through the public ops (or, for ids the op would refuse on the CPU, the backend
itself), judged as `specdec-kernels selftest` judges them: bit for bit for probabilities,
and for logits equal up to decisions within a tiny margin of their boundary
(`compare_block_logits`). Here besides: 20 back-to-back calls (the ticket protocol on real
hardware, the workspace left zeroed) and a CUDA-graph capture replayed on new inputs.
"""

import pytest

torch = pytest.importorskip("torch")

from catalog_support import check_case, gpu_catalog, gpu_profile, skip_unless_backend  # noqa: E402
from gpu_support import backends_here  # noqa: E402
from specdec_kernels import ops  # noqa: E402
from specdec_kernels.common import workspace as _workspace  # noqa: E402
from specdec_kernels.selftest.inputs import random_probs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
BACKENDS = ("triton", "cuda")
CATALOG_OPS = ("block_verify", "block_verify_logits")


def need(op: str, backend: str) -> None:
    if backend not in backends_here(op):
        pytest.skip(f"no {backend} backend of {op} here")


def assert_exact(got, want, vocab, what=""):
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        if not torch.equal(g_, w_):
            rows = (g_ != w_).reshape(g_.shape[0], -1).any(1).nonzero().flatten()[:5].tolist()
            raise AssertionError(f"{name} differs in rows {rows}: {g_[rows].tolist()} != {w_[rows].tolist()} {what}")
    final = got[0].gather(1, got[1].unsqueeze(1))
    assert bool(((final >= 0) & (final < vocab)).all())


@pytest.mark.parametrize("case,backend", gpu_catalog("cuda", CATALOG_OPS))
def test_catalog_case(case, backend):
    skip_unless_backend(case.op, backend, "cuda")
    check_case(case, backend, "cuda", profile=gpu_profile(), graphs=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["block_verify", "block_verify_logits"])
def test_repeat_calls_and_graph_replay(backend, op):
    need(op, backend)
    batch, g, vocab = 8, 4, 151936
    gen = torch.Generator(device=DEV).manual_seed(11)

    def build():
        target, draft, drafts = random_probs(batch, g, vocab, torch.bfloat16, gen, DEV)
        if op == "block_verify":
            return dict(target_probs=target, draft_probs=draft, draft_tokens=drafts, seed=5)
        return dict(target_logits=target.log(), draft_logits=draft.log(), draft_tokens=drafts, seed=5,
                    temperature=0.9)

    call = getattr(ops, op)
    static = build()
    first = call(**static, backend=backend)
    for _ in range(20):
        again = call(**static, backend=backend)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(int(buf.count_nonzero()) == 0 for buf in _workspace._zeroed_workspaces.values())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(**static, backend=backend)
    for _ in range(3):
        fresh = build()
        for k, v in fresh.items():
            if isinstance(v, torch.Tensor):
                static[k].copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        want = call(**static, backend="torch")
        if op == "block_verify":
            assert_exact(out, want, vocab)
        else:
            assert_exact(out, call(**static, backend=backend), vocab)  # the replay equals an eager call
