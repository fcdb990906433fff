// What the panel products share (panel_gemm.cpp: float activations; panel_q8.cpp: int8
// activations; panel_bf16.cpp: bf16 activations on AMX tiles): the layout's row count, its
// argument check, the AVX2 loads of a panel's scales, a column's codes as floats, and
// whether the OS lends the AMX tiles.
#pragma once

#include "common.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define CADENCE_PANEL_AVX2 1
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace cadence_cpu {

constexpr int64_t PANEL = 16;  // rows of W a panel holds

// Which panels of a product to compute: [first, first + count), or from `first` to the end
// (count < 0: the whole product by default). moe_panels.cpp hands the panels of many
// experts' products out in such ranges.
struct PanelRange {
  int64_t first = 0;
  int64_t count_ = -1;
  int64_t count(int64_t n) const {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    return count_ < 0 ? panels - first : std::min(count_, panels - first);
  }
};

// One product's operands as raw pointers: out [M, N] and x [M, K] contiguous rows of
// `dtype`, the weight's panels q / sc (check_panels' layout; sc float16 or float32). The
// callers check them; moe_panels.cpp builds one per expert without a tensor view each
// (~1 us of dispatch a view, 64 views a layer at top-8).
struct PanelOperands {
  void* out;
  const void* x;
  at::ScalarType dtype;
  int64_t M, N, K;
  const uint8_t* q;
  const void* sc;
  bool sc_half;
};

// panel_gemm (float activations) and panel_gemm_q8 (int8 activations) over a range of the
// output's panels: the columns of `out` outside it are left as they were.
void panel_gemm_rows(const PanelOperands& a, int64_t group, int64_t bits, bool generic, PanelRange range);
void panel_gemm_q8_rows(const PanelOperands& a, int64_t group, int64_t bits, PanelRange range);
void panel_gemm_range(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc, int64_t group,
                      int64_t bits, bool generic, PanelRange range);
void panel_gemm_q8_range(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc,
                         int64_t group, int64_t bits, PanelRange range);

// q and sc hold the panels of an [n, k] weight of `bits`-bit codes (panel_gemm.cpp's
// layout), or this throws.
void check_panels(const at::Tensor& q, const at::Tensor& sc, int64_t n, int64_t k,
                  int64_t group, int64_t bits);

// Whether this process may use the AMX tiles: Linux lends their 8 KB of state on request
// (CADENCE_CPU_AMX=0: never ask). False where the build has no AMX.
bool amx_permitted();

#if defined(__AVX512F__)
// The panel's 16 codes at column k as floats (Bits 4: bytes 0-7 hold rows 0-7 in their low
// nibbles, rows 8-15 in the high; Bits 8: a byte a row).
template <int Bits>
inline __m512 codes16(const uint8_t* q, int64_t k) {
  __m128i b;
  if constexpr (Bits == 4) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k * 8));
    const __m128i nib = _mm_set1_epi8(15);
    b = _mm_unpacklo_epi64(_mm_and_si128(x, nib), _mm_and_si128(_mm_srli_epi16(x, 4), nib));
  } else {
    b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k * 16));
  }
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}
#endif

#ifdef CADENCE_PANEL_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {  // F16C: c10's scalar conversion costs ~20 cycles
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

}  // namespace cadence_cpu
