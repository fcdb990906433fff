// Attention of short queries (decodes, speculative verifies) straight from the paged KV
// pool: no gathered copy of the context.

#include "attention_bf16.h"
#include "common.h"

#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CADENCE_ATTN_AVX2 1
#endif

namespace cadence_cpu {

// ---- register-blocked inner loops (head dims that are multiples of 64) -------------------
//
// Scores: eight keys at a time, eight sums kept in registers over the head dim and
// finished together by one tree of horizontal adds (a dot product per key would end each
// key with its own horizontal sum: as many instructions again as its multiplies at
// D = 64). Values: the output row's 64-float slices held in eight registers while every
// key of a block adds its weighted row into them (no load and store of the sums per key).

#ifdef CADENCE_ATTN_AVX2
// Lane i of the result = the sum of a_i's eight lanes.
inline __m256 lane_sums(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                        __m256 a6, __m256 a7) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// out[i] = scale * (q . k_i) for the eight rows k_0..k_7 (contiguous rows of D floats).
inline void scores8(const float* q, const float* k, int64_t D, float scale, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + D + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * D + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * D + d), a3);
    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 4 * D + d), a4);
    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 5 * D + d), a5);
    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 6 * D + d), a6);
    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 7 * D + d), a7);
  }
  _mm256_storeu_ps(out, _mm256_mul_ps(lane_sums(a0, a1, a2, a3, a4, a5, a6, a7),
                                      _mm256_set1_ps(scale)));
}

// acc[0..D) += sum over j < n of w[j] v_j (rows v_j of D floats, D a multiple of 64).
inline void weighted_rows(float* acc, const float* w, const float* v, int64_t n, int64_t D) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    float* a = acc + d0;
    __m256 s0 = _mm256_loadu_ps(a), s1 = _mm256_loadu_ps(a + 8), s2 = _mm256_loadu_ps(a + 16),
           s3 = _mm256_loadu_ps(a + 24), s4 = _mm256_loadu_ps(a + 32), s5 = _mm256_loadu_ps(a + 40),
           s6 = _mm256_loadu_ps(a + 48), s7 = _mm256_loadu_ps(a + 56);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 wj = _mm256_broadcast_ss(w + j);
      const float* r = v + j * D + d0;
      s0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r), s0);
      s1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 8), s1);
      s2 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 16), s2);
      s3 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 24), s3);
      s4 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 32), s4);
      s5 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 40), s5);
      s6 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 48), s6);
      s7 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 56), s7);
    }
    _mm256_storeu_ps(a, s0), _mm256_storeu_ps(a + 8, s1), _mm256_storeu_ps(a + 16, s2);
    _mm256_storeu_ps(a + 24, s3), _mm256_storeu_ps(a + 32, s4), _mm256_storeu_ps(a + 40, s5);
    _mm256_storeu_ps(a + 48, s6), _mm256_storeu_ps(a + 56, s7);
  }
}
#endif

// scores[j] = scale * (q . row_j) for the n rows of D floats: eight keys a step where the
// head dim allows (DC a multiple of 64), one dot product a key otherwise.
template <int DC>
inline void block_scores(const float* q, const float* rows, int64_t D, int64_t n, float scale,
                         float* scores) {
  int64_t j = 0;
#ifdef CADENCE_ATTN_AVX2
  if constexpr (DC > 0 && DC % 64 == 0)
    for (; j + 8 <= n; j += 8) scores8(q, rows + j * D, D, scale, scores + j);
#endif
  for (; j < n; ++j) scores[j] = dot(q, rows + j * D, D) * scale;
}

// acc[0..D) += sum over j < n of w[j] row_j.
template <int DC>
inline void block_values(float* acc, const float* w, const float* rows, int64_t D, int64_t n) {
#ifdef CADENCE_ATTN_AVX2
  if constexpr (DC > 0 && DC % 64 == 0) return weighted_rows(acc, w, rows, n, D);
#endif
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) acc[d] += w[j] * rows[j * D + d];
}

// ---- paged attention for short queries ------------------------------------------------

