// The launch plans of every CUDA kernel (launch_plan.h): pure host functions of the
// sizes and a DeviceLimits, shared by the launchers (current device) and the CPU
// tests (sm_80 / sm_90 tables, through bind_launch_plans.cpp).

#include "launch_plan.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "early_exit_math.cuh"
#include "early_exit_mma.cuh"
#include "attention_math.cuh"

namespace specdec {
namespace plans {

namespace {

constexpr int64_t kInt32Max = 0x7FFFFFFF;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void require(bool ok, const std::string& op, const std::string& what) {
  if (!ok) throw std::invalid_argument("specdec_kernels." + op + ": " + what);
}

Plan refused(const std::string& why) {
  Plan p;
  p.refusal = why;
  return p;
}

// A launch of `kernel`, with the opt-in decided by the one rule, or the first limit it breaks.
std::string add_launch(Plan& plan, const std::string& kernel, int64_t gx, int64_t gy, int64_t gz, int block,
                       int static_smem, int64_t dynamic_smem, const DeviceLimits& lim) {
  if (gx > lim.grid_x) return kernel + ": grid x " + std::to_string(gx) + " > " + std::to_string(lim.grid_x);
  if (gy > lim.grid_yz || gz > lim.grid_yz) {
    return kernel + ": grid y/z " + std::to_string(std::max(gy, gz)) + " > " + std::to_string(lim.grid_yz);
  }
  if (block > lim.threads_per_block) return kernel + ": block of " + std::to_string(block) + " threads";
  if (static_smem + dynamic_smem > lim.smem_per_block_optin) {
    return kernel + ": " + std::to_string(static_smem + dynamic_smem) + " B of shared memory > the device's " +
           std::to_string(lim.smem_per_block_optin);
  }
  plan.launches.push_back(
      {kernel, {gx, gy, gz}, block, static_smem, dynamic_smem, needs_opt_in(static_smem, dynamic_smem, lim)});
  return "";
}

// Finishes a plan: a launch that breaks a limit refuses the whole call.
Plan& check(Plan& plan, const std::string& broken) {
  if (!broken.empty()) {
    plan.launches.clear();
    plan.refusal = broken;
  }
  return plan;
}

void require_chain(const char* op, int64_t B, int64_t G) { require(B >= 0 && G >= 0, op, "B and G must be >= 0"); }

// V must leave 0xFFFFFFFF free as the verify kernels' "no element" index, and fit int32.
std::string vocab_refusal(int64_t V) { return V >= kInt32Max ? "V >= 2^31 - 1" : ""; }

}  // namespace

DeviceLimits arch_limits(int arch) {
  DeviceLimits lim{};
  lim.arch = arch;
  lim.smem_per_block = 48 * 1024;
  lim.reserved_smem_per_block = 1024;
  lim.regs_per_sm = 65536;
  lim.regs_per_block = 65536;
  lim.threads_per_block = 1024;
  lim.threads_per_sm = 2048;
  lim.grid_x = kInt32Max;
  lim.grid_yz = 65535;
  if (arch == 80) {  // A100
    lim.sms = 108;
    lim.smem_per_block_optin = 166912;  // 163 KiB
    lim.smem_per_sm = 167936;
  } else if (arch == 90) {  // H100 SXM
    lim.sms = 132;
    lim.smem_per_block_optin = 232448;  // 227 KiB
    lim.smem_per_sm = 233472;
  } else {
    throw std::invalid_argument("launch_plan: arch must be 80 or 90 (got " + std::to_string(arch) + ")");
  }
  return lim;
}

bool needs_opt_in(int static_smem, int64_t dynamic_smem, const DeviceLimits& lim) {
  return static_smem + dynamic_smem > lim.smem_per_block;
}

SplitPlan chain_splits(int64_t rows, int64_t V, int sms) {
  constexpr int64_t kChunkAlign = 8, kMinChunk = 4096, kBlocksPerSM = 4;
  int64_t splits = ceil_div(kBlocksPerSM * std::max(sms, 1), std::max<int64_t>(rows, 1));
  splits = std::max<int64_t>(1, std::min(splits, V / kMinChunk));
  const int64_t chunk = ceil_div(ceil_div(V, splits), kChunkAlign) * kChunkAlign;
  return {static_cast<int>(ceil_div(V, chunk)), static_cast<int>(chunk)};
}

// ---------------------------------------------------------------------------
// Split-V verification: grid (B, rows per batch row, splits). B rides in grid x
// (up to 2^31 - 1); splits <= 4 CTAs per SM stay far below the 65535 of grid z.
// ---------------------------------------------------------------------------
namespace {

Plan plan_split_v(const char* kernel, int64_t B, int64_t per_row, int64_t V, int static_smem, int64_t dynamic_smem,
                  const DeviceLimits& lim) {
  Plan plan;
  if (const std::string why = vocab_refusal(V); !why.empty()) return refused(why);
  if (per_row > lim.grid_yz) return refused(std::string(kernel) + ": " + std::to_string(per_row) + " rows per batch row > 65535 (grid y)");
  if (B == 0) return plan;  // nothing to launch
  const SplitPlan s = chain_splits(B * per_row, V, lim.sms);
  plan.values = {{"splits", s.splits}, {"chunk", s.chunk}};
  return check(plan, add_launch(plan, kernel, B, per_row, s.splits, kVerifyThreads, static_smem, dynamic_smem, lim));
}

}  // namespace

Plan plan_greedy_verify(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim) {
  require_chain("greedy_verify", B, G);
  require(V >= 1, "greedy_verify", "V must be >= 1");
  return plan_split_v("greedy_verify_kernel", B, G + 1, V, kGreedyVerifyStaticSmem, 0, lim);
}

Plan plan_logit_verify(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim) {
  require_chain("logit_verify", B, G);
  require(V >= 1, "logit_verify", "V must be >= 1");
  return plan_split_v("logit_verify_kernel", B, G + 1, V, kLogitVerifyStaticSmem, 0, lim);
}

Plan plan_tree_greedy_verify(int64_t B, int64_t N, int64_t V, const DeviceLimits& lim) {
  require(B >= 0 && N >= 1, "tree_greedy_verify", "need B >= 0 and N >= 1");
  require(V >= 1, "tree_greedy_verify", "V must be >= 1");
  return plan_split_v("tree_greedy_verify_kernel", B, N, V, kTreeGreedyVerifyStaticSmem, 0, lim);
}

Plan plan_max_prob(int64_t R, int64_t V, const DeviceLimits& lim) {
  require(R >= 0, "max_prob", "R must be >= 0");
  require(V >= 1, "max_prob", "V must be >= 1");
  Plan plan;
  if (const std::string why = vocab_refusal(V); !why.empty()) return refused(why);
  if (R == 0) return plan;
  const SplitPlan s = chain_splits(R, V, lim.sms);
  plan.values = {{"splits", s.splits}, {"chunk", s.chunk}};
  // one CTA per (row, split) in grid x
  if (R > lim.grid_x / s.splits) return refused("max_prob: R * splits > 2^31 - 1");
  return check(plan, add_launch(plan, "max_prob_kernel", R * s.splits, 1, 1, kVerifyThreads, kMaxProbStaticSmem, 0,
                                lim));
}

// ---------------------------------------------------------------------------
// The softmax statistics of the logits sampling ops (softmax_stats_kernel): ~4 CTAs per SM
// over all rows, chunks of >= 2048 elements (one chunk for a smaller V), at most
// block_verify_max_splits(rows) per row (its workspace slots); every CTA owns >= 1 element.
// ---------------------------------------------------------------------------
int64_t block_verify_max_splits(int64_t rows) {
  constexpr int64_t kCtaTarget = 4 * 256;  // 4 CTAs per SM on a 256-SM device
  return std::clamp<int64_t>(ceil_div(kCtaTarget, std::max<int64_t>(rows, 1)), 1, kBlockVerifyMaxSplits);
}

namespace {

// One wave of `per_sm` CTAs per SM over all rows, chunks of >= 2048 elements (one chunk for a
// smaller V), at most `most` splits; with `cap_chunk`, at least ceil(V / kSamplingMaxChunk)
// splits (chunks of at most 8192 elements: the kernel's last block rescans one). Every CTA owns
// at least one element.
SplitPlan sampling_splits(int64_t rows, int64_t V, int sms, int64_t per_sm, int64_t most, bool cap_chunk) {
  constexpr int64_t kChunkAlign = 8, kMinChunk = 2048;
  int64_t splits = ceil_div(per_sm * std::max(sms, 1), std::max<int64_t>(rows, 1));
  splits = std::min({splits, most, std::max<int64_t>(1, V / kMinChunk)});
  if (cap_chunk) splits = std::max(splits, ceil_div(V, kSamplingMaxChunk));
  splits = std::max<int64_t>(splits, 1);
  const int64_t chunk = ceil_div(ceil_div(V, splits), kChunkAlign) * kChunkAlign;
  return {static_cast<int>(ceil_div(V, chunk)), static_cast<int>(chunk)};
}

// The statistics launch of a logits op: grid (B, 2G+1, splits).
SplitPlan softmax_stats_splits(int64_t B, int64_t G, int64_t V, int sms) {
  const int64_t rows = B * (2 * G + 1);
  return sampling_splits(rows, V, sms, 4, block_verify_max_splits(rows), false);
}

std::string add_softmax_stats_launch(Plan& plan, int64_t B, int64_t G, const SplitPlan& st, const DeviceLimits& lim) {
  plan.values["stats_splits"] = st.splits;
  plan.values["stats_chunk"] = st.chunk;
  return add_launch(plan, "softmax_stats_kernel", B, 2 * G + 1, st.splits, kRejectionThreads, kSoftmaxStatsStaticSmem,
                    0, lim);
}

}  // namespace

// ---------------------------------------------------------------------------
// rejection_sample: grid (B, splits); logits: the statistics, then grid (B, splits)
// ---------------------------------------------------------------------------
int64_t rejection_max_splits(int64_t V) { return ceil_div(V, 2048); }

namespace {

// One wave of its 4 CTAs per SM over all rows, chunks of 2048..8192 elements (one chunk for a
// smaller V); splits <= rejection_max_splits(V), and every CTA owns at least one element.
SplitPlan rejection_splits(int64_t rows, int64_t V, int sms) {
  return sampling_splits(rows, V, sms, kRejectionBlocksPerSM, rejection_max_splits(V), true);
}

std::string rejection_refusal(int64_t G, int64_t V) {
  if (V >= kRejectionMaxVocab) return "V >= 2^23 (fixed-point totals stay exact below)";
  if (G > (1 << 20)) return "G > 2^20";
  return "";
}

}  // namespace

Plan plan_rejection_sample(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim) {
  require_chain("rejection_sample", B, G);
  require(V >= 1, "rejection_sample", "V must be >= 1");
  if (const std::string why = rejection_refusal(G, V); !why.empty()) return refused(why);
  Plan plan;
  if (B == 0) return plan;
  const SplitPlan s = rejection_splits(B, V, lim.sms);
  plan.values = {{"splits", s.splits}, {"chunk", s.chunk}, {"ws_stride", rejection_max_splits(V)},
                 {"ctas_per_sm", kRejectionBlocksPerSM}};
  return check(plan, add_launch(plan, "rejection_sample_kernel", B, s.splits, 1, kRejectionThreads,
                                kRejectionSampleStaticSmem, 0, lim));
}

RejectionLogitsLayout rejection_logits_layout(int64_t B, int64_t G, int64_t V) {
  require(B >= 0 && G >= 0 && V >= 1, "rejection_sample_logits", "need B >= 0, G >= 0 and V >= 1");
  auto align16 = [](int64_t bytes) { return ceil_div(bytes, 16) * 16; };
  RejectionLogitsLayout l{};
  l.ws_stride = rejection_max_splits(V);
  l.counters_offset = B * l.ws_stride * 16;                     // longlong2 chunk totals
  l.partials_offset = l.counters_offset + align16(B * 4);       // uint32 tickets
  const int64_t stat_rows = B * (2 * G + 1);
  l.stats_stride = block_verify_max_splits(stat_rows);
  l.merged_offset = l.partials_offset + stat_rows * l.stats_stride * 8;  // float2 partials
  l.stats_counters_offset = l.merged_offset + align16(stat_rows * 8);    // float2 merged
  l.bytes = B == 0 ? 0 : l.stats_counters_offset + align16(B * 4);
  return l;
}

Plan plan_rejection_sample_logits(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim) {
  require_chain("rejection_sample_logits", B, G);
  require(V >= 1, "rejection_sample_logits", "V must be >= 1");
  if (const std::string why = rejection_refusal(G, V); !why.empty()) return refused(why);
  if (2 * G + 1 > lim.grid_yz) return refused(std::to_string(2 * G + 1) + " statistics rows per batch row > 65535 (grid y)");
  Plan plan;
  const RejectionLogitsLayout l = rejection_logits_layout(B, G, V);
  plan.values = {{"ws_stride", l.ws_stride},           {"counters_offset", l.counters_offset},
                 {"stats_stride", l.stats_stride},     {"partials_offset", l.partials_offset},
                 {"merged_offset", l.merged_offset},   {"stats_counters_offset", l.stats_counters_offset},
                 {"workspace_bytes", l.bytes}};
  if (B == 0) return plan;
  const SplitPlan s = rejection_splits(B, V, lim.sms);
  plan.values["splits"] = s.splits;
  plan.values["chunk"] = s.chunk;
  plan.values["ctas_per_sm"] = kRejectionBlocksPerSM;
  std::string broken = add_softmax_stats_launch(plan, B, G, softmax_stats_splits(B, G, V, lim.sms), lim);
  if (broken.empty()) {
    broken = add_launch(plan, "rejection_sample_logits_kernel", B, s.splits, 1, kRejectionThreads,
                        kRejectionSampleLogitsStaticSmem, 0, lim);
  }
  return check(plan, broken);
}

// ---------------------------------------------------------------------------
// kv_compact: grid (B * column blocks, 2 * layers); threads shrink while too few CTAs
// would spread over the GPU (small B: a few layers x heads per CTA is latency-bound).
// ---------------------------------------------------------------------------
Plan plan_kv_compact(int64_t B, int64_t num_layers, int64_t heads, int64_t seq_capacity, int64_t head_dim,
                     int64_t elem_size, int64_t vector_bytes, const DeviceLimits& lim) {
  const char* op = "kv_compact";
  require(B >= 0 && num_layers >= 0 && heads >= 0 && seq_capacity >= 0 && head_dim >= 0, op,
          "B, layers, heads, S_max and D must be >= 0");
  require(elem_size == 2 || elem_size == 4, op, "elem_size must be 2 or 4 bytes");
  const int64_t v = vector_bytes;
  require(v == 2 || v == 4 || v == 8 || v == 16, op, "vector_bytes must be 2, 4, 8 or 16");
  require((head_dim * elem_size) % v == 0, op, "vector_bytes must divide head_dim * elem_size");
  if (heads == 0 || head_dim == 0 || seq_capacity == 0) num_layers = 0;  // lengths only
  if (2 * num_layers > lim.grid_yz) return refused("2 * layers > 65535");
  Plan plan;
  if (B == 0) return plan;
  const int64_t columns = heads * (head_dim * elem_size / v);
  const int64_t num_caches = std::max<int64_t>(2 * num_layers, 1);
  int64_t threads = std::min<int64_t>(kKvCompactMaxThreads, std::max<int64_t>(32, ceil_div(columns, 32) * 32));
  const int64_t wanted_blocks = 2 * static_cast<int64_t>(lim.sms);
  // halve while too few CTAs, in whole warps (a 24-thread block idles a quarter of its warp)
  while (threads > 32 && B * num_caches * ceil_div(columns, threads) < wanted_blocks) threads = ceil_div(threads / 2, 32) * 32;
  const int64_t column_blocks = std::max<int64_t>(1, ceil_div(columns, threads));
  if (column_blocks > lim.grid_x / B) return refused("B * column blocks > 2^31 - 1");
  plan.values = {{"column_blocks", column_blocks}, {"num_layers", num_layers}};
  return check(plan, add_launch(plan, "kv_compact_kernel", B * column_blocks, num_caches, 1, static_cast<int>(threads),
                                kKvCompactStaticSmem, 0, lim));
}

// ---------------------------------------------------------------------------
// early_exit_topk: split kernel (row groups, splits) + merge kernel (B).
// ---------------------------------------------------------------------------
namespace {

// The tensor-core path: normalize (B), mma (column groups, splits), merge (B). Workspace:
// [B][splits][k] u64 candidates, then at hn_offset the hi and lo arrays [hn_rows][hn_stride] u16.
Plan plan_early_exit_mma(int64_t B, int64_t H, int64_t V, int64_t k, const DeviceLimits& lim, int ctas_per_sm_hint) {
  namespace ee = early_exit;
  const int nt = ee::n_tiles_for(B);
  const int64_t bn = 8 * nt;
  const int64_t hs = ceil_div(H, ee::kChunk) * ee::kChunk;
  // kept sets [warps][bn][k] + minima [warps][bn] (u64), then the hi / lo tiles [bn][stride] u16
  const int64_t kept_bytes = kEarlyExitMmaWarps * bn * (k + 1) * 8;
  const int64_t most_stride = (lim.smem_per_block_optin - kEarlyExitMmaStaticSmem - kept_bytes) / (4 * bn);
  int64_t k_block = std::min<int64_t>(hs, most_stride / ee::kChunk * ee::kChunk);
  while (k_block >= ee::kChunk && ee::smem_stride(k_block) > most_stride) k_block -= ee::kChunk;
  if (k_block < ee::kChunk) return refused("early_exit_mma_kernel: no 32-column k-block fits in shared memory");
  Plan plan;
  if (B == 0) return plan;
  const int64_t dynamic = kept_bytes + 4 * bn * ee::smem_stride(k_block);
  int ctas = ctas_per_sm_hint;
  if (ctas <= 0) {  // registers (cuobjdump): 128 a thread at 1-2 n-tiles (2 CTAs), more at 4-8 (1 CTA)
    ctas = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>(nt <= 2 ? 2 : 1,
                             lim.smem_per_sm / (kEarlyExitMmaStaticSmem + dynamic + lim.reserved_smem_per_block))));
  }
  const int64_t col_groups = ceil_div(B, bn);
  const int64_t vt = ee::vocab_tile(nt);
  const int64_t tiles = ceil_div(V, vt);
  const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(tiles, static_cast<int64_t>(lim.sms) * ctas / col_groups));
  const int64_t tiles_per_split = ceil_div(tiles, wanted);
  const int64_t splits = ceil_div(tiles, tiles_per_split);
  const int64_t cand_bytes = B * splits * k * 8;
  const int64_t hn_offset = ceil_div(cand_bytes, 16) * 16;
  const int64_t hn_rows = col_groups * bn;
  plan.values = {{"mma", 1},
                 {"n_tiles", nt},
                 {"k_block", k_block},
                 {"hn_stride", hs},
                 {"hn_rows", hn_rows},
                 {"hn_offset", hn_offset},
                 {"per_split", tiles_per_split * vt},
                 {"splits", splits},
                 {"workspace_bytes", hn_offset + 2 * hn_rows * hs * 2}};
  std::string broken = add_launch(plan, "early_exit_normalize_kernel", B, 1, 1, kEarlyExitNormThreads,
                                  kEarlyExitNormStaticSmem, 0, lim);
  if (broken.empty()) {
    broken = add_launch(plan, "early_exit_mma_kernel", col_groups, splits, 1, kEarlyExitMmaWarps * 32,
                        kEarlyExitMmaStaticSmem, dynamic, lim);
  }
  if (broken.empty()) {
    broken = add_launch(plan, "early_exit_merge_kernel", B, 1, 1, kEarlyExitMergeThreads, kEarlyExitMergeStaticSmem,
                        0, lim);
  }
  return check(plan, broken);
}

}  // namespace

