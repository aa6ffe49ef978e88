"""Fixed-point sampling helpers in Triton, bit-identical to `specdec_kernels.common.sampling`.

  weight_v  = floor(clamp(x_v, 0, 1) * 2^40)   (x in float32; NaN -> 0, +inf -> 1, -inf -> 0)
  threshold = floor(u * float64(total))         (u float64 in [0, 1); kept in [0, total - 1])
  token     = first v with cumsum(weight)_v > threshold
            = the number of v with cumsum(weight)_v <= threshold

Weights are int64 and sums of them are exact, so any tiling or reduction order gives the
same token. Multiplying by 2^40 is exact in float32 for x in [0, 1], and the values being
floored are never negative, so a truncating cast is the floor.
"""

import triton
import triton.language as tl


@triton.jit
def to_weights(x):
    """int64 fixed-point weights of a float32 tile (reference `to_weights`)."""
    x = tl.where(x != x, 0.0, x)  # NaN -> 0 first: min/max NaN semantics differ across targets
    x = tl.minimum(tl.maximum(x, 0.0), 1.0)  # -inf -> 0, +inf -> 1
    return (x * 1099511627776.0).to(tl.int64)  # 2^40, exact in float32; x >= 0 so trunc == floor


@triton.jit
def draw_threshold(u, total):
    """floor(u * float64(total)) as int64, kept in [0, total - 1] (total int64 >= 0).

    For u in [0, 1) the clamp never acts; it keeps the draw inside the row for an
    unvalidated GPU uniform of 1.0, above 1, or NaN (`common.sampling.draw_threshold`).
    """
    x = u.to(tl.float64) * total.to(tl.float64)
    x = tl.where(x >= 0.0, tl.minimum(x, 4611686018427387904.0), 0.0)  # NaN, < 0 -> 0; 2^62 cap
    return tl.minimum(x.to(tl.int64), tl.maximum(total - 1, 0))


@triton.jit
def count_at_or_below(weights, carry, threshold, mask):
    """Within one tile: how many lanes have carry + inclusive cumsum(weights) <= threshold.

    Summed over the tiles of a row (carry = the weight of the tiles before), this is the
    index of the first token whose cumulative weight exceeds the threshold.
    """
    cdf = carry + tl.cumsum(weights, axis=0)
    return tl.sum(((cdf <= threshold) & mask).to(tl.int32), axis=0).to(tl.int64)
