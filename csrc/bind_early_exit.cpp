// Python bindings of early_exit_topk (early_exit.h), plus a host emulation of the
// kernels' top-k selection for CPU-only tests.
//
// The emulation takes finished float32 logits (the GEMV itself can only be checked on
// a GPU) and runs the kernels' selection over their structure: the plan's vocabulary
// slices, each warp's kept set fed the rows v = start + warp, += 8 (early_exit_math.cuh),
// the per-CTA merge of the warps' sets (k rounds, strictly decreasing), then the merge
// kernel's per-thread sorted lists and k block-max pops.
//
// host_early_exit_mma emulates the tensor-core path whole (early_exit_mma.cuh): the hi/lo
// split, the k-block staging, every lane's 16-byte loads and the registers built from them,
// a software m16n8k16 that reads those registers through the PTX fragment layout (fp32
// products and sums), the epilogue's (vocab id, batch column) of each accumulator and the
// kept sets, the per-CTA merge and the merge kernel.

#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "early_exit_math.cuh"
#include "early_exit_mma.cuh"
#include "early_exit.h"
#include "launch_plan.h"
#include "registry.h"

namespace py = pybind11;

namespace {

using specdec::device_ptr;
namespace ee = specdec::early_exit;
using Key = unsigned long long;

void early_exit_topk(uint64_t hidden, int64_t hidden_stride, uint64_t norm_weight, uint64_t norm_bias,
                     int norm_dtype, uint64_t lm_head, int64_t lm_head_stride, uint64_t values, uint64_t indices,
                     uint64_t workspace, uint64_t workspace_bytes, int64_t B, int64_t H, int64_t V, int64_t k,
                     int dtype, int norm, double eps, uint64_t stream) {
  specdec::launch_early_exit_topk(
      device_ptr<const void>(hidden), hidden_stride, device_ptr<const void>(norm_weight),
      device_ptr<const void>(norm_bias), norm_dtype, device_ptr<const void>(lm_head), lm_head_stride,
      device_ptr<float>(values), device_ptr<int64_t>(indices), device_ptr<void>(workspace), workspace_bytes, B, H,
      V, k, dtype, norm, eps, reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
}

void check_host(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("host_early_exit_select: ") + what);
}

// The merge kernel over one row's candidates: per-thread sorted lists, k block-max pops.
void merge_row(const std::vector<Key>& cand, int k, int merge_threads, float* values, int64_t* ids) {
  std::vector<std::vector<Key>> lists(static_cast<size_t>(merge_threads));
  Key sorted[ee::kMaxK];
  for (int t = 0; t < merge_threads; ++t) {
    std::fill(sorted, sorted + ee::kMaxK, 0ull);
    for (size_t i = t; i < cand.size(); i += merge_threads) ee::sorted_insert(sorted, cand[i]);
    lists[t].assign(sorted, sorted + ee::kMaxK);
  }
  for (int j = 0; j < k; ++j) {
    Key best = 0;
    for (const auto& list : lists) best = std::max(best, list[0]);
    for (auto& list : lists) {
      if (list[0] == best) {
        std::copy(list.begin(), list.end(), sorted);
        ee::sorted_pop(sorted);
        list.assign(sorted, sorted + ee::kMaxK);
      }
    }
    values[j] = ee::key_logit(best);
    ids[j] = specdec::argmax_key_index(best);
  }
}

// logits: float32 [B, V] flat. Returns (values [B*k], ids [B*k], splits used).
std::tuple<std::vector<float>, std::vector<int64_t>, int> host_early_exit_select(
    const std::vector<float>& logits, int64_t B, int64_t V, int k, int sms, int ctas_per_sm, int merge_threads) {
  check_host(B >= 1 && V >= 1 && k >= 1 && k <= ee::kMaxK && k <= V && merge_threads >= 1, "bad sizes");
  check_host(logits.size() == static_cast<size_t>(B * V), "logits size");
  const ee::Plan p = ee::make_plan(B, V, sms, ctas_per_sm);
  std::vector<float> values(static_cast<size_t>(B * k));
  std::vector<int64_t> ids(static_cast<size_t>(B * k));
  for (int64_t b = 0; b < B; ++b) {
    const float* row = logits.data() + b * V;
    std::vector<Key> cand;
    for (int s = 0; s < p.splits; ++s) {
      const int64_t v0 = s * p.per_split, v1 = std::min(V, v0 + p.per_split);
      std::vector<Key> kept(static_cast<size_t>(ee::kWarps * k));
      for (int w = 0; w < ee::kWarps; ++w) {
        Key thresh = 0;
        ee::kept_init(&kept[w * k], k, thresh);
        for (int64_t v = v0 + w; v < v1; v += ee::kWarps) {
          ee::kept_offer(&kept[w * k], k, ee::logit_key(row[v], static_cast<uint32_t>(v)), thresh);
        }
      }
      Key prev = ~0ull;
      for (int j = 0; j < k; ++j) {
        Key best = 0;
        for (const Key key : kept) {
          if (key < prev && key > best) best = key;
        }
        cand.push_back(best);
        prev = best;
      }
    }
    merge_row(cand, k, merge_threads, values.data() + b * k, ids.data() + b * k);
  }
  return {values, ids, p.splits};
}

void check_mma(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("host_early_exit_mma: ") + what);
}

