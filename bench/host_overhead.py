"""Host time of one eager call of every op, with its kernel stubbed: what Python costs around a launch.

Every registered implementation of the op is replaced by a no-op that returns outputs of the right shapes
(allocated once), so a call costs only the op's own host path: argument checks, backend resolution, the
custom-op wrapper; kv_compact's stub also computes the cache layout (common/kv_layout.py), the host work its GPU
launchers do for every call before the launch. Two modes:
- device: value checks off (ops' `validate.can_inspect` answers False), which is what a call on CUDA tensors
  runs in Python (values are never read there: that would sync). The CPU stands in for the GPU machine's host:
  resolve() takes its CPU branch (auto -> torch; on a GPU it also asks the kernels' cached launch plans), and
  the launchers' own host work (Triton's launcher, the CUDA module's call) is not in these rows.
- cpu: the same call on CPU tensors as it runs, value checks included (tiny shapes: B 8, g 4, V 256).
kv_compact runs at 2 and 32 layers, its caches passed as a list of one allocation's per-layer views
("stacked views"), a list of separate tensors ("separate"), or the two [L, B, Hkv, S_max, D] tensors themselves
("stacked tensor"). The same cache tensors every call, as a decode loop passes them.

Reported per row: median microseconds per call over --rounds interleaved rounds (round r times every row once,
--calls calls each), with the rounds' min and max; one torch thread. The target (<= 30 us per eager call at 32
layers on the project's 2-core machine, device mode) is printed beside each row, never asserted.

    python bench/host_overhead.py --out bench/results --stem host_overhead
    python bench/host_overhead.py --rounds 3 --calls 50 --out /tmp/h     # quick (CI)
    python bench/host_overhead.py --before bench/results/host_overhead_before.json --out bench/results
"""

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from specdec_kernels import ops  # noqa: E402
from specdec_kernels.common import registry  # noqa: E402
from specdec_kernels.common.kv_layout import cache_layout  # noqa: E402
from specdec_kernels.common import validate  # noqa: E402
from _report import write_report  # noqa: E402

TARGET_US = 30.0
B, G, V, N, HQ, HKV, D, S, H = 8, 4, 256, 8, 4, 2, 16, 64, 64
MODES = ("device", "cpu")
COLS = ["op", "case", "mode", "us", "us_min", "us_max", "before_us", "target_us", "meets_target", "error"]


def _chain(op: str, gen: torch.Generator, device: torch.device) -> dict:
    target = torch.rand(B, G + 1, V, generator=gen).to(device)
    draft = torch.rand(B, G, V, generator=gen).to(device)
    tokens = torch.randint(0, V, (B, G), generator=gen).to(device)
    uniforms = torch.rand(B, G + 1, generator=gen).to(device)
    sampling = dict(uniforms=uniforms)
    return {
        "rejection_sample": dict(target_probs=target, draft_probs=draft, draft_tokens=tokens, **sampling),
        "rejection_sample_logits": dict(target_logits=target, draft_logits=draft, draft_tokens=tokens, **sampling),
        "block_verify": dict(target_probs=target, draft_probs=draft, draft_tokens=tokens, **sampling),
        "block_verify_logits": dict(target_logits=target, draft_logits=draft, draft_tokens=tokens, **sampling),
        "greedy_verify": dict(target_logits=target, draft_tokens=tokens),
        "relaxed_verify": dict(target_logits=target, draft_tokens=tokens, top_beta=2, tau=1.0),
        "bild_verify": dict(target_logits=target, draft_tokens=tokens, rollback_threshold=2.0),
    }[op]


def _tree(gen: torch.Generator, device: torch.device) -> dict:
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 4]).expand(B, N).contiguous()
    tree = dict(target=torch.rand(B, N, V, generator=gen), draft=torch.rand(B, N, V, generator=gen),
                tokens=torch.randint(0, V, (B, N), generator=gen), parents=parents,
                uniforms=torch.rand(B, N, generator=gen))
    return {name: x.to(device) for name, x in tree.items()}


def _caches(layers: int, layout: str, device: torch.device) -> tuple:
    """(k_caches, v_caches) of `layers` layers [B, HKV, S, D] in one of the three forms the op takes."""
    if layout == "separate":
        return ([torch.zeros(B, HKV, S, D, device=device) for _ in range(layers)],
                [torch.zeros(B, HKV, S, D, device=device) for _ in range(layers)])
    keys, values = torch.zeros(2, layers, B, HKV, S, D, device=device).unbind(0)
    if layout == "stacked tensor":
        return keys, values
    return list(keys.unbind(0)), list(values.unbind(0))


LAYOUTS = ("stacked views", "separate", "stacked tensor")


