"""`specdec-kernels info`: what was built and which backend `auto` picks for each op on this machine,
in a few lines; `--json` prints the full record (specdec_kernels.build_info())."""

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the full build_info() record as JSON")


def summary(info: dict) -> str:
    cuda = info["cuda_module"]
    if cuda["loaded"]:
        runtime = cuda["cuda_runtime_version"]
        runtime = f", CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}" if runtime else ""
        module = f"built for sm {', '.join(cuda['archs'])}{runtime}, loaded"
    elif cuda["built"]:
        module = f"built but not loaded: {cuda['error']}"
    else:
        module = "not built (Python-only install: the torch and triton backends)"
    by_backend: dict[str, list[str]] = {}
    for op, backend in info["auto_backends"].items():
        by_backend.setdefault(backend, []).append(op)
    if len(by_backend) == 1:
        (backend, ops), = by_backend.items()
        picks = f"{backend} for all {len(ops)} ops"
    else:
        picks = "; ".join(f"{backend}: {', '.join(ops)}" for backend, ops in by_backend.items())
    device = info["device"] if info["cuda_available"] else "cpu (no GPU found)"
    lines = [f"specdec-kernels {info['version']} (torch {info['torch']}, triton {info['triton'] or 'not installed'}, "
             f"transformers {info['transformers'] or 'not installed'})",
             f"CUDA module: {module}",
             f"device: {device}",
             f"backend=\"auto\" picks: {picks}"]
    if info["cuda_available"]:  # why, per op: only kernels a GPU of this architecture verified (batch <= 8)
        width = max(len(op) for op in info["auto_reasons"])
        lines += [f"  {op:<{width}}  {why}" for op, why in info["auto_reasons"].items()]
    lines.append("(specdec-kernels info --json: the full record, incl. every op's implemented backends)")
    return "\n".join(lines)


def run(args) -> int:
    from . import build_info

    info = build_info()
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        print(summary(info))
    return 0
