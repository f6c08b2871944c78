// Perplexity and KL-divergence scoring (the library part of `kimi perplexity`; docs/perplexity.md).
//
// The standard chunked method (as llama.cpp's perplexity tool): the token stream is cut into
// n_chunk = min(n_tokens / n_ctx, max_chunks) chunks of n_ctx tokens; each chunk is evaluated from an
// empty sequence and the second half is scored: for i in [first, n_ctx - 2], with first = n_ctx / 2,
// NLL_i = -log softmax(logits_i)[token_{i+1}]. PPL = exp(mean NLL); its error is
// PPL * sqrt(var(NLL) / (count - 1)) (the population variance of the per-token NLL).
//
//   kimi::Context ctx(model, opts);                 // n_ctx_max >= n_ctx, n_seq_max >= 1
//   kimi::ppl::Options o{.n_ctx = 512};
//   auto r = kimi::ppl::evaluate(ctx, tokens, o, [](const kimi::ppl::ChunkReport& c) { ... });
//   fmt::print("PPL = {:.4f} +/- {:.4f}\n", r.stats.ppl(), r.stats.ppl_err());
//
// KL divergence: a base run writes, for every scored token, the log-softmax of its top-N tokens, the
// log of the remaining probability mass and the log-prob of the actual next token (KldBase file,
// format below); a later run (another model, precision, top-k...) over the same tokens compares its
// full distribution against it. KL(base || model) is computed over the N+1 outcomes {top-N tokens
// of the base, everything else}: sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest).
// That is the exact KL of the two distributions coarsened to those outcomes (a lower bound of the
// full-vocabulary KL, equal to it when the rest mass is zero) and exactly 0 for identical logits.
//
// KLD base file (little-endian, see docs/perplexity.md):
//   "KIMIKLD\x01"  u32 version(=1)  u32 n_ctx  u32 n_chunk  u32 n_vocab  u32 top_n  u32 first
//   i32 bos_replaced (-1: none; else the id that replaced each chunk's first token)  u32 reserved(=0)
//   i32 tokens[n_chunk * n_ctx]                      (the evaluated tokens, chunk after chunk)
//   per scored token (n_chunk * (n_ctx - 1 - first), in order):
//     f32 logp_target  f32 log_rest  { i32 id, f32 logp } x top_n   (top-N by logit, ties -> lower id)
//   per chunk: f64 nll_sum  f64 nll2_sum             (so the base PPL over any prefix is exact)
//   f64 ppl  f64 ppl_err  u64 n_scored  u64 fnv1a64(all bytes before it)  "KLDEND\0\0"
// Nothing about the model or engine settings is stored, so two runs with identical logits write
// byte-identical files.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/context.h"

namespace kimi::ppl {

struct Options {
  int n_ctx = 512;           // tokens per chunk (the context of every evaluation)
  int max_chunks = -1;       // -1: all full chunks of the text
  int32_t bos_id = -1;       // >= 0: the first token of every chunk is replaced by it (add_bos models)
  int top_n = 32;            // tokens per scored position kept in a KLD base file
};

// Per-token NLL accumulator (llama.cpp's formulas).
struct Stats {
  double nll_sum = 0, nll2_sum = 0;
  int64_t count = 0;
  void add(double nll) {
    nll_sum += nll;
    nll2_sum += nll * nll;
    ++count;
  }
  double mean() const { return count ? nll_sum / static_cast<double>(count) : 0.0; }
  double ppl() const;
  double ppl_err() const;  // 0 when count < 2
};

// Mean/stderr of a per-token series and its percentiles (for KLD).
struct KldSummary {
  int64_t count = 0;
  double kld_mean = 0, kld_err = 0;
  double kld_median = 0, kld_p90 = 0, kld_p95 = 0, kld_p99 = 0, kld_max = 0, kld_min = 0;
  double top1_agree = 0, top1_err = 0;      // fraction of positions with the same argmax
  double base_ppl = 0, base_ppl_err = 0;    // base over the compared chunks (exact, from the file)
  double ppl = 0, ppl_err = 0;              // this run
  double delta_ppl = 0;                     // ppl - base_ppl
  double ppl_ratio = 0;                     // ppl / base_ppl
  double dp_mean = 0, dp_rms = 0;           // p(target) - p_base(target)
  int n_chunk_file = 0;                     // chunks in the base file (compared may be fewer)
};

// Percentile of sorted values with linear interpolation between ranks (q in [0, 1]).
double percentile_sorted(const std::vector<double>& sorted, double q);

// A loaded (validated) KLD base file.
class KldBase {
 public:
  // Reads and validates everything (magic, version, sizes, checksum, ids < n_vocab, finite values).
  // Throws kimi::Error naming the path and what is wrong.
  static KldBase load(const std::string& path);

