// 4-bit panels (panel_gemm.cpp's layout) times int8 activations: decode-sized products
// as integer dot products, the way llama.cpp multiplies Q4 weights by Q8 activations.
//
// Why: at a few rows the float path (panel_gemm) spends ~10 instructions per column of a
// panel unpacking 16 codes to floats and multiplying each row in, so one row runs at 3-4
// GB/s of codes, far under memory bandwidth. Here four columns of a panel (32 bytes: 64
// codes) become two registers of unsigned bytes, and one `maddubs` per register multiplies
// them by the row's int8 activations and adds pairs: about a quarter of the instructions.
//
// The arithmetic. Each row of x is quantized per block of 32 columns (QBLOCK): d = max|x|
// / 127, qx = round(x / d), so x ~ d qx. For a panel row n and a group g of the weights
// (W = s v + c over the group's columns):
//     sum_k x_k W[n, k] = s[n, g] sum_blocks d_b (sum_k qx_k v[n, k]) + c[n, g] sum_k x_k
// The integer sums are exact: a code times qx is at most 15 x 127, a pair 3,810, and eight
// steps of four columns (a block) add at most 30,480 into each 16-bit lane before they
// widen to 32 bits. The offset term uses the float sum of x, so only the activation
// rounding (relative 1/254 per block at most) separates this from panel_gemm's result.
// Used for 16-bit activations only (gguf_cpu.py): float32 models keep the exact path.
//
// Two tiles, chosen when the kernels are built (-march=native): AVX-512 VNNI's `dpbusd`
// where the CPU has it (q8_tile_vnni, below), else AVX2's `maddubs` (q8_tile). Both give
// the same sums in the same order: bit-identical results.
//
// Activation patterns (the AVX2 tile): for columns k..k+3, maddubs needs (qx_k, qx_k+1) in every pair of
// the low 128-bit lane and (qx_k+2, qx_k+3) in the high one, matching the weight bytes
// after one shuffle (row j's codes at k and k+1 side by side). They are built once per
// call, 8 bytes per column of each row, and read by every panel.

#include "panels.h"

#include <type_traits>

#if defined(CADENCE_PANEL_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define CADENCE_PANEL_VNNI 1  // (-march=native on a CPU with AVX-512 VNNI and VBMI)
#endif

namespace cadence_cpu {

bool panel_q8_available() {
#ifdef CADENCE_PANEL_AVX2
  return true;
#else
  return false;
#endif
}

#ifdef CADENCE_PANEL_AVX2
namespace {

constexpr int64_t QBLOCK = 32;  // columns an activation scale covers (and the int16 bound)
constexpr int MRQ = 4;          // batch rows a tile multiplies

// f(std::integral_constant<int, mr>) for a tile of mr <= Max rows (its row count compiled in).
template <int Max, typename F>
void with_tile_rows(int mr, F&& f) {
  if constexpr (Max > 1) {
    if (mr < Max) return with_tile_rows<Max - 1>(mr, f);
  }
  f(std::integral_constant<int, Max>{});
}

// Rows of x [M, K] (float32) -> int8 codes qx [M, K], block scales d [M, K / QBLOCK] and
// group sums [M, K / group].
void quantize_rows(const float* x, int64_t M, int64_t K, int64_t group, int8_t* qx, float* d,
                   float* sums) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    for (int64_t g = 0; g < K / group; ++g) {
      float s = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) s += xr[k];
      sums[m * (K / group) + g] = s;
    }
    for (int64_t b = 0; b < K / QBLOCK; ++b) {
      const float* xb = xr + b * QBLOCK;
      float amax = 0.0f;
      for (int64_t i = 0; i < QBLOCK; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      d[m * (K / QBLOCK) + b] = scale;
      int8_t* qb = qx + m * K + b * QBLOCK;
      for (int64_t i = 0; i < QBLOCK; ++i)
        qb[i] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, std::nearbyint(xb[i] * inv))));
    }
  }
}

// int8 codes [M, K] -> the AVX2 tile's patterns [M, K * 8] (see the top of the file).
[[maybe_unused]] void expand_patterns(const int8_t* qx, int64_t M, int64_t K, int8_t* pat) {
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; k += 4) {
      int32_t four;
      std::memcpy(&four, qx + m * K + k, 4);
      const __m256i p = _mm256_shuffle_epi8(_mm256_set1_epi32(four), spread);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pat + m * K * 8 + k * 8), p);
    }
}

