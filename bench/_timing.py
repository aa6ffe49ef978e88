"""GPU timing that every microbenchmark shares: CUDA-graph capture, event-timed medians, copy bandwidth."""

import statistics
import time

import torch

FLUSH_BYTES = 256 * 2**20  # written before a timed call so it starts with a cold L2: more than any L2 (H100: 50 MB)


def capture_graph(fn):
    """A CUDA graph of one call of fn, or None when the call cannot be captured.

    The warm-up runs on a side stream that first waits for the current stream: the inputs were
    just written there, and a side stream that does not wait reads them half-written (on the
    first H100 run this fed NaN to torch.multinomial and killed bench_verify with a device assert).
    """
    current = torch.cuda.current_stream()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            fn()
        current.wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # noqa: BLE001 - any capture failure means "time it eagerly"
        torch.cuda.synchronize()
        return None
    return graph


def time_eager(fn, device: torch.device, repeats: int, flush_bytes: int = 0) -> float:
    """Median microseconds of fn() after one warm-up call: CUDA events on a GPU, wall time on the CPU.
    flush_bytes > 0: a buffer that size is written before every GPU sample, so each call starts with a cold L2."""
    fn()
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if flush_bytes and device.type == "cuda" else None
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def copy_bandwidth(device: torch.device) -> float | None:
    """Measured device-to-device copy bandwidth (bytes read + written per second); None on the CPU."""
    if device.type != "cuda":
        return None
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (time_eager(lambda: dst.copy_(src), device, 20) * 1e-6)
