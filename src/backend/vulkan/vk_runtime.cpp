// The Vulkan runtime (vk_runtime.h): device, memory with device addresses, the recorded command
// stream and its staging ring, and the lazily created compute pipelines.
#include "backend/vulkan/vk_runtime.h"

#include <algorithm>
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
  for (Slot& sl : slots_) {
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    vk_check(vkAllocateCommandBuffers(dev_, &cai, &sl.cb), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    vk_check(vkCreateFence(dev_, &fci, nullptr, &sl.fence), "vkCreateFence");
  }

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
    for (Slot& sl : slots_)
      if (sl.fence) vkDestroyFence(dev_, sl.fence, nullptr);
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
              VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
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

// ---- command stream ----

void Runtime::begin_if_needed() {
  if (recording_) return;
  Slot& sl = slots_[cur_];
  if (sl.in_flight) {  // the rotation came back to a command buffer the device may still run
    vk_check(vkWaitForFences(dev_, 1, &sl.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    vk_check(vkResetFences(dev_, 1, &sl.fence), "vkResetFences");
    sl.in_flight = false;
  }
  vk_check(vkResetCommandBuffer(sl.cb, 0), "vkResetCommandBuffer");
  cmd_ = sl.cb;
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vk_check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  recording_ = true;
  barrier();  // after everything submitted earlier (its first scope spans earlier submissions)
}

void Runtime::barrier() {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0,
                       nullptr);
}

void Runtime::submit(bool wait) {
  if (recording_) {
    vk_check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
    recording_ = false;
    if (pending_) {
      Slot& sl = slots_[cur_];
      VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
      si.commandBufferCount = 1;
      si.pCommandBuffers = &sl.cb;
      vk_check(vkQueueSubmit(queue_, 1, &si, sl.fence), "vkQueueSubmit");
      sl.in_flight = true;
      ++submits_;
      cur_ = (cur_ + 1) % kSlots;
    }
    pending_ = false;  // an empty command buffer is not submitted: begin_if_needed resets it
  }
  if (!wait) return;
  // the oldest submission first (the queue runs them in order)
  for (int i = 1; i <= kSlots; ++i) {
    Slot& sl = slots_[(cur_ + i) % kSlots];
    if (!sl.in_flight) continue;
    vk_check(vkWaitForFences(dev_, 1, &sl.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    vk_check(vkResetFences(dev_, 1, &sl.fence), "vkResetFences");
    sl.in_flight = false;
  }
  ring_head_ = 0;  // nothing in flight reads the ring any more
}

void Runtime::sync() { submit(true); }
void Runtime::flush() { submit(false); }

void Runtime::destroy(Pipeline& p) {
  if (!p.pipe) return;
  submit_and_wait();
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
  return p.pipe;
}

void Runtime::dispatch(Pipeline& p, const void* push, uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (gx == 0 || gy == 0 || gz == 0) return;
  check(push_bytes <= 128, "vulkan: {} push constants exceed 128 bytes", p.shader);
  const VkPipeline pipe = pipeline_for(p);
  begin_if_needed();
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
  vkCmdPushConstants(cmd_, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  vkCmdDispatch(cmd_, gx, gy, gz);
  barrier();
  pending_ = true;
}

void Runtime::copy(uint64_t dst, uint64_t src, uint64_t bytes) {
  if (bytes == 0 || dst == src) return;
  uint64_t so = 0, dof = 0;
  const Alloc& s = src == ring_.addr || (src > ring_.addr && src < ring_.addr + ring_.bytes) ? ring_ : resolve(src, bytes, &so);
  if (&s == &ring_) so = src - ring_.addr;
  const Alloc& d = resolve(dst, bytes, &dof);
  begin_if_needed();
  VkBufferCopy r{so, dof, bytes};
  vkCmdCopyBuffer(cmd_, s.buf, d.buf, 1, &r);
  barrier();
  pending_ = true;
}

void Runtime::fill_zero(uint64_t dst, uint64_t bytes) {
  if (bytes == 0) return;
  uint64_t off = 0;
  const Alloc& d = resolve(dst, bytes, &off);
  begin_if_needed();
  if (off % 4 == 0 && bytes % 4 == 0) {
    vkCmdFillBuffer(cmd_, d.buf, off, bytes, 0);
  } else {  // unaligned: copy zeros from the ring
    uint64_t done = 0;
    while (done < bytes) {
      const uint64_t part = std::min<uint64_t>(bytes - done, ring_.bytes / 2);
      std::vector<uint8_t> z;  // rare path (odd-sized f16 rows): not used by the forward pass
      z.assign(part, 0);
      const uint64_t at = stage(z.data(), part);
      begin_if_needed();
      VkBufferCopy r{at - ring_.addr, off + done, part};
      vkCmdCopyBuffer(cmd_, ring_.buf, d.buf, 1, &r);
      done += part;
    }
  }
  barrier();
  pending_ = true;
}

void Runtime::reserve_staging(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 1u << 20);
  if (ring_.buf && ring_.bytes >= bytes) return;
  sync();
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
    begin_if_needed();
    VkBufferCopy r{so, at, part};
    vkCmdCopyBuffer(cmd_, s.buf, ring_.buf, 1, &r);
    pending_ = true;
    submit_and_wait();
    std::memcpy(h + done, static_cast<const uint8_t*>(ring_.mapped) + at, part);
    done += part;
  }
  from_dev_ += bytes;
}

}  // namespace kimi::vk