Plan plan_early_exit_topk(int64_t B, int64_t H, int64_t V, int64_t k, const DeviceLimits& lim,
                          int ctas_per_sm_hint, int dtype, bool aligned) {
  const char* op = "early_exit_topk";
  require(B >= 0 && H >= 1 && V >= 1, op, "need B >= 0, H >= 1 and V >= 1");
  require(k >= 1 && k <= kEarlyExitMaxK && k <= V, op, "k must be in [1, min(16, V)] (larger k: the torch path)");
  require(dtype >= 0 && dtype <= 2, op, "dtype must be 0, 1 or 2");
  if (V >= kInt32Max) return refused("V >= 2^31 - 1");
  if (dtype != 0 && H % 8 == 0 && aligned) return plan_early_exit_mma(B, H, V, k, lim, ctas_per_sm_hint);
  // The CTA's normalised rows live in dynamic shared memory next to the static kept
  // sets: as many rows (<= 8) as the device's opt-in maximum holds.
  const int64_t row_bytes = H * static_cast<int64_t>(sizeof(float));
  const int64_t room = lim.smem_per_block_optin - kEarlyExitSplitStaticSmem;
  if (room < row_bytes) {
    return refused("H = " + std::to_string(H) + ": one normalised row does not fit in shared memory");
  }
  Plan plan;
  if (B == 0) return plan;
  const int64_t rows = std::min<int64_t>({B, kEarlyExitRowsPerCta, room / row_bytes});
  const int64_t dynamic = rows * row_bytes;
  const int64_t per_cta = kEarlyExitSplitStaticSmem + dynamic + lim.reserved_smem_per_block;
  int ctas = ctas_per_sm_hint;
  if (ctas <= 0) {
    ctas = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>(lim.threads_per_sm / (kEarlyExitWarps * 32), lim.smem_per_sm / per_cta)));
  }
  const early_exit::Plan p = early_exit::make_plan(B, V, lim.sms, ctas, static_cast<int>(rows));
  plan.values = {{"rows_per_cta", p.rows_per_cta},
                 {"per_split", p.per_split},
                 {"splits", p.splits},
                 {"workspace_bytes", B * p.splits * k * 8}};
  std::string broken = add_launch(plan, "early_exit_split_kernel", p.row_groups, p.splits, 1, kEarlyExitWarps * 32,
                                  kEarlyExitSplitStaticSmem, dynamic, lim);
  if (broken.empty()) {
    broken = add_launch(plan, "early_exit_merge_kernel", B, 1, 1, kEarlyExitMergeThreads, kEarlyExitMergeStaticSmem,
                        0, lim);
  }
  return check(plan, broken);
}

