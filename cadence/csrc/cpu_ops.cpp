// Fused CPU kernels for the decode step (cadence/layers/cpu_ops.py builds and loads them).
//
// A CPU decode step at small batch is not bound by its matmuls alone: each decoder layer
// also ran ~50 small PyTorch ops (RMSNorm as pow/mean/rsqrt/mul/cast, rotary as
// cat/neg/mul/add for q and k, SiLU and the gate multiply, and a token-by-token gather of
// every decoding request's K/V for SDPA), each a few microseconds of dispatch. Each
// function here does one of those chains in one call:
//
//   add_rms_norm(x, residual?, weight, eps) -> (out, x + residual)
//   rotary_(q, k, cos, sin)                  rotate q and k in place (rotate-half layout)
//   silu_and_mul(x) -> out                   silu(x[:, :d]) * x[:, d:]
//   paged_attention(out, q, k_cache, v_cache, block_tables, rows, query_lens, seq_lens,
//                   block_size, scale)       short queries read K/V straight from the pool
//   bind_threads(cores)                      pin the intra-op threads, one to a core
//   expand_int4(out, packed, sz, group, acc, transposed)  a packed int4 weight, expanded
//
// Rounding follows PyTorch's unfused ops: math in float32, results rounded to the
// activation dtype wherever PyTorch's op would write a tensor of that dtype, so bf16
// outputs equal the unfused layers' up to the order of float32 sums.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline float to_f(T v) {
  return static_cast<float>(v);
}

template <typename T>
inline T to_t(float v) {
  return static_cast<T>(v);
}

// bf16 by bit operations: c10's conversions check for NaN with a branch, which stops the
// compiler from vectorizing any loop that converts (measured: SiLU-and-mul 10x slower).
// Round to nearest even, as c10 does; NaN inputs stay NaN (quiet NaNs, the only kind
// arithmetic produces).
inline uint16_t bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

template <>
inline float to_f<c10::BFloat16>(c10::BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <>
inline c10::BFloat16 to_t<c10::BFloat16>(float v) {
  return c10::BFloat16(bf16_bits(v), c10::BFloat16::from_bits());
}

// Element j of a row, read and written through 16-bit integers for bf16: loads of
// c10::BFloat16 (a class) keep a loop scalar, loads of uint16_t vectorize.
template <typename T>
inline float load_f(const T* p, int64_t j) {
  return to_f(p[j]);
}

template <>
inline float load_f<c10::BFloat16>(const c10::BFloat16* p, int64_t j) {
  const uint32_t u = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[j]) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename T>
inline void store_t(T* p, int64_t j, float v) {
  p[j] = to_t<T>(v);
}

template <>
inline void store_t<c10::BFloat16>(c10::BFloat16* p, int64_t j, float v) {
  reinterpret_cast<uint16_t*>(p)[j] = bf16_bits(v);
}

// Round through the activation dtype (a no-op for float32).
template <typename T>
inline float round_t(float v) {
  return to_f(to_t<T>(v));
}

// Dot product of n floats with sixteen partial sums (the compiler keeps them in one
// vector register; a single running sum would serialise every add).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  float s = acc[0];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// exp(x) for the softmax, branch-free so a loop of them vectorizes (std::exp is a scalar
// libm call: ~2,300 of them a layer at 256 keys were a third of the kernel). Cody-Waite
// range reduction and Cephes' degree-6 polynomial: within 2 ulp of expf on [-87, 88];
// below -87 it returns 2^-126 instead of 0, which a softmax sum cannot tell apart.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);  // vectorizes (-fno-math-errno)
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// A row of n values widened to float32 (bf16: the 16 bits are a float's high half; a
// loop of shifts the compiler vectorizes, where c10's scalar conversion is not).
template <typename T>
inline void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <>
inline void widen<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

// ---- RMSNorm with the residual add ---------------------------------------------------

template <typename T>
void add_rms_norm_impl(const torch::Tensor& x, const torch::Tensor* residual,
                       const torch::Tensor& weight, double eps, torch::Tensor& out,
                       torch::Tensor& res_out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* rp = residual ? residual->data_ptr<T>() : nullptr;
  const T* wp = weight.data_ptr<T>();
  T* op = out.data_ptr<T>();
  T* sp = res_out.data_ptr<T>();
  const int64_t xs = x.stride(0), rs = residual ? residual->stride(0) : 0;
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> h(n);
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = xp + r * xs;
      for (int64_t i = 0; i < n; ++i)  // x + residual is a dtype-T tensor in PyTorch: round it
        h[i] = rp ? round_t<T>(load_f(xr, i) + load_f(rp + r * rs, i)) : load_f(xr, i);
      const float ss = dot(h.data(), h.data(), n);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      T* o = op + r * n;
      for (int64_t i = 0; i < n; ++i) store_t(o, i, load_f(wp, i) * round_t<T>(h[i] * inv));
      if (rp) {  // without a residual, x itself is the returned sum: nothing to write
        T* s = sp + r * n;
        for (int64_t i = 0; i < n; ++i) store_t(s, i, h[i]);
      }
    }
  });
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual,
                                        torch::Tensor weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, hidden]");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "bad norm weight");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "norm weight dtype != x dtype");
  if (residual) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
                "residual must match x");
  }
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  auto res_out = residual ? torch::empty({x.size(0), x.size(1)}, x.options()) : x;
  const torch::Tensor* rp = residual ? &*residual : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm",
                                  [&] { add_rms_norm_impl<scalar_t>(x, rp, weight, eps, out, res_out); });
  return {out, res_out};
}

