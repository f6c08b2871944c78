// Independent float64 reference forward pass of Kimi-K3 / K3.1, written from the spec
// (k3-architecture.md §1 and §3, dsa-indexer.md §1.2, spec/README.md decisions 3-4,
// formats-quant.md §3). It reads the HUGGING FACE checkpoint directly (config.json + safetensors),
// never the GGUF, so comparing the engine against it checks converter and engine together.
//
// Shares no code with the engine: own BF16/F16/E2M1 decoding, own loops, double everywhere.
// Links only kimi_io (safetensors reader, HfConfig).
//
//   auto ref = kimi::ref::RefModel::load(hf_dir);
//   auto logits = ref.forward(tokens);            // [T][vocab], every position
//   auto fast = ref.forward(tokens, {.emulate_fast = true});
//
// Trap switches (RefOptions::trap) each implement ONE plausible mistake (k3-architecture.md §5) so
// tests can prove they have the power to see it. See docs/testing.md.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kimi::st {
class Checkpoint;
}

namespace kimi::ref {

enum class Trap {
  None = 0,
  // layer schedule (trap 1)
  ZeroIndexedFullAttn,   // full_attn_layers read as 0-based
  // residual attention (traps 2-3)
  BankMixedH,            // bank the mixed h instead of the raw P
  BankBeforeMix,         // bank P before the attention-side mix (the mix then sees P twice)
  NoRestart,             // P = P + a on bank layers
  EmbedInStream,         // standard residual at layer 0: P = x0 + a
  CurrentFirstInSoftmax, // weights computed with the current stream first, applied as if last
  ResSumNormalized,      // sum the normalized candidates instead of the raw ones
  NoFinalMix,            // logits from RMSNorm(stream), no final ResMix
  ResScoreNormOnly,      // score vector = res_norm.weight only
  ResScoreProjOnly,      // score vector = res_proj.weight only
  // KDA (traps 4-9, 16)
  ALogReshape,           // head h takes A_log[h * (stored / heads)] instead of A_log[h]
  GateAsClamp,           // g = max(lb, -exp(A_log) softplus(a)) instead of lb * sigmoid(exp(A_log) a)
  SsmAWrongSign,         // lb * sigmoid(-exp(A_log) a)
  DeltaOrderWrong,       // predict with the undecayed state
  ReadBeforeUpdate,      // read out with the decayed state before the update
  RmsInsteadOfL2,        // q/k RMS-normalized instead of l2-normalized
  ConvTapReversed,       // tap 0 multiplies the current token
  ConvLayoutTransposed,  // conv weight [C,1,K] read as [K, C] (converter-side reshape mistake)
  KdaNoConvSilu,         // no SiLU after the short conv
  KdaGateSilu,           // output gate SiLU instead of sigmoid
  KdaNoQueryScale,       // no 1/sqrt(D) on the read-out
  // MLA (traps 10-12, 16)
  MlaNoPe,               // drop q_pe . k_pe
  MlaScale128,           // softmax scale 1/sqrt(qk_nope) instead of 1/sqrt(nope + rope)
  MlaGateUnnormed,       // output gate reads the un-normed mixed input h
  GProjMixup,            // converter named the MLA g_proj ssm_g: MLA layers lose their output gate
  KvbSplitBlocked,       // kv_b split as [all heads' K | all heads' V] instead of per head
  KvbKVSwapped,          // per head: first v rows taken as V, next nope rows as K
  // MoE (traps 13-15)
  RouterBiasInWeights,   // expert weight = sigmoid + selection bias
  RouterBiasIgnored,     // choose experts without the correction bias
  RouterSoftmax,         // softmax gating instead of sigmoid
  RoutedNormBeforeSum,   // routed RMSNorm applied to each expert output before the weighted sum
  NoRenormalize,         // expert weights not renormalized
  SwiGLUInsteadOfSiTU,   // silu(g) * u
  SwapGateUp,            // situ(u, g)
  SituNoUpTanh,          // up branch without lambda * tanh(u / lambda)
  MxfpNibbleOrder,       // ggml nibble order applied to the compressed-tensors bytes
  MxfpHalfScale,         // E2M1 values with ggml's halved scale 2^(e-128)
  // DSA indexer (decision 3)
  IndexerTieLater,       // ties: the later position wins
  IndexerNoRelu,         // no ReLU on q_h . k_s
  IndexerRmsNormK,       // RMSNorm (no mean, no bias) instead of LayerNorm on k
  IndexerQUnnormed,      // q from the q_a_proj output before q_a_layernorm
  IndexerNoCausalMask,   // top-k over all positions, future ones masked afterwards
  IndexerNoWeightScale,  // weights_proj output not scaled by 1/sqrt(H_I D_I)
  // epsilons (trap 19)
  EpsHfReference,        // HF model's 1e-6 for the MLA q_a/kv_a norms and the KDA l2 norm
  Count_
};
const char* trap_name(Trap t);
std::vector<Trap> all_traps();  // every trap except None
// False for the traps that cannot change the logits by more than rounding-level amounts, by
// construction of the model (docs/testing.md says why): NoRenormalize (a common factor removed by
// the routed RMSNorm), IndexerNoWeightScale (top-k is invariant to a positive scale),
// EpsHfReference (1e-5 vs 1e-6 next to mean squares of order 1).
bool trap_observable(Trap t);

struct RefOptions {
  int attn_top_k = -1;        // -1: config index_topk (0 if absent); 0: no indexer; >0: override
  bool emulate_fast = false;  // round like the engine's Precision::Fast: bf16 before BF16 matmuls,
                              // Q8_0 blocks before MXFP4 matmuls, f16 MLA/indexer caches
  Trap trap = Trap::None;
};

// Hyper-parameters read from config.json (text_config merged into the root).
struct RefConfig {
  int64_t n_layer = 0, d = 0, vocab = 0, n_head = 0;
  double eps = 1e-5;
  double situ_beta = 4.0, situ_lambda = 25.0;
  int64_t block_size = 0;                       // attn_res_block_size (0: plain residual)
  std::vector<int64_t> full_attn_1based;        // as stored
  // MLA
  int64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, vdim = 0;
  // KDA
  int64_t kda_dim = 0, conv_k = 0;
  bool has_gate_lb = false;
  double gate_lb = 0.0;
  // FFN / MoE
  int64_t first_dense = 0, dense_width = 0;
  int64_t n_expert = 0, n_used = 0, n_shared = 0, moe_width = 0, latent = 0;
  double routed_scale = 1.0;
  bool renorm = true;
  bool sigmoid_gating = true;
  bool experts_packed = false;                  // compressed-tensors mxfp4-pack-quantized
  bool tie_embeddings = false;
  // indexer
  int64_t idx_heads = 0, idx_dim = 0, idx_topk = 0;
};

// ---- building blocks, exposed for the self-checks (all double) ----
double bf16_bits_to_double(uint16_t h);
double f16_bits_to_double(uint16_t h);
double round_to_bf16(double x);  // via f32, round to nearest even
double round_to_f16(double x);   // via f32, round to nearest even
// Q8_0 round trip of n values (n multiple of 32): per block d = f16(max|x| / 127), q = round(x / d)
void round_q8_0(double* x, int64_t n);
double e2m1_value(int code);     // OCP E2M1 code (0..15) -> value
// Decodes one row of compressed-tensors MXFP4: packed[n/2], scales[n/32] -> out[n].
// ggml_order=true decodes with ggml's nibble order instead (the MxfpNibbleOrder trap).
void mxfp4_decode_row(const uint8_t* packed, const uint8_t* scales, int64_t n, double* out,
                      bool ggml_order = false, bool half_scale = false);
double situ(double g, double u, double beta, double lambda);
// ResMix (k3-architecture §3.1): bank entries b_k, current c, fused score vector w.
std::vector<double> res_mix(const std::vector<const std::vector<double>*>& bank, const std::vector<double>& cur,
                            const std::vector<double>& w, double eps, Trap trap = Trap::None);
// KDA delta-rule recurrence for one head over T tokens (k3-architecture.md §3.3 step 7), inputs already normalized:
// q,k,v: [T][D]; g: [T][D] log-decay per key channel; beta: [T]; returns o [T][D] (scaled 1/sqrt(D)).
std::vector<std::vector<double>> kda_recurrence(const std::vector<std::vector<double>>& q,
                                                const std::vector<std::vector<double>>& k,
                                                const std::vector<std::vector<double>>& v,
                                                const std::vector<std::vector<double>>& g,
                                                const std::vector<double>& beta, Trap trap = Trap::None);
// Indexer score (dsa-indexer §1.2 / decision 3) of one query against one key:
// sum_h w[h] * ReLU(q[h*D + i] . k[i]).
double indexer_score(const std::vector<double>& q, const std::vector<double>& w, const std::vector<double>& k,
                     int64_t n_heads, int64_t dim, Trap trap = Trap::None);
// Top-k positions (returned ascending) of scores[0..n); ties -> earlier position wins (unless trap).
// k >= n selects everything.
std::vector<int64_t> select_top_k(const std::vector<double>& scores, int64_t k, Trap trap = Trap::None);

class RefModel {
 public:
  static RefModel load(const std::string& hf_dir);
  RefModel(RefModel&&) noexcept;
  RefModel& operator=(RefModel&&) noexcept;
  ~RefModel();

  const RefConfig& config() const { return cfg_; }
  // Logits [T][vocab] for every position of one sequence starting at position 0.
  std::vector<std::vector<double>> forward(const std::vector<int32_t>& tokens, const RefOptions& opts = {}) const;

  struct Impl;

 private:
  RefModel() = default;
  RefConfig cfg_;
  std::unique_ptr<Impl> impl_;
};

// Largest |a - b| over all entries / largest |b| (relative to the reference scale).
double max_rel_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b);

}  // namespace kimi::ref
