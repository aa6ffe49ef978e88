"""The HF-integration scenarios on a GPU in bf16 (run with -m gpu; skipped without CUDA).

Tolerance: bf16 logits cannot match HF's bf16 logits bit for bit (different summation orders),
so both are measured against HF's fp32 logits on the same GPU. Ours must be no further from fp32
than twice HF's own bf16 error plus 1e-2 (the logits of these tiny models are O(1)):
    max|ours_bf16 - hf_fp32| <= 2 * max|hf_bf16 - hf_fp32| + 1e-2   for every compared tensor.
"""

import pytest
import torch

from hf_support import FAMILIES, SCENARIOS, Session, auto_class, load_pair, save_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=FAMILIES)
def gpu_models(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    save_tiny_model(request.param, directory)
    exact = auto_class(request.param).from_pretrained(directory, attn_implementation="sdpa",
                                                      dtype=torch.float32).to("cuda").eval()
    hf_bf16, adapter = load_pair(request.param, directory, dtype=torch.bfloat16, device="cuda")
    return exact, hf_bf16, adapter


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_bf16_logits_track_hf(gpu_models, scenario):
    exact, hf_bf16, adapter = gpu_models
    assert adapter.new_cache(1, 8).keys.dtype == torch.bfloat16
    compared = 0
    for label, ours, (truth, theirs) in SCENARIOS[scenario](Session(adapter, exact, hf_bf16)):
        ours_error = (ours.float() - truth).abs().max().item()
        hf_error = (theirs.float() - truth).abs().max().item()
        assert ours_error <= 2 * hf_error + 1e-2, f"{label}: ours {ours_error:.4g} vs HF bf16 {hf_error:.4g}"
        compared += 1
    assert compared > 0
