// Tree / chain verification attention (reference/attention.py is the specification).
//
// Decode-shaped: N draft nodes per row against a long prefix. One CTA owns one (row b, KV head,
// prefix split, M-tile): the N nodes x (Hq / Hkv) query heads of that KV head are packed as the MMA
// M dimension (packed row r = node * group + head-in-group), so every K/V tile is read once for all.
//  * Split s owns an aligned key range computed on the device from the row's own length
//    (attention_math.cuh row_split): no host plan.
//  * Prefix tiles run unmasked; only tiles reaching the draft nodes test ancestor bits, which each
//    thread derives by walking `parents` up (ancestor_window): no mask tensor, any N.
//  * Tensor-core path (fp16/bf16, D 64/128): mma.sync m16n8k16, fp32 accumulators, 64-key K/V tiles
//    in XOR-swizzled shared memory via 3-stage cp.async. SIMT path: float32 and head dims <= 256.
//  * Splits write partial (acc, max, sum); the last CTA of a (b, KV head, M-tile) to take a ticket
//    merges them by log-sum-exp and re-zeroes the ticket. A row with one active split writes directly.

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "launch_utils.h"
#include "attention.h"
#include "attention_math.cuh"
#include "mma.cuh"

namespace specdec {
namespace {

using namespace tree_attn;

constexpr float kLog2e = 1.4426950408889634074f;

// Everything a CTA needs, passed by value.
struct Params {
  const void* q;
  int64_t q_sb, q_sn, q_sh;
  KvTensor k, v;
  IndexTensor seq_lens, parents, block_table;
  int page_size;
  int64_t num_pages;
  void* out;
  int64_t o_sb, o_sn, o_sh;
  float* lse;
  float* partials;
  unsigned int* counters;
  int N, Hq, Hkv, group, D;
  int M;  // packed rows per KV head: N * group
  int64_t capacity;
  int splits, m_tiles;
  float scale_log2;
  int kv_aligned16;  // K/V rows may be copied as 16-byte chunks (cp.async)
};

// ===========================================================================
// Addressing shared by both kernels
// ===========================================================================
__device__ __forceinline__ int64_t load_index(const IndexTensor& t, int64_t offset) {
  return t.is_int64 ? static_cast<const int64_t*>(t.data)[offset]
                    : static_cast<int64_t>(static_cast<const int32_t*>(t.data)[offset]);
}

// This CTA's coordinates in the flattened grid (M-tile fastest, so the CTAs
// that read the same K/V slice run side by side and share it in L2).
struct Cta {
  int m_tile, split, kvh, b;
  int64_t tile_id;  // (b, kvh, m_tile): ticket and partial-slot index
};

__device__ __forceinline__ Cta decode_cta(const Params& p) {
  int64_t x = blockIdx.x;
  Cta c;
  c.m_tile = static_cast<int>(x % p.m_tiles);
  x /= p.m_tiles;
  c.split = static_cast<int>(x % p.splits);
  x /= p.splits;
  c.kvh = static_cast<int>(x % p.Hkv);
  c.b = static_cast<int>(x / p.Hkv);
  c.tile_id = (static_cast<int64_t>(c.b) * p.Hkv + c.kvh) * p.m_tiles + c.m_tile;
  return c;
}

// The keys of this CTA: [lo, hi) of the row's prefix + N keys.
struct Work {
  int prefix;
  int lo, hi;
  int active;  // splits of this row that own keys (the same for every CTA of the row)
};

__device__ __forceinline__ Work split_work(const Params& p, const Cta& c) {
  const int64_t prefix = clamp_prefix(load_index(p.seq_lens, c.b * p.seq_lens.stride0), p.capacity, p.N);
  const int64_t keys = prefix + p.N;
  const RowSplit rs = row_split(keys, p.splits);
  const int64_t lo = c.split * rs.chunk;
  const int64_t hi = lo + rs.chunk < keys ? lo + rs.chunk : keys;
  return {static_cast<int>(prefix), static_cast<int>(lo), static_cast<int>(hi), rs.active};
}

// Where key position `pos` of row b sits: (outer index, slot), and whether its
// page id is usable (contiguous caches always are).
struct KvSlot {
  int64_t outer;
  int64_t slot;
  bool ok;
};

__device__ __forceinline__ KvSlot kv_slot(const Params& p, int b, int pos) {
  if (p.block_table.data == nullptr) return {b, pos, true};
  const unsigned ps = static_cast<unsigned>(p.page_size);
  const unsigned upos = static_cast<unsigned>(pos);
  const int64_t page = load_index(p.block_table, b * p.block_table.stride0 +
                                                     static_cast<int64_t>(upos / ps) * p.block_table.stride1);
  return {page, static_cast<int64_t>(upos % ps), page >= 0 && page < p.num_pages};
}

__device__ __forceinline__ int64_t kv_offset(const KvTensor& t, const KvSlot& s, int kvh) {
  return s.outer * t.stride_outer + s.slot * t.stride_slot + kvh * t.stride_head;
}

// Packed row r of KV head kvh -> (node, query head).
__device__ __forceinline__ int node_of(const Params& p, int r) { return r / p.group; }
__device__ __forceinline__ int head_of(const Params& p, int kvh, int r) { return kvh * p.group + r % p.group; }

// Visible draft keys of one key tile for the node of a packed row (see
// ancestor_window); 0 for padding rows past M.
__device__ __forceinline__ uint64_t tree_window(const Params& p, int b, int row, int w0, int width) {
  if (row >= p.M) return 0;
  const int node = node_of(p, row);
  if (p.parents.data == nullptr) return chain_window(node, w0, width);
  const IndexTensor par = p.parents;
  const int64_t base = b * par.stride0;
  return ancestor_window(node, w0, width, [&](int i) { return load_index(par, base + i * par.stride1); });
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__device__ __forceinline__ void store_out(const Params& p, int b, int kvh, int row, int d, float value) {
  const int64_t off = b * p.o_sb + static_cast<int64_t>(node_of(p, row)) * p.o_sn +
                      static_cast<int64_t>(head_of(p, kvh, row)) * p.o_sh + d;
  static_cast<T*>(p.out)[off] = from_float<T>(value);
}

__device__ __forceinline__ void store_lse(const Params& p, int b, int kvh, int row, float m, float l) {
  const int64_t off = (static_cast<int64_t>(b) * p.N + node_of(p, row)) * p.Hq + head_of(p, kvh, row);
  p.lse[off] = natural_lse(m, l);
}

// ===========================================================================
// Split partials: per (tile_id, split) a block of block_m x D accumulators,
// then block_m running maxima, then block_m sums.
// ===========================================================================
__device__ __forceinline__ float* partial_block(const Params& p, int64_t tile_id, int split, int block_m) {
  const int64_t per_split = static_cast<int64_t>(block_m) * (p.D + 2);
  return p.partials + (tile_id * p.splits + split) * per_split;
}

// Called by every thread after it stored its partials. True (block-uniform)
// in the last CTA of the tile to arrive, which then owns the merge; that CTA
// also re-zeroes the ticket (every other CTA of the tile has taken its turn).
__device__ __forceinline__ bool last_to_arrive(const Params& p, int64_t tile_id, int active) {
  __shared__ bool s_last;
  __threadfence();  // this thread's partials are visible device-wide before the ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned ticket = atomicAdd(&p.counters[tile_id], 1u);
    s_last = ticket == static_cast<unsigned>(active) - 1u;
    if (s_last) p.counters[tile_id] = 0u;
  }
  __syncthreads();
  const bool last = s_last;
  if (last) __threadfence();  // pairs with the other CTAs' fences before reading their partials
  return last;
}

// Merge the `active` partial states of this tile's rows and write out / lse.
// One warp per row; lane s (and s + 32) owns split s's weight (kMaxSplits <= 64).
// Partials written by other CTAs are read with ld.global.cg (L2, never a stale L1 line).
template <typename T>
__device__ void merge_splits(const Params& p, const Cta& c, int active, int block_m) {
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  const int64_t per_split = static_cast<int64_t>(block_m) * (p.D + 2);
  const float* base = partial_block(p, c.tile_id, 0, block_m);
  for (int lr = threadIdx.x >> 5; lr < block_m; lr += warps) {
    const int row = c.m_tile * block_m + lr;
    if (row >= p.M) break;  // rows only grow with lr
    auto m_of = [&](int s) { return __ldcg(base + s * per_split + static_cast<int64_t>(block_m) * p.D + lr); };
    auto l_of = [&](int s) { return __ldcg(base + s * per_split + static_cast<int64_t>(block_m) * (p.D + 1) + lr); };
    const float m_a = lane < active ? m_of(lane) : -INFINITY;
    const float m_b = lane + 32 < active ? m_of(lane + 32) : -INFINITY;
    float m_max = fmaxf(m_a, m_b);
    m_max = reduce::warp_all(m_max, reduce::MaxF32{});
    // A real row always sees its own node, so some split has a finite max.
    const float w_a = lane < active ? split_weight(m_a, m_max) : 0.0f;
    const float w_b = lane + 32 < active ? split_weight(m_b, m_max) : 0.0f;
    float l = (lane < active ? l_of(lane) * w_a : 0.0f) + (lane + 32 < active ? l_of(lane + 32) * w_b : 0.0f);
    l = reduce::warp_all(l, reduce::Sum{});
    const float inv_l = 1.0f / l;
    for (int d0 = 0; d0 < p.D; d0 += 32) {
      const int d = d0 + lane;
      float acc = 0.0f;
      for (int s = 0; s < active; ++s) {
        const float w = __shfl_sync(0xFFFFFFFFu, s < 32 ? w_a : w_b, s & 31);
        if (d < p.D) acc += __ldcg(base + s * per_split + static_cast<int64_t>(lr) * p.D + d) * w;
      }
      if (d < p.D) store_out<T>(p, c.b, c.kvh, row, d, acc * inv_l);
    }
    if (lane == 0) store_lse(p, c.b, c.kvh, row, m_max, l);
  }
}

// ===========================================================================
// Tensor-core kernel (fp16 / bf16, D in {64, 128})
// ===========================================================================
constexpr int kBlockN = 64;  // keys per K/V tile (divides kKeyAlign)
constexpr int kStages = 3;   // K/V tiles in flight per CTA
static_assert(kKeyAlign % kBlockN == 0, "a tile must never straddle two splits");
static_assert(kBlockN == plans::kTreeAttentionBlockN && kStages == plans::kTreeAttentionStages,
              "launch_plan.h mirrors the MMA tiles");

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: no read at all, the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// The "memory" clobber keeps the compiler from moving shared-memory accesses
// across the wait (the barrier that follows orders the other threads).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two fp32 -> one register of two 16-bit values, the lower column in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Element offset of the 16-byte chunk `chunk` of key row `row` in a swizzled
// [kBlockN][kD] tile: the chunk index is XOR-ed with row % 8, so the 8 rows an
// ldmatrix reads (or cp.async writes) at one logical chunk hit 8 different
// bank groups.
template <int kD>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

// Copy K/V keys [start, start + kBlockN) of (b, kvh) into one stage; keys at
// or past `hi` and keys on an unusable page are zero-filled (never read).
template <typename T, int kD, int kThreads>
__device__ __forceinline__ void load_kv_tile(const Params& p, const Cta& c, int start, int hi, T* sk, T* sv) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per key row
  constexpr int kRowStep = kThreads / kChunks;
  constexpr int kPerThread = kBlockN / kRowStep;
  static_assert(kThreads % kChunks == 0 && kBlockN % kRowStep == 0, "tile copy layout");
  const int chunk = threadIdx.x % kChunks;
  const int row0 = threadIdx.x / kChunks;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k.data);
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v.data);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int row = row0 + i * kRowStep;
    const int pos = start + row;
    bool valid = pos < hi;
    KvSlot s{0, 0, false};
    if (valid) {
      s = kv_slot(p, c.b, pos);
      valid = s.ok;
    }
    const uint16_t* ksrc = valid ? kbase + kv_offset(p.k, s, c.kvh) + chunk * 8 : kbase;
    const uint16_t* vsrc = valid ? vbase + kv_offset(p.v, s, c.kvh) + chunk * 8 : vbase;
    T* kdst = sk + swizzled<kD>(row, chunk);
    T* vdst = sv + swizzled<kD>(row, chunk);
    if (p.kv_aligned16) {
      cp_async_16(kdst, ksrc, valid);
      cp_async_16(vdst, vsrc, valid);
    } else {  // rows not 16-byte aligned: plain 2-byte loads, one 16-byte shared store
      uint32_t kw[4], vw[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        kw[e] = valid ? (static_cast<uint32_t>(ksrc[2 * e]) | (static_cast<uint32_t>(ksrc[2 * e + 1]) << 16)) : 0u;
        vw[e] = valid ? (static_cast<uint32_t>(vsrc[2 * e]) | (static_cast<uint32_t>(vsrc[2 * e + 1]) << 16)) : 0u;
      }
      *reinterpret_cast<uint4*>(kdst) = make_uint4(kw[0], kw[1], kw[2], kw[3]);
      *reinterpret_cast<uint4*>(vdst) = make_uint4(vw[0], vw[1], vw[2], vw[3]);
    }
  }
}

