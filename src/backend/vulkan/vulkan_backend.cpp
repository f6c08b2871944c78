// The Vulkan backend (vulkan_backend.h): memory, dense algebra, the residual mix, caches, the
// MLA per-head matmuls and the routed experts. Attention and the indexer are in vk_attention.cpp,
// KDA and the router in vk_kda.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/vulkan/vk_backend_impl.h"
#include "backend/vulkan/vulkan_backend.h"
#include "tensor/types.h"
#include "util/error.h"

namespace kimi {

namespace {

class VkBuffer final : public Buffer {
 public:
  VkBuffer(Backend* owner, vk::Runtime& rt, const vk::Runtime::Alloc& a, uint64_t bytes)
      : Buffer(owner, reinterpret_cast<void*>(a.addr), bytes), rt_(rt), a_(a) {}
  ~VkBuffer() override { rt_.free(a_); }

 private:
  vk::Runtime& rt_;
  vk::Runtime::Alloc a_;
};

}  // namespace

std::vector<VulkanDeviceInfo> list_vulkan_devices() {
  std::vector<VulkanDeviceInfo> out;
  for (const vk::DeviceInfo& d : vk::list_devices()) {
    VulkanDeviceInfo v;
    v.index = static_cast<int>(d.index);
    v.name = d.name;
    v.type = d.type;
    v.memory = d.device_local;
    v.usable = d.usable;
    v.missing = d.missing;
    out.push_back(v);
  }
  return out;
}

std::unique_ptr<Backend> make_vulkan_backend(int index, Precision prec) {
  check(index >= 0, "vulkan: device index {} is negative", index);
  return std::make_unique<VulkanBackend>(index, prec);
}

VulkanBackend::VulkanBackend(int index, Precision prec)
    : rt_(static_cast<uint32_t>(index)), prec_(prec), name_(fmt::format("vulkan:{}", index)) {
  const char* portable = std::getenv("KIMI_VULKAN_PORTABLE");
  subgroup_ = rt_.info().subgroup_arith && !(portable && std::string(portable) == "1");
  if (const char* g = std::getenv("KIMI_VULKAN_GEMM_MIN")) {
    char* end = nullptr;
    const long long v = std::strtoll(g, &end, 10);
    check(end != g && *end == '\0' && v >= 1, "KIMI_VULKAN_GEMM_MIN='{}': expected a token count >= 1", g);
    gemm_min_ = v;
  }
}

VulkanBackend::~VulkanBackend() {
  rt_.sync();
  weights_.clear();
  for (auto& [n, p] : pipes_) rt_.destroy(p);
}

BackendStats VulkanBackend::stats() const {
  BackendStats s;
  s.bytes_to_device = rt_.bytes_to_device();
  s.bytes_from_device = rt_.bytes_from_device();
  s.device_bytes = rt_.device_bytes();
  s.weight_bytes = weight_bytes_;
  s.submits = rt_.submits();
  s.cmd_recorded = rt_.recorded();
  s.cmd_replayed = rt_.replayed();
  s.record_seconds = rt_.record_seconds();
  return s;
}

// ---- memory ----

std::unique_ptr<Buffer> VulkanBackend::alloc(uint64_t bytes, const char* what) {
  const vk::Runtime::Alloc a = rt_.alloc(bytes, what);
  return std::make_unique<VkBuffer>(this, rt_, a, bytes);
}

// Identity of a placed weight: contexts made over the same model share one upload, a different
// model (even one mapped at the same address with the same names) gets its own.
std::string VulkanBackend::weight_key(const std::string& name, const uint8_t* host, uint64_t bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over up to 64 samples of 64 bytes spread over the tensor
  const uint64_t step = std::max<uint64_t>(64, bytes / 64);
  for (uint64_t off = 0; off < bytes; off += step)
    for (uint64_t i = off; i < std::min(bytes, off + 64); ++i) h = (h ^ host[i]) * 1099511628211ull;
  return fmt::format("{}@{}+{}#{:x}", name, static_cast<const void*>(host), bytes, h);
}

const uint8_t* VulkanBackend::place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) {
  const std::string key = weight_key(name, host, bytes);
  auto it = weights_.find(key);
  if (it == weights_.end()) {
    auto b = alloc(bytes, name.c_str());
    rt_.upload(dev_addr(b->data()), host, bytes);
    weight_bytes_ += bytes;
    it = weights_.emplace(key, std::move(b)).first;
  }
  return static_cast<const uint8_t*>(it->second->data());
}

