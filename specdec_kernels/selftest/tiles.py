"""Cases that pin a Triton launcher's tiles: at "tiny" a case may carry `triton_overrides` (block
sizes, splits) so the interpreter's small shapes still cross tile and split boundaries."""

import importlib


def run_with_tiles(op: str, family: str, x: dict, backend: str, launch):
    """`op` on `backend`; on Triton with the case's `triton_overrides`, launch(launcher, inputs, tiles)
    calls the family's own launcher with them, unless the registered Triton backend was replaced (a
    mutation test), which then runs as registered."""
    from .. import ops
    from ..common.registry import implementation

    x = dict(x)
    tiles = x.pop("triton_overrides", None)
    if tiles is not None and backend == "triton":
        launcher = getattr(importlib.import_module(f"..triton.{family}", __package__), op)
        if implementation(op, "triton") is launcher:
            return launch(launcher, x, tiles)
    return getattr(ops, op)(**x, backend=backend)