template <int kD, int kWarps>
constexpr int mma_smem_bytes() {
  return 2 * kStages * kBlockN * kD * 2;  // K and V stages of 16-bit elements
}

// CTAs per SM the register allocation is tuned for (__launch_bounds__): D = 128
// needs ~230 registers a thread (accumulators 64, Q fragments 32, scores 32);
// the D = 64 kernels are capped so that two (8 warps) or three (4 warps) CTAs fit.
template <int kD, int kWarps>
constexpr int mma_min_ctas_per_sm() {
  return kD == 64 ? (kWarps == 8 ? 2 : 3) : 1;
}

template <typename T, int kD, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, (mma_min_ctas_per_sm<kD, kWarps>()))
    tree_attention_mma_kernel(const Params p) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kBlockM = kWarps * 16;
  constexpr int kTile = kBlockN * kD;
  constexpr int kKSteps = kD / 16;     // k-steps of Q.K^T
  constexpr int kNTiles = kBlockN / 8;  // n-tiles of S (8 keys each)
  constexpr int kDTiles = kD / 8;      // n-tiles of P.V (8 head dims each)
  extern __shared__ __align__(128) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);  // [kStages][kBlockN][kD], swizzled
  T* sv = sk + kStages * kTile;

  const Cta c = decode_cta(p);
  const Work w = split_work(p, c);
  if (c.split >= w.active) return;  // the whole CTA leaves: this split of the row owns no keys

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // accumulator row within the warp's 16 (and g + 8)
  const int t4 = lane & 3;  // accumulator column pair
  const int warp_row = c.m_tile * kBlockM + warp * 16;
  const bool warp_active = warp_row < p.M;  // warp-uniform: padding warps only help copy
  const int row0 = warp_row + g;
  const int row1 = row0 + 8;

  // ---- Q fragments (A operand), straight from global memory, zero past M ----
  uint32_t qf[kKSteps][4];
  {
    const uint16_t* q16 = static_cast<const uint16_t*>(p.q);
    auto q_row = [&](int r) -> const uint16_t* {
      return q16 + c.b * p.q_sb + static_cast<int64_t>(node_of(p, r)) * p.q_sn +
             static_cast<int64_t>(head_of(p, c.kvh, r)) * p.q_sh;
    };
    const uint16_t* qa = row0 < p.M ? q_row(row0) : nullptr;
    const uint16_t* qb = row1 < p.M ? q_row(row1) : nullptr;
    auto pair = [](const uint16_t* r, int d) -> uint32_t {
      return r == nullptr ? 0u : (static_cast<uint32_t>(r[d]) | (static_cast<uint32_t>(r[d + 1]) << 16));
    };
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int d = ks * 16 + 2 * t4;
      qf[ks][0] = pair(qa, d);
      qf[ks][1] = pair(qb, d);
      qf[ks][2] = pair(qa, d + 8);
      qf[ks][3] = pair(qb, d + 8);
    }
  }

  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // log2-domain running max of rows row0, row1
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the running sums

  const int num_tiles = (w.hi - w.lo + kBlockN - 1) / kBlockN;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_kv_tile<T, kD, kThreads>(p, c, w.lo + s * kBlockN, w.hi, sk + s * kTile, sv + s * kTile);
    cp_async_commit();  // possibly empty: keeps the group count uniform
  }

  for (int it = 0; it < num_tiles; ++it) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile `it` have landed
    __syncthreads();                // everyone's have; and tile it-1's stage is free again
    {
      const int next = it + kStages - 1;
      if (next < num_tiles) {
        const int st = next % kStages;
        load_kv_tile<T, kD, kThreads>(p, c, w.lo + next * kBlockN, w.hi, sk + st * kTile, sv + st * kTile);
      }
      cp_async_commit();
    }
    if (!warp_active) continue;

    const int stage = it % kStages;
    const T* kt = sk + stage * kTile;
    const T* vt = sv + stage * kTile;
    const int tile_start = w.lo + it * kBlockN;

    // ---- S = Q K^T (16 x kBlockN per warp) ----
    float s[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kp = 0; kp < kKSteps / 2; ++kp) {
        uint32_t b[4];  // b0, b1 of k-step 2kp, then of 2kp + 1
        ldmatrix_x4(b, kt + swizzled<kD>(nt * 8 + (lane & 7), kp * 4 + (lane >> 3)));
        mma_16816<T>(s[nt], qf[2 * kp], b[0], b[1]);
        mma_16816<T>(s[nt], qf[2 * kp + 1], b[2], b[3]);
      }
    }

    // ---- scale; mask only tiles that reach the draft nodes ----
    const bool masked = tile_start + kBlockN > w.prefix;
    uint64_t win0 = 0, win1 = 0;
    const int prefix_keys = w.prefix - tile_start;  // keys j < prefix_keys are prefix keys
    if (masked) {
      const int w0 = tile_start - w.prefix;
      win0 = tree_window(p, c.b, row0, w0, kBlockN);
      win1 = tree_window(p, c.b, row1, w0, kBlockN);
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        if (masked) {
          const int j = nt * 8 + 2 * t4 + (e & 1);
          const uint64_t win = e < 2 ? win0 : win1;
          if (!(j < prefix_keys || ((win >> j) & 1ull))) x = -INFINITY;
        }
        s[nt][e] = x;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      }
    }

    // ---- online softmax (the 4 lanes of a quad share a row) ----
    float offset[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xFFFFFFFFu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xFFFFFFFFu, tile_max[h], 2));
      const float m_new = fmaxf(m_run[h], tile_max[h]);
      offset[h] = softmax_offset(m_new);
      const float alpha = exp2f(m_run[h] - offset[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[dt][2 * h] *= alpha;
        o[dt][2 * h + 1] *= alpha;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(s[nt][e] - offset[e >> 1]);
        s[nt][e] = pe;
        l_run[e >> 1] += pe;
      }
    }

    // ---- O += P V: the S accumulators of n-tiles 2kk, 2kk+1 are the A fragment ----
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b[4];  // b0, b1 of d-tile 2dp, then of 2dp + 1
        ldmatrix_x4_trans(b, vt + swizzled<kD>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), dp * 2 + (lane >> 4)));
        mma_16816<T>(o[2 * dp], a, b[0], b[1]);
        mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending here; leave nothing in flight

  // ---- epilogue ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xFFFFFFFFu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xFFFFFFFFu, l_run[h], 2);
  }
  const int rows[2] = {row0, row1};
  if (w.active == 1) {  // the only split of this row: final values straight out
    if (warp_active) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (rows[h] >= p.M) continue;
        const float inv_l = 1.0f / l_run[h];
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          store_out<T>(p, c.b, c.kvh, rows[h], dt * 8 + 2 * t4, o[dt][2 * h] * inv_l);
          store_out<T>(p, c.b, c.kvh, rows[h], dt * 8 + 2 * t4 + 1, o[dt][2 * h + 1] * inv_l);
        }
        if (t4 == 0) store_lse(p, c.b, c.kvh, rows[h], m_run[h], l_run[h]);
      }
    }
    return;
  }

  float* part = partial_block(p, c.tile_id, c.split, kBlockM);
  if (warp_active) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = warp * 16 + g + 8 * h;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        *reinterpret_cast<float2*>(part + lr * kD + dt * 8 + 2 * t4) = make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
      }
      if (t4 == 0) {
        part[kBlockM * kD + lr] = m_run[h];
        part[kBlockM * (kD + 1) + lr] = l_run[h];
      }
    }
  }
  if (last_to_arrive(p, c.tile_id, w.active)) merge_splits<T>(p, c, w.active, kBlockM);
}