void VulkanBackend::upload(void* dst, const void* host_src, uint64_t bytes) { rt_.upload(dev_addr(dst), host_src, bytes); }
void VulkanBackend::download(void* host_dst, const void* src, uint64_t bytes) {
  rt_.download(host_dst, dev_addr(src), bytes);
}
void VulkanBackend::copy(void* dst, const void* src, uint64_t bytes) { rt_.copy(dev_addr(dst), dev_addr(src), bytes); }
void VulkanBackend::fill_zero(void* dst, uint64_t bytes) { rt_.fill_zero(dev_addr(dst), bytes); }
void VulkanBackend::sync() { rt_.sync(); }
void VulkanBackend::flush() { rt_.flush(); }

// the most tiles moe_sort.comp can cut `slots` (token, expert) pairs into: ceil(slots / BN) plus one
// partial tile per non-empty bucket (the experts and the bucket of slots held elsewhere)
static int64_t moe_max_tiles(int64_t slots, int64_t n_expert) {
  constexpr int64_t kBN = 32;  // mm_tiled.comp's BN
  return (slots + kBN - 1) / kBN + std::min(n_expert + 1, slots);
}

void VulkanBackend::reserve(const WorkLimits& lim) {
  lim_ = lim;
  // staging: the largest host input of one step (entries, row lists, a residual upload) twice over
  const uint64_t d_guess = static_cast<uint64_t>(std::max<int64_t>(lim.expert_width, 4096));
  rt_.reserve_staging(std::max<uint64_t>(8u << 20, static_cast<uint64_t>(lim.n_tokens) * d_guess * 4 * 4));
  const int64_t slots = lim.n_tokens * lim.n_expert_used;
  ex_gate_.reset();
  ex_up_.reset();
  ex_out_.reset();
  ex_sort_.reset();
  if (lim.n_expert > 0 && slots > 0) {
    ex_gate_ = alloc(static_cast<uint64_t>(slots * lim.expert_ff) * 4, "expert gate rows");
    ex_up_ = alloc(static_cast<uint64_t>(slots * lim.expert_ff) * 4, "expert up rows");
    ex_out_ = alloc(static_cast<uint64_t>(slots * lim.expert_width) * 4, "expert outputs");
    ex_sort_ = alloc(static_cast<uint64_t>(4 + 4 * moe_max_tiles(slots, lim.n_expert) + slots) * 4, "expert grouping");
  }
  scratch_ = (ex_gate_ ? ex_gate_->bytes() * 2 + ex_out_->bytes() + ex_sort_->bytes() : 0);
}

uint64_t VulkanBackend::scratch_bytes() const {
  uint64_t b = scratch_;
  for (const auto& s : op_scratch_)
    if (s) b += s->bytes();
  return b;
}

void* VulkanBackend::op_scratch(int which, uint64_t bytes) {
  auto& s = op_scratch_[which];
  if (!s || s->bytes() < bytes) {  // grows on the first use of a larger shape only
    if (s) rt_.sync();
    s = alloc(std::max<uint64_t>(bytes, 1u << 16), which == 0 ? "attention scratch" : "kda scratch");
  }
  return s->data();
}

vk::Pipeline& VulkanBackend::pipe(const char* shader) {
  auto it = pipes_.find(shader);  // heterogeneous lookup: no string is built
  if (it == pipes_.end()) {
    it = pipes_.emplace(shader, vk::Pipeline{}).first;
    it->second.shader = it->first.c_str();
  }
  return it->second;
}

// the shader suffix of a weight type ("q8_0"), nullptr without shaders for it
static const char* type_suffix(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "f32";
    case GgmlType::F16: return "f16";
    case GgmlType::BF16: return "bf16";
    case GgmlType::Q8_0: return "q8_0";
    case GgmlType::Q4_0: return "q4_0";
    case GgmlType::Q5_0: return "q5_0";
    case GgmlType::Q5_1: return "q5_1";
    case GgmlType::MXFP4: return "mxfp4";
    case GgmlType::Q4_K: return "q4_k";
    case GgmlType::Q5_K: return "q5_k";
    case GgmlType::Q6_K: return "q6_k";
    case GgmlType::Q2_K: return "q2_k";
    case GgmlType::Q3_K: return "q3_k";
    case GgmlType::IQ4_XS: return "iq4_xs";
    default: return nullptr;
  }
}

