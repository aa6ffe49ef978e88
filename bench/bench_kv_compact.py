"""Microbenchmark of kv_compact: bytes moved per second, every backend side by side.

One step of tree speculative decoding ends by moving each request's accepted nodes' K/V
into place in every layer. Shapes: 32 layers, B in {1, 8, 32}, N in {8, 64} draft nodes,
Hkv 8, D 128, bf16, prefixes uniform in [P/2, P] (P = 1024). Trees (fixed seeds): N nodes
over a fixed depth (4 levels below the root for N = 8, 8 for N = 64), every node's parent a
random node of the level above, numbered level by level (parents before children); each
request accepts a random root-to-node path of length uniform in [1, depth + 1].

Backends:
- index_select: the Medusa/EAGLE way generalised to a batch: the host reads the lengths
  (a sync), then per layer cache and request an index_select of the accepted slots and a
  copy_ into place (2 launches per cache and request);
- torch: the reference (ops.kv_compact(backend="torch"): gather + index_put per cache);
- triton, cuda: ours, one launch for all layers; "stacked" caches are views of one
  [L, 2, B, Hkv, S, D] allocation (no table), "separate" ones one tensor each (device table).

Reported per case: median microseconds per call (CUDA-graph replay where the call can be
captured, else eager wall time on the stream, host syncs included) with L2 flushed before
every call, the eager time too, the bytes that must move (rows whose slot changes x 2L x
Hkv x D x element size, read + written), GB/s, pct_bound (those bytes / time / a measured
device-to-device copy's bandwidth: bench/_bound.py), and whether the caches equal the reference's.

    python bench/bench_kv_compact.py --out bench/results          # GPU: the full grid
    python bench/bench_kv_compact.py --smoke --out /tmp/bench      # tiny shapes (CI, CPU)
    python bench/bench_kv_compact.py --batch 32 --nodes 64 --backends cuda triton --out /tmp/b
    pytest bench/test_bench_kv_compact.py --benchmark-only         # the same cases, pytest-benchmark
"""

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_kernels import ops

# bench/ is on sys.path (the script's folder, or pytest's rootdir insertion)
from _bound import pct_of_bound  # noqa: E402
from _report import base_parser, write_report  # noqa: E402
from _timing import FLUSH_BYTES, capture_graph, copy_bandwidth, time_eager  # noqa: E402

FULL = {"B": (1, 8, 32), "N": (8, 64), "layers": 32, "heads": 8, "dim": 128, "prefix": 1024}
SMOKE = {"B": (1, 3), "N": (8,), "layers": 2, "heads": 2, "dim": 16, "prefix": 16}
DEPTH = {8: 4, 64: 8}  # tree levels below the root; other N: about log2(N) + 1
BACKENDS = ("index_select", "torch", "triton", "cuda")
LAYOUTS = ("stacked", "separate")
OUR_BACKENDS = ("triton", "cuda")  # the only ones whose speed depends on the layout


@dataclass
class Case:
    batch: int
    nodes: int
    layers: int
    heads: int
    dim: int
    prefix: int
    layout: str
    dtype: torch.dtype
    device: torch.device

    @property
    def name(self) -> str:
        return f"B{self.batch}-N{self.nodes}-L{self.layers}-{self.layout}-{str(self.dtype).replace('torch.', '')}"


def depth_of(nodes: int) -> int:
    return DEPTH.get(nodes, max(1, nodes.bit_length()))


def tree_paths(batch: int, nodes: int, gen: torch.Generator) -> list[list[int]]:
    """One accepted path per request: a random root-to-node path of its own random level tree."""
    depth = min(depth_of(nodes), nodes - 1)
    paths = []
    for _ in range(batch):
        # nodes per level: the root, then nodes - 1 spread over `depth` levels (each >= 1)
        sizes = [1] + [1] * depth
        for _ in range(nodes - 1 - depth):
            sizes[1 + int(torch.randint(0, depth, (), generator=gen))] += 1
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        parent = [-1] * nodes
        for level in range(1, len(sizes)):
            for i in range(starts[level], starts[level] + sizes[level]):
                parent[i] = starts[level - 1] + int(torch.randint(0, sizes[level - 1], (), generator=gen))
        length = int(torch.randint(1, depth + 2, (), generator=gen))  # uniform in [1, depth + 1]
        node = starts[length - 1] + int(torch.randint(0, sizes[length - 1], (), generator=gen))
        path = []
        while node >= 0:
            path.append(node)
            node = parent[node]
        paths.append(path[::-1])
    return paths


