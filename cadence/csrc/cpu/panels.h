// What the two panel products share (panel_gemm.cpp: float activations; panel_q8.cpp:
// int8 activations): the layout's row count, its argument check, and the AVX2 loads of a
// panel's scales.
#pragma once

#include "common.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define CADENCE_PANEL_AVX2 1
#endif

namespace cadence_cpu {

constexpr int64_t PANEL = 16;  // rows of W a panel holds

// q and sc hold the panels of an [n, k] weight of `bits`-bit codes (panel_gemm.cpp's
// layout), or this throws.
void check_panels(const at::Tensor& q, const at::Tensor& sc, int64_t n, int64_t k,
                  int64_t group, int64_t bits);

#ifdef CADENCE_PANEL_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {  // F16C: c10's scalar conversion costs ~20 cycles
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

}  // namespace cadence_cpu
