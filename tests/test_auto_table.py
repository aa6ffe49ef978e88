"""`backend="auto"` on a GPU follows the measured table (common/auto_table.py), and the table follows its files.

resolve() reads only the device type, whether `_C` loads and whether triton imports, so a GPU is faked the
way tests/test_registry_limits.py does it; the backends' launch limits are replaced (the CUDA ones ask the
device). The second half derives every entry again from the results file it cites, with the rule the
table's docstring states.
"""

import collections
import json
import math
from pathlib import Path

import pytest
import torch

import specdec_kernels.ops  # noqa: F401  (registers every backend)
from specdec_kernels.common import auto_table, registry

ROOT = Path(__file__).resolve().parents[1]
GPU, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.fixture
def fake_gpu(monkeypatch):
    """`_C` loads, triton imports, no launch limits: what auto picks is the table's first backend."""
    monkeypatch.setattr(registry._cuda_module, "load", lambda: object())
    monkeypatch.setattr(registry, "triton_importable", lambda: True)
    monkeypatch.setattr(registry, "_LIMITS", {})


def pick(op, batch, device=GPU, key="B"):
    return registry.resolve(op, "auto", device, sizes={key: batch})


def test_early_exit_topk_never_gets_the_cuda_kernel_measured_slower_than_torch(fake_gpu):
    assert [pick("early_exit_topk", b) for b in (1, 8, 64)] == ["triton", "triton", "torch"]
    assert registry.resolve("early_exit_topk", "cuda", GPU) == "cuda"  # still there when asked for by name


@pytest.mark.parametrize("op, batch, expected", [
    ("rejection_sample_logits", 1, "torch"), ("rejection_sample_logits", 8, "torch"),
    ("rejection_sample_logits", 9, "cuda"), ("rejection_sample_logits", 64, "cuda"),
    ("greedy_verify", 8, "triton"), ("greedy_verify", 9, "cuda"),
    ("relaxed_verify", 1, "triton"), ("relaxed_verify", 256, "cuda"),
    ("rejection_sample", 1, "triton"), ("rejection_sample", 64, "triton"),
    ("tree_greedy_verify", 1, "cuda"), ("tree_rejection_sample", 64, "cuda"), ("kv_compact", 32, "cuda"),
    ("block_verify", 1, "cuda"), ("block_verify_logits", 64, "cuda"), ("tree_attention", 8, "cuda"),  # unmeasured
    ("kv_rollback", 8, "torch"),  # torch only
])
def test_auto_takes_the_measured_winner_of_the_regime(fake_gpu, op, batch, expected):
    assert pick(op, batch) == expected
    assert pick(op, batch, CPU) == "torch"


def test_max_prob_and_fallback_check_are_keyed_by_rows(fake_gpu):
    assert pick("max_prob", 64, key="R") == "triton"
    assert registry.resolve("fallback_check", "auto", GPU, runs_as="max_prob", sizes={"R": 3, "V": 9}) == "triton"


def test_without_sizes_auto_takes_the_small_batch_regime(fake_gpu):
    assert registry.resolve("early_exit_topk", "auto", GPU) == "triton"
    assert registry.resolve("rejection_sample_logits", "auto", GPU) == "torch"


def test_a_refused_or_missing_backend_falls_to_the_next_measured_one_then_torch(fake_gpu, monkeypatch):
    registry._LIMITS[("greedy_verify", "cuda")] = lambda sizes: "too big"
    assert pick("greedy_verify", 64) == "triton"  # cuda first at B 64, refused: triton, also faster than torch
    registry._LIMITS[("rejection_sample_logits", "cuda")] = lambda sizes: "too big"
    assert pick("rejection_sample_logits", 64) == "torch"  # triton was measured slower than torch there
    monkeypatch.setattr(registry._cuda_module, "load", lambda: None)  # no `_C`: the old rule's next step
    assert pick("block_verify", 64) == "triton" and pick("tree_greedy_verify", 1) == "triton"
    monkeypatch.setattr(registry, "triton_importable", lambda: False)
    assert pick("block_verify", 64) == "torch"


def test_the_table_names_registered_ops_and_their_kernel_backends():
    for op, measured in auto_table.MEASURED.items():
        assert op in registry.registered_ops(), op
        for backend in (*measured.small, *measured.large):
            assert backend in ("cuda", "triton") and backend in registry.implemented_backends(op), (op, backend)


# ---------------------------------------------------------------- the entries against their files

# the plain-torch rows of each bench (the torch backend and the bench's stand-ins), and what makes one case
PLAIN_TORCH = {auto_table.VERIFY_ROWS: ("torch", "naive"), auto_table.EARLY_EXIT: ("torch", "baseline"),
               auto_table.KV_COMPACT: ("torch", "index_select")}
CASE = {auto_table.VERIFY_ROWS: ("B", "g", "regime"), auto_table.EARLY_EXIT: ("B", "H", "V"),
        auto_table.KV_COMPACT: ("B", "N")}  # kv_compact's torch rows are of one layout, ours of two: both beside them


def rows_of(source: str, op: str) -> list[dict]:
    path = ROOT / source
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        rows = json.loads(path.read_text())["rows"]
    return [r for r in rows if r.get("op", op) == op and "us" in r]


def derive(rows: list[dict], source: str) -> tuple[str, ...]:
    """The table's rule: kernel backends no slower than plain torch in every case, by geometric mean time."""
    times = collections.defaultdict(list)  # backend -> [(case, us)]
    for r in rows:
        times[r["backend"]].append((tuple(r[k] for k in CASE[source]), r["us"]))
    bar = {}
    for name in PLAIN_TORCH[source]:
        for case, us in times.get(name, ()):
            bar[case] = min(bar.get(case, math.inf), us)
    listed = [b for b in ("cuda", "triton") if times.get(b) and all(us <= bar[c] for c, us in times[b])]

    def mean_log(backend):
        return sum(math.log(us) for _, us in times[backend]) / len(times[backend])

    return tuple(sorted(listed, key=mean_log))


@pytest.mark.parametrize("op", sorted(auto_table.MEASURED))
def test_every_entry_is_what_its_results_file_says(op):
    measured = auto_table.MEASURED[op]
    rows = rows_of(measured.source, op)
    small = [r for r in rows if r["B"] <= auto_table.SMALL_BATCH]
    large = [r for r in rows if r["B"] > auto_table.SMALL_BATCH]
    assert small and large, f"{measured.source} has no {op} rows on one side of B={auto_table.SMALL_BATCH}"
    assert derive(small, measured.source) == measured.small
    assert derive(large, measured.source) == measured.large
