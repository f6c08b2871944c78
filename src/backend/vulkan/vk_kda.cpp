// The Vulkan backend's KDA ops and the MoE router (vk_backend_impl.h).
#include "backend/vulkan/vk_backend_impl.h"
#include "util/error.h"

namespace kimi {

void VulkanBackend::kda_conv_silu(const float* const[3], int64_t, int64_t, const SeqStates&, const BatchEntry*, int64_t,
                                  float* const[3]) {
  fail("vulkan: kda_conv_silu is not implemented yet");
}

void VulkanBackend::kda_gate(float*, const float*, const float*, int64_t, int64_t, int64_t, const KdaGateParams&) {
  fail("vulkan: kda_gate is not implemented yet");
}

void VulkanBackend::kda_scan(const SeqStates&, const BatchEntry*, int64_t, int64_t, int64_t, const float*, const float*,
                             const float*, const float*, const float*, float, float*) {
  fail("vulkan: kda_scan is not implemented yet");
}

void VulkanBackend::moe_route(float*, const float*, int64_t, const RouterParams&, float*, int32_t*, float*) {
  fail("vulkan: moe_route is not implemented yet");
}

}  // namespace kimi
