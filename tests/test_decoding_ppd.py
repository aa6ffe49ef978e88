"""Strategy `ppd` on a tiny 4-layer fp32 Llama (CPU): token-identical to HF greedy for k in
{1, 3, 5} and exit layer d/2 and 3d/4, batch 1 and 4 (left-padded), torch and Triton (interpreter)
early-exit top-k; an always-hit candidate
source emits two tokens per step and a never-hit one one, and both leave the KV cache a greedy
prefill of the same tokens computes; trained "Y" heads lower the held-out KL to the final
layer and survive save/load; ppd.theory reproduces the paper's Figure 3/4 numbers from its
Table 2 match rates (worked out from the paper's Theorem 4.1); match_rate gives a Table-2-shaped table."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import specdec_kernels
from specdec_kernels import hf
from specdec_kernels.decoding import PPDDecoder
from specdec_kernels.decoding.engine import Engine, restored_attention
from specdec_kernels.decoding.ppd import format_match_table, match_rate, theory
from specdec_kernels.decoding.standardize import Sampling
from specdec_kernels.models import EarlyExitHeads
from specdec_kernels.training import early_exit_kl, train_early_exit_heads

from decoding_support import left_padded
from hf_support import VOCAB, one_thread

NEW = 12
DEPTH = 4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=DEPTH,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.1)
    built = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in built.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    directory = tmp_path_factory.mktemp("ppd_llama")
    built.save_pretrained(directory)
    return AutoModelForCausalLM.from_pretrained(directory).eval()


def greedy(model, ids, mask):
    return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("exit_layer", [DEPTH // 2, 3 * DEPTH // 4])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_identical_to_greedy(model, k, exit_layer):
    ids, mask = left_padded([7, 3, 5, 8], seed=2)
    out = specdec_kernels.generate(model, ids, attention_mask=mask, strategy="ppd", k=k, exit_layer=exit_layer,
                                   max_new_tokens=NEW, pad_token_id=0, backend="torch")
    assert torch.equal(out.sequences, greedy(model, ids, mask))
    extra = out.stats.extra
    assert extra["exit_layer"] == exit_layer and extra["k"] == k and extra["head"] == "N"
    assert out.stats.per_position_acceptance[0] == extra["match_rate"]
    one = PPDDecoder(model, k=k, exit_layer=exit_layer).generate(ids[2:3, -5:], max_new_tokens=NEW, pad_token_id=0)
    assert torch.equal(one.sequences, greedy(model, ids[2:3, -5:], None))


def test_triton_backend_identical_to_greedy(model):
    """The early head's top-k, the attention and kv_compact through the Triton kernels (interpreter here)."""
    ids, mask = left_padded([7, 3, 5, 8], seed=5)
    out = specdec_kernels.generate(model, ids, attention_mask=mask, strategy="ppd", k=3, max_new_tokens=6,
                                   pad_token_id=0, backend="triton")
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, expected)


class Oracle:
    """Candidates from the known greedy continuation: k distinct tokens that hold the true next
    token (hit) or all differ from it (miss)."""

    def __init__(self, continuation: torch.Tensor, k: int, hit: bool):
        self.continuation, self.k, self.hit = continuation, k, hit

    def __call__(self, engine, hidden):
        index = engine.num_generated.clamp(max=self.continuation.shape[1] - 1).unsqueeze(1)
        truth = self.continuation[engine.row_ids].gather(1, index)
        offsets = torch.arange(self.k).unsqueeze(0)
        # a hit puts the truth at branch (tokens so far) mod k, so every branch's K/V gets kept
        offsets = offsets - index % self.k if self.hit else offsets + 1
        return (truth + offsets) % VOCAB


def run_engine(model, strategy, ids, mask):
    engine = Engine(model, strategy, ids, attention_mask=mask, max_new_tokens=NEW,
                    sampling=Sampling(False, 1.0, None, None), eos_token_id=[], pad_token_id=0, backend="torch",
                    cuda_graphs=False)
    return engine, engine.run()


