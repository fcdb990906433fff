// torch's packed int4 CPU weights, expanded for prefill-sized products.

#include "common.h"

namespace cadence_cpu {

// W^T [K, rows] in dtype T from `_convert_weight_to_int4pack_for_cpu`'s bytes [N / B, K,
// B / 2] (per block of B rows and column k: low nibbles rows 0..B/2-1, high nibbles rows
// B/2..B-1; torch packs B = 64 rows with AVX-512, 32 with AVX2: int4_cpu.pack_block_rows)
// and scales_and_zeros [K / group, N, 2]: w = q * scale + (zero - 8 * scale), rounded where
// PyTorch's ops (int4_cpu.Int4PackCPU.dequantize_torch) round, so both give equal bits. W^T
// is the packed order: each column's B consecutive rows are computed and written as
// vectors (writing W [rows, K] instead needs a transposing copy: 2x slower).
// `accumulate`: add to `out` (a second plane), rounding the sum as PyTorch's add does.
template <typename T>
void expand_int4_impl(const uint8_t* packed, const T* sz, T* out, int64_t rows, int64_t K,
                      int64_t n_pad, int64_t group, int64_t B, bool accumulate) {
  const int64_t blocks = n_pad / B, groups = K / group, half = B / 2;
  at::parallel_for(0, blocks * groups, 1, [&](int64_t u0, int64_t u1) {
    float scale[64], offset[64], vals[64];
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t blk = u / groups, kg = u % groups;
      const int64_t last = std::min<int64_t>(B, rows - blk * B);
      const T* szg = sz + (kg * n_pad + blk * B) * 2;
      for (int j = 0; j < B; ++j) {
        scale[j] = load_f(szg, 2 * j);
        offset[j] = round_t<T>(load_f(szg, 2 * j + 1) - round_t<T>(8.0f * scale[j]));
      }
      for (int64_t kk = 0; kk < group; ++kk) {
        const uint8_t* b = packed + (blk * K + kg * group + kk) * half;
        for (int j = 0; j < half; ++j) {
          vals[j] = round_t<T>(static_cast<float>(b[j] & 15) * scale[j] + offset[j]);
          vals[j + half] =
              round_t<T>(static_cast<float>(b[j] >> 4) * scale[j + half] + offset[j + half]);
        }
        T* o = out + (kg * group + kk) * rows + blk * B;
        if (accumulate)
          for (int64_t j = 0; j < last; ++j) store_t(o, j, load_f(o, j) + vals[j]);
        else
          for (int64_t j = 0; j < last; ++j) store_t(o, j, vals[j]);
      }
    }
  });
}

// Expand into out = W^T [K, rows] (rows <= N: the padding rows are not written), from
// bytes packed in blocks of `block_rows` rows (32 or 64).
void expand_int4(at::Tensor out, at::Tensor packed, at::Tensor scales_zeros, int64_t group,
                 bool accumulate, int64_t block_rows) {
  TORCH_CHECK(out.is_contiguous() && packed.is_contiguous() && scales_zeros.is_contiguous(),
              "expand_int4 takes contiguous tensors");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2, "packed must be uint8 [N, K/2]");
  const int64_t n_pad = packed.size(0), K = packed.size(1) * 2, rows = out.size(1);
  TORCH_CHECK(block_rows == 32 || block_rows == 64, "block_rows must be 32 or 64");
  TORCH_CHECK(n_pad % block_rows == 0 && rows <= n_pad && out.size(0) == K, "shapes disagree");
  TORCH_CHECK(group > 0 && K % group == 0 && scales_zeros.numel() == (K / group) * n_pad * 2,
              "scales_and_zeros must be [K / group, N, 2]");
  TORCH_CHECK(scales_zeros.scalar_type() == out.scalar_type(), "scales dtype != out dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "expand_int4", [&] {
    expand_int4_impl<scalar_t>(packed.data_ptr<uint8_t>(), scales_zeros.data_ptr<scalar_t>(),
                               out.data_ptr<scalar_t>(), rows, K, n_pad, group, block_rows,
                               accumulate);
  });
}

}  // namespace cadence_cpu
