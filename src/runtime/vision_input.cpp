#include "runtime/vision_input.h"

#include <fmt/format.h>

#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kimi {

std::string find_mmproj(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::string p = model_path;
  const std::string ext = ".gguf";
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0)
    p = p.substr(0, p.size() - ext.size());
  p += ".mmproj.gguf";
  std::error_code ec;
  return fs::is_regular_file(p, ec) ? p : std::string();
}

std::string no_vision_message(const std::string& model_path) {
  return fmt::format(
      "{}: this model has no vision projector, so it cannot read images: convert the Hugging Face checkpoint "
      "again without --no-vision (`kimi convert HF_DIR -o MODEL.gguf` writes MODEL.mmproj.gguf next to it) and "
      "keep that file next to the model, or name it with --mmproj FILE",
      model_path);
}

std::string media_text(const image::Patches& p) {
  std::string s = fmt::format("<|media_begin|>image {}x{}<|media_content|>", p.width, p.height);
  s.reserve(s.size() + static_cast<size_t>(p.size.tokens) * 13 + 16);
  for (int64_t i = 0; i < p.size.tokens; ++i) s += "<|media_pad|>";
  s += "<|media_end|>";
  return s;
}

VisionRunner::VisionRunner(const std::string& mmproj, int64_t text_hidden, int n_threads, Precision prec,
                           std::shared_ptr<Backend> backend)
    : be_(std::move(backend)), m_(VisionModel::load(mmproj, text_hidden)) {
  if (!be_) {
    pool_ = std::make_unique<ThreadPool>(n_threads);
    cpu_ = std::make_unique<CpuBackend>(*pool_, prec);
    be_ = std::shared_ptr<Backend>(cpu_.get(), [](Backend*) {});  // owned by cpu_
  }
  be_->reserve({});
  enc_ = std::make_unique<VisionEncoder>(*m_, *be_);
}

VisionRunner::~VisionRunner() = default;

std::vector<float> VisionRunner::encode(const std::vector<const image::Patches*>& images,
                                        const std::atomic<bool>* cancel) {
  return enc_->encode(images, cancel);
}

void add_prompt_with_images(Batch& b, const std::vector<int32_t>& tokens, int32_t placeholder, const float* rows,
                            int64_t n_rows, int64_t d, int32_t seq, int32_t pos0, bool logits_last) {
  int64_t n_ph = 0;
  for (int32_t t : tokens) n_ph += t == placeholder;
  check(n_ph == n_rows, "the prompt has {} image placeholder tokens (<|media_pad|>, id {}) but the images give {} rows",
        n_ph, placeholder, n_rows);
  int64_t r = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool last = logits_last && i + 1 == tokens.size();
    const int32_t pos = pos0 + static_cast<int32_t>(i);
    if (tokens[i] == placeholder)
      b.add_embd(tokens[i], rows + (r++) * d, seq, pos, last);
    else
      b.add(tokens[i], seq, pos, last);
  }
}

}  // namespace kimi