// ---- rotary embedding, in place ------------------------------------------------------

template <typename T>
void rotate_rows(torch::Tensor& t, const T* cos, const T* sin, int64_t cs_stride) {
  const int64_t tokens = t.size(0), heads = t.size(1), dim = t.size(2), half = dim / 2;
  T* p = t.data_ptr<T>();
  const int64_t ts = t.stride(0), hs = t.stride(1);
  at::parallel_for(0, tokens * heads, 64, [&](int64_t i0, int64_t i1) {
    std::vector<float> x(dim);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t tok = i / heads, head = i % heads;
      T* row = p + tok * ts + head * hs;
      const T* c = cos + tok * cs_stride;
      const T* s = sin + tok * cs_stride;
      for (int64_t d = 0; d < dim; ++d) x[d] = load_f(row, d);
      // q * cos + rotate_half(q) * sin, each product rounded as PyTorch's would be; the
      // two halves as two loops (no branch in either).
      for (int64_t d = 0; d < half; ++d)
        store_t(row, d, round_t<T>(x[d] * load_f(c, d)) + round_t<T>(-x[d + half] * load_f(s, d)));
      for (int64_t d = half; d < dim; ++d)
        store_t(row, d, round_t<T>(x[d] * load_f(c, d)) + round_t<T>(x[d - half] * load_f(s, d)));
    }
  });
}

void rotary_(torch::Tensor q, torch::Tensor k, torch::Tensor cos, torch::Tensor sin) {
  check_rows(q, "q");
  check_rows(k, "k");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, "q and k must be [tokens, heads, dim]");
  TORCH_CHECK(q.size(2) % 2 == 0, "rotary needs an even head dim");
  TORCH_CHECK(cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type(),
              "cos/sin dtype != q dtype");
  auto c = cos.reshape({cos.size(0), -1}).contiguous();
  auto s = sin.reshape({sin.size(0), -1}).contiguous();
  TORCH_CHECK(c.size(0) == q.size(0) && c.size(1) == q.size(2), "cos/sin must be [tokens, 1, dim]");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "rotary_", [&] {
    rotate_rows<scalar_t>(q, c.data_ptr<scalar_t>(), s.data_ptr<scalar_t>(), c.size(1));
    rotate_rows<scalar_t>(k, c.data_ptr<scalar_t>(), s.data_ptr<scalar_t>(), c.size(1));
  });
}

