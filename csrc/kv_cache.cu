// kv_compact: move each row's accepted tree nodes' K/V into place, all layers in one launch, in
// place (contract in kv_cache.h and reference/kv_cache.py).
//
// Hazard-free without a global barrier: row b's entries increase strictly from >= 0, so
// src_j = len + a_j >= dst_j = len + j and src_j > src_i for i < j; the only hazard is a row
// written after it was read (dst_k == src_j, k > j), within one column. Each thread owns whole
// columns and goes through the rows in increasing j (kRowsInFlight loads before their stores), so
// program order alone orders every conflicting access. Entries with src == dst (the root, a
// chain-shaped path) form a prefix of the valid entries and are not copied.
//
// Grid: x = B * column blocks, y = 2L caches (K layers, then V layers); a warp covers whole
// 16-byte segments, and blocks of cache 0, column block 0 also write the new lengths. Copies use
// ld/st.global.cg (L2 only): every byte is touched once, L1 would not help.

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "kv_cache.h"
#include "launch_utils.h"

namespace specdec {
namespace {

constexpr int kMaxThreads = 256;
static_assert(kMaxThreads == plans::kKvCompactMaxThreads, "launch_plan.h mirrors the block size");
constexpr int kRowsInFlight = 8;  // loads each thread has outstanding before its stores

struct RowArgs {
  const void* seq_lens;
  bool seq_lens_int32;
  int64_t seq_lens_stride;
  const int64_t* accepted;
  int64_t accepted_stride_b;
  int64_t accepted_stride_m;
  void* new_lens;
  int64_t M;
};

struct CacheRef {
  char* base;
  int64_t stride_b, stride_h, stride_s;  // bytes
};

__device__ __forceinline__ CacheRef cache_ref(const KvCacheSet& caches, int64_t t) {
  const int64_t es = caches.elem_size;
  if (caches.table != nullptr) {
    const int64_t* entry = caches.table + 4 * t;
    return {reinterpret_cast<char*>(static_cast<uintptr_t>(entry[0])), entry[1] * es, entry[2] * es,
            entry[3] * es};
  }
  const bool is_v = t >= caches.num_layers;
  const int64_t layer = is_v ? t - caches.num_layers : t;
  const int64_t* stride = is_v ? caches.v_stride : caches.k_stride;
  char* base = static_cast<char*>(is_v ? caches.v_base : caches.k_base);
  return {base + layer * (is_v ? caches.v_step : caches.k_step) * es, stride[0] * es, stride[1] * es,
          stride[2] * es};
}

template <typename Word>
__global__ void __launch_bounds__(kMaxThreads)
kv_compact_kernel(const KvCacheSet caches, const RowArgs rows, int64_t column_blocks) {
  __shared__ int64_t s_src[kMaxThreads];  // source row of each entry of the tile, -1: no move
  __shared__ int s_first, s_last;          // first / last moving entry of the tile

  const int64_t b = blockIdx.x / column_blocks;
  const int64_t column_block = blockIdx.x % column_blocks;
  const int64_t t = blockIdx.y;
  const int64_t words_per_head = caches.head_dim * caches.elem_size / static_cast<int64_t>(sizeof(Word));
  const int64_t col = column_block * blockDim.x + threadIdx.x;
  const bool has_column = t < 2 * caches.num_layers && col < caches.heads * words_per_head;

  char* column = nullptr;  // this thread's Word in row 0 of (cache t, batch row b)
  int64_t row_stride = 0;
  if (has_column) {
    const CacheRef cache = cache_ref(caches, t);
    column = cache.base + b * cache.stride_b + (col / words_per_head) * cache.stride_h +
             (col % words_per_head) * static_cast<int64_t>(sizeof(Word));
    row_stride = cache.stride_s;
  }
  const int64_t len = rows.seq_lens_int32
                          ? static_cast<int64_t>(static_cast<const int32_t*>(rows.seq_lens)[b * rows.seq_lens_stride])
                          : static_cast<const int64_t*>(rows.seq_lens)[b * rows.seq_lens_stride];
  const int64_t capacity = caches.seq_capacity;

  int64_t count = 0;  // valid entries of the row
  for (int64_t m0 = 0; m0 < rows.M; m0 += blockDim.x) {
    const int64_t j = m0 + threadIdx.x;
    const int64_t a = j < rows.M ? rows.accepted[b * rows.accepted_stride_b + j * rows.accepted_stride_m] : -1;
    const int64_t src = len + a;
    const int64_t dst = len + j;
    const bool moves = a >= 0 && a != j && src >= 0 && src < capacity && dst >= 0 && dst < capacity;
    s_src[threadIdx.x] = moves ? src : -1;
    if (threadIdx.x == 0) {
      s_first = INT_MAX;
      s_last = -1;
    }
    count += __syncthreads_count(a >= 0);  // also publishes s_src and the reset above
    if (moves) {
      atomicMin(&s_first, static_cast<int>(threadIdx.x));
      atomicMax(&s_last, static_cast<int>(threadIdx.x));
    }
    __syncthreads();
    const int first = s_first;
    const int last = s_last;
    if (has_column) {
      for (int i0 = first; i0 <= last; i0 += kRowsInFlight) {
        int64_t from[kRowsInFlight];
        Word words[kRowsInFlight];
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          from[u] = i0 + u <= last ? s_src[i0 + u] : -1;
          words[u] = from[u] >= 0 ? __ldcg(reinterpret_cast<const Word*>(column + from[u] * row_stride)) : Word{};
        }
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          if (from[u] >= 0) __stcg(reinterpret_cast<Word*>(column + (len + m0 + i0 + u) * row_stride), words[u]);
        }
      }
    }
    __syncthreads();  // the next tile rewrites s_src, s_first and s_last
  }

