// Images in a prompt (docs/spec/vision.md §4): the projector file next to a model, the media text
// an image becomes, the tower run on a backend of its own (CPU, or a Vulkan one the caller gives),
// and a batch whose <|media_pad|>
// positions take the tower's rows.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/mat_view.h"
#include "image/image.h"
#include "model/vision.h"
#include "runtime/context.h"

namespace kimi {

class ThreadPool;
class CpuBackend;

// MODEL.gguf -> MODEL.mmproj.gguf when that file exists, else "" (what `kimi convert` writes).
std::string find_mmproj(const std::string& model_path);

// The error for an image sent to a text-only model: how to get a vision-capable file.
std::string no_vision_message(const std::string& model_path);

// "<|media_begin|>image {w}x{h}<|media_content|>" + tokens x "<|media_pad|>" + "<|media_end|>"
std::string media_text(const image::Patches& p);

class VisionRunner {
 public:
  // mmproj: the projector file; text_hidden: the text model's hidden size (checked); backend: the
  // tower's own backend (not a context's: the runner reserves its scratch), nullptr: a CPU backend
  // of n_threads threads in precision prec
  VisionRunner(const std::string& mmproj, int64_t text_hidden, int n_threads, Precision prec,
               std::shared_ptr<Backend> backend = nullptr);
  ~VisionRunner();
  const VisionModel& model() const { return *m_; }
  const char* backend_name() const { return be_->name(); }  // "cpu", "vulkan:0", ...
  image::Patches preprocess(const image::Rgb& img) const { return m_->preprocess(img); }
  // rows [sum of tokens][text hidden] for the images in order; cancel: VisionEncoder::encode
  std::vector<float> encode(const std::vector<const image::Patches*>& images, const std::atomic<bool>* cancel = nullptr);

 private:
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> cpu_;
  std::shared_ptr<Backend> be_;  // cpu_ or the given backend
  std::unique_ptr<VisionModel> m_;
  std::unique_ptr<VisionEncoder> enc_;
};

// Adds `tokens` of sequence seq at positions pos0.. to the batch; the i-th `placeholder` token takes
// row i of `rows` (n_rows rows of d floats, host, valid until decode returns). Throws when the
// prompt's placeholder count differs from n_rows.
void add_prompt_with_images(Batch& b, const std::vector<int32_t>& tokens, int32_t placeholder, const float* rows,
                            int64_t n_rows, int64_t d, int32_t seq, int32_t pos0, bool logits_last);

}  // namespace kimi
