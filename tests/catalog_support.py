"""The kernel case catalog (specdec_kernels/selftest/cases_*.py) as pytest parameters.

The CPU interpreter tests (tests/test_triton_*.py), the GPU tests (tests/test_gpu_*.py) and
`specdec-kernels selftest` draw their kernel cases from the same catalog, each at its own
size tier: "tiny" on the CPU (Triton under the interpreter), "quick" and "full" on a GPU.
A case is judged exactly as the selftest judges it (selftest.run_case), so a failure here
reads like a failure there.
"""

import os

import pytest
import torch

from specdec_kernels import selftest
from specdec_kernels.selftest.model import FAIL, PASS, SKIP, Plan
from specdec_kernels.selftest.runner import REFUSAL
from specdec_kernels.selftest.tiers import CONTROL, spread

# The GPU tests' tiers (`pytest -m gpu --gpu-tier quick|full`; tests/conftest.py sets these variables).
# quick (the default): at most QUICK_CASES_PER_OP of each op's cases at the catalog's "quick" profile, per
# backend, spread over its list; sized so that `pytest -m gpu` fits ~3 minutes on 12 workers of an H100
# machine (bench/gpu_test_budget.py estimates it from the 2026-11-27 run). full: every case at "full".
TIERS = ("quick", "full")
TIER_VARIABLE, FOCUS_VARIABLE = "SPECDEC_GPU_TIER", "SPECDEC_GPU_FOCUS"
QUICK_CASES_PER_OP = 32


def catalog_cases(profile: str, device, ops=None, *, where=lambda case: True) -> list:
    """pytest.param(case) for every catalog case of `ops` (names; None = all) at `profile`
    on `device` that `where(case)` keeps, with readable ids."""
    device = torch.device(device)
    params = []
    for family in selftest.CASE_FAMILIES:
        for case in family(profile, device):
            if (ops is None or case.op in ops) and where(case):
                dtype = "-" if case.dtype is None else str(case.dtype).replace("torch.", "")
                params.append(pytest.param(case, id=f"{case.op}[{case.name}]-{dtype}"))
    return params


def check_case(case, backend: str, device, *, profile: str = "tiny", seed: int = 0, graphs: bool = False) -> None:
    """Run `case` on `backend` against its reference, as the selftest does; fail with the
    selftest's own message when the backend's answer (or its graph replay) is wrong.

    A case the backend's launch limits refuse fails too: the catalog holds what every backend must
    serve, so a refusal is a regression of the limits, unless the case leaves that backend out by
    design (`Case.backends`, then this skips). Only what this machine lacks (a GPU too small for the
    production shapes) skips."""
    device = torch.device(device)
    if case.backends and backend not in case.backends:
        pytest.skip(f"{case.op} [{case.name}] leaves {backend} out by design (Case.backends)")
    plan = Plan(device=device, profile=profile, backends=(backend,), explicit_backends=True, ops=(case.op,),
                graphs=graphs, engine=False, seed=seed)
    results = selftest.run_case(plan, case, (backend,))
    failures = [f"{r.op} [{r.backend}] {r.case} {r.dtype}: {r.message} (error {r.error})"
                for r in results if r.status == FAIL]
    assert not failures, "\n".join(failures)
    refused = [f"{r.op} [{r.backend}] {r.case} {r.dtype}: {r.message}" for r in results
               if r.status == SKIP and REFUSAL in r.message]
    assert not refused, ("the launch limits refuse a catalog case (leave the backend out of the case's "
                         "`backends` if that is by design):\n" + "\n".join(refused))
    if not any(r.status == PASS for r in results):
        pytest.skip("; ".join(r.message for r in results) or "nothing ran")


def skip_unless_backend(op: str, backend: str, device) -> None:
    """Skip (not fail) when `backend` cannot run `op` on `device` here: no built _C for cuda, no
    triton, or no form of the op for that backend."""
    from specdec_kernels import ops

    try:
        ops.resolve(op, backend, torch.device(device))
    except (ValueError, RuntimeError) as error:
        pytest.skip(f"{op} on {backend}: {error}")


def gpu_tier() -> str:
    """The GPU tests' tier: $SPECDEC_GPU_TIER, "quick" when unset."""
    tier = os.environ.get(TIER_VARIABLE) or "quick"
    if tier not in TIERS:
        raise ValueError(f"{TIER_VARIABLE} (--gpu-tier) must be one of {', '.join(TIERS)} (got {tier!r})")
    return tier


def gpu_profile() -> str:
    """The catalog profile of the tier's cases."""
    return "full" if gpu_tier() == "full" else "quick"


def gpu_focus() -> set | None:
    """$SPECDEC_GPU_FOCUS ("op/backend" or "op" items, comma-separated; --gpu-focus): the kernels that get the
    tier's cases; every other (op, backend) gets a control sample. None (unset): every kernel gets the tier."""
    text = os.environ.get(FOCUS_VARIABLE)
    if text is None:
        return None
    focus = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, _, backend = item.partition("/")
        focus |= {(op, backend)} if backend else {(op, "cuda"), (op, "triton")}  # an op alone: both backends
    return focus


def gpu_catalog(device, ops, backends=("cuda", "triton")) -> list:
    """pytest.param(case, backend) of the GPU tier for every catalog case of `ops` on each of `backends`:
    the tier's sample of each op (quick: QUICK_CASES_PER_OP spread over the op's list; full: all), or a
    control sample of CONTROL cases for a kernel outside the focus."""
    tier, focus = gpu_tier(), gpu_focus()
    params = []
    for op in ops:
        cases = [p.values[0] for p in catalog_cases(gpu_profile(), device, (op,))]
        for backend in backends:
            limit = None if tier == "full" else QUICK_CASES_PER_OP
            if focus is not None and (op, backend) not in focus:
                limit = CONTROL
            for case in spread(cases, limit):
                dtype = "-" if case.dtype is None else str(case.dtype).replace("torch.", "")
                params.append(pytest.param(case, backend, id=f"{case.op}[{case.name}]-{dtype}-{backend}"))
    return params
