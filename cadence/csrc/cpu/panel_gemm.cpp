// GGUF weights in 16-row panels: one product for every batch size that reads each weight
// once a call and multiplies it into every row of the batch.
//
// The layout (cadence/quant/gguf_cpu.py packs it at load): a weight W [N, K] with
// W[n, k] = s[n, g] v[n, k] + c[n, g] per group g of `group` columns (GGUF's blocks, see
// gguf_blocks.py), rows padded to P = ceil(N / 16) panels of 16:
//
//   q    uint8 [P, K, 8]   bits <= 4: byte j = v[16p + j, k] | v[16p + 8 + j, k] << 4
//        uint8 [P, K, 16]  bits <= 8: byte j = v[16p + j, k]
//        uint8 [P, K, 32]  bits 16: bf16 weights themselves (plain bf16 models on a CPU
//                          without oneDNN bf16 kernels: gguf_cpu.PanelsCPU.from_plain),
//                          half-word j = W[16p + j, k]; sc is then one group (K) of s = 1,
//                          c = 0, which the unpacking skips
//   sc   [P, K / group, 2, 16] float16 (where every value is exact in it) or float32:
//        [p, g, 0, j] = s[16p + j, g], [p, g, 1, j] = c[16p + j, g]
//
// The product is an outer product per column k: the 16 weights of a panel at k are
// unpacked once into two vectors of 8 floats (w = v s + c in one fused multiply-add), and
// each of up to MR batch rows adds x[m, k] times them into its 16 sums, kept in
// registers for all of K. Sums are float32, whatever the activations' dtype; no
// horizontal sums. Torch's int4 kernel, which this replaces, unpacked every weight again
// for every row of the batch. On a 2-core AVX2 machine (benchmarks/gguf_cpu_sweep.py) a
// tile of 6 rows runs at 2.5-3x the one-row rate: the unpacking, not memory, bounds one
// row. The build (-march=native, cpu_ops.py) picks the widest tile the CPU has: AVX-512
// (a panel's 16 weights are one register; tiles of 12 rows), AVX2 (two registers; 6
// rows), else the portable loop.

#include "panels.h"

#include <type_traits>
#if defined(__AVX512F__)
#define CADENCE_PANEL_AVX512 1
#endif

