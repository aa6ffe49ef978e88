#pragma once
// The index arithmetic of the tree-attention kernels (attention.cu), host- and
// device-compilable so that CPU-only CI checks the exact functions the kernels call
// (bind_attention.cpp exposes them as _C.host_tree_attention_*):
//   * which keys each prefix split of a row owns,
//   * the per-node ancestor bits of one key tile (the tree mask),
//   * the log-sum-exp merge of the splits' partial softmax states.
// Scores live in the log2 domain inside the kernels (x = q.k * scale * log2(e)).

#include <cmath>
#include <cstdint>

#include "host_device.cuh"

namespace specdec {
namespace tree_attn {

// Split boundaries are multiples of kKeyAlign, so a key tile (64 keys in the MMA
// kernel, 16 in the SIMT one) never straddles two splits, and a split is never
// shorter than kMinSplitKeys (below that the partial's write + merge cost more
// than the extra parallelism buys).
constexpr int kKeyAlign = 64;
constexpr int kMinSplitKeys = 256;
constexpr int kMaxSplits = 64;

// The prefix length actually used for a row: seq_lens[b] clamped so that the
// row's keys [0, prefix + N) stay inside the cache whatever the caller passed
// (validated inputs are unchanged by the clamp). Needs capacity >= N.
SPECDEC_HD int64_t clamp_prefix(int64_t seq_len, int64_t capacity, int64_t N) {
  const int64_t hi = capacity - N;
  return seq_len < 0 ? 0 : (seq_len > hi ? hi : seq_len);
}

// How a row of `keys` keys (prefix + N >= 1) is cut into at most `splits`
// pieces: split s owns [s * chunk, min((s + 1) * chunk, keys)) for s < active.
// Computed on the device from the row's own length, so every row is split
// evenly whatever S_max is, and identically by every CTA of the row.
struct RowSplit {
  int64_t chunk;
  int active;
};

SPECDEC_HD RowSplit row_split(int64_t keys, int splits) {
  int64_t chunk = (keys + splits - 1) / splits;
  chunk = (chunk + kKeyAlign - 1) / kKeyAlign * kKeyAlign;
  if (chunk < kMinSplitKeys) chunk = kMinSplitKeys;
  return {chunk, static_cast<int>((keys + chunk - 1) / chunk)};
}

// The tree mask of one key tile for one node: bit j (j < width <= 64) is set
// when tree node w0 + j is `node` itself or one of its ancestors. w0 may be
// negative (a tile that starts in the prefix); prefix keys are visible anyway
// and are not part of the window. parent_of(i) reads parents[b, i] (int64);
// a value outside [0, i) ends the walk, so the root, unused slots and even
// malformed input keep the walk finite and every read inside [0, node].
template <typename ParentOf>
SPECDEC_HD uint64_t ancestor_window(int node, int w0, int width, ParentOf parent_of) {
  uint64_t bits = 0;
  int cur = node;
  while (cur >= 0 && cur >= w0) {  // parents come before children: stop below the window
    if (cur < w0 + width) bits |= 1ull << (cur - w0);
    if (cur == 0) break;
    const int64_t par = parent_of(cur);
    if (par < 0 || par >= cur) break;
    cur = static_cast<int>(par);
  }
  return bits;
}

// The same window for a causal chain (parents=None): nodes max(w0, 0) .. node.
SPECDEC_HD uint64_t chain_window(int node, int w0, int width) {
  const int lo = w0 < 0 ? -w0 : 0;                               // first j with w0 + j >= 0
  const int hi = node - w0 + 1 < width ? node - w0 + 1 : width;  // one past the last j <= node
  if (hi <= lo) return 0;
  const uint64_t below_hi = hi >= 64 ? ~0ull : (1ull << hi) - 1;
  const uint64_t below_lo = (1ull << lo) - 1;  // lo < hi <= 64, so lo <= 63
  return below_hi & ~below_lo;
}

// The running-max offset of the online softmax: a row that has seen no
// visible key yet (max -inf) uses 0, so exp2(-inf - 0) = 0 and never NaN.
SPECDEC_HD float softmax_offset(float running_max) {
  return running_max == -INFINITY ? 0.0f : running_max;
}

// Weight of a split's partial state (m_s, l_s, acc_s) in the merged row whose
// largest max is m_max: merged l = sum_s l_s * w_s, acc = sum_s acc_s * w_s.
SPECDEC_HD float split_weight(float m_s, float m_max) {
  return m_s == -INFINITY ? 0.0f : exp2f(m_s - m_max);
}

// Natural-log log-sum-exp of the scaled scores from the log2-domain state.
SPECDEC_HD float natural_lse(float m, float l) {
  return (m + log2f(l)) * 0.69314718055994530942f;
}

}  // namespace tree_attn
}  // namespace specdec
