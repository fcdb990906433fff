// A mixture's experts on a CPU in one call, from GGUF panels (cadence/quant/gguf_experts.py):
// the (token, slot) pairs grouped by expert, each expert's rows times its [gate; up]
// panels, SiLU-and-mul, times its down panels, and every token's outputs summed by their
// routing weights.
//
// Why: in Python the same step was ~20 tensor operations around the two grouped products
// (grouping, gathers, the weighted sum), ~0.45 ms a layer at one row against ~0.3 ms of
// products; llama.cpp does the whole block in one op. The products are panel_products.cpp's:
// the panels of every chosen expert shared out in ranges over the threads.
//
// Sums: each pair's down output is multiplied by its weight and added to its token's
// float32 sum in expert order, rounded once to the activations' dtype (in float32, the
// torch reference's multiply-then-add in the same order: the same result).

#include "panels.h"

namespace cadence_cpu {

at::Tensor silu_and_mul(at::Tensor x);

namespace {

// out rows = blocks of x times each block's expert panels (q[e], sc[e]), as panel_products;
// each block's operands are pointers into the stacks and the row buffers, not tensor views
// (a view costs ~1 us of dispatch: 64 a layer at top-8, several percent of a decoded token).
void expert_products(const at::Tensor& out, const at::Tensor& x, const std::vector<int64_t>& experts,
                     const std::vector<int64_t>& sizes, const at::Tensor& q, const at::Tensor& sc,
                     int64_t group, int64_t bits, bool int8) {
  const int64_t N = out.size(1), K = x.size(1), panels = (N + PANEL - 1) / PANEL;
  TORCH_CHECK(out.is_contiguous() && x.is_contiguous() && out.scalar_type() == x.scalar_type(),
              "moe_panels: contiguous rows of one dtype");
  TORCH_CHECK(q.is_contiguous() && sc.is_contiguous(), "moe_panels: contiguous panel stacks");
  check_panels(q.select(0, 0), sc.select(0, 0), N, K, group, bits);  // (every expert's layout)
  const size_t count = experts.size();
  const int64_t row_bytes_x = K * x.element_size(), row_bytes_out = N * out.element_size();
  const int64_t q_bytes = q.stride(0), sc_bytes = sc.stride(0) * sc.element_size();
  std::vector<PanelOperands> operands;
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    operands.push_back(PanelOperands{
        static_cast<char*>(out.data_ptr()) + row * row_bytes_out,
        static_cast<const char*>(x.data_ptr()) + row * row_bytes_x, x.scalar_type(), sizes[i], N, K,
        q.data_ptr<uint8_t>() + experts[i] * q_bytes,
        static_cast<const char*>(sc.data_ptr()) + experts[i] * sc_bytes,
        sc.scalar_type() == at::kHalf});
    row += sizes[i];
  }
  const int64_t total = panels * static_cast<int64_t>(count);
  const int64_t grain = std::max<int64_t>(1, total / (at::get_num_threads() * 4));
  std::vector<std::pair<size_t, PanelRange>> ranges;
  for (size_t i = 0; i < count; ++i)
    for (int64_t p = 0; p < panels; p += grain) ranges.push_back({i, PanelRange{p, std::min(grain, panels - p)}});
  parallel_chunks(static_cast<int64_t>(ranges.size()), 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto& [i, range] = ranges[r];
      if (int8)
        panel_gemm_q8_rows(operands[i], group, bits, range);
      else
        panel_gemm_rows(operands[i], group, bits, false, range);
    }
  });
}

}  // namespace

