// Weight placement: which backend holds each tensor, decided once at load time from rules in the
// style of llama.cpp's -ngl / --cpu-moe / --n-cpu-moe / -ot, never inside layer code.
//
//   kimi::PlacementRules r;          // filled by the command line
//   r.n_gpu_layers = 20;             // -ngl 20: the last 20 layers on the accelerator(s)
//   r.n_cpu_moe = 4;                 // --n-cpu-moe 4: routed experts of layers 0..3 stay on the host
//   r.overrides = kimi::parse_tensor_overrides("blk\\.7\\.=cpu");   // -ot REGEX=DEV
//   kimi::Placement p = kimi::resolve_placement(r, {"cpu", "gpu0"}, tensor_names, n_layer);
//   p.device_of("blk.30.attn_q.weight");   // -> 1
//
// Devices are backend indices: 0 is always the host CPU backend, 1.. the accelerators or remote
// ranks in the order the engine lists them. With only the CPU, every rule resolves to device 0.
//
// The forward pass runs in parts; all tensors of one part must be on one device (the part runs
// there and the activations are copied between parts on different devices):
//   input    token_embd.weight                                   (default: device 0)
//   attn     blk.N.attn_norm / attn_res_score and the mixer: attn_*, ssm_*, indexer.*
//   ffn      blk.N.ffn_norm / ffn_res_score, dense ffn_gate/up/down, router ffn_gate_inp +
//            exp_probs_b, shared experts *_shexp, latent ffn_routed_down/up/norm
//   experts  blk.N.ffn_gate_exps / ffn_up_exps / ffn_down_exps (the routed experts)
//   output   output_norm, output_res_score, output.weight (the lm head)
// A layer's caches and states (MLA latent rows, indexer keys, KDA states) live with its attn part.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kimi {

struct PlacementRules {
  // -ngl N: the weights of the LAST N layers (layers n_layer-N .. n_layer-1) go to the accelerator
  // devices 1..D-1, split into contiguous runs of (nearly) equal length in device order; the
  // first layers stay on device 0. N > n_layer also places the output part (as llama.cpp does);
  // -1 = every layer and the output. Ignored (everything on device 0) without an accelerator.
  int n_gpu_layers = 0;
  bool cpu_moe = false;  // --cpu-moe: the routed experts of every layer stay on device 0
  int n_cpu_moe = 0;     // --n-cpu-moe N: the routed experts of layers 0..N-1 stay on device 0
  // -ot REGEX=DEV: a tensor whose name the ECMAScript regex matches anywhere (std::regex_search)
  // goes to DEV (a device name, case-insensitive, or its index). Checked in order, the first
  // match wins, and an override beats every rule above.
  struct Override {
    std::string pattern;
    std::string device;
  };
  std::vector<Override> overrides;
  // Fit the rules to the first accelerator's memory when the context is made (fit_to_memory):
  // set by the command line when -ngl was not given with an accelerator device.
  bool auto_fit = false;
};

// One -ot argument: "REGEX=DEV", several joined with ',' (as llama.cpp accepts). The '=' that
// separates is the last one of each item. Throws kimi::Error naming the bad item.
std::vector<PlacementRules::Override> parse_tensor_overrides(const std::string& arg);

enum class PlacementPart : uint8_t { Input, Attn, Ffn, Experts, Output };
const char* placement_part_name(PlacementPart p);
// The part a tensor belongs to and its layer (-1 for input/output tensors).
PlacementPart placement_part_of(const std::string& tensor_name, int32_t* layer);

// The resolved decision: a device for every part (and so for every tensor).
struct Placement {
  std::vector<std::string> devices;           // names, index = device
  int input = 0, output = 0;                  // devices of the input / output parts
  std::vector<int> attn, ffn, experts;        // per layer
  std::map<std::string, int> tensors;         // every tensor name given -> its device

  int device_of(const std::string& tensor_name) const;  // throws for a name not resolved
  int part_device(PlacementPart p, int32_t layer) const;
  bool single_device() const;                 // every part on device 0
  // One line per device: which layers' parts it holds (for -v and the load summary).
  std::string summary() const;
};

struct TensorBytes {
  std::string name;
  uint64_t bytes = 0;
};

// The default placement on an accelerator of `budget` bytes (device 1), keeping `reserve` bytes
// free for caches and work buffers: the rules as given when everything they place on
// accelerators fits; else the routed experts on the CPU first (--cpu-moe, what users of big MoE
// models do by hand); else also fewer layers (-ngl) until it fits. `why` gets one line for the
// load summary. budget 0 = unlimited (rules returned as given).
PlacementRules fit_to_memory(PlacementRules rules, const std::vector<std::string>& devices,
                             const std::vector<TensorBytes>& tensors, uint32_t n_layer, uint64_t budget,
                             uint64_t reserve, std::string* why);

// Resolves the rules for the given devices (names; index 0 = host CPU, must not be empty) and
// tensor names. Throws kimi::Error for an override naming an unknown device, a regex that does not
// compile, or a placement that splits one part over two devices (naming the tensors).
Placement resolve_placement(const PlacementRules& rules, const std::vector<std::string>& devices,
                            const std::vector<std::string>& tensor_names, uint32_t n_layer);

}  // namespace kimi