// ===========================================================================
// SIMT kernel (float32, or a head dim the tensor-core kernel does not cover)
// ===========================================================================
constexpr int kSimtRows = 16;  // packed rows per CTA: 4 warps x 4 rows
constexpr int kSimtKeys = 16;  // keys per tile: lanes l and l + 16 split one key's dot product
constexpr int kSimtThreads = 128;
constexpr int kSimtMaxD = 256;
constexpr int kSimtDPerLane = kSimtMaxD / 32;
static_assert(kKeyAlign % kSimtKeys == 0, "a tile must never straddle two splits");
static_assert(kSimtRows == plans::kTreeAttentionSimtRows && kSimtKeys == plans::kTreeAttentionSimtKeys &&
                  kSimtThreads == plans::kTreeAttentionSimtThreads && kSimtMaxD == plans::kTreeAttentionSimtMaxD,
              "launch_plan.h mirrors the SIMT tiles");

// Shared floats: Q [16][D], K [16][D | 1] (odd row stride: lanes reading one
// column of 16 keys hit 16 banks), V [16][D].
__host__ __device__ constexpr int simt_k_stride(int D) { return D | 1; }
int simt_smem_bytes(int D) { return (kSimtRows * D + kSimtKeys * simt_k_stride(D) + kSimtKeys * D) * 4; }