// ---------------------------------------------------------------------------
// tree_attention: one launch over (b, KV head, split, m tile) in grid x.
// ---------------------------------------------------------------------------
namespace {

bool has_mma_kernel(int dtype, int64_t D) { return dtype != 0 && (D == 64 || D == 128); }

// The tensor-core kernel's K and V stages (16-bit elements), or the SIMT kernel's
// float Q [16][D], K [16][D | 1] and V [16][D].
int64_t tree_attention_dynamic_smem(bool mma, int64_t D) {
  if (mma) return 2 * kTreeAttentionStages * kTreeAttentionBlockN * D * 2;
  return (kTreeAttentionSimtRows * D + kTreeAttentionSimtKeys * (D | 1) + kTreeAttentionSimtKeys * D) * 4;
}

// CTAs of one kernel per SM when no occupancy query is at hand: the threads and shared
// memory bounds, and the register budget the MMA kernels' __launch_bounds__ aim at.
int estimate_ctas_per_sm(bool mma, int64_t D, int threads, int64_t smem, const DeviceLimits& lim) {
  int64_t ctas = std::min<int64_t>(lim.threads_per_sm / threads, lim.smem_per_sm / (smem + lim.reserved_smem_per_block));
  if (mma) ctas = std::min<int64_t>(ctas, D == 64 ? (threads == 256 ? 2 : 3) : 1);
  return static_cast<int>(std::max<int64_t>(ctas, 1));
}

}  // namespace