namespace cadence_cpu {

// Batch rows a tile multiplies: its sums fill the registers (AVX-512: 32 of 16 floats, 12
// rows of one; AVX2: 16 of 8 floats, 6 rows of two) with room for the weights and scales.
#ifdef CADENCE_PANEL_AVX512
constexpr int MR = 12;
#else
constexpr int MR = 6;
#endif

// A panel's scale and offset vectors for one group, widened to float32.
template <typename S>
inline void group_scales(const S* sc, float* out) {
  for (int j = 0; j < 2 * PANEL; ++j) out[j] = static_cast<float>(sc[j]);
}

// ---- the portable path (and the reference the tests hold the AVX2 path to) ---------------

// Bytes of q per column k of a panel. Bits 32 is internal: a panel already unpacked into
// float32 weights [K, 16] (unpack_panel), which a tile reads with no arithmetic.
constexpr int64_t panel_bytes(int bits) { return bits * 2; }

// The panel's weight j at column k before its scale: a code, or (Bits 16) the bf16 weight.
template <int Bits>
inline float panel_code(const uint8_t* qk, int j) {
  if constexpr (Bits == 4) return static_cast<float>(j < 8 ? (qk[j] & 15) : (qk[j - 8] >> 4));
  if constexpr (Bits == 16) return load_f(reinterpret_cast<const c10::BFloat16*>(qk), j);
  if constexpr (Bits == 32) return reinterpret_cast<const float*>(qk)[j];
  return static_cast<float>(qk[j]);
}

template <int Bits, typename S>
void panel_tile_generic(const float* x, int64_t ldx, int mr, const uint8_t* q, const S* sc,
                        int64_t K, int64_t group, float* acc /* [mr, 16] */) {
  constexpr int64_t per_k = panel_bytes(Bits);
  float sg[2 * PANEL], w[PANEL];
  for (int64_t k = 0; k < K; ++k) {
    if (k % group == 0) group_scales(sc + (k / group) * 2 * PANEL, sg);
    const uint8_t* qk = q + k * per_k;
    for (int j = 0; j < PANEL; ++j)
      w[j] = Bits == 32 ? panel_code<Bits>(qk, j) : panel_code<Bits>(qk, j) * sg[j] + sg[PANEL + j];
    for (int r = 0; r < mr; ++r) {
      const float xv = x[r * ldx + k];
      for (int j = 0; j < PANEL; ++j) acc[r * PANEL + j] += xv * w[j];
    }
  }
}

#ifdef CADENCE_PANEL_AVX2
// The panel's 16 weights at column k as two vectors of 8 floats: w = v s + c (one
// rounding: the fused multiply-add).
template <int Bits>
inline void unpack(const uint8_t* q, int64_t k, __m256 s0, __m256 s1, __m256 c0, __m256 c1,
                   __m256& w0, __m256& w1) {
  if constexpr (Bits == 32) {  // unpacked already
    w0 = _mm256_loadu_ps(reinterpret_cast<const float*>(q + k * 64));
    w1 = _mm256_loadu_ps(reinterpret_cast<const float*>(q + k * 64) + 8);
  } else if constexpr (Bits == 16) {  // bf16: a float's high half; no scale (s = 1, c = 0)
    const __m128i* p = reinterpret_cast<const __m128i*>(q + k * 32);
    w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
    w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p + 1)), 16));
  } else {
    __m256i v0, v1;
    if constexpr (Bits == 4) {
      const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + k * 8)));
      v0 = _mm256_and_si256(b, _mm256_set1_epi32(15));
      v1 = _mm256_srli_epi32(b, 4);
    } else {
      v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + k * 16)));
      v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + k * 16 + 8)));
    }
    w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v0), s0, c0);
    w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v1), s1, c1);
  }
}

// MR_ rows of x against one panel, all of K. The sums are named locals, not an array: GCC
// keeps an array of vectors on the stack and stores every element each step.
#define CADENCE_ROW(r, A0, A1)                                                  \
  if constexpr (MR_ > r) {                                                     \
    const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);                    \
    A0 = _mm256_fmadd_ps(w0, xv, A0);                                          \
    A1 = _mm256_fmadd_ps(w1, xv, A1);                                          \
  }

template <int Bits, int MR_, typename S>
inline void panel_tile_avx2(const float* x, int64_t ldx, const uint8_t* q, const S* sc,
                            int64_t K, int64_t group, float* acc) {
  static_assert(MR_ >= 1 && MR_ <= 6, "tiles of 1 to 6 rows");
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
  __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    const S* sgp = sc + (g0 / group) * 2 * PANEL;
    const __m256 s0 = load8(sgp), s1 = load8(sgp + 8), c0 = load8(sgp + 16), c1 = load8(sgp + 24);
    for (int64_t k = g0; k < g0 + group; ++k) {
      __m256 w0, w1;
      unpack<Bits>(q, k, s0, s1, c0, c1, w0, w1);
      CADENCE_ROW(0, a00, a01)
      CADENCE_ROW(1, a10, a11)
      CADENCE_ROW(2, a20, a21)
      CADENCE_ROW(3, a30, a31)
      CADENCE_ROW(4, a40, a41)
      CADENCE_ROW(5, a50, a51)
    }
  }
  const __m256 sums[12] = {a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51};
  for (int r = 0; r < MR_; ++r) {
    _mm256_storeu_ps(acc + r * PANEL, sums[2 * r]);
    _mm256_storeu_ps(acc + r * PANEL + 8, sums[2 * r + 1]);
  }
}
#undef CADENCE_ROW
#endif

