// Shared by the Vulkan op tests (tests/unit/test_vulkan_*.cpp): the CPU backend in f32 as the
// reference and one Vulkan device, plus helpers to put host data into each and read it back.
// Without a usable Vulkan device the tests skip with one line — unless KIMI_REQUIRE_VULKAN=1 or
// CI=true, where a missing device is a failure (CI installs lavapipe, Mesa's software driver).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/vulkan/vulkan_backend.h"
#include "tensor/quants.h"
#include "tensor/types.h"
#include "util/thread_pool.h"

namespace kimi::test {

inline bool vulkan_required() {
  const char* r = std::getenv("KIMI_REQUIRE_VULKAN");
  const char* ci = std::getenv("CI");
  return (r && std::string(r) == "1") || (ci && std::string(ci) == "true");
}

// index of the first usable device, or -1
inline int first_vulkan_device() {
  for (const auto& d : list_vulkan_devices())
    if (d.usable) return d.index;
  return -1;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> U(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = U(r);
  return v;
}

// relative RMS error of got vs want
inline double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// a rows x cols weight of type t from random values (quantized by the reference quantizers)
inline std::vector<uint8_t> make_weight(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  const auto f = random_floats(static_cast<size_t>(rows * cols), seed, 0.5f);
  const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(rb * static_cast<uint64_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = f.data() + r * cols;
    uint8_t* dst = out.data() + rb * static_cast<uint64_t>(r);
    if (t == GgmlType::F32) {
      std::memcpy(dst, src, static_cast<size_t>(cols) * 4);
    } else if (t == GgmlType::F16 || t == GgmlType::BF16) {
      auto* h = reinterpret_cast<uint16_t*>(dst);
      for (int64_t c = 0; c < cols; ++c) h[c] = t == GgmlType::F16 ? f32_to_f16(src[c]) : f32_to_bf16(src[c]);
    } else {
      quantize_row(t, src, dst, cols);
    }
  }
  return out;
}

// every weight type the Vulkan matmuls read
inline const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K,
                           GgmlType::Q3_K, GgmlType::IQ4_XS};

class VulkanOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const int dev = first_vulkan_device();
    if (dev < 0) {
      if (vulkan_required()) FAIL() << "no usable Vulkan device, but KIMI_REQUIRE_VULKAN=1 / CI=true (is mesa-vulkan-drivers installed?)";
      GTEST_SKIP() << "no Vulkan device on this machine: Vulkan op tests skipped";
    }
    pool_ = std::make_unique<ThreadPool>(2);
    cpu_ = std::make_unique<CpuBackend>(*pool_, Precision::F32);
    gpu_ = make_vulkan_backend(dev, Precision::F32);
  }

  // a buffer on each backend holding the same host data
  struct Pair {
    std::unique_ptr<Buffer> c, g;
    size_t bytes = 0;
    template <class T>
    T* cp() const { return c->as<T>(); }
    template <class T>
    T* gp() const { return g->as<T>(); }
  };
  template <class T>
  Pair both(const std::vector<T>& host) {
    Pair p;
    p.bytes = host.size() * sizeof(T);
    p.c = cpu_->alloc(p.bytes, "test");
    p.g = gpu_->alloc(p.bytes, "test");
    if (p.bytes) {
      std::memcpy(p.c->data(), host.data(), p.bytes);
      gpu_->upload(p.g->data(), host.data(), p.bytes);
    }
    return p;
  }
  template <class T = float>
  Pair zeros(size_t count) { return both(std::vector<T>(count)); }
  // (cpu result, gpu result) of a buffer pair, as host vectors
  template <class T = float>
  std::pair<std::vector<T>, std::vector<T>> read(const Pair& p, size_t count = 0) {
    if (count == 0) count = p.bytes / sizeof(T);
    std::vector<T> c(count), g(count);
    std::memcpy(c.data(), p.c->data(), count * sizeof(T));
    gpu_->sync();
    gpu_->download(g.data(), p.g->data(), count * sizeof(T));
    return {c, g};
  }
  // a weight's bytes placed on each backend
  struct Weight {
    MatView c, g;
  };
  Weight weight(const std::string& name, GgmlType t, int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
    Weight w;
    w.c.type = w.g.type = t;
    w.c.rows = w.g.rows = rows;
    w.c.cols = w.g.cols = cols;
    w.c.row_bytes = w.g.row_bytes = bytes.size() / static_cast<size_t>(rows);
    host_.push_back(bytes);
    w.c.data = host_.back().data();
    w.g.data = gpu_->place_weight(name, host_.back().data(), bytes.size());
    return w;
  }

  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<Backend> gpu_;
  std::vector<std::vector<uint8_t>> host_;  // weight bytes (the CPU backend uses them in place)
};

}  // namespace kimi::test