// ---- SiLU and multiply ----------------------------------------------------------------

torch::Tensor silu_and_mul(torch::Tensor x) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "x must be [rows, 2 * d]");
  const int64_t rows = x.size(0), d = x.size(1) / 2, xs = x.stride(0);
  auto out = torch::empty({rows, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    // Rows in parallel; a row is a loop the compiler vectorizes (exp_approx, no libm call).
    at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* gate = xp + r * xs;
        const scalar_t* up = gate + d;
        scalar_t* o = op + r * d;
        for (int64_t j = 0; j < d; ++j) {
          const float g = load_f(gate, j);
          const float silu = round_t<scalar_t>(g / (1.0f + exp_approx(-g)));
          store_t(o, j, silu * load_f(up, j));
        }
      }
    });
  });
  return out;
}

// ---- paged attention for short queries ------------------------------------------------

// One unit of work: query token `qi` of request `b`, the `group` query heads that share KV
// head `kvh`. Scores for every key it sees, softmax, then the weighted sum of V, reading
// the keys block by block where they lie in the pool (no gathered copy of the context).
// Keys are walked by block, not by position: a position -> slot division per key cost
// more than the arithmetic.
template <typename T, int DC>
void attend_unit(T* out, const T* q, int64_t q_tok_stride, int64_t q_head_stride,
                 int64_t o_tok_stride, int64_t o_head_stride, const T* kc, const T* vc,
                 int64_t slot_stride, int64_t head_dim_rt, const int64_t* table, int64_t block_size,
                 int64_t row, int64_t keys, int64_t kvh, int64_t group, float scale,
                 std::vector<float>& qf, std::vector<float>& scores, std::vector<float>& rows,
                 std::vector<float>& acc) {
  // DC: the head dim as a compile-time constant (64, 128: loops fully unrolled and
  // vectorized), 0 for any other (a runtime bound).
  const int64_t D = DC > 0 ? DC : head_dim_rt;
  qf.resize(group * D);
  scores.resize(group * keys);
  rows.resize(block_size * D);
  acc.assign(group * D, 0.0f);
  for (int64_t g = 0; g < group; ++g)
    widen(q + row * q_tok_stride + (kvh * group + g) * q_head_stride, &qf[g * D], D);
  const int64_t blocks = (keys + block_size - 1) / block_size;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t first = blk * block_size, n = std::min(block_size, keys - first);
    const T* base = kc + table[blk] * block_size * slot_stride + kvh * D;
    for (int64_t j = 0; j < n; ++j) widen(base + j * slot_stride, &rows[j * D], D);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t j = 0; j < n; ++j)
        scores[g * keys + first + j] = dot(&qf[g * D], &rows[j * D], D) * scale;
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = &scores[g * keys];
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < keys; ++p) m = std::max(m, s[p]);
    float sum = 0.0f;
    for (int64_t p = 0; p < keys; ++p) s[p] = exp_approx(s[p] - m);
    for (int64_t p = 0; p < keys; ++p) sum += s[p];
    const float inv = 1.0f / sum;
    for (int64_t p = 0; p < keys; ++p) s[p] *= inv;
  }
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t first = blk * block_size, n = std::min(block_size, keys - first);
    const T* base = vc + table[blk] * block_size * slot_stride + kvh * D;
    for (int64_t j = 0; j < n; ++j) widen(base + j * slot_stride, &rows[j * D], D);
    for (int64_t g = 0; g < group; ++g) {
      float* a = &acc[g * D];
      for (int64_t j = 0; j < n; ++j) {
        const float w = scores[g * keys + first + j];
        const float* v = &rows[j * D];
        for (int64_t d = 0; d < D; ++d) a[d] += w * v[d];
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    T* o = out + row * o_tok_stride + (kvh * group + g) * o_head_stride;
    for (int64_t d = 0; d < D; ++d) store_t(o, d, acc[g * D + d]);
  }
}