vk::Pipeline& VulkanBackend::mm_pipe(GgmlType t) {
  const char* sfx = type_suffix(t);
  if (!sfx) fail("vulkan: no matmul shader for weight type {}", type_name(t));
  char name[32];
  std::snprintf(name, sizeof(name), "mm_%s%s", sfx, subgroup_ ? "_sg" : "");
  return pipe(name);
}

uint64_t VulkanBackend::stage_entries(const BatchEntry* e, int64_t n) {
  static_assert(sizeof(BatchEntry) == 16, "BatchEntry is staged as 4 ints");
  // want_logits is a bool in the 4th int: shaders read only token, seq_id and pos
  return rt_.stage(e, static_cast<uint64_t>(n) * sizeof(BatchEntry));
}

// ---- dense algebra ----

void VulkanBackend::mm(const MatView& W, const float* x, int64_t n, float* y, int64_t batch, const MmArgs& a) {
  if (n <= 0 || batch <= 0 || W.rows <= 0) return;
  if (a.sel == nullptr && n >= gemm_min_) return mm_tiled(W, x, n, y, batch, a);
  struct {
    uint64_t w, x, y, sel, slice_bytes;
    uint32_t rows, cols, n, row_bytes, ldx, ldy, x_batch, y_batch, x_div;
  } pc{dev_addr(W.data), dev_addr(x), dev_addr(y), dev_addr(a.sel), a.slice_bytes,
       u32(W.rows, "matmul rows"), u32(W.cols, "matmul cols"), u32(n, "matmul tokens"), u32(static_cast<int64_t>(W.row_bytes), "row bytes"),
       u32(static_cast<int64_t>(a.ldx), "ldx"), u32(static_cast<int64_t>(a.ldy), "ldy"),
       u32(static_cast<int64_t>(a.x_batch), "x batch"), u32(static_cast<int64_t>(a.y_batch), "y batch"), a.x_div};
  constexpr int64_t kTile = 8;  // tokens per workgroup (mm.comp TT)
  // _sg: 4 rows per subgroup (mm.comp NR), 4 x 64 / subgroup size rows per workgroup (the shader's grid
  // stride covers any count, should the device run other subgroup sizes); portable: one row per workgroup
  const int64_t sg = rt_.info().subgroup_size;
  const int64_t rows_per_group = subgroup_ && sg > 0 && sg < 64 ? 4 * (64 / sg) : 1;
  rt_.dispatch(mm_pipe(W.type), &pc, sizeof(pc), groups((W.rows + rows_per_group - 1) / rows_per_group),
               u32((n + kTile - 1) / kTile, "token tiles"), u32(batch, "matmul batch"));
}

void VulkanBackend::mm_tiled(const MatView& W, const float* x, int64_t n, float* y, int64_t batch, const MmArgs& a,
                             uint64_t groups, int64_t max_tiles) {
  const char* sfx = type_suffix(W.type);
  if (!sfx) fail("vulkan: no matmul shader for weight type {}", type_name(W.type));
  char name[32];
  std::snprintf(name, sizeof(name), "mm_tiled_%s", sfx);
  struct {
    uint64_t w, x, y, slice_bytes, groups;
    uint32_t rows, cols, n, row_bytes, ldx, ldy, x_batch, y_batch, x_div;
  } pc{dev_addr(W.data), dev_addr(x), dev_addr(y), a.slice_bytes, groups,
       u32(W.rows, "matmul rows"), u32(W.cols, "matmul cols"), u32(n, "matmul tokens"), u32(static_cast<int64_t>(W.row_bytes), "row bytes"),
       u32(static_cast<int64_t>(a.ldx), "ldx"), u32(static_cast<int64_t>(a.ldy), "ldy"),
       u32(static_cast<int64_t>(a.x_batch), "x batch"), u32(static_cast<int64_t>(a.y_batch), "y batch"), a.x_div};
  constexpr int64_t kBM = 64, kBN = 32;  // mm_tiled.comp's block
  const int64_t ytiles = groups ? max_tiles : (n + kBN - 1) / kBN;
  check(ytiles <= 65535 && batch <= 65535, "vulkan: tiled matmul over {} token tiles x {} slices (at most 65535 each)",
        ytiles, batch);
  rt_.dispatch(pipe(name), &pc, sizeof(pc), kimi::groups((W.rows + kBM - 1) / kBM), u32(ytiles, "token tiles"), u32(batch, "matmul batch"));
}