#ifdef CADENCE_PANEL_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 floats rounded to bf16 (to nearest even, as bf16_bits) and stored.
inline void store_bf16x16(c10::BFloat16* o, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtepi32_epi16(r));
}

// The panel's 16 weights at column k in one register: w = v s + c (bf16: the weights).
template <int Bits>
inline __m512 unpack16(const uint8_t* q, int64_t k, __m512 s, __m512 c) {
  if constexpr (Bits == 32) {  // unpacked already
    return _mm512_loadu_ps(reinterpret_cast<const float*>(q + k * 64));
  } else if constexpr (Bits == 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 32));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_fmadd_ps(codes16<Bits>(q, k), s, c);
  }
}

#define CADENCE_ROW16(r, A) \
  if constexpr (MR_ > r) A = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r * ldx + k]), A);

template <int Bits, int MR_, typename S>
inline void panel_tile_avx512(const float* x, int64_t ldx, const uint8_t* q, const S* sc,
                              int64_t K, int64_t group, float* acc) {
  static_assert(MR_ >= 1 && MR_ <= 12, "tiles of 1 to 12 rows");
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  __m512 a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    const S* sgp = sc + (g0 / group) * 2 * PANEL;
    const __m512 s = load16(sgp), c = load16(sgp + PANEL);
    for (int64_t k = g0; k < g0 + group; ++k) {
      const __m512 w = unpack16<Bits>(q, k, s, c);
      CADENCE_ROW16(0, a0) CADENCE_ROW16(1, a1) CADENCE_ROW16(2, a2) CADENCE_ROW16(3, a3)
      CADENCE_ROW16(4, a4) CADENCE_ROW16(5, a5) CADENCE_ROW16(6, a6) CADENCE_ROW16(7, a7)
      CADENCE_ROW16(8, a8) CADENCE_ROW16(9, a9) CADENCE_ROW16(10, a10) CADENCE_ROW16(11, a11)
    }
  }
  const __m512 sums[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
  for (int r = 0; r < MR_; ++r) _mm512_storeu_ps(acc + r * PANEL, sums[r]);
}
#undef CADENCE_ROW16
#endif

#if defined(CADENCE_PANEL_AVX512) || defined(CADENCE_PANEL_AVX2)
// The widest vector tile this build has, for exactly R rows.
template <int Bits, int R, typename S>
inline void vector_tile(const float* x, int64_t ldx, const uint8_t* q, const S* sc, int64_t K,
                        int64_t group, float* acc) {
#ifdef CADENCE_PANEL_AVX512
  panel_tile_avx512<Bits, R>(x, ldx, q, sc, K, group, acc);
#else
  panel_tile_avx2<Bits, R>(x, ldx, q, sc, K, group, acc);
#endif
}

// The tile of mr rows (1..MR): its row count a compile-time constant, so the sums stay in
// named registers.
template <int Bits, int R = 1, typename S>
inline void vector_tile_rows(int mr, const float* x, int64_t ldx, const uint8_t* q, const S* sc,
                             int64_t K, int64_t group, float* acc) {
  if constexpr (R < MR) {
    if (mr > R) return vector_tile_rows<Bits, R + 1>(mr, x, ldx, q, sc, K, group, acc);
  }
  vector_tile<Bits, R>(x, ldx, q, sc, K, group, acc);
}
#endif

template <int Bits, typename S>
void panel_tile(const float* x, int64_t ldx, int mr, const uint8_t* q, const S* sc,
                int64_t K, int64_t group, float* acc, bool generic) {
#if defined(CADENCE_PANEL_AVX512) || defined(CADENCE_PANEL_AVX2)
  if (!generic) return vector_tile_rows<Bits>(mr, x, ldx, q, sc, K, group, acc);
#endif
  std::fill(acc, acc + mr * PANEL, 0.0f);
  panel_tile_generic<Bits>(x, ldx, mr, q, sc, K, group, acc);
}

