"""The selftest checks both forms of the CUDA tree sampler where the device has both (sm_90: the cluster form and
the split form, SPECDEC_TREE_FORM), under a repeated-call stress: `auto` picks one form per shape, so the other
would otherwise go unchecked on that GPU. On the CPU: which forms a device gets, the environment around each run,
a form the plan refuses as a skip (any other error a failure), and the stress rows of the catalog."""

import os

import pytest
import torch

from specdec_kernels import selftest
from specdec_kernels.selftest import runner
from specdec_kernels.selftest.cases_tree_verify import run_rejection, tree_verify_cases
from specdec_kernels.selftest.model import Case, Plan
from specdec_kernels.selftest.tiers import CONTROL, SELFTEST_QUICK, spread

CPU = torch.device("cpu")


@pytest.mark.parametrize("capability, forms", [((9, 0), ("split", "cluster")), ((10, 0), ("split", "cluster")),
                                               ((8, 0), (None,)), ((8, 9), (None,))])
def test_the_forms_a_device_gets(monkeypatch, capability, forms):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    case = next(c for c in tree_verify_cases("tiny", CPU) if c.op == "tree_rejection_sample")
    assert runner._forms(case, "cuda", torch.device("cuda")) == forms
    assert runner._forms(case, "triton", torch.device("cuda")) == (None,)  # one Triton kernel
    greedy = next(c for c in tree_verify_cases("tiny", CPU) if c.op == "tree_greedy_verify")
    assert runner._forms(greedy, "cuda", torch.device("cuda")) == (None,)


def test_each_form_runs_under_its_environment_and_a_refused_form_is_a_skip(monkeypatch):
    monkeypatch.setattr(runner, "_forms", lambda case, backend, device: ("split", "cluster"))
    monkeypatch.setenv("SPECDEC_TREE_FORM", "auto")
    seen = []

    def run(inputs, backend):
        form = os.environ["SPECDEC_TREE_FORM"]
        seen.append(form)
        if backend == "torch":
            return (torch.zeros(2),)
        if form == "cluster" and inputs["refuse"] == "plan":
            raise ValueError("specdec_kernels.tree_rejection_sample: the cluster form's 64 clusters of 8 CTAs do "
                             "not fit one wave (49 at once)")
        if form == "cluster" and inputs["refuse"] == "bug":
            raise ValueError("specdec_kernels.tree_rejection_sample: null device pointer")
        return (torch.zeros(2),)

    def compare(got, want, inputs):
        return 0.0, None if torch.equal(got[0], want[0]) else "differs"

    plan = Plan(device=CPU, profile="tiny", backends=("cuda",), explicit_backends=False, ops=(), graphs=False,
                engine=False, seed=0)
    for refuse, cluster_status in (("no", "pass"), ("plan", "skip"), ("bug", "fail")):
        case = Case("tree_rejection_sample", "a case", None, lambda seed, r=refuse: {"refuse": r}, run, compare)
        results = selftest.run_case(plan, case, ("cuda",))
        assert [(r.case, r.status) for r in results] == [("a case [split form]", "pass"),
                                                         ("a case [cluster form]", cluster_status)], refuse
    assert set(seen) == {"split", "cluster", "auto"} and os.environ["SPECDEC_TREE_FORM"] == "auto"  # restored


def test_every_quick_and_control_sample_has_a_repeated_call_stress():
    for profile in ("quick", "full"):
        cases = [c for c in tree_verify_cases(profile, CPU) if c.op == "tree_rejection_sample"]
        for limit in (SELFTEST_QUICK, CONTROL):
            assert any("repeated calls" in c.name for c in spread(cases, limit)), (profile, limit)


def test_repeated_calls_stack_every_call_and_the_reference_once(monkeypatch):
    case = next(c for c in tree_verify_cases("tiny", CPU) if c.op == "tree_rejection_sample" and "ragged" in c.name)
    inputs = dict(case.build(0), repeat=3)
    inputs.pop("triton_overrides", None)
    calls = []
    from specdec_kernels import ops

    real = ops.tree_rejection_sample
    monkeypatch.setattr(ops, "tree_rejection_sample", lambda *a, **k: calls.append(k["backend"]) or real(*a, **k))
    want = run_rejection(inputs, "torch")
    got = run_rejection(inputs, "triton")
    assert calls == ["torch", "triton", "triton", "triton"]
    assert all(g.shape[0] == 3 and torch.equal(g, w) for g, w in zip(got, want))
