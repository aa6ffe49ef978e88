"""Which device and how many CPU threads a command (demo, generate) runs with, from --device and
--threads, refusing what would otherwise be ignored (cpu:1) or end in a traceback (banana)."""

import os
from typing import Callable, NoReturn

import torch

MAX_DEFAULT_THREADS = 4  # decoding at batch 1 gains little from more, and spinning threads cost a loaded machine


def add_machine_arguments(parser) -> None:
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads of torch (default: half the cores, at most 4; OMP_NUM_THREADS if set)")


def pick_device(text: str | None, fail: Callable[[str], NoReturn]) -> torch.device:
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        fail(f"--device {text}: expected cpu, cuda or cuda:N")
    if device.type == "cpu":
        if device.index not in (None, 0):
            fail(f"--device {text}: the CPU takes no index (pass cpu; --threads N sets how many cores it uses)")
        return torch.device("cpu")
    if device.type != "cuda":
        fail(f"--device {text}: expected cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        fail(f"--device {text}: CUDA is not available here")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        fail(f"--device {text}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's share), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(cores: int) -> int:
    """Half the cores (the other half absorbs the rest of the machine's load: with every core busy,
    one delayed thread stalls each op), at least 1, at most MAX_DEFAULT_THREADS."""
    return max(1, min(MAX_DEFAULT_THREADS, cores // 2))


def set_threads(requested: int | None, fail: Callable[[str], NoReturn]) -> str:
    """Set torch's CPU threads; returns how the number was chosen, for the user."""
    if requested is not None:
        if requested < 1:
            fail(f"--threads {requested}: expected a positive number of threads")
        torch.set_num_threads(requested)
        return "--threads"
    if os.environ.get("OMP_NUM_THREADS"):
        return "OMP_NUM_THREADS"  # torch already took it
    cores = cpu_cores()
    torch.set_num_threads(default_threads(cores))
    return f"default for {cores} cores; --threads N to change"