  int n_ctx() const { return n_ctx_; }
  int n_chunk() const { return n_chunk_; }
  int n_vocab() const { return n_vocab_; }
  int top_n() const { return top_n_; }
  int first() const { return first_; }
  int32_t bos_replaced() const { return bos_; }
  double ppl() const { return ppl_; }
  double ppl_err() const { return ppl_err_; }
  const std::string& path() const { return path_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // n_chunk * n_ctx
  int scored_per_chunk() const { return n_ctx_ - 1 - first_; }
  // scored token j (0-based over the whole file)
  float logp_target(int64_t j) const { return rec_f32(j, 0); }
  float log_rest(int64_t j) const { return rec_f32(j, 1); }
  int32_t top_id(int64_t j, int k) const;
  float top_logp(int64_t j, int k) const { return rec_f32(j, 3 + 2 * k); }
  double chunk_nll_sum(int c) const { return chunk_stats_[2 * static_cast<size_t>(c)]; }
  double chunk_nll2_sum(int c) const { return chunk_stats_[2 * static_cast<size_t>(c) + 1]; }
  size_t record_words() const { return 2 + 2 * static_cast<size_t>(top_n_); }

 private:
  float rec_f32(int64_t j, size_t w) const;
  std::string path_;
  int n_ctx_ = 0, n_chunk_ = 0, n_vocab_ = 0, top_n_ = 0, first_ = 0;
  int32_t bos_ = -1;
  double ppl_ = 0, ppl_err_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<uint32_t> records_;  // raw 32-bit words of the per-token records
  std::vector<double> chunk_stats_;
};

// Progress of evaluate(), called after every chunk.
struct ChunkReport {
  int chunk = 0;            // 1-based
  int n_chunk = 0;
  double chunk_ppl = 0;     // this chunk alone
  double ppl = 0;           // running (all chunks so far)
  double ppl_err = 0;
  double seconds = 0;       // this chunk's evaluation time
  // KLD mode (compare against a base): running values
  bool has_kld = false;
  double kld_mean = 0;
  double top1_agree = 0;
  double base_ppl = 0;      // base's running PPL over the same chunks
};

// One scored token of a KLD comparison (kept in Result::per_token, written by --kld-per-token).
struct TokenKld {
  int chunk = 0;        // 0-based chunk
  int pos = 0;          // position of the scored logits in the chunk (they predict position pos + 1)
  int32_t next = 0;     // the token scored (the chunk's token at pos + 1)
  double kld = 0;       // KL(base || this run) as in KldSummary
  int same_top1 = 0;    // 1 when this run's argmax is the base's top-1
  double nll = 0;       // -log p(next) of this run
};

struct Result {
  int n_ctx = 0, n_chunk = 0;
  int64_t n_tokens = 0;               // tokens of the input stream
  Stats stats;                        // all scored tokens
  std::vector<double> running_ppl;    // after each chunk
  std::vector<double> chunk_ppl;      // each chunk alone
  double seconds = 0;                 // total evaluation time
  std::optional<KldSummary> kld;      // when compared against a base
  std::vector<TokenKld> per_token;    // when compared against a base: every scored token, in order
};

// Per-token file (`kimi perplexity --kl-divergence BASE --kld-per-token FILE`, docs/quantize.md):
// tab-separated text,
//   # kimi kld-per-token 1
//   # base <path of the KLD base>
//   # n_ctx <n> first <first scored position> n_chunk <n> count <scored tokens>
//   chunk  pos  next  kld  same_top1  nll        (column names)
//   one row per scored token in order; kld and nll with 17 significant digits (exact doubles).
void write_per_token(const std::string& path, const std::string& base_path, int n_ctx,
                     const std::vector<TokenKld>& rows);
struct PerTokenFile {
  std::string path, base;
  int n_ctx = 0, first = 0, n_chunk = 0;
  std::vector<TokenKld> rows;
};
// Reads and validates a per-token file; kimi::Error naming the path and line otherwise.
PerTokenFile read_per_token(const std::string& path);

// Paired comparison of two runs against the same base on the same tokens (a = this run, b = the other):
// for each series x (KLD, same-top-1 as 0/1, NLL) the per-token differences d_i = x_a,i - x_b,i.
//   diff = mean(d); se_token = sd(d) / sqrt(n) (sample sd, n - 1), which takes the tokens as independent;
//   se_chunk = sd(D_c) / sqrt(C) over the C per-chunk means D_c (all chunks have the same count), which
//   allows any correlation between the tokens of one chunk (they share a context) and is the one to quote;
//   rel = diff / mean_b. Both runs' errors are measured on the same tokens, so what is common to the
//   tokens (how hard each one is) cancels in d_i, unlike two separate means +/- their own errors.
struct PairedDiff {
  double mean_a = 0, mean_b = 0, diff = 0, se_token = 0, se_chunk = 0, rel = 0;
};
struct PairedComparison {
  int64_t count = 0;
  int n_chunk = 0;
  PairedDiff kld, top1, nll;
};
// Throws kimi::Error when the rows do not pair (count, chunk, position and token must match);
// `what_b` names b in the message. se_chunk is 0 with a single chunk.
PairedComparison paired_compare(const std::vector<TokenKld>& a, const std::vector<TokenKld>& b,
                                const std::string& what_b);

// Number of chunks evaluate() will use, or a kimi::Error naming the token count needed
// (at least 2 * n_ctx tokens, as llama.cpp requires). `what` names the input in the message.
int plan_chunks(int64_t n_tokens, const Options& opt, const std::string& what);

// Runs the chunked evaluation on sequence 0 of `ctx` (cleared before every chunk).
// base_out: path of a KLD base file to write (temp file + rename; removed on error).
// compare: a base to compare against; then `tokens` must equal the base's tokens of the evaluated
// chunks and opt.n_ctx / top_n / bos must match the file (kimi::Error otherwise).
Result evaluate(Context& ctx, const std::vector<int32_t>& tokens, const Options& opt,
                const std::function<void(const ChunkReport&)>& on_chunk = {}, const std::string& base_out = "",
                const KldBase* compare = nullptr);

// Scoring helpers (exposed for tests and other tools).
// log-sum-exp of logits[0..n) in double (max-shifted).
double log_sum_exp(const float* logits, int n);
// log-softmax of one token: logits[id] - log_sum_exp
inline double log_prob(const float* logits, int n, int32_t id, double lse) {
  return static_cast<double>(logits[id]) - lse;
}

}  // namespace kimi::ppl