Plan plan_tree_attention(int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kv_capacity, int dtype,
                         const DeviceLimits& lim, int ctas_per_sm) {
  const char* op = "tree_attention";
  require(dtype == 0 || dtype == 1 || dtype == 2, op, "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  require(B >= 0 && N >= 1 && Hkv >= 1 && Hq >= Hkv && Hq % Hkv == 0 && D >= 1, op,
          "need B >= 0, N >= 1, D >= 1, Hq % Hkv == 0");
  require(kv_capacity >= N, op, "the KV cache must hold at least N positions per row");
  if (D > kTreeAttentionSimtMaxD) return refused("the cuda backend supports head dims 1..256");
  // positions, page ids / slots and packed rows are 32-bit inside the kernels
  if (kv_capacity > kInt32Max - tree_attn::kKeyAlign) return refused("KV capacity >= 2^31 - 64 positions");
  const int64_t M = N * (Hq / Hkv);
  if (M > kInt32Max || Hq > kInt32Max) return refused("N * Hq / Hkv >= 2^31");
  const bool mma = has_mma_kernel(dtype, D);
  const int block_m = mma ? (M > 64 ? 128 : 64) : kTreeAttentionSimtRows;
  const int threads = mma ? block_m / 16 * 32 : kTreeAttentionSimtThreads;
  const int64_t dynamic = tree_attention_dynamic_smem(mma, D);
  const int64_t m_tiles = ceil_div(M, block_m);
  if (ctas_per_sm <= 0) ctas_per_sm = estimate_ctas_per_sm(mma, D, threads, kTreeAttentionStaticSmem + dynamic, lim);
  // One wave of resident CTAs: split the rows' prefixes only as far as it takes to fill
  // the GPU, and never into pieces shorter than kMinSplitKeys.
  const int64_t tiles = B * Hkv * m_tiles;
  const int64_t slots = static_cast<int64_t>(std::max(lim.sms, 1)) * std::max(ctas_per_sm, 1);
  const int64_t most = std::min<int64_t>(tree_attn::kMaxSplits,
                                         std::max<int64_t>(1, ceil_div(kv_capacity, tree_attn::kMinSplitKeys)));
  const int64_t splits = std::clamp<int64_t>(slots / std::max<int64_t>(tiles, 1), 1, most);
  Plan plan;
  plan.values = {{"path", mma ? 1 : 0},
                 {"block_m", block_m},
                 {"m_tiles", m_tiles},
                 {"splits", splits},
                 {"counter_bytes", splits > 1 ? tiles * 4 : 0},
                 {"partial_bytes", splits > 1 ? tiles * splits * block_m * (D + 2) * 4 : 0}};
  if (B == 0) return plan;
  if (tiles > lim.grid_x / splits) return refused("B * Hkv * splits * m_tiles > 2^31 - 1");
  return check(plan, add_launch(plan, mma ? "tree_attention_mma_kernel" : "tree_attention_simt_kernel",
                                tiles * splits, 1, 1, threads, kTreeAttentionStaticSmem, dynamic, lim));
}

