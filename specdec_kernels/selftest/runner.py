"""Running the checks: every backend on each case against the reference, its CUDA-graph replay,
the engine check (engine.py), and the stop after a CUDA error that poisons the context."""

import os
import time
from typing import Callable

import torch

from ..cuda.tree_verify import forced_tree_form
from .cases_attention import attention_cases
from .cases_block_verification import block_verification_cases
from .cases_early_exit import early_exit_cases
from .cases_kv_cache import kv_cases
from .cases_logit_verify import logit_verify_cases
from .cases_rejection_sampling import rejection_sampling_cases
from .cases_tree_verify import tree_verify_cases
from .device import ContextLost, context_alive, describe_error, sync
from .engine import run_engine
from .model import FAIL, PASS, SKIP, Case, Plan, Result
from .tiers import spread

CASE_FAMILIES = (logit_verify_cases, rejection_sampling_cases, block_verification_cases, tree_verify_cases,
                 attention_cases, kv_cases, early_exit_cases)
REFUSAL = "cannot serve this call"  # what a backend past its registered launch limits says (common/registry.py)
FORM_REFUSAL = "the cluster form"  # what the CUDA tree plan says where a forced cluster form cannot run
# bench/gpu_first_look.sh's dry run and tests/test_selftest_watchdog.py: every check of the op named here blocks,
# as a synchronize behind a deadlocked kernel would, so that the watchdog's handling of a hang shows without a GPU
STAND_IN_HANG = "SPECDEC_SELFTEST_STAND_IN_HANG"


def _forms(case: Case, backend: str, device) -> tuple:
    """The forms a check runs a kernel in: tree_rejection_sample's CUDA kernel in its split form and, where
    the device has thread-block clusters (sm_90 and later), its cluster form too (SPECDEC_TREE_FORM), since
    auto picks only one of them per shape; (None,): one plain run."""
    if (case.op == "tree_rejection_sample" and backend == "cuda" and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (9, 0)):
        return ("split", "cluster")
    return (None,)


def _starting(plan: Plan, op: str, backend: str, name: str) -> None:
    """Tell the watchdog (plan.on_check) which check starts; the stand-in hang blocks here."""
    if plan.on_check is not None:
        plan.on_check(op, backend, name)
    if os.environ.get(STAND_IN_HANG) == op:
        while True:
            time.sleep(3600)


def _copy_into(static: dict, fresh: dict) -> None:
    """Write a new problem's values into the captured graph's input tensors (same shapes)."""
    for name, value in static.items():
        new = fresh[name]
        if isinstance(value, torch.Tensor):
            value.copy_(new)
        elif isinstance(value, list):
            for old, replacement in zip(value, new):
                old.copy_(replacement)
        # python scalars (thresholds, k, max_depth) are baked into the graph's launch: they stay


def _not_available(op, backend, device) -> str | None:
    """Why `backend` cannot run `op` on `device` here (no _C, no triton), or None."""
    from .. import ops

    try:
        ops.resolve(op, backend, device)
    except (ValueError, RuntimeError) as error:
        return str(error)
    return None


def run_case(plan: Plan, case: Case, backends: tuple) -> list[Result]:
    """Every backend on one case (and its CUDA-graph replay), against the reference."""
    device = plan.device
    dtype = "-" if case.dtype is None else str(case.dtype).replace("torch.", "")
    results = []

    def result(backend, name, status, error=None, message="", start=None):
        results.append(Result(case.op, backend, name, dtype, status, error, message,
                              0.0 if start is None else time.perf_counter() - start))

    try:
        inputs = case.build(plan.seed)
        want = case.reference(inputs) if case.reference else case.run(inputs, "torch")
        sync(device)
    except torch.cuda.OutOfMemoryError:
        # the production shapes need a few GiB beside the reference's intermediates: a smaller GPU skips them
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        for backend in backends:
            result(backend, case.name, SKIP, message=f"the inputs and the reference do not fit in this GPU's "
                                                     f"{total:.0f} GiB")
        torch.cuda.empty_cache()
        return results
    except Exception as error:  # noqa: BLE001 - a broken case builder is a selftest failure, reported
        for backend in backends:
            result(backend, case.name, FAIL, message=f"building the case or the reference failed: {describe_error(error)}")
        if not context_alive(device):
            raise ContextLost(f"{case.op} {case.name} (reference)", results) from error
        return results
    for backend in backends:
        for form in _forms(case, backend, device):
            with forced_tree_form(form):
                _check(plan, case, backend, inputs, want, "" if form is None else f" [{form} form]", result, results)
    return results