def cases(device: torch.device = torch.device("cpu")) -> list[tuple[str, str, object]]:
    """(op, case, call): each call runs the public op once on fixed inputs on `device`."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    rows = []
    for op in ("rejection_sample", "rejection_sample_logits", "block_verify", "block_verify_logits", "greedy_verify",
               "relaxed_verify", "bild_verify"):
        kwargs = _chain(op, gen, device)
        rows.append((op, f"B{B} g{G} V{V}", lambda op=op, kwargs=kwargs: getattr(ops, op)(**kwargs)))
    seeded = _chain("rejection_sample", gen, device)
    seeded.pop("uniforms")
    offsets = torch.zeros(B, dtype=torch.int64, device=device)
    rows.append(("rejection_sample", "seeded", lambda: ops.rejection_sample(**seeded, seed=7, offsets=offsets)))
    logits = rand(B, V)
    rows.append(("max_prob", f"B{B} V{V}", lambda: ops.max_prob(logits)))
    rows.append(("fallback_check", f"B{B} V{V}", lambda: ops.fallback_check(logits, 0.5)))
    tree = _tree(gen, device)
    rows.append(("tree_greedy_verify", f"B{B} N{N} V{V}", lambda: ops.tree_greedy_verify(
        tree["target"], tree["tokens"], tree["parents"], max_depth=3)))
    rows.append(("tree_rejection_sample", f"B{B} N{N} V{V}", lambda: ops.tree_rejection_sample(
        tree["target"], tree["draft"], tree["tokens"], tree["parents"], uniforms=tree["uniforms"], max_depth=3)))
    q, k, v = rand(B, N, HQ, D), rand(B, HKV, S, D), rand(B, HKV, S, D)
    lens = torch.full((B,), S - N, dtype=torch.int64, device=device)
    rows.append(("tree_attention", "contiguous", lambda: ops.tree_attention(q, k, v, lens, tree["parents"])))
    pages = rand(B * S // 16, 16, HKV, D)
    table = torch.arange(B * S // 16, device=device).view(B, S // 16)
    rows.append(("tree_attention", "paged", lambda: ops.tree_attention(q, pages, pages, lens, tree["parents"],
                                                                        block_table=table)))
    hidden, norm_w, head = rand(B, H), torch.ones(H, device=device), rand(V, H)
    rows.append(("early_exit_topk", f"B{B} H{H} V{V} k8", lambda: ops.early_exit_topk(hidden, norm_w, head, 8)))
    num_accepted = torch.full((B,), 2, dtype=torch.int64, device=device)
    rows.append(("kv_rollback", f"B{B}", lambda: ops.kv_rollback(lens, num_accepted)))
    rows += kv_compact_cases(device, (2, 32))
    return rows


def kv_compact_cases(device: torch.device, layers=(2, 32), backend: str = "auto") -> list[tuple[str, str, object]]:
    """kv_compact on every form of the caches, the same tensors every call (as a decode loop passes them)."""
    lens = torch.full((B,), S - N, dtype=torch.int64, device=device)
    accepted = torch.full((B, 4), -1, dtype=torch.int64)
    accepted[:, :3] = torch.tensor([0, 1, 3])
    accepted = accepted.to(device)
    rows = []
    for count in layers:
        for layout in LAYOUTS:
            kc, vc = _caches(count, layout, device)
            rows.append(("kv_compact", f"L{count} {layout}", lambda kc=kc, vc=vc: ops.kv_compact(
                kc, vc, lens, accepted, backend=backend)))
    return rows


def _layout_then(out):
    """kv_compact's stub: the cache layout both GPU launchers compute before launching (the launchers' only
    host work that grows with the layers), then the stored outputs."""
    def stub(k_caches, v_caches, *args, **kwargs):
        if len(k_caches):
            cache_layout(k_caches, v_caches)
        return out
    return stub


def _stub_outputs(op: str, out):
    """A no-op with the outputs of one real call (allocated once)."""
    if op == "kv_compact":
        return _layout_then(out)
    return lambda *args, **kwargs: out


@contextlib.contextmanager
def stubbed_kernels(outputs: dict):
    """Every registered backend of each op in `outputs` returns that op's stored outputs."""
    saved = {op: dict(registry._IMPLS[op]) for op in outputs}
    try:
        for op, out in outputs.items():
            for backend in registry._IMPLS[op]:
                registry._IMPLS[op][backend] = _stub_outputs(op, out)
        yield
    finally:
        for op, impls in saved.items():
            registry._IMPLS[op].clear()
            registry._IMPLS[op].update(impls)


@contextlib.contextmanager
def value_checks(on: bool):
    """mode "device": the ops' value checks answer as they do for CUDA tensors (never inspected)."""
    saved = validate.can_inspect
    if not on:
        validate.can_inspect = lambda x: False
    try:
        yield
    finally:
        validate.can_inspect = saved


def kernel_op(op: str) -> str:
    """The registered op whose kernels a public op calls (max_prob serves fallback_check)."""
    return "max_prob" if op == "fallback_check" else op