template <typename T>
__global__ void __launch_bounds__(kSimtThreads) tree_attention_simt_kernel(const Params p) {
  extern __shared__ float fsmem[];
  const int D = p.D;
  const int ks = simt_k_stride(D);
  float* sq = fsmem;
  float* sk = sq + kSimtRows * D;
  float* sv = sk + kSimtKeys * ks;

  const Cta c = decode_cta(p);
  const Work w = split_work(p, c);
  if (c.split >= w.active) return;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row_base = c.m_tile * kSimtRows;
  const T* qt = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < kSimtRows * D; i += kSimtThreads) {
    const int r = row_base + i / D;
    const int d = i % D;
    sq[i] = r < p.M ? to_float(qt[c.b * p.q_sb + static_cast<int64_t>(node_of(p, r)) * p.q_sn +
                                  static_cast<int64_t>(head_of(p, c.kvh, r)) * p.q_sh + d])
                    : 0.0f;
  }

  float acc[4][kSimtDPerLane];
  float m_run[4], l_run[4];
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    m_run[rr] = -INFINITY;
    l_run[rr] = 0.0f;
#pragma unroll
    for (int k = 0; k < kSimtDPerLane; ++k) acc[rr][k] = 0.0f;
  }
  const int key = lane & 15;
  const int half = lane >> 4;
  const T* kbase = static_cast<const T*>(p.k.data);
  const T* vbase = static_cast<const T*>(p.v.data);

  for (int tile_start = w.lo; tile_start < w.hi; tile_start += kSimtKeys) {
    __syncthreads();  // the previous tile is consumed (and Q is stored, the first time)
    for (int i = threadIdx.x; i < kSimtKeys * D; i += kSimtThreads) {
      const int j = i / D;
      const int d = i % D;
      const int pos = tile_start + j;
      float kx = 0.0f, vx = 0.0f;
      if (pos < w.hi) {
        const KvSlot s = kv_slot(p, c.b, pos);
        if (s.ok) {
          kx = to_float(kbase[kv_offset(p.k, s, c.kvh) + d]);
          vx = to_float(vbase[kv_offset(p.v, s, c.kvh) + d]);
        }
      }
      sk[j * ks + d] = kx;
      sv[j * D + d] = vx;
    }
    __syncthreads();

    const bool masked = tile_start + kSimtKeys > w.prefix;
    const int prefix_keys = w.prefix - tile_start;
    const bool key_in_range = tile_start + key < w.hi;
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int lr = warp * 4 + rr;
      float dot = 0.0f;
      for (int d = half; d < D; d += 2) dot += sq[lr * D + d] * sk[key * ks + d];
      dot += __shfl_xor_sync(0xFFFFFFFFu, dot, 16);
      float x = key_in_range ? dot * p.scale_log2 : -INFINITY;
      if (masked && !(key < prefix_keys)) {
        const uint64_t win = tree_window(p, c.b, row_base + lr, tile_start - w.prefix, kSimtKeys);
        if (!((win >> key) & 1ull)) x = -INFINITY;
      }
      float tile_max = x;
      tile_max = reduce::warp_all<16>(tile_max, reduce::MaxF32{});  // within each half-warp
      const float m_new = fmaxf(m_run[rr], tile_max);
      const float offset = softmax_offset(m_new);
      const float alpha = exp2f(m_run[rr] - offset);
      const float pj = exp2f(x - offset);
      float psum = pj;
      psum = reduce::warp_all<16>(psum, reduce::Sum{});
      m_run[rr] = m_new;
      l_run[rr] = l_run[rr] * alpha + psum;
#pragma unroll
      for (int k = 0; k < kSimtDPerLane; ++k) acc[rr][k] *= alpha;
#pragma unroll
      for (int j = 0; j < kSimtKeys; ++j) {
        const float pv = __shfl_sync(0xFFFFFFFFu, pj, j);
#pragma unroll
        for (int k = 0; k < kSimtDPerLane; ++k) {
          const int d = lane + 32 * k;
          if (d < D) acc[rr][k] += pv * sv[j * D + d];
        }
      }
    }
  }

  // ---- epilogue (m_run / l_run are identical in every lane) ----
  if (w.active == 1) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int row = row_base + warp * 4 + rr;
      if (row >= p.M) continue;
      const float inv_l = 1.0f / l_run[rr];