// A panel's weights as float32 [K, 16] in w: the vector tiles' own unpacking (the same
// rounding), stored once for every tile of the call to read.
template <int Bits, typename S>
void unpack_panel(const uint8_t* q, const S* sc, int64_t K, int64_t group, float* w) {
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    const S* sgp = sc + (g0 / group) * 2 * PANEL;
#if defined(CADENCE_PANEL_AVX512)
    const __m512 s = load16(sgp), c = load16(sgp + PANEL);
    for (int64_t k = g0; k < g0 + group; ++k) _mm512_storeu_ps(w + k * PANEL, unpack16<Bits>(q, k, s, c));
#elif defined(CADENCE_PANEL_AVX2)
    const __m256 s0 = load8(sgp), s1 = load8(sgp + 8), c0 = load8(sgp + 16), c1 = load8(sgp + 24);
    for (int64_t k = g0; k < g0 + group; ++k) {
      __m256 w0, w1;
      unpack<Bits>(q, k, s0, s1, c0, c1, w0, w1);
      _mm256_storeu_ps(w + k * PANEL, w0);
      _mm256_storeu_ps(w + k * PANEL + 8, w1);
    }
#else
    float sg[2 * PANEL];
    group_scales(sgp, sg);
    for (int64_t k = g0; k < g0 + group; ++k)
      for (int j = 0; j < PANEL; ++j)
        w[k * PANEL + j] = panel_code<Bits>(q + k * panel_bytes(Bits), j) * sg[j] + sg[PANEL + j];
#endif
  }
}

// From this many batch rows a panel is unpacked once into a float32 buffer (K x 16: 36 KiB
// at K = 576, within L2) that every tile of rows reads, instead of each tile unpacking it
// again: the unpacking was a third of a 16-row product's time on a 2-core AVX2 machine.
constexpr int64_t BUFFER_ROWS = 2 * MR;

template <typename T, int Bits, typename S>
void panel_gemm_impl(T* out, const float* x, int64_t M, int64_t N, int64_t K, const uint8_t* q,
                     const S* sc, int64_t group, bool generic, PanelRange range) {
  const int64_t per_k = panel_bytes(Bits), first = range.first;
  const int64_t count = range.count(N);
  const bool buffered = !generic && M >= BUFFER_ROWS;
  parallel_chunks(count, chunk_grain(count), [&](int64_t c0, int64_t c1) {
    float acc[MR * PANEL];
    thread_local std::vector<float> unpacked;  // (per thread: chunks come many a call)
    if (buffered) unpacked.resize(K * PANEL);
    for (int64_t p = first + c0; p < first + c1; ++p) {
      const uint8_t* qp = q + p * K * per_k;
      const S* sp = sc + p * (K / group) * 2 * PANEL;
      const int64_t n0 = p * PANEL, width = std::min(PANEL, N - n0);
      if (buffered) unpack_panel<Bits>(qp, sp, K, group, unpacked.data());
      const uint8_t* wp = reinterpret_cast<const uint8_t*>(unpacked.data());
      for (int64_t m0 = 0; m0 < M; m0 += MR) {
        const int mr = static_cast<int>(std::min<int64_t>(MR, M - m0));
        if (buffered)
          panel_tile<32>(x + m0 * K, K, mr, wp, sp, K, group, acc, false);
        else
          panel_tile<Bits>(x + m0 * K, K, mr, qp, sp, K, group, acc, generic);
        for (int r = 0; r < mr; ++r)
          for (int64_t j = 0; j < width; ++j) store_t(out + (m0 + r) * N + n0, j, acc[r * PANEL + j]);
      }
    }
  });
}

