// The elementwise chains of a decoder layer, one call each: RMSNorm with the residual add,
// rotary in place, SiLU-and-mul.

#include "common.h"

namespace cadence_cpu {

// ---- RMSNorm with the residual add ---------------------------------------------------

// gemma: Gemma's RMSNorm, whose weight is an offset from 1 and whose product is taken in
// float32 before the one rounding (Llama's rounds the normed value first, then scales).
template <typename T>
void add_rms_norm_impl(const at::Tensor& x, const at::Tensor* residual,
                       const at::Tensor& weight, double eps, bool gemma, at::Tensor& out,
                       at::Tensor& res_out) {
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
      if (rp) {  // x + residual is a dtype-T tensor in PyTorch: round it
        const T* rr = rp + r * rs;
        for (int64_t i = 0; i < n; ++i) h[i] = round_t<T>(load_f(xr, i) + load_f(rr, i));
      } else {  // (two loops: with the choice inside, the compiler left the loop scalar)
        for (int64_t i = 0; i < n; ++i) h[i] = load_f(xr, i);
      }
      const float ss = dot(h.data(), h.data(), n);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      T* o = op + r * n;
      if (gemma) {
        for (int64_t i = 0; i < n; ++i) store_t(o, i, (h[i] * inv) * (1.0f + load_f(wp, i)));
      } else {
        for (int64_t i = 0; i < n; ++i) store_t(o, i, load_f(wp, i) * round_t<T>(h[i] * inv));
      }
      if (rp) {  // without a residual, x itself is the returned sum: nothing to write
        T* s = sp + r * n;
        for (int64_t i = 0; i < n; ++i) store_t(s, i, h[i]);
      }
    }
  });
}

std::vector<at::Tensor> add_rms_norm(at::Tensor x, c10::optional<at::Tensor> residual,
                                        at::Tensor weight, double eps, bool gemma) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, hidden]");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "bad norm weight");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "norm weight dtype != x dtype");
  if (residual) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
                "residual must match x");
  }
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  auto res_out = residual ? at::empty({x.size(0), x.size(1)}, x.options()) : x;
  const at::Tensor* rp = residual ? &*residual : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm",
                                  [&] { add_rms_norm_impl<scalar_t>(x, rp, weight, eps, gemma, out, res_out); });
  return {out, res_out};
}

// ---- rotary embedding, in place ------------------------------------------------------

template <typename T>
void rotate_rows(at::Tensor& t, const T* cos, const T* sin, int64_t cs_stride) {
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

void rotary_(at::Tensor q, at::Tensor k, at::Tensor cos, at::Tensor sin) {
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

at::Tensor silu_and_mul(at::Tensor x) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "x must be [rows, 2 * d]");
  const int64_t rows = x.size(0), d = x.size(1) / 2, xs = x.stride(0);
  auto out = at::empty({rows, d}, x.options());
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

}  // namespace cadence_cpu
