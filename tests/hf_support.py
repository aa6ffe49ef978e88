"""Tiny HF models of every supported family, saved and loaded back from disk (nothing downloads),
HF's own logits (its default cache and SDPA, one row at a time) to compare ours against, and the
decoding scenarios the HF-integration tests replay on the CPU (fp32) and on a GPU (bf16).

A scenario yields (label, ours, theirs): our logits and a tuple of HF's, one per reference model;
the tests decide the tolerance.
"""

import contextlib

import torch
from transformers import (AutoModelForCausalLM, AutoModelForSeq2SeqLM, BartConfig, GPT2Config, LlamaConfig,
                          MistralConfig, Qwen2Config, Qwen3Config)

from specdec_kernels import hf
from specdec_kernels.hf.cache_keyword import MODEL_CACHE_KEYWORD

VOCAB = 64
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gpt2", "bart")
# Larger than HF's default init (0.02), so attention patterns differ clearly between tokens and
# a wrong mask or position shows up far above the 1e-5 tolerance.
INIT_STD = 0.1


@contextlib.contextmanager
def one_thread():
    """Tiny models run several times faster on one CPU thread (no thread hand-offs per op)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def tiny_config(family: str):
    rotary = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, initializer_range=INIT_STD)
    if family == "llama":
        return LlamaConfig(**rotary)
    if family == "qwen2":
        return Qwen2Config(**rotary)
    if family == "qwen3":
        return Qwen3Config(**rotary, head_dim=16)  # head_dim != hidden / heads, as in real Qwen3
    if family == "mistral":
        return MistralConfig(**rotary, sliding_window=64)  # S_max <= window: a sliding window changes nothing
    if family == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, initializer_range=INIT_STD,
                          bos_token_id=0, eos_token_id=0)
    if family == "bart":
        return BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                          init_std=INIT_STD, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    raise ValueError(family)


def auto_class(family: str):
    return AutoModelForSeq2SeqLM if family == "bart" else AutoModelForCausalLM


def save_tiny_model(family: str, directory, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = auto_class(family).from_config(tiny_config(family))
    with torch.no_grad():  # also the weights HF initialises to zero or one (biases, norms), so they matter
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory)


def load_pair(family: str, directory, *, dtype=torch.float32, device="cpu"):
    """(HF's model with SDPA, our adapter over a second copy), both loaded from `directory`."""
    reference = auto_class(family).from_pretrained(directory, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    ours = auto_class(family).from_pretrained(directory, dtype=dtype).to(device).eval()
    return reference, hf.adapt(ours)


class HFReference:
    """HF's logits for one row at a time, from each of `models` (e.g. fp32 and bf16 copies): the
    committed tokens through HF's default cache, then the new tokens on top (what an HF generation
    loop computes, with no padding anywhere). Results are tuples, one tensor per model."""

    def __init__(self, models, sources: torch.Tensor | None = None, source_lengths: list[int] | None = None):
        self.models, self.sources, self.source_lengths = models, sources, source_lengths

    def _forward(self, model, row: int, tokens: list[int], past=None, **kwargs):
        ids = torch.tensor([tokens], dtype=torch.int64, device=model.device)
        if self.sources is None:
            return model(input_ids=ids, **{MODEL_CACHE_KEYWORD: past}, use_cache=True, **kwargs)
        source = self.sources[row:row + 1, :self.source_lengths[row]].to(model.device)
        return model(input_ids=source, decoder_input_ids=ids, **{MODEL_CACHE_KEYWORD: past}, use_cache=True, **kwargs)

    @torch.no_grad()
    def logits(self, row: int, prefix: list[int], new: list[int]) -> tuple[torch.Tensor, ...]:
        """[len(new), V] logits of `new` after `prefix` (row's source for encoder-decoders)."""
        out = []
        for model in self.models:
            past = self._forward(model, row, prefix).past_key_values if prefix else None
            out.append(self._forward(model, row, new, past).logits[0])
        return tuple(out)

    @torch.no_grad()
    def hidden(self, row: int, tokens: list[int], layer: int) -> torch.Tensor:
        """[len(tokens), H]: HF's output_hidden_states[layer] of the decoder (first model, no cache)."""
        out = self._forward(self.models[0], row, tokens, output_hidden_states=True)
        states = out.decoder_hidden_states if self.sources is not None else out.hidden_states
        return states[layer][0]


class Session:
    """One batch on our side (adapter + SpecCache), mirrored by each row's committed tokens."""

    def __init__(self, adapter, *reference_models, batch: int = 3, max_length: int = 48, seed: int = 0):
        self.adapter = adapter
        self.gen = torch.Generator().manual_seed(seed)
        self.device = adapter.lm_head.weight.device
        self.cache = adapter.new_cache(batch, max_length)
        self.history = [[] for _ in range(batch)]
        if isinstance(adapter, hf.seq2seq.BartAdapter):
            lengths = [5, 3, 4, 6, 2][:batch]
            sources = self.randint(batch, max(lengths)).cpu()
            mask = (torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.int64)
            adapter.encode(sources.to(self.device), self.cache, attention_mask=mask.to(self.device))
            self.reference = HFReference(reference_models, sources, lengths)
        else:
            self.reference = HFReference(reference_models)

    def randint(self, *shape) -> torch.Tensor:
        return torch.randint(3, VOCAB, shape, generator=self.gen).to(self.device)

    def prefill(self, lengths: list[int]):
        prompts = self.randint(len(lengths), max(lengths))
        logits = self.adapter.prefill(prompts, self.cache, torch.tensor(lengths, device=self.device))
        for b, length in enumerate(lengths):
            self.history[b] = prompts[b, :length].tolist()
            yield f"prefill row {b}", logits[b, :length], self.reference.logits(b, [], self.history[b])

    def chain(self, num_tokens: int):
        """Verify a chain of num_tokens per row (nothing committed); yields comparisons, returns tokens."""
        tokens = self.randint(len(self.history), num_tokens)
        logits = self.adapter.verify(tokens, self.cache)
        for b, history in enumerate(self.history):
            yield f"chain row {b}", logits[b], self.reference.logits(b, history, tokens[b].tolist())
        return tokens

    def decode(self):
        tokens = yield from self.chain(1)
        self.cache.commit()
        for b, history in enumerate(self.history):
            history.append(int(tokens[b, 0]))

    def rollback(self, tokens: torch.Tensor, num_accepted: list[int]):
        self.cache.rollback(torch.tensor(num_accepted, device=self.device))
        for b, history in enumerate(self.history):
            history.extend(tokens[b, :num_accepted[b] + 1].tolist())

    def tree(self, parents: torch.Tensor):
        """Verify a tree per row; yields each used node's logits against HF over its own path."""
        tokens = self.randint(*parents.shape)
        logits = self.adapter.verify(tokens, self.cache, parents.to(self.device))
        for b, history in enumerate(self.history):
            for node in range(parents.shape[1]):
                if node and parents[b, node] < 0:
                    continue  # unused slot
                path = tokens[b, tree_path(parents[b], node)].tolist()
                theirs = tuple(t[-1] for t in self.reference.logits(b, history, path))
                yield f"tree row {b} node {node}", logits[b, node], theirs
        return tokens

    def compact(self, tokens: torch.Tensor, parents: torch.Tensor, accepted_leaf: list[int]):
        """Accept the root-to-`accepted_leaf[b]` path of each row and compact the cache."""
        paths = [tree_path(parents[b], leaf) for b, leaf in enumerate(accepted_leaf)]
        width = max(len(p) for p in paths)
        accepted = torch.tensor([p + [-1] * (width - len(p)) for p in paths], device=self.device)
        self.cache.compact(accepted)
        for b, path in enumerate(paths):
            self.history[b].extend(tokens[b, path].tolist())

    def select_rows(self, rows: list[int]):
        self.cache.select_rows(torch.tensor(rows, device=self.device))
        self.history = [list(self.history[r]) for r in rows]
        if self.reference.sources is not None:  # the encoder side moves with the rows
            self.reference.sources = self.reference.sources[rows]
            self.reference.source_lengths = [self.reference.source_lengths[r] for r in rows]


def tree_path(parents: torch.Tensor, node: int) -> list[int]:
    """Node indices from the root to `node` (parents [N])."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


# Three differently shaped trees of 6 slots (the third row leaves two slots unused).
TREES = torch.tensor([[-1, 0, 0, 1, 1, 2],
                      [-1, 0, 1, 2, 0, 4],
                      [-1, 0, 0, 2, -1, -1]])


def scenario_prefill_decode(session: Session):
    yield from session.prefill([7, 4, 5])
    yield from session.decode()
    yield from session.decode()


def scenario_chain_rollback(session: Session):
    yield from session.prefill([6, 3, 5])
    tokens = yield from session.chain(4)  # root + 3 drafts
    session.rollback(tokens, [3, 0, 1])
    tokens = yield from session.chain(4)  # the next chain sees exactly the kept tokens
    session.rollback(tokens, [1, 2, 0])
    yield from session.decode()


def scenario_tree_compact(session: Session):
    yield from session.prefill([5, 7, 3])
    tokens = yield from session.tree(TREES)
    session.compact(tokens, TREES, [4, 5, 3])  # depths 2, 3, 2: nodes move into place
    yield from session.chain(3)
    tokens = yield from session.tree(TREES)
    session.compact(tokens, TREES, [0, 2, 1])
    yield from session.decode()


def scenario_rows(session: Session):
    yield from session.prefill([4, 6, 5])
    yield from session.decode()
    session.select_rows([2, 0])  # drop row 1, swap the others
    yield from session.decode()
    tokens = yield from session.tree(TREES[:2])
    session.compact(tokens, TREES[:2], [3, 2])
    yield from session.decode()


SCENARIOS = {"prefill_decode": scenario_prefill_decode, "chain_rollback": scenario_chain_rollback,
             "tree_compact": scenario_tree_compact, "rows": scenario_rows}
