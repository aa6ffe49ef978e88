"""Philox-4x32-10 in Triton, bit-identical to `specdec_kernels.common.rng`.

Device helpers only (no kernels): `philox4x32` works on uint32 tensors/scalars and
`philox_uniform` turns a counter (position, row key, salt, extra) and a 64-bit seed into
the same 53-bit float64 uniform as `rng.philox_uniform`:
    ((x0 >> 5) * 2^26 + (x1 >> 6)) * 2^-53.
Positions, row keys and seeds are int64; only their low 32 bits enter the counter (the
reference masks them with 0xFFFFFFFF too), and the seed is split into the key words
(low 32 bits, high 32 bits).
"""

import triton
import triton.language as tl

PHILOX_ROUNDS: tl.constexpr = tl.constexpr(10)
SALT_ACCEPT: tl.constexpr = tl.constexpr(0)  # rng.SALT_ACCEPT
SALT_FINAL: tl.constexpr = tl.constexpr(1)  # rng.SALT_FINAL

# randomness modes of the sampling kernels (constexpr `RANDOM` argument)
UNIFORMS: tl.constexpr = tl.constexpr(0)  # caller-supplied uniforms
INT_SEED: tl.constexpr = tl.constexpr(1)  # one int seed, rows keyed by batch index
ROW_SEEDS: tl.constexpr = tl.constexpr(2)  # int64 or int32 [B] per-request seeds (read as int64), row key 0


@triton.jit
def _u32(x):
    """Low 32 bits of an integer value as uint32 (int64 -> uint32 truncates)."""
    return x.to(tl.int64).to(tl.uint32)


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 on uint32 words (all arguments broadcast to one shape); returns 4 words."""
    m0 = tl.full((), 0xD2511F53, tl.uint32)
    m1 = tl.full((), 0xCD9E8D57, tl.uint32)
    w0 = tl.full((), 0x9E3779B9, tl.uint32)
    w1 = tl.full((), 0xBB67AE85, tl.uint32)
    for _ in tl.static_range(PHILOX_ROUNDS):
        hi0 = tl.umulhi(c0, m0)
        lo0 = c0 * m0  # uint32 product wraps: the low word
        hi1 = tl.umulhi(c2, m1)
        lo1 = c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + w0  # wraps mod 2^32
        k1 = k1 + w1
    return c0, c1, c2, c3


@triton.jit
def philox_uniform(seed, position, row_key, salt, extra):
    """float64 uniform in [0, 1) of rng.philox_uniform(seed, position, row_key, salt, extra).

    seed: int64 (64-bit key); position, row_key, extra: int64 (broadcast together); salt: int.
    """
    seed = seed.to(tl.int64)
    position = position.to(tl.int64)
    zero = tl.zeros_like(position)  # every counter word takes position's shape
    c0 = _u32(position)
    c1 = _u32(zero + row_key)
    c2 = _u32(zero + salt)
    c3 = _u32(zero + extra)
    k0 = _u32(zero + seed)
    k1 = _u32(zero + (seed >> 32))  # arithmetic shift, then the low 32 bits: the high word
    x0, x1, _x2, _x3 = philox4x32(c0, c1, c2, c3, k0, k1)
    bits53 = (x0 >> 5).to(tl.int64) * 67108864 + (x1 >> 6).to(tl.int64)  # 27 + 26 bits, 2^26 = 67108864
    return bits53.to(tl.float64) * 1.1102230246251565e-16  # 2^-53, exact scaling


@triton.jit
def row_stream(seeds_ptr, offsets_ptr, b, seed, stride_s, stride_o, RANDOM: tl.constexpr,
               HAS_OFFSETS: tl.constexpr):
    """(seed, row key, offset) int64 scalars of batch row b's Philox stream: an int seed keys rows
    by batch index; per-request seeds (ROW_SEEDS) use row key 0; caller uniforms use none of them
    (zeros). offset is offsets[b] when given, else 0."""
    if RANDOM == INT_SEED:
        seed_b = tl.full((), 0, tl.int64) + seed.to(tl.int64)
        row_key = b.to(tl.int64)
    elif RANDOM == ROW_SEEDS:
        seed_b = tl.load(seeds_ptr + b * stride_s).to(tl.int64)
        row_key = tl.full((), 0, tl.int64)
    else:
        seed_b = tl.full((), 0, tl.int64)
        row_key = tl.full((), 0, tl.int64)
    if HAS_OFFSETS:
        offset = tl.load(offsets_ptr + b * stride_o).to(tl.int64)
    else:
        offset = tl.full((), 0, tl.int64)
    return seed_b, row_key, offset
