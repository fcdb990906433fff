// Short-query attention over a bf16 KV pool on CPUs with AVX512-BF16 (head dims 64 and
// 128): the keys' bf16 rows go straight into `dpbf16` dot products and the values' rows
// are widened in registers, where the portable kernel copies every key and value row to a
// float32 buffer first (a store and a reload of each) and sums eight floats a multiply.
//
// Precision: q . k is exact products of bf16 values summed in float32, as the widened
// kernel does (in another order); the probabilities stay float32 (not rounded to bf16
// before the values' sum, as GPU kernels do).
#pragma once

#include "common.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define CADENCE_ATTN_BF16 1

namespace cadence_cpu {
namespace attn_bf16 {

// Lane i of the result = the sum of a[i]'s sixteen lanes: a tree of 45 shuffles and adds
// for sixteen sums (a horizontal sum per vector would take 8 apiece).
inline __m512 lane_sums16(const __m512 (&a)[16]) {
  __m512 b[8], e[4], h[2];
  for (int i = 0; i < 8; ++i)  // a 128-bit lane of b[i]: two partial sums of each of 2 keys
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // ... of e[i]: one partial sum of each of keys 4i..4i+3
    const __m512d c = _mm512_castps_pd(b[2 * i]), d = _mm512_castps_pd(b[2 * i + 1]);
    e[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
  }
  for (int i = 0; i < 2; ++i)  // 0x88: 128-bit lanes 0, 2 of each; 0xDD: lanes 1, 3
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(e[2 * i], e[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(e[2 * i], e[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(h[0], h[1], 0x88),
                       _mm512_shuffle_f32x4(h[0], h[1], 0xDD));
}

inline __m512bh load_bh(const uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(p);
}

// s[i] = scale * (q . k_i) for the 16 key rows k_i (D bf16 values, `stride` apart), the
// first n of them stored; q: the query row as D / 32 registers of bf16 pairs. Rows past n
// must be readable (slots of the same block): each sum only ever sees its own row.
template <int D>
inline void scores16(const __m512bh (&q)[D / 32], const uint16_t* k, int64_t stride, int64_t n,
                     float scale, float* s) {
  __m512 a[16];
  for (int i = 0; i < 16; ++i) {
    a[i] = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], load_bh(k + i * stride));
    for (int c = 1; c < D / 32; ++c) a[i] = _mm512_dpbf16_ps(a[i], q[c], load_bh(k + i * stride + c * 32));
  }
  const __m512 r = _mm512_mul_ps(lane_sums16(a), _mm512_set1_ps(scale));
  _mm512_mask_storeu_ps(s, static_cast<__mmask16>((1u << n) - 1u), r);
}

// The same for one key row.
template <int D>
inline float score1(const __m512bh (&q)[D / 32], const uint16_t* k, float scale) {
  __m512 a = _mm512_setzero_ps();
  for (int c = 0; c < D / 32; ++c) a = _mm512_dpbf16_ps(a, q[c], load_bh(k + c * 32));
  return _mm512_reduce_add_ps(a) * scale;
}

// acc[g * D + d] += sum over i < n of p[g * p_stride + i] * v_i[d] for G heads, the sums
// held in registers over the n value rows (D bf16 values, `stride` apart).
template <int D, int G>
inline void values_rows(float* acc, const float* p, int64_t p_stride, const uint16_t* v,
                        int64_t stride, int64_t n) {
  constexpr int C = D / 16;
  __m512 a[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) a[g][c] = _mm512_loadu_ps(acc + g * D + c * 16);
  for (int64_t i = 0; i < n; ++i) {
    __m512 row[C];
    for (int c = 0; c < C; ++c) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i * stride + c * 16));
      row[c] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    }
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * p_stride + i]);
      for (int c = 0; c < C; ++c) a[g][c] = _mm512_fmadd_ps(w, row[c], a[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * D + c * 16, a[g][c]);
}

// s[0..n) = softmax(s[0..n)), the max and the sum kept in sixteen lanes (a loop of
// std::max or += over floats is one serial chain: the compiler may not reorder it).
inline void softmax(float* s, int64_t n) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t p = 0;
  for (; p + 16 <= n; p += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + p));
  float m = _mm512_reduce_max_ps(mv);
  for (; p < n; ++p) m = std::max(m, s[p]);
  for (p = 0; p < n; ++p) s[p] = exp_approx(s[p] - m);  // (vectorized by the compiler)
  __m512 sv = _mm512_setzero_ps();
  for (p = 0; p + 16 <= n; p += 16) sv = _mm512_add_ps(sv, _mm512_loadu_ps(s + p));
  float sum = _mm512_reduce_add_ps(sv);
  for (; p < n; ++p) sum += s[p];
  const float inv = 1.0f / sum;
  for (p = 0; p < n; ++p) s[p] *= inv;
}

