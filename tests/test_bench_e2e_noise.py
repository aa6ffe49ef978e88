"""bench/e2e_noise_acceptance.py (how the first GPU look picks its ~0.7-acceptance noise level) on the tiny
shape: noise 0 makes the target the draft (acceptance exactly 1), noise lowers it, and bad input is refused."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/e2e_noise_acceptance.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_noise_zero_is_the_draft_and_noise_lowers_acceptance():
    done = run("--shape", "smoke", "--noise", "0", "0.3", "3")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["noise"] for row in rows] == [0.0, 0.3, 3.0]
    assert rows[0]["alpha_greedy"] == 1.0 and rows[0]["alpha_sampling"] == 1.0
    assert rows[1]["alpha_greedy"] < 1.0 and rows[1]["alpha_sampling"] < 1.0
    assert rows[2]["alpha_greedy"] < rows[1]["alpha_greedy"] and rows[2]["alpha_sampling"] < rows[1]["alpha_sampling"]
    assert all(row["positions"] == 4 * 24 for row in rows)  # 4 prompts x 24 new tokens (the defaults)


def test_bad_input_is_refused_in_one_line():
    done = run("--shape", "smoke", "--noise", "-1")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith("--noise levels must be >= 0")
    done = run("--shape", "smoke", "--noise", "0", "--rows", "0")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith("--rows must be at least 1")
