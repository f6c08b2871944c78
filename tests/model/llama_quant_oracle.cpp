// llama.cpp's own quantizer as an oracle for the per-tensor types of `kimi quantize`: runs
// llama_model_quantize of the prebuilt llama.cpp v0.5.0 library (../shared/tools/llama-ref) as a dry
// run (no data is quantized) and prints, per tensor in file order, "NAME TYPE" with the type
// llama.cpp's rules chose. Not part of the build: tests/model/test_convert_llama_ref.cpp compiles it
// against llama-ref's headers and libraries when llama-ref is installed.
//
// usage: llama_quant_oracle MODEL.gguf FTYPE [--imatrix-ones]
//   FTYPE: the llama_ftype number; --imatrix-ones passes an importance matrix of ones for every
//   2-D/3-D tensor (llama.cpp's rules then see has_imatrix = true; the values do not matter in a
//   dry run).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

static std::string g_log;

static void capture(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_INFO || level == GGML_LOG_LEVEL_CONT || level == GGML_LOG_LEVEL_WARN) g_log += text;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf FTYPE [--imatrix-ones]\n", argv[0]);
    return 2;
  }
  const bool ones = argc > 3 && std::strcmp(argv[3], "--imatrix-ones") == 0;
  llama_log_set(capture, nullptr);
#ifdef ORACLE_BACKEND_DIR
  ggml_backend_load_all_from_path(ORACLE_BACKEND_DIR);
#endif
  llama_backend_init();
  llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = static_cast<llama_ftype>(std::atoi(argv[2]));
  p.dry_run = true;
  p.nthread = 1;

  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<llama_model_imatrix_data> imatrix;
  if (ones) {
    ggml_context* meta = nullptr;
    gguf_init_params gp{true, &meta};
    gguf_context* g = gguf_init_from_file(argv[1], gp);
    if (!g) {
      std::fprintf(stderr, "cannot read %s\n", argv[1]);
      return 1;
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
      const char* name = gguf_get_tensor_name(g, i);
      const ggml_tensor* t = ggml_get_tensor(meta, name);
      if (!t || ggml_n_dims(t) < 2) continue;
      names.emplace_back(name);
      values.emplace_back(static_cast<size_t>(t->ne[0] * t->ne[2]), 1.0f);
    }
    for (size_t i = 0; i < names.size(); ++i) imatrix.push_back({names[i].c_str(), values[i].data(), values[i].size()});
    imatrix.push_back({nullptr, nullptr, 0});
    p.imatrix = imatrix.data();
    gguf_free(g);
    ggml_free(meta);
  }
  const uint32_t rc = llama_model_quantize(argv[1], "/dev/null", &p);
  if (rc != 0) {
    std::fprintf(stderr, "llama_model_quantize failed (%u)\n%s", rc, g_log.c_str());
    return 1;
  }
  // "[   3/ 228] blk.0.attn_q.weight    - [ 2048,  2048,     1,     1], type =   bf16, size = ... MiB -> ... MiB (q4_K)"
  // or "..., type =    f32, size =    0.008 MiB" (kept)
  size_t pos = 0;
  int n = 0;
  while ((pos = g_log.find("] ", pos)) != std::string::npos) {
    const size_t line_start = g_log.rfind('\n', pos) == std::string::npos ? 0 : g_log.rfind('\n', pos) + 1;
    if (g_log[line_start] != '[') {
      ++pos;
      continue;
    }
    const size_t eol = g_log.find('\n', pos);
    const std::string line = g_log.substr(pos + 2, (eol == std::string::npos ? g_log.size() : eol) - pos - 2);
    pos = eol == std::string::npos ? g_log.size() : eol;
    const size_t dash = line.find(" - [");
    const size_t ty = line.find("type = ");
    if (dash == std::string::npos || ty == std::string::npos) continue;
    std::string name = line.substr(0, dash);
    while (!name.empty() && name.back() == ' ') name.pop_back();
    std::string type;
    const size_t open = line.rfind('('), close = line.rfind(')');
    if (line.find("->") != std::string::npos && open != std::string::npos && close > open) {
      type = line.substr(open + 1, close - open - 1);
    } else {
      const size_t b = line.find_first_not_of(' ', ty + 7);
      type = line.substr(b, line.find(',', b) - b);
    }
    std::printf("%s %s\n", name.c_str(), type.c_str());
    ++n;
  }
  if (n == 0) {
    std::fprintf(stderr, "no tensor lines in llama.cpp's log:\n%s", g_log.c_str());
    return 1;
  }
  return 0;
}
