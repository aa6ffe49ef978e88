"""bench/e2e.py's PNG plots: measured speedup against acceptance rate beside Leviathan's curve, and
tokens/s by method and batch size. matplotlib is imported here only (the [bench] / [test] extra)."""

import statistics
from pathlib import Path

from _e2e_runners import leviathan_speedup


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _label(row: dict) -> str:
    parts = [row["method"]]
    if row.get("graphs"):
        parts.append("graphs")
    if row.get("gamma") and row["method"] != "ours_plain":
        parts.append(f"g={row['gamma']}")
    if row.get("tree"):
        parts.append(f"tree {row['tree']}")
    return " ".join(parts)


def plot_speedup(rows: list[dict], path: Path, meta: dict) -> None:
    """ours_spec speedup over ours_plain against Leviathan's alpha on the synthetic sweep (every pair
    when there is none), CUDA-graph rows when the run has them, else eager; one theory curve per gamma
    at the median measured c of that gamma's batch-1 rows (all its rows when there is no batch 1)."""
    plt = _pyplot()
    spec = [r for r in rows if r.get("method") == "ours_spec" and r.get("speedup_vs_plain") is not None]
    spec = [r for r in spec if r["pair"] == "synthetic"] or spec
    graphs = any(r["graphs"] for r in spec)
    spec = [r for r in spec if r["graphs"] == graphs]
    figure, axes = plt.subplots(figsize=(7, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    alphas = [i / 100 for i in range(101)]
    for i, gamma in enumerate(sorted({r["gamma"] for r in spec})):
        color = colors[i % len(colors)]
        mine = [r for r in spec if r["gamma"] == gamma]
        c = statistics.median(r["c"] for r in ([r for r in mine if r["batch"] == 1] or mine))
        axes.plot(alphas, [leviathan_speedup(a, gamma, c) for a in alphas], color=color,
                  label=f"theory g={gamma}, c={c:.3f}")
        for mode, marker in (("greedy", "o"), ("sampling", "^")):
            points = [r for r in mine if r["mode"] == mode]
            if points:
                axes.scatter([r["alpha"] for r in points], [r["speedup_vs_plain"] for r in points], color=color,
                             marker=marker, label=f"measured g={gamma} {mode}")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("acceptance rate alpha (Leviathan: accepted / examined drafts)")
    axes.set_ylabel("speedup over our plain greedy")
    axes.set_title(f"speculative decoding vs theory, {'CUDA graphs' if graphs else 'eager'} "
                   f"({meta['device']}, {meta['date']})", fontsize=10)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_tokens(rows: list[dict], path: Path, meta: dict) -> None:
    """Grouped bars of tokens/s per method (x) and batch size (bars), one panel per mode, on the
    synthetic pair's first noise level (or the first pair that ran); failures and timeouts are drawn
    at 0 and marked."""
    plt = _pyplot()
    ran = [r for r in rows if r.get("batch") is not None]
    synthetic = [r for r in ran if r["pair"] == "synthetic"]
    if synthetic:  # its first noise level: the one hf_static ran at
        chosen = [r for r in synthetic if r["noise"] == synthetic[0]["noise"]]
    else:
        chosen = [r for r in ran if r["pair"] == ran[0]["pair"]] if ran else []
    modes = sorted({r["mode"] for r in chosen}) or ["greedy"]
    figure, panels = plt.subplots(len(modes), 1, figsize=(10, 4 * len(modes)), squeeze=False)
    for axes, mode in zip(panels[:, 0], modes):
        mine = [r for r in chosen if r["mode"] == mode and r["method"] != "ours_plain_draft"]
        labels = list(dict.fromkeys(_label(r) for r in mine))
        batches = sorted({r["batch"] for r in mine})
        width = 0.8 / max(len(batches), 1)
        for j, batch in enumerate(batches):
            for x, label in enumerate(labels):
                row = next((r for r in mine if r["batch"] == batch and _label(r) == label), None)
                if row is None:
                    continue
                value = row.get("tok_s") or 0
                axes.bar(x + j * width, value, width, color=f"C{j}", label=f"batch {batch}" if x == 0 else None)
                if row["status"] != "ok":
                    axes.text(x + j * width, 0, row["status"], rotation=90, fontsize=7, ha="center", va="bottom")
        axes.set_xticks([x + width * (len(batches) - 1) / 2 for x in range(len(labels))])
        axes.set_xticklabels(labels, rotation=20, fontsize=8, ha="right")
        axes.set_ylabel("tokens/s")
        axes.set_title(f"{mode}: tokens/s by method and batch size ({meta['device']}, {meta['date']})", fontsize=10)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