#pragma unroll
      for (int k = 0; k < kSimtDPerLane; ++k) {
        const int d = lane + 32 * k;
        if (d < D) store_out<T>(p, c.b, c.kvh, row, d, acc[rr][k] * inv_l);
      }
      if (lane == 0) store_lse(p, c.b, c.kvh, row, m_run[rr], l_run[rr]);
    }
    return;
  }
  float* part = partial_block(p, c.tile_id, c.split, kSimtRows);
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    const int lr = warp * 4 + rr;
#pragma unroll
    for (int k = 0; k < kSimtDPerLane; ++k) {
      const int d = lane + 32 * k;
      if (d < D) part[lr * D + d] = acc[rr][k];
    }
    if (lane == 0) {
      part[kSimtRows * D + lr] = m_run[rr];
      part[kSimtRows * (D + 1) + lr] = l_run[rr];
    }
  }
  if (last_to_arrive(p, c.tile_id, w.active)) merge_splits<T>(p, c, w.active, kSimtRows);
}

// ===========================================================================
// Kernel selection, occupancy and launch
// ===========================================================================
void check_arg(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("specdec_kernels.tree_attention: ") + what);
}

bool has_mma_kernel(int dtype, int64_t D) { return dtype != kFloat32 && (D == 64 || D == 128); }