// MR_ rows against one panel (q [K, 8] bytes, sc [K / group, 2, 16]), all of K, into
// acc [MR_, 16].
template <int MR_, typename S>
void q8_tile(const int8_t* pat, const float* d, const float* sums, int64_t K, int64_t group,
             const uint8_t* q, const S* sc, float* acc) {
  const __m256i nib = _mm256_set1_epi8(15);
  // row j's codes at columns k, k+1 side by side (low lane), k+2, k+3 (high lane)
  const __m256i pairs = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                         0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  const int64_t nb = K / QBLOCK, ng = K / group;
  __m256 t0[MR_], t1[MR_];
  for (int r = 0; r < MR_; ++r) t0[r] = t1[r] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    __m256 f0[MR_], f1[MR_];  // sum over the group's blocks of d_b times the integer sums
    for (int r = 0; r < MR_; ++r) f0[r] = f1[r] = _mm256_setzero_ps();
    for (int64_t b0 = g0; b0 < g0 + group; b0 += QBLOCK) {
      __m256i lo[MR_], hi[MR_];
      for (int r = 0; r < MR_; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
      for (int64_t k = b0; k < b0 + QBLOCK; k += 4) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 8));
        const __m256i wl = _mm256_shuffle_epi8(_mm256_and_si256(w, nib), pairs);
        const __m256i wh = _mm256_shuffle_epi8(_mm256_and_si256(_mm256_srli_epi16(w, 4), nib), pairs);
        for (int r = 0; r < MR_; ++r) {
          const __m256i xp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pat + r * K * 8 + k * 8));
          lo[r] = _mm256_add_epi16(lo[r], _mm256_maddubs_epi16(wl, xp));
          hi[r] = _mm256_add_epi16(hi[r], _mm256_maddubs_epi16(wh, xp));
        }
      }
      for (int r = 0; r < MR_; ++r) {
        const __m256 db = _mm256_set1_ps(d[r * nb + b0 / QBLOCK]);
        const __m256i i0 = _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(lo[r])),
                                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(lo[r], 1)));
        const __m256i i1 = _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(hi[r])),
                                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(hi[r], 1)));
        f0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), db, f0[r]);
        f1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), db, f1[r]);
      }
    }
    const S* sg = sc + (g0 / group) * 2 * PANEL;
    const __m256 s0 = load8(sg), s1 = load8(sg + 8), c0 = load8(sg + 16), c1 = load8(sg + 24);
    for (int r = 0; r < MR_; ++r) {
      const __m256 sx = _mm256_set1_ps(sums[r * ng + g0 / group]);
      t0[r] = _mm256_fmadd_ps(c0, sx, _mm256_fmadd_ps(f0[r], s0, t0[r]));
      t1[r] = _mm256_fmadd_ps(c1, sx, _mm256_fmadd_ps(f1[r], s1, t1[r]));
    }
  }
  for (int r = 0; r < MR_; ++r) {
    _mm256_storeu_ps(acc + r * PANEL, t0[r]);
    _mm256_storeu_ps(acc + r * PANEL + 8, t1[r]);
  }
}

#ifdef CADENCE_PANEL_VNNI
// AVX-512 VNNI: the same sums, one instruction per (4 columns, 16 panel rows, batch row).
// Four columns' 32 bytes of codes unpack to 64 bytes (low nibbles: rows 0-7, then high
// nibbles: rows 8-15), and one byte permute puts row j's four codes in 32-bit lane j;
// `dpbusd` multiplies them (unsigned) by a row's four int8 activations (broadcast) and adds
// the four products into lane j, in 32 bits: no 16-bit bound, no widening. The float steps
// per block and group are panel_q8's AVX2 tile's, in the same order: the same results.
constexpr int MRV = 8;  // batch rows a tile multiplies (3 of the 32 registers each)

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// byte j * 4 + c of the permuted register <- row j's code of column c
alignas(64) constexpr int8_t ROW_LANES[64] = {
    0,  8,  16, 24, 1,  9,  17, 25, 2,  10, 18, 26, 3,  11, 19, 27,
    4,  12, 20, 28, 5,  13, 21, 29, 6,  14, 22, 30, 7,  15, 23, 31,
    32, 40, 48, 56, 33, 41, 49, 57, 34, 42, 50, 58, 35, 43, 51, 59,
    36, 44, 52, 60, 37, 45, 53, 61, 38, 46, 54, 62, 39, 47, 55, 63};

