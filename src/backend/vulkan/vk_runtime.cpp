// The Vulkan runtime (vk_runtime.h): device, memory with device addresses, the recorded command
// stream and its staging ring, and the lazily created compute pipelines.
#include "backend/vulkan/vk_runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/vulkan/vk_shaders.h"
#include "util/error.h"

namespace kimi::vk {

namespace {

const char* vk_result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VkResult error";
  }
}

void vk_check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) fail("vulkan: {} failed: {} ({})", what, vk_result_name(r), static_cast<int>(r));
}

VkInstance make_instance() {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "kimi.cpp";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  VkInstance inst = VK_NULL_HANDLE;
  if (vkCreateInstance(&ci, nullptr, &inst) != VK_SUCCESS) return VK_NULL_HANDLE;
  return inst;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance inst) {
  uint32_t n = 0;
  if (vkEnumeratePhysicalDevices(inst, &n, nullptr) != VK_SUCCESS || n == 0) return {};
  std::vector<VkPhysicalDevice> v(n);
  if (vkEnumeratePhysicalDevices(inst, &n, v.data()) != VK_SUCCESS) return {};
  v.resize(n);
  return v;
}

DeviceInfo describe(VkPhysicalDevice pd, uint32_t index) {
  DeviceInfo d;
  d.index = index;
  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  m3.pNext = &sub;
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &m3;
  vkGetPhysicalDeviceProperties2(pd, &p2);
  const VkPhysicalDeviceProperties& p = p2.properties;
  d.name = p.deviceName;
  switch (p.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: d.type = "discrete"; break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: d.type = "integrated"; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: d.type = "virtual"; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: d.type = "cpu"; break;
    default: d.type = "other";
  }
  d.api_version = p.apiVersion;
  d.subgroup_size = sub.subgroupSize;
  d.subgroup_arith = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                     (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                     (sub.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
  d.max_alloc = m3.maxMemoryAllocationSize;
  d.max_storage_range = p.limits.maxStorageBufferRange;
  d.shared_memory = p.limits.maxComputeSharedMemorySize;
  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  for (uint32_t i = 0; i < mp.memoryHeapCount; ++i)
    if (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      d.device_local = std::max<uint64_t>(d.device_local, mp.memoryHeaps[i].size);

  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f11;
  if (VK_API_VERSION_MINOR(p.apiVersion) >= 2 || VK_API_VERSION_MAJOR(p.apiVersion) > 1) vkGetPhysicalDeviceFeatures2(pd, &f2);
  std::string miss;
  auto need = [&](bool ok, const char* what) {
    if (!ok) miss += (miss.empty() ? "" : ", ") + std::string(what);
  };
  need(VK_API_VERSION_MAJOR(p.apiVersion) > 1 || VK_API_VERSION_MINOR(p.apiVersion) >= 2, "Vulkan 1.2");
  need(f12.bufferDeviceAddress, "bufferDeviceAddress");
  need(f12.storageBuffer8BitAccess, "storageBuffer8BitAccess");
  need(f11.storageBuffer16BitAccess, "storageBuffer16BitAccess");
  need(f2.features.shaderInt64, "shaderInt64");
  d.usable = miss.empty();
  d.missing = miss;
  return d;
}

}  // namespace

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  VkInstance inst = make_instance();
  if (!inst) return out;
  const auto pds = physical_devices(inst);
  for (uint32_t i = 0; i < pds.size(); ++i) out.push_back(describe(pds[i], i));
  vkDestroyInstance(inst, nullptr);
  return out;
}

Runtime::Runtime(uint32_t index) {
  inst_ = make_instance();
  check(inst_ != VK_NULL_HANDLE, "vulkan: no Vulkan loader or driver (vkCreateInstance failed); install a driver "
                                 "(e.g. Debian mesa-vulkan-drivers) or use --device cpu");
  const auto pds = physical_devices(inst_);
  if (index >= pds.size()) {
    vkDestroyInstance(inst_, nullptr);
    fail("vulkan: device {} does not exist ({} Vulkan device(s) found)", index, pds.size());
  }
  phys_ = pds[index];
  info_ = describe(phys_, index);
  if (!info_.usable) {
    vkDestroyInstance(inst_, nullptr);
    fail("vulkan: device {} ({}) lacks {}", index, info_.name, info_.missing);
  }
  vkGetPhysicalDeviceMemoryProperties(phys_, &memprops_);

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, qf.data());
  qfam_ = UINT32_MAX;
  for (uint32_t i = 0; i < nq; ++i)  // prefer a compute queue without graphics (async compute), else any
    if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) {
      qfam_ = i;
      break;
    }
  if (qfam_ == UINT32_MAX)
    for (uint32_t i = 0; i < nq; ++i)
      if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
        qfam_ = i;
        break;
      }
  check(qfam_ != UINT32_MAX, "vulkan: device {} ({}) has no compute queue", index, info_.name);

  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = qfam_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.bufferDeviceAddress = VK_TRUE;
  f12.storageBuffer8BitAccess = VK_TRUE;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.storageBuffer16BitAccess = VK_TRUE;
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.features.shaderInt64 = VK_TRUE;
  f2.pNext = &f11;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &f2;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  vk_check(vkCreateDevice(phys_, &dci, nullptr, &dev_), "vkCreateDevice");
  vkGetDeviceQueue(dev_, qfam_, 0, &queue_);

  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = qfam_;
  vk_check(vkCreateCommandPool(dev_, &pci, nullptr, &pool_), "vkCreateCommandPool");
  for (Entry& e : entries_) {
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    vk_check(vkAllocateCommandBuffers(dev_, &cai, &e.cb), "vkAllocateCommandBuffers");
  }
  for (Fence& f : fences_) {
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    vk_check(vkCreateFence(dev_, &fci, nullptr, &f.fence), "vkCreateFence");
  }
  tape_.reserve(1u << 16);
  if (const char* r = std::getenv("KIMI_VULKAN_REPLAY")) {
    check(std::strcmp(r, "0") == 0 || std::strcmp(r, "1") == 0, "KIMI_VULKAN_REPLAY='{}': expected 0 or 1", r);
    replay_ = std::strcmp(r, "1") == 0;
  }
  if (const char* d = std::getenv("KIMI_VULKAN_TAPE_DEBUG")) debug_tape_ = std::strcmp(d, "1") == 0;

  // one layout for every shader: 128 bytes of push constants (the minimum every device has)
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
  VkPipelineLayoutCreateInfo lci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  lci.pushConstantRangeCount = 1;
  lci.pPushConstantRanges = &pcr;
  vk_check(vkCreatePipelineLayout(dev_, &lci, nullptr, &layout_), "vkCreatePipelineLayout");
  VkPipelineCacheCreateInfo cci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  vk_check(vkCreatePipelineCache(dev_, &cci, nullptr, &cache_), "vkCreatePipelineCache");
  reserve_staging(8u << 20);
}

