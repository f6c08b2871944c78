// The Vulkan backend's MLA attention and DSA indexer ops (vk_backend_impl.h).
#include "backend/vulkan/vk_backend_impl.h"
#include "util/error.h"

namespace kimi {

void VulkanBackend::mla_attention(const CacheRows&, int64_t, const BatchEntry*, int64_t, int64_t, const float*,
                                  const int32_t*, const int32_t*, int64_t, float, AttnPath, float*) {
  fail("vulkan: mla_attention is not implemented yet");
}

void VulkanBackend::indexer_scores(const CacheRows&, int32_t, const float*, const float*, int64_t, int64_t, float*) {
  fail("vulkan: indexer_scores is not implemented yet");
}

void VulkanBackend::indexer_topk(const float*, int64_t, int64_t, int32_t*, int32_t*, float*) {
  fail("vulkan: indexer_topk is not implemented yet");
}

}  // namespace kimi
