"""CUDA backend of `early_exit_topk` (csrc/early_exit.cu): fp16/bf16 weights with H % 8 == 0
and a 16-byte aligned LM head (row stride a multiple of 8) run the tensor-core path (three
launches: normalise once, mma.sync GEMM + top-k, merge); other calls the SIMT path (two
launches). No host sync; the workspace from the per-stream zeroed cache (handed back zeroed).
k <= common.limits.FUSED_MAX_K (the op runs larger k on the torch path)."""

from ..common.registry import register
from ..common.workspace import zeroed_workspace
from ..common.limits import FUSED_MAX_K
from ..common.outputs import topk_outputs
from ._launch import DTYPE_CODES, library, on_device, pointer, plan_limits, stream_handle

NORM_CODES = {"none": 0, "rms": 1, "layer": 2}


def early_exit_topk(hidden, norm_weight, lm_head_weight, k: int, *, eps: float, norm: str, norm_bias=None):
    lib = library()
    batch, hidden_size = hidden.shape
    vocab = lm_head_weight.shape[0]
    device = hidden.device
    values, indices = topk_outputs(hidden, k)
    if batch == 0:
        return values, indices
    if norm == "none":
        norm_weight = norm_bias = None
    norm_weight = None if norm_weight is None else norm_weight.contiguous()
    norm_bias = None if norm_bias is None else norm_bias.contiguous()
    if norm_weight is not None and norm_bias is not None and norm_bias.dtype != norm_weight.dtype:
        norm_bias = norm_bias.to(norm_weight.dtype)  # one norm dtype code for both vectors
    vectors = norm_weight if norm_weight is not None else norm_bias
    norm_dtype = DTYPE_CODES[vectors.dtype] if vectors is not None else 0
    with on_device(device):  # the plan (and so the workspace size) uses the current device's SM count
        dtype = DTYPE_CODES[hidden.dtype]
        nbytes = lib.early_exit_topk_workspace_bytes(batch, hidden_size, vocab, k, dtype,
                                                     mma_aligned(lm_head_weight))
        workspace = zeroed_workspace(device, nbytes)
        lib.early_exit_topk(hidden.data_ptr(), hidden.stride(0), pointer(norm_weight), pointer(norm_bias), norm_dtype,
                            lm_head_weight.data_ptr(), lm_head_weight.stride(0), values.data_ptr(),
                            indices.data_ptr(), workspace.data_ptr(), workspace.numel(), batch, hidden_size, vocab,
                            k, dtype, NORM_CODES[norm], float(eps), stream_handle(device))
    return values, indices


def mma_aligned(lm_head_weight) -> bool:
    """The launcher's rule (csrc/early_exit.cu, mma_aligned) for the tensor-core path's 16-byte loads."""
    return lm_head_weight.data_ptr() % 16 == 0 and lm_head_weight.stride(0) % 8 == 0


def _plan_sizes(sizes):
    """k beyond FUSED_MAX_K runs on the torch path whatever the backend: nothing to check. The
    weight dtype chooses the path (an unaligned LM head, known only at call time, takes SIMT)."""
    if sizes["k"] > FUSED_MAX_K:
        return None
    dtype = sizes.get("dtype")
    return dict(B=sizes["B"], H=sizes["H"], V=sizes["V"], k=sizes["k"],
                dtype=DTYPE_CODES.get(dtype, 0) if dtype is not None else 0)


register("early_exit_topk", "cuda", early_exit_topk, limits=plan_limits("early_exit_topk", _plan_sizes))
