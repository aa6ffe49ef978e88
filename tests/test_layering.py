"""Imports point down only: decoding -> hf -> ops -> kernels (triton/, cuda/) -> common, reference.

The kernel layers and what lies beneath them never import the public API (ops/) or anything
above it; a mutation that adds such an import makes this fail.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_kernels"
ABOVE = {"ops", "hf", "decoding", "integrations", "training", "cli", "demo", "defaults", "selftest"}
# layer -> the package's own top-level modules it may import
ALLOWED = {
    "common": {"common"},
    "reference": {"common", "reference"},
    "triton": {"common", "reference", "triton"},
    "cuda": {"common", "reference", "cuda"},
    "ops": {"common", "reference", "triton", "cuda", "ops"},
    # adapters for other engines sit on the public API, never on the kernels beneath it
    "integrations": {"common", "reference", "ops", "integrations"},
}


def package_imports(path: Path) -> set[str]:
    """Top-level specdec_kernels modules that `path` imports (absolute or relative)."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders below the package root
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found |= {n.split(".")[1] for n in names if n.startswith("specdec_kernels.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "specdec_kernels":
                    found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
                continue
            if node.level > depth + 1:
                continue
            own = list(path.relative_to(PACKAGE).parts[:-1])
            base = own[:len(own) - (node.level - 1)]
            parts = base + ((node.module or "").split(".") if node.module else [])
            found |= {parts[0]} if parts else {a.name for a in node.names}
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_never_import_upwards(layer):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, layer
    for path in files:
        imported = package_imports(path)
        bad = imported - ALLOWED[layer] - {"_version"}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)} (layer {layer!r} may import {sorted(ALLOWED[layer])})"


def test_the_checker_sees_relative_and_absolute_imports(tmp_path):
    assert package_imports(PACKAGE / "ops" / "early_exit.py") >= {"common", "reference"}
    assert "ops" in package_imports(PACKAGE / "__init__.py")
    assert ABOVE - set(ALLOWED)  # the upper layers are not in any allow-list
    assert package_imports(PACKAGE / "integrations" / "vllm" / "sampler.py") == {"ops"}


ADAPTERS = ("specdec_kernels.integrations.flashinfer", "specdec_kernels.integrations.sglang",
            "specdec_kernels.integrations.vllm", "specdec_kernels.hf_generate")


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_adapter_names_the_upstream_version_it_tracks(name):
    import importlib

    tracks = getattr(importlib.import_module(name), "TRACKS", None)
    assert isinstance(tracks, str) and tracks.split()[0] in ("flashinfer", "sgl-kernel", "vllm", "transformers"), name


def test_only_hf_private_reads_transformers_private_surface():
    """custom_generate's reads of HF internals (the calling generate()'s frame, GenerationConfig's private
    defaults) live in hf_generate/hf_private.py alone; a mutation that adds one elsewhere fails here."""
    private = ("_getframe", "f_locals", "f_back", "_get_default_generation_params")
    offenders = [f"{path.relative_to(PACKAGE)}: {word}" for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name != "hf_private.py" for word in private if word in path.read_text()]
    assert not offenders, offenders
    assert all(word in (PACKAGE / "hf_generate" / "hf_private.py").read_text() for word in private)
