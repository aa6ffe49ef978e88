"""`specdec-kernels selftest`: every GPU kernel against the torch reference on this GPU.

Runs every op of `specdec_kernels.ops` on every GPU backend this install has (cuda, triton)
at small and production shapes (vocabularies up to 151936, batches up to 256, trees up to 64
nodes, tree attention over 4096-token prefixes, contiguous and paged KV, head dims 64 and
128, float32/float16/bfloat16), captures each op once in a CUDA graph and replays it on new
inputs, and decodes with the embedded default models through every strategy, with and
without CUDA graphs, asking for the target's own greedy tokens. Prints a pass/fail matrix
(ops x backends) with the device, driver and versions, then every failure in detail.

Its options, output and the GPU scripts that run it: docs/gpu.md.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from . import verified, watchdog
from .model import DTYPES, FAIL, PASS, SKIP, Plan, Result
from .report import JsonLinesLog, format_header, format_report, header, matrix
from .runner import CASE_FAMILIES, execute, run_case
from .tiers import CONTROL, SELFTEST_QUICK

# CASE_FAMILIES, DTYPES and run_case are not used here: tests/test_selftest.py builds and runs cases through them
__all__ = ["CASE_FAMILIES", "DTYPES", "Plan", "Result", "add_arguments", "execute", "run", "run_case", "verdict",
           "write_json"]

GPU_BACKENDS = ("cuda", "triton")
NO_GPU = ("specdec-kernels selftest: no CUDA GPU is visible (torch.cuda.is_available() is False); "
          "selftest checks the GPU kernels and needs one.")
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 2
WATCHDOG_S = 300  # on a GPU, by default: longer than any check takes (a production shape's first Triton compile)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write the header, the matrix and every check as JSON")
    parser.add_argument("--jsonl", metavar="FILE",
                        help="also append the header and then every check to FILE, one JSON line each, the moment "
                             "it finishes (a run cut off by a timeout keeps every check it finished)")
    parser.add_argument("--quick", action="store_true",
                        help=f"small shapes only (skips the production shapes), at most {SELFTEST_QUICK} cases per op "
                             "spread over its catalog")
    parser.add_argument("--ops", metavar="NAME,...",
                        help="only these ops, in this order (default: every registered op)")
    parser.add_argument("--control-ops", metavar="NAME,...",
                        help=f"also these ops, after --ops, at a control sample of {CONTROL} cases each (what "
                             "bench/gpu_first_look.sh runs for ops whose kernels did not change since the last "
                             "GPU run)")
    parser.add_argument("--backends", metavar="NAME,...",
                        help="only these backends (default: cuda,triton; an explicitly named backend that "
                             "cannot run here is a failure, a default one a skip)")
    parser.add_argument("--device", default="cuda",
                        help="cuda or cuda:N (default cuda). `cpu` tests the selftest itself: tiny shapes, "
                             "Triton under TRITON_INTERPRET=1, no CUDA graphs")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph capture checks")
    parser.add_argument("--no-engine", action="store_true",
                        help="skip the engine check (every strategy on the embedded default models vs greedy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--watchdog", type=float, metavar="SECONDS",
                        help=f"run the checks in a child process and call a check with no result after SECONDS a "
                             f"hang: it fails, the child is killed and a fresh one goes on with the next op (default "
                             f"{WATCHDOG_S} on a GPU, off with --device cpu; 0: off)")
    parser.add_argument("--worker-log", help=argparse.SUPPRESS)  # the watched child's JSON-lines log (watchdog.py)


def _split(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _argv(args, *, ops: str | None = None, control: str | None = None, outputs: bool = True) -> list[str]:
    """The command line of `args` again (to re-run the CPU dev mode under the Triton interpreter); a watched
    child's: other ops, no output files, no watchdog of its own."""
    argv = ["selftest", "--device", args.device, "--seed", str(args.seed)]
    named = (("--ops", args.ops if ops is None else ops), ("--control-ops", args.control_ops if control is None
                                                           else control), ("--backends", args.backends))
    if outputs:
        named += (("--json", args.json), ("--jsonl", args.jsonl))
        argv += [] if args.watchdog is None else ["--watchdog", f"{args.watchdog:g}"]
    for flag, value in named:
        if value:
            argv += [flag, value]
    for flag, on in (("--quick", args.quick), ("--no-graphs", args.no_graphs), ("--no-engine", args.no_engine)):
        if on:
            argv.append(flag)
    return argv


def fail(message: str) -> int:
    print(f"specdec-kernels selftest: {message}", file=sys.stderr)
    return EXIT_NO_GPU


