// The sampler's draw on a CPU, one row per task: a temperature softmax and an inverse-CDF
// draw in three passes over the row (max, weights and their sums, one block's scan),
// where the unfused PyTorch ops made five or six [rows, vocab] tensors (a float copy, a
// division, a softmax, a float64 copy and its running sum): 10.9 ms for 32 rows of
// 49,152, 15 % of a served decode step at temperature 1.
//
//   sample_rows(out, logits, temperature, uniform)
//       out[r] = argmax(logits[r]) (first index of the maximum) where temperature[r] == 0,
//       else a draw from softmax(logits[r] / temperature[r]) with uniform[r] in [0, 1)
//   draw_rows(out, probs, uniform)
//       a draw from the unnormalised non-negative weights probs[r] (top-k / top-p / min-p
//       already applied)
//
// The draw: the first token whose running sum exceeds u times the row's total. Sums are
// float64 over blocks of kBlock tokens (each block's sum vectorizes; the totals of blocks
// run in order), and the scan walks only the block the target falls in. A token of zero
// weight is never the first to exceed (its running sum equals the one before it), nor is
// a token whose logit is -inf (its weight is exactly 0, not exp's smallest float).

#include "common.h"

namespace cadence_cpu {
namespace {

constexpr int64_t kBlock = 512;  // tokens a block: a block's sums stay in L1

// Sum of n floats as float64 (eight partial sums: one vector register of doubles).
inline double sum_f64(const float* w, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(w[i + j]);
  double s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += static_cast<double>(w[i]);
  return s;
}

// The drawn token of weights w[0, n) with per-block sums `blocks`: see the file comment.
int64_t inverse_cdf(const float* w, int64_t n, const double* blocks, double u) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  double total = 0.0;
  for (int64_t b = 0; b < nb; ++b) total += blocks[b];
  if (!(total > 0.0)) return n - 1;  // no mass (or NaN): the last token, as torch's search
  const double target = std::min(u * total, std::nextafter(total, 0.0));
  double before = 0.0;
  int64_t b = 0;
  while (b + 1 < nb && !(before + blocks[b] > target)) before += blocks[b++];
  // Inside the block the sum runs token by token, which may round differently from the
  // block's vector sum: where it never exceeds the target, the block's last token of
  // non-zero weight is the draw (the target sits within rounding of the block's end).
  const int64_t j1 = std::min(n, (b + 1) * kBlock);
  int64_t last = -1;
  for (int64_t j = b * kBlock; j < j1; ++j) {
    if (w[j] > 0.0f) last = j;
    before += static_cast<double>(w[j]);
    if (before > target) return j;
  }
  return last >= 0 ? last : n - 1;
}

// Whether v replaces m as a running maximum under torch's argmax rule: a NaN is the
// maximum (the first NaN stays), otherwise a strictly greater value.
inline bool beats(float v, float m) { return v > m || (v != v && m == m); }

// The first index of the row's maximum (torch's argmax rule), in sixteen lanes: each lane
// keeps its first maximum, and of the lanes holding the maximum the lowest index wins.
template <typename T>
int64_t argmax_row(const T* x, int64_t n, float& best) {
  constexpr int L = 16;
  float lane_max[L];
  int32_t lane_arg[L];
  for (int l = 0; l < L; ++l) lane_max[l] = -std::numeric_limits<float>::infinity(), lane_arg[l] = l;
  int64_t j = 0;
  for (; j + L <= n; j += L)
    for (int l = 0; l < L; ++l) {
      const float v = load_f(x, j + l);
      const bool more = beats(v, lane_max[l]);
      lane_max[l] = more ? v : lane_max[l];
      lane_arg[l] = more ? static_cast<int32_t>(j + l) : lane_arg[l];
    }
  best = load_f(x, std::min<int64_t>(lane_arg[0], n - 1));
  int64_t arg = std::min<int64_t>(lane_arg[0], n - 1);
  for (int l = 1; l < L && l < n; ++l) {
    const bool tie = lane_max[l] == best || (lane_max[l] != lane_max[l] && best != best);
    if (beats(lane_max[l], best) || (tie && lane_arg[l] < arg))
      best = lane_max[l], arg = lane_arg[l];
  }
  for (; j < n; ++j) {
    const float v = load_f(x, j);
    if (beats(v, best)) best = v, arg = j;
  }
  return arg;
}

template <typename T>
int64_t sample_row(const T* x, int64_t n, float temperature, double u, float* w,
                   double* blocks) {
  float best;
  const int64_t arg = argmax_row(x, n, best);
  if (temperature == 0.0f || best == -std::numeric_limits<float>::infinity()) return arg;
  const float inv_t = 1.0f / temperature;
  for (int64_t b0 = 0, b = 0; b0 < n; b0 += kBlock, ++b) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    for (int64_t j = b0; j < b1; ++j) {
      const float z = (load_f(x, j) - best) * inv_t;
      w[j] = z < -87.0f ? 0.0f : exp_approx(z);  // -inf logits (banned tokens) weigh 0
    }
    blocks[b] = sum_f64(w + b0, b1 - b0);
  }
  return inverse_cdf(w, n, blocks, u);
}

