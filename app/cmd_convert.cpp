// kimi convert HF_DIR -o OUT.gguf [--outtype auto|bf16|f16|f32|q8_0] [--layers N] [--split-max-size SIZE]
//              [--mmproj PATH | --no-vision] [--quiet]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"
#include "convert/convert.h"
#include "util/progress.h"
#include "util/cli.h"

namespace {

int cmd_convert(int argc, char** argv) {
  CLI::App app{"Convert a Hugging Face Kimi-K3 / K3.1 checkpoint to GGUF (text model + a vision projector file)", "kimi convert"};
  std::string hf_dir, out, outtype = "auto", split, mmproj;
  int64_t layers = -1;
  bool quiet = false, no_vision = false;
  app.add_option("HF_DIR", hf_dir, "Hugging Face model directory (config.json, *.safetensors, tiktoken.model)")
      ->required();
  app.add_option("-o,--output", out, "output GGUF path (split output: PREFIX-0000N-of-0000M.gguf)")->required();
  app.add_option("--outtype", outtype, "auto|bf16|f16|f32|q8_0 (MXFP4 experts always stay MXFP4)")
      ->check(CLI::IsMember({"auto", "bf16", "f16", "f32", "q8_0"}, CLI::ignore_case));
  app.add_option("--layers", layers, "keep only the first N layers")->check(CLI::Range(1, INT32_MAX));
  app.add_option("--split-max-size", split, "split output into shards of at most SIZE tensor bytes (e.g. 500M, 2G)");
  auto* mm = app.add_option("--mmproj", mmproj,
                            "where the vision tower + projector go (default: OUT with .gguf -> .mmproj.gguf)");
  app.add_flag("--no-vision", no_vision, "write only the text model (no projector file)")->excludes(mm);
  app.add_flag("--quiet,-q", quiet, "print only the summary");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  kimi::convert::ConvertOptions o;
  o.hf_dir = hf_dir;
  o.out_path = out;
  o.outtype = kimi::convert::parse_outtype(outtype);
  o.layers = layers;
  o.split_max_bytes = split.empty() ? 0 : kimi::parse_size(split);
  o.quiet = quiet;
  o.no_vision = no_vision;
  o.mmproj_path = mmproj;
  auto r = kimi::convert::convert(o);
  std::printf("converted %zu tensors, %s (%s, file_type %u) in %.2fs, %s/s; %zu metadata keys\n", r.n_tensors,
              kimi::format_bytes(r.tensor_bytes).c_str(), kimi::convert::outtype_name(r.outtype),
              static_cast<unsigned>(r.ftype), r.seconds,
              kimi::format_bytes(static_cast<uint64_t>(r.seconds > 0 ? r.tensor_bytes / r.seconds : 0)).c_str(),
              r.n_metadata);
  if (r.vision_path.empty())
    std::printf("dropped %zu %s tensors (%s)\n", r.n_dropped, r.dropped_what.c_str(),
                kimi::format_bytes(r.dropped_bytes).c_str());
  for (auto& p : r.outputs) std::printf("wrote %s\n", p.c_str());
  if (!r.vision_path.empty())
    std::printf("wrote %s (vision tower + projector: %zu tensors, %s)\n", r.vision_path.c_str(), r.n_vision,
                kimi::format_bytes(r.vision_bytes).c_str());
  return 0;
}

kimi::app::Registrar reg_convert("convert", "convert a Hugging Face Kimi-K3/K3.1 checkpoint to GGUF", cmd_convert);

}  // namespace
