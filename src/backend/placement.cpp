// Weight placement rules -> one device per forward-pass part (see placement.h).
#include "backend/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include "util/error.h"

namespace kimi {

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

std::string without_colon(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ':'), s.end());
  return s;
}

// DEV of -ot: a device name (case-insensitive; "vulkan0" = "vulkan:0" as llama.cpp spells it), a
// backend name alone for its first device ("vulkan" = the first vulkan:N, "gpu" = the first
// accelerator), or an index.
int device_index(const std::string& dev, const std::vector<std::string>& devices, const std::string& item) {
  const std::string want = lower(dev);
  for (size_t i = 0; i < devices.size(); ++i)
    if (lower(devices[i]) == want || without_colon(lower(devices[i])) == without_colon(want)) return static_cast<int>(i);
  for (size_t i = 1; i < devices.size(); ++i)
    if (want == "gpu" || lower(devices[i]).rfind(want + ":", 0) == 0) return static_cast<int>(i);
  if (!dev.empty() && std::all_of(dev.begin(), dev.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
      dev.size() < 6) {
    const int i = std::stoi(dev);
    if (i < static_cast<int>(devices.size())) return i;
  }
  std::string names;
  for (size_t i = 0; i < devices.size(); ++i) names += fmt::format("{}{} ({})", i ? ", " : "", devices[i], i);
  fail("placement: -ot '{}': unknown device '{}' (devices: {})", item, dev, names);
}

}  // namespace

std::vector<PlacementRules::Override> parse_tensor_overrides(const std::string& arg) {
  std::vector<PlacementRules::Override> out;
  size_t i = 0;
  while (i <= arg.size()) {
    size_t j = arg.find(',', i);
    if (j == std::string::npos) j = arg.size();
    const std::string item = arg.substr(i, j - i);
    const size_t eq = item.rfind('=');
    check(eq != std::string::npos && eq > 0 && eq + 1 < item.size(),
          "-ot: '{}' is not REGEX=DEVICE (e.g. 'exps=cpu' or 'blk\\.1[0-9]\\.=1')", item);
    out.push_back({item.substr(0, eq), item.substr(eq + 1)});
    i = j + 1;
  }
  return out;
}

const char* placement_part_name(PlacementPart p) {
  switch (p) {
    case PlacementPart::Input: return "input";
    case PlacementPart::Attn: return "attn";
    case PlacementPart::Ffn: return "ffn";
    case PlacementPart::Experts: return "experts";
    case PlacementPart::Output: return "output";
  }
  return "?";
}

PlacementPart placement_part_of(const std::string& name, int32_t* layer) {
  *layer = -1;
  if (starts_with(name, "blk.")) {
    const size_t dot = name.find('.', 4);
    if (dot != std::string::npos && dot > 4) {
      int32_t il = 0;
      bool digits = dot - 4 < 7;
      for (size_t k = 4; k < dot && digits; ++k) {
        if (name[k] < '0' || name[k] > '9') digits = false;
        else il = il * 10 + (name[k] - '0');
      }
      if (digits) {
        *layer = il;
        const std::string rest = name.substr(dot + 1);
        if (rest == "ffn_gate_exps.weight" || rest == "ffn_up_exps.weight" || rest == "ffn_down_exps.weight")
          return PlacementPart::Experts;
        if (starts_with(rest, "ffn_") || starts_with(rest, "exp_probs_b")) return PlacementPart::Ffn;
        return PlacementPart::Attn;
      }
    }
  }
  if (starts_with(name, "output")) return PlacementPart::Output;
  return PlacementPart::Input;
}

int Placement::part_device(PlacementPart p, int32_t il) const {
  switch (p) {
    case PlacementPart::Input: return input;
    case PlacementPart::Output: return output;
    case PlacementPart::Attn: return attn.at(static_cast<size_t>(il));
    case PlacementPart::Ffn: return ffn.at(static_cast<size_t>(il));
    case PlacementPart::Experts: return experts.at(static_cast<size_t>(il));
  }
  return 0;
}

int Placement::device_of(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  fail("placement: tensor '{}' was not placed", name);
}

bool Placement::single_device() const {
  auto zero = [](const std::vector<int>& v) { return std::all_of(v.begin(), v.end(), [](int d) { return d == 0; }); };
  return input == 0 && output == 0 && zero(attn) && zero(ffn) && zero(experts);
}

