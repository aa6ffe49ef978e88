"""What the run prints and writes: the header (device, driver, versions), the matrix and the report."""

import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict

import torch

from .device import describe_error
from .model import FAIL, PASS, SKIP, Plan, Result


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _driver(device) -> dict:
    """The CUDA driver API version (libcuda) and the NVIDIA driver version (nvidia-smi), as far as found."""
    info = {"cuda_driver_api": None, "nvidia_driver": None}
    if device.type != "cuda":
        return info
    try:
        import ctypes

        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            info["cuda_driver_api"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={index}"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            info["nvidia_driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def header(plan: Plan) -> dict:
    from .. import __version__, build_info

    device = plan.device
    info = {"specdec_kernels": __version__, "device": str(device), "python": platform.python_version(),
            "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
            "cuda_runtime": torch.version.cuda, "profile": plan.profile, "backends": list(plan.backends),
            "graphs": plan.graphs and device.type == "cuda", "engine": plan.engine, "seed": plan.seed,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(["specdec-kernels", *sys.argv[1:]])}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                    **_driver(device))
    else:
        info.update(name=f"CPU {platform.machine()} (selftest dev mode: tiny shapes, Triton interpreter)")
    try:
        built = build_info()
        info["cuda_module"] = built["cuda_module"]
    except Exception as error:  # noqa: BLE001 - the header must not stop the run
        info["cuda_module"] = {"error": describe_error(error)}
    return info


def matrix(results: list[Result]) -> dict:
    """{op: {backend: {pass, fail, skip}}} in first-seen order."""
    table: dict[str, dict[str, dict[str, int]]] = {}
    for r in results:
        cell = table.setdefault(r.op, {}).setdefault(r.backend, {PASS: 0, FAIL: 0, SKIP: 0})
        cell[r.status] += 1
    return table


def format_header(info: dict) -> str:
    lines = []
    if info["device"].startswith("cuda"):
        driver = info.get("nvidia_driver") or "?"
        api = info.get("cuda_driver_api")
        lines.append(f"device: {info['name']} ({info['device']}), compute capability {info['compute_capability']}, "
                     f"{info['memory_gib']} GiB, driver {driver}{f' (CUDA {api})' if api else ''}")
    else:
        lines.append(f"device: {info['name']}")
    lines.append(f"versions: specdec-kernels {info['specdec_kernels']}, torch {info['torch']} (CUDA runtime "
                 f"{info['cuda_runtime']}), triton {info['triton']}, transformers {info['transformers']}, "
                 f"python {info['python']}")
    module = info.get("cuda_module", {})
    if module.get("loaded"):
        runtime = module.get("cuda_runtime_version")
        if isinstance(runtime, int):  # cudaRuntimeGetVersion's 1000 * major + 10 * minor
            runtime = f"{runtime // 1000}.{runtime % 1000 // 10}"
        archs = " ".join(f"sm_{arch}" for arch in module.get("archs") or []) or "?"
        lines.append(f"_C: loaded, built for {archs} with CUDA runtime {runtime}")
    else:
        lines.append(f"_C: not loaded ({module.get('error') or 'not built'}): the cuda backend is not checked")
    lines.append(f"shapes: {info['profile']}; backends: {', '.join(info['backends']) or 'none'}; "
                 f"CUDA graphs: {'on' if info['graphs'] else 'off'}; engine: {'on' if info['engine'] else 'off'}")
    return "\n".join(lines)


def format_report(results: list[Result], seconds: float) -> str:
    """The matrix (ops x backends: passed/ran, failures, skips), every failure, the skip reasons, the verdict."""
    lines = []
    table = matrix(results)
    order = {"cuda": 0, "triton": 1, "torch": 2}
    backends = sorted({b for row in table.values() for b in row}, key=lambda b: (order.get(b, 3), b))
    width = max([len(op) for op in table] + [8])
    lines.append(f"{'op':<{width}}  " + "  ".join(f"{b:<18}" for b in backends).rstrip())
    for op, row in table.items():
        cells = []
        for backend in backends:
            cell = row.get(backend)
            if cell is None:
                text = "-"
            else:
                ran = cell[PASS] + cell[FAIL]
                text = f"{cell[PASS]}/{ran} pass" if ran else "skipped"
                if cell[FAIL]:
                    text += f" {cell[FAIL]} FAIL"
                if cell[SKIP] and ran:
                    text += f" +{cell[SKIP]} skip"
            cells.append(f"{text:<18}")
        lines.append(f"{op:<{width}}  " + "  ".join(cells).rstrip())
    failures = [r for r in results if r.status == FAIL]
    skips = [r for r in results if r.status == SKIP]
    if failures:
        lines.append("")
        lines.append("failures:")
        for r in failures:
            lines.append(f"  FAIL {r.op} [{r.backend}] {r.case} {r.dtype}: {r.message}")
    if skips:
        reasons: dict[tuple, int] = {}
        for r in skips:
            reasons[(r.op, r.backend, r.message.splitlines()[0][:160] if r.message else "")] = \
                reasons.get((r.op, r.backend, r.message.splitlines()[0][:160] if r.message else ""), 0) + 1
        lines.append("")
        lines.append("skipped:")
        for (op, backend, reason), count in reasons.items():
            lines.append(f"  {op} [{backend}] x{count}: {reason}")
    passed = sum(r.status == PASS for r in results)
    outcome = "FAIL" if failures else ("PASS" if passed else "NOTHING RAN")
    lines.append("")
    lines.append(f"selftest: {passed} passed, {len(failures)} failed, {len(skips)} skipped in {seconds:.1f} s: {outcome}")
    return "\n".join(lines)


class JsonLinesLog(list):
    """The run's results list that also appends every Result to a JSON-lines file the moment it is
    recorded (flushed), after one {"header": ...} line: a run killed by a timeout leaves each check it
    finished, which a JSON document rewritten per op does not (the engine is one op)."""

    def __init__(self, path: str, info: dict):
        super().__init__()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run's whole life
        self._write({"header": info})

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def note(self, record: dict) -> None:
        """A line that is no check (the watchdog's {"running": ...} markers)."""
        self._write(record)

    def append(self, result: Result) -> None:
        super().append(result)
        self._write(asdict(result))

    def extend(self, results) -> None:
        for result in results:
            self.append(result)

    def close(self) -> None:
        self._file.close()
