"""The python/ strategy examples and the hand-written ops decode loop run and reproduce greedy: on the tiny
untrained default set (--models), and on the embedded set when this checkout ships it."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from default_models_support import save_tiny_default_models
from specdec_kernels.defaults import default_models_available

ROOT = Path(__file__).resolve().parents[1]
# what each example must print (its lossless run equals the target's greedy output)
EXPECTED = {
    "generate_speculative.py": ["speculative == target greedy: True", "bild == target greedy: True"],
    "generate_speculative_tree.py": ["chain == target greedy: True", "tree == target greedy: True"],
    "generate_specdec.py": ["specdec (top_beta=1, tau=0.0) == target greedy: True"],
    "generate_bild.py": ["bild (exact) == target greedy: True", "bild (nll) == target greedy:"],
    "generate_ppd.py": ["ppd (head Y) == target greedy: True"],
    "hf_custom_generate.py": ["speculative == target greedy: True", "bild == target greedy: True"],
    "ops_decode_loop.py": ["speculative == greedy loop: True"],
}


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    return save_tiny_default_models(tmp_path_factory.mktemp("tiny_default_models"))


@pytest.fixture
def run_example(monkeypatch, capsys):
    """Run python/<name> in this process (as `python python/<name> --max-new-tokens 6 ARGS`) and return its stdout:
    no interpreter start and transformers import per example."""
    monkeypatch.syspath_prepend(str(ROOT / "python"))  # the examples import python/example_models.py
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, above all on a shared machine

    def run(name, *args):
        monkeypatch.setattr(sys, "argv", [name, "--max-new-tokens", "6", *map(str, args)])
        capsys.readouterr()
        runpy.run_path(str(ROOT / "python" / name), run_name="__main__")
        return capsys.readouterr().out

    yield run
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_on_a_models_folder(name, tiny_set, run_example):
    out = run_example(name, "--models", tiny_set)
    for line in EXPECTED[name]:
        assert line in out


def test_ops_decode_loop_never_imports_transformers(tiny_set):
    script = ROOT / "python/ops_decode_loop.py"
    code = (f"import runpy, sys; sys.argv = [{str(script)!r}, '--models', {str(tiny_set)!r}, '--max-new-tokens', '3'];"
            "runpy.run_path(sys.argv[0], run_name='__main__');"
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "speculative == greedy loop: True" in done.stdout


def test_ppd_example_on_a_user_checkpoint(tiny_set, tmp_path, run_example):
    target = tmp_path / "target"  # a user's checkpoint: tokenizer files beside the weights
    target.mkdir()
    for part in ("target", "tokenizer"):
        for file in (tiny_set / part).iterdir():
            (target / file.name).write_bytes(file.read_bytes())
    assert "ppd (head N) == target greedy: True" in run_example("generate_ppd.py", "--target", target)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_on_the_embedded_set(name, run_example):
    if not default_models_available():
        pytest.skip("the embedded default models (specdec_kernels/default_models/) are not in this checkout")
    out = run_example(name)
    for line in EXPECTED[name]:
        assert line in out
