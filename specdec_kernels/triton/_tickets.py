"""Per-row tickets: how the split-V Triton kernels merge a row in the same launch.

Every program that owns a chunk of a row stores its partial results, then takes a ticket
from the row's int32 counter (in the per-stream zeroed workspace, `common.workspace`). The
program that draws the row's last ticket knows that every partial of the row is stored;
it merges them, finishes the row, and stores 0 back into the counter, so the workspace is
zeroed again for the next call or CUDA-graph replay. No second launch, no host sync.

The interpreter runs programs one after another; the barrier, the acq_rel atomic and the ".cg"
loads below are what a GPU needs.
"""

import triton
import triton.language as tl


@triton.jit
def last_ticket(counter_ptr, num_tickets):
    """Take a ticket from the int32 counter; True in the program that draws the last of
    `num_tickets`. Call after storing this program's partials."""
    tl.debug_barrier()  # every thread's partial stores come before the ticket
    # one thread's atomic; its release (GPU scope) makes the stores visible to whoever acquires it later
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    return ticket == num_tickets - 1


@triton.jit
def reset_ticket(counter_ptr):
    """Hand the counter back zeroed (only the last program calls this: all have counted)."""
    tl.store(counter_ptr, 0)


@triton.jit
def load_partials(ptr, rows, row_mask, num_splits, other, BLOCK_S: tl.constexpr):
    """([rows, BLOCK_S] per-chunk partials of `rows` stored [row, split] at `ptr`, their mask);
    masked entries are `other`. Read by the merging program: other programs stored them, so
    ".cg" (L2 only) skips this SM's L1, which is not coherent across SMs and may hold an earlier call's."""
    s = tl.arange(0, BLOCK_S)
    mask = row_mask[:, None] & (s[None, :] < num_splits)
    offs = rows[:, None] * num_splits + s[None, :]
    return tl.load(ptr + offs, mask=mask, other=other, cache_modifier=".cg"), mask
