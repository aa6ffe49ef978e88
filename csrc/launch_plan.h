#pragma once
// Launch plans: for every CUDA kernel, ONE pure host function turns the call's sizes
// and a device-limits struct into the grid, block, static + dynamic shared memory,
// whether the > 48 KiB opt-in is needed, or a one-line refusal. The launchers launch
// exactly the plan these functions return (on the current device's limits), and the
// CPU tests call the same functions through _C.launch_plan on the sm_80 / sm_90
// tables over the whole shape space the public ops accept (tests/test_cuda_launch_plans.py).
//
// Host-only C++ (no CUDA headers): launch_plans.cpp builds with the host compiler, so
// a plan change rebuilds one small file. The kernels' static shared memory is mirrored
// here as constants (the host cannot see a kernel's __shared__ declarations); the test
// cross-checks every constant against cuobjdump's SHARED of the compiled kernels.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace specdec {
namespace plans {

// What a launch may use on one device.
struct DeviceLimits {
  int arch;                    // 80, 90, ... (major * 10 + minor)
  int sms;                     // multiprocessors
  int smem_per_block;          // static + dynamic without the opt-in (48 KiB)
  int smem_per_block_optin;    // static + dynamic with the opt-in
  int smem_per_sm;             // usable by CTAs on one SM
  int reserved_smem_per_block; // the runtime's share of each CTA (counts against smem_per_sm)
  int regs_per_sm;
  int regs_per_block;
  int threads_per_block;
  int threads_per_sm;
  int64_t grid_x;              // 2^31 - 1
  int64_t grid_yz;             // 65535
};

// The published limits of sm_80 (A100: 108 SMs) and sm_90 (H100 SXM: 132 SMs);
// throws std::invalid_argument for another arch.
DeviceLimits arch_limits(int arch);

// One kernel launch. `kernel` is the kernel's name as it appears in cuobjdump.
struct Launch {
  std::string kernel;
  int64_t grid[3];
  int block;
  int static_smem;    // the kernel's __shared__ declarations (mirror, checked against cuobjdump)
  int64_t dynamic_smem;
  bool opt_in;        // static + dynamic > smem_per_block: raise the kernel's dynamic limit first
};

// A call's launches (in order), or why the CUDA backend cannot serve it.
struct Plan {
  std::string refusal;                    // empty: launch `launches`
  std::vector<Launch> launches;
  std::map<std::string, int64_t> values;  // kernel parameters the launcher passes (splits, chunk, ...)
  bool ok() const { return refusal.empty(); }
  int64_t at(const char* key) const { return values.at(key); }
};

// The >48 KiB opt-in rule: the runtime refuses a launch whose static + dynamic shared
// memory exceeds smem_per_block unless cudaFuncAttributeMaxDynamicSharedMemorySize was
// raised to >= dynamic, and static + that attribute must stay <= smem_per_block_optin.
bool needs_opt_in(int static_smem, int64_t dynamic_smem, const DeviceLimits& lim);

// ---------------------------------------------------------------------------
// Kernel shapes shared by the kernels (static_assert-ed there) and the plans.
// ---------------------------------------------------------------------------
constexpr int kVerifyThreads = 256;           // greedy / logit / tree-greedy verify, max_prob
constexpr int kRejectionThreads = 256;        // rejection_sample (probs and logits)
constexpr int kRejectionBlocksPerSM = 4;      // its __launch_bounds__ residency (<= 64 registers)
constexpr int kKvCompactMaxThreads = 256;
constexpr int kEarlyExitWarps = 8;            // early_exit_split_kernel
constexpr int kEarlyExitRowsPerCta = 8;       // most batch rows one split CTA multiplies
constexpr int kEarlyExitMaxK = 16;
constexpr int kEarlyExitMergeThreads = 256;
constexpr int kEarlyExitMmaWarps = 8;         // early_exit_mma_kernel (fp16 / bf16 weights)
constexpr int kEarlyExitNormThreads = 256;    // early_exit_normalize_kernel
constexpr int64_t kRejectionMaxVocab = int64_t{1} << 23;
constexpr int kTreeAttentionStages = 3;       // K/V tiles in flight per MMA CTA
constexpr int kTreeAttentionBlockN = 64;      // keys per MMA K/V tile
constexpr int kTreeAttentionSimtRows = 16;    // packed rows per SIMT CTA
constexpr int kTreeAttentionSimtKeys = 16;    // keys per SIMT tile
constexpr int kTreeAttentionSimtThreads = 128;
constexpr int kTreeAttentionSimtMaxD = 256;

// Static shared memory of each kernel, in bytes, as the compiler lays out its
// __shared__ declarations (sm_80; cuobjdump adds the 1 KiB reserved block on sm_90).
// greedy_verify / tree_greedy_verify: u64 warp_scratch[8], bool, int, int64 = 64 + 1 (+3) + 4 + 8.
constexpr int kGreedyVerifyStaticSmem = 80;
constexpr int kTreeGreedyVerifyStaticSmem = 80;
// logit_verify: BlockScratch (u64[8] + u32[8] + MaxSum[8] = 160), bool (+3), int, int64.
constexpr int kLogitVerifyStaticSmem = 176;
// max_prob: BlockScratch, bool.
constexpr int kMaxProbStaticSmem = 161;
// rejection_sample: i64 sum[8][2], i64 scan[8], int, bool (+3), i64 x3 = 128 + 64 + 8 + 24.
constexpr int kRejectionSampleStaticSmem = 224;
// rejection_sample_logits: the same kernel body on softmax rows.
constexpr int kRejectionSampleLogitsStaticSmem = kRejectionSampleStaticSmem;
// softmax_stats_kernel (the logits ops' first launch): f32 m[8], s[8]; bool last.
constexpr int kSoftmaxStatsStaticSmem = 65;
// The largest V-chunk of a sampling kernel whose last block rescans one chunk for the drawn id
// (rejection_sample, block_verify): the rescan stays short whatever B is.
constexpr int64_t kSamplingMaxChunk = 8192;
// tree_attention (both kernels): bool s_last, padded to the 128-byte alignment of the
// dynamic buffer that follows it.
constexpr int kTreeAttentionStaticSmem = 128;
// kv_compact: i64 s_src[256], int s_first, s_last.
constexpr int kKvCompactStaticSmem = 8 * kKvCompactMaxThreads + 8;
// early_exit_split_kernel: u64 kept[warps][rows per CTA][max k].
constexpr int kEarlyExitSplitStaticSmem = 8 * kEarlyExitWarps * kEarlyExitRowsPerCta * kEarlyExitMaxK;
// early_exit_merge_kernel: u64 scratch[8], u64 winner: 72 B, laid out in 80 (cuobjdump;
// the compiler pads one of the two to 16-byte alignment).
constexpr int kEarlyExitMergeStaticSmem = 80;
// early_exit_normalize_kernel: f32 partial[8]. early_exit_mma_kernel: dynamic only.
constexpr int kEarlyExitNormStaticSmem = 32;
constexpr int kEarlyExitMmaStaticSmem = 0;

// ---------------------------------------------------------------------------
// Plans. dtype: 0 float32, 1 float16, 2 bfloat16. Arguments outside what the op
// accepts at all throw std::invalid_argument naming the argument; shapes the op
// accepts but these kernels cannot launch come back refused.
// ---------------------------------------------------------------------------

// Split-V chunking of the verify kernels (chain_common.cuh): ~4 CTAs per SM over all
// rows, never below 4096 elements per CTA; every CTA owns >= 1 element.
struct SplitPlan {
  int splits;
  int chunk;
};
SplitPlan chain_splits(int64_t rows, int64_t V, int sms);

Plan plan_greedy_verify(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim);
Plan plan_logit_verify(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim);  // relaxed and bild
Plan plan_max_prob(int64_t R, int64_t V, const DeviceLimits& lim);
Plan plan_tree_greedy_verify(int64_t B, int64_t N, int64_t V, const DeviceLimits& lim);
// Workspace slots per batch row of the rejection kernels: the most splits any device plans.
int64_t rejection_max_splits(int64_t V);
Plan plan_rejection_sample(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim);
// rejection_sample_logits: softmax_stats_kernel, grid (B, 2G+1, stats_splits), then
// rejection_sample_logits_kernel, grid (B, splits). Byte layout of its zeroed workspace (every
// offset 16-byte aligned): [B][ws_stride] longlong2 chunk totals, [B] uint32 tickets, then the
// statistics: [B*(2G+1)][stats_stride] float2 partials, [B*(2G+1)] float2 merged, [B] uint32 tickets.
struct RejectionLogitsLayout {
  int64_t ws_stride, counters_offset;
  int64_t stats_stride, partials_offset, merged_offset, stats_counters_offset;
  int64_t bytes;
};
RejectionLogitsLayout rejection_logits_layout(int64_t B, int64_t G, int64_t V);
Plan plan_rejection_sample_logits(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim);
// vector_bytes: the widest access the caches allow (2 is the worst case: most columns).
Plan plan_kv_compact(int64_t B, int64_t num_layers, int64_t heads, int64_t seq_capacity, int64_t head_dim,
                     int64_t elem_size, int64_t vector_bytes, const DeviceLimits& lim);
// ctas_per_sm_hint: CTAs per SM of the split kernel (the device's occupancy query on a
// GPU); <= 0 estimates it from the limits. dtype 1/2 (fp16/bf16 weights) with H % 8 == 0 and
// `aligned` (16-byte aligned LM head, row stride a multiple of 8 elements) plans the
// tensor-core path (normalize, mma, merge launches; values "mma" = 1); else the SIMT path.
Plan plan_early_exit_topk(int64_t B, int64_t H, int64_t V, int64_t k, const DeviceLimits& lim,
                          int ctas_per_sm_hint = 0, int dtype = 0, bool aligned = true);
// ctas_per_sm: CTAs of the chosen kernel per SM (occupancy query on a GPU); <= 0
// estimates it from the limits and the kernel's __launch_bounds__.
Plan plan_tree_attention(int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kv_capacity,
                         int dtype, const DeviceLimits& lim, int ctas_per_sm = 0);

// ---------------------------------------------------------------------------
// block_verify (csrc/block_verification.cu): grid (B, G+1, splits) [+ the logits' statistics
// kernel, grid (B, 2G+1, splits)]. Chunks hold at most kSamplingMaxChunk elements; the
// workspace depends on B, G and V, never on the device.
// ---------------------------------------------------------------------------
constexpr int kBlockVerifyThreads = 256;
constexpr int kBlockVerifyBlocksPerSM = 3;  // its __launch_bounds__ residency (<= 80 registers: 4 would spill)
constexpr int64_t kBlockVerifyMaxSplits = 64;  // per (batch row, position): workspace slots
// block_verify_kernel: i64 sum[8][2], scan[8]; f32 p[256], q[256]; bool ok[256]; f32 carry;
// int tau; bool last; i64 chunk, base, found = 128 + 64 + 1024 + 1024 + 256 + 4 + 4 + 1 (+7) + 24.
constexpr int kBlockVerifyStaticSmem = 2536;
constexpr int kBlockVerifyLogitsStaticSmem = 2536;  // the same kernel body on softmax rows
// Statistics slots per (batch row, row) for `rows` = B * (rows per batch row) rows in all:
// enough for ~4 CTAs per SM on a 256-SM device, at most kBlockVerifyMaxSplits. The block
// kernel's own slots are at least ceil(V / kSamplingMaxChunk) besides (its chunk cap).
int64_t block_verify_max_splits(int64_t rows);
// Byte layout of the zeroed workspace (every offset 16-byte aligned):
//   [B*(G+1)][ws_stride] longlong2 chunk totals (.x residual, .y plain p), [B*(G+1)] float
//   prefix ratios, [B] uint32 tickets; logits only: [B*(2G+1)][stats_stride] float2 partial
//   softmax statistics, [B*(2G+1)] float2 merged statistics, [B] uint32 tickets.
struct BlockVerifyLayout {
  int64_t ws_stride, ratios_offset, counters_offset;
  int64_t stats_stride, partials_offset, merged_offset, stats_counters_offset;
  int64_t bytes;
};
BlockVerifyLayout block_verify_layout(int64_t B, int64_t G, int64_t V, bool logits);
Plan plan_block_verify(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim);
Plan plan_block_verify_logits(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim);

// ---------------------------------------------------------------------------
// tree_rejection_sample (csrc/tree_verify.cu, tree_rejection_split_kernel): grid (B, chunks); a
// row's CTAs claim the V-chunks of each pass (stage) of its walk. Chunks of 2048..8192 elements
// (one for a smaller V; larger only past V = 128 * 8192), at most kTreeRejectionMaxChunks, so the
// scratch is per row: state (8 words), rank table (2N), chunk sums (3 x 128); none grows with V.
// The zeroed workspace holds 4 ticket words per row and is left zeroed.
// ---------------------------------------------------------------------------
constexpr int kTreeRejectionThreads = 256;
constexpr int kTreeRejectionBlocksPerSM = 3;    // its __launch_bounds__ residency (<= 80 registers: 4 spill)
constexpr int64_t kTreeRejectionMaxChunks = 128;
constexpr int kTreeRejectionSyncWords = 16;     // claim word, finished chunks, CTAs left: a 128-byte line a row
constexpr int kTreeRejectionStateWords = 8;
constexpr int kTreeRejectionPartWords = 3;      // per chunk: residual, p and Q weight sums
// tree_rejection_split_kernel: i64 sum[8][2], scan[8]; u64 word; Outcome (48); i64 x3; bool
// = 128 + 64 + 8 + 48 + 24 + 1, padded to 288 for the 16-byte aligned dynamic buffer (the tree's copy).
constexpr int kTreeRejectionStaticSmem = 288;
// Both forms copy a tree of at most this many nodes into dynamic shared memory (16 bytes a node) before the
// walk's serial part (tree_walk.cuh, kSharedTreeNodes); a larger tree is read from global memory.
constexpr int kTreeRejectionSharedNodes = 256;
// The sm_90 form, tree_rejection_cluster_kernel: grid (B * C), one thread-block cluster of C CTAs
// (cluster dims (C, 1, 1)) per batch row, CTA r owning ids [r * chunk, (r + 1) * chunk) of every
// pass; the partial sums and rank 0's decision travel through distributed shared memory, so the
// scratch holds the state and the rank table only (8 + 2N words a row) and no zeroed words.
// C <= 8 is portable; 9..16 need cudaFuncAttributeNonPortableClusterSizeAllowed. Slices hold
// <= kTreeRejectionClusterMaxSlice ids (past 16 of them the split form runs).
constexpr int kTreeRejectionMaxCluster = 16;
constexpr int kTreeRejectionPortableCluster = 8;
constexpr int64_t kTreeRejectionClusterSlice = 8192;      // the slice the plan aims at (the split's largest chunk)
constexpr int64_t kTreeRejectionClusterMaxSlice = 16384;  // the most ids one CTA's slice holds
// tree_rejection_cluster_kernel: i64 sum[8][2], scan[8]; i64 part[3], decision[6], parts[16][3],
// local[6]; i64 found, base; int owner = 128 + 64 + 24 + 48 + 384 + 48 + 16 + 4, padded to 720 for the
// dynamic buffer (sm_90; on sm_80 the kernel is a stub that traps, which the plan never launches).
constexpr int kTreeRejectionClusterStaticSmem = 720;
// form: 0 auto (the cluster form on sm_90 when it fits, else the split form), 1 the split form, 2 the
// cluster form (refused where it cannot run: no sm_90 code, V past the slices a schedulable cluster holds,
// clusters that do not fit one wave, B * C > grid x).
enum TreeRejectionForm : int { kTreeFormAuto = 0, kTreeFormSplit = 1, kTreeFormCluster = 2 };
// What the cluster form needs to know of the device and of the module's code, which the limits do not say
// (the launcher queries them once per device; the CPU tests pass each case):
//   code_arch: the virtual arch (__CUDA_ARCH__ / 10) whose code of the cluster kernel the device runs
//     (cudaFuncAttributes::ptxVersion); below 90 the kernel's body is a stub that traps, so the plan never
//     picks it (a `_C` built without sm_90 code on an H100 runs sm_80 code);
//   active[C]: thread-block clusters of C CTAs that fit on the device at once (cudaOccupancyMaxActiveClusters;
//     0 where such a cluster cannot be scheduled at all: MIG, MPS and green contexts shrink what fits).
struct ClusterFacts {
  int code_arch;
  int active[kTreeRejectionMaxCluster + 1];
};
// The facts the published limits imply: the device's own arch's code, and floor(3 * SMs / C) clusters of up
// to 16 CTAs on sm_90 / sm_100 (8 elsewhere; none below sm_90). An upper bound: a cluster sits in one GPC.
ClusterFacts nominal_cluster_facts(const DeviceLimits& lim);
// The virtual arch of the code the driver runs on a device of `device_arch` from a module built for `built`
// (setup.py's gencode: SASS for each arch, PTX of the highest): the highest SASS of the device's major at or
// below it ("90a": that arch alone), else that PTX where its arch is at or below the device's (JIT-compiled),
// else 0 (no code for this device: every launch fails).
int runnable_code_arch(int device_arch, const std::vector<std::string>& built);
Plan plan_tree_rejection_sample(int64_t B, int64_t N, int64_t V, const DeviceLimits& lim, int form = kTreeFormAuto,
                                const ClusterFacts* facts = nullptr);

}  // namespace plans
}  // namespace specdec
