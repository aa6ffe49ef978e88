"""The CUDA kernels' random-number and fixed-point arithmetic (csrc/philox.cuh), built
for the host, against the torch specification: runs in CPU-only CI whenever _C is built."""

import pytest
import torch

from specdec_kernels import _cuda_module
from specdec_kernels.reference import _sampling, rng

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None, reason="specdec_kernels._C is not built here")


def test_philox_matches_random123_known_answers():
    # Random123's kat_vectors for philox4x32_10 (counter, key -> output).
    words = rng.philox4x32(0, 0, 0, 0, 0, 0)
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("seed", [0, 1, 12345, -1, 2**62 + 7, -(2**40) - 3])
@pytest.mark.parametrize("salt", [rng.SALT_ACCEPT, rng.SALT_FINAL])
def test_host_philox_uniform_is_the_reference(seed, salt):
    gen = torch.Generator().manual_seed(seed % 1000 + salt)
    n = 4000
    position = torch.randint(-(2**40), 2**40, (n,), generator=gen)
    position[:8] = torch.tensor([0, 1, 2**32 - 1, 2**32, -1, 2**31, 7, 2**33 + 5])
    row_key = torch.randint(0, 2**20, (n,), generator=gen)
    extra = torch.randint(0, 64, (n,), generator=gen)
    expected = rng.philox_uniform(seed, position, row_key, salt, extra)
    got = torch.tensor(_C.host_philox_uniform(seed, position.tolist(), row_key.tolist(), salt, extra.tolist()),
                       dtype=torch.float64)
    assert torch.equal(got, expected)


def test_host_to_weights_is_the_reference():
    gen = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, 1.0, 1.5, -1.0, float("nan"), float("inf"), float("-inf"), 1e-45, 1e-38,
                            2.0**-40, 2.0**-41, 1.0 - 2.0**-24, 0.5, 3e-13])
    x = torch.cat([special, torch.rand(20000, generator=gen), torch.rand(2000, generator=gen) * 1e-9,
                   torch.randn(2000, generator=gen)]).float()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # the kernels widen to fp32 first
        xs = x.to(dtype).float()
        expected = _sampling.to_weights(xs)
        got = torch.tensor(_C.host_to_weights(xs.tolist()), dtype=torch.int64)
        assert torch.equal(got, expected), dtype


def test_host_draw_threshold_is_the_reference():
    gen = torch.Generator().manual_seed(1)
    u = rng.philox_uniform(3, torch.arange(5000), 0, rng.SALT_FINAL)
    total = torch.randint(0, 2**57, (5000,), generator=gen)
    total[:4] = torch.tensor([0, 1, 2**40, 151936 * 2**40])
    expected = torch.floor(u * total.to(torch.float64)).to(torch.int64)  # as in _sampling.sample_weights
    got = torch.tensor(_C.host_draw_threshold(u.tolist(), total.tolist()), dtype=torch.int64)
    assert torch.equal(got, expected)