def reference_outputs(rows) -> dict:
    """One real call's outputs per registered op (by whichever backend `auto` picks): what the stubs hand back."""
    outputs = {}
    for op, _, call in rows:
        name = kernel_op(op)
        if name in outputs:
            continue
        captured = {}
        real = dict(registry._IMPLS[name])

        def spy(fn):
            def run(*args, **kwargs):
                captured["out"] = fn(*args, **kwargs)
                return captured["out"]
            return run

        registry._IMPLS[name].update({backend: spy(fn) for backend, fn in real.items()})
        try:
            call()
        except (TypeError, ValueError):
            pass  # a form the op refuses: reported per row
        finally:
            registry._IMPLS[name].update(real)
        if "out" in captured:
            outputs[name] = captured["out"]
    return outputs


def time_rows(rows, *, rounds: int, calls: int, mode: str) -> list[dict]:
    """Median, min and max microseconds per call of every row over interleaved rounds."""
    samples: dict[int, list[float]] = {i: [] for i in range(len(rows))}
    errors: dict[int, str] = {}
    with value_checks(mode == "cpu"):
        for i, (_, _, call) in enumerate(rows):  # warm-up, and the rows the op refuses
            try:
                call()
            except (TypeError, ValueError) as error:
                errors[i] = f"{type(error).__name__}: {error}"
        for _ in range(rounds):
            for i, (_, _, call) in enumerate(rows):
                if i in errors:
                    continue
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                samples[i].append((time.perf_counter() - start) / calls * 1e6)
    out = []
    for i, (op, case, _) in enumerate(rows):
        row = {"op": op, "case": case, "mode": mode, "target_us": TARGET_US}
        if i in errors:
            row["error"] = errors[i]
        else:
            row.update(us=round(statistics.median(samples[i]), 1), us_min=round(min(samples[i]), 1),
                       us_max=round(max(samples[i]), 1))
            row["meets_target"] = row["us"] <= TARGET_US
        out.append(row)
    return out


def gpu_rows(device: torch.device, *, rounds: int = 11, calls: int = 50) -> list[dict]:
    """The host path on a GPU (for bench/gpu_probe.py). Mode "gpu stubbed": every op on CUDA tensors (value
    checks skipped, as in any GPU call; resolve() asks the kernels' launch plans) with its kernels stubbed.
    Mode "gpu launch <backend>": kv_compact at 32 layers with its kernels launched, no sync in the loop, so
    the time is the call's host time, launch included (the GPU keeps up with kernels this small)."""
    rows = cases(device)
    with stubbed_kernels(reference_outputs(rows)):
        out = time_rows(rows, rounds=rounds, calls=calls, mode="gpu stubbed")
    for backend in ("cuda", "triton") if device.type == "cuda" else ():  # the interpreter's time says nothing
        try:
            ops.resolve("kv_compact", backend, device)
        except (ValueError, RuntimeError):
            continue
        out += time_rows(kv_compact_cases(device, (32,), backend), rounds=rounds, calls=calls,
                         mode=f"gpu launch {backend}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def add_before(rows: list[dict], before: Path | None) -> None:
    if before is None:
        return
    earlier = {(r["op"], r["case"], r["mode"]): r.get("us") for r in json.loads(before.read_text())["rows"]}
    for row in rows:
        row["before_us"] = earlier.get((row["op"], row["case"], row["mode"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # many short rounds: the machine is shared, and a burst of another job's work then hits a few rounds of
    # every row instead of every round of a few rows
    parser.add_argument("--rounds", type=int, default=41, help="interleaved timed rounds (after one warm-up call)")
    parser.add_argument("--calls", type=int, default=50, help="calls per row and round")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--before", type=Path, default=None, help="an earlier run's JSON: its us as before_us")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--stem", default="host_overhead")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = cases()
    with stubbed_kernels(reference_outputs(rows)):
        results = [r for mode in args.modes for r in time_rows(rows, rounds=args.rounds, calls=args.calls, mode=mode)]
    add_before(results, args.before)
    for row in results:
        print(json.dumps(row), flush=True)
    device_32 = [r for r in results if r["mode"] == "device" and "us" in r and "L2 " not in r["case"]]
    worst = max(device_32, key=lambda r: r["us"])
    note = (f"1 torch thread, kernels stubbed (no-op implementations returning outputs of the right shapes); "
            f"{args.rounds} interleaved rounds x {args.calls} calls; us: median over rounds (min, max beside it). "
            "mode device: value checks off, as on CUDA tensors (the CPU stands in for the GPU machine's host; "
            "resolve() takes its CPU branch; launchers' host work not included but kv_compact's cache layout); mode cpu: CPU tensors as they run. "
            f"Target: <= {TARGET_US:.0f} us per eager call, 32 layers, device mode; worst such row: "
            f"{worst['op']} {worst['case']} {worst['us']} us")
    write_report(results, args.out, args.stem, "Host path per eager op call, kernels stubbed", COLS,
                 "python " + shlex.join(sys.argv), {"threads": 1, "rounds": args.rounds, "calls": args.calls,
                                                     "target_us": TARGET_US, "load_average": os.getloadavg()}, note)
    print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
