// Helpers shared by tests: temp dirs, running the kimi binary, tiny synthetic models.
#pragma once
#include <string>

namespace kimi::test {

// A fresh empty directory under the system temp dir, removed by the destructor.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};
// Runs `kimi ARGS` (ARGS is shell-quoted by the caller), capturing output.
RunResult run_kimi(const std::string& args);

// Path of a cached tiny synthetic HF checkpoint / converted GGUF made once per test binary run
// (`kimi synth --preset tiny --seed SEED [extra]` and `kimi convert`). Cached under the build dir.
std::string tiny_hf(int seed = 1, const std::string& extra_synth_args = "");
std::string tiny_gguf(int seed = 1, const std::string& extra_synth_args = "", const std::string& extra_convert_args = "");
// A directory with model.gguf (text) and model.mmproj.gguf (the vision projector file) converted
// from tiny_hf(seed, extra_synth_args).
std::string tiny_vision_dir(int seed = 1, const std::string& extra_synth_args = "");

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& data);

}  // namespace kimi::test