@pytest.mark.parametrize("hit", [True, False])
def test_candidate_source_paths_and_cache(model, hit):
    ids, mask = left_padded([6, 4], seed=3)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    continuation = expected[:, ids.shape[1]:]
    strategy = PPDDecoder(model, k=3, candidates=Oracle(continuation, 3, hit))
    with restored_attention(model):
        engine, out = run_engine(model, strategy, ids, mask)
        check_cache(hf.adapt(model), engine.cache, ids, mask, continuation)
    assert torch.equal(out.sequences, expected)
    steps = out.stats.steps
    assert steps == (NEW // 2 if hit else NEW)  # two tokens per step on a hit, one on a miss
    assert out.stats.extra["match_rate"] == (1.0 if hit else 0.0)


def check_cache(adapter, cache, ids, mask, continuation):
    """The cache holds prompt + generated tokens but the last one (the root): compare it with a
    plain prefill of exactly those tokens."""
    lengths = mask.sum(1)
    for row in range(ids.shape[0]):
        tokens = torch.cat([ids[row, ids.shape[1] - int(lengths[row]):], continuation[row]])[:-1]
        assert int(cache.seq_lens[row]) == tokens.numel()
        reference = adapter.new_cache(1, tokens.numel() + 1)
        adapter.prefill(tokens.unsqueeze(0), reference)
        n = tokens.numel()
        torch.testing.assert_close(cache.keys[:, row, :, :n], reference.keys[:, 0, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.values[:, row, :, :n], reference.values[:, 0, :, :n], rtol=1e-5, atol=1e-5)


def text_tokens(seed: int, count: int) -> list[torch.Tensor]:
    """Text from the model itself (its sampled continuations), so the heads see its distribution."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (count,), generator=gen)]


def test_trained_heads_lower_kl_and_reload(model, tmp_path):
    layers = [DEPTH // 2, 3 * DEPTH // 4]
    heads = train_early_exit_heads(model, layers, text_tokens(1, 2048), steps=150, batch_size=8,
                                   sequence_length=32, learning_rate=3e-3, output_dir=tmp_path, checkpoint_every=100,
                                   progress=False)
    held_out = torch.cat(text_tokens(9, 512)).view(16, 32)
    before = early_exit_kl(model, None, layers, held_out)
    after = early_exit_kl(model, heads, layers, held_out)
    for layer in layers:
        assert after[layer] < 0.8 * before[layer], (layer, before, after)
    loaded = EarlyExitHeads.from_pretrained(tmp_path)
    assert early_exit_kl(model, loaded, layers, held_out) == after
    ids, mask = left_padded([7, 3, 5, 8], seed=4)
    rates = {}
    for head in (None, loaded, EarlyExitHeads.from_pretrained(tmp_path, dtype=torch.float64)):  # cast to the target's
        out = specdec_kernels.generate(model, ids, attention_mask=mask, strategy="ppd", k=1, head=head,
                                       max_new_tokens=NEW, pad_token_id=0)
        assert torch.equal(out.sequences, greedy(model, ids, mask))
        rates[out.stats.extra["head"]] = out.stats.extra["match_rate"]
    table = match_rate(model, [ids[0, -5:], ids[3]], layers, ks=(1, 3), heads=loaded, new_tokens=8)
    assert {(r["layer"], r["k"], r["head"]) for r in table} == {(l, k, h) for l in layers for k in (1, 3)
                                                              for h in "NY"}
    for row in table:
        assert 0.0 <= row["match_rate"] <= 1.0 and row["tokens"] == 16
    rate = {(r["layer"], r["k"], r["head"]): r["match_rate"] for r in table}
    for layer in layers:
        for head in "NY":
            assert rate[(layer, 1, head)] <= rate[(layer, 3, head)]  # top-3 contains top-1
    assert "| 1 | Y |" in format_match_table(table)
    # a resumed run from the last checkpoint (step 100) ends where the uninterrupted one did
    resumed = train_early_exit_heads(model, layers, text_tokens(1, 2048), steps=150, batch_size=8,
                                     sequence_length=32, learning_rate=3e-3, output_dir=tmp_path, resume=True,
                                     progress=False)
    for (name, a), (_, b) in zip(heads.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


# the paper's layer-20 Table 2 match rates (Vicuna-13B, d = 40) and the Figure 3/4 values they
# give by Theorem 4.1: (p, k, latency per token / d, compute per time unit, compute per token / d)
FIGURE_POINTS = [
    (0.3890, 1, 0.805, 1.621, 1.305), (0.5281, 1, 0.736, 1.679, 1.236), (0.5404, 3, 0.730, 3.055, 2.230),
    (0.6837, 3, 0.658, 3.279, 2.158), (0.6015, 5, 0.699, 4.575, 3.199), (0.7415, 5, 0.629, 4.973, 3.129),
    (0.2163, 1, 0.892, 1.561, 1.392), (0.2917, 1, 0.854, 1.585, 1.354), (0.3169, 3, 0.842, 2.782, 2.342),
    (0.4114, 3, 0.794, 2.888, 2.294), (0.3713, 5, 0.814, 4.070, 3.314), (0.4784, 5, 0.761, 4.286, 3.261),
    (0.3208, 1, 0.840, 1.596, 1.340), (0.4365, 1, 0.782, 1.640, 1.282), (0.4636, 3, 0.768, 2.953, 2.268),
    (0.6060, 3, 0.697, 3.152, 2.197), (0.5251, 5, 0.737, 4.390, 3.237), (0.6733, 5, 0.663, 4.769, 3.163),
]


@pytest.mark.parametrize("p,k,latency,per_time,per_token", FIGURE_POINTS)
def test_theory_reproduces_the_papers_numbers(p, k, latency, per_time, per_token):
    out = theory(40, 20, k, p)
    assert round(out["normalized_latency"], 3) == latency
    assert round(out["compute_per_time_unit"], 3) == per_time
    assert round(out["normalized_compute_per_token"], 3) == per_token


def test_theory_expected_totals_and_simulation():
    # Theorem 4.1 values the note's simulation checked: (d, d̄, k, p, ℓ) -> (latency, compute)
    for (d, d_bar, k, p, length), (latency, compute) in [((40, 20, 3, 0.6837, 16), (434.89, 1394.89)),
                                                         ((40, 30, 1, 0.4, 128), (4612.0, 5892.0)),
                                                         ((40, 35, 5, 0.9, 10), (359.5, 609.5))]:
        out = theory(d, d_bar, k, p, length)
        assert round(out["expected_latency"], 2) == latency and round(out["expected_compute"], 2) == compute
    # Monte Carlo of the run structure (T_X = d + (X - 1)d̄, i.i.d. hits) agrees with the formula
    gen = torch.Generator().manual_seed(0)
    d, d_bar, k, p, length = 8, 5, 2, 0.6, 20
    hits = torch.rand(20000, length - 1, generator=gen) < p
    runs = 1 + (~hits).sum(1).double()
    latency = d_bar * length + (d - d_bar) * runs
    assert abs(latency.mean().item() - theory(d, d_bar, k, p, length)["expected_latency"]) < 0.2
    with pytest.raises(ValueError, match="d/2 <= d_bar < d"):
        theory(40, 10, 1, 0.5)


def test_clear_errors(model):
    ids = torch.randint(3, VOCAB, (1, 4))
    with pytest.raises(ValueError, match="exit_layer"):
        specdec_kernels.generate(model, ids, strategy="ppd", exit_layer=DEPTH, max_new_tokens=2)
    with pytest.raises(ValueError, match="do_sample"):
        specdec_kernels.generate(model, ids, strategy="ppd", do_sample=True, max_new_tokens=2)
    with pytest.raises(ValueError, match="head"):
        specdec_kernels.generate(model, ids, strategy="ppd", head="Z", max_new_tokens=2)
    with pytest.raises(ValueError, match="layers"):
        train_early_exit_heads(model, [DEPTH], text_tokens(0, 256), steps=1, progress=False)
