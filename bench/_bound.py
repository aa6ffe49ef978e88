"""The one "% of bound" every benchmark and the GPU probe report.

    % of bound = 100 x (bytes the op must move) / (seconds) / (the measured copy bandwidth)

The copy bandwidth is _timing.copy_bandwidth: the bytes a 256 MiB device-to-device copy reads plus the bytes it
writes, per second. Those are the same bytes any kernel must move through HBM, read or written, so the copy's
figure is what the op's bytes are divided by, whole (not half of it: a kernel that only reads moves as many
bytes per second as a copy does). The bytes are each benchmark's to count: what the op's contract must read and
write.
"""


def pct_of_bound(nbytes: float, seconds: float, bandwidth: float | None) -> float | None:
    """Percent of the bandwidth bound, to 0.1; None without a measured bandwidth (a CPU run)."""
    if bandwidth is None or bandwidth == 0:
        return None
    if bandwidth < 0:
        raise ValueError(f"bandwidth must be > 0 (got {bandwidth})")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0 (got {nbytes})")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0 (got {seconds})")
    return round(100 * nbytes / seconds / bandwidth, 1)