Runtime::~Runtime() {
  if (dev_) {
    vkDeviceWaitIdle(dev_);
    for (auto& [a, al] : allocs_) {
      vkDestroyBuffer(dev_, al.buf, nullptr);
      vkFreeMemory(dev_, al.mem, nullptr);
    }
    if (ring_.buf) {
      vkDestroyBuffer(dev_, ring_.buf, nullptr);
      vkFreeMemory(dev_, ring_.mem, nullptr);
    }
    for (auto& [n, m] : modules_) vkDestroyShaderModule(dev_, m, nullptr);
    if (cache_) vkDestroyPipelineCache(dev_, cache_, nullptr);
    if (layout_) vkDestroyPipelineLayout(dev_, layout_, nullptr);
    for (Fence& f : fences_)
      if (f.fence) vkDestroyFence(dev_, f.fence, nullptr);
    if (pool_) vkDestroyCommandPool(dev_, pool_, nullptr);
    vkDestroyDevice(dev_, nullptr);
  }
  if (inst_) vkDestroyInstance(inst_, nullptr);
}

uint32_t Runtime::find_memory(uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) const {
  for (uint32_t i = 0; i < memprops_.memoryTypeCount; ++i)
    if ((bits & (1u << i)) && (memprops_.memoryTypes[i].propertyFlags & want) == want &&
        !(memprops_.memoryTypes[i].propertyFlags & avoid))
      return i;
  for (uint32_t i = 0; i < memprops_.memoryTypeCount; ++i)
    if ((bits & (1u << i)) && (memprops_.memoryTypes[i].propertyFlags & want) == want) return i;
  return UINT32_MAX;
}

