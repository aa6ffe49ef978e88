"""The kernel case catalog (specdec_kernels/selftest/cases_*.py) as pytest parameters.

The CPU interpreter tests (tests/test_triton_*.py), the GPU tests (tests/test_gpu_*.py) and
`specdec-kernels selftest` draw their kernel cases from the same catalog, each at its own
size tier: "tiny" on the CPU (Triton under the interpreter), "quick" and "full" on a GPU.
A case is judged exactly as the selftest judges it (selftest.run_case), so a failure here
reads like a failure there.
"""

import pytest
import torch

from specdec_kernels import selftest
from specdec_kernels.selftest.model import FAIL, PASS, Plan


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
    selftest's own message when the backend's answer (or its graph replay) is wrong."""
    device = torch.device(device)
    plan = Plan(device=device, profile=profile, backends=(backend,), explicit_backends=True, ops=(case.op,),
                graphs=graphs, engine=False, seed=seed)
    results = selftest.run_case(plan, case, (backend,))
    failures = [f"{r.op} [{r.backend}] {r.case} {r.dtype}: {r.message} (error {r.error})"
                for r in results if r.status == FAIL]
    assert not failures, "\n".join(failures)
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
