"""bench/_probe_questions.py: the probe rows for what the kernels' review left to a GPU. On the CPU: the star
inputs reject every sibling (K + 1 passes over V, both sibling rules, checked by the reference), and the
section asks for the rows the questions need (stand-in probe and measurements: no timing here)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _probe_questions as questions  # noqa: E402
from specdec_kernels import ops  # noqa: E402


@pytest.mark.parametrize("rule", questions.RULES)
@pytest.mark.parametrize("siblings", [2, 5])
def test_the_star_rejects_every_sibling(rule, siblings):
    x = questions.star_inputs(3, siblings, 50, rule, torch.float32, torch.device("cpu"))
    assert x["tree_tokens"].shape == (3, siblings + 1) and (x["parents"][:, 1:] == 0).all()
    if rule == "without_replacement":
        assert all(len(set(row[1:].tolist())) == siblings for row in x["tree_tokens"])  # distinct draws
    out, accepted, nodes = ops.tree_rejection_sample(**x, backend="torch")
    assert (accepted == 0).all() and (nodes[:, 1:] == -1).all()


class FakeProbe:
    mode = "gpu"

    def __init__(self):
        self.rows = []

    def run(self, section, label, measure):
        self.rows.append({"section": section, **label})


def test_the_section_asks_for_each_questions_rows(monkeypatch):
    monkeypatch.setattr(questions.bx, "backends_for", lambda device: ["cuda", "triton", "baseline"])
    probe = FakeProbe()
    questions.question_rows(probe, torch.device("cuda"), torch.bfloat16, 1.0)
    table = {(r["K"], r["B"], r["siblings"]) for r in probe.rows if r["question"] == "rank table"}
    assert table == {(k, b, rule) for k in (4, 32) for b in (1, 64) for rule in questions.RULES}
    exits = [(r["B"], r["backend"]) for r in probe.rows if r["question"] == "early_exit B > 32"]
    assert exits == [(32, "cuda"), (33, "cuda"), (48, "cuda"), (64, "cuda")]
    assert all(r["section"] == "questions" for r in probe.rows)
