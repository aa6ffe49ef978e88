"""The shipped default models (specdec_kernels/default_models, made by bench/train_default_models.py):
they load, fit the size budget, their tokenizer round-trips source text, every strategy reproduces
the target's greedy output on them, and the trained draft agrees with the target far more often than
an untrained one; plus a --quick run of the training script whose output loads."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec_kernels
from default_models_support import save_tiny_default_models
from specdec_kernels.defaults import DEFAULT_MODELS_DIR, PARTS, default_models_available, load_default_models

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _stdlib_text import HELD_OUT, stdlib_files  # noqa: E402
from train_default_models import folder_bytes, greedy_acceptance  # noqa: E402

BUDGET_BYTES = 20 * 1000 * 1000
NEW = 12
# Share of the target's greedy tokens the draft predicts on held-out text: the shipped draft
# (distilled from its target) must reach it; the untrained tiny set's draft must not.
ACCEPTANCE_FLOOR = 0.5

pytestmark = pytest.mark.skipif(not default_models_available(), reason="no default models shipped in the package")


@pytest.fixture(scope="module")
def models():
    return load_default_models()


def held_out_text() -> str:
    return next(iter(stdlib_files(HELD_OUT).values()))


def test_shipped_set_is_complete_and_within_budget():
    for part in PARTS:
        assert (DEFAULT_MODELS_DIR / part).is_dir(), part
    made = (DEFAULT_MODELS_DIR / "MADE.md").read_text()
    assert "command:" in made and "device:" in made and "acceptance" in made
    assert 0 < folder_bytes(DEFAULT_MODELS_DIR) <= BUDGET_BYTES


def test_loads_with_the_documented_architecture(models):
    config = models.target.config
    assert config.hidden_size // config.num_attention_heads in (64, 128)  # the kernels' fast head_dim
    assert config.num_key_value_heads < config.num_attention_heads  # GQA
    assert models.draft.config.num_hidden_layers < config.num_hidden_layers
    assert models.draft.config.vocab_size == config.vocab_size == len(models.tokenizer)
    assert models.early_exit_heads.layers == sorted({config.num_hidden_layers // 2, 3 * config.num_hidden_layers // 4})
    assert next(models.target.parameters()).dtype == torch.float32  # CPU default


def test_tokenizer_round_trips_source_text(models):
    text = held_out_text()[:4000]
    ids = models.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert models.tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2  # BPE merges, not bytes
    assert models.tokenizer.eos_token == models.tokenizer.pad_token == "<|endoftext|>"


def left_padded_prompts(tokenizer):
    text = held_out_text()
    tokenizer.padding_side = "left"
    batch = tokenizer([text[:60], text[200:230]], add_special_tokens=False, return_tensors="pt", padding=True)
    assert (batch.attention_mask[1] == 0).any()  # the second row really is padded
    return batch.input_ids, batch.attention_mask


@pytest.mark.parametrize("strategy,options", [
    ("speculative", {"num_draft_tokens": 3}),
    ("bild", {"rollback_rule": "exact"}),
    ("specdec", {"top_beta": 1}),
    ("ppd", {"k": 3}),
    ("eagle", {"num_draft_tokens": 4}),
    ("eagle", {"num_draft_tokens": 4, "tree_topk": 3, "tree_nodes": 12}),
])
def test_every_strategy_reproduces_greedy(models, strategy, options):
    ids, mask = left_padded_prompts(models.tokenizer)
    pad = models.tokenizer.pad_token_id
    expected = models.target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=pad)
    out = specdec_kernels.generate(models.target, ids, attention_mask=mask, strategy=strategy, max_new_tokens=NEW,
                                   pad_token_id=pad, **models.strategy_options()[strategy], **options)
    assert torch.equal(out.sequences, expected)


def acceptance(models, prompts: int = 4, length: int = 24) -> float:
    ids = models.tokenizer(held_out_text(), add_special_tokens=False, return_tensors="pt").input_ids[0]
    return greedy_acceptance(models.target, models.draft, ids[:prompts * length].view(prompts, length), NEW)


def test_trained_draft_agrees_more_often_than_an_untrained_one(models, tmp_path):
    untrained = load_default_models(save_tiny_default_models(tmp_path / "tiny"))
    assert acceptance(untrained) < ACCEPTANCE_FLOOR <= acceptance(models)


def eagle_tokens_per_forward(models, head) -> float:
    ids, mask = left_padded_prompts(models.tokenizer)
    out = specdec_kernels.generate(models.target, ids, attention_mask=mask, strategy="eagle", draft_model=head,
                                   num_draft_tokens=4, max_new_tokens=NEW, pad_token_id=models.tokenizer.pad_token_id)
    return out.stats.mean_accepted_tokens


def test_the_trained_eagle_head_drafts_target_ids(models):
    """The shipped head (MADE.md beside it) drafts over 3,072 of the 4,096 ids, mapped by d2t: with d2t taken away
    (draft ids read as target ids) its drafts are other tokens and far fewer are accepted."""
    head = models.eagle3
    assert head is not None and head.draft_vocab < head.vocab and head.d2t.any()
    assert "acceptance" in (DEFAULT_MODELS_DIR / "eagle3" / "MADE.md").read_text()
    trained = eagle_tokens_per_forward(models, head)
    saved = head.d2t.clone()
    try:
        head.d2t.zero_()
        unmapped = eagle_tokens_per_forward(models, head)
    finally:
        head.d2t.copy_(saved)
    assert trained > 1.5 and unmapped < 1 + (trained - 1) / 2


def test_quick_training_run_makes_a_loadable_set(tmp_path):
    out = tmp_path / "quick"
    subprocess.run([sys.executable, str(ROOT / "bench/train_default_models.py"), "--quick", "--out", str(out),
                    "--device", "cpu"], check=True, capture_output=True, cwd=ROOT)
    models = load_default_models(out)
    assert "acceptance" in (out / "MADE.md").read_text()
    ids = models.tokenizer("def f(x):\n", return_tensors="pt").input_ids
    pad = models.tokenizer.pad_token_id
    out_ids = specdec_kernels.generate(models.target, ids, strategy="speculative", draft_model=models.draft,
                                       max_new_tokens=4, pad_token_id=pad).sequences
    assert torch.equal(out_ids, models.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                                                       do_sample=False, pad_token_id=pad))


def test_quick_eagle_training_run_makes_a_loadable_head(models, tmp_path):
    from specdec_kernels.models import Eagle3Drafter

    out = tmp_path / "eagle3"
    subprocess.run([sys.executable, str(ROOT / "bench/train_eagle.py"), "--quick", "--out", str(out)], check=True,
                   capture_output=True, cwd=ROOT)
    assert "acceptance" in (out / "MADE.md").read_text()
    head = Eagle3Drafter.from_pretrained(out, models.target)
    ids = models.tokenizer("def f(x):\n", return_tensors="pt").input_ids
    pad = models.tokenizer.pad_token_id
    got = specdec_kernels.generate(models.target, ids, strategy="eagle", draft_model=head, max_new_tokens=6,
                                   pad_token_id=pad).sequences
    assert torch.equal(got, models.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                                   do_sample=False, pad_token_id=pad))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_a_cuda_device_without_cuda_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^load_default_models: device='cuda' needs CUDA, which this torch \(.*\) "
                                         r"does not see: pass device='cpu'$"):
        load_default_models(device="cuda")