Runtime::Alloc Runtime::make_buffer(uint64_t bytes, bool host_visible, const char* what) {
  bytes = std::max<uint64_t>(16, (bytes + 15) / 16 * 16);
  check(bytes <= info_.max_alloc,
        "vulkan: {} needs one buffer of {:.1f} MiB, more than device {} ({}) allows in one allocation ({:.1f} MiB); "
        "keep it on the CPU (-ot or --cpu-moe)",
        what, bytes / 1048576.0, info_.index, info_.name, info_.max_alloc / 1048576.0);
  Alloc a;
  a.bytes = bytes;
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = bytes;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
              VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
              (host_visible ? VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT : 0);
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  vk_check(vkCreateBuffer(dev_, &bci, nullptr, &a.buf), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev_, a.buf, &req);
  const uint32_t mt = host_visible
                          ? find_memory(req.memoryTypeBits,
                                        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0)
                          : find_memory(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  if (mt == UINT32_MAX) {
    vkDestroyBuffer(dev_, a.buf, nullptr);
    fail("vulkan: no memory type for {} on device {}", what, info_.index);
  }
  VkMemoryAllocateFlagsInfo fl{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  fl.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.pNext = &fl;
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = mt;
  const VkResult r = vkAllocateMemory(dev_, &mai, nullptr, &a.mem);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(dev_, a.buf, nullptr);
    fail("vulkan: allocating {:.1f} MiB for {} on device {} ({}) failed: {} ({:.1f} MiB allocated so far)",
         bytes / 1048576.0, what, info_.index, info_.name, vk_result_name(r), device_bytes_ / 1048576.0);
  }
  vk_check(vkBindBufferMemory(dev_, a.buf, a.mem, 0), "vkBindBufferMemory");
  VkBufferDeviceAddressInfo ai{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  ai.buffer = a.buf;
  a.addr = vkGetBufferDeviceAddress(dev_, &ai);
  if (host_visible) vk_check(vkMapMemory(dev_, a.mem, 0, VK_WHOLE_SIZE, 0, &a.mapped), "vkMapMemory");
  return a;
}

Runtime::Alloc Runtime::alloc(uint64_t bytes, const char* what) {
  Alloc a = make_buffer(bytes, false, what);
  allocs_[a.addr] = a;
  device_bytes_ += a.bytes;
  fill_zero(a.addr, a.bytes);
  return a;
}

void Runtime::free(const Alloc& a) {
  auto it = allocs_.find(a.addr);
  if (it == allocs_.end()) return;
  sync();  // recorded work may still use it
  drop_cache();  // and cached command buffers may reference it
  vkDestroyBuffer(dev_, it->second.buf, nullptr);
  vkFreeMemory(dev_, it->second.mem, nullptr);
  device_bytes_ -= it->second.bytes;
  allocs_.erase(it);
}

const Runtime::Alloc& Runtime::resolve(uint64_t addr, uint64_t bytes, uint64_t* offset) const {
  auto it = allocs_.upper_bound(addr);
  check(it != allocs_.begin(), "vulkan: address {:#x} is not in any buffer of device {}", addr, info_.index);
  --it;
  const Alloc& a = it->second;
  check(addr >= a.addr && addr + bytes <= a.addr + a.bytes,
        "vulkan: range [{:#x}, +{}) is not inside one buffer of device {}", addr, bytes, info_.index);
  *offset = addr - a.addr;
  return a;
}

// ---- command stream: the tape, submission, replay ----

namespace {

enum TapeOp : uint64_t { kDispatch = 1, kIndirect = 2, kCopy = 3, kFill = 4 };

// non-dispatchable handles as tape words (a pointer on 64-bit targets, uint64_t on 32-bit ones)
template <class H>
uint64_t hword(H h) {
  static_assert(sizeof(H) <= 8, "handle");
  uint64_t u = 0;
  std::memcpy(&u, &h, sizeof(H));
  return u;
}
template <class H>
H hof(uint64_t u) {
  H h;
  std::memcpy(&h, &u, sizeof(H));
  return h;
}

// words of the record starting at t[i]
size_t record_words(const uint64_t* t) {
  const uint64_t op = t[0] & 0xFF, push_words = (t[0] >> 8 & 0xFF) / 8 + ((t[0] >> 8 & 7) ? 1 : 0);
  switch (op) {
    case kDispatch: return 4 + push_words;
    case kIndirect: return 3 + push_words;
    case kCopy: return 6;
    default: return 4;
  }
}

}  // namespace

void Runtime::barrier(VkCommandBuffer cb) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  // (host writes to the staging ring need no barrier: vkQueueSubmit makes them visible)
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_INDIRECT_COMMAND_READ_BIT;
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                           VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT,
                       0, 1, &mb, 0, nullptr, 0, nullptr);
}

