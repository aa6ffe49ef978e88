"""A call that dies mid-kernel cannot make a later call wrong.

The ticketed kernels hand the per-stream zeroed workspace back zeroed only if the last program of
every row finishes (common/workspace.py). Here a fault is injected into a running kernel under the
Triton interpreter: the third ticket a rejection_sample launch takes raises, so some programs have
stored partials and counted themselves and the rest never run. The counters are left non-zero;
the launch guard marks the stream, and the next call zeroes the buffer before trusting it, so it
answers exactly as the reference. A mutation check runs the same sequence with the guard disabled:
the stale tickets then elect a last program too early and the counters stay dirty. The guard is
the same for the CUDA launchers (`cuda._launch.on_device`); its bookkeeping is checked directly.
"""

import os

import pytest
import torch

from specdec_kernels import reference
from specdec_kernels.common import workspace
from specdec_kernels.triton import _tickets, rejection_sampling

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = torch.device("cpu")
interpreter_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                      reason="injects the fault into a kernel the Triton interpreter runs")
PLAN = dict(block_v=16, min_tiles=1)  # V = 200 in 13 splits: 13 tickets per row


class InjectedFault(RuntimeError):
    pass


def case(seed: int = 0, batch: int = 3, g: int = 3, vocab: int = 200) -> dict:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, g + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(batch, g, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    return dict(target_probs=p, draft_probs=q, draft_tokens=drafts,
                uniforms=torch.rand(batch, g + 1, generator=gen, dtype=torch.float64))


def dying_ticket(after: int):
    """`_tickets.last_ticket` that takes its ticket, then raises on the `after`-th call."""
    calls = [0]

    def last_ticket(counter_ptr, num_tickets):
        ticket = _tickets.last_ticket(counter_ptr, num_tickets)
        calls[0] += 1
        if calls[0] == after:
            raise InjectedFault(f"injected after {after} tickets")
        return ticket

    return last_ticket


def counters(batch: int) -> torch.Tensor:
    return workspace.zeroed_counters(DEVICE, batch).clone()


@pytest.fixture
def clean_workspace():
    for buffer in workspace._zeroed_workspaces.values():
        buffer.zero_()
    workspace._open_calls.clear()
    yield
    for buffer in workspace._zeroed_workspaces.values():
        buffer.zero_()  # leave the shared workspace as the next test expects it
    workspace._open_calls.clear()


def die_mid_kernel(monkeypatch, inputs):
    with monkeypatch.context() as patch:
        patch.setattr(rejection_sampling, "last_ticket", dying_ticket(after=3))
        with pytest.raises(Exception, match="injected after 3 tickets"):  # the interpreter wraps it
            rejection_sampling._launch(**inputs, **PLAN)


@interpreter_only
def test_a_call_after_a_fault_mid_kernel_is_exact(monkeypatch, clean_workspace):
    inputs = case()
    die_mid_kernel(monkeypatch, inputs)
    assert int(counters(3).count_nonzero()) > 0  # the dead launch left tickets behind
    assert workspace.left_dirty(DEVICE)
    for seed in (0, 1):  # the next calls: the reference's answer, the buffer handed back zeroed
        inputs = case(seed)
        got = rejection_sampling._launch(**inputs, **PLAN)
        want = reference.rejection_sample(**inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert int(counters(3).count_nonzero()) == 0 and not workspace.left_dirty(DEVICE)


@interpreter_only
def test_without_the_guard_the_stale_tickets_corrupt_later_calls(monkeypatch, clean_workspace):
    """Mutation check: the same fault, and the next call with the guard's zeroing switched off."""
    die_mid_kernel(monkeypatch, case())
    stale = counters(3)
    assert int(stale.count_nonzero()) > 0
    monkeypatch.setattr(workspace, "_open_calls", {})  # forget the dead call: nothing zeroes the buffer
    rejection_sampling._launch(**case(1), **PLAN)
    # a row with c stale tickets elects its last program c tickets early; the c late ones stay counted
    assert torch.equal(counters(3), stale)


def test_the_guard_zeroes_only_after_a_call_that_did_not_return(clean_workspace):
    """The bookkeeping the CUDA launchers share (`cuda._launch.on_device` enters the same guard)."""
    buffer = workspace.zeroed_workspace(DEVICE, 64)
    with workspace.launch_guard(DEVICE), workspace.launch_guard(DEVICE):  # nested: one call
        buffer[:8] = 7  # a kernel's ticket in flight
        buffer[:8] = 0  # ... handed back
    buffer[8] = 5  # what a finished call may not leave, but the guard trusts it: no memset per call
    with workspace.launch_guard(DEVICE):
        assert int(buffer[8]) == 5
    buffer[8] = 0
    with pytest.raises(InjectedFault):
        with workspace.launch_guard(DEVICE):
            with workspace.launch_guard(DEVICE):
                buffer[:4] = 3
                raise InjectedFault("a launcher raised after a kernel ran")
    assert workspace.left_dirty(DEVICE) and int(buffer.count_nonzero()) == 4
    with workspace.launch_guard(DEVICE):
        assert int(buffer.count_nonzero()) == 0  # zeroed before this call's kernels
    assert not workspace.left_dirty(DEVICE)
