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
// Tiles, chosen when the kernels are built (-march=native): AVX-512 VNNI's `dpbusd`
// where the CPU has it (q8_tile_vnni, below), else AVX2's `maddubs` (q8_tile); and from
// AMX_ROWS batch rows, AMX-INT8 where the CPU has it and the OS lends the tiles
// (q8_tile_amx: one `tdpbsud` multiplies 16 rows by a block of a panel). All give the same
// sums in the same order: bit-identical results.
//
// Codes of up to 8 bits (the one-byte layout: Q5_0, Q5_1, Q5_K, Q8_0) take the VNNI and
// AMX tiles only (maddubs' 16-bit pairs would overflow at 255 x 127). Their offsets use
// the quantized activations' sums (sum_b d_b sum_k qx_k), not the float ones: a Q8_0
// weight's offset is -128 s, and 128 times each block's rounding error would otherwise
// stay in the result; this way the product is exactly qx's with the dequantized W.
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
#if defined(CADENCE_PANEL_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define CADENCE_PANEL_AMX 1
#endif

namespace cadence_cpu {

bool panel_q8_available(int64_t bits) {
#if defined(CADENCE_PANEL_VNNI)
  return bits == 4 || bits == 8;
#elif defined(CADENCE_PANEL_AVX2)
  return bits == 4;
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
// group sums [M, K / group]: of x itself, or (quantized_sums) of d_b qx.
void quantize_rows(const float* x, int64_t M, int64_t K, int64_t group, bool quantized_sums,
                   int8_t* qx, float* d, float* sums) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    for (int64_t g = 0; !quantized_sums && g < K / group; ++g) {
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
    for (int64_t g = 0; quantized_sums && g < K / group; ++g) {
      float s = 0.0f;
      for (int64_t b = g * group / QBLOCK; b < (g + 1) * group / QBLOCK; ++b) {
        int32_t n = 0;
        for (int64_t i = 0; i < QBLOCK; ++i) n += qx[m * K + b * QBLOCK + i];
        s += d[m * (K / QBLOCK) + b] * static_cast<float>(n);
      }
      sums[m * (K / group) + g] = s;
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
// One byte permute puts row j's four codes (columns k..k+3) in 32-bit lane j (4-bit
// panels: after their 32 bytes unpack to 64, low nibbles rows 0-7 then high nibbles rows
// 8-15); `dpbusd` multiplies them (unsigned) by a row's four int8 activations (broadcast)
// and adds the four products into lane j, in 32 bits: no 16-bit bound, no widening. The
// float steps per block and group are panel_q8's AVX2 tile's, in the same order: the same
// results.
constexpr int MRV = 8;  // batch rows a tile multiplies (3 of the 32 registers each)

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// byte j * 4 + c of the permuted register <- row j's code of column c: 4-bit panels
// (unpacked: bytes 0-31 low nibbles, 8 a column; 32-63 high nibbles) and one-byte panels
// (16 bytes a column)
alignas(64) constexpr int8_t ROW_LANES4[64] = {
    0,  8,  16, 24, 1,  9,  17, 25, 2,  10, 18, 26, 3,  11, 19, 27,
    4,  12, 20, 28, 5,  13, 21, 29, 6,  14, 22, 30, 7,  15, 23, 31,
    32, 40, 48, 56, 33, 41, 49, 57, 34, 42, 50, 58, 35, 43, 51, 59,
    36, 44, 52, 60, 37, 45, 53, 61, 38, 46, 54, 62, 39, 47, 55, 63};
alignas(64) constexpr int8_t ROW_LANES8[64] = {
    0,  16, 32, 48, 1,  17, 33, 49, 2,  18, 34, 50, 3,  19, 35, 51,
    4,  20, 36, 52, 5,  21, 37, 53, 6,  22, 38, 54, 7,  23, 39, 55,
    8,  24, 40, 56, 9,  25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
    12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};

// Bytes of a panel's codes per column.
constexpr int64_t code_bytes(int bits) { return bits == 4 ? 8 : 16; }

// The panel's codes of columns k..k+3, row j's four in 32-bit lane j.
template <int Bits>
inline __m512i row_codes(const uint8_t* q, int64_t k) {
  if constexpr (Bits == 4) {
    const __m256i nib = _mm256_set1_epi8(15);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 8));
    const __m256i lo = _mm256_and_si256(w, nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
    return _mm512_permutexvar_epi8(_mm512_load_si512(ROW_LANES4),
                                   _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  } else {
    return _mm512_permutexvar_epi8(_mm512_load_si512(ROW_LANES8), _mm512_loadu_si512(q + k * 16));
  }
}

template <int Bits, int MR_, typename S>
void q8_tile_vnni(const int8_t* qx, const float* d, const float* sums, int64_t K,
                  int64_t group, const uint8_t* q, const S* sc, float* acc) {
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
        const __m512i codes = row_codes<Bits>(q, k);
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

#ifdef CADENCE_PANEL_AMX
// AMX-INT8: a block (32 columns) of a panel against 16 batch rows is one `tdpbsud`: A =
// the rows' int8 codes (16 x 32 bytes, read in place from qx), B = the panel's codes laid
// out as VNNI's registers (8 rows of 64 bytes: row_codes of columns k..k+3), C = 16 x 16
// int32 sums, stored and finished by the VNNI tile's float steps in the same order (so
// the results are the same bits). Tiles of 32 rows run two A / C pairs against one B, so
// the codes unpack once per 32 rows. qx must hold whole tiles of 16 rows (zero padding):
// the padded rows are multiplied and never read.
constexpr int64_t AMX_ROWS = 16;  // batch rows from which the AMX tile runs

// The tile registers' shapes, loaded once per chunk of panels on the thread that runs it
// (a thread's tile state is its own), released at the end (a context switch then saves
// no tile data, and oneDNN's kernels load their own shapes).
class AmxTiles {
 public:
  AmxTiles() {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;  // palette 1
    auto shape = [&](int t, int rows, int bytes) {
      config[48 + t] = static_cast<uint8_t>(rows);
      std::memcpy(config + 16 + 2 * t, &bytes, 2);
    };
    for (int slot : {0, 4}) {         // (amx_block's two slots: tiles 0, 1, 3 and 4, 5, 7)
      shape(slot, QBLOCK / 4, 64);    // B: the block's codes, 4 columns a row
      shape(slot + 1, 16, QBLOCK);    // A: 16 rows' int8 codes of the block
      shape(slot + 3, 16, 64);        // C: 16 rows x 16 int32 sums
    }
    _tile_loadconfig(config);
  }
  ~AmxTiles() { _tile_release(); }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

// The block `blk` of a panel against 16 rows, into the int32 sums c [16, 16]: its codes
// laid out as B in b, then A (the rows' codes, in place) times B. Slot 0 and 1 use
// separate tile registers, so one block's product is in flight while the previous
// block's sums are finished.
template <int Bits, int Slot>
inline void amx_block(const int8_t* qx, int64_t K, const uint8_t* q, int64_t blk, uint8_t* b,
                      int32_t* c) {
  for (int64_t s = 0; s < QBLOCK / 4; ++s)
    _mm512_store_si512(b + s * 64, row_codes<Bits>(q, blk * QBLOCK + 4 * s));
  // (GCC's tile intrinsics take the register number as a literal)
  if constexpr (Slot == 0) {
    _tile_loadd(0, b, 64);
    _tile_loadd(1, qx + blk * QBLOCK, K);
    _tile_zero(3);
    _tile_dpbsud(3, 1, 0);
    _tile_stored(3, c, 64);
  } else {
    _tile_loadd(4, b, 64);
    _tile_loadd(5, qx + blk * QBLOCK, K);
    _tile_zero(7);
    _tile_dpbsud(7, 5, 4);
    _tile_stored(7, c, 64);
  }
}

// mr <= 16 rows (qx holding 16) against one panel, all of K, into acc [mr, 16].
template <int Bits, typename S>
void q8_tile_amx(const int8_t* qx, const float* d, const float* sums, int64_t K,
                 int64_t group, int mr, const uint8_t* q, const S* sc, float* acc) {
  alignas(64) uint8_t b[2][QBLOCK / 4 * 64];
  alignas(64) int32_t c[2][16 * PANEL];
  alignas(64) float f[16 * PANEL];
  const int64_t nb = K / QBLOCK, ng = K / group, per_group = group / QBLOCK;
  for (int r = 0; r < mr; ++r) _mm512_storeu_ps(acc + r * PANEL, _mm512_setzero_ps());
  amx_block<Bits, 0>(qx, K, q, 0, b[0], c[0]);
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int slot = blk & 1;
    if (blk + 1 < nb) {  // the next block's product, issued before this one's float steps
      if (slot == 0) amx_block<Bits, 1>(qx, K, q, blk + 1, b[1], c[1]);
      else amx_block<Bits, 0>(qx, K, q, blk + 1, b[0], c[0]);
    }
    const bool first = blk % per_group == 0;
    for (int r = 0; r < mr; ++r) {
      const __m512 db = _mm512_set1_ps(d[r * nb + blk]);
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(c[slot] + r * PANEL));
      const __m512 prev = first ? _mm512_setzero_ps() : _mm512_load_ps(f + r * PANEL);
      _mm512_store_ps(f + r * PANEL, _mm512_fmadd_ps(sum, db, prev));
    }
    if ((blk + 1) % per_group != 0) continue;
    const int64_t g = blk / per_group;
    const S* sg = sc + g * 2 * PANEL;
    const __m512 sv = load16(sg), cv = load16(sg + PANEL);
    for (int r = 0; r < mr; ++r) {
      const __m512 sx = _mm512_set1_ps(sums[r * ng + g]);
      const __m512 t = _mm512_loadu_ps(acc + r * PANEL);
      _mm512_storeu_ps(acc + r * PANEL,
                       _mm512_fmadd_ps(cv, sx, _mm512_fmadd_ps(_mm512_load_ps(f + r * PANEL), sv, t)));
    }
  }
}
#endif

}  // namespace
#endif

// out [M, N] = x [M, K] W^T for panels of codes of up to 4 or 8 bits (`bits`), x quantized
// to int8 per block of 32 columns.
void panel_gemm_q8(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc, int64_t group,
                   int64_t bits) {
  panel_gemm_q8_range(out, x, q, sc, group, bits, PanelRange{});
}

void panel_gemm_q8_range(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc,
                         int64_t group, int64_t bits, PanelRange range) {
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && out.is_contiguous(), "x [M, K], out [M, N]");
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.size(0) == x.size(0), "out must match x");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  check_panels(q, sc, N, K, group, bits);
  const at::Tensor xc = x.contiguous();
  const PanelOperands a{out.data_ptr(), xc.data_ptr(), out.scalar_type(), M, N, K,
                        q.data_ptr<uint8_t>(), sc.data_ptr(), sc.scalar_type() == at::kHalf};
  panel_gemm_q8_rows(a, group, bits, range);
}

void panel_gemm_q8_rows(const PanelOperands& a, int64_t group, int64_t bits, PanelRange range) {
  TORCH_CHECK(panel_q8_available(bits), "panel_gemm_q8: no int8 tile for ", bits,
              "-bit codes in this build (panel_q8_available)");
  TORCH_CHECK(group % QBLOCK == 0, "int8 activations need groups of a multiple of 32 columns");
#ifdef CADENCE_PANEL_AVX2
  const int64_t M = a.M, K = a.K, N = a.N;
  thread_local std::vector<float> widened;
  thread_local std::vector<int8_t> qx, pat;
  thread_local std::vector<float> d, sums;
#ifdef CADENCE_PANEL_AMX
  const bool amx = M >= AMX_ROWS && amx_permitted();
#else
  const bool amx = false;
#endif
  const int64_t padded = amx ? (M + 15) / 16 * 16 : M;  // (AMX reads whole 16-row tiles)
  qx.assign(padded * K, 0);
  d.resize(M * (K / QBLOCK));
  sums.resize(M * (K / group));
  const int64_t first = range.first, count = range.count(N);
  const uint8_t* qp = a.q;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.dtype, "panel_gemm_q8", [&] {
    const float* x32 = static_cast<const float*>(a.x);
    if constexpr (!std::is_same_v<scalar_t, float>) {
      widened.resize(M * K);
      widen(static_cast<const scalar_t*>(a.x), widened.data(), M * K);
      x32 = widened.data();
    }
    quantize_rows(x32, M, K, group, bits == 8, qx.data(), d.data(), sums.data());
#ifdef CADENCE_PANEL_VNNI
    const int8_t* patp = qx.data();  // (the VNNI and AMX tiles read the codes as they are)
#else
    pat.resize(M * K * 8);
    expand_patterns(qx.data(), M, K, pat.data());
    const int8_t* patp = pat.data();
#endif
    scalar_t* o = static_cast<scalar_t*>(a.out);
    // (the thread_local buffers are this thread's: the workers get pointers, not names)
    const float *dp = d.data(), *sump = sums.data();
    auto run = [&](auto s, auto code_bits) {
      using S = decltype(s);
      constexpr int Bits = decltype(code_bits)::value;
      const S* scp = static_cast<const S*>(a.sc);
      parallel_chunks(count, chunk_grain(count), [&](int64_t c0, int64_t c1) {
        const int64_t p0 = first + c0, p1 = first + c1;
        constexpr int rows_max = std::max<int>(MR_TILE, 16 * 2);
        float acc[rows_max * PANEL];
        auto store = [&](int64_t p, int64_t m0, int mr) {
          const int64_t n0 = p * PANEL, width = std::min(PANEL, N - n0);
          for (int r = 0; r < mr; ++r)
            for (int64_t j = 0; j < width; ++j) store_t(o + (m0 + r) * N + n0, j, acc[r * PANEL + j]);
        };
#ifdef CADENCE_PANEL_AMX
        if (amx) {
          AmxTiles tiles;
          for (int64_t p = p0; p < p1; ++p)
            for (int64_t m0 = 0; m0 < M; m0 += 16) {
              const int mr = static_cast<int>(std::min<int64_t>(16, M - m0));
              q8_tile_amx<Bits, S>(patp + m0 * K, dp + m0 * (K / QBLOCK), sump + m0 * (K / group), K, group, mr,
                   qp + p * K * code_bytes(Bits), scp + p * (K / group) * 2 * PANEL, acc);
              store(p, m0, mr);
            }
          return;
        }
#endif
        for (int64_t p = p0; p < p1; ++p) {
          for (int64_t m0 = 0; m0 < M; m0 += MR_TILE) {
            const int mr = static_cast<int>(std::min<int64_t>(MR_TILE, M - m0));
#ifdef CADENCE_PANEL_VNNI
            with_tile_rows<MR_TILE>(mr, [&](auto rows) {
              q8_tile_vnni<Bits, decltype(rows)::value>(
                  patp + m0 * K, dp + m0 * (K / QBLOCK), sump + m0 * (K / group), K, group,
                  qp + p * K * code_bytes(Bits), scp + p * (K / group) * 2 * PANEL, acc);
            });
#else
            with_tile_rows<MR_TILE>(mr, [&](auto rows) {
              q8_tile<decltype(rows)::value>(patp + m0 * K * 8, dp + m0 * (K / QBLOCK),
                                  sump + m0 * (K / group), K, group, qp + p * K * 8,
                                  scp + p * (K / group) * 2 * PANEL, acc);
            });
#endif
            store(p, m0, mr);
          }
        }
      });
    };
    auto with_bits = [&](auto s) {
#ifdef CADENCE_PANEL_VNNI
      if (bits == 8) return run(s, std::integral_constant<int, 8>{});
#endif
      run(s, std::integral_constant<int, 4>{});
    };
    if (a.sc_half) with_bits(c10::Half()); else with_bits(0.0f);
  });
#endif
}

}  // namespace cadence_cpu