// hn: float32 [B, H] normalised hidden states; weight: [V, H] 16-bit patterns of `dtype`
// (1 fp16, 2 bf16). per_split / k_block / n_tiles: the plan's values (launch_plan
// "early_exit_topk" with dtype). Returns (values [B*k], ids [B*k]).
std::tuple<std::vector<float>, std::vector<int64_t>> host_early_exit_mma(
    const std::vector<float>& hn, const std::vector<int>& weight, int64_t B, int64_t H, int64_t V, int k, int dtype,
    int64_t per_split, int k_block, int n_tiles) {
  constexpr int W = ee::kMmaWarps;
  check_mma(B >= 1 && H >= 1 && V >= 1 && k >= 1 && k <= ee::kMaxK && k <= V, "bad sizes");
  check_mma(H % 8 == 0, "H must be a multiple of 8 (the kernel's 16-byte loads; other H take the SIMT path)");
  check_mma(dtype == 1 || dtype == 2, "dtype must be 1 (float16) or 2 (bfloat16)");
  check_mma(hn.size() == static_cast<size_t>(B * H) && weight.size() == static_cast<size_t>(V * H), "sizes");
  check_mma(n_tiles == ee::n_tiles_for(B) && k_block >= ee::kChunk && k_block % ee::kChunk == 0, "plan");
  const int MT = ee::m_tiles_for(n_tiles), BN = 8 * n_tiles, vt = ee::vocab_tile(n_tiles);
  check_mma(per_split >= 1 && per_split % vt == 0, "per_split must be a multiple of the vocabulary tile");
  const int64_t hs = (H + ee::kChunk - 1) / ee::kChunk * ee::kChunk;
  const int64_t col_groups = (B + BN - 1) / BN, rows = col_groups * BN;
  // launch 1: the hi / lo arrays of the workspace (zeros past H and B)
  std::vector<uint16_t> hi(static_cast<size_t>(rows * hs), 0), lo(hi.size(), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) ee::split_hi_lo(hn[b * H + h], dtype, hi[b * hs + h], lo[b * hs + h]);
  auto word = [](const uint16_t* p) { return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 16; };
  auto half_of = [dtype](uint32_t w, int half) { return ee::from_bits16(static_cast<uint16_t>(w >> (16 * half)), dtype); };
  std::vector<uint16_t> wbits(weight.size());
  for (size_t i = 0; i < weight.size(); ++i) wbits[i] = static_cast<uint16_t>(weight[i]);
  const int64_t splits = (V + per_split - 1) / per_split;
  const int64_t nchunks = hs / ee::kChunk;
  const int cpk = k_block / ee::kChunk;
  const int64_t stride = ee::smem_stride(k_block);
  std::vector<std::vector<Key>> cand(static_cast<size_t>(B));
  std::vector<uint16_t> s_hi(static_cast<size_t>(BN * stride)), s_lo(s_hi.size());
  for (int64_t cg = 0; cg < col_groups; ++cg) {
    const int64_t col0 = cg * BN;
    for (int64_t split = 0; split < splits; ++split) {
      const int64_t v0 = split * per_split, v1 = std::min(V, v0 + per_split);
      std::vector<Key> kept(static_cast<size_t>(W * BN * k)), thresh(static_cast<size_t>(W * BN));
      for (int i = 0; i < W * BN; ++i) ee::kept_init(&kept[i * k], k, thresh[i]);
      auto stage = [&](int64_t kb) {
        for (int r = 0; r < BN; ++r)
          for (int p = 0; p < k_block; ++p) {
            const int64_t col = kb * k_block + p;
            s_hi[r * stride + p] = col < hs ? hi[(col0 + r) * hs + col] : 0;
            s_lo[r * stride + p] = col < hs ? lo[(col0 + r) * hs + col] : 0;
          }
      };
      for (int64_t vbase = v0; vbase < v1; vbase += vt) {
        // acc[warp][mt][nt][lane][i]
        std::vector<float> acc(static_cast<size_t>(W * MT * n_tiles * 32 * 4), 0.0f);
        auto at = [&](int w, int mt, int nt, int lane, int i) -> float& {
          return acc[((((static_cast<size_t>(w) * MT + mt) * n_tiles + nt) * 32 + lane) * 4) + i];
        };
        for (int64_t c = 0; c < nchunks; ++c) {
          const int cc = static_cast<int>(c % cpk);
          if (cc == 0) stage(c / cpk);  // resident or not, the same values land in the tile
          for (int w = 0; w < W; ++w) {
            const int64_t vw = vbase + static_cast<int64_t>(w) * 16 * MT;
            // every lane's 16-byte loads: weight rows (zeros past the slice / H), hn from the tile
            uint32_t wreg[32][2][2][4] = {};  // [lane][mt][half][word] (mt < 2)
            uint32_t hreg[32][ee::kMmaMaxNTiles][4] = {}, lreg[32][ee::kMmaMaxNTiles][4] = {};
            for (int lane = 0; lane < 32; ++lane) {
              const int64_t col = c * ee::kChunk + ee::load_col(lane);
              for (int mt = 0; mt < MT; ++mt)
                for (int half = 0; half < 2; ++half) {
                  const int64_t v = vw + mt * 16 + ee::load_row(lane, half);
                  if (v < v1 && col < H)
                    for (int j = 0; j < 4; ++j) wreg[lane][mt][half][j] = word(&wbits[v * H + col + 2 * j]);
                }
              for (int nt = 0; nt < n_tiles; ++nt) {
                const int64_t off = (nt * 8 + ee::load_row(lane, 0)) * stride + cc * ee::kChunk + ee::load_col(lane);
                for (int j = 0; j < 4; ++j) {
                  hreg[lane][nt][j] = word(&s_hi[off + 2 * j]);
                  lreg[lane][nt][j] = word(&s_lo[off + 2 * j]);
                }
              }
            }
            for (int nt = 0; nt < n_tiles; ++nt)
              for (int s = 0; s < 2; ++s)
                for (int mt = 0; mt < MT; ++mt)
                  for (int pass = 0; pass < 2; ++pass) {  // hi, then lo
                    float A[16][16] = {}, Bm[16][8] = {};
                    for (int lane = 0; lane < 32; ++lane) {
                      uint32_t ar[4], b[2];
                      ee::a_regs(wreg[lane][mt][0], wreg[lane][mt][1], s, ar);
                      ee::b_regs(pass == 0 ? hreg[lane][nt] : lreg[lane][nt], s, b[0], b[1]);
                      for (int e = 0; e < 8; ++e) A[ee::mma_a_row(lane, e)][ee::mma_a_col(lane, e)] = half_of(ar[e >> 1], e & 1);
                      for (int e = 0; e < 4; ++e) Bm[ee::mma_b_k(lane, e)][ee::mma_b_n(lane, e)] = half_of(b[e >> 1], e & 1);
                    }
                    for (int lane = 0; lane < 32; ++lane)
                      for (int i = 0; i < 4; ++i) {
                        float sum = 0.0f;
                        for (int kk = 0; kk < 16; ++kk) sum += A[ee::mma_c_row(lane, i)][kk] * Bm[kk][ee::mma_c_col(lane, i)];
                        at(w, mt, nt, lane, i) += sum;
                      }
                  }
          }
        }
        // epilogue
        for (int w = 0; w < W; ++w) {
          const int64_t vw = vbase + static_cast<int64_t>(w) * 16 * MT;
          for (int mt = 0; mt < MT; ++mt)
            for (int nt = 0; nt < n_tiles; ++nt)
              for (int i = 0; i < 4; ++i)
                for (int lane = 0; lane < 32; ++lane) {
                  const int64_t v = ee::epilogue_vocab(vw, mt, lane, i);
                  const int col = ee::epilogue_col(nt, lane, i);
                  if (v >= v1 || col0 + col >= B) continue;
                  const Key key = ee::logit_key(at(w, mt, nt, lane, i), static_cast<uint32_t>(v));
                  ee::kept_offer(&kept[(static_cast<size_t>(w) * BN + col) * k], k, key, thresh[w * BN + col]);
                }
        }
      }
      // the CTA's merge of its warps' sets: k rounds, strictly decreasing
      for (int col = 0; col < BN; ++col) {
        const int64_t row = col0 + col;
        if (row >= B) continue;
        Key prev = ~0ull;
        for (int j = 0; j < k; ++j) {
          Key best = 0;
          for (int w = 0; w < W; ++w)
            for (int q = 0; q < k; ++q) {
              const Key key = kept[(static_cast<size_t>(w) * BN + col) * k + q];
              if (key < prev && key > best) best = key;
            }
          cand[row].push_back(best);
          prev = best;
        }
      }
    }
  }
  std::vector<float> values(static_cast<size_t>(B * k));
  std::vector<int64_t> ids(static_cast<size_t>(B * k));
  for (int64_t b = 0; b < B; ++b) merge_row(cand[b], k, specdec::plans::kEarlyExitMergeThreads, &values[b * k], &ids[b * k]);
  return {values, ids};
}

