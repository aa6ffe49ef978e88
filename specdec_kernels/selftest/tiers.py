"""How many of an op's catalog cases a run takes: the quick and control samples.

The catalog (cases_*.py) lists, per op, the shapes x dtypes first and the crafted edge cases after them, so
the profile's list grows with every case anyone adds ("quick" held 902 cases on 2026-11-29). A
quick run must stay quick whatever the catalog holds: it takes at most a fixed number of cases per op,
spread evenly over the op's list (the first and the last always), so it sees small and large shapes,
several dtypes and some edge cases, and the same ones on every run. The control sample is the small
sample an op whose kernels did not change since the last GPU run gets (bench/gpu_first_look.sh).
"""

SELFTEST_QUICK = 6  # cases per op of `selftest --quick` (the H100 run of 2026-11-27 took ~5-10 per op in 166 s)
CONTROL = 2  # cases per op of a control sample (`selftest --control-ops`, the GPU tests' focus mode)


def spread(cases: list, limit: int | None) -> list:
    """At most `limit` of `cases`, evenly spaced over the list (first and last included), in list
    order; all of them when limit is None or not smaller than the list."""
    if limit is None or len(cases) <= limit:
        return list(cases)
    if limit < 1:
        raise ValueError(f"limit must be at least 1 (got {limit})")
    if limit == 1:
        return [cases[0]]
    step = (len(cases) - 1) / (limit - 1)
    return [cases[round(i * step)] for i in range(limit)]