void VulkanBackend::matmul(const MatView& W, const float* x, int64_t n, float* y) {
  MmArgs a;
  a.ldx = static_cast<uint64_t>(W.cols);
  a.ldy = static_cast<uint64_t>(W.rows);
  mm(W, x, n, y, 1, a);
}

void VulkanBackend::embed_rows(const MatView& table, const BatchEntry* e, int64_t n, float* out) {
  if (n <= 0) return;
  const uint64_t ids = stage_entries(e, n);
  struct {
    uint64_t table, ids, out;
    uint32_t cols, row_bytes, id_stride, n;
  } pc{dev_addr(table.data), ids, dev_addr(out), u32(table.cols, "embedding width"),
       u32(static_cast<int64_t>(table.row_bytes), "row bytes"), 4, u32(n, "tokens")};
  const char* sfx = type_suffix(table.type);
  if (!sfx) fail("vulkan: no row-gather shader for weight type {}", type_name(table.type));
  char name[32];
  std::snprintf(name, sizeof(name), "getrows_%s", sfx);
  rt_.dispatch(pipe(name), &pc, sizeof(pc), u32(n, "tokens"));
}

namespace {
struct NormPc {
  uint64_t x, w, b, y;
  uint32_t ldx, ldy, n, width;
  float eps;
};
}  // namespace

void VulkanBackend::rms_norm_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t n,
                                  int64_t width, float eps) {
  NormPc pc{dev_addr(x), dev_addr(w), 0, dev_addr(y), u32(ldx, "ldx"), u32(ldy, "ldy"), u32(n, "rows"), u32(width, "width"), eps};
  rt_.dispatch(pipe("norm_rms"), &pc, sizeof(pc), groups(n));
}

void VulkanBackend::layer_norm_rows(float* x, const float* w, const float* b, int64_t n, int64_t width, float eps) {
  NormPc pc{dev_addr(x), dev_addr(w), dev_addr(b), dev_addr(x), u32(width, "width"), u32(width, "width"), u32(n, "rows"),
            u32(width, "width"), eps};
  rt_.dispatch(pipe("norm_layer"), &pc, sizeof(pc), groups(n));
}

void VulkanBackend::l2_norm_rows(float* x, int64_t n, int64_t width, float eps) {
  NormPc pc{dev_addr(x), 0, 0, dev_addr(x), u32(width, "width"), u32(width, "width"), u32(n, "rows"), u32(width, "width"), eps};
  rt_.dispatch(pipe("norm_l2"), &pc, sizeof(pc), groups(n));
}

void VulkanBackend::eltwise(uint32_t op, void* y, const void* x, uint64_t count, float a, float b, int32_t i) {
  if (count == 0) return;
  check(count < (uint64_t{1} << 32), "vulkan: element-wise op over {} elements (at most 2^32 - 1)", count);
  struct {
    uint64_t y, x;
    uint32_t count, op;
    float a, b;
    int32_t i;
  } pc{dev_addr(y), dev_addr(x), static_cast<uint32_t>(count), op, a, b, i};
  rt_.dispatch(pipe("eltwise"), &pc, sizeof(pc), groups(static_cast<int64_t>((count + 255) / 256)));
}

void VulkanBackend::add(float* y, const float* x, int64_t count) { eltwise(0, y, x, static_cast<uint64_t>(count)); }
void VulkanBackend::scale_rows(float* x, int64_t n, int64_t width, float a) {
  eltwise(1, x, nullptr, static_cast<uint64_t>(n * width), a);
}
void VulkanBackend::sigmoid(float* x, int64_t count) { eltwise(2, x, nullptr, static_cast<uint64_t>(count)); }
void VulkanBackend::mul_sigmoid_rows(float* x, const float* gate, int64_t n, int64_t width) {
  eltwise(3, x, gate, static_cast<uint64_t>(n * width));
}
void VulkanBackend::situ_rows(float* g, const float* u, int64_t n, int64_t width, float beta, float lambda) {
  eltwise(4, g, u, static_cast<uint64_t>(n * width), beta, lambda);
}
void VulkanBackend::set_i32(int32_t* dst, int64_t count, int32_t v) {
  eltwise(5, dst, nullptr, static_cast<uint64_t>(count), 0, 0, v);
}

