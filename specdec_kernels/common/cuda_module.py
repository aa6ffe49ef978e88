"""Loads the optional compiled module `specdec_kernels._C` once and remembers why it failed."""

import importlib
import importlib.util

_state: dict = {}


def load():
    """The `_C` module, or None when it was not built or cannot be imported here."""
    if "module" not in _state:
        try:
            _state["module"] = importlib.import_module("specdec_kernels._C")
            _state["error"] = None
        except ImportError as err:
            _state["module"] = None
            _state["error"] = str(err)
    return _state["module"]


def built() -> bool:
    """True when a compiled `_C` file is installed with the package."""
    return importlib.util.find_spec("specdec_kernels._C") is not None


def load_error() -> str | None:
    load()
    return _state["error"]
