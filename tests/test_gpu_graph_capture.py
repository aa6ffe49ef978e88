"""GPU: the engine's GraphRunner warms up and captures on one stream, so a single-launch op's
per-stream workspace (common/workspace.py) cached at warm-up is found during capture: the graph
holds the op's kernel and no memset of a fresh buffer. Skips without CUDA or a built _C."""

import pytest
import torch

from gpu_support import CUDA_KERNEL_MARKS

pytestmark = CUDA_KERNEL_MARKS

from specdec_kernels import ops  # noqa: E402
from specdec_kernels.cuda import logit_verify_greedy as launcher  # noqa: E402
from specdec_kernels.decoding.graphs import GraphRunner  # noqa: E402


def test_capture_finds_the_warm_up_workspace(monkeypatch):
    seen = []
    real = launcher.zeroed_workspace

    def spy(device, nbytes):
        buffer = real(device, nbytes)
        seen.append((buffer.data_ptr(), torch.cuda.is_current_stream_capturing()))
        return buffer

    monkeypatch.setattr(launcher, "zeroed_workspace", spy)
    runner = GraphRunner(True, torch.device("cuda"))
    logits = torch.randn(4, 6, 32000, device="cuda")
    drafts = logits[:, :5].argmax(-1)

    def step(logits, drafts):
        return ops.greedy_verify(logits, drafts, backend="cuda")

    runner("verify", step, logits, drafts)  # warm-up, on the runner's stream
    runner("verify", step, logits, drafts)  # capture on that stream, replay
    assert [capturing for _, capturing in seen] == [False, True]
    assert seen[0][0] == seen[1][0], "the capture took a fresh workspace (and captured its memset)"
    for _ in range(3):
        logits = torch.randn(4, 6, 32000, device="cuda")
        drafts = logits[:, :5].argmax(-1)
        drafts[:, 2] = -1
        out, accepted = runner("verify", step, logits, drafts)  # inputs copied into the captured ones
        want = ops.greedy_verify(logits, drafts, backend="torch")
        assert torch.equal(out, want[0]) and torch.equal(accepted, want[1])
    assert len(seen) == 2  # replays allocate nothing
