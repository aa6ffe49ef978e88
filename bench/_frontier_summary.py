"""What bench/lossy_frontier.py concludes from its rows: the Pareto frontier of each lossy strategy, the
issue-41 targets, and the markdown that shows them."""

from _pareto import pareto_front

# (x, y, maximize y): the frontiers kept per family. speedup is CPU wall time; tokens_per_forward is the
# hardware-independent axis (target forwards are what a memory-bound GPU pays for).
FRONTIERS = (("speedup", "rouge_l_greedy", True), ("tokens_per_forward", "rouge_l_greedy", True),
             ("speedup", "nll", False), ("speedup", "rouge_l_true", True))
FAMILIES = ("bild", "specdec")
ROUGE_BAR = 0.9  # issue 41: "at a ROUGE-L >= 0.9 against the target's greedy output"


def is_reference(row: dict) -> bool:
    """The lossless points drawn beside the frontiers: the plain loop, speculative chains, SpecDec at beta=1."""
    return row["family"] == "reference" or row["point"] == "specdec beta=1"


def frontiers(rows: list[dict]) -> dict:
    """{family: {"x|y": [point names on the frontier, worst x first]}}."""
    out = {}
    for family in FAMILIES:
        mine = [r for r in rows if r["family"] == family]
        if mine:
            out[family] = {f"{x}|{y}": [r["point"] for r in pareto_front(mine, x, y, maximize_y=up)]
                           for x, y, up in FRONTIERS}
    return out


def targets(rows: list[dict]) -> dict:
    """The issue's targets, each with the rows that decide it."""
    speculative = [r for r in rows if r["strategy"] == "speculative"]
    exact = [r for r in rows if r["family"] == "bild" and r.get("rule") == "exact"]
    out = {"lossless_identical_to_greedy": {
        "met": all(r["identical_to_greedy"] == 1.0 for r in rows if r["lossless"]),
        "violations": [r["point"] for r in rows if r["lossless"] and r["identical_to_greedy"] != 1.0]}}
    if exact:
        best = max(exact, key=lambda r: r["speedup"])
        fewest = min(exact, key=lambda r: r["forwards_per_token"])
        out["bild_exact"] = {"met": all(r["identical_to_greedy"] == 1.0 for r in exact), "points": len(exact),
                             "fastest": _brief(best), "fewest_forwards": _brief(fewest), "paper_speedup": "1.5-1.85x"}
    for family in FAMILIES:
        lossy = [r for r in rows if r["family"] == family and not r["lossless"]]
        if not lossy or not speculative:
            continue
        good = [r for r in lossy if r["rouge_l_greedy"] >= ROUGE_BAR]
        best = min(good, key=lambda r: r["forwards_per_token"]) if good else None
        beaten = [s["point"] for s in speculative if best and best["forwards_per_token"] < s["forwards_per_token"]]
        out[f"{family}_fewer_forwards"] = {
            "met": bool(beaten) and len(beaten) == len(speculative), "beats": beaten,
            "speculative": {s["point"]: s["forwards_per_token"] for s in speculative},
            "best_at_rouge_bar": _brief(best) if best else None,
            "best_rouge_below_speculative": _brief(max(
                [r for r in lossy if r["forwards_per_token"] < min(s["forwards_per_token"] for s in speculative)],
                key=lambda r: r["rouge_l_greedy"], default=None))}
    return out


def _brief(row: dict | None) -> dict | None:
    if row is None:
        return None
    return {k: row[k] for k in ("point", "speedup", "speedup_min", "speedup_max", "forwards_per_token",
                                "tokens_per_forward", "rouge_l_greedy", "identical_to_greedy", "nll")}


def rollback_pressure(token_nlls: list[list[float]], thresholds) -> dict:
    """Share of the target's own greedy tokens whose -log p exceeds each rollback threshold: in paper
    mode a small-model token there is rolled back even when it is the target's argmax."""
    flat = [x for row in token_nlls for x in row]
    return {f"{t:g}": round(sum(x > t for x in flat) / max(len(flat), 1), 3) for t in thresholds}


FRONTIER_COLS = ("point", "speedup", "forwards_per_token", "tokens_per_forward", "rouge_l_greedy",
                 "identical_to_greedy", "nll", "rouge_l_true")


def _cell(row: dict, col: str) -> str:
    if col == "speedup":
        return f"{row['speedup']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
    return str(row[col])


def frontier_markdown(rows: list[dict], fronts: dict) -> list[str]:
    by_name = {r["point"]: r for r in rows}
    refs = [r for r in rows if is_reference(r)]
    lines = []
    head = ["| " + " | ".join(FRONTIER_COLS) + " |", "|" + "---|" * len(FRONTIER_COLS)]
    lines += ["## Reference points", "", *head]
    lines += ["| " + " | ".join(_cell(r, c) for c in FRONTIER_COLS) + " |" for r in refs]
    for family, named in fronts.items():
        for key, title in (("speedup|rouge_l_greedy", "CPU speed-up x ROUGE-L against the target's greedy output"),
                           ("tokens_per_forward|rouge_l_greedy", "tokens per target forward x ROUGE-L against greedy")):
            lines += ["", f"## {family}: frontier of {title}", "", *head]
            lines += ["| " + " | ".join(_cell(by_name[n], c) for c in FRONTIER_COLS) + " |" for n in named[key]]
    return lines


def targets_markdown(found: dict) -> list[str]:
    lines = ["## Targets (issue 41)", ""]
    check = found["lossless_identical_to_greedy"]
    lines.append(f"- every lossless point identical to the target's greedy output: {'yes' if check['met'] else 'NO'}"
                 + (f" (not: {', '.join(check['violations'])})" if check["violations"] else ""))
    if "bild_exact" in found:
        t = found["bild_exact"]
        fast, few = t["fastest"], t["fewest_forwards"]
        lines.append(f"- BiLD, exact rule ({t['points']} points): identical to greedy: {'yes' if t['met'] else 'NO'}; "
                     f"fastest {fast['point']} at {fast['speedup']:.2f}x ({fast['speedup_min']:.2f}-"
                     f"{fast['speedup_max']:.2f}) and {fast['forwards_per_token']} target forwards per token; "
                     f"fewest forwards {few['point']} at {few['forwards_per_token']} per token and {few['speedup']:.2f}x "
                     f"(the paper: {t['paper_speedup']} at no loss, T4 GPU, T5/mT5)")
    for family in FAMILIES:
        t = found.get(f"{family}_fewer_forwards")
        if t is None:
            continue
        refs = ", ".join(f"{k}: {v}" for k, v in t["speculative"].items())
        best, below = t["best_at_rouge_bar"], t["best_rouge_below_speculative"]
        text = (f"- {family}: a lossy point with fewer target forwards per token than lossless speculative ({refs}) "
                f"at ROUGE-L >= {ROUGE_BAR}: {'met' if t['met'] else 'not met'}")
        if best:
            text += (f"; fewest forwards at ROUGE-L >= {ROUGE_BAR}: {best['point']} ({best['forwards_per_token']} per "
                     f"token, ROUGE-L {best['rouge_l_greedy']}, beats {', '.join(t['beats']) or 'none'})")
        else:
            text += f"; no lossy point reaches ROUGE-L {ROUGE_BAR}"
        if below:
            text += (f"; best ROUGE-L among lossy points with fewer forwards than every speculative point: "
                     f"{below['point']} ({below['forwards_per_token']} per token, ROUGE-L {below['rouge_l_greedy']})")
        lines.append(text)
    return lines
