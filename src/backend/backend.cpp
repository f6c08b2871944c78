// Copies between backends (backend.h).
#include "backend/backend.h"

#include <vector>

namespace kimi {

void copy_between(Backend& to, void* dst, Backend& from, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  if (&to == &from) return to.copy(dst, src, bytes);
  from.sync();
  if (from.host_visible()) return to.upload(dst, src, bytes);
  if (to.host_visible()) return from.download(dst, src, bytes);
  // device to device: through a host staging buffer (grows once to the largest copy)
  thread_local std::vector<uint8_t> staging;
  if (staging.size() < bytes) staging.resize(bytes);
  from.download(staging.data(), src, bytes);
  to.upload(dst, staging.data(), bytes);
}

}  // namespace kimi
