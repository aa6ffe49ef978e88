"""After a run on a GPU, each kernel whose every check passed (common/kernel_trust.kernels_that_passed) goes into
this machine's record of verified kernels, by its fingerprint and the GPU's architecture: from the next process
on, `backend="auto"` picks it on GPUs of that architecture (until its code changes)."""

from dataclasses import asdict
from pathlib import Path

from ..common import kernel_trust
from .model import Result


def record(info: dict, results: list[Result]) -> tuple[Path | None, list[str]]:
    """(the local record's path, the kernels added) for a run on a CUDA device; (None, []) otherwise."""
    if not str(info.get("device", "")).startswith("cuda") or "compute_capability" not in info:
        return None, []
    major, minor = str(info["compute_capability"]).split(".")
    entries = []
    for kernel, counts in kernel_trust.kernels_that_passed([asdict(r) for r in results]).items():
        fingerprint = kernel_trust.fingerprint(*kernel.split("/"))
        if fingerprint is None:
            continue  # a CUDA kernel of a `_C` that does not carry its sources' hashes: cannot be named
        skipped = f", {counts['skipped']} skipped" if counts["skipped"] else ""
        entries.append({"kernel": kernel, "fingerprint": fingerprint, "arch": f"sm_{major}{minor}",
                        "device": info.get("name", "unknown"),
                        "checks": f"specdec-kernels selftest ({info.get('profile')}): {counts['passed']} passed"
                                  f"{skipped}"})
    if not entries:
        return None, []
    return kernel_trust.record_local(entries), [entry["kernel"] for entry in entries]


def summary(info: dict, results: list[Result]) -> str | None:
    """Record the run's verified kernels; the line that says so (None when nothing was recorded)."""
    path, kernels = record(info, results)
    if path is None:
        return None
    arch = "sm_" + str(info["compute_capability"]).replace(".", "")
    return (f"verified on {arch}, picked by backend='auto' from now on: {len(kernels)} kernels "
            f"({', '.join(kernels)}) in {path}")
