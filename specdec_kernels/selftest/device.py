"""The selftest's device plumbing: synchronising, telling a poisoned CUDA context, and one-line errors."""

import torch


class ContextLost(Exception):
    """A CUDA error poisoned the context at `where`; `results` are the checks done before it (the
    failing one included) that the caller has not recorded yet."""

    def __init__(self, where: str, results: list | None = None):
        super().__init__(where)
        self.results = results or []


def describe_error(error: BaseException) -> str:
    """The error's type and its first lines (a Triton compile error names the line on its second)."""
    lines = [line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    return " | ".join(lines[:3])[:600]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def context_alive(device: torch.device) -> bool:
    """False once a kernel fault has poisoned the CUDA context (every later call would fail)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return float(torch.ones(1, device=device).add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False