def run(args) -> int:
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        return fail(f"--device {args.device}: use cuda, cuda:N, or cpu (which only tests the selftest itself)")
    for flag, path in (("--json", args.json), ("--jsonl", args.jsonl)):
        if path and not Path(path).resolve().parent.is_dir():
            return fail(f"{flag} {path}: no such folder")
    from .. import ops

    known = (*ops.registered_ops(), "engine")
    wanted = _split(args.ops) or ([] if args.control_ops else list(known))
    control = [name for name in _split(args.control_ops) or [] if name not in wanted]
    for flag, names in (("--ops", wanted), ("--control-ops", control)):
        unknown = [name for name in names if name not in known]
        if unknown:
            return fail(f"{flag}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    limits = {name: SELFTEST_QUICK for name in wanted} if args.quick else {}
    limits.update({name: CONTROL for name in control})
    backends = _split(args.backends) or list(GPU_BACKENDS)
    bad = [b for b in backends if b not in GPU_BACKENDS]
    if bad:
        return fail(f"--backends: unknown {', '.join(bad)}; the GPU backends are {', '.join(GPU_BACKENDS)} "
                    "(torch is the reference every check compares with)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(NO_GPU, file=sys.stderr)
            return EXIT_NO_GPU
        if device.index is not None and device.index >= torch.cuda.device_count():
            return fail(f"--device {args.device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    seconds = args.watchdog if args.watchdog is not None else (WATCHDOG_S if device.type == "cuda" else 0)
    if seconds > 0 and not args.worker_log:
        return _watched(args, device, wanted, control, seconds)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        # The Triton kernels were decorated at import: only a fresh process can run them interpreted.
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.run([sys.executable, "-m", "specdec_kernels", *_argv(args)], env=env).returncode
    if device.type == "cpu":
        backends = [b for b in backends if b == "triton"]  # the cuda backend needs a GPU: nothing to run
    plan = Plan(device=device, profile="tiny" if device.type == "cpu" else ("quick" if args.quick else "full"),
                backends=tuple(backends), explicit_backends=args.backends is not None and device.type == "cuda",
                ops=tuple(dict.fromkeys([*wanted, *control])), graphs=not args.no_graphs,
                engine=not args.no_engine, seed=args.seed, cases_per_op=limits)
    info = header(plan)
    if args.worker_log:  # a watched child: every check and a marker before each into the watchdog's log
        plan.results = JsonLinesLog(args.worker_log, info)
        plan.on_check = watchdog.marker(plan.results)
    elif args.jsonl:
        plan.results = JsonLinesLog(args.jsonl, info)
    print(format_header(info), flush=True)
    start = time.perf_counter()

    def progress(op, done, op_seconds):
        print(f"  {op}: {sum(r.status == PASS for r in done)} passed, {sum(r.status == FAIL for r in done)} failed, "
              f"{sum(r.status == SKIP for r in done)} skipped ({op_seconds:.1f} s)", file=sys.stderr, flush=True)
        for r in done:
            if r.status == FAIL:
                print(f"    FAIL [{r.backend}] {r.case} {r.dtype}: {r.message}", file=sys.stderr, flush=True)
        if args.json:  # rewritten after every op, so a run cut off by a timeout keeps what it checked
            write_json(args.json, info, plan.results, time.perf_counter() - start, finished=False)

    try:
        results = execute(plan, progress)
    except KeyboardInterrupt:
        results = plan.results
        results.append(Result("selftest", "-", "interrupted", "-", FAIL, message="interrupted (Ctrl-C)"))
    except Exception:  # noqa: BLE001 - a bug of the selftest itself: report it with what ran so far
        results = plan.results
        results.append(Result("selftest", "-", "internal error", "-", FAIL, message=traceback.format_exc(limit=3)))
    if args.worker_log:
        return EXIT_OK if verdict(results) else EXIT_FAILED  # the watchdog's process reports
    return finish(args, info, results, time.perf_counter() - start)


def finish(args, info: dict, results: list[Result], seconds: float) -> int:
    """The report, the --json file, the local record of the kernels this run verified; the exit status."""
    print()
    print(format_report(results, seconds), flush=True)
    if args.json:
        write_json(args.json, info, results, seconds, finished=True)
        print(f"wrote {args.json}")
    line = verified.summary(info, results)
    if line:
        print(line)
    return EXIT_OK if verdict(results) else EXIT_FAILED


def _watched(args, device: torch.device, wanted: list[str], control: list[str], seconds: float) -> int:
    """The run in watched children (watchdog.py): this process relays their checks to --jsonl, then reports."""
    results: list[Result] = []
    state: dict = {}
    start = time.perf_counter()

    def on_header(info: dict) -> None:
        if "info" not in state:
            state["info"] = info
            state["log"] = JsonLinesLog(args.jsonl, info) if args.jsonl else None

    def on_result(result: Result) -> None:
        results.append(result)
        if state.get("log") is not None:
            state["log"].append(result)

    def command(remaining: list[str], log) -> list[str]:
        keep = lambda names: ",".join(name for name in names if name in remaining)  # noqa: E731
        argv = _argv(args, ops=keep(wanted) or ("" if control else None), control=keep(control), outputs=False)
        return [sys.executable, "-m", "specdec_kernels", *argv, "--worker-log", str(log)]

    order = [name for name in dict.fromkeys([*wanted, *control]) if name != "engine"]
    order += ["engine"] if "engine" in [*wanted, *control] else []  # the engine check runs last
    watchdog.supervise(order, command, watchdog.child_environment(device.type), seconds, on_header, on_result)
    return finish(args, state.get("info", {}), results, time.perf_counter() - start)


def verdict(results: list[Result]) -> bool:
    """Passed: something ran and nothing failed (skips are listed, not failures)."""
    return any(r.status == PASS for r in results) and not any(r.status == FAIL for r in results)


def write_json(path: str, info: dict, results: list[Result], seconds: float, *, finished: bool) -> None:
    summary = {"passed": sum(r.status == PASS for r in results), "failed": sum(r.status == FAIL for r in results),
               "skipped": sum(r.status == SKIP for r in results), "seconds": round(seconds, 2),
               "finished": finished, "ok": finished and verdict(results)}
    Path(path).write_text(json.dumps({"header": info, "summary": summary, "matrix": matrix(results),
                                      "checks": [asdict(r) for r in results]}, indent=1))