// out/q: [T, Hq, D]; k_cache/v_cache: [slots, Hkv, D]; block_tables: [B, max_blocks] int64;
// first_row/query_lens/seq_lens: [B] int64 (the request's first row in q, its query
// tokens, and its keys including them). Query token i of a request sits at position
// seq_len - query_len + i and sees keys 0..that position.
void paged_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                     torch::Tensor v_cache, torch::Tensor block_tables, torch::Tensor first_row,
                     torch::Tensor query_lens, torch::Tensor seq_lens, int64_t block_size,
                     double scale) {
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
  // Units: (request, query token, KV head), flattened through a prefix sum over queries.
  std::vector<int64_t> unit_start(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ql[b] >= 1 && ql[b] <= sl[b], "query_len must be in 1..seq_len");
    TORCH_CHECK((sl[b] + block_size - 1) / block_size <= max_blocks, "block table too short");
    unit_start[b + 1] = unit_start[b] + ql[b] * Hkv;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t* kc = k_cache.data_ptr<scalar_t>();
    const scalar_t* vc = v_cache.data_ptr<scalar_t>();
    const int64_t* tp = tables.data_ptr<int64_t>();
    at::parallel_for(0, unit_start[B], 1, [&](int64_t u0, int64_t u1) {
      std::vector<float> qf, scores, kf, acc;
      int64_t b = std::upper_bound(unit_start.begin(), unit_start.end(), u0) - unit_start.begin() - 1;
      for (int64_t u = u0; u < u1; ++u) {
        while (u >= unit_start[b + 1]) ++b;
        const int64_t local = u - unit_start[b], qi = local / Hkv, kvh = local % Hkv;
        const int64_t keys = sl[b] - ql[b] + qi + 1;
        auto unit = D == 64 ? attend_unit<scalar_t, 64>
                    : D == 128 ? attend_unit<scalar_t, 128>
                               : attend_unit<scalar_t, 0>;
        unit(op, qp, q.stride(0), q.stride(1), out.stride(0), out.stride(1), kc,
                              vc, Hkv * D, D, tp + b * max_blocks, block_size, fr[b] + qi, keys,
                              kvh, group, static_cast<float>(scale), qf, scores, kf, acc);
      }
    });
  });
}

// ---- int4 weights: expanding torch's packed layout ------------------------------------

// W in dtype T from `_convert_weight_to_int4pack_for_cpu`'s bytes [N / 64, K, 32] (per
// block of 64 rows and column k: low nibbles rows 0..31, high nibbles rows 32..63) and
// scales_and_zeros [K / group, N, 2]: w = q * scale + (zero - 8 * scale), rounded where
// PyTorch's ops (int4_cpu.Int4PackCPU.dequantize_torch) round, so both give equal bits.
// `transposed`: out is W^T [K, rows], which the packed order writes directly (64
// consecutive rows of one column at a time, vectorized); else out is W [rows, K], written
// through a small tile and a transposing copy (1.7x slower). `accumulate`: add to `out`
// (a second plane), rounding the sum as PyTorch's add does.
template <typename T>
void expand_int4_impl(const uint8_t* packed, const T* sz, T* out, int64_t rows, int64_t K,
                      int64_t n_pad, int64_t group, bool accumulate, bool transposed) {
  const int64_t blocks = n_pad / 64, groups = K / group;
  at::parallel_for(0, blocks * groups, 1, [&](int64_t u0, int64_t u1) {
    float scale[64], offset[64], vals[64];
    std::vector<float> tile(transposed ? 0 : group * 64);  // [k in group][row in block]
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t blk = u / groups, kg = u % groups;
      const int64_t last = std::min<int64_t>(64, rows - blk * 64);
      const T* szg = sz + (kg * n_pad + blk * 64) * 2;
      for (int j = 0; j < 64; ++j) {
        scale[j] = load_f(szg, 2 * j);
        offset[j] = round_t<T>(load_f(szg, 2 * j + 1) - round_t<T>(8.0f * scale[j]));
      }
      for (int64_t kk = 0; kk < group; ++kk) {
        const uint8_t* b = packed + (blk * K + kg * group + kk) * 32;
        float* t = transposed ? vals : &tile[kk * 64];
        for (int j = 0; j < 32; ++j) {
          t[j] = round_t<T>(static_cast<float>(b[j] & 15) * scale[j] + offset[j]);
          t[j + 32] = round_t<T>(static_cast<float>(b[j] >> 4) * scale[j + 32] + offset[j + 32]);
        }
        if (transposed) {
          T* o = out + (kg * group + kk) * rows + blk * 64;
          if (accumulate)
            for (int64_t j = 0; j < last; ++j) store_t(o, j, load_f(o, j) + vals[j]);
          else
            for (int64_t j = 0; j < last; ++j) store_t(o, j, vals[j]);
        }
      }
      if (transposed) continue;
      for (int64_t j = 0; j < last; ++j) {
        T* o = out + (blk * 64 + j) * K + kg * group;
        if (accumulate)
          for (int64_t kk = 0; kk < group; ++kk) store_t(o, kk, load_f(o, kk) + tile[kk * 64 + j]);
        else
          for (int64_t kk = 0; kk < group; ++kk) store_t(o, kk, tile[kk * 64 + j]);
      }
    }
  });
}

