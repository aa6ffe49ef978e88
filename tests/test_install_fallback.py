"""The Python-only package (no `_C`) installs on the oldest setuptools pyproject.toml allows (issue 20, item 8).

With setuptools 78 (vLLM's CPU build pins setuptools < 81) an editable install whose `_C` was not built (no
nvcc, SPECDEC_NO_CUDA=1, a failed CUDA build) stopped with "can't copy .../_C...so: doesn't exist". Here a new
venv holds the floor setuptools and sees this environment's packages (torch, pybind11, ninja) through a .pth
line, so nothing big is downloaded; the source tree is installed into it with `--no-build-isolation
--no-deps`, editable and not, then imported. The isolated builds (`pip install [-e] .`, where pip fetches the
build requirements itself) run the same setup.py code; they are checked by hand (issue 20's note), not here,
because each downloads its build environment.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP_TIMEOUT_S = 300


def setuptools_floor() -> str:
    """The release named by pyproject.toml's `setuptools>=X` build requirement."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"setuptools>=([0-9.]+)"', text)
    assert found, "pyproject.toml's [build-system] requires must pin a setuptools floor: setuptools>=X.Y.Z"
    return found.group(1)


def pip(venv_python: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # This environment's pip drives the new interpreter (--python): the venv needs no pip of its own.
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), *args],
                          capture_output=True, text=True, env=env, timeout=PIP_TIMEOUT_S)


@pytest.fixture(scope="module")
def floor_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("setuptools_floor")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    floor = setuptools_floor()
    done = pip(python, "install", "-q", f"setuptools=={floor}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"the registry did not serve setuptools=={floor}: {last}")
    # Appended after the venv's own site-packages, so the floor setuptools wins over this environment's.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "zz_outer_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def source_tree(dest: Path) -> Path:
    """What a clean clone holds for the build, without a `_C` left by an earlier in-place build."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", "build")
    for name in ("csrc", "specdec_kernels"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest


def fake_cuda_home(dest: Path) -> Path:
    """A toolkit whose nvcc fails: a failed CUDA build, on any machine."""
    (dest / "bin").mkdir(parents=True)
    nvcc = dest / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc: simulated failure' >&2\nexit 1\n")
    nvcc.chmod(0o755)
    return dest


CASES = {
    # name: (editable?, why _C is not built, import the package? (torch's import costs seconds: once is enough))
    "editable-no-cuda": (True, "SPECDEC_NO_CUDA", True),
    "wheel-no-cuda": (False, "SPECDEC_NO_CUDA", False),
    "editable-failed-build": (True, "failed build", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_python_only_install_on_the_setuptools_floor(case, floor_venv, tmp_path):
    editable, reason, full_import = CASES[case]
    (tmp_path / "src").mkdir()
    src = source_tree(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_NO_CUDA", "SPECDEC_REQUIRE_CUDA", "CUDA_PATH")}
    if reason == "SPECDEC_NO_CUDA":
        env["SPECDEC_NO_CUDA"] = "1"
        expected_line = "SPECDEC_NO_CUDA=1: skipping the CUDA module"
    else:
        env["CUDA_HOME"] = str(fake_cuda_home(tmp_path / "cuda"))
        env["MAX_JOBS"] = "1"  # ninja stops at the first (failing) nvcc job: no C++ compiles in parallel with it
        expected_line = "CUDA build failed"
    target = ["-e", str(src)] if editable else [str(src)]
    done = pip(floor_venv, "install", "-v", "--no-build-isolation", "--no-deps", *target, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert expected_line in done.stdout + done.stderr  # the fallback said why (visible with pip -v)

    # Where the venv finds the package (without running it), that no _C came with it, and which setuptools built it.
    probe = ("import importlib.util, pathlib, setuptools; spec = importlib.util.find_spec('specdec_kernels'); "
             "print(setuptools.__version__); print(spec.origin); "
             "print(len(list(pathlib.Path(spec.origin).parent.glob('_C*'))))")
    if full_import:
        probe += "; import specdec_kernels; print(specdec_kernels.build_info()['cuda_module']['loaded'])"
    out = subprocess.run([str(floor_venv), "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(env, OMP_NUM_THREADS="1"), timeout=PIP_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-4000:]
    version, location, c_files, *loaded = out.stdout.split()
    assert version == setuptools_floor()
    installed_from = src if editable else floor_venv.parent.parent
    assert Path(location).resolve().is_relative_to(installed_from.resolve()), location
    assert c_files == "0"
    assert loaded == (["False"] if full_import else [])
