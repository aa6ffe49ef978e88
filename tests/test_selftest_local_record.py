"""After a run on a GPU the selftest records each kernel whose every check passed, by fingerprint and
architecture, in this machine's record (selftest/verified.py): `auto` then picks it on that architecture.
The run is made up (a GPU is simulated); the kernels and their fingerprints are the real ones."""

import json

import torch

from specdec_kernels.common import kernel_trust, registry
from specdec_kernels.selftest import verified
from specdec_kernels.selftest.model import Result

H100 = {"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "profile": "quick"}


def checks(op, backend, *statuses):
    return [Result(op, backend, f"case {i}", "float32", status) for i, status in enumerate(statuses)]


def test_the_kernels_that_passed_are_recorded_and_auto_picks_them(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_trust.CACHE_DIR, str(tmp_path))
    monkeypatch.delenv(kernel_trust.OPT_IN, raising=False)
    monkeypatch.setattr(kernel_trust, "SHIPPED", tmp_path / "none.json")
    monkeypatch.setattr(kernel_trust, "capability", lambda device: (9, 0))
    monkeypatch.setattr(registry, "_LIMITS", {})
    results = (checks("greedy_verify", "triton", "pass", "pass", "skip") + checks("rejection_sample", "triton", "pass",
               "fail") + checks("kv_rollback", "torch", "pass"))
    line = verified.summary(H100, results)
    assert line and "sm_90" in line and "greedy_verify/triton" in line and "rejection_sample" not in line
    written = json.loads(kernel_trust.local_record_path().read_text())["kernels"]
    assert [(e["kernel"], e["arch"], e["device"]) for e in written] == [("greedy_verify/triton", "sm_90", H100["name"])]
    assert written[0]["fingerprint"] == kernel_trust.fingerprint("greedy_verify", "triton")
    assert "2 passed, 1 skipped" in written[0]["checks"]
    gpu = torch.device("cuda")
    try:
        assert registry.auto_choice("greedy_verify", gpu)["backend"] == "triton"
        assert registry.auto_choice("rejection_sample", gpu)["backend"] == "torch"  # a check failed
        monkeypatch.setattr(kernel_trust, "capability", lambda device: (8, 0))
        kernel_trust.forget()
        assert registry.auto_choice("greedy_verify", gpu)["backend"] == "torch"  # verified on sm_90 only
    finally:
        kernel_trust.forget()


def test_a_cpu_run_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_trust.CACHE_DIR, str(tmp_path))
    cpu = {"device": "cpu", "name": "CPU", "profile": "tiny"}
    assert verified.summary(cpu, checks("greedy_verify", "triton", "pass")) is None
    assert not kernel_trust.local_record_path().exists()
