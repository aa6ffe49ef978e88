"""Triton's interpreter without its repeated patching of triton.language: the same results, about half the time.

A kernel launch under TRITON_INTERPRET=1 (GridExecutor.__call__) patches triton.language (its builtins become
numpy implementations) and restores it when the launch returns. Every call of a @triton.jit helper inside the
kernel (InterpretedFunction.__call__) runs that patching again, though nothing has been restored in between:
`_patch_builtin` walks every member of tl, tl.tensor and tl.math each time (~1.4 ms a call), and our kernels call
their helpers per tile, so two thirds of an interpreted tree attention went there. Patching again is a no-op in
effect (a patched builtin is no longer a builtin, so it is not wrapped twice; the other attributes are set to the
same functions; the helper's scope is never restored), so a helper call inside a launch that already patched the
modules the helper sees skips it. Every release we claim (3.6 to 3.9) has this structure; another one is left
as it is (`install` says whether it patched) and the tests are only slower.

tests/conftest.py installs it; tests/test_interpreter_speedup.py checks the results are unchanged.
"""

import inspect
import threading


class _Launch(threading.local):
    fn = None  # the kernel being launched
    modules = None  # ids of the language modules patched since it started (None until its own patching)


def _language_modules(fn, tl) -> frozenset:
    return frozenset(id(value) for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in (tl, tl.core))


def install() -> bool:
    """Patch triton's interpreter module in this process; True if it has the expected structure and was patched."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    if getattr(interpreter._patch_lang, "skips_nested", False):
        return True
    executor, device_fn = getattr(interpreter, "GridExecutor", None), getattr(interpreter, "InterpretedFunction", None)
    try:  # the two call sites this relies on, as every release we claim has them
        structure = ("_patch_lang(self.fn)" in inspect.getsource(executor.__call__)
                     and "_patch_lang(self.fn)" in inspect.getsource(device_fn.__call__))
    except (AttributeError, OSError, TypeError):
        structure = False
    if not structure:
        return False
    original_patch, original_launch = interpreter._patch_lang, executor.__call__
    launch = _Launch()

    def patch_lang(fn):
        if launch.fn is None:
            return original_patch(fn)
        modules = _language_modules(fn, tl)
        if launch.modules is not None and modules <= launch.modules:
            return None  # a helper inside the launch, whose modules are patched: its caller discards the scope
        scope = original_patch(fn)  # the launch itself, or the first helper that sees another module (tl.core)
        launch.modules = modules | (launch.modules or frozenset())
        return scope

    def run_launch(self, *args, **kwargs):
        outer = launch.fn, launch.modules
        launch.fn, launch.modules = self.fn, None
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            launch.fn, launch.modules = outer

    patch_lang.skips_nested = True
    patch_lang.originals = original_patch, original_launch
    interpreter._patch_lang = patch_lang
    executor.__call__ = run_launch
    return True


def uninstall() -> None:
    """Triton's interpreter as it was (tests/test_interpreter_speedup.py compares the two)."""
    from triton.runtime import interpreter

    originals = getattr(interpreter._patch_lang, "originals", None)
    if originals is not None:
        interpreter._patch_lang, interpreter.GridExecutor.__call__ = originals
