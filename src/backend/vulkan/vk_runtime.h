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
// Ordering. Ops, copies, uploads and fills are issued in order; a full compute/transfer barrier
// separates them (and one starts every command buffer, which orders it after everything submitted
// before it on the queue). flush() submits what is issued without waiting, so the host can issue
// the next ops while the device runs; download and sync submit and wait for everything in flight;
// so does a full staging ring. Host data that an op reads (the micro-batch, an upload) is copied
// into a host-visible staging ring first, so the caller's memory may change right after the call;
// the ring is written front to back and restarts at its beginning only when nothing in flight can
// still read it (everything submitted has completed).
//
// The tape and replay. An op is not recorded into a command buffer at once: it is appended to the
// tape, a flat list of 64-bit words holding exactly what the command buffer would get (pipeline,
// push-constant bytes, group counts or the staged address of indirect counts, copy and fill
// regions). At submit the tape is compared with the tapes of the command buffers recorded before
// (a hash, then the whole words); on a match the cached command buffer is submitted again (the
// commands it holds are those the tape describes, so it equals a fresh recording), otherwise the
// tape is recorded into a free command buffer, which is kept for the next match. A decode step
// starts on an idle runtime, so the ring restarts at the same offset, staged addresses repeat and
// steps of one shape give the same tape: the new inputs are in the ring, the command buffer is
// replayed. What changes per step is staged data (positions, visible-row counts read by the
// shaders; group counts read by vkCmdDispatchIndirect), never the tape, except where a shape
// really changes (attention's chunk splits every 64 positions). Freeing a buffer or a pipeline drops
// every cached command buffer (they may reference it). KIMI_VULKAN_REPLAY=0 records every
// submission fresh (the A/B switch); the results are the same bits either way. Nothing is
// allocated per op: the ring, the tape and the command buffers are reused.
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
  // a dispatch whose group counts are 3 uint32 at `args`, a staged address (stage()): they may
  // change from step to step without changing the tape
  void dispatch_indirect(Pipeline& p, const void* push, uint32_t push_bytes, uint64_t args);
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
  // command buffers recorded from the tape, and cached ones submitted again (replayed)
  uint64_t recorded() const { return recorded_; }
  uint64_t replayed() const { return replayed_; }
  double record_seconds() const { return record_ns_ * 1e-9; }  // host time spent recording them
  bool replay_enabled() const { return replay_; }

 private:
  void barrier(VkCommandBuffer cb);
  void submit(bool wait);  // submit the tape; wait: for everything in flight
  void submit_and_wait() { submit(true); }
  void put(uint64_t w);  // a tape word (and the running hash)
  void put_push(const void* push, uint32_t push_bytes);
  // a buffer-to-buffer copy on the tape: bytes from src_buf at src_off to dst_buf at dst_off
  void put_copy(VkBuffer src_buf, VkBuffer dst_buf, uint64_t src_off, uint64_t dst_off, uint64_t bytes);
  void record(VkCommandBuffer cb, bool reusable);  // the tape into cb
  bool complete(uint64_t serial);                  // submission `serial` has finished (no wait)
  void wait_fence(int f);
  void drop_cache();  // cached command buffers may reference something freed
  void report_mismatch() const;
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
  // submissions in flight at most (each with its fence); command buffers: kept for replay or free
  static constexpr int kFences = 3;
  static constexpr int kEntries = 24;
  struct Fence {
    VkFence fence = VK_NULL_HANDLE;
    bool in_flight = false;
    uint64_t serial = 0;  // the submission it signals
  };
  struct Entry {
    VkCommandBuffer cb = VK_NULL_HANDLE;
    std::vector<uint64_t> tape;  // what cb holds, when cached
    uint64_t hash = 0;
    bool cached = false;
    uint64_t serial = 0;  // its last submission
    uint64_t used = 0;    // for least-recently-used reuse
  };
  Fence fences_[kFences];
  int next_fence_ = 0;
  Entry entries_[kEntries];
  uint64_t serial_ = 0, done_serial_ = 0;  // last submission, last one known complete
  std::vector<uint64_t> tape_;             // the ops issued since the last submit
  static constexpr uint64_t kHashSeed = 0x6a09e667f3bcc908ull;
  uint64_t tape_hash_ = kHashSeed;
  bool replay_ = true;
  bool debug_tape_ = false;  // KIMI_VULKAN_TAPE_DEBUG=1: why a tape was not replayed (stderr)
  std::map<uint64_t, std::string> pipe_names_;  // for that report
  uint64_t recorded_ = 0, replayed_ = 0, record_ns_ = 0;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::map<std::string, VkShaderModule> modules_;
  VkPhysicalDeviceMemoryProperties memprops_{};

  std::map<uint64_t, Alloc> allocs_;  // by device address
  uint64_t device_bytes_ = 0;

  Alloc ring_{};           // host-visible staging ring
  uint64_t ring_head_ = 0;
  uint64_t to_dev_ = 0, from_dev_ = 0, submits_ = 0;
};

}  // namespace kimi::vk