template <int MR_, typename S>
void q8_tile_vnni(const int8_t* qx, const float* d, const float* sums, int64_t K,
                  int64_t group, const uint8_t* q, const S* sc, float* acc) {
  const __m512i lanes = _mm512_load_si512(ROW_LANES);
  const __m256i nib = _mm256_set1_epi8(15);
  const int64_t nb = K / QBLOCK, ng = K / group;
  __m512 t[MR_];
  for (int r = 0; r < MR_; ++r) t[r] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    __m512 f[MR_];
    for (int r = 0; r < MR_; ++r) f[r] = _mm512_setzero_ps();
    for (int64_t b0 = g0; b0 < g0 + group; b0 += QBLOCK) {
      __m512i sum[MR_];
      for (int r = 0; r < MR_; ++r) sum[r] = _mm512_setzero_si512();
      for (int64_t k = b0; k < b0 + QBLOCK; k += 4) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 8));
        const __m256i lo = _mm256_and_si256(w, nib);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
        const __m512i codes =
            _mm512_permutexvar_epi8(lanes, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
        for (int r = 0; r < MR_; ++r) {
          int32_t four;
          std::memcpy(&four, qx + r * K + k, 4);
          sum[r] = _mm512_dpbusd_epi32(sum[r], codes, _mm512_set1_epi32(four));
        }
      }
      for (int r = 0; r < MR_; ++r) {
        const __m512 db = _mm512_set1_ps(d[r * nb + b0 / QBLOCK]);
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), db, f[r]);
      }
    }
    const S* sg = sc + (g0 / group) * 2 * PANEL;
    const __m512 sv = load16(sg), cv = load16(sg + PANEL);
    for (int r = 0; r < MR_; ++r) {
      const __m512 sx = _mm512_set1_ps(sums[r * ng + g0 / group]);
      t[r] = _mm512_fmadd_ps(cv, sx, _mm512_fmadd_ps(f[r], sv, t[r]));
    }
  }
  for (int r = 0; r < MR_; ++r) _mm512_storeu_ps(acc + r * PANEL, t[r]);
}

constexpr int MR_TILE = MRV;
#else
constexpr int MR_TILE = MRQ;
#endif

}  // namespace
#endif

// out [M, N] = x [M, K] W^T for 4-bit panels, x quantized to int8 per block of 32 columns.
void panel_gemm_q8(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc, int64_t group) {
#ifndef CADENCE_PANEL_AVX2
  TORCH_CHECK(false, "panel_gemm_q8 needs AVX2 (panel_q8_available() is false)");
#else
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && out.is_contiguous(), "x [M, K], out [M, N]");
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.size(0) == x.size(0), "out must match x");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  TORCH_CHECK(group % QBLOCK == 0, "int8 activations need groups of a multiple of 32 columns");
  check_panels(q, sc, N, K, group, 4);
  const at::Tensor xc = x.contiguous();
  thread_local std::vector<float> widened;
  thread_local std::vector<int8_t> qx, pat;
  thread_local std::vector<float> d, sums;
  qx.resize(M * K);
  d.resize(M * (K / QBLOCK));
  sums.resize(M * (K / group));
  const int64_t panels = (N + PANEL - 1) / PANEL;
  const uint8_t* qp = q.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "panel_gemm_q8", [&] {
    const float* x32 = reinterpret_cast<const float*>(xc.data_ptr());
    if constexpr (!std::is_same_v<scalar_t, float>) {
      widened.resize(M * K);
      widen(xc.data_ptr<scalar_t>(), widened.data(), M * K);
      x32 = widened.data();
    }
    quantize_rows(x32, M, K, group, qx.data(), d.data(), sums.data());
#ifdef CADENCE_PANEL_VNNI
    const int8_t* patp = qx.data();  // (the VNNI tile reads the codes as they are)
#else
    pat.resize(M * K * 8);
    expand_patterns(qx.data(), M, K, pat.data());
    const int8_t* patp = pat.data();
#endif
    scalar_t* o = out.data_ptr<scalar_t>();
    // (the thread_local buffers are this thread's: the workers get pointers, not names)
    const float *dp = d.data(), *sump = sums.data();
    auto run = [&](auto s) {
      using S = decltype(s);
      const S* scp = static_cast<const S*>(sc.data_ptr());
      parallel_chunks(panels, chunk_grain(panels), [&](int64_t p0, int64_t p1) {
        float acc[MR_TILE * PANEL];
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t n0 = p * PANEL, width = std::min(PANEL, N - n0);
          for (int64_t m0 = 0; m0 < M; m0 += MR_TILE) {
            const int mr = static_cast<int>(std::min<int64_t>(MR_TILE, M - m0));
#ifdef CADENCE_PANEL_VNNI
            with_tile_rows<MR_TILE>(mr, [&](auto rows) {
              q8_tile_vnni<decltype(rows)::value>(patp + m0 * K, dp + m0 * (K / QBLOCK),
                                       sump + m0 * (K / group), K, group, qp + p * K * 8,
                                       scp + p * (K / group) * 2 * PANEL, acc);
            });
#else
            with_tile_rows<MR_TILE>(mr, [&](auto rows) {
              q8_tile<decltype(rows)::value>(patp + m0 * K * 8, dp + m0 * (K / QBLOCK),
                                  sump + m0 * (K / group), K, group, qp + p * K * 8,
                                  scp + p * (K / group) * 2 * PANEL, acc);
            });
#endif
            for (int r = 0; r < mr; ++r)
              for (int64_t j = 0; j < width; ++j) store_t(o + (m0 + r) * N + n0, j, acc[r * PANEL + j]);
          }
        }
      });
    };
    if (sc.scalar_type() == at::kHalf) run(c10::Half()); else run(0.0f);
  });
#endif
}

}  // namespace cadence_cpu
