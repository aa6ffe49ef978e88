"""Build `specdec_kernels._C` from csrc/ with nvcc through ninja.

The module is a plain pybind11 extension over raw device pointers: no torch C++ headers,
so it builds on a machine without a GPU (343 s of CPU time for sm_80 + sm_90 with nvcc 13.0: docs/install.md)
and runs with any torch version.

Environment:
  SPECDEC_NO_CUDA=1          skip the CUDA module (Python-only install)
  SPECDEC_CUDA_ARCHS="80;90" SM versions to compile for (PTX of the highest is added)
  SPECDEC_REQUIRE_CUDA=1     fail the install instead of falling back when nvcc (or ninja, pybind11) is missing or fails
  CUDA_HOME / CUDA_PATH      where the toolkit lives (else /usr/local/cuda, else nvcc on PATH)
"""

import importlib.util
import os
import re
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
# Where the repository lives: the package's links (PyPI's project page) point there. Confirm before a release.
PROJECT_URL = "https://github.com/specdec-kernels/specdec-kernels"
BUILD_MINUTES = "about 6 minutes of CPU time, so several minutes on 2 cores"  # docs/install.md: the measurement


TTY = "/dev/tty"  # the user's terminal: pip hides a build's own output unless it runs with -v


def log(msg: str) -> None:
    line = f"[specdec-kernels] {msg}"
    print(line, file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        return  # already on the terminal (python setup.py, pip -v)
    try:  # a long compile, or a Python-only install, must not pass unannounced under plain `pip install`
        with open(TTY, "w") as tty:
            tty.write(line + "\n")
    except OSError:
        pass  # no terminal (CI, a pipe): the line is in pip -v's output


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


def version() -> str:
    return re.search(r'__version__ = "([^"]+)"', (ROOT / "specdec_kernels" / "_version.py").read_text()).group(1)


def long_description() -> str:
    """README.md with its relative links made absolute: PyPI shows the description away from the repository,
    where `docs/install.md` leads nowhere. Links point at the release's tag, so they match the installed code."""
    base = f"{PROJECT_URL}/blob/v{version()}/"
    return re.sub(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)", lambda m: f"]({base}{m.group(1)})",
                  (ROOT / "README.md").read_text(encoding="utf-8"))


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
        log(f"compiling specdec_kernels._C with {nvcc} for sm_{', sm_'.join(archs)} (+PTX), {jobs} job(s): "
            f"{BUILD_MINUTES} (SPECDEC_NO_CUDA=1 skips it; SPECDEC_CUDA_ARCHS=90 builds one arch)")
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
        long_description=long_description(),
        long_description_content_type="text/markdown",
        project_urls={"Source": PROJECT_URL, "Documentation": f"{PROJECT_URL}/blob/v{version()}/docs/index.md"},
        ext_modules=[Extension("specdec_kernels._C", sources=[], optional=True)],
        cmdclass={"build_ext": NinjaCudaBuild},
    )