// ---------------------------------------------------------------------------
// block_verify: grid (B, G+1, splits); logits: + statistics grid (B, 2G+1, splits)
// ---------------------------------------------------------------------------
namespace {

// The block kernel's slots per (batch row, position): its chunks hold at most
// kSamplingMaxChunk elements, so a large V takes more than block_verify_max_splits(rows).
int64_t block_verify_slots(int64_t rows, int64_t V) {
  return std::max(block_verify_max_splits(rows), ceil_div(V, kSamplingMaxChunk));
}

}  // namespace

BlockVerifyLayout block_verify_layout(int64_t B, int64_t G, int64_t V, bool logits) {
  require(B >= 0 && G >= 0 && V >= 1, "block_verify", "need B >= 0, G >= 0 and V >= 1");
  auto align16 = [](int64_t bytes) { return ceil_div(bytes, 16) * 16; };
  BlockVerifyLayout l{};
  const int64_t rows = B * (G + 1);
  l.ws_stride = block_verify_slots(rows, V);
  l.ratios_offset = rows * l.ws_stride * 16;                      // longlong2 totals
  l.counters_offset = l.ratios_offset + align16(rows * 4);        // float prefix ratios
  int64_t end = l.counters_offset + align16(B * 4);               // uint32 tickets
  if (logits) {
    const int64_t stat_rows = B * (2 * G + 1);
    l.stats_stride = block_verify_max_splits(stat_rows);
    l.partials_offset = end;
    l.merged_offset = l.partials_offset + stat_rows * l.stats_stride * 8;  // float2 partials
    l.stats_counters_offset = l.merged_offset + align16(stat_rows * 8);    // float2 merged
    end = l.stats_counters_offset + align16(B * 4);
  }
  l.bytes = B == 0 ? 0 : end;
  return l;
}