  if (t == 0 && column_block == 0 && threadIdx.x == 0) {
    if (rows.seq_lens_int32) {
      static_cast<int32_t*>(rows.new_lens)[b] = static_cast<int32_t>(len + count);
    } else {
      static_cast<int64_t*>(rows.new_lens)[b] = len + count;
    }
  }
}

void check_arg(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("specdec_kernels.kv_compact: " + what);
}

bool divides(int64_t vector_bytes, int64_t bytes) { return bytes % vector_bytes == 0; }

template <typename Word>
void launch_typed(const KvCacheSet& caches, const RowArgs& rows, const plans::Plan& plan, cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
  kv_compact_kernel<Word><<<grid, l.block, l.dynamic_smem, stream>>>(caches, rows, plan.at("column_blocks"));
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_kv_compact(const KvCacheSet& caches, const void* seq_lens, bool seq_lens_int32,
                       int64_t seq_lens_stride, const int64_t* accepted, int64_t accepted_stride_b,
                       int64_t accepted_stride_m, void* new_lens, int64_t B, int64_t M,
                       cudaStream_t stream) {
  check_arg(B >= 0 && M >= 0, "B and M must be >= 0");
  check_arg(caches.num_layers >= 0, "num_layers must be >= 0");
  const plans::Plan plan = plans::plan_kv_compact(B, caches.num_layers, caches.heads, caches.seq_capacity,
                                                  caches.head_dim, caches.elem_size, caches.vector_bytes,
                                                  current_device_limits());
  check_arg(plan.ok(), plan.refusal);
  const int64_t v = caches.vector_bytes;
  if (B == 0) return;
  check_arg(seq_lens && new_lens && (M == 0 || accepted), "null device pointer");
  RowArgs rows{seq_lens, seq_lens_int32, seq_lens_stride, accepted, accepted_stride_b, accepted_stride_m,
               new_lens, M};
  KvCacheSet set = caches;
  set.num_layers = plan.at("num_layers");  // 0: lengths only (empty caches)
  if (set.num_layers > 0 && set.table == nullptr) {
    check_arg(set.k_base && set.v_base, "null cache base pointer");
    const int64_t es = set.elem_size;
    bool aligned = reinterpret_cast<uintptr_t>(set.k_base) % v == 0 && reinterpret_cast<uintptr_t>(set.v_base) % v == 0 &&
                   divides(v, set.k_step * es) && divides(v, set.v_step * es);
    for (int i = 0; i < 3; ++i) aligned = aligned && divides(v, set.k_stride[i] * es) && divides(v, set.v_stride[i] * es);
    check_arg(aligned, "vector_bytes must divide every base address, step and stride in bytes");
  }
  switch (v) {
    case 16:
      launch_typed<uint4>(set, rows, plan, stream);
      break;
    case 8:
      launch_typed<uint2>(set, rows, plan, stream);
      break;
    case 4:
      launch_typed<uint32_t>(set, rows, plan, stream);
      break;
    default:
      launch_typed<uint16_t>(set, rows, plan, stream);
      break;
  }
}

}  // namespace specdec