// out [T, H] = sum_j weights[t, j] * expert[ids[t, j] - first](x[t]) over this rank's
// experts (first .. first + E - 1; other ids add nothing). x [T, H] in the activations'
// dtype; ids [T, k] int64; weights [T, k] float32 or x's dtype. q13 / sc13: every expert's
// [gate; up] panels stacked [E, ...] ([2I, H] weights), q2 / sc2 the down ones ([H, I]);
// int8_13 / int8_2: whether each side's products quantize their activations to int8 (a
// Q4_K gate|up may, a Q6_K down not: gguf_cpu.PanelsCPU.register_tiles decides).
at::Tensor moe_panels(at::Tensor x, at::Tensor ids, at::Tensor weights, at::Tensor q13,
                      at::Tensor sc13, at::Tensor q2, at::Tensor sc2, int64_t first,
                      int64_t width, int64_t group13, int64_t bits13, int64_t group2,
                      int64_t bits2, bool int8_13, bool int8_2) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "moe_panels: x must be contiguous [T, H]");
  TORCH_CHECK(ids.dim() == 2 && ids.size(0) == x.size(0) && ids.scalar_type() == at::kLong,
              "moe_panels: ids must be int64 [T, k]");
  TORCH_CHECK(weights.sizes() == ids.sizes(), "moe_panels: weights must be [T, k]");
  TORCH_CHECK(q13.size(0) == q2.size(0) && sc13.size(0) == q13.size(0) && sc2.size(0) == q2.size(0),
              "moe_panels: as many experts in every stack");
  const int64_t T = x.size(0), H = x.size(1), k = ids.size(1), E = q13.size(0);
  const at::Tensor idc = ids.contiguous();
  const at::Tensor wf = weights.to(at::kFloat).contiguous();
  const int64_t* idp = idc.data_ptr<int64_t>();
  // Counting sort of the pairs by expert (pair order kept within each expert).
  std::vector<int64_t> counts(E + 1, 0);
  for (int64_t p = 0; p < T * k; ++p) {
    const int64_t e = idp[p] - first;
    ++counts[(e >= 0 && e < E) ? e : E];
  }
  std::vector<int64_t> experts, sizes, start(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    start[e + 1] = start[e] + counts[e];
    if (counts[e]) {
      experts.push_back(e);
      sizes.push_back(counts[e]);
    }
  }
  const int64_t P = start[E];
  at::Tensor out = at::zeros_like(x);
  if (P == 0) return out;
  std::vector<int64_t> order(P), fill(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < T * k; ++p) {
    const int64_t e = idp[p] - first;
    if (e >= 0 && e < E) order[fill[e]++] = p;
  }
  at::Tensor tokens = at::empty({P}, ids.options());
  int64_t* tp = tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < P; ++i) tp[i] = order[i] / k;
  const at::Tensor rows = x.index_select(0, tokens);
  at::Tensor gate_up = at::empty({P, 2 * width}, x.options());
  expert_products(gate_up, rows, experts, sizes, q13, sc13, group13, bits13, int8_13);
  const at::Tensor h = silu_and_mul(gate_up);
  at::Tensor down = at::empty({P, H}, x.options());
  expert_products(down, h, experts, sizes, q2, sc2, group2, bits2, int8_2);
  // Each token's pairs in expert order: the pair's position in `order` for (t, slot).
  std::vector<int64_t> position(T * k, -1);
  for (int64_t i = 0; i < P; ++i) position[order[i]] = i;
  const float* wp = wf.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "moe_panels", [&] {
    const scalar_t* dp = down.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
      std::vector<std::pair<int64_t, int64_t>> mine;  // (position, pair) of a token's slots
      std::vector<float> acc(H);
      for (int64_t t = t0; t < t1; ++t) {
        mine.clear();
        for (int64_t j = 0; j < k; ++j)
          if (position[t * k + j] >= 0) mine.push_back({position[t * k + j], t * k + j});
        if (mine.empty()) continue;
        std::sort(mine.begin(), mine.end());  // expert order, as the reference adds them
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (const auto& [pos, pair] : mine) {
          const scalar_t* y = dp + pos * H;
          const float w = wp[pair];
          for (int64_t c = 0; c < H; ++c) acc[c] += to_f(y[c]) * w;
        }
        for (int64_t c = 0; c < H; ++c) store_t(op + t * H, c, acc[c]);
      }
    });
  });
  return out;
}

}  // namespace cadence_cpu
