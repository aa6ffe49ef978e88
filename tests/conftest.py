import importlib.util
import os
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run under the interpreter. It must be switched on before
# specdec_kernels (and so triton.jit) is first imported by any test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_speedup

    interpreter_speedup.install()  # the interpreter without its repeated patching: same results, ~40% less time

# The tests run the kernels that `auto` holds back until a GPU has verified them (common/kernel_trust.py): that is
# what they are for, and what the GPU calls run. tests/test_kernel_trust.py switches it off where it checks the gate.
os.environ.setdefault("SPECDEC_UNVERIFIED_KERNELS", "1")

# The Triton test modules import triton at the top: without it they are not collected.
collect_ignore_glob = [] if importlib.util.find_spec("triton") else ["test_triton_*.py"]


def pytest_addoption(parser):
    group = parser.getgroup("gpu", "GPU test tiers (tests/catalog_support.py)")
    group.addoption("--gpu-tier", choices=("quick", "full"), default=None,
                    help="the catalog cases of `-m gpu`: quick (default: a sample per op, ~3 minutes on 12 workers "
                         "of an H100) or full (every case; about 4000 tests)")
    group.addoption("--gpu-focus", metavar="OP[/BACKEND],...", default=None,
                    help="only these kernels get the tier's cases; every other kernel a control sample")


def pytest_configure(config):
    """The options reach the catalog's parametrisation (made when test modules are imported, also in
    xdist workers, which get the same options) through the environment."""
    from catalog_support import FOCUS_VARIABLE, TIER_VARIABLE

    for option, variable in (("--gpu-tier", TIER_VARIABLE), ("--gpu-focus", FOCUS_VARIABLE)):
        value = config.getoption(option)
        if value is not None:
            os.environ[variable] = value


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip cleanly on machines without CUDA; Triton tests need a GPU or the
    interpreter (TRITON_INTERPRET=1 before the first import of triton)."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_triton = pytest.mark.skip(reason="CPU tensors need TRITON_INTERPRET=1 set before triton is imported")
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    here = Path(__file__).resolve().parent
    for item in items:
        if here not in Path(item.path).resolve().parents:
            continue  # not this folder's test (bench/stand_in_hang.py, the dry run's stand-in, runs on a CPU)
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        elif not interpreting and item.path.name.startswith("test_triton_"):
            item.add_marker(skip_triton)
