"""bench/lossy_frontier.py's parts on cases whose answers are known by hand: ROUGE-L (bench/_quality.py), the
Pareto frontier (bench/_pareto.py), the targets it reads off the rows (bench/_frontier_summary.py) and the
held-out windows (bench/_heldout_slice.py)."""

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _frontier_summary import frontiers, targets  # noqa: E402
from _heldout_slice import heldout_examples  # noqa: E402
from _pareto import pareto_front  # noqa: E402
from _quality import lcs_length, mean_nll, rouge_l_f1, token_nlls  # noqa: E402


def test_rouge_l_on_words_computed_by_hand():
    # LCS "the cat on the mat" = 5 of 6 words on each side: P = R = F1 = 5/6
    assert rouge_l_f1("the cat sat on the mat".split(), "the cat is on the mat".split()) == pytest.approx(5 / 6)
    # [1,2,3,4] vs [2,4,5]: LCS [2,4] = 2, P = 2/4, R = 2/3, F1 = 2 * (1/2 * 2/3) / (1/2 + 2/3) = 4/7
    assert rouge_l_f1([1, 2, 3, 4], [2, 4, 5]) == pytest.approx(4 / 7)
    assert lcs_length("ABCBDAB", "BDCABA") == 4  # the textbook example (BCBA)


def test_rouge_l_edges():
    assert rouge_l_f1([7, 8, 9], [7, 8, 9]) == 1.0
    assert rouge_l_f1([1, 2], [3, 4]) == 0.0
    assert rouge_l_f1([], [1]) == 0.0 and rouge_l_f1([1], []) == 0.0
    assert rouge_l_f1([1, 2, 3], [3, 2, 1]) == pytest.approx(1 / 3)  # LCS 1 of 3 each way
    assert rouge_l_f1([1, 2], [1, 2, 3, 4]) == rouge_l_f1([1, 2, 3, 4], [1, 2])  # F1 is symmetric


def test_pareto_front_of_a_known_set():
    points = [{"n": "a", "x": 1.0, "y": 1.0}, {"n": "b", "x": 2.0, "y": 0.5}, {"n": "c", "x": 1.5, "y": 0.8},
              {"n": "d", "x": 0.5, "y": 0.9}, {"n": "e", "x": 2.0, "y": 0.4}, {"n": "f", "x": 1.5, "y": 0.8}]
    # d is beaten by a on both axes, e by b on y at equal x; c and f are the same point, so both stay
    assert [p["n"] for p in pareto_front(points, "x", "y")] == ["a", "c", "f", "b"]
    # y minimised (an NLL): e (the largest x, the smallest y) beats every other point
    assert [p["n"] for p in pareto_front(points, "x", "y", maximize_y=False)] == ["e"]


def test_pareto_front_minimising_x():
    points = [{"n": "a", "x": 1.0, "y": 1.0}, {"n": "b", "x": 2.0, "y": 2.0}, {"n": "c", "x": 3.0, "y": 1.5}]
    # fewer x is better: a (1, 1) and b (2, 2) stay, c (3, 1.5) loses to b
    assert [p["n"] for p in pareto_front(points, "x", "y", maximize_x=False)] == ["b", "a"]


def row(point, family, lossless, fpt, rouge, speedup=1.0, **extra):
    return {"point": point, "family": family, "strategy": extra.pop("strategy", family), "lossless": lossless,
            "forwards_per_token": fpt, "tokens_per_forward": round(1 / fpt, 3), "rouge_l_greedy": rouge,
            "identical_to_greedy": 1.0 if rouge == 1.0 else 0.0, "nll": 1.0, "rouge_l_true": 0.1, "speedup": speedup,
            "speedup_min": speedup, "speedup_max": speedup, **extra}


def test_frontiers_and_targets_read_the_rows():
    rows = [row("plain", "reference", True, 1.0, 1.0, strategy="plain"),
            row("speculative g=4", "reference", True, 0.35, 1.0, 0.9, strategy="speculative"),
            row("bild exact", "bild", True, 0.5, 1.0, 0.8, rule="exact", mode="paper"),
            row("bild rb=1", "bild", False, 0.3, 0.95, 1.1, rule="nll", mode="paper"),
            row("bild rb=4", "bild", False, 0.2, 0.5, 1.3, rule="nll", mode="paper"),
            row("specdec beta=1", "specdec", True, 0.35, 1.0, 1.0),
            row("specdec lossy", "specdec", False, 0.34, 0.7, 1.2)]
    fronts = frontiers(rows)
    assert fronts["bild"]["speedup|rouge_l_greedy"] == ["bild exact", "bild rb=1", "bild rb=4"]
    assert fronts["specdec"]["tokens_per_forward|rouge_l_greedy"] == ["specdec beta=1", "specdec lossy"]
    found = targets(rows)
    assert found["lossless_identical_to_greedy"]["met"]
    assert found["bild_exact"]["met"] and found["bild_exact"]["fastest"]["point"] == "bild exact"
    assert found["bild_fewer_forwards"]["met"] and found["bild_fewer_forwards"]["beats"] == ["speculative g=4"]
    assert found["bild_fewer_forwards"]["best_at_rouge_bar"]["point"] == "bild rb=1"
    assert not found["specdec_fewer_forwards"]["met"]  # its lossy point is under the ROUGE-L bar
    assert found["specdec_fewer_forwards"]["best_rouge_below_speculative"]["point"] == "specdec lossy"
    rows[2]["identical_to_greedy"] = 0.5  # an exact-rule BiLD point that drifted is reported, not hidden
    assert not targets(rows)["bild_exact"]["met"]
    assert targets(rows)["lossless_identical_to_greedy"]["violations"] == ["bild exact"]


class WordTokenizer:
    """Whitespace "tokens" as ids of their lengths: enough for the windows' arithmetic."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [len(w) for w in text.split()]}


def test_heldout_windows_are_the_file_in_order():
    examples = heldout_examples(WordTokenizer(), count=8, prompt_tokens=5, new_tokens=3)
    assert len(examples) == 8 and len({e.source for e in examples}) == 8
    assert {e.source.split("@")[0] for e in examples} == {"colorsys.py", "fnmatch.py", "glob.py", "shlex.py"}
    assert all(len(e.prompt) == 5 and len(e.continuation) == 3 for e in examples)
    assert all(e.source.endswith("@0") for e in examples[:4])  # each file's first window starts at its top
    from _stdlib_text import stdlib_files
    for e in examples:
        name, start = e.source.split("@")
        ids = WordTokenizer()(stdlib_files([name])[name])["input_ids"]
        assert ids[int(start):int(start) + 8] == e.prompt + e.continuation  # continuation = the file's next tokens


def test_token_nlls_are_the_models_cross_entropy():
    class Uniform(torch.nn.Module):  # every next token has probability 1/4
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            return type("Out", (), {"logits": torch.zeros(1, ids.shape[1], 4)})()

    assert token_nlls(Uniform(), [0, 1], [2, 3, 0]) == pytest.approx([math.log(4)] * 3)
    assert mean_nll(Uniform(), [0], [1]) == pytest.approx(math.log(4))
    with pytest.raises(ValueError):
        token_nlls(Uniform(), [], [1])
