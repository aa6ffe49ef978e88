"""Backends that cannot serve a shape are skipped by `auto` and refused by name, never launched."""

import pytest
import torch

from specdec_kernels.common import registry

GPU = torch.device("cuda")  # resolve() only reads the device type: no GPU needed


@pytest.fixture
def fake_op(monkeypatch):
    """A registered op whose cuda backend serves B <= 4 and whose triton backend serves B <= 8."""
    monkeypatch.setattr(registry, "_IMPLS", {})
    monkeypatch.setattr(registry, "_LIMITS", {})
    monkeypatch.setattr(registry._cuda_module, "load", lambda: object())
    monkeypatch.setattr(registry, "triton_importable", lambda: True)
    registry.register("fake", "torch", lambda: "torch")
    registry.register("fake", "triton", lambda: "triton", limits=lambda s: None if s["B"] <= 8 else "B > 8")
    registry.register("fake", "cuda", lambda: "cuda", limits=lambda s: None if s["B"] <= 4 else "B > 4")
    return "fake"


@pytest.mark.parametrize("batch, expected", [(1, "cuda"), (4, "cuda"), (5, "triton"), (9, "torch")])
def test_auto_takes_the_first_backend_that_can_serve(fake_op, batch, expected):
    assert registry.resolve(fake_op, "auto", GPU, sizes={"B": batch}) == expected


def test_auto_without_sizes_keeps_the_preference_order(fake_op):
    assert registry.resolve(fake_op, "auto", GPU) == "cuda"
    assert registry.resolve(fake_op, "auto", torch.device("cpu"), sizes={"B": 1}) == "torch"


def test_an_explicit_backend_that_cannot_serve_says_why(fake_op):
    assert registry.resolve(fake_op, "cuda", GPU, sizes={"B": 4}) == "cuda"
    with pytest.raises(ValueError, match=r"fake: the 'cuda' backend cannot serve this call: B > 4; use backend='auto'"):
        registry.resolve(fake_op, "cuda", GPU, sizes={"B": 5})
    assert registry.refusal(fake_op, "triton", {"B": 9}) == "B > 8"
    assert registry.refusal(fake_op, "torch", {"B": 10**9}) is None
