// kimi run: generate tokens from a prompt (text through the GGUF tokenizer, or token ids).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <optional>

#include "command.h"
#include "engine_args.h"
#include "model/model.h"
#include "runtime/chat_session.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "runtime/vision_input.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate tokens with a kimi-k3 GGUF model"};
  kimi::app::EngineArgs ea;
  kimi::app::add_engine_options(app, ea);
  std::string prompt, tokens, prompt_file;
  int n_predict = 32;
  bool ids = false, ignore_eos = false, no_display_prompt = false;
  kimi::SamplerParams sp;
  app.add_option("-p,--prompt", prompt, "prompt text (needs the tokenizer in the GGUF)");
  app.add_option("-f,--file", prompt_file, "read the prompt text from FILE (as -p)");
  app.add_flag("--no-display-prompt", no_display_prompt, "do not echo the prompt before the generated text");
  app.add_option("--tokens", tokens, "prompt as comma-separated token ids");
  app.add_option("-n,--n-predict", n_predict, "tokens to generate")->check(CLI::Range(0, INT32_MAX));
  kimi::app::add_sampling_options(app, sp);
  kimi::app::SpecArgs sa;
  kimi::app::add_spec_options(app, sa);
  app.add_flag("--ids", ids, "print generated token ids instead of text");
  app.add_flag("--ignore-eos", ignore_eos, "do not stop at end-of-generation tokens");
  bool chat = false;
  app.add_flag("--chat", chat, "wrap -p TEXT in the Kimi chat format (one user turn, thinking on)");
  std::vector<std::string> images;
  std::string mmproj;
  app.add_option("--image", images, "an image (PNG, JPEG, WebP, GIF) placed before the prompt text; repeatable");
  app.add_option("--mmproj", mmproj, "the vision projector file (default: MODEL.mmproj.gguf next to the model)");
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;
  if (app.count("--file")) {
    kimi::check(!app.count("--prompt"), "give one of -p/--prompt and -f/--file");
    std::ifstream f(prompt_file, std::ios::binary);
    kimi::check(f.good(), "-f/--file: cannot open '{}'", prompt_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
    kimi::check(!prompt.empty(), "-f/--file: '{}' is empty", prompt_file);
  }
  kimi::check(!(app.count("--prompt") && prompt.empty()), "-p/--prompt: the prompt is empty");
  kimi::check(prompt.empty() != tokens.empty(), "give exactly one of -p/--prompt (or -f/--file) and --tokens");
  const std::string shown_prompt = prompt;
  kimi::check(!chat || !prompt.empty(), "--chat needs -p/--prompt");
  kimi::check(images.empty() || !prompt.empty(), "--image needs a text prompt (-p or -f), not --tokens");

  const kimi::SpecParams spec = kimi::app::spec_params(sa);
  auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
  // images: decoded, preprocessed and run through the tower before the prompt is tokenized
  // (docs/spec/vision.md §4: each becomes its media text, before the prompt text)
  std::vector<float> image_rows;
  int32_t placeholder = -1;
  if (!images.empty()) {
    if (mmproj.empty()) mmproj = kimi::find_mmproj(ea.model);
    kimi::check(!mmproj.empty(), "{}", kimi::no_vision_message(ea.model));
    kimi::VisionRunner vr(mmproj, model->hparams().n_embd, ea.threads,
                          ea.precision == "f32" ? kimi::Precision::F32 : kimi::Precision::Fast,
                          kimi::app::side_backend(ea));
    std::vector<kimi::image::Patches> ps;
    std::string media;
    for (const auto& f : images) {
      ps.push_back(vr.preprocess(kimi::image::decode_file(f, {})));
      media += kimi::media_text(ps.back());
    }
    std::vector<const kimi::image::Patches*> pp;
    int64_t n_patches = 0;
    for (const auto& p : ps) pp.push_back(&p), n_patches += p.size.gh * p.size.gw;
    const auto tv = std::chrono::steady_clock::now();
    image_rows = vr.encode(pp);
    const double sv = std::chrono::duration<double>(std::chrono::steady_clock::now() - tv).count();
    std::fprintf(stderr, "images: %zu, %lld patches -> %lld tokens, vision tower on %s %.3f s (%.1f patches/s)\n",
                 ps.size(),
                 static_cast<long long>(n_patches), static_cast<long long>(image_rows.size() / model->hparams().n_embd),
                 vr.backend_name(), sv, n_patches / std::max(sv, 1e-9));
    placeholder = vr.model().hp().placeholder;
    prompt = media + prompt;
  }
  if (chat) prompt = kimi::render_single_turn(prompt);
  std::optional<kimi::tok::Tokenizer> tok;
  if (model->reader().has("tokenizer.ggml.tokens")) tok.emplace(kimi::tok::Tokenizer::from_gguf(model->reader()));
  std::vector<int32_t> in;
  if (!prompt.empty()) {
    kimi::check(tok.has_value(), "{}: -p needs a tokenizer (tokenizer.ggml.tokens) in the GGUF; use --tokens",
                ea.model);
    in = tok->encode(prompt);
    if (placeholder >= 0)
      kimi::check(tok->token_id("<|media_pad|>") == placeholder,
                  "the projector's placeholder id {} is not the tokenizer's <|media_pad|> ({})", placeholder,
                  tok->token_id("<|media_pad|>"));
  } else {
    in = kimi::app::parse_token_list(tokens);
  }
  kimi::check(!in.empty(), "the prompt is empty");
  const bool text_out = tok.has_value() && !ids;

  const int64_t n_ctx_need = static_cast<int64_t>(in.size()) + n_predict + 1;
  const uint32_t n_ctx_train = model->hparams().n_ctx_train;
  kimi::check(ea.ctx > 0 || n_ctx_train == 0 || n_ctx_need <= n_ctx_train,
              "{}: the prompt ({} tokens) + -n {} exceed the model's context length {} (kimi-k3.context_length)",
              ea.model, in.size(), n_predict, n_ctx_train);
  // positions decoded: the prompt and every generated token but the last
  const int64_t n_pos = static_cast<int64_t>(in.size()) + std::max(n_predict - 1, 0);
  kimi::check(ea.ctx == 0 || n_pos <= ea.ctx,
              "the prompt ({} tokens) + -n {} need {} positions, which exceeds the context size (-c {})", in.size(),
              n_predict, n_pos, ea.ctx);
  const int n_ctx = static_cast<int>(std::min<int64_t>(n_ctx_need, INT32_MAX));
  // the DSpark draft's block may reach block_size - 1 positions past the last one decoded
  // the DSpark draft on a Vulkan backend of its own when the target's layers are on Vulkan
  const std::shared_ptr<kimi::Backend> draft_be = !sa.draft_model.empty() ? kimi::app::side_backend(ea) : nullptr;
  std::unique_ptr<kimi::Drafter> drafter =
      kimi::app::make_drafter(sa, *model, n_ctx + 64, ea.threads,
                              ea.precision == "f32" ? kimi::Precision::F32 : kimi::Precision::Fast, draft_be);
  int n_batch = std::min<int>(ea.batch, static_cast<int>(in.size()));
  kimi::ContextOptions co = kimi::app::context_options(ea, n_ctx, n_batch);
  if (drafter) {  // a verify step in one micro-batch; one snapshot slot for the step's rollback
    co.n_batch_max = std::max(co.n_batch_max, std::min(ea.batch, 3 * spec.n_max + 2));
    co.n_snapshots_max += 1;
  }
  kimi::Context ctx(*model, co);
  kimi::app::print_engine_summary(ea, ctx);
  kimi::Sampler sampler(sp, ctx.n_vocab());
  for (int32_t t : in) sampler.accept(t);

  if (!no_display_prompt && text_out) {  // the prompt first, as llama-cli shows it
    const std::string shown = !shown_prompt.empty() ? shown_prompt : tok->decode(in);
    std::fwrite(shown.data(), 1, shown.size(), stdout);
    std::fflush(stdout);
  }
  using clk = std::chrono::steady_clock;
  auto t0 = clk::now();
  kimi::Batch b;
  if (placeholder >= 0)
    kimi::add_prompt_with_images(b, in, placeholder, image_rows.data(),
                                 static_cast<int64_t>(image_rows.size()) / model->hparams().n_embd,
                                 model->hparams().n_embd, 0, 0, true);
  else
    b.add_sequence(in, 0, 0, true);
  // a drafter that reads the target's hidden states (dspark) needs them from the prompt on
  if (drafter) ctx.set_tap_layers({drafter->tap_layers().begin(), drafter->tap_layers().end()});
  ctx.decode(b);
  auto t1 = clk::now();
  const kimi::ExpertStreamStats xs_pp = ctx.expert_stream_stats();
  int n_gen = 0;
  kimi::Speculator gen(ctx, 0, sampler, drafter.get(), spec);
  bool done = n_predict == 0;
  auto emit = [&](int32_t t) {  // prints t; true when generation ends with it
    ++n_gen;
    if (text_out) {
      const std::string& piece = tok->token_to_piece(t);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      std::printf("%s%d", n_gen > 1 ? " " : "", t);
    }
    std::fflush(stdout);
    return (!ignore_eos && ((tok && tok->is_eog(t)) || t == model->hparams().eos_id)) || n_gen == n_predict;
  };
  if (!done) {
    const int32_t first = sampler.sample(ctx.logits(b.size() - 1));
    sampler.accept(first);
    done = emit(first);
    gen.start(in, first);
  }
  while (!done)
    for (int32_t t : gen.step(n_predict - n_gen))
      if ((done = emit(t))) break;
  auto t2 = clk::now();
  std::printf("\n");
  std::fflush(stdout);  // the text ends before the stats on stderr
  const double pp_s = std::chrono::duration<double>(t1 - t0).count();
  const double tg_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.2f tok/s); generated %d tokens in %.3f s (%.2f tok/s)\n",
               in.size(), pp_s, in.size() / std::max(pp_s, 1e-9), n_gen, tg_s,
               n_gen > 1 ? (n_gen - 1) / std::max(tg_s, 1e-9) : 0.0);
  if (drafter)
    std::fprintf(stderr, "%s\n",
                 kimi::app::spec_summary(sa, gen.stats(), draft_be ? draft_be->name() : std::string()).c_str());
  if (ea.verbose && xs_pp.offload_steps + xs_pp.offload_declined > 0)  // prefill offload (docs/gpu.md)
    std::fprintf(stderr, "prompt: %s\n", xs_pp.offload_summary().c_str());
  if (ea.verbose && xs_pp.enabled)
    std::fprintf(stderr, "prompt: %s\ngenerate: %s\n", xs_pp.summary(pp_s).c_str(),
                 ctx.expert_stream_stats().minus(xs_pp).summary(tg_s).c_str());
  return 0;
}

kimi::app::Registrar reg_run("run", "generate text/tokens from a prompt", cmd_run);

}  // namespace
