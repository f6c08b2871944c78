// Chunked perplexity, KLD base files and the KL-divergence comparison (see perplexity.h).
#include "runtime/perplexity.h"

#include <algorithm>
#include <bit>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "util/error.h"
#include "util/tempfile.h"

namespace kimi::ppl {

static_assert(std::endian::native == std::endian::little, "KLD base files are little-endian");

namespace {

constexpr char kMagic[8] = {'K', 'I', 'M', 'I', 'K', 'L', 'D', '\x01'};
constexpr char kEndMagic[8] = {'K', 'L', 'D', 'E', 'N', 'D', '\0', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 40;
constexpr size_t kTrailerBytes = 40;  // ppl, ppl_err, n_scored, checksum, end magic

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= kFnvPrime;
  }
  return h;
}

// Writes a file through a temp name; the destructor removes the temp unless commit() succeeded.
class FileWriter {
 public:
  explicit FileWriter(std::string path) : path_(std::move(path)) {
    const TempFile t = create_temp_file(path_);  // unique name, removed on SIGINT/SIGTERM/SIGHUP
    tmp_ = t.path;
    f_ = ::fdopen(t.fd, "wb");
    if (!f_) {
      const int e = errno;
      ::close(t.fd);
      discard_temp(tmp_);
      fail("{}: cannot open for writing ({})", tmp_, std::strerror(e));
    }
  }
  ~FileWriter() {
    if (f_) std::fclose(f_);
    if (!committed_) discard_temp(tmp_);
  }
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* p, size_t n) {
    if (n == 0) return;
    check(std::fwrite(p, 1, n, f_) == n, "{}: write failed ({})", tmp_, std::strerror(errno));
    hash_ = fnv1a(hash_, p, n);
  }
  template <typename T>
  void put(const T& v) {
    write(&v, sizeof(T));
  }
  uint64_t hash() const { return hash_; }
  void commit() {
    const int rc = std::fclose(f_);
    f_ = nullptr;
    check(rc == 0, "{}: write failed ({})", tmp_, std::strerror(errno));
    commit_temp(tmp_, path_);
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  uint64_t hash_ = kFnvOffset;
  bool committed_ = false;
};

template <typename T>
T get_at(const std::vector<uint8_t>& d, size_t off) {
  T v;
  std::memcpy(&v, d.data() + off, sizeof(T));
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double Stats::ppl() const { return std::exp(mean()); }

double Stats::ppl_err() const {
  if (count < 2) return 0.0;
  const double n = static_cast<double>(count);
  const double m = nll_sum / n;
  const double var = nll2_sum / n - m * m;
  return var > 0 ? ppl() * std::sqrt(var / (n - 1)) : 0.0;
}

double percentile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return 0.0;
  const double r = std::clamp(q, 0.0, 1.0) * static_cast<double>(s.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(r));
  const size_t hi = std::min(lo + 1, s.size() - 1);
  const double f = r - static_cast<double>(lo);
  return s[lo] + (s[hi] - s[lo]) * f;
}

double log_sum_exp(const float* logits, int n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) m = std::max(m, logits[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - m);
  return static_cast<double>(m) + std::log(s);
}

int plan_chunks(int64_t n_tokens, const Options& opt, const std::string& what) {
  check(opt.n_ctx >= 4, "perplexity: context size must be at least 4 tokens (got {})", opt.n_ctx);
  check(opt.max_chunks == -1 || opt.max_chunks >= 1, "perplexity: --chunks must be >= 1 (got {})", opt.max_chunks);
  check(opt.top_n >= 1 && opt.top_n <= 65536, "perplexity: top-N must be in [1, 65536] (got {})", opt.top_n);
  const int64_t need = 2 * static_cast<int64_t>(opt.n_ctx);
  check(n_tokens >= need,
        "{}: {} tokens, but perplexity with a context of {} needs at least {} tokens (2 x ctx); use a longer text "
        "or a smaller -c",
        what, n_tokens, opt.n_ctx, need);
  int64_t n = n_tokens / opt.n_ctx;
  if (opt.max_chunks > 0) n = std::min<int64_t>(n, opt.max_chunks);
  check(n <= std::numeric_limits<int>::max(), "{}: too many chunks ({})", what, n);
  return static_cast<int>(n);
}

// ---------------------------------------------------------------------------------------------
// KldBase

int32_t KldBase::top_id(int64_t j, int k) const {
  int32_t v;
  std::memcpy(&v, &records_[static_cast<size_t>(j) * record_words() + 2 + 2 * static_cast<size_t>(k)], 4);
  return v;
}

float KldBase::rec_f32(int64_t j, size_t w) const {
  float v;
  std::memcpy(&v, &records_[static_cast<size_t>(j) * record_words() + w], 4);
  return v;
}

KldBase KldBase::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(static_cast<bool>(f), "{}: cannot open KLD base file", path);
  std::vector<uint8_t> d((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  check(!f.bad(), "{}: read error", path);
  check(d.size() >= kHeaderBytes + kTrailerBytes,
        "{}: {} bytes, too small to be a KLD base file (written by kimi perplexity --kl-divergence-base)", path,
        d.size());
  check(std::memcmp(d.data(), kMagic, 8) == 0,
        "{}: not a KLD base file (bad magic; expected one written by kimi perplexity --kl-divergence-base)", path);
  const uint32_t version = get_at<uint32_t>(d, 8);
  check(version == kVersion, "{}: KLD base file version {} is not supported (expected {})", path, version, kVersion);
  KldBase b;
  b.path_ = path;
  const uint32_t n_ctx = get_at<uint32_t>(d, 12), n_chunk = get_at<uint32_t>(d, 16), n_vocab = get_at<uint32_t>(d, 20),
                 top_n = get_at<uint32_t>(d, 24), first = get_at<uint32_t>(d, 28), reserved = get_at<uint32_t>(d, 36);
  const int32_t bos = get_at<int32_t>(d, 32);
  check(n_ctx >= 4 && n_ctx <= (1u << 24), "{}: header: n_ctx {} out of range [4, 2^24] (corrupt file)", path, n_ctx);
  check(n_chunk >= 1 && n_chunk <= (1u << 24), "{}: header: n_chunk {} out of range [1, 2^24] (corrupt file)", path,
        n_chunk);
  check(n_vocab >= 1 && n_vocab <= (1u << 28), "{}: header: n_vocab {} out of range (corrupt file)", path, n_vocab);
  check(top_n >= 1 && top_n <= std::min<uint32_t>(n_vocab, 65536),
        "{}: header: top_n {} out of range [1, min(n_vocab {}, 65536)] (corrupt file)", path, top_n, n_vocab);
  check(first == n_ctx / 2, "{}: header: first scored position {} != n_ctx/2 = {} (corrupt file)", path, first,
        n_ctx / 2);
  check(bos >= -1 && bos < static_cast<int64_t>(n_vocab), "{}: header: bos id {} out of range (corrupt file)", path,
        bos);
  check(reserved == 0, "{}: header: reserved field is {} (expected 0; corrupt file)", path, reserved);
  b.n_ctx_ = static_cast<int>(n_ctx);
  b.n_chunk_ = static_cast<int>(n_chunk);
  b.n_vocab_ = static_cast<int>(n_vocab);
  b.top_n_ = static_cast<int>(top_n);
  b.first_ = static_cast<int>(first);
  b.bos_ = bos;

  const uint64_t n_tok = uint64_t(n_chunk) * n_ctx;
  const uint64_t n_scored = uint64_t(n_chunk) * (n_ctx - 1 - first);
  const uint64_t rec_bytes = 4 * b.record_words();
  const uint64_t expect = kHeaderBytes + 4 * n_tok + n_scored * rec_bytes + 16ull * n_chunk + kTrailerBytes;
  check(d.size() == expect,
        "{}: {} bytes, expected {} for n_ctx {}, {} chunks, top-{} (truncated or corrupt KLD base file)", path,
        d.size(), expect, n_ctx, n_chunk, top_n);
  const size_t body = d.size() - kTrailerBytes;
  check(std::memcmp(d.data() + d.size() - 8, kEndMagic, 8) == 0, "{}: bad end marker (truncated or corrupt file)",
        path);
  const uint64_t stored_hash = get_at<uint64_t>(d, body + 24);
  const uint64_t hash = fnv1a(kFnvOffset, d.data(), body + 24);
  check(hash == stored_hash, "{}: checksum mismatch (stored {:016x}, computed {:016x}): the file is corrupt", path,
        stored_hash, hash);
  b.ppl_ = get_at<double>(d, body);
  b.ppl_err_ = get_at<double>(d, body + 8);
  const uint64_t stored_scored = get_at<uint64_t>(d, body + 16);
  check(stored_scored == n_scored, "{}: trailer: {} scored tokens, expected {} (corrupt file)", path, stored_scored,
        n_scored);
  check(std::isfinite(b.ppl_) && b.ppl_ >= 1.0, "{}: trailer: PPL {} is not a valid perplexity (corrupt file)", path,
        b.ppl_);

  size_t off = kHeaderBytes;
  b.tokens_.resize(n_tok);
  std::memcpy(b.tokens_.data(), d.data() + off, 4 * n_tok);
  off += 4 * n_tok;
  for (uint64_t i = 0; i < n_tok; ++i)
    check(b.tokens_[i] >= 0 && b.tokens_[i] < static_cast<int32_t>(n_vocab),
          "{}: token {} (chunk {}, position {}) is {}, outside the vocabulary [0, {}) (corrupt file)", path, i,
          i / n_ctx + 1, i % n_ctx, b.tokens_[i], n_vocab);
  b.records_.resize(n_scored * b.record_words());
  std::memcpy(b.records_.data(), d.data() + off, n_scored * rec_bytes);
  off += n_scored * rec_bytes;
  for (uint64_t j = 0; j < n_scored; ++j) {
    const float lt = b.logp_target(j), lr = b.log_rest(j);
    check(std::isfinite(lt) && lt <= 0.0f, "{}: scored token {}: log-prob {} is not a finite value <= 0 (corrupt file)",
          path, j, lt);
    check(!std::isnan(lr) && lr <= 0.0f, "{}: scored token {}: rest log-mass {} is not <= 0 (corrupt file)", path, j,
          lr);
    for (int k = 0; k < b.top_n_; ++k) {
      const int32_t id = b.top_id(j, k);
      const float lp = b.top_logp(j, k);
      check(id >= 0 && id < static_cast<int32_t>(n_vocab),
            "{}: scored token {}: top-{} id {} outside the vocabulary (corrupt file)", path, j, k + 1, id);
      check(std::isfinite(lp) && lp <= 0.0f, "{}: scored token {}: top-{} log-prob {} invalid (corrupt file)", path, j,
            k + 1, lp);
    }
  }
  b.chunk_stats_.resize(2 * static_cast<size_t>(n_chunk));
  std::memcpy(b.chunk_stats_.data(), d.data() + off, 16ull * n_chunk);
  for (uint32_t c = 0; c < n_chunk; ++c)
    check(std::isfinite(b.chunk_nll_sum(c)) && b.chunk_nll_sum(c) >= 0 && std::isfinite(b.chunk_nll2_sum(c)),
          "{}: chunk {}: NLL sums invalid (corrupt file)", path, c + 1);
  return b;
}

// ---------------------------------------------------------------------------------------------
// evaluate

Result evaluate(Context& ctx, const std::vector<int32_t>& tokens, const Options& opt,
                const std::function<void(const ChunkReport&)>& on_chunk, const std::string& base_out,
                const KldBase* cmp) {
  const int n_chunk = plan_chunks(static_cast<int64_t>(tokens.size()), opt, "perplexity input");
  const int n_ctx = opt.n_ctx;
  const int first = n_ctx / 2;
  const int per_chunk = n_ctx - 1 - first;
  const int V = ctx.n_vocab();
  check(ctx.options().n_ctx_max >= n_ctx, "perplexity: the context holds {} positions, the chunk size is {}",
        ctx.options().n_ctx_max, n_ctx);
  check(opt.bos_id < V, "perplexity: BOS id {} outside the vocabulary ({})", opt.bos_id, V);
  const int top_n = std::min(opt.top_n, V);

  if (cmp) {
    check(cmp->n_ctx() == n_ctx, "{}: the KLD base was made with a context of {} tokens, this run uses {}",
          cmp->path(), cmp->n_ctx(), n_ctx);
    check(cmp->n_vocab() == V, "{}: the KLD base has a vocabulary of {}, the model has {}", cmp->path(),
          cmp->n_vocab(), V);
    check(cmp->bos_replaced() == opt.bos_id,
          "{}: the KLD base replaced each chunk's first token by {}, this run by {} (-1 = none)", cmp->path(),
          cmp->bos_replaced(), opt.bos_id);
    check(n_chunk <= cmp->n_chunk(), "{}: the KLD base has {} chunks, this run evaluates {}", cmp->path(),
          cmp->n_chunk(), n_chunk);
  }

  std::optional<FileWriter> w;
  if (!base_out.empty()) {
    w.emplace(base_out);
    w->write(kMagic, 8);
    w->put<uint32_t>(kVersion);
    w->put<uint32_t>(static_cast<uint32_t>(n_ctx));
    w->put<uint32_t>(static_cast<uint32_t>(n_chunk));
    w->put<uint32_t>(static_cast<uint32_t>(V));
    w->put<uint32_t>(static_cast<uint32_t>(top_n));
    w->put<uint32_t>(static_cast<uint32_t>(first));
    w->put<int32_t>(opt.bos_id);
    w->put<uint32_t>(0);
  }

  // the evaluated tokens of every chunk (BOS replacement applied)
  std::vector<int32_t> chunk_toks(static_cast<size_t>(n_chunk) * n_ctx);
  for (int c = 0; c < n_chunk; ++c) {
    std::copy_n(tokens.begin() + static_cast<int64_t>(c) * n_ctx, n_ctx, chunk_toks.begin() + int64_t(c) * n_ctx);
    if (opt.bos_id >= 0) chunk_toks[static_cast<size_t>(c) * n_ctx] = opt.bos_id;
  }
  for (size_t i = 0; i < chunk_toks.size(); ++i)
    check(chunk_toks[i] >= 0 && chunk_toks[i] < V, "perplexity input: token {} is {}, outside the vocabulary [0, {})",
          i, chunk_toks[i], V);
  if (cmp) {
    for (size_t i = 0; i < chunk_toks.size(); ++i)
      check(chunk_toks[i] == cmp->tokens()[i],
            "{}: token {} (chunk {}, position {}) is {} in the KLD base but {} in this run: the base was made from "
            "a different text or tokenizer",
            cmp->path(), i, i / n_ctx + 1, i % n_ctx, cmp->tokens()[i], chunk_toks[i]);
  }
  if (w) w->write(chunk_toks.data(), chunk_toks.size() * 4);

  // scratch (allocated once)
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::vector<uint8_t> in_top(static_cast<size_t>(V), 0);
  std::vector<uint32_t> rec(2 + 2 * static_cast<size_t>(top_n));
  std::vector<double> chunk_stats;
  chunk_stats.reserve(2 * static_cast<size_t>(n_chunk));
  std::vector<double> klds;
  if (cmp) klds.reserve(static_cast<size_t>(n_chunk) * per_chunk);
  double kld_sum = 0, kld2_sum = 0, dp_sum = 0, dp2_sum = 0;
  int64_t top1_same = 0;
  Stats base_stats;

  Result r;
  r.n_ctx = n_ctx;
  r.n_chunk = n_chunk;
  r.n_tokens = static_cast<int64_t>(tokens.size());
  if (cmp) r.per_token.reserve(static_cast<size_t>(n_chunk) * per_chunk);
  const auto t_all = std::chrono::steady_clock::now();
  Batch b;
  b.entries.reserve(static_cast<size_t>(n_ctx));
  int64_t j_global = 0;  // scored token index over the whole run

  for (int c = 0; c < n_chunk; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t* ct = chunk_toks.data() + static_cast<size_t>(c) * n_ctx;
    b.clear();
    for (int i = 0; i < n_ctx; ++i) b.add(ct[i], 0, i, i >= first && i < n_ctx - 1);
    ctx.seq_clear(0);
    ctx.decode(b);

    Stats cs;
    for (int i = first; i < n_ctx - 1; ++i, ++j_global) {
      const float* lg = ctx.logits(static_cast<size_t>(i));
      const int32_t next = ct[i + 1];
      const double lse = log_sum_exp(lg, V);
      const double lp = log_prob(lg, V, next, lse);
      cs.add(-lp);
      if (!w && !cmp) continue;

      float mx = -std::numeric_limits<float>::infinity();
      for (int v = 0; v < V; ++v) mx = std::max(mx, lg[v]);

      if (w) {
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + top_n, idx.end(), [lg](int32_t a, int32_t bb) {
          return lg[a] > lg[bb] || (lg[a] == lg[bb] && a < bb);
        });
        const float lpt = static_cast<float>(lp);
        std::memcpy(&rec[0], &lpt, 4);
        for (int k = 0; k < top_n; ++k) {
          const int32_t id = idx[static_cast<size_t>(k)];
          const float l = static_cast<float>(log_prob(lg, V, id, lse));
          std::memcpy(&rec[2 + 2 * static_cast<size_t>(k)], &id, 4);
          std::memcpy(&rec[3 + 2 * static_cast<size_t>(k)], &l, 4);
          in_top[static_cast<size_t>(id)] = 1;
        }
        double rest = 0;
        for (int v = 0; v < V; ++v)
          if (!in_top[static_cast<size_t>(v)]) rest += std::exp(static_cast<double>(lg[v]) - mx);
        const float lrest =
            rest > 0 ? static_cast<float>(std::log(rest) + mx - lse) : -std::numeric_limits<float>::infinity();
        std::memcpy(&rec[1], &lrest, 4);
        for (int k = 0; k < top_n; ++k) in_top[static_cast<size_t>(idx[static_cast<size_t>(k)])] = 0;
        w->write(rec.data(), rec.size() * 4);
      }

      if (cmp) {
        const int tn = cmp->top_n();
        double kl = 0;
        for (int k = 0; k < tn; ++k) {
          const int32_t id = cmp->top_id(j_global, k);
          const double lpb = cmp->top_logp(j_global, k);
          const double lq = static_cast<float>(log_prob(lg, V, id, lse));  // rounded as the base was
          kl += std::exp(lpb) * (lpb - lq);
          in_top[static_cast<size_t>(id)] = 1;
        }
        double rest = 0;
        for (int v = 0; v < V; ++v)
          if (!in_top[static_cast<size_t>(v)]) rest += std::exp(static_cast<double>(lg[v]) - mx);
        for (int k = 0; k < tn; ++k) in_top[static_cast<size_t>(cmp->top_id(j_global, k))] = 0;
        const double lrb = cmp->log_rest(j_global);
        if (std::isfinite(lrb)) {
          // q_rest can underflow only for absurd logits; floor it so KL stays finite
          const double lqr = rest > 0 ? static_cast<double>(static_cast<float>(std::log(rest) + mx - lse)) : -745.0;
          kl += std::exp(lrb) * (lrb - lqr);
        }
        klds.push_back(kl);
        kld_sum += kl;
        kld2_sum += kl * kl;
        int32_t am = 0;  // argmax, ties -> lower id (the base's top-1 rule)
        for (int v = 1; v < V; ++v)
          if (lg[v] > lg[am]) am = v;
        const int same = am == cmp->top_id(j_global, 0) ? 1 : 0;
        top1_same += same;
        r.per_token.push_back({c, i, next, kl, same, -lp});
        // both sides rounded to f32 as stored, so identical logits give exactly 0
        const double dp = std::exp(static_cast<double>(static_cast<float>(lp))) -
                          std::exp(static_cast<double>(cmp->logp_target(j_global)));
        dp_sum += dp;
        dp2_sum += dp * dp;
      }
    }
    // the totals add per-chunk sums, exactly as a comparison re-adds a base file's chunk sums
    r.stats.nll_sum += cs.nll_sum;
    r.stats.nll2_sum += cs.nll2_sum;
    r.stats.count += cs.count;
    chunk_stats.push_back(cs.nll_sum);
    chunk_stats.push_back(cs.nll2_sum);
    r.chunk_ppl.push_back(cs.ppl());
    r.running_ppl.push_back(r.stats.ppl());

    ChunkReport rep;
    rep.chunk = c + 1;
    rep.n_chunk = n_chunk;
    rep.chunk_ppl = cs.ppl();
    rep.ppl = r.stats.ppl();
    rep.ppl_err = r.stats.ppl_err();
    rep.seconds = seconds_since(t0);
    if (cmp) {
      base_stats.nll_sum += cmp->chunk_nll_sum(c);
      base_stats.nll2_sum += cmp->chunk_nll2_sum(c);
      base_stats.count += per_chunk;
      rep.has_kld = true;
      rep.kld_mean = kld_sum / static_cast<double>(klds.size());
      rep.top1_agree = static_cast<double>(top1_same) / static_cast<double>(klds.size());
      rep.base_ppl = base_stats.ppl();
    }
    if (on_chunk) on_chunk(rep);
  }
  r.seconds = seconds_since(t_all);

  if (w) {
    w->write(chunk_stats.data(), chunk_stats.size() * 8);
    w->put<double>(r.stats.ppl());
    w->put<double>(r.stats.ppl_err());
    w->put<uint64_t>(static_cast<uint64_t>(r.stats.count));
    w->put<uint64_t>(w->hash());
    w->write(kEndMagic, 8);
    w->commit();
  }

  if (cmp) {
    KldSummary k;
    const double n = static_cast<double>(klds.size());
    k.count = static_cast<int64_t>(klds.size());
    k.kld_mean = kld_sum / n;
    const double var = kld2_sum / n - k.kld_mean * k.kld_mean;
    k.kld_err = n > 1 && var > 0 ? std::sqrt(var / (n - 1)) : 0.0;
    std::sort(klds.begin(), klds.end());
    k.kld_min = klds.front();
    k.kld_max = klds.back();
    k.kld_median = percentile_sorted(klds, 0.5);
    k.kld_p90 = percentile_sorted(klds, 0.90);
    k.kld_p95 = percentile_sorted(klds, 0.95);
    k.kld_p99 = percentile_sorted(klds, 0.99);
    k.top1_agree = static_cast<double>(top1_same) / n;
    k.top1_err = n > 1 ? std::sqrt(k.top1_agree * (1 - k.top1_agree) / (n - 1)) : 0.0;
    k.base_ppl = base_stats.ppl();
    k.base_ppl_err = base_stats.ppl_err();
    k.ppl = r.stats.ppl();
    k.ppl_err = r.stats.ppl_err();
    k.delta_ppl = k.ppl - k.base_ppl;
    k.ppl_ratio = k.ppl / k.base_ppl;
    k.dp_mean = dp_sum / n;
    k.dp_rms = std::sqrt(dp2_sum / n);
    k.n_chunk_file = cmp->n_chunk();
    r.kld = k;
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// per-token files and the paired comparison

namespace {
constexpr const char* kPerTokenMagic = "# kimi kld-per-token 1";
constexpr const char* kPerTokenColumns = "chunk\tpos\tnext\tkld\tsame_top1\tnll";
}  // namespace

void write_per_token(const std::string& path, const std::string& base_path, int n_ctx,
                     const std::vector<TokenKld>& rows) {
  check(base_path.find('\n') == std::string::npos, "--kld-per-token: the base path contains a newline");
  const int first = n_ctx / 2;
  const int n_chunk = rows.empty() ? 0 : rows.back().chunk + 1;
  FileWriter w(path);
  std::string s = fmt::format("{}\n# base {}\n# n_ctx {} first {} n_chunk {} count {}\n{}\n", kPerTokenMagic,
                              base_path, n_ctx, first, n_chunk, rows.size(), kPerTokenColumns);
  w.write(s.data(), s.size());
  for (const auto& t : rows) {
    s = fmt::format("{}\t{}\t{}\t{:.17g}\t{}\t{:.17g}\n", t.chunk, t.pos, t.next, t.kld, t.same_top1, t.nll);
    w.write(s.data(), s.size());
  }
  w.commit();
}

PerTokenFile read_per_token(const std::string& path) {
  check(!std::filesystem::is_directory(path), "{}: is a directory (expected a per-token KLD file)", path);
  check(std::filesystem::exists(path), "{}: cannot open the per-token KLD file (no such file)", path);
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "{}: cannot open the per-token KLD file", path);
  PerTokenFile f;
  f.path = path;
  std::string line;
  auto next_line = [&](const char* what) {
    check(static_cast<bool>(std::getline(in, line)), "{}: ends before {} (not a complete per-token KLD file)", path,
          what);
  };
  next_line("the first line");
  check(line == kPerTokenMagic, "{}: not a per-token KLD file (first line must be '{}', written by kimi perplexity "
        "--kld-per-token)", path, kPerTokenMagic);
  next_line("the base line");
  check(line.rfind("# base ", 0) == 0, "{}: line 2 must be '# base PATH'", path);
  f.base = line.substr(7);
  next_line("the sizes line");
  long long count = -1;
  {
    char extra = 0;
    check(std::sscanf(line.c_str(), "# n_ctx %d first %d n_chunk %d count %lld%c", &f.n_ctx, &f.first, &f.n_chunk,
                      &count, &extra) == 4 &&
              f.n_ctx >= 4 && f.first == f.n_ctx / 2 && f.n_chunk >= 1 && count >= 1 &&
              count == static_cast<long long>(f.n_chunk) * (f.n_ctx - 1 - f.first),
          "{}: line 3 must be '# n_ctx N first N/2 n_chunk C count C*(N-1-N/2)' (got '{}')", path, line);
  }
  next_line("the column names");
  check(line == kPerTokenColumns, "{}: line 4 must be the column names '{}'", path, kPerTokenColumns);
  const int per_chunk = f.n_ctx - 1 - f.first;
  f.rows.reserve(static_cast<size_t>(count));
  for (long long j = 0; j < count; ++j) {
    next_line("all its rows");
    const long long ln = j + 5;
    TokenKld t;
    char extra = 0;
    check(std::sscanf(line.c_str(), "%d\t%d\t%d\t%lf\t%d\t%lf%c", &t.chunk, &t.pos, &t.next, &t.kld, &t.same_top1,
                      &t.nll, &extra) == 6,
          "{}:{}: expected 6 tab-separated numbers (chunk pos next kld same_top1 nll), got '{}'", path, ln, line);
    check(t.chunk == j / per_chunk && t.pos == f.first + j % per_chunk,
          "{}:{}: row {} must be chunk {} position {} (got {} {})", path, ln, j, j / per_chunk,
          f.first + j % per_chunk, t.chunk, t.pos);
    check(std::isfinite(t.kld) && t.kld >= -1e-9 && std::isfinite(t.nll) && t.nll >= -1e-9 &&
              (t.same_top1 == 0 || t.same_top1 == 1) && t.next >= 0,
          "{}:{}: invalid values (kld and nll must be finite and >= 0, same_top1 0 or 1, next >= 0)", path, ln);
    f.rows.push_back(t);
  }
  check(!std::getline(in, line), "{}: more rows than the count {} of line 3", path, count);
  return f;
}

PairedComparison paired_compare(const std::vector<TokenKld>& a, const std::vector<TokenKld>& b,
                                const std::string& what_b) {
  check(a.size() == b.size(), "{}: {} scored tokens, this run has {} (compare runs over the same base and --chunks)",
        what_b, b.size(), a.size());
  check(a.size() >= 2, "paired comparison: needs at least 2 scored tokens");
  for (size_t i = 0; i < a.size(); ++i)
    check(a[i].chunk == b[i].chunk && a[i].pos == b[i].pos && a[i].next == b[i].next,
          "{}: scored token {} is chunk {} position {} token {}, in this run chunk {} position {} token {}: not the "
          "same tokens (another base or text)",
          what_b, i, b[i].chunk, b[i].pos, b[i].next, a[i].chunk, a[i].pos, a[i].next);
  PairedComparison pc;
  pc.count = static_cast<int64_t>(a.size());
  pc.n_chunk = a.back().chunk + 1;
  auto series = [&](auto get) {
    PairedDiff p;
    const double n = static_cast<double>(a.size());
    double sa = 0, sb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      sa += get(a[i]);
      sb += get(b[i]);
    }
    p.mean_a = sa / n;
    p.mean_b = sb / n;
    p.diff = p.mean_a - p.mean_b;
    double ss = 0;  // two-pass variance of the differences
    std::vector<double> chunk_sum(static_cast<size_t>(pc.n_chunk), 0.0);
    std::vector<int64_t> chunk_n(static_cast<size_t>(pc.n_chunk), 0);
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = get(a[i]) - get(b[i]);
      ss += (d - p.diff) * (d - p.diff);
      chunk_sum[static_cast<size_t>(a[i].chunk)] += d;
      ++chunk_n[static_cast<size_t>(a[i].chunk)];
    }
    p.se_token = std::sqrt(ss / (n - 1) / n);
    if (pc.n_chunk > 1) {
      double mc = 0;
      for (int c = 0; c < pc.n_chunk; ++c) mc += chunk_sum[size_t(c)] / double(chunk_n[size_t(c)]);
      mc /= pc.n_chunk;
      double sc = 0;
      for (int c = 0; c < pc.n_chunk; ++c) {
        const double dc = chunk_sum[size_t(c)] / double(chunk_n[size_t(c)]) - mc;
        sc += dc * dc;
      }
      p.se_chunk = std::sqrt(sc / (pc.n_chunk - 1) / pc.n_chunk);
    }
    p.rel = p.mean_b != 0 ? p.diff / p.mean_b : 0.0;
    return p;
  };
  pc.kld = series([](const TokenKld& t) { return t.kld; });
  pc.top1 = series([](const TokenKld& t) { return static_cast<double>(t.same_top1); });
  pc.nll = series([](const TokenKld& t) { return t.nll; });
  return pc;
}

}  // namespace kimi::ppl
