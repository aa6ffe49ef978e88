"""bench/_probe_targets.py times CUDA tree_rejection_sample in each of its forms (cluster, split), forced
through SPECDEC_TREE_FORM; here the probe and the measurement are stand-ins (no GPU), so what is checked is
which rows it asks for, that each measurement runs under its form, and that the variable is restored."""

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _probe_targets as targets  # noqa: E402


class FakeProbe:
    mode = "gpu"

    def __init__(self):
        self.rows = []

    def run(self, section, label, measure):
        self.rows.append({"section": section, **label, **measure()})


def test_each_form_is_timed_under_its_own_variable(monkeypatch):
    monkeypatch.setenv("SPECDEC_TREE_FORM", "auto")
    monkeypatch.setattr(targets.bv, "backends_for", lambda op, device: ["torch", "triton", "cuda"])
    monkeypatch.setattr(targets.bv, "measure", lambda case, backend, *args, **kwargs: {
        "form_seen": os.environ["SPECDEC_TREE_FORM"], "B_seen": case.batch, "op_seen": case.op})
    probe = FakeProbe()
    targets.tree_form_rows(probe, torch.device("cuda"), torch.bfloat16, 1.0, 0, 1)
    assert os.environ["SPECDEC_TREE_FORM"] == "auto"
    got = {(r["op"], r["B"], r["form"], r["form_seen"]) for r in probe.rows}
    assert got == {(op, b, form, form) for op in ("tree_rejection_sample", "tree_rejection_sample_wr")
                   for b in (1, 64) for form in ("split", "cluster")}
    assert all(r["backend"] == "cuda" and r["V"] == 128256 and r["section"] == "targets" for r in probe.rows)


def test_no_cuda_backend_no_rows(monkeypatch):
    monkeypatch.setattr(targets.bv, "backends_for", lambda op, device: ["torch", "triton"])
    probe = FakeProbe()
    targets.tree_form_rows(probe, torch.device("cpu"), torch.float32, 1.0, 0, 1)
    assert probe.rows == []