// The hi / lo split and the 16-bit roundings the kernels use (float32 values -> (hi, lo) bit patterns).
std::tuple<std::vector<int>, std::vector<int>> host_early_exit_split(const std::vector<float>& x, int dtype) {
  check_mma(dtype == 1 || dtype == 2, "dtype must be 1 (float16) or 2 (bfloat16)");
  std::vector<int> hi(x.size()), lo(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t h, l;
    ee::split_hi_lo(x[i], dtype, h, l);
    hi[i] = h;
    lo[i] = l;
  }
  return {hi, lo};
}

// The PTX m16n8k16 layout functions, [lane][element] -> (row, col), for the test that pins them.
py::dict host_mma_layout() {
  py::dict d;
  py::list a, b, c, load;
  for (int lane = 0; lane < 32; ++lane) {
    py::list ar, br, cr;
    for (int e = 0; e < 8; ++e) ar.append(py::make_tuple(ee::mma_a_row(lane, e), ee::mma_a_col(lane, e)));
    for (int e = 0; e < 4; ++e) br.append(py::make_tuple(ee::mma_b_k(lane, e), ee::mma_b_n(lane, e)));
    for (int i = 0; i < 4; ++i) cr.append(py::make_tuple(ee::mma_c_row(lane, i), ee::mma_c_col(lane, i)));
    a.append(ar);
    b.append(br);
    c.append(cr);
    load.append(py::make_tuple(ee::load_row(lane, 0), ee::load_row(lane, 1), ee::load_col(lane)));
  }
  d["a"] = a;
  d["b"] = b;
  d["c"] = c;
  d["load"] = load;
  return d;
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("early_exit_topk_workspace_bytes", &specdec::early_exit_topk_workspace_bytes, py::arg("B"), py::arg("H"),
        py::arg("V"), py::arg("k"), py::arg("dtype") = 0, py::arg("aligned") = true,
        "Bytes of zeroed workspace early_exit_topk needs on the current device (left zeroed after use). "
        "dtype: the weights' code; aligned: LM head 16-byte aligned with a row stride that is a multiple of 8.");
  m.def("host_early_exit_mma", &host_early_exit_mma, py::arg("hn"), py::arg("weight"), py::arg("B"), py::arg("H"),
        py::arg("V"), py::arg("k"), py::arg("dtype"), py::arg("per_split"), py::arg("k_block"), py::arg("n_tiles"),
        "CPU emulation of the tensor-core early_exit_topk (fragments, epilogue, merges) on normalised "
        "float32 hidden states and 16-bit weight patterns (testing only).");
  m.def("host_early_exit_split", &host_early_exit_split, py::arg("x"), py::arg("dtype"),
        "The kernels' hi / lo split of float32 values into 16-bit patterns (testing only).");
  m.def("host_mma_layout", &host_mma_layout, "The m16n8k16 fragment layout functions (testing only).");
  m.def("early_exit_topk", &early_exit_topk, py::arg("hidden"), py::arg("hidden_stride"), py::arg("norm_weight"),
        py::arg("norm_bias"), py::arg("norm_dtype"), py::arg("lm_head"), py::arg("lm_head_stride"),
        py::arg("values"), py::arg("indices"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("B"),
        py::arg("H"), py::arg("V"), py::arg("k"), py::arg("dtype"), py::arg("norm"), py::arg("eps"),
        py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Fused norm + LM head + top-k on `stream` (two kernel launches, no sync). norm: 0 none, 1 rms, "
        "2 layer; norm_weight / norm_bias may be 0; 1 <= k <= min(16, V).");
  m.def("host_early_exit_select", &host_early_exit_select, py::arg("logits"), py::arg("B"), py::arg("V"),
        py::arg("k"), py::arg("sms"), py::arg("ctas_per_sm"), py::arg("merge_threads"),
        "CPU emulation of the early_exit_topk kernels' top-k selection over given logits (testing only).");
});

}  // namespace