def make_inputs(case: Case, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed * 1000 + case.batch * 10 + case.nodes)
    paths = tree_paths(case.batch, case.nodes, gen)
    m = depth_of(case.nodes) + 1
    accepted = torch.tensor([p + [-1] * (m - len(p)) for p in paths], dtype=torch.int64)
    seq_lens = torch.randint(case.prefix // 2, case.prefix + 1, (case.batch,), generator=gen)
    shape = (case.batch, case.heads, case.prefix + case.nodes, case.dim)
    dev_gen = torch.Generator(device=case.device).manual_seed(seed)
    if case.layout == "stacked":
        kv = torch.randn(case.layers, 2, *shape, generator=dev_gen, device=case.device, dtype=case.dtype)
        k_caches, v_caches = list(kv[:, 0]), list(kv[:, 1])
    else:
        caches = [torch.randn(*shape, generator=dev_gen, device=case.device, dtype=case.dtype)
                  for _ in range(2 * case.layers)]
        k_caches, v_caches = caches[: case.layers], caches[case.layers:]
    return {"k_caches": k_caches, "v_caches": v_caches, "seq_lens": seq_lens.to(case.device),
            "accepted_nodes": accepted.to(case.device)}


def index_select_copy(k_caches, v_caches, seq_lens, accepted_nodes):
    """Medusa/EAGLE-style compaction for a batch: host-known lengths (one sync), then per
    layer cache and request an index_select of the accepted slots and a copy_ into place."""
    src = seq_lens.unsqueeze(1) + accepted_nodes.clamp(min=0)
    counts = (accepted_nodes >= 0).sum(dim=1)
    starts, lengths = seq_lens.tolist(), counts.tolist()  # the host sync this design needs
    for cache in (*k_caches, *v_caches):
        for b, (start, length) in enumerate(zip(starts, lengths)):
            if length:
                moved = cache[b].index_select(1, src[b, :length])
                cache[b, :, start:start + length].copy_(moved)
    return seq_lens + counts.to(seq_lens.dtype)


def callable_for(backend: str, inputs: dict):
    if backend == "index_select":
        return lambda: index_select_copy(**inputs)
    return lambda: ops.kv_compact(**inputs, backend=backend)


def backends_for(device: torch.device, wanted=BACKENDS) -> list[str]:
    names = []
    for backend in wanted:
        if backend == "index_select":
            names.append(backend)
            continue
        try:
            ops.resolve("kv_compact", backend, device)
        except (ValueError, RuntimeError):
            continue
        names.append(backend)
    return names


def moved_bytes(case: Case, accepted_nodes: torch.Tensor) -> int:
    """Bytes read + written by a kernel that copies only the rows whose slot changes."""
    positions = torch.arange(accepted_nodes.shape[1], device=accepted_nodes.device)
    rows = int(((accepted_nodes >= 0) & (accepted_nodes != positions)).sum())
    elem = torch.tensor([], dtype=case.dtype).element_size()
    return 2 * rows * 2 * case.layers * case.heads * case.dim * elem


def time_calls(fn, device: torch.device, repeats: int) -> float:
    """Median microseconds of fn(); on a GPU each call starts with a cold L2 and is timed
    with events on the stream (host syncs inside fn count: the stream waits for them)."""
    return time_eager(fn, device, repeats, flush_bytes=FLUSH_BYTES)


def captured(fn):
    """graph.replay of one captured call, or None when the call cannot be captured."""
    graph = capture_graph(fn)
    return None if graph is None else graph.replay


def agrees(backend: str, inputs: dict) -> bool:
    """Run `backend` on copies of the inputs and the reference on other copies: equal caches
    and lengths, bit for bit."""
    def fresh():
        k = [c.clone() for c in inputs["k_caches"]]
        v = [c.clone() for c in inputs["v_caches"]]
        return {**inputs, "k_caches": k, "v_caches": v}

    got_in, want_in = fresh(), fresh()
    got = callable_for(backend, got_in)()
    want = ops.kv_compact(**want_in, backend="torch")
    same = torch.equal(got, want)
    for key in ("k_caches", "v_caches"):
        same = same and all(torch.equal(a, b) for a, b in zip(got_in[key], want_in[key]))
    return bool(same)


def measure(case: Case, backend: str, repeats: int, copy_bw: float | None) -> dict:
    inputs = make_inputs(case)
    row = {"B": case.batch, "N": case.nodes, "layers": case.layers, "Hkv": case.heads, "D": case.dim,
           "layout": case.layout, "dtype": str(case.dtype).replace("torch.", ""), "backend": backend,
           "mean_accepted": round(float((inputs["accepted_nodes"] >= 0).sum(1).float().mean()), 2)}
    if backend != "torch":
        row["exact"] = agrees(backend, inputs)
    fn = callable_for(backend, inputs)
    eager = time_calls(fn, case.device, repeats)
    replay = captured(fn) if case.device.type == "cuda" and backend in OUR_BACKENDS else None
    us = time_calls(replay, case.device, repeats) if replay is not None else eager
    nbytes = moved_bytes(case, inputs["accepted_nodes"])
    row.update(us=round(us, 2), timing="graph" if replay is not None else "eager", eager_us=round(eager, 2),
               moved_MB=round(nbytes / 2**20, 3), GBps=round(nbytes / (us * 1e-6) / 1e9, 1))
    if copy_bw:
        row["pct_bound"] = pct_of_bound(nbytes, us * 1e-6, copy_bw)
    return row


def grid(smoke: bool, dtype: torch.dtype, device: torch.device, batches=None, nodes=None,
         layouts=LAYOUTS) -> list[Case]:
    axes = SMOKE if smoke else FULL
    shape = (axes["layers"], axes["heads"], axes["dim"], axes["prefix"])
    return [Case(b, n, *shape, layout, dtype, device)
            for b, n, layout in itertools.product(batches or axes["B"], nodes or axes["N"], layouts)]


def runs(cases: list[Case], backends: list[str]) -> list[tuple[Case, str]]:
    """(case, backend) pairs. The baselines do not care about the layout: they run on the
    first layout of the grid only."""
    first_layout = cases[0].layout if cases else None
    return [(case, backend) for case in cases for backend in backends
            if backend in OUR_BACKENDS or case.layout == first_layout]


def write_results(rows: list[dict], out: Path, command: str, copy_bw: float | None) -> None:
    cols = ["B", "N", "layers", "layout", "dtype", "backend", "us", "timing", "eager_us", "moved_MB", "GBps",
            "pct_bound", "mean_accepted", "exact"]
    copy_gbps = round(copy_bw / 1e9, 1) if copy_bw else None
    write_report(rows, out, "kv_compact", "kv_compact", cols, command, {"copy_bandwidth_GBps": copy_gbps},
                 f"copy bandwidth {copy_gbps} GB/s (read + write); pct_bound = moved bytes / time / copy bandwidth "
                 "(bench/_bound.py)")


def main(argv=None) -> int:
    parser = base_parser(__doc__)
    parser.add_argument("--nodes", nargs="+", type=int, default=None, help="override the N axis")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or device.type == "cpu"
    repeats = args.repeats or (3 if smoke else 30)
    copy_bw = copy_bandwidth(device)
    cases = grid(smoke, getattr(torch, args.dtype), device, args.batch, args.nodes, args.layouts)
    rows = []
    for case, backend in runs(cases, backends_for(device, args.backends)):
        rows.append(measure(case, backend, repeats, copy_bw))
        print(json.dumps(rows[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next case allocates its own caches
    write_results(rows, args.out, "python " + " ".join(sys.argv), copy_bw)
    return 0 if all(r.get("exact", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
