// The Vulkan runtime under the Vulkan backend: one device and its compute queue, memory, the
// command stream ops are recorded into, and the compute pipelines (SPIR-V embedded at build time).
//
// Memory model. Every allocation is a VkBuffer with a shader device address
// (VK_KHR_buffer_device_address, core in Vulkan 1.2); the backend hands that address out as the
// Buffer's data() and as the weight pointers, so the seam's "pointer into a buffer of this backend"
// is a real device address. Shaders receive addresses in push constants and read through
// GL_EXT_buffer_reference: no descriptor sets, and no maxStorageBufferRange limit (lavapipe's is
// 128 MiB; a tensor or cache bigger than that is read directly). The limit that remains is the
// size of one allocation (maxMemoryAllocationSize / maxBufferSize), checked with a clear error.
//
// Ordering. Ops, copies, uploads and fills are recorded in issue order into a command buffer
// with a full compute/transfer barrier between them (and one at the start of every command
// buffer, which orders it after everything submitted before it on the queue). flush() submits
// what is recorded without waiting: recording goes on in the next of kSlots command buffers, each
// with its fence, while the device runs the earlier ones. download and sync submit and wait for
// everything in flight; so does a full staging ring. Host data that an op reads (the micro-batch,
// an upload) is copied into a host-visible staging ring first, so the caller's memory may change
// right after the call; the ring is written front to back and restarts at its beginning only when
// nothing in flight can still read it (everything submitted has completed). Nothing is allocated
// per op: the ring and the command buffers are reused.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kimi::vk {

struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  std::string type;        // discrete, integrated, virtual, cpu, other
  uint64_t device_local = 0;  // bytes of the largest device-local heap
  uint32_t api_version = 0;
  uint32_t subgroup_size = 0;
  bool subgroup_arith = false;      // subgroup arithmetic in compute shaders (the _sg shaders)
  uint64_t max_alloc = 0;           // maxMemoryAllocationSize
  uint64_t max_storage_range = 0;   // maxStorageBufferRange (not a limit here: see above)
  uint32_t shared_memory = 0;
  bool usable = false;              // has everything the backend needs
  std::string missing;              // what it lacks when !usable
};

// The devices the Vulkan loader sees (empty when there is no loader or driver). Never throws.
std::vector<DeviceInfo> list_devices();

// A compute pipeline for one embedded shader, created on first use.
struct Pipeline {
  const char* shader = nullptr;
  VkPipeline pipe = VK_NULL_HANDLE;
};

class Runtime {
 public:
  // Opens device `index` (list_devices order). Throws kimi::Error naming what is missing.
  explicit Runtime(uint32_t index);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const DeviceInfo& info() const { return info_; }

  // ---- memory ----
  struct Alloc {
    VkBuffer buf = VK_NULL_HANDLE;
    VkDeviceMemory mem = VK_NULL_HANDLE;
    uint64_t addr = 0, bytes = 0;
    void* mapped = nullptr;  // host-visible allocations only
  };
  // A device-local buffer of `bytes` (zero-filled through the command stream); `what` names it in errors.
  Alloc alloc(uint64_t bytes, const char* what);
  void free(const Alloc& a);
  // the allocation holding device address [addr, addr + bytes) and the offset into it
  const Alloc& resolve(uint64_t addr, uint64_t bytes, uint64_t* offset) const;
  uint64_t device_bytes() const { return device_bytes_; }

  // ---- command stream (in issue order) ----
  void dispatch(Pipeline& p, const void* push, uint32_t push_bytes, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1);
  void copy(uint64_t dst, uint64_t src, uint64_t bytes);
  void fill_zero(uint64_t dst, uint64_t bytes);
  void upload(uint64_t dst, const void* host, uint64_t bytes);
  void download(void* host, uint64_t src, uint64_t bytes);  // waits for the result
  // host bytes placed in the staging ring, visible to the ops recorded after this call; returns
  // their device address (valid until the next submit)
  uint64_t stage(const void* host, uint64_t bytes);
  void sync();   // submit what is recorded and wait for everything in flight
  void flush();  // submit what is recorded without waiting (recording continues in the next command buffer)
  void destroy(Pipeline& p);  // frees a pipeline made by dispatch (device idle first)

  // staging ring capacity (grown only by reserve, never in the decode loop)
  void reserve_staging(uint64_t bytes);

  uint64_t bytes_to_device() const { return to_dev_; }
  uint64_t bytes_from_device() const { return from_dev_; }
  uint64_t submits() const { return submits_; }

 private:
  void begin_if_needed();
  void barrier();
  void submit(bool wait);  // end and submit the recording command buffer; wait: for all in flight
  void submit_and_wait() { submit(true); }
  VkPipeline pipeline_for(Pipeline& p);
  uint32_t find_memory(uint32_t type_bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) const;
  Alloc make_buffer(uint64_t bytes, bool host_visible, const char* what);

  DeviceInfo info_;
  VkInstance inst_ = VK_NULL_HANDLE;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkDevice dev_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t qfam_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  static constexpr int kSlots = 3;  // command buffers in rotation (recording + in flight)
  struct Slot {
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    bool in_flight = false;
  };
  Slot slots_[kSlots];
  int cur_ = 0;                       // the slot being recorded
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;  // slots_[cur_].cb while recording
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::map<std::string, VkShaderModule> modules_;
  VkPhysicalDeviceMemoryProperties memprops_{};
  bool recording_ = false;
  bool pending_ = false;  // commands recorded since the last submit

  std::map<uint64_t, Alloc> allocs_;  // by device address
  uint64_t device_bytes_ = 0;

  Alloc ring_{};           // host-visible staging ring
  uint64_t ring_head_ = 0;
  uint64_t to_dev_ = 0, from_dev_ = 0, submits_ = 0;
};

}  // namespace kimi::vk