namespace {

// The block kernel: one wave of its 3 CTAs per SM over all rows, chunks of 2048..8192 elements
// (one chunk for a smaller V), never more splits than the workspace holds.
SplitPlan block_verify_splits(int64_t rows, int64_t V, int sms) {
  return sampling_splits(rows, V, sms, kBlockVerifyBlocksPerSM, block_verify_slots(rows, V), true);
}

std::string block_verify_refusal(int64_t V, int64_t rows_per_batch_row, const DeviceLimits& lim) {
  if (V >= kRejectionMaxVocab) return "V >= 2^23 (fixed-point totals stay exact below)";
  if (rows_per_batch_row > lim.grid_yz) {
    return std::to_string(rows_per_batch_row) + " rows per batch row > 65535 (grid y)";
  }
  return "";
}

void put_layout(Plan& plan, const BlockVerifyLayout& l) {
  plan.values["ctas_per_sm"] = kBlockVerifyBlocksPerSM;
  plan.values["ws_stride"] = l.ws_stride;
  plan.values["ratios_offset"] = l.ratios_offset;
  plan.values["counters_offset"] = l.counters_offset;
  plan.values["workspace_bytes"] = l.bytes;
}

}  // namespace

Plan plan_block_verify(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim) {
  require_chain("block_verify", B, G);
  require(V >= 1, "block_verify", "V must be >= 1");
  if (const std::string why = block_verify_refusal(V, G + 1, lim); !why.empty()) return refused(why);
  Plan plan;
  put_layout(plan, block_verify_layout(B, G, V, false));
  if (B == 0) return plan;
  const SplitPlan s = block_verify_splits(B * (G + 1), V, lim.sms);
  plan.values["splits"] = s.splits;
  plan.values["chunk"] = s.chunk;
  return check(plan, add_launch(plan, "block_verify_kernel", B, G + 1, s.splits, kBlockVerifyThreads,
                                kBlockVerifyStaticSmem, 0, lim));
}

