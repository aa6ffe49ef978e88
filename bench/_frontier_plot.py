"""bench/lossy_frontier.py's plot: four panels, quality over speed, each lossy strategy's points and
Pareto frontier with the plain loop and the lossless points as references. matplotlib is imported
here only (the [bench] / [test] extra)."""

from pathlib import Path

from _frontier_summary import FRONTIERS, is_reference

PANELS = {("speedup", "rouge_l_greedy"): ("CPU speed-up over the plain loop", "ROUGE-L F1 vs the target's greedy output"),
          ("tokens_per_forward", "rouge_l_greedy"): ("tokens per target forward (hardware-independent)",
                                                     "ROUGE-L F1 vs the target's greedy output"),
          ("speedup", "nll"): ("CPU speed-up over the plain loop", "target's mean NLL of the output (lower = better)"),
          ("speedup", "rouge_l_true"): ("CPU speed-up over the plain loop", "ROUGE-L F1 vs the true continuation")}
REF_MARKERS = ("*", "^", "v", "P", "X", "<", ">", "p", "h")
STYLE = {"bild paper": ("tab:blue", "o"), "bild official": ("tab:cyan", "s"), "specdec": ("tab:orange", "D")}


def _group(row: dict) -> str:
    return f"bild {row['mode']}" if row["family"] == "bild" else row["family"]


def plot_frontiers(rows: list[dict], fronts: dict, path: Path, meta: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    by_name = {r["point"]: r for r in rows}
    figure, axes = plt.subplots(2, 2, figsize=(12, 9))
    for ax, (x, y, _) in zip(axes.flat, FRONTIERS):
        for group, (color, marker) in STYLE.items():
            pts = [r for r in rows if r["family"] != "reference" and _group(r) == group]
            if pts:
                ax.scatter([r[x] for r in pts], [r[y] for r in pts], color=color, marker=marker, s=22, alpha=0.55,
                           label=group)
        for family, named in fronts.items():
            line = [by_name[n] for n in named[f"{x}|{y}"]]
            ax.plot([r[x] for r in line], [r[y] for r in line], color="tab:orange" if family == "specdec" else "tab:blue",
                    linewidth=1.2, label=f"{family} frontier")
        refs = [r for r in rows if is_reference(r)]
        for r, marker in zip(refs, REF_MARKERS):  # named in the legend: their labels would overlap on the plot
            ax.scatter([r[x]], [r[y]], color="black", marker=marker, s=70, zorder=3, label=r["point"])
        ax.set_xlabel(PANELS[(x, y)][0])
        ax.set_ylabel(PANELS[(x, y)][1])
        ax.grid(alpha=0.3)
    axes.flat[1].legend(fontsize=7, loc="lower left")  # the emptiest corner of the four panels
    figure.suptitle(f"lossy strategies: quality over speed ({meta['device']}, {meta['date']}, {meta['threads']} thread(s); "
                    f"{meta['prompts']} held-out prompts x {meta['new_tokens']} tokens)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
