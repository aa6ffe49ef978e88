"""The dry run's stand-in for a GPU test stuck in a CUDA call (bench/gpu_first_look.sh --dry-run, through
bench/gpu_pytest.py --stand-in-hang): with GPU_PYTEST_STAND_IN=1 it blocks the way a synchronize behind a
deadlocked kernel does, deaf to the signals a per-test timeout would send (SIGALRM, SIGTERM, SIGINT), so only
a kill ends it. Not a test file of the suite (its name matches no test pattern); passed to pytest by name."""

import os
import signal
import time

import pytest


@pytest.mark.gpu
def test_a_stuck_gpu_call():
    if os.environ.get("GPU_PYTEST_STAND_IN") != "1":
        pytest.skip("the stand-in hangs only in the dry run of bench/gpu_first_look.sh")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGTERM, signal.SIGINT})
    while True:
        time.sleep(3600)