void Runtime::record(VkCommandBuffer cb, bool reusable) {
  vk_check(vkResetCommandBuffer(cb, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = reusable ? 0 : VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vk_check(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
  barrier(cb);  // after everything submitted earlier (its first scope spans earlier submissions)
  const uint64_t* t = tape_.data();
  for (size_t i = 0; i < tape_.size(); i += record_words(t + i)) {
    const uint64_t* r = t + i;
    const uint32_t push_bytes = static_cast<uint32_t>(r[0] >> 8 & 0xFF);
    switch (r[0] & 0xFF) {
      case kDispatch:
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, hof<VkPipeline>(r[1]));
        vkCmdPushConstants(cb, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, r + 4);
        vkCmdDispatch(cb, static_cast<uint32_t>(r[2]), static_cast<uint32_t>(r[2] >> 32), static_cast<uint32_t>(r[3]));
        break;
      case kIndirect:
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, hof<VkPipeline>(r[1]));
        vkCmdPushConstants(cb, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, r + 3);
        vkCmdDispatchIndirect(cb, ring_.buf, r[2]);
        break;
      case kCopy: {
        VkBufferCopy c{r[3], r[4], r[5]};
        vkCmdCopyBuffer(cb, hof<::VkBuffer>(r[1]), hof<::VkBuffer>(r[2]), 1, &c);
        break;
      }
      case kFill: vkCmdFillBuffer(cb, hof<::VkBuffer>(r[1]), r[2], r[3], 0); break;
    }
    barrier(cb);
  }
  vk_check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

void Runtime::wait_fence(int f) {
  Fence& fe = fences_[f];
  if (!fe.in_flight) return;
  vk_check(vkWaitForFences(dev_, 1, &fe.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  vk_check(vkResetFences(dev_, 1, &fe.fence), "vkResetFences");
  fe.in_flight = false;
  // a vkQueueSubmit fence also covers every earlier submission to the queue
  done_serial_ = std::max(done_serial_, fe.serial);
}

bool Runtime::complete(uint64_t serial) {
  if (serial <= done_serial_) return true;
  for (int f = 0; f < kFences; ++f)
    if (fences_[f].in_flight && fences_[f].serial >= serial && vkGetFenceStatus(dev_, fences_[f].fence) == VK_SUCCESS) {
      wait_fence(f);
      return true;
    }
  return serial <= done_serial_;
}

void Runtime::drop_cache() {
  for (Entry& e : entries_) e.cached = false;
}

void Runtime::submit(bool wait) {
  if (!tape_.empty()) {
    const int f = next_fence_;  // the oldest submission's fence: free it first
    wait_fence(f);
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    Entry* use = nullptr;
    if (replay_)
      for (Entry& e : entries_)
        if (e.cached && e.hash == tape_hash_ && e.tape.size() == tape_.size() &&
            std::memcmp(e.tape.data(), tape_.data(), tape_.size() * 8) == 0 && complete(e.serial)) {
          use = &e;
          break;
        }
    const bool replayed = use != nullptr;
    const auto t1 = clk::now();
    uint64_t rec_ns = 0;
    if (replayed) {
      ++replayed_;
    } else {
      if (debug_tape_ && replay_) report_mismatch();
      // the least recently used command buffer the device is done with, uncached ones first
      for (Entry& e : entries_) {
        if (!complete(e.serial)) continue;
        if (!use || (use->cached && !e.cached) || (use->cached == e.cached && e.used < use->used)) use = &e;
      }
      check(use != nullptr, "vulkan: no free command buffer ({} in flight at most)", kFences);
      const auto r0 = clk::now();
      record(use->cb, replay_);
      rec_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - r0).count());
      record_ns_ += rec_ns;
      ++recorded_;
      use->cached = replay_;
      if (replay_) {
        use->tape.assign(tape_.begin(), tape_.end());
        use->hash = tape_hash_;
      }
    }
    if (debug_tape_) {
      size_t records = 0;
      for (size_t i = 0; i < tape_.size(); i += record_words(tape_.data() + i)) ++records;
      std::fprintf(stderr, "vulkan tape: submit %llu: %zu commands, %zu words, %s (lookup %.1f us, recording %.1f us)\n",
                   static_cast<unsigned long long>(serial_ + 1), records, tape_.size(),
                   replayed ? "replayed" : "recorded",
                   std::chrono::duration<double, std::micro>(t1 - t0).count(), rec_ns * 1e-3);
    }
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &use->cb;
    vk_check(vkQueueSubmit(queue_, 1, &si, fences_[f].fence), "vkQueueSubmit");
    use->serial = use->used = ++serial_;
    fences_[f].in_flight = true;
    fences_[f].serial = serial_;
    next_fence_ = (f + 1) % kFences;
    ++submits_;
    tape_.clear();
    tape_hash_ = kHashSeed;
  }
  if (!wait) return;
  for (int i = 0; i < kFences; ++i) wait_fence((next_fence_ + i) % kFences);  // oldest first
  ring_head_ = 0;  // nothing in flight reads the ring any more
}

void Runtime::report_mismatch() const {
  // the cached tape closest to this one: the most recently used of the same length, else any
  const Entry* best = nullptr;
  for (const Entry& e : entries_)
    if (e.cached && (!best || (e.tape.size() == tape_.size()) > (best->tape.size() == tape_.size()) ||
                     ((e.tape.size() == tape_.size()) == (best->tape.size() == tape_.size()) && e.used > best->used)))
      best = &e;
  if (!best) {
    std::fprintf(stderr, "vulkan tape: %zu words recorded (nothing cached)\n", tape_.size());
    return;
  }
  size_t i = 0, rec = 0;
  while (i < tape_.size() && i < best->tape.size()) {
    const size_t n = record_words(tape_.data() + i);
    if (n != record_words(best->tape.data() + i) || i + n > best->tape.size() ||
        std::memcmp(tape_.data() + i, best->tape.data() + i, n * 8) != 0) {
      size_t w = 0;
      while (w < n && tape_[i + w] == best->tape[i + w]) ++w;
      const uint64_t op = tape_[i] & 0xFF;
      auto it = op <= kIndirect ? pipe_names_.find(tape_[i + 1]) : pipe_names_.end();
      std::fprintf(stderr, "vulkan tape: %zu words vs cached %zu: record %zu (op %llu %s) differs at word %zu: %#llx vs %#llx\n",
                   tape_.size(), best->tape.size(), rec, static_cast<unsigned long long>(op),
                   it != pipe_names_.end() ? it->second.c_str() : "", w,
                   static_cast<unsigned long long>(w < n ? tape_[i + w] : 0),
                   static_cast<unsigned long long>(w < n && i + w < best->tape.size() ? best->tape[i + w] : 0));
      return;
    }
    i += n;
    ++rec;
  }
  std::fprintf(stderr, "vulkan tape: %zu words vs cached %zu: equal for the first %zu records\n", tape_.size(),
               best->tape.size(), rec);
}

void Runtime::sync() { submit(true); }
void Runtime::flush() { submit(false); }

void Runtime::destroy(Pipeline& p) {
  if (!p.pipe) return;
  submit_and_wait();
  drop_cache();
  pipe_names_.erase(hword(p.pipe));
  vkDestroyPipeline(dev_, p.pipe, nullptr);
  p.pipe = VK_NULL_HANDLE;
}

VkPipeline Runtime::pipeline_for(Pipeline& p) {
  if (p.pipe) return p.pipe;
  const Spirv* s = find_spirv(p.shader);
  check(s != nullptr, "vulkan: shader '{}' is not built in", p.shader);
  VkShaderModule& mod = modules_[p.shader];
  if (!mod) {
    VkShaderModuleCreateInfo ci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    ci.codeSize = s->count * 4;
    ci.pCode = s->words;
    vk_check(vkCreateShaderModule(dev_, &ci, nullptr, &mod), "vkCreateShaderModule");
  }
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  ci.layout = layout_;
  vk_check(vkCreateComputePipelines(dev_, cache_, 1, &ci, nullptr, &p.pipe), "vkCreateComputePipelines");
  pipe_names_[hword(p.pipe)] = p.shader;
  return p.pipe;
}

void Runtime::put(uint64_t w) {
  tape_.push_back(w);
  tape_hash_ = (tape_hash_ ^ w) * 0x9E3779B97F4A7C15ull;
  tape_hash_ ^= tape_hash_ >> 29;
}

void Runtime::put_copy(VkBuffer src_buf, VkBuffer dst_buf, uint64_t src_off, uint64_t dst_off, uint64_t bytes) {
  put(kCopy);
  put(hword(src_buf));
  put(hword(dst_buf));
  put(src_off);
  put(dst_off);
  put(bytes);
}

void Runtime::put_push(const void* push, uint32_t push_bytes) {
  for (uint32_t o = 0; o < push_bytes; o += 8) {
    uint64_t w = 0;
    std::memcpy(&w, static_cast<const uint8_t*>(push) + o, std::min<uint32_t>(8, push_bytes - o));
    put(w);
  }
}

void Runtime::dispatch(Pipeline& p, const void* push, uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (gx == 0 || gy == 0 || gz == 0) return;
  check(push_bytes <= 128, "vulkan: {} push constants exceed 128 bytes", p.shader);
  const VkPipeline pipe = pipeline_for(p);
  put(kDispatch | uint64_t{push_bytes} << 8);
  put(hword(pipe));
  put(uint64_t{gx} | uint64_t{gy} << 32);
  put(gz);
  put_push(push, push_bytes);
}

void Runtime::dispatch_indirect(Pipeline& p, const void* push, uint32_t push_bytes, uint64_t args) {
  check(push_bytes <= 128, "vulkan: {} push constants exceed 128 bytes", p.shader);
  check(args >= ring_.addr && args + 12 <= ring_.addr + ring_.bytes && args % 4 == 0,
        "vulkan: {}: indirect group counts at {:#x} are not staged", p.shader, args);
  const VkPipeline pipe = pipeline_for(p);
  put(kIndirect | uint64_t{push_bytes} << 8);
  put(hword(pipe));
  put(args - ring_.addr);
  put_push(push, push_bytes);
}

void Runtime::copy(uint64_t dst, uint64_t src, uint64_t bytes) {
  if (bytes == 0 || dst == src) return;
  uint64_t so = 0, dof = 0;
  const Alloc& s = src >= ring_.addr && src < ring_.addr + ring_.bytes ? ring_ : resolve(src, bytes, &so);
  if (&s == &ring_) so = src - ring_.addr;
  const Alloc& d = resolve(dst, bytes, &dof);
  put_copy(s.buf, d.buf, so, dof, bytes);
}

void Runtime::fill_zero(uint64_t dst, uint64_t bytes) {
  if (bytes == 0) return;
  uint64_t off = 0;
  const Alloc& d = resolve(dst, bytes, &off);
  if (off % 4 == 0 && bytes % 4 == 0) {
    put(kFill);
    put(hword(d.buf));
    put(off);
    put(bytes);
  } else {  // unaligned: copy zeros from the ring
    uint64_t done = 0;
    while (done < bytes) {
      const uint64_t part = std::min<uint64_t>(bytes - done, ring_.bytes / 2);
      std::vector<uint8_t> z;  // rare path (odd-sized f16 rows): not used by the forward pass
      z.assign(part, 0);
      const uint64_t at = stage(z.data(), part);
      copy(dst + done, at, part);
      done += part;
    }
  }
}

void Runtime::reserve_staging(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 1u << 20);
  if (ring_.buf && ring_.bytes >= bytes) return;
  sync();
  drop_cache();
  if (ring_.buf) {
    vkDestroyBuffer(dev_, ring_.buf, nullptr);
    vkFreeMemory(dev_, ring_.mem, nullptr);
  }
  ring_ = make_buffer(bytes, true, "staging ring");
  ring_head_ = 0;
}

uint64_t Runtime::stage(const void* host, uint64_t bytes) {
  const uint64_t need = (bytes + 15) / 16 * 16;
  check(need <= ring_.bytes, "vulkan: {} bytes of host data exceed the staging ring ({} bytes)", bytes, ring_.bytes);
  if (ring_head_ + need > ring_.bytes) submit_and_wait();  // ring full: run what uses it, start over
  const uint64_t at = ring_head_;
  if (bytes) std::memcpy(static_cast<uint8_t*>(ring_.mapped) + at, host, bytes);
  ring_head_ += need;
  to_dev_ += bytes;
  return ring_.addr + at;
}

void Runtime::upload(uint64_t dst, const void* host, uint64_t bytes) {
  const auto* h = static_cast<const uint8_t*>(host);
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t part = std::min<uint64_t>(bytes - done, ring_.bytes / 2);
    const uint64_t at = stage(h + done, part);
    copy(dst + done, at, part);
    done += part;
  }
}

void Runtime::download(void* host, uint64_t src, uint64_t bytes) {
  auto* h = static_cast<uint8_t*>(host);
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t part = std::min<uint64_t>(bytes - done, ring_.bytes);
    uint64_t so = 0;
    const Alloc& s = resolve(src + done, part, &so);
    if (ring_head_ + part > ring_.bytes) submit_and_wait();
    const uint64_t at = ring_head_;
    put_copy(s.buf, ring_.buf, so, at, part);
    submit_and_wait();
    std::memcpy(h + done, static_cast<const uint8_t*>(ring_.mapped) + at, part);
    done += part;
  }
  from_dev_ += bytes;
}

}  // namespace kimi::vk