void VulkanBackend::copy2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t n, int64_t width) {
  if (n <= 0 || width <= 0) return;
  struct {
    uint64_t src, dst;
    uint32_t ld_src, ld_dst, n, width;
  } pc{dev_addr(src), dev_addr(dst), u32(ld_src, "ld_src"), u32(ld_dst, "ld_dst"), u32(n, "rows"), u32(width, "width")};
  rt_.dispatch(pipe("copy2d"), &pc, sizeof(pc), groups(n));
}

void VulkanBackend::gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  if (n <= 0) return;
  const uint64_t r = rt_.stage(rows, static_cast<uint64_t>(n) * 4);
  struct {
    uint64_t src, dst, rows;
    uint32_t width, ld_src, n, f16, n_ctx;
  } pc{dev_addr(src), dev_addr(dst), r, u32(width, "width"), u32(width, "width"), u32(n, "rows"), 0, 0};
  rt_.dispatch(pipe("rows_gather"), &pc, sizeof(pc), u32(n, "rows"));
}

// ---- residual attention ----

namespace {
struct ResPc {
  uint64_t cur, w, bank, bank_inv, dst;
  uint32_t nb, bank_tokens, n, d;
  float eps;
};
}  // namespace

void VulkanBackend::res_mix(const float* cur, const float* w, const float* bank, const float* bank_inv, uint32_t nb,
                            int64_t bank_tokens, int64_t n, int64_t d, float eps, float* dst) {
  check(nb <= 255, "vulkan: res_mix with {} bank entries (at most 255)", nb);
  ResPc pc{dev_addr(cur), dev_addr(w), dev_addr(bank), dev_addr(bank_inv), dev_addr(dst), nb,
           u32(bank_tokens, "bank tokens"), u32(n, "tokens"), u32(d, "width"), eps};
  rt_.dispatch(pipe("resmix_mix"), &pc, sizeof(pc), u32(n, "tokens"));
}

void VulkanBackend::bank_append(const float* src, int64_t n, int64_t d, float eps, float* bank_entry, float* inv_entry) {
  ResPc pc{dev_addr(src), 0, dev_addr(bank_entry), dev_addr(inv_entry), 0, 0, 0, u32(n, "tokens"), u32(d, "width"), eps};
  rt_.dispatch(pipe("resmix_append"), &pc, sizeof(pc), u32(n, "tokens"));
}

// ---- caches ----

void VulkanBackend::store_cache_rows(const float* src, int64_t ld_src, const BatchEntry* e, int64_t n,
                                     const CacheRows& rows) {
  if (n <= 0) return;
  const uint64_t ents = stage_entries(e, n);
  struct {
    uint64_t src, dst, rows;
    uint32_t width, ld_src, n, f16, n_ctx;
  } pc{dev_addr(src), dev_addr(rows.data), ents, u32(rows.width, "cache width"), u32(ld_src, "ld_src"), u32(n, "rows"),
       rows.f16 ? 1u : 0u, u32(rows.n_ctx, "n_ctx")};
  rt_.dispatch(pipe("rows_store_cache"), &pc, sizeof(pc), u32(n, "rows"));
}

// ---- MLA per-head matmuls ----

// y[t][h] = W_h x[t][h] over H stacked per-head slices: x rows of x_head floats per head (H of
// them per token), y rows of y_head
void VulkanBackend::head_mm(const MatView& W, uint64_t slice_bytes, const float* x, int64_t x_head, float* y,
                            int64_t y_head, int64_t n, int64_t H) {
  MmArgs a;
  a.ldx = static_cast<uint64_t>(H * x_head);
  a.x_batch = static_cast<uint64_t>(x_head);
  a.ldy = static_cast<uint64_t>(H * y_head);
  a.y_batch = static_cast<uint64_t>(y_head);
  a.slice_bytes = slice_bytes;
  mm(W, x, n, y, H, a);
}

void VulkanBackend::mla_absorb_queries(const MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n, int64_t H,
                                       int64_t nope, int64_t pe, float* qcat) {
  const int64_t kvl = k_b.rows, kq = nope + pe, W = kvl + pe;
  head_mm(k_b, slice_bytes, q, kq, qcat, W, n, H);
  if (pe > 0) copy2d(qcat + kvl, W, q + nope, kq, n * H, pe);  // the rope part passes through
}

void VulkanBackend::mla_value_heads(const MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n, int64_t H,
                                    float* o) {
  head_mm(v_b, slice_bytes, z, v_b.cols, o, v_b.rows, n, H);
}