// One compiled kernel and its launch shape.
struct KernelChoice {
  const void* fn;
  int threads;
  int smem;        // dynamic shared memory of this launch
  int smem_limit;  // the most any launch of this kernel asks for (its attribute)
  int index;       // slot in the per-device cache of prepare_kernel
};

template <typename T, int kD, int kWarps>
KernelChoice mma_choice(int index) {
  constexpr int kSmem = mma_smem_bytes<kD, kWarps>();
  return {reinterpret_cast<const void*>(&tree_attention_mma_kernel<T, kD, kWarps>), kWarps * 32, kSmem, kSmem,
          index};
}

template <typename T>
KernelChoice simt_choice(int index, int64_t D) {
  return {reinterpret_cast<const void*>(&tree_attention_simt_kernel<T>), kSimtThreads,
          simt_smem_bytes(static_cast<int>(D)), simt_smem_bytes(kSimtMaxD), index};
}

constexpr int kKernelSlots = 11;

KernelChoice choose_kernel(int dtype, int64_t D, int block_m) {
  if (has_mma_kernel(dtype, D)) {
    const bool wide = block_m == 128;
    if (dtype == kBFloat16) {
      if (D == 64) return wide ? mma_choice<__nv_bfloat16, 64, 8>(0) : mma_choice<__nv_bfloat16, 64, 4>(1);
      return wide ? mma_choice<__nv_bfloat16, 128, 8>(2) : mma_choice<__nv_bfloat16, 128, 4>(3);
    }
    if (D == 64) return wide ? mma_choice<__half, 64, 8>(4) : mma_choice<__half, 64, 4>(5);
    return wide ? mma_choice<__half, 128, 8>(6) : mma_choice<__half, 128, 4>(7);
  }
  if (dtype == kFloat32) return simt_choice<float>(8, D);
  if (dtype == kFloat16) return simt_choice<__half>(9, D);
  return simt_choice<__nv_bfloat16>(10, D);
}