// One unit of work: query token `qi` of request `b`, the `group` query heads that share KV
// head `kvh`. Scores for every key it sees (keys lo..keys-1: all of them, or the last
// `window`), soft-capped where asked, softmax, then the weighted sum of V, reading the keys
// block by block where they lie in the pool (no gathered copy of the context). Keys are
// walked by block, not by position: a position -> slot division per key cost more than the
// arithmetic.
template <typename T, int DC>
void attend_unit(T* out, const T* q, int64_t q_tok_stride, int64_t q_head_stride,
                 int64_t o_tok_stride, int64_t o_head_stride, const T* kc, const T* vc,
                 int64_t slot_stride, int64_t head_dim_rt, const int64_t* table, int64_t block_size,
                 int64_t row, int64_t keys, int64_t window, float softcap, int64_t kvh,
                 int64_t group, float scale, std::vector<float>& qf, std::vector<float>& scores,
                 std::vector<float>& rows, std::vector<float>& acc) {
  // DC: the head dim as a compile-time constant (64, 128: loops fully unrolled and
  // vectorized), 0 for any other (a runtime bound).
  const int64_t D = DC > 0 ? DC : head_dim_rt;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, keys - window) : 0;
  const int64_t span = keys - lo;
  qf.resize(group * D);
  scores.resize(group * span);
  rows.resize(block_size * D);
  acc.assign(group * D, 0.0f);
  for (int64_t g = 0; g < group; ++g)
    widen(q + row * q_tok_stride + (kvh * group + g) * q_head_stride, &qf[g * D], D);
  const int64_t first_blk = lo / block_size, blocks = (keys + block_size - 1) / block_size;
  for (int64_t blk = first_blk; blk < blocks; ++blk) {
    // Keys first..last-1 of this block, as offsets j0..j1-1 into it.
    const int64_t j0 = std::max(blk * block_size, lo) - blk * block_size;
    const int64_t j1 = std::min(block_size, keys - blk * block_size);
    const T* base = kc + table[blk] * block_size * slot_stride + kvh * D;
    for (int64_t j = j0; j < j1; ++j) widen(base + j * slot_stride, &rows[j * D], D);
    for (int64_t g = 0; g < group; ++g) {
      float* s = &scores[g * span + blk * block_size + j0 - lo];  // key blk * block_size + j0
      block_scores<DC>(&qf[g * D], &rows[j0 * D], D, j1 - j0, scale, s);
      if (softcap > 0.0f)
        for (int64_t j = 0; j < j1 - j0; ++j) s[j] = std::tanh(s[j] / softcap) * softcap;  // Gemma 2
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = &scores[g * span];
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < span; ++p) m = std::max(m, s[p]);
    float sum = 0.0f;
    for (int64_t p = 0; p < span; ++p) s[p] = exp_approx(s[p] - m);
    for (int64_t p = 0; p < span; ++p) sum += s[p];
    const float inv = 1.0f / sum;
    for (int64_t p = 0; p < span; ++p) s[p] *= inv;
  }
  for (int64_t blk = first_blk; blk < blocks; ++blk) {
    const int64_t j0 = std::max(blk * block_size, lo) - blk * block_size;
    const int64_t j1 = std::min(block_size, keys - blk * block_size);
    const T* base = vc + table[blk] * block_size * slot_stride + kvh * D;
    for (int64_t j = j0; j < j1; ++j) widen(base + j * slot_stride, &rows[j * D], D);
    for (int64_t g = 0; g < group; ++g)
      block_values<DC>(&acc[g * D], &scores[g * span + blk * block_size + j0 - lo], &rows[j0 * D],
                       D, j1 - j0);
  }
  for (int64_t g = 0; g < group; ++g) {
    T* o = out + row * o_tok_stride + (kvh * group + g) * o_head_stride;
    for (int64_t d = 0; d < D; ++d) store_t(o, d, acc[g * D + d]);
  }
}