// The most heads whose sums fit in registers beside one widened value row.
template <int D>
constexpr int kHeadsAtOnce = D == 64 ? 4 : 2;

template <int D>
inline void values_heads(float* acc, const float* p, int64_t p_stride, const uint16_t* v,
                         int64_t stride, int64_t n, int64_t heads) {
  for (int64_t g = 0; g < heads; g += kHeadsAtOnce<D>) {
    float* a = acc + g * D;
    const float* w = p + g * p_stride;
    switch (std::min<int64_t>(kHeadsAtOnce<D>, heads - g)) {
      case 1: values_rows<D, 1>(a, w, p_stride, v, stride, n); break;
      case 2: values_rows<D, 2>(a, w, p_stride, v, stride, n); break;
      case 3: if constexpr (kHeadsAtOnce<D> >= 3) values_rows<D, 3>(a, w, p_stride, v, stride, n); break;
      default: if constexpr (kHeadsAtOnce<D> >= 4) values_rows<D, 4>(a, w, p_stride, v, stride, n);
    }
  }
}

// One query row (pool row `row` of q and out) over KV heads kvh0..kvh1-1 and their query
// heads: scores of keys lo..keys-1 (the last `window`, or all), soft-capped where asked,
// softmax, the weighted sum of values. Block by block in the pool, all the unit's KV heads
// of a block together: a block's slots (every KV head of 16 keys) are one contiguous run
// of memory, read in order.
template <int D>
void attend_row(uint16_t* out, const uint16_t* q, int64_t q_tok_stride, int64_t q_head_stride,
                int64_t o_tok_stride, int64_t o_head_stride, const uint16_t* kc,
                const uint16_t* vc, int64_t slot_stride, const int64_t* table,
                int64_t block_size, int64_t row, int64_t keys, int64_t window, float softcap,
                int64_t kvh0, int64_t kvh1, int64_t group, float scale,
                std::vector<float>& scores, std::vector<float>& acc) {
  const int64_t lo = window > 0 ? std::max<int64_t>(0, keys - window) : 0;
  const int64_t span = keys - lo, heads = (kvh1 - kvh0) * group, hq0 = kvh0 * group;
  scores.resize(heads * span);
  acc.assign(heads * D, 0.0f);
  const int64_t first_blk = lo / block_size, blocks = (keys + block_size - 1) / block_size;
  for (int64_t blk = first_blk; blk < blocks; ++blk) {
    const int64_t j0 = std::max(blk * block_size, lo) - blk * block_size;
    const int64_t j1 = std::min(block_size, keys - blk * block_size);
    const uint16_t* base = kc + table[blk] * block_size * slot_stride;
    for (int64_t h = 0; h < heads; ++h) {
      const uint16_t* qrow = q + row * q_tok_stride + (hq0 + h) * q_head_stride;
      __m512bh qv[D / 32];
      for (int c = 0; c < D / 32; ++c) qv[c] = load_bh(qrow + c * 32);
      const uint16_t* k = base + ((hq0 + h) / group) * D;
      float* s = &scores[h * span + blk * block_size - lo];  // key blk * block_size
      int64_t i = j0;
      for (; i < j1 && i + 16 <= block_size; i += 16)
        scores16<D>(qv, k + i * slot_stride, slot_stride, std::min<int64_t>(16, j1 - i), scale, s + i);
      for (; i < j1; ++i) s[i] = score1<D>(qv, k + i * slot_stride, scale);
      if (softcap > 0.0f)  // Gemma 2
        for (int64_t i = j0; i < j1; ++i) s[i] = std::tanh(s[i] / softcap) * softcap;
    }
  }
  for (int64_t h = 0; h < heads; ++h) softmax(&scores[h * span], span);
  for (int64_t blk = first_blk; blk < blocks; ++blk) {
    const int64_t j0 = std::max(blk * block_size, lo) - blk * block_size;
    const int64_t j1 = std::min(block_size, keys - blk * block_size);
    const uint16_t* base = vc + table[blk] * block_size * slot_stride + j0 * slot_stride;
    for (int64_t kvh = kvh0; kvh < kvh1; ++kvh) {
      const int64_t h = (kvh - kvh0) * group;
      values_heads<D>(&acc[h * D], &scores[h * span + blk * block_size + j0 - lo], span,
                      base + kvh * D, slot_stride, j1 - j0, group);
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    uint16_t* o = out + row * o_tok_stride + (hq0 + h) * o_head_stride;
    for (int64_t d = 0; d < D; ++d) o[d] = bf16_bits(acc[h * D + d]);
  }
}

}  // namespace attn_bf16
}  // namespace cadence_cpu
#endif
