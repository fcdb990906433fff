// bf16 activations times GGUF panels on AMX-BF16 tiles: each block of a panel (16 weight
// rows x 32 columns) is dequantized once, in registers, to bf16 (the weights
// expand_panels writes: v s + c rounded to bf16), laid out as a B tile, and multiplied
// into every 16-row tile of the batch by one `tdpbf16ps`, the sums staying float32 in the
// C tiles over all of K.
//
//   panel_gemm_bf16(out, x, q, sc, group, bits)   out [M, N] = x [M, K] W^T, x bf16
//
// Why: the int8 tiles (panel_q8.cpp) finish every 32-column block's integer sums in float
// for every batch row (a load, a conversion and three multiply-adds a row and block), so
// their cost grows with the rows; here the per-block work is the dequantization, shared by
// every row, and a row costs one tile product. The result is x times the bf16-expanded
// weight in float32 (oneDNN's GEMM on expand_panels' W^T computes the same, in another
// order of sums), with no 8-bit rounding of the activations. (The tiles read subnormal
// bf16 values as zero and flush subnormal sums: the expansion keeps them.)

#include "panels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__) && \
    defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define CADENCE_PANEL_AMX_BF16 1
#include <immintrin.h>
#endif

namespace cadence_cpu {

bool panel_bf16_available(int64_t bits) {
#ifdef CADENCE_PANEL_AMX_BF16
  return (bits == 4 || bits == 8) && amx_permitted();
#else
  (void)bits;
  return false;
#endif
}

#ifdef CADENCE_PANEL_AMX_BF16
namespace {

constexpr int64_t KB = 32;     // columns of K a B tile holds (16 rows of bf16 pairs)
constexpr int ROW_TILES = 3;   // 16-row tiles of the batch a pass multiplies (48 rows)

// Tile registers: B in 0 and 1 (alternate blocks), A (a row tile's activations) in 2-4,
// C (its float32 sums) in 5-7. Every tile is 16 rows of 64 bytes.
class BfTiles {
 public:
  BfTiles() {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      config[48 + t] = 16;
      const uint16_t bytes = 64;
      std::memcpy(config + 16 + 2 * t, &bytes, 2);
    }
    _tile_loadconfig(config);
  }
  ~BfTiles() { _tile_release(); }
  BfTiles(const BfTiles&) = delete;
  BfTiles& operator=(const BfTiles&) = delete;
};

inline __m512 scales16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 scales16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Word 2i + h of the result <- word i of half h (a: columns k, b: k + 1): B's pairs.
alignas(64) constexpr uint16_t PAIRS[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                            21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                            11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// Block `blk` of a panel as a B tile in b (16 rows of 64 bytes: row i, lane j = the bf16
// weights of panel row j at columns 2i and 2i + 1).
template <int Bits>
inline void dequant_block(const uint8_t* q, int64_t blk, __m512 s, __m512 c, uint16_t* b) {
  const __m512i pairs = _mm512_load_si512(PAIRS);
  for (int i = 0; i < KB / 2; ++i) {
    const int64_t k = blk * KB + 2 * i;
    const __m512 w0 = _mm512_add_ps(_mm512_mul_ps(codes16<Bits>(q, k), s), c);
    const __m512 w1 = _mm512_add_ps(_mm512_mul_ps(codes16<Bits>(q, k + 1), s), c);
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(w1, w0);  // w0 low half, w1 high
    _mm512_store_si512(b + i * 32, _mm512_permutexvar_epi16(pairs, both));
  }
}

// Row tile T of x (block blk) into A tile 2 + T, times B tile b_tile, into C tile 5 + T.
// (GCC's tile intrinsics take register numbers as literals, hence the spelled-out cases.)
template <int T>
inline void row_tile_product(const uint16_t* x, int64_t K, int64_t blk, int b_tile) {
  const uint16_t* a = x + T * 16 * K + blk * KB;
  if constexpr (T == 0) {
    _tile_loadd(2, a, K * 2);
    if (b_tile == 0) _tile_dpbf16ps(5, 2, 0); else _tile_dpbf16ps(5, 2, 1);
  } else if constexpr (T == 1) {
    _tile_loadd(3, a, K * 2);
    if (b_tile == 0) _tile_dpbf16ps(6, 3, 0); else _tile_dpbf16ps(6, 3, 1);
  } else {
    _tile_loadd(4, a, K * 2);
    if (b_tile == 0) _tile_dpbf16ps(7, 4, 0); else _tile_dpbf16ps(7, 4, 1);
  }
}

// tiles (1-3) row tiles of x (bf16 [16 * tiles, K]) against one panel, all of K, into
// acc [16 * tiles, 16] float32.
template <int Bits, typename S>
void panel_pass(const uint16_t* x, int64_t K, int64_t group, int tiles, const uint8_t* q,
                const S* sc, float* acc) {
  alignas(64) uint16_t b[2][16 * 32];
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  __m512 s = _mm512_setzero_ps(), c = s;
  for (int64_t blk = 0; blk < K / KB; ++blk) {
    if (blk * KB % group == 0) {
      const S* sg = sc + (blk * KB / group) * 2 * PANEL;
      s = scales16(sg), c = scales16(sg + PANEL);
    }
    const int slot = blk & 1;
    dequant_block<Bits>(q, blk, s, c, b[slot]);
    if (slot == 0) _tile_loadd(0, b[0], 64);
    else _tile_loadd(1, b[1], 64);
    row_tile_product<0>(x, K, blk, slot);
    if (tiles > 1) row_tile_product<1>(x, K, blk, slot);
    if (tiles > 2) row_tile_product<2>(x, K, blk, slot);
  }
  _tile_stored(5, acc, 64);
  if (tiles > 1) _tile_stored(6, acc + 16 * PANEL, 64);
  if (tiles > 2) _tile_stored(7, acc + 32 * PANEL, 64);
}

}  // namespace
#endif

void panel_gemm_bf16(at::Tensor out, at::Tensor x, at::Tensor q, at::Tensor sc, int64_t group,
                     int64_t bits) {
  TORCH_CHECK(panel_bf16_available(bits), "panel_gemm_bf16: no AMX-BF16 tiles for ", bits,
              "-bit codes here (panel_bf16_available)");
#ifdef CADENCE_PANEL_AMX_BF16
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && out.is_contiguous(), "x [M, K], out [M, N]");
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "x and out must be CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "panel_gemm_bf16 takes bf16 activations");
  TORCH_CHECK(out.size(0) == x.size(0), "out must have x's rows");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat,
              "out must be bf16 or float32");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  TORCH_CHECK(K % KB == 0 && group % KB == 0, "K and the group must be multiples of 32");
  check_panels(q, sc, N, K, group, bits);
  // The rows padded to whole tiles of 16 (the padding is multiplied and never read).
  const int64_t row_tiles = (M + 15) / 16;
  thread_local std::vector<uint16_t> padded;
  padded.assign(row_tiles * 16 * K, 0);
  const at::Tensor xc = x.contiguous();
  std::memcpy(padded.data(), xc.data_ptr(), M * K * sizeof(uint16_t));
  const uint16_t* xp = padded.data();
  const int64_t panels = (N + PANEL - 1) / PANEL;
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const bool f32 = out.scalar_type() == at::kFloat;
  void* op = out.data_ptr();
  auto run = [&](auto code_bits, auto s) {
    constexpr int Bits = decltype(code_bits)::value;
    using S = decltype(s);
    const S* scp = static_cast<const S*>(sc.data_ptr());
    parallel_chunks(panels, chunk_grain(panels), [&](int64_t p0, int64_t p1) {
      BfTiles tiles;
      alignas(64) float acc[ROW_TILES * 16 * PANEL];
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * PANEL, width = std::min(PANEL, N - n0);
        for (int64_t t0 = 0; t0 < row_tiles; t0 += ROW_TILES) {
          const int tiles_now = static_cast<int>(std::min<int64_t>(ROW_TILES, row_tiles - t0));
          panel_pass<Bits, S>(xp + t0 * 16 * K, K, group, tiles_now, qp + p * K * (Bits * 2),
                              scp + p * (K / group) * 2 * PANEL, acc);
          const int64_t m1 = std::min(M, (t0 + tiles_now) * 16);
          for (int64_t m = t0 * 16; m < m1; ++m) {
            const float* a = acc + (m - t0 * 16) * PANEL;
            if (f32) std::memcpy(static_cast<float*>(op) + m * N + n0, a, width * sizeof(float));
            else
              for (int64_t j = 0; j < width; ++j)
                reinterpret_cast<uint16_t*>(op)[m * N + n0 + j] = bf16_bits(a[j]);
          }
        }
      }
    });
  };
  const bool half = sc.scalar_type() == at::kHalf;
  if (bits == 4)
    half ? run(std::integral_constant<int, 4>(), c10::Half()) : run(std::integral_constant<int, 4>(), 0.0f);
  else
    half ? run(std::integral_constant<int, 8>(), c10::Half()) : run(std::integral_constant<int, 8>(), 0.0f);
#endif
}

}  // namespace cadence_cpu
