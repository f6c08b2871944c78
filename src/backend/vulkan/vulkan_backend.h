// The Vulkan backend: the Backend interface (backend/backend.h) on one Vulkan device. Buffers
// are device memory addressed by their shader device address (vk_runtime.h); weights are
// uploaded once at load, quantized types stay in their GGUF blocks on the device (MXFP4 stays
// 4-bit) and are decoded inside the matmul shaders. Activations and sums are f32 in both
// precisions (Precision::Fast only selects the f16 cache type, chosen by the caller).
//
//   auto be = kimi::make_vulkan_backend(0, kimi::Precision::F32);   // device 0 of list_vulkan_devices()
//   ContextOptions o; o.extra_backends = {be.get()};                 // device 1 of the placement
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace kimi {

struct VulkanDeviceInfo {
  int index = 0;
  std::string name, type;
  uint64_t memory = 0;  // largest device-local heap
  bool usable = false;
  std::string missing;  // what an unusable device lacks
};

// The Vulkan devices present (empty without a loader or driver); never throws.
std::vector<VulkanDeviceInfo> list_vulkan_devices();

// Opens device `index`; throws kimi::Error when it does not exist or lacks a needed feature.
std::unique_ptr<Backend> make_vulkan_backend(int index, Precision prec);

// What a Vulkan device does at most, measured now (kimi bench --device vulkan; ~0.1-0.5 s): its read
// bandwidth (a shader summing 16-byte loads of a 1 GiB buffer, 64 MiB on a software device) and its f32
// multiply-add rate (8 independent fma chains per invocation; the backend's shaders do f32 arithmetic, so
// this is their peak, not the tensor cores'). Zeros for a backend that is not a Vulkan one.
DeviceCeiling measure_vulkan_ceiling(Backend& be);

}  // namespace kimi
