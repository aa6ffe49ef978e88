"""Backend registry and selection: on a GPU `auto` tries the kernel backends the GPU measurements
name for the op and batch (common/auto_table.py; cuda, else triton, for an op never measured), skips
each one that no GPU of this architecture has verified in its current form (common/kernel_trust.py),
and falls back to torch; on a CPU it is torch.

A backend may register `limits`: a function of the call's sizes (a dict of named ints and
the dtype, built by the op: B, G, V, N, H, D, ...) that returns None when its kernels can
serve the call, else a one-line reason. `auto` skips a backend that cannot serve a shape
(so a shape past a kernel's launch limits runs on the next backend, never into a launch
error); an explicit backend that cannot serve it raises that reason.
"""

import functools
import os

import torch

try:  # private to torch: without it every call goes through the custom op (correct, only slower)
    from torch.utils._python_dispatch import _get_current_dispatch_mode as _get_dispatch_mode
except ImportError:  # pragma: no cover
    def _get_dispatch_mode():
        return True

from . import cuda_module as _cuda_module
from .auto_table import auto_order
from .kernel_trust import trusted, verified

BACKENDS = ("torch", "triton", "cuda")
_IMPLS: dict[str, dict[str, object]] = {}
_LIMITS: dict[tuple[str, str], object] = {}


def register(op: str, backend: str, fn, *, limits=None) -> None:
    """Register `fn` as `backend`'s implementation of `op`; `limits(sizes) -> str | None`."""
    assert backend in BACKENDS, backend
    _IMPLS.setdefault(op, {})[backend] = fn
    if limits is not None:
        _LIMITS[(op, backend)] = limits


def refusal(op: str, backend: str, sizes: dict | None) -> str | None:
    """Why `backend` cannot serve a call of `op` with these sizes, or None when it can."""
    limits = _LIMITS.get((op, backend))
    if limits is None or sizes is None:
        return None
    return limits(sizes)


def implementation(op: str, backend: str):
    return _IMPLS[op][backend]


def implemented_backends(op: str) -> tuple[str, ...]:
    return tuple(b for b in BACKENDS if b in _IMPLS.get(op, {}))


def registered_ops() -> tuple[str, ...]:
    return tuple(sorted(_IMPLS))


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _loads(backend: str) -> bool:
    """Whether a kernel backend's code is here: the `_C` module for cuda, the triton package for triton."""
    return _cuda_module.load() is not None if backend == "cuda" else triton_importable()


def resolve(op: str, backend: str, device: torch.device, *, runs_as: str | None = None,
            sizes: dict | None = None) -> str:
    """The concrete backend that runs `op` on tensors of `device`, or a clear error.

    runs_as: the registered op whose kernels do the work, when `op` is a composition.
    sizes: the call's sizes, checked against each backend's registered limits.
    """
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"{op}: backend must be one of 'auto', 'torch', 'triton', 'cuda' (got {backend!r})")
    kernel_op = runs_as or op
    available = implemented_backends(kernel_op)
    on_gpu = device.type == "cuda"
    if backend == "auto":
        if on_gpu:
            for candidate in auto_order(kernel_op, sizes):
                if (candidate in available and _loads(candidate) and refusal(kernel_op, candidate, sizes) is None
                        and verified(kernel_op, candidate, device)):
                    return candidate
        return "torch"
    if backend not in available:
        raise ValueError(f"{op}: the {backend!r} backend is not available for this op yet; implemented: {available}")
    if backend == "cuda":
        if not on_gpu:
            raise ValueError(f"{op}: backend='cuda' needs CUDA tensors (got tensors on {device})")
        if _cuda_module.load() is None:
            raise RuntimeError(f"{op}: backend='cuda' needs specdec_kernels._C, which is not loaded: "
                               f"{_cuda_module.load_error()} (see specdec_kernels.build_info())")
    if backend == "triton":
        if not triton_importable():
            raise RuntimeError(f"{op}: backend='triton' needs the triton package")
        if not on_gpu and not triton_interpreting():
            raise ValueError(f"{op}: backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 for CPU tensors")
    reason = refusal(kernel_op, backend, sizes)
    if reason is not None:
        raise ValueError(f"{op}: the {backend!r} backend cannot serve this call: {reason}; use backend='auto' "
                         f"(it picks a backend that can) or another backend")
    return backend


def auto_choice(op: str, device: torch.device, sizes: dict | None = None) -> dict:
    """What `auto` picks for `op` on `device` and why, as resolve() decides it (without its warning):
    {"backend": ..., "passed_over": [(backend, why), ...] in the measured order, "unverified": [backends
    passed over only for want of a GPU's verification]}."""
    available = implemented_backends(op)
    passed_over, unverified = [], []
    if device.type != "cuda":
        return {"backend": "torch", "passed_over": [], "unverified": []}
    for candidate in auto_order(op, sizes):
        if candidate not in available:
            continue
        if not _loads(candidate):
            passed_over.append((candidate, "not installed here"))
        elif (why := refusal(op, candidate, sizes)) is not None:
            passed_over.append((candidate, why))
        elif not trusted(op, candidate, device):
            passed_over.append((candidate, "not verified on this GPU's architecture in its current form"))
            unverified.append(candidate)
        else:
            return {"backend": candidate, "passed_over": passed_over, "unverified": unverified}
    return {"backend": "torch", "passed_over": passed_over, "unverified": unverified}


def _plain_tensors(values) -> bool:
    """Every tensor argument (also inside lists) is a plain torch.Tensor with data: no meta tensor,
    no FakeTensor, FunctionalTensor or other subclass that tracing / torch.compile hands an op."""
    for value in values:
        if isinstance(value, (list, tuple)):
            if not _plain_tensors(value):
                return False
        elif isinstance(value, torch.Tensor) and (type(value) is not torch.Tensor or value.is_meta):
            return False  # meta tensors too: their shapes come from the op's fake implementation
    return True


def eager_mode() -> bool:
    """Not compiling, and no torch dispatch or torch-function mode (fake tensors, make_fx,
    functionalisation) is active."""
    return (not torch.compiler.is_compiling() and _get_dispatch_mode() is None
            and not torch._C._is_torch_function_mode_enabled())


def eager(args) -> bool:
    """Whether a call can skip the custom-op dispatcher: eager_mode() and plain tensors only."""
    return eager_mode() and _plain_tensors(args)


class EagerFirstOp:
    """A torch.library custom op whose eager calls run its Python body directly.

    The custom op is what torch.compile, export and fake-tensor tracing need (its fake
    implementation gives them shapes); in eager mode its dispatch (schema parsing of the
    arguments, autograd and dispatcher boxing) costs tens of microseconds per call, which the
    CPU decode loop pays several times per token. Everything else (register_fake, torch.ops.specdec.*)
    is the custom op's.
    """

    def __init__(self, op, body):
        self.op, self.body = op, body

    def __call__(self, *args, **kwargs):
        if eager(args) and eager(kwargs.values()):
            return self.body(*args, **kwargs)
        return self.op(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.op, name)


def custom_op(name: str, *, mutates_args):
    """torch.library.custom_op(name, mutates_args=...), wrapped in EagerFirstOp."""
    def wrap(body):
        return EagerFirstOp(torch.library.custom_op(name, mutates_args=mutates_args)(body), body)
    return wrap