def _check(plan: Plan, case: Case, backend: str, inputs: dict, want, suffix: str, result: Callable,
           results: list) -> None:
    """One backend on one case (and its CUDA-graph replay), recorded through result(backend, name, ...) into
    `results` (what a lost context reports)."""
    device, name = plan.device, case.name + suffix
    start = time.perf_counter()
    try:
        _starting(plan, case.op, backend, name)
        got = case.run(inputs, backend)
        sync(device)
        error, problem = case.compare(got, want, inputs)
        result(backend, name, FAIL if problem else PASS, error, problem or "", start)
    except Exception as error:  # noqa: BLE001
        message = describe_error(error)
        if isinstance(error, ValueError) and (REFUSAL in message or (suffix and FORM_REFUSAL in message)):
            result(backend, name, SKIP, message=message, start=start)  # past a launch limit, or a form's
            return
        result(backend, name, FAIL, message=message, start=start)
        if not context_alive(device):
            raise ContextLost(f"{case.op} [{backend}] {name}", results) from error
        return
    if case.graph and plan.graphs and (device.type == "cuda" or plan.capture is not None):
        start = time.perf_counter()
        try:
            _starting(plan, case.op, backend, name + " graph")
            error, problem = graph_check(plan, case, backend)
            result(backend, name + " graph", FAIL if problem else PASS, error, problem or "", start)
        except Exception as error:  # noqa: BLE001
            result(backend, name + " graph", FAIL, message=describe_error(error), start=start)
            if not context_alive(device):
                raise ContextLost(f"{case.op} [{backend}] {name} graph", results) from error


def cuda_graph_capture(device: torch.device, fn):
    """fn captured in a CUDA graph after a warm-up on the capture stream: (its outputs, replay)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()  # warm-up: compilation, cached workspaces and pointer tables exist before the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warm-up's stream: per-stream workspaces already exist
        outputs = fn()

    def replay():
        graph.replay()
        torch.cuda.synchronize(device)
    return outputs, replay


def graph_check(plan: Plan, case: Case, backend: str):
    """Capture the op once, write another problem's values into the captured inputs, replay:
    the replay must solve the new problem (nothing data-dependent baked in) and equal the
    reference and an eager call on it."""
    static = case.build(plan.seed + 101)
    captured, replay = (plan.capture or cuda_graph_capture)(plan.device, lambda: case.run(static, backend))
    _copy_into(static, case.build(plan.seed + 202))
    replay()
    replayed = tuple(t.clone() for t in captured)
    want = case.reference(static) if case.reference else case.run(static, "torch")
    error, problem = case.compare(replayed, want, static)
    if problem:
        return error, f"replay vs reference: {problem}"
    eager = case.run(static, backend)
    _, problem = case.compare(replayed, eager, static)
    return error, None if problem is None else f"replay vs eager: {problem}"


def execute(plan: Plan, progress: Callable = lambda op, done, seconds: None) -> list[Result]:
    """Run the plan's checks, calling progress(op, its results) after each op; a lost CUDA
    context stops the remaining GPU checks (they are reported as skipped)."""
    from .. import ops

    results = plan.results
    cases = [case for family in CASE_FAMILIES for case in family(plan.profile, plan.device) if case.op in plan.ops]
    lost = None
    by_op: dict[str, list[Case]] = {}
    for case in cases:
        by_op.setdefault(case.op, []).append(case)
    for op in plan.ops:
        op_cases = spread(by_op.get(op, []), plan.cases_per_op.get(op))
        if op == "engine" or not op_cases:
            continue
        started, before = time.perf_counter(), len(results)
        for case in op_cases:
            backends = case.backends or tuple(b for b in plan.backends if b in ops.implemented_backends(op) and b != "torch")
            available, missing = [], []
            for backend in backends:
                reason = _not_available(op, backend, plan.device)
                (missing if reason else available).append((backend, reason))
            for backend, reason in missing:
                status = FAIL if plan.explicit_backends else SKIP
                results.append(Result(op, backend, case.name, "-" if case.dtype is None else str(case.dtype)[6:],
                                      status, message=reason))
            if lost is not None:
                for backend, _ in available:
                    results.append(Result(op, backend, case.name, "-" if case.dtype is None else str(case.dtype)[6:],
                                          SKIP, message=f"not run: the CUDA context was lost at {lost}"))
                continue
            if available:
                try:
                    results.extend(run_case(plan, case, tuple(b for b, _ in available)))
                except ContextLost as error:
                    lost = str(error)
                    results.extend(error.results)
                    results.append(Result(op, "-", "CUDA context", "-", FAIL,
                                          message=f"a CUDA error poisoned the context at {lost}; the remaining GPU "
                                                  "checks are not run (rerun with --ops to isolate)"))
        if plan.device.type == "cuda":
            torch.cuda.empty_cache()  # the production shapes of the next op start from a clean pool
        progress(op, results[before:], time.perf_counter() - started)
    if plan.engine and "engine" in plan.ops:
        started, before = time.perf_counter(), len(results)
        engine_backends = plan.backends if plan.device.type == "cuda" else ("torch",)
        usable = []
        for backend in engine_backends:
            reason = None if backend == "torch" else _not_available("greedy_verify", backend, plan.device)
            if reason:
                results.append(Result("engine", backend, "every strategy", "float32",
                                      FAIL if plan.explicit_backends else SKIP, message=reason))
            else:
                usable.append(backend)
        if lost is not None:
            results.append(Result("engine", "-", "every strategy", "float32", SKIP,
                                  message=f"not run: the CUDA context was lost at {lost}"))
        elif usable:
            try:
                _starting(plan, "engine", ",".join(usable), "every strategy")
                run_engine(plan, tuple(usable), results.append)
            except ContextLost as error:
                results.append(Result("engine", "-", "CUDA context", "-", FAIL,
                                      message=f"a CUDA error poisoned the context at {error}"))
        progress("engine", results[before:], time.perf_counter() - started)
    return results