void check_draw_args(const at::Tensor& out, const at::Tensor& rows, const at::Tensor& uniform) {
  check_rows(rows, "logits");
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) > 0, "logits must be [rows, vocab]");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kLong &&
                  out.numel() == rows.size(0), "out must be int64 [rows]");
  TORCH_CHECK(uniform.is_contiguous() && uniform.scalar_type() == at::kDouble &&
                  uniform.numel() == rows.size(0), "uniform must be float64 [rows]");
}

}  // namespace

void sample_rows(at::Tensor out, at::Tensor logits, at::Tensor temperature,
                 at::Tensor uniform) {
  check_draw_args(out, logits, uniform);
  TORCH_CHECK(temperature.is_contiguous() && temperature.scalar_type() == at::kFloat &&
                  temperature.numel() == logits.size(0), "temperature must be float32 [rows]");
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  int64_t* o = out.data_ptr<int64_t>();
  const float* t = temperature.data_ptr<float>();
  const double* u = uniform.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "sample_rows",
                                  [&] {
    const scalar_t* x = logits.data_ptr<scalar_t>();
    parallel_chunks(rows, 1, [&](int64_t r0, int64_t r1) {
      // A thread's row of weights, kept between calls: a fresh 200 KB vector a row is an
      // mmap and its page faults (a third of the kernel's time at 32 rows).
      static thread_local std::vector<float> w;
      static thread_local std::vector<double> blocks;
      w.resize(std::max<size_t>(w.size(), n));
      blocks.resize(std::max<size_t>(blocks.size(), nb));
      for (int64_t r = r0; r < r1; ++r)
        o[r] = sample_row(x + r * stride, n, t[r], u[r], w.data(), blocks.data());
    });
  });
}

void draw_rows(at::Tensor out, at::Tensor probs, at::Tensor uniform) {
  check_draw_args(out, probs, uniform);
  TORCH_CHECK(probs.scalar_type() == at::kFloat, "probs must be float32");
  const int64_t rows = probs.size(0), n = probs.size(1), stride = probs.stride(0);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  int64_t* o = out.data_ptr<int64_t>();
  const float* p = probs.data_ptr<float>();
  const double* u = uniform.data_ptr<double>();
  parallel_chunks(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> blocks(nb);
    for (int64_t r = r0; r < r1; ++r) {
      const float* w = p + r * stride;
      for (int64_t b0 = 0, b = 0; b0 < n; b0 += kBlock, ++b)
        blocks[b] = sum_f64(w + b0, std::min(n, b0 + kBlock) - b0);
      o[r] = inverse_cdf(w, n, blocks.data(), u[r]);
    }
  });
}

}  // namespace cadence_cpu