Plan plan_block_verify_logits(int64_t B, int64_t G, int64_t V, const DeviceLimits& lim) {
  require_chain("block_verify_logits", B, G);
  require(V >= 1, "block_verify_logits", "V must be >= 1");
  if (const std::string why = block_verify_refusal(V, 2 * G + 1, lim); !why.empty()) return refused(why);
  Plan plan;
  const BlockVerifyLayout l = block_verify_layout(B, G, V, true);
  put_layout(plan, l);
  plan.values["stats_stride"] = l.stats_stride;
  plan.values["partials_offset"] = l.partials_offset;
  plan.values["merged_offset"] = l.merged_offset;
  plan.values["stats_counters_offset"] = l.stats_counters_offset;
  if (B == 0) return plan;
  const SplitPlan s = block_verify_splits(B * (G + 1), V, lim.sms);
  plan.values["splits"] = s.splits;
  plan.values["chunk"] = s.chunk;
  std::string broken = add_softmax_stats_launch(plan, B, G, softmax_stats_splits(B, G, V, lim.sms), lim);
  if (broken.empty()) {
    broken = add_launch(plan, "block_verify_logits_kernel", B, G + 1, s.splits, kBlockVerifyThreads,
                        kBlockVerifyLogitsStaticSmem, 0, lim);
  }
  return check(plan, broken);
}

// ---------------------------------------------------------------------------
// tree_rejection_sample: grid (B, chunks) (split form) or (B * C) in clusters of C (sm_90)
// ---------------------------------------------------------------------------
namespace {

// rejection_sample's split (4 CTAs per SM over the rows, chunks of 2048..8192 elements), then at
// most kTreeRejectionMaxChunks chunks (longer ones past V = 2^20), so the chunk sums' slots are fixed.
SplitPlan tree_rejection_splits(int64_t B, int64_t V, int sms) {
  SplitPlan s = sampling_splits(B, V, sms, kTreeRejectionBlocksPerSM, kTreeRejectionMaxChunks, true);
  if (s.splits > kTreeRejectionMaxChunks) {
    constexpr int64_t kChunkAlign = 8;
    const int64_t chunk = ceil_div(ceil_div(V, kTreeRejectionMaxChunks), kChunkAlign) * kChunkAlign;
    s = {static_cast<int>(ceil_div(V, chunk)), static_cast<int>(chunk)};
  }
  return s;
}

// The largest cluster size with a schedulable cluster.
int64_t largest_cluster(const ClusterFacts& facts) {
  for (int c = kTreeRejectionMaxCluster; c >= 1; --c) {
    if (facts.active[c] > 0) return c;
  }
  return 0;
}

// The cluster form's size C and slice. A row's CTAs stay resident for its whole walk, so clusters past
// what fits on the device at once (facts.active[C]) would run a later round of rows: the largest C whose B
// clusters fit at once (`fill`) bounds it. While slices of <= 8192 ids (the split's largest chunk: passes
// and the final rescan stay short) fit, those, else slices of up to 16384 ids (fewer CTAs a row); at least
// 2048 ids a slice (the split's smallest chunk), and up to `fill` CTAs to fill the device when B is small.
// C = ceil(V / slice), so the slices cover V exactly and none is empty. {0, 0} when V needs more slices of
// kTreeRejectionClusterMaxSlice than the largest cluster the device schedules. A C past `fill` comes back
// when even the long slices do not fit one wave: the caller then takes the split form.
SplitPlan tree_rejection_cluster(int64_t B, int64_t V, const ClusterFacts& facts) {
  constexpr int64_t kChunkAlign = 8, kMinSlice = 2048;
  const int64_t most = largest_cluster(facts);
  if (most < 1) return {0, 0};
  int64_t fill = 0;
  for (int c = 1; c <= most; ++c) {
    if (facts.active[c] >= std::max<int64_t>(B, 1)) fill = c;
  }
  const int64_t short_slices = ceil_div(V, kTreeRejectionClusterSlice);
  const int64_t cover = short_slices <= fill ? short_slices : ceil_div(V, kTreeRejectionClusterMaxSlice);
  int64_t c = std::max(cover, std::min(fill, std::max<int64_t>(1, V / kMinSlice)));
  c = std::min<int64_t>(std::max<int64_t>(c, 1), most);
  const int64_t slice = ceil_div(ceil_div(V, c), kChunkAlign) * kChunkAlign;
  if (slice > kTreeRejectionClusterMaxSlice) return {0, 0};
  return {static_cast<int>(ceil_div(V, slice)), static_cast<int>(slice)};
}

// Why the cluster form cannot run this call ("" when it can).
std::string no_cluster_form(int64_t B, const SplitPlan& cl, const DeviceLimits& lim, const ClusterFacts& facts) {
  if (lim.arch < 90) return "the cluster form needs sm_90 (thread-block clusters)";
  if (facts.code_arch < 90) {
    return "the cluster form needs sm_90 code in _C (this device runs its sm_" + std::to_string(facts.code_arch) +
           " code, where the cluster kernel is a stub)";
  }
  if (cl.splits == 0) return "the cluster form needs V <= C * 16384 for a cluster of C CTAs the device schedules";
  if (B * cl.splits > lim.grid_x) return "the cluster form's grid B * C > grid x";
  // A row's CTAs wait on each other at every stage, so rows whose clusters wait for a free slot run in later
  // rounds: past one wave the split form (work stealing, no co-residency) is the faster one.
  if (B > facts.active[cl.splits]) {
    return "the cluster form's " + std::to_string(B) + " clusters of " + std::to_string(cl.splits) +
           " CTAs do not fit one wave (" + std::to_string(facts.active[cl.splits]) + " at once)";
  }
  return "";
}

}  // namespace

