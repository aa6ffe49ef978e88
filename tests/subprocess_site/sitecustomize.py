"""The interpreter speedup (tests/interpreter_speedup.py) in the Python subprocesses a test starts: a test that
puts this folder on PYTHONPATH (the GPU script's dry runs, whose selftest and pytest stages run Triton's
interpreter) gets the same results in about half the interpreter time, as the tests' own process does."""

import os
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import interpreter_speedup

    interpreter_speedup.install()
