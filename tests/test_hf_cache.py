"""SpecCache against a plain Python model of its contents: 1,000 random sequences of append /
rollback / compact / drop / reorder / repeat / crop operations (tiny shapes, torch backend), plus
its errors."""

import random

import pytest
import torch

from specdec_kernels.hf import SpecCache
from specdec_kernels.common import validate

from hf_support import one_thread

LAYERS, HEADS, DIM = 2, 2, 2


def content(uids: torch.Tensor) -> torch.Tensor:
    """[L, B, Hkv, N, D] K of tokens with unique ids uids [B, N] (V is its negation): every
    (token, layer, head, dim) gets its own exactly representable value."""
    layer = torch.arange(LAYERS).view(LAYERS, 1, 1, 1, 1) * 5
    head = torch.arange(HEADS).view(1, 1, HEADS, 1, 1) * 100
    dim = torch.arange(DIM).view(1, 1, 1, 1, DIM) * 10
    return (uids.view(1, uids.shape[0], 1, uids.shape[1], 1) * 1000 + layer + head + dim).float()


class Model:
    """What the cache must hold: each row's committed token ids, oldest first."""

    def __init__(self, batch: int):
        self.rows = [[] for _ in range(batch)]
        self.next_uid = 1

    def new_uids(self, num_tokens: int) -> torch.Tensor:
        uids = torch.arange(self.next_uid, self.next_uid + len(self.rows) * num_tokens).view(len(self.rows), num_tokens)
        self.next_uid += uids.numel()
        return uids

    def check(self, cache: SpecCache) -> None:
        lengths = [len(row) for row in self.rows]
        assert cache.seq_lens.tolist() == lengths
        width = max(lengths)
        if not width:
            return
        uids = torch.tensor([row + [0] * (width - len(row)) for row in self.rows])
        kept = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).view(1, -1, 1, width, 1)
        expected = content(uids)
        assert torch.equal(torch.where(kept, cache.keys[:, :, :, :width], 0), torch.where(kept, expected, 0))
        assert torch.equal(torch.where(kept, cache.values[:, :, :, :width], 0), torch.where(kept, -expected, 0))


def write(cache: SpecCache, model: Model, num_tokens: int) -> torch.Tensor | None:
    """A forward's K/V writes through HF's entry point (Cache.update, every layer); None when the
    cache refused because a row would pass S_max (then nothing may have changed)."""
    uids = model.new_uids(num_tokens)
    fits = max(len(row) for row in model.rows) + num_tokens <= cache.max_length
    keys = content(uids)
    try:
        for layer in range(LAYERS):
            cache.update(keys[layer], -keys[layer], layer)
    except ValueError as error:
        assert not fits and "exceeds max_length" in str(error)
        return None
    assert fits
    return uids


