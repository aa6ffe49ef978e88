"""`backend="auto"` on a GPU picks only kernels a GPU of the same architecture verified in their current form
(common/kernel_trust.py): torch for a kernel whose fingerprint no record lists, the kernel once the shipped or
the local record lists it for this architecture, the fastest verified backend of the measured order otherwise.
A GPU is simulated: resolve() reads the device type, kernel_trust.capability is replaced (sm_80, sm_90) and the
launch limits (which ask the device) are dropped, as tests/test_auto_table.py does."""

import json
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdec_kernels.common import cuda_module, installed_kernels, kernel_trust, registry
from specdec_kernels import ops  # noqa: F401  (registers every backend)

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.device("cuda")
ARCHS = {"sm_80": (8, 0), "sm_90": (9, 0)}


@pytest.fixture
def gate(tmp_path, monkeypatch):
    """The gate switched on, an empty shipped record, a local record in tmp_path, a simulated GPU."""
    monkeypatch.delenv(kernel_trust.OPT_IN, raising=False)
    monkeypatch.setenv(kernel_trust.CACHE_DIR, str(tmp_path / "cache"))
    shipped = tmp_path / "shipped.json"
    monkeypatch.setattr(kernel_trust, "SHIPPED", shipped)
    device = {"capability": (9, 0)}
    monkeypatch.setattr(kernel_trust, "capability", lambda _: device["capability"])
    monkeypatch.setattr(registry, "_LIMITS", {})  # the CUDA launch limits ask the device: none here

    def ship(*entries):
        shipped.write_text(json.dumps({"kernels": list(entries)}))
        kernel_trust.forget()

    ship()
    yield SimpleNamespace(ship=ship, device=device)
    kernel_trust.forget()


def entry(op: str, backend: str, arch: str, fingerprint: str | None = None) -> dict:
    return {"kernel": f"{op}/{backend}", "fingerprint": fingerprint or kernel_trust.fingerprint(op, backend),
            "arch": arch, "device": "a simulated GPU", "checks": "made up for the test"}


def auto(op: str, batch: int = 1) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kernel_trust.UnverifiedKernelWarning)
        return registry.resolve(op, "auto", GPU, sizes={"B": batch})


def has_cuda_fingerprints() -> bool:
    return cuda_module.load() is not None and installed_kernels.csrc_identity() is not None


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_auto_picks_a_kernel_only_once_a_record_lists_its_fingerprint(gate, arch):
    gate.device["capability"] = ARCHS[arch]
    other = next(name for name in ARCHS if name != arch)
    assert auto("greedy_verify") == "torch"  # measured order (triton, cuda) at B 1: neither verified
    gate.ship(entry("greedy_verify", "triton", other))  # verified elsewhere only
    assert auto("greedy_verify") == "torch"
    gate.ship(entry("greedy_verify", "triton", arch, fingerprint="0123456789abcdef"))  # an older kernel's
    assert auto("greedy_verify") == "torch"
    gate.ship(entry("greedy_verify", "triton", arch))  # the shipped record lists today's kernel
    assert auto("greedy_verify") == "triton"
    assert auto("rejection_sample") == "torch"  # another op's kernels stay unverified
    gate.ship()
    kernel_trust.record_local([entry("greedy_verify", "triton", arch)])  # what the selftest writes
    assert auto("greedy_verify") == "triton"
    assert json.loads(kernel_trust.local_record_path().read_text())["kernels"][0]["kernel"] == "greedy_verify/triton"


def test_auto_takes_the_fastest_verified_backend_in_the_measured_order(gate):
    # greedy_verify's measured order at B 64 is (cuda, triton): with only triton verified, triton
    gate.ship(entry("greedy_verify", "triton", "sm_90"))
    assert auto("greedy_verify", 64) == "triton"
    if not has_cuda_fingerprints():
        pytest.skip("no `_C` with its sources' hashes: the CUDA kernels cannot be fingerprinted here")
    gate.ship(entry("greedy_verify", "triton", "sm_90"), entry("greedy_verify", "cuda", "sm_90"))
    assert auto("greedy_verify", 64) == "cuda" and auto("greedy_verify", 1) == "triton"
    gate.ship(entry("greedy_verify", "cuda", "sm_90"))
    assert auto("greedy_verify", 1) == "cuda"  # the measured-faster triton is unverified: the verified cuda


def test_the_opt_in_and_explicit_backends_run_unverified_kernels(gate, monkeypatch):
    assert auto("tree_rejection_sample") == "torch"
    assert registry.resolve("tree_rejection_sample", "triton", GPU) == "triton"  # asked for by name: runs
    monkeypatch.setenv(kernel_trust.OPT_IN, "1")
    kernel_trust.forget()
    assert auto("greedy_verify") == "triton" and auto("rejection_sample_logits", 1) == "torch"  # the measured table


def test_one_warning_per_process_names_the_held_back_ops_and_the_command(gate):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in ("greedy_verify", "tree_rejection_sample", "greedy_verify", "rejection_sample"):
            registry.resolve(op, "auto", GPU, sizes={"B": 1})
    lines = [str(w.message) for w in caught if issubclass(w.category, kernel_trust.UnverifiedKernelWarning)]
    assert len(lines) == 1, lines
    assert "greedy_verify on torch" in lines[0] and "tree_rejection_sample on torch" in lines[0]
    assert "specdec-kernels selftest" in lines[0] and kernel_trust.OPT_IN in lines[0] and "sm_90" in lines[0]


