"""Counter-based randomness shared by every backend: Philox-4x32-10 on 32-bit words.

A draw is a pure function of (seed, counter), so a row's result never depends on batch
order, batch size or how many draws other rows made, and a CUDA graph can replay it.
The torch, Triton and CUDA backends implement the same function bit for bit; this file
is the specification. All arithmetic stays inside int64 without overflow (products are
split into 16-bit halves), so the torch version is exact on every device.

Counter layout: (cursor + i, row key, salt, extra): the row's draw cursor (the ops' `offsets`), i the
draw's place in the call, the batch index for an int seed (0 for per-request seeds), the purpose
(SALT_* here, standardize.SALT_DRAFT, draft_tree.SALT_TREE_DRAFT) and a tree's sibling rank or slot.
How a loop advances the cursor, and why by the call's width: docs/ops.md, "Randomness".
"""

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10

SALT_ACCEPT = 0  # the coin that accepts or rejects a drafted token
SALT_FINAL = 1  # the draw of the correction / bonus token


def _mulhilo32(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * m for a in [0, 2^32), without int64 overflow."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    t_lo = a_lo * m  # < 2^48
    t_hi = a_hi * m  # < 2^48; a * m = t_hi * 2^16 + t_lo
    low = (t_lo + ((t_hi & 0xFFFF) << 16)) & MASK32
    high = ((t_hi + (t_lo >> 16)) >> 16) & MASK32
    return high, low


def philox4x32(c0, c1, c2, c3, k0, k1) -> tuple[torch.Tensor, ...]:
    """Philox-4x32-10 on int64 tensors holding 32-bit words; returns four 32-bit words."""
    c0, c1, c2, c3, k0, k1 = (torch.as_tensor(x, dtype=torch.int64) & MASK32 for x in (c0, c1, c2, c3, k0, k1))
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo32(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo32(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def philox_uniform(seed, position, row_key, salt: int, extra=0) -> torch.Tensor:
    """float64 uniforms in [0, 1) with 53 random bits, one per broadcast element.

    seed: int or int64 tensor (64-bit key); position, row_key, extra: int or int64 tensors.
    The value 0 is allowed on purpose: the ops' strict comparisons (u * q < p and
    "first cumulative weight > u * total") never select a zero-mass token for any u in [0, 1).
    """
    seed = torch.as_tensor(seed, dtype=torch.int64)
    position = torch.as_tensor(position, dtype=torch.int64)
    x0, x1, _, _ = philox4x32(position, row_key, salt, extra, seed & MASK32, (seed >> 32) & MASK32)
    bits53 = (x0 >> 5) * (1 << 26) + (x1 >> 6)  # 27 + 26 bits, exact in int64 and float64
    return bits53.to(torch.float64) * (2.0**-53)
