"""What the public API (ops/) and the kernel layers (triton/, cuda/) both need, owned by neither.

registry: the backend registry the kernels register into and ops/ resolves from;
outputs: the verify ops' output tensors; kv_layout: the cache addressing of kv_compact;
workspace: zeroed per-stream workspaces; cuda_module: loading `_C`; limits: kernel limits
that the op and the kernels must agree on. Imports nothing above it.
"""
