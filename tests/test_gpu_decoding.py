"""The decoding engine on a GPU (run with -m gpu; skipped without CUDA): the CUDA-graph path
(draft and verify steps captured once per (batch size, draft length), then replayed, and kept for
the next call with the same shapes) gives the
same tokens as the eager path and as HF's greedy generate, in fp32; seeded sampling is identical
with and without graphs (the same kernels and Philox draws replayed)."""

import pytest
import torch

import specdec_kernels
from specdec_kernels import ops

from decoding_support import left_padded, make_pair

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_gpu_attention = pytest.mark.skipif(
    not any(b in ops.implemented_backends("tree_attention") for b in ("triton", "cuda")),
    reason="CUDA graphs need a GPU backend of ops.tree_attention (its torch reference syncs per row)")
NEW = 24


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request, tmp_path_factory):
    target, draft = make_pair(request.param, tmp_path_factory.mktemp(request.param))
    return target.to("cuda"), draft.to("cuda")


def hf_greedy(target, ids, mask):
    return target.generate(ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=NEW, do_sample=False, pad_token_id=0)


def run(target, draft, ids, mask, **kwargs):
    return specdec_kernels.generate(target, ids.cuda(), attention_mask=mask.cuda(), strategy="speculative",
                                    draft_model=draft, max_new_tokens=NEW, pad_token_id=0, **kwargs)


@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
def test_eager_greedy_equals_hf_on_gpu(pair, backend):
    target, draft = pair
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    expected = hf_greedy(target, ids, mask)
    out = run(target, draft, ids, mask, num_draft_tokens=3, backend=backend, cuda_graphs=False)
    assert torch.equal(out.sequences, expected)


@needs_gpu_attention
@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_graphs_equal_eager_and_hf(pair, schedule):
    target, draft = pair
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    expected = hf_greedy(target, ids, mask)
    specdec_kernels.decoding.clear_graph_cache()  # graphs are kept between calls: start without any
    graphed = run(target, draft, ids, mask, num_draft_tokens=3, schedule=schedule, cuda_graphs=True)
    assert torch.equal(graphed.sequences, expected)
    assert graphed.stats.extra["cuda_graphs_captured"] >= 2  # the draft and the verify step


@needs_gpu_attention
@pytest.mark.parametrize("max_new_tokens", [NEW, 5])
def test_second_call_replays_the_kept_graphs(pair, max_new_tokens):
    """A second call with new prompts of the same batch size and length bucket captures nothing (a
    shorter budget included: it is a device tensor) and still equals HF's greedy output."""
    target, draft = pair
    specdec_kernels.decoding.clear_graph_cache()
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    first = run(target, draft, ids, mask, num_draft_tokens=3, cuda_graphs=True)
    assert first.stats.extra["cuda_graphs_captured"] >= 2
    ids, mask = left_padded([4, 6, 2, 7], seed=5)
    second = specdec_kernels.generate(target, ids.cuda(), attention_mask=mask.cuda(), strategy="speculative",
                                      draft_model=draft, max_new_tokens=max_new_tokens, pad_token_id=0,
                                      num_draft_tokens=3, cuda_graphs=True)
    assert second.stats.extra["cuda_graphs_captured"] == 0
    expected = target.generate(ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=0)
    assert torch.equal(second.sequences, expected)


@needs_gpu_attention
def test_graphs_sampling_equals_eager(pair):
    target, draft = pair
    ids, mask = left_padded([6, 2, 4], seed=2)
    kwargs = dict(do_sample=True, temperature=0.9, top_p=0.95, seed=11, eos_token_id=[])
    eager = run(target, draft, ids, mask, cuda_graphs=False, **kwargs)
    graphed = run(target, draft, ids, mask, cuda_graphs=True, **kwargs)
    assert torch.equal(eager.sequences, graphed.sequences)


@needs_gpu_attention
def test_bild_graphs_exact_rule_equals_hf(pair):
    target, draft = pair
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    expected = hf_greedy(target, ids, mask)
    out = specdec_kernels.generate(target, ids.cuda(), attention_mask=mask.cuda(), strategy="bild", draft_model=draft,
                                   rollback_rule="exact", fallback_threshold=0.08, max_small_run=4,
                                   max_new_tokens=NEW, pad_token_id=0, cuda_graphs=True)
    assert torch.equal(out.sequences, expected)
