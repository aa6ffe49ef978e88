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