std::string Placement::summary() const {
  std::string s;
  for (size_t dev = 0; dev < devices.size(); ++dev) {
    std::string parts;
    auto add_layers = [&](const std::vector<int>& v, const char* what) {
      std::string ls;
      for (size_t il = 0; il < v.size(); ++il) {
        if (v[il] != static_cast<int>(dev)) continue;
        size_t j = il;
        while (j + 1 < v.size() && v[j + 1] == static_cast<int>(dev)) ++j;
        ls += fmt::format("{}{}", ls.empty() ? "" : ",", il == j ? std::to_string(il) : fmt::format("{}-{}", il, j));
        il = j;
      }
      if (!ls.empty()) parts += fmt::format(" {} {}", what, ls);
    };
    if (input == static_cast<int>(dev)) parts += " input";
    add_layers(attn, "attn");
    add_layers(ffn, "ffn");
    add_layers(experts, "experts");
    if (output == static_cast<int>(dev)) parts += " output";
    s += fmt::format("placement: device {} ({}):{}\n", dev, devices[dev], parts.empty() ? " nothing" : parts);
  }
  return s;
}

Placement resolve_placement(const PlacementRules& rules, const std::vector<std::string>& devices,
                            const std::vector<std::string>& tensor_names, uint32_t n_layer) {
  check(!devices.empty(), "placement: no devices (device 0 must be the host CPU backend)");
  check(rules.n_gpu_layers >= -1, "placement: -ngl must be -1 (all) or >= 0 (got {})", rules.n_gpu_layers);
  check(rules.n_cpu_moe >= 0, "placement: --n-cpu-moe must be >= 0 (got {})", rules.n_cpu_moe);
  Placement p;
  p.devices = devices;
  const int64_t L = n_layer;
  const int n_acc = static_cast<int>(devices.size()) - 1;

  // 1. layer rule (-ngl): the last N layers on devices 1..D-1 in contiguous runs
  std::vector<int> layer_dev(static_cast<size_t>(L), 0);
  int out_dev = 0;
  if (n_acc > 0 && rules.n_gpu_layers != 0) {
    const int64_t N = rules.n_gpu_layers < 0 ? L : std::min<int64_t>(rules.n_gpu_layers, L);
    for (int64_t j = 0; j < N; ++j) layer_dev[static_cast<size_t>(L - N + j)] = 1 + static_cast<int>(j * n_acc / N);
    if (rules.n_gpu_layers < 0 || rules.n_gpu_layers > L) out_dev = n_acc;  // the last accelerator
  }
  // 2. expert rules
  std::vector<int> exp_dev = layer_dev;
  for (int64_t il = 0; il < L; ++il)
    if (rules.cpu_moe || il < rules.n_cpu_moe) exp_dev[static_cast<size_t>(il)] = 0;

  // 3. per tensor: the part's default, then the first matching override
  std::vector<std::regex> res;
  std::vector<int> res_dev;
  for (const auto& o : rules.overrides) {
    const std::string item = o.pattern + "=" + o.device;
    try {
      res.emplace_back(o.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail("placement: -ot '{}': the pattern is not a valid regular expression ({})", item, e.what());
    }
    res_dev.push_back(device_index(o.device, devices, item));
  }
  p.input = 0;
  p.output = out_dev;
  p.attn = layer_dev;
  p.ffn = layer_dev;
  p.experts = exp_dev;
  // parts decided by an override: the first tensor that set them (to report a split part)
  struct Seen {
    int dev = -1;
    std::string tensor;
  };
  std::vector<Seen> seen(static_cast<size_t>(3 * L + 2));
  auto slot = [&](PlacementPart part, int32_t il) -> Seen& {
    switch (part) {
      case PlacementPart::Input: return seen[0];
      case PlacementPart::Output: return seen[1];
      case PlacementPart::Attn: return seen[static_cast<size_t>(2 + il)];
      case PlacementPart::Ffn: return seen[static_cast<size_t>(2 + L + il)];
      default: return seen[static_cast<size_t>(2 + 2 * L + il)];
    }
  };
  auto part_ref = [&](PlacementPart part, int32_t il) -> int& {
    switch (part) {
      case PlacementPart::Input: return p.input;
      case PlacementPart::Output: return p.output;
      case PlacementPart::Attn: return p.attn[static_cast<size_t>(il)];
      case PlacementPart::Ffn: return p.ffn[static_cast<size_t>(il)];
      default: return p.experts[static_cast<size_t>(il)];
    }
  };
  for (const auto& name : tensor_names) {
    int32_t il = -1;
    PlacementPart part = placement_part_of(name, &il);
    if ((part != PlacementPart::Input && part != PlacementPart::Output) && (il < 0 || il >= L)) {
      part = PlacementPart::Input;  // a stray blk tensor beyond block_count (the loader rejects or ignores it)
      il = -1;
    }
    int dev = -1;
    for (size_t k = 0; k < res.size() && dev < 0; ++k)
      if (std::regex_search(name, res[k])) dev = res_dev[k];
    Seen& s = slot(part, il);
    const int fallback = part_ref(part, il);
    const int d = dev >= 0 ? dev : fallback;
    if (s.dev < 0) {
      s.dev = d;
      s.tensor = name;
    } else if (s.dev != d) {
      const std::string where = il >= 0 ? fmt::format("layer {}'s {}", il, placement_part_name(part))
                                        : fmt::format("the {} part", placement_part_name(part));
      fail("placement: tensor '{}' would go to device {} ({}) but '{}' of {} goes to device {} ({}); all tensors "
           "of a part must be on one device (match the whole part with -ot, e.g. 'blk\\.{}\\.=DEV')",
           name, d, devices[static_cast<size_t>(d)], s.tensor, where, s.dev, devices[static_cast<size_t>(s.dev)],
           il >= 0 ? il : 0);
    }
  }
  // apply: a part's device is the one its tensors agreed on (the rule default for parts without tensors)
  for (PlacementPart part : {PlacementPart::Input, PlacementPart::Output})
    if (slot(part, -1).dev >= 0) part_ref(part, -1) = slot(part, -1).dev;
  for (int32_t il = 0; il < L; ++il)
    for (PlacementPart part : {PlacementPart::Attn, PlacementPart::Ffn, PlacementPart::Experts})
      if (slot(part, il).dev >= 0) part_ref(part, il) = slot(part, il).dev;
  for (const auto& name : tensor_names) {
    int32_t il = -1;
    PlacementPart part = placement_part_of(name, &il);
    if ((part != PlacementPart::Input && part != PlacementPart::Output) && (il < 0 || il >= L)) {
      part = PlacementPart::Input;
      il = -1;
    }
    p.tensors[name] = part_ref(part, il);
  }
  return p;
}

PlacementRules fit_to_memory(PlacementRules r, const std::vector<std::string>& devices,
                             const std::vector<TensorBytes>& tensors, uint32_t n_layer, uint64_t budget,
                             uint64_t reserve, std::string* why) {
  if (budget == 0 || devices.size() < 2) return r;
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const auto& t : tensors) names.push_back(t.name);
  auto on_accel = [&](const PlacementRules& rr) {
    const Placement p = resolve_placement(rr, devices, names, n_layer);
    uint64_t b = 0;
    for (const auto& t : tensors)
      if (p.device_of(t.name) != 0) b += t.bytes;
    return b;
  };
  auto fits = [&](const PlacementRules& rr, uint64_t* b) {
    *b = on_accel(rr);
    return *b + reserve <= budget;
  };
  auto gib = [](uint64_t b) { return static_cast<double>(b) / 1073741824.0; };
  uint64_t b = 0;
  std::string msg;
  if (fits(r, &b)) {
    msg = fmt::format("placement: {:.2f} GiB of weights on {} ({:.2f} GiB available): everything the rules place there fits",
                      gib(b), devices[1], gib(budget - reserve));
  } else {
    const uint64_t all = b;
    r.cpu_moe = true;
    if (fits(r, &b)) {
      msg = fmt::format("placement: the model needs {:.2f} GiB on {} ({:.2f} GiB available): routed experts stay on the "
                        "CPU (--cpu-moe), {:.2f} GiB on the device",
                        gib(all), devices[1], gib(budget - reserve), gib(b));
    } else {
      int ngl = static_cast<int>(n_layer);
      for (; ngl > 0; --ngl) {
        r.n_gpu_layers = ngl;
        if (fits(r, &b)) break;
      }
      r.n_gpu_layers = ngl;
      b = ngl > 0 ? b : 0;
      msg = fmt::format("placement: the model needs {:.2f} GiB on {} ({:.2f} GiB available): routed experts on the CPU "
                        "and the last {} of {} layers on the device (-ngl {}), {:.2f} GiB",
                        gib(all), devices[1], gib(budget > reserve ? budget - reserve : 0), ngl, n_layer, ngl, gib(b));
    }
  }
  if (why) *why = msg;
  return r;
}

}  // namespace kimi