// Opt the kernel in to its largest dynamic shared memory (an upper limit,
// harmless for smaller launches) when its static + dynamic shared memory passes
// 48 KiB (the D = 64 MMA kernels: exactly 48 KiB dynamic + 128 B static), and
// return how many CTAs of this launch fit
// on one SM. Cached per device and kernel for the last shared-memory size
// asked, so after one warm-up call a captured call makes no runtime queries
// beyond cudaGetDevice.
int prepare_kernel(const KernelChoice& k) {
  constexpr int kMaxDevices = 64;
  static std::atomic<uint64_t> cached[kMaxDevices][kKernelSlots];  // (smem << 32) | CTAs per SM; 0: not asked
  int dev = 0;
  SPECDEC_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {
    const uint64_t hit = cached[dev][k.index].load(std::memory_order_relaxed);
    if ((hit >> 32) == static_cast<uint64_t>(k.smem) && (hit & 0xFFFFFFFFu) != 0) {
      return static_cast<int>(hit & 0xFFFFFFFFu);
    }
  }
  if (plans::needs_opt_in(plans::kTreeAttentionStaticSmem, k.smem_limit, current_device_limits())) {
    SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_limit));
  }
  int per_sm = 0;
  SPECDEC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, k.threads, k.smem));
  per_sm = std::max(per_sm, 1);
  if (cacheable) {
    cached[dev][k.index].store((static_cast<uint64_t>(k.smem) << 32) | static_cast<uint64_t>(per_sm),
                               std::memory_order_relaxed);
  }
  return per_sm;
}

TreeAttentionPlan legacy_plan(const plans::Plan& p) {
  check_arg(p.ok(), p.refusal.c_str());
  TreeAttentionPlan plan{};
  plan.path = static_cast<int>(p.at("path"));
  plan.block_m = static_cast<int>(p.at("block_m"));
  plan.m_tiles = static_cast<int>(p.at("m_tiles"));
  plan.splits = static_cast<int>(p.at("splits"));
  plan.counter_bytes = static_cast<uint64_t>(p.at("counter_bytes"));
  plan.partial_bytes = static_cast<uint64_t>(p.at("partial_bytes"));
  return plan;
}

}  // namespace

TreeAttentionPlan plan_tree_attention(int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                                      int64_t kv_capacity, int dtype, int sms, int ctas_per_sm) {
  plans::DeviceLimits lim = plans::arch_limits(90);
  lim.sms = std::max(sms, 1);
  return legacy_plan(plans::plan_tree_attention(B, N, Hq, Hkv, D, kv_capacity, dtype, lim, std::max(ctas_per_sm, 1)));
}

