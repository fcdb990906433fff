// Helpers shared by the CPU kernels (cadence/csrc/cpu/*.cpp): dtype conversion that the
// compiler can vectorize, dot products, a branch-free exp, and argument checks.
//
// Rounding follows PyTorch's unfused ops: math in float32, results rounded to the
// activation dtype wherever PyTorch's op would write a tensor of that dtype.
#pragma once

#include <ATen/ATen.h>  // not torch/extension.h: only bindings.cpp needs pybind11

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace cadence_cpu {

// Run fn(i0, i1) over [0, n) in chunks of `grain` that the intra-op threads claim from a
// shared counter, rather than at::parallel_for's equal static shares. On a machine where
// another process takes part of one core (a client, the API server), a static share makes
// every product wait for the thread on that core: measured on 2 cores with a process
// busy half of one core's time, a decode step took 1.7x as long. Claimed chunks let the
// other thread do more of the work.
template <typename F>
inline void parallel_chunks(int64_t n, int64_t grain, const F& fn) {
  const int64_t threads = at::get_num_threads();
  if (threads <= 1 || n <= grain || at::in_parallel_region()) {
    for (int64_t i0 = 0; i0 < n; i0 += grain) fn(i0, std::min(n, i0 + grain));
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i0 = next.fetch_add(grain); i0 < n; i0 = next.fetch_add(grain))
      fn(i0, std::min(n, i0 + grain));
  });
}

// A grain that cuts n items into about `per_thread` chunks a thread.
inline int64_t chunk_grain(int64_t n, int64_t per_thread = 6) {
  return std::max<int64_t>(1, n / (at::get_num_threads() * per_thread));
}

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

inline void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

}  // namespace cadence_cpu
