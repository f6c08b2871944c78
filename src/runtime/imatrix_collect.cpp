#include "runtime/imatrix_collect.h"

#include <cstring>

#include "backend/cpu/matmul.h"
#include "util/error.h"

namespace kimi::imatrix {

// ------------------------------------------------------------------------------------------------
const uint8_t* ImatrixBackend::place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) {
  const uint8_t* p = CpuBackend::place_weight(name, host, bytes);
  names_[p] = name;
  return p;
}

const std::string* ImatrixBackend::name_of(const uint8_t* p) const {
  auto it = names_.find(p);
  return it == names_.end() ? nullptr : &it->second;
}

Entry& ImatrixBackend::entry(const std::string& name, int64_t n_in, int64_t n_mat) {
  Entry& e = d_.entries[name];
  if (e.sum2.empty()) {
    e.n_in = n_in;
    e.n_mat = n_mat;
    e.sum2.assign(static_cast<size_t>(n_in * n_mat), 0.0);
    e.count.assign(static_cast<size_t>(n_mat), 0.0);
  }
  check(e.n_in == n_in && e.n_mat == n_mat, "imatrix: '{}' seen with {} x {} inputs, earlier {} x {}", name, n_in,
        n_mat, e.n_in, e.n_mat);
  return e;
}

namespace {
void add_sq(double* s, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s[i] += static_cast<double>(x[i]) * x[i];
}
}  // namespace

void ImatrixBackend::matmul(const kern::MatView& W, const float* x, int64_t n, float* y) {
  if (const std::string* nm = name_of(W.data)) {
    Entry& e = entry(*nm, W.cols, 1);
    for (int64_t t = 0; t < n; ++t) add_sq(e.sum2.data(), x + t * W.cols, W.cols);
    e.count[0] += static_cast<double>(n);
  }
  CpuBackend::matmul(W, x, n, y);
}

void ImatrixBackend::moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel,
                                 const float* weights, int64_t n_used, int64_t n_expert, float situ_beta,
                                 float situ_lambda, float* acc) {
  const std::string* ng = name_of(m.gate.data);
  const std::string* nu = name_of(m.up.data);
  const std::string* nd = name_of(m.down.data);
  const int64_t F = m.gate.rows;
  if (ng && nu && nd) {
    Entry& eg = entry(*ng, width, n_expert);
    Entry& eu = entry(*nu, width, n_expert);
    Entry& ed = entry(*nd, F, n_expert);
    for (int64_t ex = 0; ex < n_expert; ++ex) {
      // the tokens routed to this expert
      int64_t cnt = 0;
      for (int64_t i = 0; i < n * n_used; ++i)
        if (sel[i] == ex) ++cnt;
      if (cnt == 0) continue;
      xg_.resize(static_cast<size_t>(cnt * width));
      g_.resize(static_cast<size_t>(cnt * F));
      u_.resize(static_cast<size_t>(cnt * F));
      int64_t c = 0;
      for (int64_t i = 0; i < n * n_used; ++i)
        if (sel[i] == ex) std::memcpy(&xg_[static_cast<size_t>(c++ * width)], x + (i / n_used) * width, static_cast<size_t>(width) * 4);
      for (int64_t t = 0; t < cnt; ++t) {
        add_sq(&eg.sum2[static_cast<size_t>(ex * width)], &xg_[static_cast<size_t>(t * width)], width);
        add_sq(&eu.sum2[static_cast<size_t>(ex * width)], &xg_[static_cast<size_t>(t * width)], width);
      }
      eg.count[static_cast<size_t>(ex)] += static_cast<double>(cnt);
      eu.count[static_cast<size_t>(ex)] += static_cast<double>(cnt);
      // the down projection's input: SiTU(gate x) * up x, recomputed with the same kernels
      kern::MatView gw = m.gate, uw = m.up;
      gw.data += m.gate_slice * static_cast<uint64_t>(ex);
      uw.data += m.up_slice * static_cast<uint64_t>(ex);
      kern::matmul(gw, xg_.data(), cnt, g_.data(), pool_, precision());
      kern::matmul(uw, xg_.data(), cnt, u_.data(), pool_, precision());
      CpuBackend::situ_rows(g_.data(), u_.data(), cnt, F, situ_beta, situ_lambda);
      for (int64_t t = 0; t < cnt; ++t) add_sq(&ed.sum2[static_cast<size_t>(ex * F)], &g_[static_cast<size_t>(t * F)], F);
      ed.count[static_cast<size_t>(ex)] += static_cast<double>(cnt);
    }
  }
  CpuBackend::moe_experts(m, x, n, width, sel, weights, n_used, n_expert, situ_beta, situ_lambda, acc);
}

void ImatrixBackend::mla_absorb_queries(const kern::MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n,
                                        int64_t H, int64_t nope, int64_t pe, float* qcat) {
  if (const std::string* nm = name_of(k_b.data)) {
    Entry& e = entry(*nm, nope, H);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) add_sq(&e.sum2[static_cast<size_t>(h * nope)], q + (t * H + h) * (nope + pe), nope);
    for (int64_t h = 0; h < H; ++h) e.count[static_cast<size_t>(h)] += static_cast<double>(n);
  }
  CpuBackend::mla_absorb_queries(k_b, slice_bytes, q, n, H, nope, pe, qcat);
}

void ImatrixBackend::mla_value_heads(const kern::MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n,
                                     int64_t H, float* o) {
  if (const std::string* nm = name_of(v_b.data)) {
    const int64_t kvl = v_b.cols;
    Entry& e = entry(*nm, kvl, H);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) add_sq(&e.sum2[static_cast<size_t>(h * kvl)], z + (t * H + h) * kvl, kvl);
    for (int64_t h = 0; h < H; ++h) e.count[static_cast<size_t>(h)] += static_cast<double>(n);
  }
  CpuBackend::mla_value_heads(v_b, slice_bytes, z, n, H, o);
}

}  // namespace kimi::imatrix