void check_panels(const at::Tensor& q, const at::Tensor& sc, int64_t n, int64_t k,
                  int64_t group, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8 || bits == 16, "panels hold 4- or 8-bit codes or bf16");
  TORCH_CHECK(group > 0 && k % group == 0, "the group must divide K");
  const int64_t panels = (n + PANEL - 1) / PANEL;
  TORCH_CHECK(q.is_contiguous() && q.scalar_type() == at::kByte &&
                  q.numel() == panels * k * panel_bytes(bits),
              "q must be uint8 [P, K, ", panel_bytes(bits), "]");
  TORCH_CHECK(sc.is_contiguous() && (sc.scalar_type() == at::kHalf || sc.scalar_type() == at::kFloat) &&
                  sc.numel() == panels * (k / group) * 2 * PANEL,
              "sc must be float16 or float32 [P, K / group, 2, 16]");
}

// Call fn<Bits, S>() for the panels' code width and scale dtype.
template <typename Fn>
void dispatch_panels(int64_t bits, bool half, Fn fn) {
  if (bits == 4)
    half ? fn(std::integral_constant<int, 4>(), c10::Half()) : fn(std::integral_constant<int, 4>(), 0.0f);
  else if (bits == 8)
    half ? fn(std::integral_constant<int, 8>(), c10::Half()) : fn(std::integral_constant<int, 8>(), 0.0f);
  else
    half ? fn(std::integral_constant<int, 16>(), c10::Half()) : fn(std::integral_constant<int, 16>(), 0.0f);
}

// out [M, N] = x [M, K] W^T, x and out in one dtype; `generic` forces the portable loop.
void panel_gemm(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc, int64_t group,
                int64_t bits, bool generic) {
  panel_gemm_range(out, x, q, sc, group, bits, generic, PanelRange{});
}

void panel_gemm_range(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc, int64_t group,
                      int64_t bits, bool generic, PanelRange range) {
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && out.is_contiguous(), "x [M, K], out [M, N]");
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.size(0) == x.size(0), "out must match x");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  check_panels(q, sc, N, K, group, bits);
  const at::Tensor xc = x.contiguous();
  const PanelOperands a{out.data_ptr(), xc.data_ptr(), out.scalar_type(), M, N, K,
                        q.data_ptr<uint8_t>(), sc.data_ptr(), sc.scalar_type() == at::kHalf};
  panel_gemm_rows(a, group, bits, generic, range);
}

void panel_gemm_rows(const PanelOperands& a, int64_t group, int64_t bits, bool generic, PanelRange range) {
  const int64_t M = a.M, K = a.K;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.dtype, "panel_gemm", [&] {
    // float32 rows to broadcast from: 16-bit rows widened into this thread's buffer (a
    // torch conversion per call cost ~13 us of allocation and dispatch: 1.5 ms a decode
    // step of SmolLM2's 120 products)
    const float* x32 = static_cast<const float*>(a.x);
    if constexpr (!std::is_same_v<scalar_t, float>) {
      thread_local std::vector<float> widened;
      widened.resize(M * K);
      widen(static_cast<const scalar_t*>(a.x), widened.data(), M * K);
      x32 = widened.data();
    }
    dispatch_panels(bits, a.sc_half, [&](auto b, auto s) {
      using S = decltype(s);
      panel_gemm_impl<scalar_t, decltype(b)::value, S>(
          static_cast<scalar_t*>(a.out), x32, M, a.N, K, a.q, static_cast<const S*>(a.sc), group,
          generic, range);
    });
  });
}

// ---- expansion: W^T [K, N] (prefill-sized products multiply it by oneDNN's GEMM) ----------

