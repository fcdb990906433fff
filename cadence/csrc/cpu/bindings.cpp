// Fused CPU kernels for the decode step: the Python module's bindings
// (cadence/layers/cpu_ops.py builds and loads them; one file per job beside this one).
//
// A CPU decode step at small batch is not bound by its matmuls alone: each decoder layer
// also ran ~50 small PyTorch ops (RMSNorm as pow/mean/rsqrt/mul/cast, rotary as
// cat/neg/mul/add for q and k, SiLU and the gate multiply, and a token-by-token gather of
// every decoding request's K/V for SDPA), each a few microseconds of dispatch. Each
// function here does one of those chains in one call:
//
//   add_rms_norm(x, residual?, weight, eps, gemma=False) -> (out, x + residual)
//   rotary_(q, k, cos, sin)                  rotate q and k in place (rotate-half layout)
//   silu_and_mul(x) -> out                   silu(x[:, :d]) * x[:, d:]
//   paged_attention(out, q, k_cache, v_cache, block_tables, rows, query_lens, seq_lens,
//                   block_size, scale, window, softcap)
//                                            short queries read K/V straight from the pool
//   bind_threads(cores)                      pin the intra-op threads, one to a core
//   expand_int4(out, packed, sz, group, acc, block_rows)
//                                            a packed int4 weight, expanded as W^T [K, N]
//   panel_gemm(out, x, q, sc, group, bits, generic)
//                                            x W^T from GGUF codes in 16-row panels
//   expand_panels(out, q, sc, group, bits)   the panels expanded as W^T [K, N]
//   panel_rows(out, q, sc, rows, n, group, bits)
//                                            rows of the panels' W (embedding lookups)
//   panel_gemm_q8(out, x, q, sc, group, bits)
//                                            x W^T for 4- or 8-bit panels, x as int8
//   panel_q8_available(bits)                 whether this build has panel_gemm_q8 for them
//   moe_panels(x, ids, weights, q13, sc13, q2, sc2, first, width, group13, bits13,
//              group2, bits2, int8_13, int8_2) -> out
//                                            a mixture's experts from GGUF panels
//   panel_gemm_bf16(out, x, q, sc, group, bits)
//                                            x W^T for 4- or 8-bit panels on AMX-BF16 tiles
//   panel_bf16_available(bits)               whether this build and OS have them
//   sample_rows(out, logits, temperature, uniform)
//                                            greedy or temperature draws, one a row
//   draw_rows(out, probs, uniform)           inverse-CDF draws from unnormalised weights
//
// Rounding follows PyTorch's unfused ops: math in float32, results rounded to the
// activation dtype wherever PyTorch's op would write a tensor of that dtype, so bf16
// outputs equal the unfused layers' up to the order of float32 sums.

#include <torch/extension.h>

namespace cadence_cpu {
std::vector<at::Tensor> add_rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual,
                                        torch::Tensor weight, double eps, bool gemma);
void rotary_(torch::Tensor q, torch::Tensor k, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_and_mul(torch::Tensor x);
void paged_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                     torch::Tensor v_cache, torch::Tensor block_tables, torch::Tensor first_row,
                     torch::Tensor query_lens, torch::Tensor seq_lens, int64_t block_size,
                     double scale, int64_t window, double softcap);
void expand_int4(torch::Tensor out, torch::Tensor packed, torch::Tensor scales_zeros,
                 int64_t group, bool accumulate, int64_t block_rows);
void panel_gemm(torch::Tensor out, torch::Tensor x, torch::Tensor q, torch::Tensor sc,
                int64_t group, int64_t bits, bool generic);
void expand_panels(torch::Tensor out, torch::Tensor q, torch::Tensor sc, int64_t group,
                   int64_t bits);
void panel_rows(torch::Tensor out, torch::Tensor q, torch::Tensor sc, torch::Tensor rows,
                int64_t n, int64_t group, int64_t bits);
void panel_gemm_q8(torch::Tensor out, torch::Tensor x, torch::Tensor q, torch::Tensor sc,
                   int64_t group, int64_t bits);
bool panel_q8_available(int64_t bits);
torch::Tensor moe_panels(torch::Tensor x, torch::Tensor ids, torch::Tensor weights,
                         torch::Tensor q13, torch::Tensor sc13, torch::Tensor q2, torch::Tensor sc2,
                         int64_t first, int64_t width, int64_t group13, int64_t bits13,
                         int64_t group2, int64_t bits2, bool int8_13, bool int8_2);
void panel_gemm_bf16(torch::Tensor out, torch::Tensor x, torch::Tensor q, torch::Tensor sc,
                     int64_t group, int64_t bits);
bool panel_bf16_available(int64_t bits);
void sample_rows(torch::Tensor out, torch::Tensor logits, torch::Tensor temperature,
                 torch::Tensor uniform);
void draw_rows(torch::Tensor out, torch::Tensor probs, torch::Tensor uniform);
void bind_threads(std::vector<int64_t> cores);
}  // namespace cadence_cpu

using namespace cadence_cpu;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "(norm(x + residual), x + residual)", py::arg("x"),
        py::arg("residual"), py::arg("weight"), py::arg("eps"), py::arg("gemma") = false);
  m.def("rotary_", &rotary_, "rotate q and k in place");
  m.def("silu_and_mul", &silu_and_mul, "silu(x[:, :d]) * x[:, d:]");
  m.def("paged_attention", &paged_attention, "short-query attention over the paged KV pool");
  m.def("bind_threads", &bind_threads, "pin OpenMP thread i to cores[i]");
  m.def("panel_gemm", &panel_gemm, "x W^T from GGUF codes in 16-row panels");
  m.def("expand_panels", &expand_panels, "the panels' W^T [K, N]");
  m.def("panel_rows", &panel_rows, "rows of the panels' W");
  m.def("panel_gemm_q8", &panel_gemm_q8, "x W^T for 4- or 8-bit panels, x quantized to int8");
  m.def("panel_q8_available", &panel_q8_available, "whether panel_gemm_q8 is built for bits");
  m.def("moe_panels", &moe_panels, "a mixture's experts from GGUF panels, in one call");
  m.def("panel_gemm_bf16", &panel_gemm_bf16, "x W^T for 4- or 8-bit panels, AMX-BF16 tiles");
  m.def("panel_bf16_available", &panel_bf16_available, "whether panel_gemm_bf16 runs here");
  m.def("sample_rows", &sample_rows, "argmax or a temperature draw per row");
  m.def("draw_rows", &draw_rows, "an inverse-CDF draw per row of unnormalised weights");
  m.def("expand_int4", &expand_int4, "expand torch's packed int4 weight as W^T [K, rows]");
}

