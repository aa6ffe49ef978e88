"""The engine check: every strategy on the embedded default models must decode the target's own
greedy tokens.

float32, CUDA graphs off and on: each row of one batched `generate` call (the demo's prompts,
left-padded) against HF's `generate(do_sample=False)` of that row's prompt ALONE. Batched HF greedy
is no reference: its padded rows run other kernels than a lone prompt and can flip a near-tie, and
our engine keeps per-row lengths instead of padding (docs/generate.md, "Comparing with HF generate").

bfloat16, where CUDA graphs run: the graph path must give the eager path's tokens (the same kernels
replayed). bfloat16 is no dtype for comparing with HF: near-ties flip between any two kernels.

Each result goes to `record` the moment it exists, so a run cut off by a timeout keeps what it checked.
"""

import argparse
import time
from typing import Callable

import torch

from .compare import shortened
from .device import ContextLost, context_alive, describe_error, sync
from .model import FAIL, PASS, SKIP, Result


def graphs_available(device: torch.device) -> bool:
    """Whether generate(cuda_graphs=True) can run here: a GPU, or (tests) a stand-in graph backend."""
    from ..decoding import graphs

    backend = graphs.current_backend()
    return device.type == "cuda" or (backend.available() and not isinstance(backend, graphs.CudaGraphs))


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when two 1-D token rows are equal, else where they part and the next few tokens."""
    if got.shape != want.shape:
        return f"{got.numel()} new tokens, want {want.numel()}"
    differ = (got != want).nonzero()
    if not differ.numel():
        return None
    pos = int(differ[0])
    return f"first differs at new token {pos}: got {shortened(got[pos:pos + 6])} want {shortened(want[pos:pos + 6])}"


class _NotLoaded(Exception):
    pass


def _load(device: torch.device, dtype: torch.dtype):
    from ..demo import load_pair

    def fail(message):
        raise _NotLoaded(message)

    no_paths = argparse.Namespace(models=None, target=None, draft=None, specdec_drafter=None)
    return load_pair(no_paths, device, dtype, fail=fail)


def _decode(pair, batch: dict, name: str, backend: str, graphs: bool, max_new: int) -> torch.Tensor:
    """Our engine's new tokens [B, max_new] for one batch."""
    import specdec_kernels

    from ..demo import rows

    out = specdec_kernels.generate(pair.target, batch["input_ids"], attention_mask=batch["attention_mask"],
                                   strategy=rows()[name][0], backend=backend,
                                   cuda_graphs=graphs, max_new_tokens=max_new, pad_token_id=pair.tokenizer.pad_token_id,
                                   eos_token_id=[], **pair.options[name])
    sync(batch["input_ids"].device)
    return out.sequences[:, batch["input_ids"].shape[1]:]


def solo_greedy(pair, prompts, max_new: int, device: torch.device) -> list[torch.Tensor]:
    """HF greedy's new tokens of each prompt decoded alone (no padding), float32."""
    from ..demo import batches

    rows = []
    with torch.no_grad():
        for text in prompts:
            alone = batches(pair.tokenizer, [text], 1, device)[0]
            out = pair.target.generate(**alone, do_sample=False, max_new_tokens=max_new,
                                       pad_token_id=pair.tokenizer.pad_token_id, eos_token_id=[])
            rows.append(out[0, alone["input_ids"].shape[1]:])
    return rows


def _strategies(pair) -> list[str]:
    """The demo's rows (every strategy of the table, each tree form after its chain): what the check runs."""
    from ..demo import rows

    return list(rows())


def run_engine(plan, backends: tuple, record: Callable[[Result], None]) -> None:
    """The float32 identity checks, then the bfloat16 graph-vs-eager checks (see the module docstring)."""
    from ..demo import PROMPTS, batches

    device = plan.device
    max_new = 32 if plan.profile == "full" else 16
    with_graphs = plan.graphs and graphs_available(device)
    start = time.perf_counter()
    try:
        pair = _load(device, torch.float32)
        batch = batches(pair.tokenizer, PROMPTS, len(PROMPTS), device)[0]
        want = solo_greedy(pair, PROMPTS, max_new, device)
    except Exception as error:  # noqa: BLE001
        for b in backends:
            record(Result("engine", b, "load the default models + HF greedy per prompt", "float32", FAIL,
                          message=describe_error(error), seconds=time.perf_counter() - start))
        return
    rows = batch["input_ids"].shape[0]
    for backend in backends:
        for graphs in (False, True) if with_graphs else (False,):
            for name in _strategies(pair):
                case = f"{name} {'cuda graphs' if graphs else 'eager'} B={rows} T={max_new} vs HF per prompt"
                _check(record, pair, device, backend, case, name, "float32",
                       lambda: _identity(pair, batch, name, backend, graphs, max_new, want))
    if not with_graphs:
        for backend in backends:
            record(Result("engine", backend, "bfloat16 graphs vs eager", "bfloat16", SKIP,
                          message="needs CUDA graphs (a GPU, and no --no-graphs)"))
        return
    try:
        pair16 = _load(device, torch.bfloat16)
    except Exception as error:  # noqa: BLE001
        for b in backends:
            record(Result("engine", b, "load the default models in bfloat16", "bfloat16", FAIL,
                          message=describe_error(error)))
        return
    for backend in backends:
        for name in _strategies(pair16):
            case = f"{name} cuda graphs vs eager B={rows} T={max_new}"
            _check(record, pair16, device, backend, case, name, "bfloat16",
                   lambda: _graphs_match_eager(pair16, batch, name, backend, max_new))


def _identity(pair, batch, name, backend, graphs, max_new, want) -> tuple[float, str | None]:
    got = _decode(pair, batch, name, backend, graphs, max_new)
    problems = [(row, first_difference(got[row], want[row])) for row in range(got.shape[0])]
    problems = [(row, p) for row, p in problems if p]
    if not problems:
        return 0.0, None
    row, problem = problems[0]
    return float(len(problems)), (f"{len(problems)} of {got.shape[0]} rows differ from HF greedy of the prompt "
                                  f"alone; row {row}: {problem}")


def _graphs_match_eager(pair, batch, name, backend, max_new) -> tuple[float, str | None]:
    eager = _decode(pair, batch, name, backend, False, max_new)
    replayed = _decode(pair, batch, name, backend, True, max_new)
    differing = [row for row in range(eager.shape[0]) if not torch.equal(eager[row], replayed[row])]
    if not differing:
        return 0.0, None
    row = differing[0]
    return float(len(differing)), f"graph path differs from the eager path: row {row}: " \
                                  f"{first_difference(replayed[row], eager[row])}"


def _check(record, pair, device, backend, case, name, dtype, run) -> None:
    if name not in pair.options:
        record(Result("engine", backend, case, dtype, SKIP, message=pair.skipped.get(name, "")))
        return
    start = time.perf_counter()
    try:
        error, problem = run()
    except Exception as failure:  # noqa: BLE001
        record(Result("engine", backend, case, dtype, FAIL, message=describe_error(failure),
                      seconds=time.perf_counter() - start))
        if not context_alive(device):
            raise ContextLost(f"engine [{backend}] {case}") from failure
        return
    record(Result("engine", backend, case, dtype, FAIL if problem else PASS, error, problem or "",
                  time.perf_counter() - start))