template <typename T, int Bits, typename S>
void expand_panels_impl(T* out, const int64_t* rows, int64_t R, int64_t N, int64_t K,
                        const uint8_t* q, const S* sc, int64_t group, bool transposed) {
  const int64_t per_k = panel_bytes(Bits), groups = K / group;
  if (transposed) {  // W^T [K, N]: a panel's 16 values at k are one contiguous run
    const int64_t panels = (N + PANEL - 1) / PANEL;
    at::parallel_for(0, panels * groups, 1, [&](int64_t u0, int64_t u1) {
      float sg[2 * PANEL];
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t p = u / groups, g = u % groups, n0 = p * PANEL;
        const int64_t width = std::min(PANEL, N - n0);
        group_scales(sc + (p * groups + g) * 2 * PANEL, sg);
#ifdef CADENCE_PANEL_AVX512
        if constexpr (std::is_same_v<T, c10::BFloat16> && (Bits == 4 || Bits == 8)) {
          if (width == PANEL) {  // v s + c as the loop below (two roundings), 16 at once
            const __m512 s = _mm512_loadu_ps(sg), c = _mm512_loadu_ps(sg + PANEL);
            for (int64_t k = g * group; k < (g + 1) * group; ++k)
              store_bf16x16(out + k * N + n0, _mm512_add_ps(_mm512_mul_ps(codes16<Bits>(q + p * K * per_k, k), s), c));
            continue;
          }
        }
#endif
        for (int64_t k = g * group; k < (g + 1) * group; ++k) {
          const uint8_t* qk = q + (p * K + k) * per_k;
          T* o = out + k * N + n0;
          for (int64_t j = 0; j < width; ++j)
            store_t(o, j, panel_code<Bits>(qk, j) * sg[j] + sg[PANEL + j]);
        }
      }
    });
    return;
  }
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {  // rows W[rows[i]]: lookups
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t n = rows[i], p = n / PANEL, j = n % PANEL;
      T* o = out + i * K;
      for (int64_t g = 0; g < groups; ++g) {
        const S* sg = sc + (p * groups + g) * 2 * PANEL;
        const float s = static_cast<float>(sg[j]), c = static_cast<float>(sg[PANEL + j]);
        for (int64_t k = g * group; k < (g + 1) * group; ++k)
          store_t(o, k, panel_code<Bits>(q + (p * K + k) * per_k, j) * s + c);
      }
    }
  });
}

// W^T [K, N] into `out`, expanded in out's dtype.
void expand_panels(at::Tensor out, at::Tensor q, at::Tensor sc, int64_t group, int64_t bits) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous(), "out must be contiguous [K, N]");
  const int64_t K = out.size(0), N = out.size(1);
  check_panels(q, sc, N, K, group, bits);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "expand_panels", [&] {
    dispatch_panels(bits, sc.scalar_type() == at::kHalf, [&](auto b, auto s) {
      using S = decltype(s);
      expand_panels_impl<scalar_t, decltype(b)::value, S>(
          out.data_ptr<scalar_t>(), nullptr, 0, N, K, q.data_ptr<uint8_t>(),
          static_cast<const S*>(sc.data_ptr()), group, true);
    });
  });
}

// out [R, K] = W[rows]: an embedding lookup from the panels (rows < n, checked).
void panel_rows(at::Tensor out, at::Tensor q, at::Tensor sc, at::Tensor rows, int64_t n,
                int64_t group, int64_t bits) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous(), "out must be contiguous [R, K]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.size(0) == out.size(0),
              "rows must be int64 [R]");
  const at::Tensor ids = rows.contiguous();
  const int64_t K = out.size(1), R = ids.size(0);
  check_panels(q, sc, n, K, group, bits);
  const int64_t* rp = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < R; ++i)
    TORCH_CHECK(rp[i] >= 0 && rp[i] < n, "row ", rp[i], " is outside the table's ", n, " rows");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "panel_rows", [&] {
    dispatch_panels(bits, sc.scalar_type() == at::kHalf, [&](auto b, auto s) {
      using S = decltype(s);
      expand_panels_impl<scalar_t, decltype(b)::value, S>(
          out.data_ptr<scalar_t>(), rp, R, n, K, q.data_ptr<uint8_t>(),
          static_cast<const S*>(sc.data_ptr()), group, false);
    });
  });
}

}  // namespace cadence_cpu
