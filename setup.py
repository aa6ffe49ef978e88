"""Build `specdec_kernels._C` from csrc/ with nvcc through ninja.

The module is a plain pybind11 extension over raw device pointers: no torch C++ headers,
so it builds on a machine without a GPU (131 s of CPU time for sm_80 + sm_90 with nvcc 13.0: README, Install)
and runs with any torch version.

Environment:
  SPECDEC_NO_CUDA=1          skip the CUDA module (Python-only install)
  SPECDEC_CUDA_ARCHS="80;90" SM versions to compile for (PTX of the highest is added)
  SPECDEC_REQUIRE_CUDA=1     fail the install instead of falling back when nvcc (or ninja, pybind11) is missing or fails
  CUDA_HOME / CUDA_PATH      where the toolkit lives (else /usr/local/cuda, else nvcc on PATH)
"""

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
DEFAULT_ARCHS = "80;90"


def log(msg: str) -> None:
    print(f"[specdec-kernels] {msg}", file=sys.stderr, flush=True)


def find_nvcc() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    if Path("/usr/local/cuda/bin/nvcc").is_file():
        return "/usr/local/cuda/bin/nvcc"
    return shutil.which("nvcc")


def find_ninja() -> str | None:
    try:
        import ninja  # the PyPI package ships the binary

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("ninja")


def has_pybind11() -> bool:
    return importlib.util.find_spec("pybind11") is not None  # its headers build the module's C++ side


def parse_archs(text: str) -> list[str]:
    archs = [a.strip().replace("sm_", "").replace(".", "") for a in text.replace(",", ";").split(";")]
    archs = [a for a in archs if a]
    bad = [a for a in archs if not a.rstrip("a").isdigit()]
    if bad or not archs:
        raise ValueError(f"SPECDEC_CUDA_ARCHS must look like '80;90' (got {text!r})")
    return archs


def gencode_flags(archs: list[str]) -> list[str]:
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    top = max(archs, key=lambda a: int(a.rstrip("a")))
    flags.append(f"-gencode=arch=compute_{top},code=compute_{top}")  # PTX for newer GPUs
    return flags


def write_ninja_file(build_dir: Path, output: Path, nvcc: str, archs: list[str]) -> Path:
    import pybind11

    cuda_home = Path(nvcc).resolve().parent.parent
    py_include = sysconfig.get_paths()["include"]
    arch_macro = shlex.quote('-DSPECDEC_CUDA_ARCHS="' + ";".join(archs) + '"')  # ';' must not reach the shell
    cxx = os.environ.get("CXX", "c++")
    cu_sources = sorted(CSRC.glob("*.cu"))
    cpp_sources = sorted(CSRC.glob("*.cpp"))
    if not cu_sources or not cpp_sources:
        raise RuntimeError(f"no CUDA or C++ sources in {CSRC}")

    q = shlex.quote
    nvcc_flags = ["-O3", "-std=c++17", "-lineinfo", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
                  *gencode_flags(archs), f"-I{CSRC}"]
    cxx_flags = ["-O2", "-std=c++17", "-fPIC", "-fvisibility=hidden", f"-I{CSRC}",
                 f"-I{pybind11.get_include()}", f"-I{py_include}", f"-I{cuda_home / 'include'}", arch_macro]
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {q(nvcc)}",
        f"cxx = {q(cxx)}",
        f"nvcc_flags = {' '.join(q(f) for f in nvcc_flags)}",
        f"cxx_flags = {' '.join(cxx_flags)}",
        "rule nvcc",
        "  command = $nvcc $nvcc_flags -MD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule cxx",
        "  command = $cxx $cxx_flags -MMD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule link",
        # cudart is linked statically: importing the module never needs a driver or a GPU.
        "  command = $nvcc -shared -cudart static $in -o $out",
    ]
    objects = []
    for src in cu_sources + cpp_sources:
        obj = build_dir / (src.name + ".o")
        objects.append(obj)
        lines.append(f"build {obj}: {'nvcc' if src.suffix == '.cu' else 'cxx'} {src}")
    lines.append(f"build {output}: link {' '.join(str(o) for o in objects)}")
    lines.append(f"default {output}")
    path = build_dir / "build.ninja"
    path.write_text("\n".join(lines) + "\n")
    return path


class NinjaCudaBuild(build_ext):
    """Compiles the one CUDA extension with ninja; falls back to Python-only when it cannot."""

    def build_extension(self, ext: Extension) -> None:
        required = os.environ.get("SPECDEC_REQUIRE_CUDA") == "1"
        if os.environ.get("SPECDEC_NO_CUDA") == "1":
            log("SPECDEC_NO_CUDA=1: skipping the CUDA module; installing the Python-only package.")
            return
        nvcc = find_nvcc()
        if nvcc is None:
            msg = "nvcc not found (CUDA_HOME, /usr/local/cuda, PATH): installing the Python-only package."
            if required:
                raise RuntimeError(msg)
            log(msg)
            return
        # Without build isolation the environment may lack the build tools: that is a failed
        # CUDA build like any other (Python-only fallback), unless SPECDEC_REQUIRE_CUDA=1.
        ninja = find_ninja()
        missing = [name for name, found in (("ninja", ninja), ("pybind11", has_pybind11())) if not found]
        if missing:
            msg = f"{' and '.join(missing)} not found (pip install {' '.join(missing)}): installing the Python-only package."
            if required:
                raise RuntimeError(msg)
            log(msg)
            return
        archs = parse_archs(os.environ.get("SPECDEC_CUDA_ARCHS", DEFAULT_ARCHS))
        output = Path(self.get_ext_fullpath(ext.name)).resolve()
        output.parent.mkdir(parents=True, exist_ok=True)
        build_dir = Path(self.build_temp).resolve() / "csrc"
        build_dir.mkdir(parents=True, exist_ok=True)
        ninja_file = write_ninja_file(build_dir, output, nvcc, archs)
        jobs = os.environ.get("MAX_JOBS", str(max(1, os.cpu_count() or 1)))
        log(f"building specdec_kernels._C with {nvcc} for sm_{', sm_'.join(archs)} (+PTX)")
        try:
            subprocess.run([ninja, "-f", str(ninja_file), "-j", jobs], check=True, cwd=build_dir)
        except subprocess.CalledProcessError as err:
            if required:
                raise
            log(f"CUDA build failed ({err}); installing the Python-only package.")


if __name__ == "__main__":  # pip's build backend runs this file as __main__; bench/build_inplace.py imports it
    setup(
        # optional=True: when the module is not built (no nvcc, SPECDEC_NO_CUDA=1, a failed build),
        # setuptools' editable install skips copying it instead of failing with "can't copy
        # .../_C...so: doesn't exist" (tests/test_install_fallback.py covers every install mode).
        ext_modules=[Extension("specdec_kernels._C", sources=[], optional=True)],
        cmdclass={"build_ext": NinjaCudaBuild},
    )
