// Greedy verification of speculative-decoding drafts.
//
// For each batch row b: accept draft i while it equals argmax(logits[b, i]),
// then emit the argmax at the first mismatch (or the bonus token). See ops.h.
//
// One launch does everything. B can be 1 with V ~150k, so one block per row
// would use a handful of SMs; instead grid = (B, G+1, splits) and each block
// reduces one V-chunk of one row to a packed (value, index) key that it
// atomicMax-es into the workspace. The last block to finish a batch row (found
// with a per-row atomic counter) reads that row's keys, walks the drafts and
// writes the outputs: no second kernel and no host sync.

#include "chain_common.cuh"
#include "common.cuh"
#include "dtype_dispatch.cuh"
#include "launch_utils.h"
#include "ops.h"

namespace specdec {
namespace {

constexpr int kThreads = 256;

using chain::chunk_argmax_key;
using chain::drafts_in_row;
using chain::key_to_token;
static_assert(kThreads == plans::kVerifyThreads, "launch_plan.h mirrors the block size");

template <typename T>
__global__ void __launch_bounds__(kThreads)
greedy_verify_kernel(const T* __restrict__ logits, int64_t stride_b, int64_t stride_g,
                     const int64_t* __restrict__ draft_tokens,
                     const int64_t* __restrict__ num_draft_tokens,
                     int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                     unsigned long long* keys, unsigned int* counters, int G, int V,
                     int chunk) {
  __shared__ unsigned long long warp_scratch[kThreads / 32];
  __shared__ bool is_last_block;
  __shared__ int s_accepted;
  __shared__ int64_t s_next_token;

  const int b = blockIdx.x;
  const int pos = blockIdx.y;
  const int split = blockIdx.z;
  const int n = drafts_in_row(num_draft_tokens, b, G);
  // Positions past n_b are never looked at; the whole block leaves together
  // (before any barrier) and is not counted below.
  if (pos > n) return;

  // ---- 1. argmax of this block's chunk ------------------------------------
  const int64_t start = static_cast<int64_t>(split) * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);
  const T* row = logits + static_cast<int64_t>(b) * stride_b + static_cast<int64_t>(pos) * stride_g;

  const unsigned long long key = chunk_argmax_key<T, kThreads>(row, start, end, warp_scratch);

  // ---- 2. merge into the row's key; elect the last block of batch row b ----
  if (threadIdx.x == 0) {
    atomicMax(&keys[static_cast<int64_t>(b) * (G + 1) + pos], key);
    __threadfence();  // our key must be visible before we count ourselves done
    const unsigned int blocks_in_row = static_cast<unsigned int>(n + 1) * gridDim.z;
    is_last_block = atomicAdd(&counters[b], 1u) == blocks_in_row - 1;
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();  // pairs with the writers' fences before reading their keys

  // ---- 3. last block: walk the drafts (n_b <= G is small: one thread) -------
  if (threadIdx.x == 0) {
    unsigned long long* row_keys = keys + static_cast<int64_t>(b) * (G + 1);
    const int64_t* row_drafts = draft_tokens + static_cast<int64_t>(b) * G;
    int accepted = 0;
    int64_t next_token = 0;
    bool stopped = false;
    for (int j = 0; j <= n; ++j) {
      // atomicExch reads the final key from L2 and re-zeroes the slot, so the
      // workspace is clean for the next call / graph replay.
      const int64_t am = key_to_token(atomicExch(&row_keys[j], 0ull), V);
      if (stopped) continue;
      // am is in [0, V), so out-of-range drafts (-1, >= V) never match.
      if (j < n && row_drafts[j] == am) {
        ++accepted;
      } else {
        next_token = am;  // correction at the mismatch, or the bonus at j == n
        stopped = true;
      }
    }
    counters[b] = 0;  // every block of row b has already incremented it
    num_accepted[b] = accepted;
    s_accepted = accepted;
    s_next_token = next_token;
  }
  __syncthreads();

  const int a = s_accepted;
  int64_t* row_out = out_tokens + static_cast<int64_t>(b) * (G + 1);
  for (int j = threadIdx.x; j <= G; j += kThreads) {
    row_out[j] = j < a ? draft_tokens[static_cast<int64_t>(b) * G + j]
                       : (j == a ? s_next_token : int64_t{-1});
  }
}

template <typename T>
void launch_typed(const void* logits, int64_t stride_b, int64_t stride_g,
                  const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                  int64_t* out_tokens, int64_t* num_accepted, unsigned long long* keys,
                  unsigned int* counters, int64_t G, int64_t V, const plans::Plan& plan,
                  cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]),
                  static_cast<unsigned>(l.grid[2]));
  greedy_verify_kernel<T><<<grid, l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(logits), stride_b, stride_g, draft_tokens, num_draft_tokens,
      out_tokens, num_accepted, keys, counters, static_cast<int>(G), static_cast<int>(V),
      static_cast<int>(plan.at("chunk")));
}

void check_arg(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("specdec_kernels.greedy_verify: ") + what);
}

}  // namespace

uint64_t greedy_verify_workspace_bytes(int64_t B, int64_t G) {
  check_arg(B >= 0 && G >= 0, "B and G must be >= 0");
  return static_cast<uint64_t>(B) * static_cast<uint64_t>(G + 1) * sizeof(unsigned long long) +
         static_cast<uint64_t>(B) * sizeof(unsigned int);
}

void launch_greedy_verify(const void* logits, int64_t stride_b, int64_t stride_g,
                          const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                          int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                          int64_t B, int64_t G, int64_t V, int dtype, cudaStream_t stream) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16,
            "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  const plans::Plan plan = plans::plan_greedy_verify(B, G, V, current_device_limits());
  check_arg(plan.ok(), plan.refusal.c_str());
  if (B == 0) return;  // nothing to do; launching an empty grid is an error
  check_arg(logits && out_tokens && num_accepted && workspace, "null device pointer");
  check_arg(G == 0 || draft_tokens, "draft_tokens is null");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 8 == 0, "workspace must be 8-byte aligned");

  auto* keys = static_cast<unsigned long long*>(workspace);
  auto* counters = reinterpret_cast<unsigned int*>(keys + B * (G + 1));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_typed<T>(logits, stride_b, stride_g, draft_tokens, num_draft_tokens, out_tokens, num_accepted, keys,
                    counters, G, V, plan, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
