// The device's ceilings for `kimi bench --device vulkan` (vulkan_backend.h, measure_vulkan_ceiling):
// read bandwidth and f32 multiply-add rate, timed on the host around whole submits, each measurement
// repeated until it runs at least 50 ms so that the submit costs nothing next to it.
#include <algorithm>
#include <chrono>

#include "backend/vulkan/vk_backend_impl.h"
#include "backend/vulkan/vulkan_backend.h"

namespace kimi {

namespace {

// runs `one` (records one dispatch) reps times per submit, doubling reps until a submit takes >= 50 ms;
// returns seconds per dispatch
template <class F>
double time_per_dispatch(vk::Runtime& rt, F&& one) {
  using clk = std::chrono::steady_clock;
  one();  // warm-up: pipeline creation, first touch
  rt.sync();
  for (int reps = 1;; reps *= 2) {
    const auto t0 = clk::now();
    for (int r = 0; r < reps; ++r) one();
    rt.sync();
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    if (s >= 0.05 || reps >= 1024) return s / reps;
  }
}

}  // namespace

DeviceCeiling VulkanBackend::measure_ceiling() {
  const auto t_start = std::chrono::steady_clock::now();
  const vk::DeviceInfo& info = rt_.info();
  const bool software = info.type == "cpu";
  DeviceCeiling c;
  c.device = info.name;
  rt_.sync();
  // read: 1 GiB on a GPU (64 MiB on a software device), within one allocation and a quarter of the memory
  uint64_t bytes = software ? (64ull << 20) : (1ull << 30);
  if (info.max_alloc > 0) bytes = std::min(bytes, info.max_alloc / 2);
  if (info.device_local > 0) bytes = std::min(bytes, info.device_local / 4);
  bytes = std::max<uint64_t>(bytes / 4096 * 4096, 4096);
  auto result = alloc(256, "ceiling result");
  {
    auto src = alloc(bytes, "ceiling read buffer");
    struct {
      uint64_t src, dst;
      uint32_t n_vec4;
    } pc{dev_addr(src->data()), dev_addr(result->data()), u32(int64_t(bytes / 16), "ceiling vectors")};
    const uint32_t g = groups(int64_t(bytes / 16 / 256));
    const double s = time_per_dispatch(rt_, [&] { rt_.dispatch(pipe("ceil_read"), &pc, sizeof(pc), g); });
    c.read_bytes_per_s = double(bytes) / s;
    c.read_buffer_bytes = bytes;
  }
  {
    // software devices end a shader's loops after 65535 iterations (docs/gpu.md): 4096 rounds stay below
    struct {
      uint64_t dst;
      uint32_t iters;
      float a, b;
    } pc{dev_addr(result->data()), software ? 4096u : 1024u, 0.999f, 1e-4f};
    const uint32_t g = software ? 16u : 65535u;
    const double s = time_per_dispatch(rt_, [&] { rt_.dispatch(pipe("ceil_fma"), &pc, sizeof(pc), g); });
    c.fma_flops = double(g) * 256.0 * double(pc.iters) * 16.0 / s;
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return c;
}

DeviceCeiling measure_vulkan_ceiling(Backend& be) {
  auto* v = dynamic_cast<VulkanBackend*>(&be);
  return v ? v->measure_ceiling() : DeviceCeiling{};
}

}  // namespace kimi