def test_a_verdict_is_computed_once_then_looked_up(gate, monkeypatch):
    asked = []
    real = kernel_trust.evidence
    monkeypatch.setattr(kernel_trust, "evidence", lambda *a: asked.append(a[:2]) or real(*a))
    gate.ship(entry("greedy_verify", "triton", "sm_90"))
    for _ in range(50):
        assert auto("greedy_verify") == "triton"
    assert asked.count(("greedy_verify", "triton")) == 1


def test_an_unknown_device_or_an_unreadable_record_verifies_nothing(gate, monkeypatch, tmp_path):
    gate.ship(entry("greedy_verify", "triton", "sm_90"))
    kernel_trust.SHIPPED.write_text("{not json")
    kernel_trust.forget()
    assert auto("greedy_verify") == "torch"
    gate.ship(entry("greedy_verify", "triton", "sm_90"))

    def no_device(_):
        raise RuntimeError("No CUDA GPUs are available")
    monkeypatch.setattr(kernel_trust, "capability", no_device)
    kernel_trust.forget()
    assert auto("greedy_verify") == "torch"


def test_which_kernels_a_selftest_run_verifies():
    rows = [dict(op="greedy_verify", backend="triton", status="pass"),
            dict(op="greedy_verify", backend="triton", status="skip"),
            dict(op="greedy_verify", backend="cuda", status="pass"),
            dict(op="greedy_verify", backend="cuda", status="fail"),  # one failure: not verified
            dict(op="kv_compact", backend="cuda", status="skip"),  # nothing passed: not verified
            dict(op="tree_attention", backend="triton", status="pass"),
            dict(op="kv_rollback", backend="torch", status="pass")]  # the reference is no kernel
    assert kernel_trust.kernels_that_passed(rows) == {"greedy_verify/triton": {"passed": 1, "skipped": 1},
                                                       "tree_attention/triton": {"passed": 1, "skipped": 0}}
    engine_failed = rows + [dict(op="engine", backend="triton", status="fail")]
    assert kernel_trust.kernels_that_passed(engine_failed) == {}
    broken = rows + [dict(op="selftest", backend="-", status="fail")]
    assert kernel_trust.kernels_that_passed(broken) == {}


def test_the_shipped_record_is_generated_and_verifies_none_of_todays_kernels(monkeypatch):
    """The shipped record is bench/verified_kernels.py's output over the committed GPU results (git gives the
    2026-11-27 run's kernels); every kernel changed since, so today `auto` runs torch on that GPU's arch."""
    shipped = json.loads(kernel_trust.SHIPPED.read_text())
    assert shipped["kernels"] and {e["arch"] for e in shipped["kernels"]} == {"sm_90"}
    assert all(e["results"] == "bench/results/gpu_checks_h100_2026-11-27" for e in shipped["kernels"])
    monkeypatch.delenv(kernel_trust.OPT_IN, raising=False)
    monkeypatch.setenv(kernel_trust.CACHE_DIR, str(ROOT / "no-such-folder"))
    monkeypatch.setattr(kernel_trust, "capability", lambda _: (9, 0))
    kernel_trust.forget()
    try:
        for op in registry.registered_ops():
            assert registry.auto_choice(op, GPU)["backend"] == "torch", op
    finally:
        kernel_trust.forget()
    has_history = subprocess.run(["git", "cat-file", "-e", "247026a1663eb2a3ea5300e261d8fab24289c825^{commit}"],
                                 cwd=ROOT, capture_output=True).returncode == 0 if (ROOT / ".git").exists() else False
    if not has_history:
        pytest.skip("no git history here: the record's regeneration is not checked")
    done = subprocess.run([sys.executable, str(ROOT / "bench/verified_kernels.py"), "--check"], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr


def test_info_says_per_op_what_auto_picks_and_why(gate):
    from specdec_kernels import info_command

    gate.ship({**entry("greedy_verify", "triton", "sm_90"), "date": "2026-12-01"})
    verified = kernel_trust.explain("greedy_verify", GPU)
    assert verified.startswith("triton: verified on sm_90 (shipped record: a simulated GPU, 2026-12-01, made up")
    held = kernel_trust.explain("tree_rejection_sample", GPU)
    assert held.startswith("torch: cuda not verified on this GPU's architecture in its current form")
    assert "triton not verified" in held and held.endswith("`specdec-kernels selftest` verifies them here")
    assert kernel_trust.explain("kv_rollback", GPU) == "torch: the GPU measurements rank no kernel above torch here"
    assert kernel_trust.explain("greedy_verify", torch.device("cpu")) == "torch: no GPU"
    info = {"version": "0", "torch": "t", "triton": "t", "transformers": "t", "device": "a simulated GPU",
            "cuda_available": True,
            "cuda_module": {"loaded": False, "built": False, "error": None},
            "auto_backends": {"greedy_verify": "triton", "tree_rejection_sample": "torch"},
            "auto_reasons": {"greedy_verify": verified, "tree_rejection_sample": held}}
    text = info_command.summary(info)
    assert f"  greedy_verify          {verified}" in text and f"  tree_rejection_sample  {held}" in text
