"""What the end-to-end method benches share (bench/lookup.py, bench/drafters.py): counting HF's target
forwards, syncing the device before a clock is read, and the two-panel bar plot of their rows."""

import sys
from pathlib import Path

import torch


class ForwardCounter:
    """Counts the target's forward calls (HF's loop: one per step, the prefill included)."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._count)

    def _count(self, *args):
        self.calls += 1

    def remove(self):
        self.handle.remove()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def method_bars(rows: list[dict], path: Path, title: str, names: list[str], group_of, label_of, tick=str) -> None:
    """Tokens/s (median, min-max) and tokens per target forward of each method in `names` (x axis, labelled by
    tick(name)), one bar per group: group_of(row) keys the groups in the rows' order, label_of(group) names them.
    Only rows whose status is "ok" are drawn; without matplotlib the plot is skipped with a note."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no {path.name}", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    groups = list(dict.fromkeys(group_of(r) for r in ok))
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(len(groups), 1)
    for j, group in enumerate(groups):
        xs, heights, low, high, tpf = [], [], [], [], []
        for i, name in enumerate(names):
            r = next((r for r in ok if group_of(r) == group and r["method"] == name), None)
            if r is None:
                continue
            xs.append(i + j * width)
            heights.append(r["tokens_per_s"])
            low.append(r["tokens_per_s"] - r["tokens_per_s_min"])
            high.append(r["tokens_per_s_max"] - r["tokens_per_s"])
            tpf.append(r["tokens_per_forward"])
        left.bar(xs, heights, width, yerr=[low, high], capsize=3, label=label_of(group))
        right.bar(xs, tpf, width, label=label_of(group))
    for axes, label in ((left, "tokens/s (median, min-max)"), (right, "tokens per target forward")):
        axes.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(names))])
        axes.set_xticklabels([tick(n) for n in names], rotation=30, ha="right", fontsize=7)
        axes.set_ylabel(label)
        axes.legend(fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
