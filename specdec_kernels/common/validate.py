"""Input checks shared by the ops and the layers above them: every error names the op, the
argument and what was expected.

Checks of tensor *values* (token ranges, tree structure, lengths) run only for CPU
tensors outside torch.compile: on a GPU they would force a host sync, so the kernels are
written to stay in bounds for any value instead.
"""

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int64,)  # token ids entering the engine and the HF models (embedding lookups)
# Index tensors of the kernel ops (token ids, parents, counts, lengths, offsets, seeds, page ids):
# every backend reads both widths at any strides, so callers never copy to change them.
OP_INDEX_DTYPES = (torch.int64, torch.int32)


def fail(op: str, message: str, error=ValueError):
    raise error(f"{op}: {message}")


def _dtype_names(dtypes) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def tensor(op: str, name: str, x, *, shape: tuple, dtypes, device: torch.device | None = None,
           last_dim_contiguous: bool = True) -> torch.Tensor:
    """Check a tensor argument. `shape` entries: an int to match, or a str naming a free dim."""
    if not isinstance(x, torch.Tensor):
        fail(op, f"`{name}` must be a torch.Tensor (got {type(x).__name__})", TypeError)
    if x.dim() != len(shape) or any(not isinstance(s, str) and x.shape[i] != s for i, s in enumerate(shape)):
        # the message is built only on failure: under torch.compile sizes may be symbolic
        expected = "[" + ", ".join(str(s) for s in shape) + "]"
        fail(op, f"`{name}` must have shape {expected} (got {list(x.shape)})")
    if x.dtype not in dtypes:
        fail(op, f"`{name}` must have dtype {_dtype_names(dtypes)} (got {str(x.dtype).replace('torch.', '')})", TypeError)
    if device is not None and x.device != device:
        fail(op, f"`{name}` must be on {device}, like the other inputs (got {x.device})")
    if last_dim_contiguous and x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        fail(op, f"`{name}` must be contiguous in its last dimension (stride {x.stride(-1)}); call .contiguous()")
    return x


def split_seed(seed) -> tuple[int | None, torch.Tensor | None]:
    """(int seed, per-request seed tensor): the custom ops take the two forms separately."""
    return (None, seed) if isinstance(seed, torch.Tensor) else (seed, None)


def optional_tensor(op: str, name: str, x, **kwargs):
    return None if x is None else tensor(op, name, x, **kwargs)


def same_dtype(op: str, names: tuple[str, ...], *xs: torch.Tensor) -> None:
    if len({x.dtype for x in xs}) > 1:
        got = ", ".join(f"{n}={str(x.dtype).replace('torch.', '')}" for n, x in zip(names, xs))
        fail(op, f"{' and '.join(f'`{n}`' for n in names)} must share one dtype (got {got})", TypeError)


def can_inspect(x: torch.Tensor) -> bool:
    """Value checks run on CPU tensors in eager mode only (never a GPU sync, never in a graph)."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def token_range(op: str, name: str, tokens: torch.Tensor, vocab: int, *, allow_padding: bool = False) -> None:
    """Token ids in [0, V) (or -1 padding). Invalid ids are rejected by the kernels anyway."""
    if can_inspect(tokens) and tokens.numel():
        low = -1 if allow_padding else 0
        if int(tokens.min()) < low or int(tokens.max()) >= vocab:
            fail(op, f"`{name}` holds ids outside [{low}, {vocab}) (min {int(tokens.min())}, max {int(tokens.max())})")


def positive_int(op: str, name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(op, f"`{name}` must be an int >= {minimum} (got {value!r})")
    return value


def real_number(op: str, name: str, value, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        fail(op, f"`{name}` must be a real number (got {value!r})")
    if minimum is not None and value < minimum:
        fail(op, f"`{name}` must be >= {minimum} (got {value!r})")
    return float(value)


def randomness(op: str, uniforms, seed, offsets, *, shape: tuple, batch: int, device: torch.device):
    """Exactly one of `uniforms` (a float tensor in [0, 1)) and `seed` (int or int64/int32 [B])."""
    if (uniforms is None) == (seed is None):
        fail(op, "pass exactly one of `uniforms` (caller-supplied randomness) and `seed`")
    if uniforms is not None:
        tensor(op, "uniforms", uniforms, shape=shape, dtypes=(torch.float32, torch.float64), device=device,
               last_dim_contiguous=False)
        if can_inspect(uniforms) and uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
            fail(op, "`uniforms` must lie in [0, 1) (no NaN)")
        if offsets is not None:
            fail(op, "`offsets` only applies to seeded mode (`seed=`)")
    elif isinstance(seed, torch.Tensor):
        tensor(op, "seed", seed, shape=(batch,), dtypes=OP_INDEX_DTYPES, device=device, last_dim_contiguous=False)
    elif isinstance(seed, bool) or not isinstance(seed, int):
        fail(op, f"`seed` must be an int or an int64/int32 tensor [B] of per-request seeds (got {type(seed).__name__})", TypeError)
    elif not -(2**63) <= seed < 2**63:
        fail(op, f"`seed` must fit in a signed 64-bit integer (got {seed})")
    optional_tensor(op, "offsets", offsets, shape=(batch,), dtypes=OP_INDEX_DTYPES, device=device, last_dim_contiguous=False)


def temperature(op: str, value, *, batch: int, device: torch.device) -> tuple[float, torch.Tensor | None]:
    """(float temperature, per-row float32 [B] or None): a float > 0 or a [B] tensor of them."""
    if isinstance(value, torch.Tensor):
        rows = tensor(op, "temperature", value, shape=(batch,), dtypes=(torch.float32,), device=device,
                      last_dim_contiguous=False)
        if can_inspect(rows) and batch and not bool((rows > 0).all()):
            fail(op, "`temperature` must be > 0 in every row (use greedy_verify for greedy rows)")
        return 1.0, rows
    if real_number(op, "temperature", value) <= 0:
        fail(op, f"`temperature` must be > 0 (got {value}); use greedy_verify for greedy decoding")
    return float(value), None


def num_draft_tokens(op: str, counts, *, batch: int, g: int, device: torch.device):
    optional_tensor(op, "num_draft_tokens", counts, shape=(batch,), dtypes=OP_INDEX_DTYPES, device=device,
                    last_dim_contiguous=False)
    if counts is not None and can_inspect(counts) and counts.numel() and (int(counts.min()) < 0 or int(counts.max()) > g):
        fail(op, f"`num_draft_tokens` must lie in [0, {g}] (got min {int(counts.min())}, max {int(counts.max())})")


def tree_parents(op: str, parents: torch.Tensor) -> None:
    """Node 0 is the root (parent -1); node i > 0 has a parent in [0, i) or -1 (unused slot)."""
    if not can_inspect(parents) or parents.numel() == 0:
        return
    if bool((parents[:, 0] != -1).any()):
        fail(op, "`parents[:, 0]` must be -1 (node 0 is the root)")
    index = torch.arange(parents.shape[1]).unsqueeze(0)
    bad = (parents < -1) | (parents >= index)
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        fail(op, f"`parents[{b}, {i}]` = {int(parents[b, i])}: each node's parent must be an earlier node "
                 "(0 <= parent < node) or -1 for an unused slot")
    unused = (parents == -1) & (index > 0)
    orphans = (parents >= 0) & unused.gather(1, parents.clamp(min=0).long())  # gather takes int64 only
    if bool(orphans.any()):
        b, i = (int(v) for v in orphans.nonzero()[0])
        fail(op, f"`parents[{b}, {i}]` points at an unused slot")
