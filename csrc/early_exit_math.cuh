#pragma once
// Running top-k arithmetic of early_exit_topk, host- and device-compilable, so the
// CPU emulation in bind_early_exit.cpp runs the kernel's own selection logic.
//
// A candidate is one u64 key (ordered_key.cuh): order-preserving logit bits << 32 |
// (2^32 - 1 - id). One integer compare orders by logit, then by the lower id; NaN packs
// as -inf. Real keys are >= 0x007FFFFF << 32 (the key of -inf), so the fill keys
// 0..k-1 that start a kept set sit below every real key and are never returned while
// k <= V real keys exist.

#include <cstdint>
#include <cstring>

#include "logit_math.cuh"
#include "ordered_key.cuh"

namespace specdec {
namespace early_exit {

constexpr int kMaxK = 16;  // largest k the fused kernels run

SPECDEC_HD unsigned long long logit_key(float logit, uint32_t id) {
  return make_argmax_key(order_preserving_bits_from_raw(logit::bits_of(logit)), id);
}

SPECDEC_HD float key_logit(unsigned long long key) {
  const uint32_t raw = raw_bits_from_order_preserving(argmax_key_order(key));
  float x;
  static_assert(sizeof(x) == sizeof(raw), "float32");
  memcpy(&x, &raw, sizeof(x));
  return x;
}

// Kept set of k unsorted, distinct keys whose minimum is `thresh`: start with the fill
// keys 0..k-1; a key above the minimum replaces it.
SPECDEC_HD void kept_init(unsigned long long* kept, int k, unsigned long long& thresh) {
  for (int j = 0; j < k; ++j) kept[j] = static_cast<unsigned long long>(j);
  thresh = 0ull;
}

SPECDEC_HD void kept_offer(unsigned long long* kept, int k, unsigned long long key,
                           unsigned long long& thresh) {
  if (key <= thresh) return;
  unsigned long long low = ~0ull;
  bool replaced = false;
  for (int j = 0; j < k; ++j) {
    if (!replaced && kept[j] == thresh) {  // keys are distinct: exactly one slot holds the minimum
      kept[j] = key;
      replaced = true;
    }
    low = kept[j] < low ? kept[j] : low;
  }
  thresh = low;
}

// A descending kMaxK-slot list with compile-time indices only (stays in registers):
// insert shifts the smaller entries down by one.
SPECDEC_HD void sorted_insert(unsigned long long (&list)[kMaxK], unsigned long long key) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = kMaxK - 1; j >= 0; --j) {
    const unsigned long long above = j > 0 ? list[j - 1] : ~0ull;
    if (key > list[j]) list[j] = key > above ? above : key;  // take the key or the entry above
  }
}

// Drops the head of a descending list (the merge popped it).
SPECDEC_HD void sorted_pop(unsigned long long (&list)[kMaxK]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < kMaxK - 1; ++j) list[j] = list[j + 1];
  list[kMaxK - 1] = 0ull;
}

// How the vocabulary is cut: `splits` contiguous slices of `per_split` rows (the last
// may be shorter, none is empty), rows_per_cta batch rows per CTA.
struct Plan {
  int64_t per_split;
  int splits;
  int row_groups;
  int rows_per_cta;
};

constexpr int kRowsPerCta = 8;  // batch rows a CTA multiplies each weight row with
constexpr int kWarps = 8;

// rows_per_cta: most batch rows per CTA (fewer when a long H leaves no shared memory for 8).
SPECDEC_HD Plan make_plan(int64_t B, int64_t V, int sms, int ctas_per_sm, int rows_per_cta = kRowsPerCta) {
  Plan p{};
  const int64_t rows = rows_per_cta < 1 ? 1 : (rows_per_cta > kRowsPerCta ? kRowsPerCta : rows_per_cta);
  p.rows_per_cta = static_cast<int>(B < rows ? B : rows);
  p.row_groups = static_cast<int>((B + rows - 1) / rows);
  // about one full wave of CTAs over all row groups, each slice at least 4 rows per warp
  int64_t wanted = static_cast<int64_t>(sms) * ctas_per_sm / p.row_groups;
  const int64_t most = (V + 4 * kWarps - 1) / (4 * kWarps);
  wanted = wanted < 1 ? 1 : (wanted > most ? most : wanted);
  p.per_split = (V + wanted - 1) / wanted;
  p.splits = static_cast<int>((V + p.per_split - 1) / p.per_split);
  return p;
}

}  // namespace early_exit
}  // namespace specdec
