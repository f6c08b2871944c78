// The tiny synthetic model for the harnesses (see common.h).
#include <string>

#include "common.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "util/error.h"

namespace kimi::fuzz {

const std::string& tiny_hf_dir() {
  static const std::string dir = [] {
    const std::string d = temp_dir() + "/tiny-hf";
    try {
      synth::write_checkpoint(synth::preset("tiny"), d, {.quiet = true});
    } catch (const Error& e) {
      die(std::string("synth tiny: ") + e.what());
    }
    return d;
  }();
  return dir;
}

const std::string& tiny_gguf() {
  static const std::string path = [] {
    const std::string p = temp_dir() + "/tiny.gguf";
    try {
      convert::ConvertOptions o;
      o.hf_dir = tiny_hf_dir();
      o.out_path = p;
      o.quiet = true;
      convert::convert(o);
    } catch (const Error& e) {
      die(std::string("convert tiny: ") + e.what());
    }
    return p;
  }();
  return path;
}

}  // namespace kimi::fuzz
