"""The points bench/lossy_frontier.py measures: each a strategy with its settings, named once.

family: the frontier a point belongs to ("bild", "specdec"), or "reference" for the plain loop and the
lossless speculative chains, which are drawn beside the frontiers but are not part of them.
"""

from dataclasses import dataclass, field


@dataclass
class Point:
    name: str
    family: str
    strategy: str
    lossless: bool
    settings: dict = field(default_factory=dict)  # what the tables show (thresholds, beta, tau, ...)
    options: dict = field(default_factory=dict)   # specdec_kernels.generate keywords, models excluded


def reference_points(gammas) -> list[Point]:
    points = [Point("plain", "reference", "plain", True)]
    points += [Point(f"speculative g={g}", "reference", "speculative", True, {"gamma": g}, {"num_draft_tokens": g})
               for g in gammas]
    return points


def specdec_points(betas, taus, block_size: int) -> list[Point]:
    """SpecDec's lossless rule (top_beta=1) and the (top_beta, tau) grid, all at one block size."""
    points = [Point("specdec beta=1", "specdec", "specdec", True, {"beta": 1, "tau": 0.0},
                    {"top_beta": 1, "tau": 0.0, "block_size": block_size})]
    for beta in betas:
        for tau in taus:
            lossless = beta == 1 or tau == 0  # relaxed_verify is exact greedy there
            points.append(Point(f"specdec beta={beta} tau={tau:g}", "specdec", "specdec", lossless,
                                {"beta": beta, "tau": tau},
                                {"top_beta": beta, "tau": tau, "block_size": block_size}))
    return points


def bild_points(modes, fallbacks, rollbacks, max_small_run: int) -> list[Point]:
    """Per mode and fallback threshold: the exact rule (the no-loss point) and the paper's NLL rule at
    every rollback threshold."""
    points = []
    for mode in modes:
        for fb in fallbacks:
            common = {"mode": mode, "fallback_threshold": fb, "max_small_run": max_small_run}
            points.append(Point(f"bild {mode} fb={fb:g} exact", "bild", "bild", True,
                                {"mode": mode, "fallback": fb, "rule": "exact"},
                                {**common, "rollback_rule": "exact"}))
            for rb in rollbacks:
                points.append(Point(f"bild {mode} fb={fb:g} rb={rb:g}", "bild", "bild", False,
                                    {"mode": mode, "fallback": fb, "rule": "nll", "rollback": rb},
                                    {**common, "rollback_rule": "nll", "rollback_threshold": rb}))
    return points