ClusterFacts nominal_cluster_facts(const DeviceLimits& lim) {
  ClusterFacts facts{};
  facts.code_arch = lim.arch;
  const int most = lim.arch < 90 ? 0
                   : lim.arch == 90 || lim.arch == 100 ? kTreeRejectionMaxCluster
                                                       : kTreeRejectionPortableCluster;
  for (int c = 1; c <= most; ++c) facts.active[c] = kTreeRejectionBlocksPerSM * std::max(lim.sms, 1) / c;
  return facts;
}

int runnable_code_arch(int device_arch, const std::vector<std::string>& built) {
  int sass = 0, ptx = 0;
  for (const std::string& name : built) {
    const bool specific = !name.empty() && name.back() == 'a';  // sm_90a: that arch alone
    const int a = std::stoi(specific ? name.substr(0, name.size() - 1) : name);
    const bool runs = specific ? a == device_arch : a / 10 == device_arch / 10 && a <= device_arch;
    if (runs) sass = std::max(sass, a);
    const bool newer = ptx == 0 || a > std::abs(ptx);
    if (newer) ptx = specific ? -a : a;  // the highest arch's PTX ships (negative: arch-specific)
  }
  if (sass > 0) return sass;
  if (ptx > 0 && ptx <= device_arch) return ptx;
  if (ptx < 0 && -ptx == device_arch) return -ptx;
  return 0;
}

Plan plan_tree_rejection_sample(int64_t B, int64_t N, int64_t V, const DeviceLimits& lim, int form,
                                const ClusterFacts* facts) {
  const char* op = "tree_rejection_sample";
  require(B >= 0 && N >= 0 && V >= 0, op, "B, N and V must be >= 0");
  require(form == kTreeFormAuto || form == kTreeFormSplit || form == kTreeFormCluster, op,
          "form must be 0 (auto), 1 (split) or 2 (cluster)");
  if (V < 1 || V >= kRejectionMaxVocab) return refused("V must be in [1, 2^23) (fixed-point totals stay exact below)");
  if (N > kInt32Max / 4) return refused("N >= 2^29");
  const ClusterFacts known = facts != nullptr ? *facts : nominal_cluster_facts(lim);
  // The cluster form where the device runs its sm_90 code, a cluster it schedules holds a row's slices, and
  // every row's cluster fits on the device at once.
  const SplitPlan cl = tree_rejection_cluster(B, V, known);
  const std::string no_cluster = no_cluster_form(B, cl, lim, known);
  if (form == kTreeFormCluster && !no_cluster.empty()) return refused(no_cluster);
  const bool cluster = form != kTreeFormSplit && no_cluster.empty();
  // the tree copied into shared memory for the walk's serial part, where it is small enough
  const int64_t tree_smem = N <= kTreeRejectionSharedNodes ? 16 * N : 0;
  Plan plan;
  if (cluster) {
    // state and rank table only: the partial sums live in the CTAs' shared memory
    const int64_t stride = kTreeRejectionStateWords + 2 * N;
    plan.values = {{"scratch_stride", stride},
                   {"scratch_bytes", B * stride * 8},
                   {"zeroed_bytes", 0},
                   {"ctas_per_sm", kTreeRejectionBlocksPerSM},
                   {"form", kTreeFormCluster}};
    if (B == 0) return plan;
    plan.values["chunks"] = cl.splits;
    plan.values["chunk"] = cl.chunk;
    plan.values["cluster"] = cl.splits;
    plan.values["portable"] = cl.splits <= kTreeRejectionPortableCluster ? 1 : 0;
    plan.values["tree_in_smem"] = tree_smem > 0 ? 1 : 0;
    return check(plan, add_launch(plan, "tree_rejection_cluster_kernel", B * cl.splits, 1, 1, kTreeRejectionThreads,
                                  kTreeRejectionClusterStaticSmem, tree_smem, lim));
  }
  const int64_t stride = kTreeRejectionStateWords + 2 * N + kTreeRejectionMaxChunks * kTreeRejectionPartWords;
  plan.values = {{"scratch_stride", stride},
                 {"scratch_bytes", B * stride * 8},
                 {"zeroed_bytes", B * kTreeRejectionSyncWords * 8},
                 {"ctas_per_sm", kTreeRejectionBlocksPerSM},
                 {"form", kTreeFormSplit}};
  if (B == 0) return plan;
  const SplitPlan s = tree_rejection_splits(B, V, lim.sms);
  plan.values["chunks"] = s.splits;
  plan.values["chunk"] = s.chunk;
  plan.values["cluster"] = 0;
  plan.values["tree_in_smem"] = tree_smem > 0 ? 1 : 0;
  return check(plan, add_launch(plan, "tree_rejection_split_kernel", B, s.splits, 1, kTreeRejectionThreads,
                                kTreeRejectionStaticSmem, tree_smem, lim));
}

}  // namespace plans
}  // namespace specdec