// out/q: [T, Hq, D]; k_cache/v_cache: [slots, Hkv, D]; block_tables: [B, max_blocks] int64;
// first_row/query_lens/seq_lens: [B] int64 (the request's first row in q, its query
// tokens, and its keys including them). Query token i of a request sits at position
// seq_len - query_len + i and sees keys 0..that position (window > 0: only the last
// `window` of them). softcap > 0: each score s becomes softcap * tanh(s / softcap).
void paged_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                     at::Tensor v_cache, at::Tensor block_tables, at::Tensor first_row,
                     at::Tensor query_lens, at::Tensor seq_lens, int64_t block_size,
                     double scale, int64_t window, double softcap) {
  check_rows(q, "q");
  check_rows(out, "out");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "cache dtype != q dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && first_row.scalar_type() == at::kLong &&
                  query_lens.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "index tensors must be int64");
  auto tables = block_tables.contiguous();
  const int64_t B = first_row.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t Hkv = k_cache.size(1), group = Hq / Hkv, max_blocks = tables.size(1);
  TORCH_CHECK(Hq % Hkv == 0 && k_cache.size(2) == D, "head counts / dims disagree");
  const int64_t* fr = first_row.data_ptr<int64_t>();
  const int64_t* ql = query_lens.data_ptr<int64_t>();
  const int64_t* sl = seq_lens.data_ptr<int64_t>();
  int64_t rows = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ql[b] >= 1 && ql[b] <= sl[b], "query_len must be in 1..seq_len");
    TORCH_CHECK((sl[b] + block_size - 1) / block_size <= max_blocks, "block table too short");
    rows += ql[b];
  }
  // KV heads a unit takes: all of its query row's where the rows alone give each thread
  // two units or more (a pool block's slots, every KV head of 16 keys, are then read as
  // one run: 14-28 % faster at 4-32 rows of 192 keys, SmolLM2's shape); one where they
  // would leave threads idle (one long prompt's decode).
  const int64_t hpu = rows >= 2 * at::get_num_threads() ? Hkv : 1, parts = Hkv / hpu;
  // Units: (request, query token, KV heads), flattened through a prefix sum over queries.
  std::vector<int64_t> unit_start(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) unit_start[b + 1] = unit_start[b] + ql[b] * parts;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t* kc = k_cache.data_ptr<scalar_t>();
    const scalar_t* vc = v_cache.data_ptr<scalar_t>();
    const int64_t* tp = tables.data_ptr<int64_t>();
    parallel_chunks(unit_start[B], chunk_grain(unit_start[B], 4), [&](int64_t u0, int64_t u1) {
      thread_local std::vector<float> qf, scores, kf, acc;  // scratch, per thread
      int64_t b = std::upper_bound(unit_start.begin(), unit_start.end(), u0) - unit_start.begin() - 1;
      for (int64_t u = u0; u < u1; ++u) {
        while (u >= unit_start[b + 1]) ++b;
        const int64_t local = u - unit_start[b], qi = local / parts, kvh0 = (local % parts) * hpu;
        const int64_t keys = sl[b] - ql[b] + qi + 1;
#ifdef CADENCE_ATTN_BF16
        if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
          if (D == 64 || D == 128) {
            auto unit = D == 64 ? attn_bf16::attend_row<64> : attn_bf16::attend_row<128>;
            unit(reinterpret_cast<uint16_t*>(op), reinterpret_cast<const uint16_t*>(qp),
                 q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                 reinterpret_cast<const uint16_t*>(kc), reinterpret_cast<const uint16_t*>(vc),
                 Hkv * D, tp + b * max_blocks, block_size, fr[b] + qi, keys, window,
                 static_cast<float>(softcap), kvh0, kvh0 + hpu, group, static_cast<float>(scale),
                 scores, acc);
            continue;
          }
        }
#endif
        auto unit = D == 64 ? attend_unit<scalar_t, 64>
                    : D == 128 ? attend_unit<scalar_t, 128>
                               : attend_unit<scalar_t, 0>;
        for (int64_t kvh = kvh0; kvh < kvh0 + hpu; ++kvh)
          unit(op, qp, q.stride(0), q.stride(1), out.stride(0), out.stride(1), kc, vc, Hkv * D,
               D, tp + b * max_blocks, block_size, fr[b] + qi, keys, window,
               static_cast<float>(softcap), kvh, group, static_cast<float>(scale), qf, scores, kf,
               acc);
      }
    });
  });
}

}  // namespace cadence_cpu
