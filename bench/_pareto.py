"""The Pareto frontier of a set of measured points: the points no other point beats on both axes."""


def pareto_front(points: list[dict], x: str, y: str, *, maximize_x: bool = True, maximize_y: bool = True) -> list[dict]:
    """The non-dominated points of `points` (dicts with keys x and y), sorted by x from worst to best.

    A point is dominated when another is at least as good on both axes and strictly better on one;
    exact duplicates dominate neither each other, so both stay (a frontier can list two settings that
    measured the same)."""
    sx, sy = (1 if maximize_x else -1), (1 if maximize_y else -1)

    def dominates(a, b):
        ax, ay, bx, by = sx * a[x], sy * a[y], sx * b[x], sy * b[y]
        return ax >= bx and ay >= by and (ax > bx or ay > by)

    front = [p for p in points if not any(dominates(q, p) for q in points)]
    return sorted(front, key=lambda p: (sx * p[x], -sy * p[y]))
