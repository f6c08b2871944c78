// Names in the MoonViT3D projector GGUF (docs/spec/vision.md §2.2): written by `kimi convert`
// (src/convert/vision_convert.cpp), read by the tower (src/model/vision.cpp), checked by verify.
#pragma once
#include <cstdint>
#include <string>

namespace kimi::moonvit {

inline constexpr const char* kArch = "moonvit3d";
inline std::string key(const char* k) { return std::string(kArch) + "." + k; }

// moonvit3d.* keys (all UINT32 unless said otherwise)
inline constexpr const char* kPatchSize = "patch_size";
inline constexpr const char* kWidth = "embedding_length";
inline constexpr const char* kQkv = "qkv_length";
inline constexpr const char* kHeads = "head_count";
inline constexpr const char* kFf = "feed_forward_length";
inline constexpr const char* kBlocks = "block_count";
inline constexpr const char* kGridH = "pos_grid_height";
inline constexpr const char* kGridW = "pos_grid_width";
inline constexpr const char* kMerge = "merge_kernel";
inline constexpr const char* kEps = "norm_epsilon";                  // FLOAT32
inline constexpr const char* kProjEps = "projector.norm_epsilon";    // FLOAT32
inline constexpr const char* kTextHidden = "projector.output_length";
inline constexpr const char* kPlaceholder = "media_placeholder_token_id";
inline constexpr const char* kPatchLimit = "image.patch_limit";
inline constexpr const char* kSidePatchLimit = "image.side_patch_limit";

// tensors
inline constexpr const char* kPatchEmbd = "v.patch_embd.weight";
inline constexpr const char* kPosEmbd = "v.pos_embd.weight";
inline constexpr const char* kPostNorm = "v.post_norm.weight";
inline constexpr const char* kMm1 = "mm.1.weight";
inline constexpr const char* kMm2 = "mm.2.weight";
inline constexpr const char* kMmNorm = "mm.post_norm.weight";
inline std::string blk(int64_t b, const char* t) { return "v.blk." + std::to_string(b) + "." + t; }
// per block: "ln1.weight", "attn_qkv.weight", "attn_out.weight", "ln2.weight", "ffn_up.weight", "ffn_down.weight"

// K3's fixed values (docs/spec/vision.md §1.1, §1.2, §3.1)
inline constexpr float kTowerEps = 0.0078125f;  // 2^-7
inline constexpr int64_t kPatchLimitK3 = 65536;
inline constexpr int64_t kSidePatchLimitK3 = 512;

}  // namespace kimi::moonvit