namespace {

// The plan on the current device, and the kernel it runs (already given its
// shared-memory attribute on this device).
struct DevicePlan {
  plans::Plan plan;
  KernelChoice kernel;
};

// A refused shape throws its reason (auto routes such shapes elsewhere first).
DevicePlan plan_on_device(int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kv_capacity,
                          int dtype) {
  const plans::DeviceLimits lim = current_device_limits();
  plans::Plan plan = plans::plan_tree_attention(B, N, Hq, Hkv, D, kv_capacity, dtype, lim);  // checks, refusals
  check_arg(plan.ok(), plan.refusal.c_str());
  const KernelChoice kernel = choose_kernel(dtype, D, static_cast<int>(plan.at("block_m")));
  plan = plans::plan_tree_attention(B, N, Hq, Hkv, D, kv_capacity, dtype, lim, prepare_kernel(kernel));
  check_arg(plan.ok(), plan.refusal.c_str());
  return {plan, kernel};
}

}  // namespace

TreeAttentionPlan tree_attention_plan_for_device(int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                                                 int64_t kv_capacity, int dtype) {
  return legacy_plan(plan_on_device(B, N, Hq, Hkv, D, kv_capacity, dtype).plan);
}

void launch_tree_attention(const TreeAttentionArgs& a, void* counters, uint64_t counter_bytes, void* partials,
                           uint64_t partial_bytes, cudaStream_t stream) {
  const bool paged = a.block_table.data != nullptr;
  const int64_t capacity = paged ? a.max_pages * a.page_size : a.s_max;
  if (paged) {
    check_arg(a.page_size >= 1 && a.page_size <= 0x7FFFFFFF && a.max_pages >= 1, "bad page_size / max_pages");
  }
  const DevicePlan chosen = plan_on_device(a.B, a.N, a.Hq, a.Hkv, a.D, capacity, a.dtype);
  const TreeAttentionPlan plan = legacy_plan(chosen.plan);
  if (a.B == 0) return;  // an empty grid is a launch error
  check_arg(a.q && a.k.data && a.v.data && a.seq_lens.data && a.out && a.lse, "null device pointer");
  check_arg(counter_bytes >= plan.counter_bytes && partial_bytes >= plan.partial_bytes,
            "workspace smaller than tree_attention_plan() asks for");
  check_arg(plan.splits == 1 || (counters && partials), "null workspace");
  check_arg(reinterpret_cast<uintptr_t>(counters) % 4 == 0 && reinterpret_cast<uintptr_t>(partials) % 16 == 0,
            "workspace alignment");
  const plans::Launch& l = chosen.plan.launches.at(0);
  const KernelChoice& k = chosen.kernel;
  if (l.block != k.threads || l.dynamic_smem != k.smem) throw std::logic_error("tree_attention: plan and kernel differ");

  Params p{};
  p.q = a.q;
  p.q_sb = a.q_stride_b;
  p.q_sn = a.q_stride_n;
  p.q_sh = a.q_stride_h;
  p.k = a.k;
  p.v = a.v;
  p.seq_lens = a.seq_lens;
  p.parents = a.parents;
  p.block_table = a.block_table;
  p.page_size = paged ? static_cast<int>(a.page_size) : 1;
  p.num_pages = a.num_pages;
  p.out = a.out;
  p.o_sb = a.out_stride_b;
  p.o_sn = a.out_stride_n;
  p.o_sh = a.out_stride_h;
  p.lse = a.lse;
  p.partials = static_cast<float*>(partials);
  p.counters = static_cast<unsigned int*>(counters);
  p.N = static_cast<int>(a.N);
  p.Hq = static_cast<int>(a.Hq);
  p.Hkv = static_cast<int>(a.Hkv);
  p.group = static_cast<int>(a.Hq / a.Hkv);
  p.D = static_cast<int>(a.D);
  p.M = static_cast<int>(a.N * p.group);
  p.capacity = capacity;
  p.splits = plan.splits;
  p.m_tiles = plan.m_tiles;
  p.scale_log2 = a.sm_scale * kLog2e;
  // cp.async needs every copied 16-byte chunk aligned: base pointers and all
  // strides of the K/V rows (in bytes) multiples of 16.
  const int elem = a.dtype == kFloat32 ? 4 : 2;
  auto aligned = [&](const KvTensor& t) {
    return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.stride_outer * elem) % 16 == 0 &&
           (t.stride_slot * elem) % 16 == 0 && (t.stride_head * elem) % 16 == 0;
  };
  p.kv_aligned16 = aligned(a.k) && aligned(a.v) ? 1 : 0;

  void* kernel_args[] = {&p};
  SPECDEC_CUDA_CHECK(cudaLaunchKernel(k.fn, dim3(static_cast<unsigned>(l.grid[0])), dim3(l.block), kernel_args,
                                      static_cast<size_t>(l.dynamic_smem), stream));
}

}  // namespace specdec
