"""`specdec-kernels selftest --quick` is quick whatever the catalog holds: at most tiers.SELFTEST_QUICK cases per
op, spread over its list; `--control-ops` adds ops at a control sample after the others; `--ops` runs in the
order given (the first GPU look puts the never-run kernels first). The plan is checked with the checks stubbed:
which cases run, in which order, not their answers (the interpreter tests judge those)."""

import argparse

import torch

from specdec_kernels import selftest
from specdec_kernels.selftest import runner
from specdec_kernels.selftest.model import PASS, Result
from specdec_kernels.selftest.tiers import CONTROL, SELFTEST_QUICK, spread

CPU = torch.device("cpu")


def tiny(op):
    return [case for family in selftest.CASE_FAMILIES for case in family("tiny", CPU) if case.op == op]


def stub_run_case(seen):
    def run_case(plan, case, backends):
        seen.append((case.op, case.name, case.dtype))
        return [Result(case.op, backend, case.name, "-", PASS) for backend in backends]
    return run_case


def test_execute_takes_the_plans_cases_per_op_in_the_plans_op_order(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run_case", stub_run_case(seen))
    plan = selftest.Plan(device=CPU, profile="tiny", backends=("triton",), explicit_backends=False,
                         ops=("tree_greedy_verify", "greedy_verify", "kv_compact"), graphs=False, engine=False, seed=0,
                         cases_per_op={"tree_greedy_verify": 5, "kv_compact": CONTROL})
    runner.execute(plan)
    ops_in_order = list(dict.fromkeys(op for op, _, _ in seen))
    assert ops_in_order == ["tree_greedy_verify", "greedy_verify", "kv_compact"]
    picked = {op: [(name, dtype) for o, name, dtype in seen if o == op] for op in ops_in_order}
    assert picked["tree_greedy_verify"] == [(c.name, c.dtype) for c in spread(tiny("tree_greedy_verify"), 5)]
    assert len(picked["greedy_verify"]) == len(tiny("greedy_verify"))  # no limit named: every case
    assert len(picked["kv_compact"]) == CONTROL < len(tiny("kv_compact"))


def plan_of(monkeypatch, *argv):
    """The Plan `selftest` builds from a command line (its execution stubbed out)."""
    parser = argparse.ArgumentParser()
    selftest.add_arguments(parser)
    plans = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the dev mode re-runs itself without it
    monkeypatch.setattr(selftest, "execute", lambda plan, progress: plans.append(plan) or [])
    selftest.run(parser.parse_args(["--device", "cpu", *argv]))
    plan, = plans
    return plan


def test_quick_caps_every_op_and_control_ops_come_after(monkeypatch):
    plan = plan_of(monkeypatch, "--quick", "--ops", "tree_rejection_sample,block_verify,engine",
                   "--control-ops", "kv_compact,block_verify")
    assert plan.ops == ("tree_rejection_sample", "block_verify", "engine", "kv_compact")  # as given; no duplicate
    assert plan.cases_per_op == {"tree_rejection_sample": SELFTEST_QUICK, "block_verify": SELFTEST_QUICK,
                                 "engine": SELFTEST_QUICK, "kv_compact": CONTROL}


def test_without_quick_every_case_runs(monkeypatch):
    plan = plan_of(monkeypatch, "--ops", "greedy_verify")
    assert plan.ops == ("greedy_verify",) and plan.cases_per_op == {}
    assert plan_of(monkeypatch, "--control-ops", "kv_compact").ops == ("kv_compact",)


def test_an_unknown_control_op_is_refused_in_one_line(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    selftest.add_arguments(parser)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert selftest.run(parser.parse_args(["--device", "cpu", "--control-ops", "kv_compact,nope"])) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"specdec-kernels selftest: --control-ops: unknown nope; known: {', '.join((*selftest_ops(), 'engine'))}"]


def selftest_ops():
    from specdec_kernels import ops
    return ops.registered_ops()


def test_a_catalog_case_the_launch_limits_refuse_fails_its_test(monkeypatch):
    """tests/catalog_support.check_case: a refusal by the launch limits is a failure (a regression of the
    limits would otherwise read as skips), unless the case leaves the backend out by design."""
    import dataclasses

    import pytest
    from catalog_support import check_case
    from specdec_kernels.common import registry

    case = next(c for c in selftest.CASE_FAMILIES[0]("tiny", torch.device("cpu")) if c.op == "greedy_verify")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(registry._LIMITS, ("greedy_verify", "triton"), lambda sizes: "a mutation refuses every call")
    with pytest.raises(AssertionError, match="the launch limits refuse a catalog case"):
        check_case(case, "triton", "cpu")
    with pytest.raises(pytest.skip.Exception, match="leaves triton out by design"):
        check_case(dataclasses.replace(case, backends=("cuda",)), "triton", "cpu")
