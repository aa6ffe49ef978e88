"""The selftest's data model: a check's Result, a Case (how to build, run and judge one problem), the Plan of a run."""

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, NamedTuple

import torch

PASS, FAIL, SKIP = "pass", "fail", "skip"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Result:
    """One check: an op on a backend at one case (shape and dtype)."""
    op: str
    backend: str
    case: str
    dtype: str
    status: str
    error: float | None = None  # max abs difference (float outputs) or number of differing entries (tokens)
    message: str = ""
    seconds: float = 0.0


@dataclass
class Case:
    """How to build one problem, run it on a backend and judge a backend's answer.

    build(seed) -> inputs (a dict; tensors on the device; every seed gives the same shapes,
    so a captured graph can be replayed on another seed's values); run(inputs, backend) ->
    a tuple of tensors; compare(got, want, inputs) -> (error, problem or None)."""
    op: str
    name: str
    dtype: torch.dtype | None
    build: Callable[[int], dict]
    run: Callable[[dict, str], tuple]
    compare: Callable[[tuple, tuple, dict], tuple]
    graph: bool = False  # also capture this case in a CUDA graph
    reference: Callable[[dict], tuple] | None = None  # default: run(inputs, "torch")
    backends: tuple = ()  # the backends to check; () = the op's non-torch backends


@dataclass
class Plan:
    device: torch.device
    profile: str  # "tiny" (cpu dev mode), "quick" or "full"
    backends: tuple
    explicit_backends: bool
    ops: tuple
    graphs: bool
    engine: bool
    seed: int
    results: list = field(default_factory=list)
    # capture(device, fn) -> (outputs, replay): how graph checks capture; None = CUDA graphs (on a GPU only).
    # Tests pass an eager stand-in to check the graph-check logic on the CPU.
    capture: Callable | None = None
    # op -> at most this many of its cases (tiers.spread); an op not named here runs every case of the profile
    cases_per_op: dict = field(default_factory=dict)
    # on_check(op, backend, check) before each check starts: what the watchdog (watchdog.py) names on a hang
    on_check: Callable | None = None


class Row(NamedTuple):
    """One case of an op's table: its inputs are build(seed, device=..., **settings). The catalog's one
    language: a family is ordinary functions that return these rows, built in loops over its tiers."""
    name: str
    dtype: torch.dtype | None
    build: Callable
    settings: dict
    compare: Callable
    graph: bool = False
    reference: Callable | None = None  # reference(inputs) -> outputs; None: the op's torch backend


def cases(op: str, run: Callable, rows: list, device, *, backends: tuple = (), reference: Callable | None = None
          ) -> list:
    """The Cases of `op` from its rows: each row's build bound to the device and its settings; `reference`
    serves the rows that name none."""
    return [Case(op, row.name, row.dtype, partial(row.build, device=device, **row.settings), run, row.compare,
                 graph=row.graph, reference=row.reference or reference, backends=backends) for row in rows]
