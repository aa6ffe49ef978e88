"""Build `specdec_kernels/_C` in place for one GPU arch, without pip (the GPU scripts' build step).

A device machine is bare and its Python environment may not be ours to install into (an older
setuptools, a read-only venv): this builds the module next to the sources with setup.py's own
ninja file, so `PYTHONPATH=<repo>` then imports the package with its CUDA module.

    python bench/build_inplace.py                # the visible GPU's arch, every core
    python bench/build_inplace.py --arch 90      # a named arch (works without a GPU: a compile check)

Skips the build when a `_C` for this Python that was compiled for the arch already imports.
Prints one line: `built sm_90 in 41.2 s`, `skipped: ...` or `failed: ...` (exit 1).
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_setup():
    """setup.py's helpers (find_nvcc, write_ninja_file, ...); its setup() call runs only as __main__."""
    spec = importlib.util.spec_from_file_location("specdec_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_arch() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def importable_archs() -> list[str] | None:
    """Archs of a `_C` that imports from this checkout in a fresh interpreter, else None."""
    code = "import specdec_kernels._C as c; print(';'.join(c.compiled_archs()))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    return done.stdout.strip().split(";") if done.returncode == 0 else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", help="SM version such as 90 (default: the visible GPU's, else $SPECDEC_CUDA_ARCHS)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: every core)")
    parser.add_argument("--force", action="store_true", help="build even when a matching _C already imports")
    args = parser.parse_args(argv)
    arch = args.arch or gpu_arch() or os.environ.get("SPECDEC_CUDA_ARCHS")
    if arch is None:
        print("failed: no --arch, no visible CUDA GPU to read one from, and no SPECDEC_CUDA_ARCHS", flush=True)
        return 1
    have = None if args.force else importable_archs()
    if have is not None and arch in have:
        print(f"skipped: specdec_kernels._C for sm_{arch} already imports (archs {';'.join(have)})", flush=True)
        return 0
    setup = load_setup()
    nvcc, ninja = setup.find_nvcc(), setup.find_ninja()
    missing = [name for name, found in (("nvcc", nvcc), ("ninja", ninja), ("pybind11", setup.has_pybind11()))
               if not found]
    if missing:
        print(f"failed: {', '.join(missing)} not found", flush=True)
        return 1
    build_dir = ROOT / "build" / f"inplace_sm{arch}"
    build_dir.mkdir(parents=True, exist_ok=True)
    output = ROOT / "specdec_kernels" / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    ninja_file = setup.write_ninja_file(build_dir, output, nvcc, setup.parse_archs(arch))
    start = time.perf_counter()
    done = subprocess.run([ninja, "-f", str(ninja_file), "-j", str(args.jobs)], cwd=build_dir)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        print(f"failed: ninja exit {done.returncode} after {seconds:.1f} s", flush=True)
        return 1
    print(f"built sm_{arch} in {seconds:.1f} s ({args.jobs} jobs) -> {output.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