def random_tree(rng: random.Random, batch: int, n: int) -> torch.Tensor:
    parents = []
    for _ in range(batch):
        row, used = [-1], [True]
        for i in range(1, n):
            parent = rng.choice([j for j in range(i) if used[j]] + [-1])  # -1: an unused slot
            row.append(parent)
            used.append(parent >= 0)
        parents.append(row)
    return torch.tensor(parents)


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def random_step(rng: random.Random, cache: SpecCache, model: Model) -> None:
    batch = len(model.rows)
    op = rng.choice(["append", "append_ragged", "rollback", "compact", "drop", "reorder", "repeat", "crop"])
    if op in ("append", "append_ragged"):
        n = rng.randint(1, 4)
        uids = write(cache, model, n)
        if uids is None:
            return
        if op == "append":
            cache.commit(n)
            kept = [n] * batch
        else:  # per-row lengths, as after a right-padded prefill
            kept = [rng.randint(0, n) for _ in range(batch)]
            cache.commit(torch.tensor(kept))
        for b in range(batch):
            model.rows[b].extend(uids[b, :kept[b]].tolist())
    elif op == "rollback":
        g = rng.randint(0, 3)
        uids = write(cache, model, g + 1)
        if uids is None:
            return
        accepted = [rng.randint(0, g) for _ in range(batch)]
        cache.rollback(torch.tensor(accepted))
        for b in range(batch):
            model.rows[b].extend(uids[b, :accepted[b] + 1].tolist())
    elif op == "compact":
        n = rng.randint(1, 6)
        uids = write(cache, model, n)
        if uids is None:
            return
        parents = random_tree(rng, batch, n)
        paths = []
        for b in range(batch):
            used = [i for i in range(n) if i == 0 or parents[b, i] >= 0]
            paths.append(path_to(parents[b].tolist(), rng.choice(used)))
        width = max(len(p) for p in paths) + rng.randint(0, 1)  # sometimes extra -1 padding
        cache.compact(torch.tensor([p + [-1] * (width - len(p)) for p in paths]))
        for b, path in enumerate(paths):
            model.rows[b].extend(uids[b, path].tolist())
    elif op == "drop":
        keep = sorted(rng.sample(range(batch), rng.randint(1, batch)))
        cache.select_rows(torch.tensor(keep))
        model.rows = [model.rows[b] for b in keep]
    elif op == "reorder":
        order = rng.sample(range(batch), batch)
        cache.reorder_cache(torch.tensor(order))
        model.rows = [list(model.rows[b]) for b in order]
    elif op == "repeat":
        if batch > 2:
            return
        cache.batch_repeat_interleave(2)
        model.rows = [list(row) for row in model.rows for _ in range(2)]
    elif op == "crop":
        k = rng.randint(0, 2)
        cache.crop(k)
        model.rows = [row[:max(len(row) - k, 0)] for row in model.rows]


def run_sequences(count: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(count):
        batch = rng.randint(1, 4)
        cache = SpecCache(LAYERS, batch, HEADS, DIM, rng.randint(6, 14))
        model = Model(batch)
        for _ in range(rng.randint(3, 8)):
            random_step(rng, cache, model)
            model.check(cache)
        assert cache.keys.data_ptr() == cache.layers[0].keys.data_ptr()  # layer views follow new storage


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_random_operation_sequences_match_the_python_model():
    run_sequences(1000, seed=0)


def test_random_sequences_without_reading_lengths_back(monkeypatch):
    """As on a GPU: no value is read back, the cache keeps a host-side bound of the lengths and
    reads them (one sync) only when a write might pass S_max; errors stay exact."""
    monkeypatch.setattr(validate, "can_inspect", lambda tensor: False)
    run_sequences(200, seed=1)


def test_storage_is_one_tensor_with_per_layer_views():
    cache = SpecCache(3, 2, HEADS, DIM, 8)
    assert cache.keys.shape == (3, 2, HEADS, 8, DIM) and cache.seq_lens.dtype == torch.int64
    for layer in range(3):
        assert cache.layers[layer].keys.data_ptr() == cache.keys[layer].data_ptr()
        assert cache.layers[layer].values.data_ptr() == cache.values[layer].data_ptr()
    assert cache.holds(cache.layers[1].keys) and not cache.holds(cache.keys[1].clone())


def test_errors():
    cache = SpecCache(LAYERS, 2, HEADS, DIM, 4)
    keys = content(torch.arange(6).view(2, 3))[0]
    with pytest.raises(ValueError, match="batch of another size needs select_rows"):
        cache.update(keys[:1], -keys[:1], 0)
    with pytest.raises(TypeError, match="must be torch.float32"):
        cache.update(keys.double(), -keys.double(), 0)
    cache.update(keys, -keys, 0)
    with pytest.raises(ValueError, match="the last forward wrote 3"):
        cache.commit(4)
    with pytest.raises(ValueError, match=r"must be < 3"):
        cache.rollback(torch.tensor([3, 0]))
    cache.commit(2)
    with pytest.raises(ValueError, match="writing 3 tokens after a row of 2 exceeds max_length=4"):
        cache.update(keys, -keys, 0)
    with pytest.raises(ValueError, match=r"row numbers in \[0, 2\)"):
        cache.select_rows(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="max_length"):
        SpecCache(LAYERS, 2, HEADS, DIM, 0)