// ---- routed experts ----
// Every (token, slot) pair runs its expert's gate and up rows, SiTU, then its down rows; the
// outputs are summed per token with the routing weights (moe_combine.comp). From gemm_min_ tokens
// the pairs are grouped per expert (moe_sort.comp + mm_tiled.comp), below each pair is its own
// row-kernel product (decode: 1 token x n_used experts).

void VulkanBackend::moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel,
                                const float* weights, int64_t n_used, int64_t n_expert, float situ_beta,
                                float situ_lambda, float* acc) {
  if (n <= 0) return;
  check(m.slices == nullptr, "vulkan: routed experts streamed into host memory cannot run here");
  const int64_t F = m.gate.rows, slots = n * n_used;
  check(ex_gate_ && slots <= lim_.n_tokens * lim_.n_expert_used && F <= lim_.expert_ff && width <= lim_.expert_width,
        "vulkan: moe_experts beyond the reserved work limits ({} slots, ff {}, width {})", slots, F, width);
  auto* eg = ex_gate_->as<float>();
  auto* eu = ex_up_->as<float>();
  auto* eo = ex_out_->as<float>();
  // the grouping's buffer (reserve) holds the tiles of lim_.n_expert experts: more, and the pairs run ungrouped
  const bool fits = ex_sort_ && static_cast<uint64_t>(4 + 4 * moe_max_tiles(slots, n_expert) + slots) * 4 <= ex_sort_->bytes();
  if (n >= gemm_min_ && n_expert + 1 <= 4096 && fits) {  // 4096: moe_sort.comp's shared counters
    // grouped (ggml's mul_mat_id idea): the pairs sorted by expert on the device, then one tiled GEMM
    // per expert over its tokens for gate, up and down; every weight block is decoded once per tile
    // of up to 32 of its tokens instead of once per pair
    const int64_t max_tiles = moe_max_tiles(slots, n_expert);
    struct {
      uint64_t sel, out;
      uint32_t slots, n_expert, bn, max_tiles;
    } sp{dev_addr(sel), dev_addr(ex_sort_->data()), u32(slots, "expert slots"), u32(n_expert, "experts"), 32,
         u32(max_tiles, "expert tiles")};
    rt_.dispatch(pipe("moe_sort"), &sp, sizeof(sp), 1);
    const uint64_t groups = dev_addr(ex_sort_->data());
    MmArgs g;
    g.x_div = u32(n_used, "experts per token");
    g.x_batch = static_cast<uint64_t>(width);
    g.y_batch = static_cast<uint64_t>(F);
    g.slice_bytes = m.gate_slice;
    mm_tiled(m.gate, x, slots, eg, 1, g, groups, max_tiles);
    g.slice_bytes = m.up_slice;
    mm_tiled(m.up, x, slots, eu, 1, g, groups, max_tiles);
    situ_rows(eg, eu, slots, F, situ_beta, situ_lambda);
    MmArgs d;
    d.x_div = 1;
    d.x_batch = static_cast<uint64_t>(F);
    d.y_batch = static_cast<uint64_t>(width);
    d.slice_bytes = m.down_slice;
    mm_tiled(m.down, eg, slots, eo, 1, d, groups, max_tiles);
  } else {
    MmArgs a;
    a.sel = sel;
    a.x_div = u32(n_used, "experts per token");
    a.x_batch = static_cast<uint64_t>(width);
    a.y_batch = static_cast<uint64_t>(F);
    a.ldx = a.ldy = 0;
    a.slice_bytes = m.gate_slice;
    mm(m.gate, x, 1, eg, slots, a);
    a.slice_bytes = m.up_slice;
    mm(m.up, x, 1, eu, slots, a);
    situ_rows(eg, eu, slots, F, situ_beta, situ_lambda);
    MmArgs d;
    d.sel = sel;
    d.x_div = 1;
    d.x_batch = static_cast<uint64_t>(F);
    d.y_batch = static_cast<uint64_t>(width);
    d.slice_bytes = m.down_slice;
    mm(m.down, eg, 1, eo, slots, d);
  }
  struct {
    uint64_t rows, weights, acc;
    uint32_t n, n_used, width;
  } pc{dev_addr(eo), dev_addr(weights), dev_addr(acc), u32(n, "tokens"), u32(n_used, "experts per token"),
       u32(width, "width")};
  rt_.dispatch(pipe("moe_combine"), &pc, sizeof(pc), u32(n, "tokens"));
}

}  // namespace kimi