// Expand into out: [rows, K], or [K, rows] when `transposed` (rows <= N: the padding rows
// are not written).
void expand_int4(torch::Tensor out, torch::Tensor packed, torch::Tensor scales_zeros,
                 int64_t group, bool accumulate, bool transposed) {
  TORCH_CHECK(out.is_contiguous() && packed.is_contiguous() && scales_zeros.is_contiguous(),
              "expand_int4 takes contiguous tensors");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2, "packed must be uint8 [N, K/2]");
  const int64_t n_pad = packed.size(0), K = packed.size(1) * 2;
  const int64_t rows = transposed ? out.size(1) : out.size(0);
  TORCH_CHECK(n_pad % 64 == 0 && rows <= n_pad && out.size(transposed ? 0 : 1) == K,
              "shapes disagree");
  TORCH_CHECK(group > 0 && K % group == 0 && scales_zeros.numel() == (K / group) * n_pad * 2,
              "scales_and_zeros must be [K / group, N, 2]");
  TORCH_CHECK(scales_zeros.scalar_type() == out.scalar_type(), "scales dtype != out dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "expand_int4", [&] {
    expand_int4_impl<scalar_t>(packed.data_ptr<uint8_t>(), scales_zeros.data_ptr<scalar_t>(),
                               out.data_ptr<scalar_t>(), rows, K, n_pad, group, accumulate,
                               transposed);
  });
}

// ---- threads ------------------------------------------------------------------------

// Pin OpenMP thread i (PyTorch's intra-op pool: ATen's parallel_for runs on it) to
// cores[i]. Thread 0 is the calling thread. Threads that migrate between cores lose their
// caches and, on a small machine, land on the core another process is using.
void bind_threads(std::vector<int64_t> cores) {
  const int n = static_cast<int>(cores.size());
  TORCH_CHECK(n >= 1, "bind_threads needs at least one core");
  std::vector<int> failed(n, 0);
  omp_set_num_threads(n);
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cores[t]), &set);
    failed[t] = sched_setaffinity(0, sizeof(set), &set) != 0;
  }
  for (int t = 0; t < n; ++t)
    TORCH_CHECK(!failed[t], "could not pin thread ", t, " to core ", cores[t]);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "(norm(x + residual), x + residual)");
  m.def("rotary_", &rotary_, "rotate q and k in place");
  m.def("silu_and_mul", &silu_and_mul, "silu(x[:, :d]) * x[:, d:]");
  m.def("paged_attention", &paged_attention, "short-query attention over the paged KV pool");
  m.def("bind_threads", &bind_threads, "pin OpenMP thread i to cores[i]");
  m.def("expand_int4", &expand_int4, "expand torch's packed int4 weight ([rows, K] or [K, rows])");
}
