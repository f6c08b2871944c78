// The prompt-cache store (prompt_cache.h): entries in memory (LRU under a byte budget) and files.
#include "server/prompt_cache.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "util/error.h"
#include "util/file_read.h"
#include "util/tempfile.h"

namespace kimi::server {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'M', 'I', 'P', 'C', '1', '\n'};
constexpr size_t kIdLen = 16;
constexpr size_t kHeadBytes = 8 + kIdLen + 4 + 4 + 8 + 8;

// The largest file of the layout for a sequence of at most n_ctx positions (one segment per token
// at most): a file beyond it is refused before it is read.
uint64_t max_file_bytes(uint64_t n_ctx, uint64_t row_bytes, uint64_t state_bytes) {
  return kHeadBytes + n_ctx * (4 + 8 + row_bytes) + state_bytes + 8;
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const auto w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// A value that is not a finite number (NaN, Inf) in an IEEE half or single: a file carrying one
// would poison every answer that continues it.
bool f16_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }
bool f32_finite(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }

// checksum of a file's bytes: 64-bit words mixed in order (the tail bytes zero-padded)
struct Checksum {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  uint64_t n = 0;
  void add(const void* p, size_t len) {
    const auto* b = static_cast<const uint8_t*>(p);
    size_t i = 0;
    if ((n & 7) == 0)  // whole words while aligned on the stream
      for (; i + 8 <= len; i += 8, n += 8) {
        std::memcpy(&word_, b + i, 8);
        mix();
      }
    for (; i < len; ++i) {
      word_ |= static_cast<uint64_t>(b[i]) << (8 * (n & 7));
      if ((++n & 7) == 0) mix();
    }
  }
  uint64_t value() {
    if (n & 7) mix();
    return h ^ n;
  }

 private:
  void mix() {
    h = (h ^ (word_ * 0xBF58476D1CE4E5B9ull));
    h = ((h << 31) | (h >> 33)) * 0x94D049BB133111EBull;
    word_ = 0;
  }
  uint64_t word_ = 0;
};

// fast path of Checksum::add for whole buffers (same result): 8 bytes at a time when aligned on n
void checksum_add(Checksum& c, const uint8_t* p, size_t len) { c.add(p, len); }

uint64_t token_hash(const std::vector<int32_t>& t) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t x : t) {
    h ^= static_cast<uint32_t>(x);
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

bool is_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& P, size_t cap) {
  if (a.empty() || a.size() > cap || a.size() > P.size()) return false;
  if (a.back() != P[a.size() - 1]) return false;
  return std::equal(a.begin(), a.end(), P.begin());
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

uint64_t default_prompt_cache_ram() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t phys = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  const uint64_t cap = uint64_t{8} << 30;
  return phys == 0 ? (uint64_t{1} << 30) : std::min(phys / 4, cap);
}

// values that are not finite numbers in k rows of the Context::seq_row_parts layout / in KDA states
bool rows_finite(const Context& ctx, const uint8_t* p, uint64_t k);
bool state_finite(const uint8_t* p, uint64_t bytes);

PromptCache::PromptCache(Context& ctx, const PromptCacheOptions& o)
    : live_bytes_(std::make_shared<std::atomic<uint64_t>>(0)), ctx_(ctx), o_(o) {
  row_bytes_ = ctx_.seq_row_bytes();
  state_bytes_ = ctx_.seq_state_bytes();
  if (o_.ram_bytes == 0) return;
  std::fprintf(stderr,
               "kimi serve: prompt cache: %.0f MiB of memory; an entry holds the KDA states (%.2f MiB) and %.0f bytes "
               "per token it does not share with a shorter entry%s%s\n",
               o_.ram_bytes / 1048576.0, state_bytes_ / 1048576.0, double(row_bytes_), o_.dir.empty() ? "" : "; files in ",
               o_.dir.c_str());
  if (o_.dir.empty()) return;
  identity_ = ctx_.state_identity();
  std::error_code ec;
  fs::create_directories(o_.dir, ec);
  check(fs::is_directory(o_.dir), "--cache-dir {}: not a directory and cannot be created{}", o_.dir,
        ec ? ": " + ec.message() : std::string());
  scan_dir();
  {
    std::lock_guard<std::mutex> lk(mu_);
    trim_disk();
  }
  writer_ = std::thread([this] { writer_loop(); });
}

PromptCache::~PromptCache() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (st_.saves > 0 || st_.disk_loads > 0)
    std::fprintf(stderr,
                 "kimi serve: prompt cache: %zu entries (%.1f MiB) at exit; %llu saved, %llu hits, %llu evicted, %llu files "
                 "written, %llu read\n",
                 mem_.size(), live_bytes_->load() / 1048576.0, (unsigned long long)st_.saves,
                 (unsigned long long)st_.hits, (unsigned long long)st_.evictions, (unsigned long long)st_.disk_writes,
                 (unsigned long long)st_.disk_loads);
  mem_.clear();
}

void PromptCache::warn(const std::string& msg) const {
  std::fprintf(stderr, "kimi serve: prompt cache: %s\n", msg.c_str());
  std::fflush(stderr);
}

// ---- memory ----

PromptCache::Hit PromptCache::find(const std::vector<int32_t>& P, size_t cap) const {
  Hit h;
  for (size_t i = 0; i < mem_.size(); ++i)
    if (mem_[i].toks.size() > h.n && is_prefix(mem_[i].toks, P, cap)) h = {mem_[i].toks.size(), static_cast<int>(i), false};
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < disk_.size(); ++i)
    if (disk_[i].toks.size() > h.n && is_prefix(disk_[i].toks, P, cap)) h = {disk_[i].toks.size(), static_cast<int>(i), true};
  return h;
}

size_t PromptCache::longest_common(const std::vector<int32_t>& P) const {
  size_t L = 0;
  for (const Entry& e : mem_) L = std::max(L, common_prefix(e.toks, P));
  std::lock_guard<std::mutex> lk(mu_);
  for (const DiskEntry& d : disk_) L = std::max(L, common_prefix(d.toks, P));
  return L;
}

bool PromptCache::load(const Hit& h, int32_t seq) {
  if (h.disk) {
    DiskEntry d;
    {
      std::lock_guard<std::mutex> lk(mu_);
      check(h.index >= 0 && static_cast<size_t>(h.index) < disk_.size(), "prompt cache: no file {}", h.index);
      d = disk_[static_cast<size_t>(h.index)];
    }
    // read and check the whole file
    std::string err;
    Entry e;
    try {
      // not through a link planted since the scan, never more than the scan saw
      const std::string buf = read_regular_file(d.path, d.size, fs::path(d.path).filename().string());
      if (buf.size() != d.size) throw std::runtime_error("its size changed");
      Checksum c;
      checksum_add(c, reinterpret_cast<const uint8_t*>(buf.data()), buf.size() - 8);
      uint64_t stored = 0;
      std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
      if (c.value() != stored) throw std::runtime_error("checksum mismatch (corrupt)");
      const char* p = buf.data() + kHeadBytes - 24;
      uint32_t nt = 0, ns = 0;
      std::memcpy(&nt, p, 4);
      std::memcpy(&ns, p + 4, 4);
      p = buf.data() + kHeadBytes + static_cast<size_t>(nt) * 4;
      const char* data = p + static_cast<size_t>(ns) * 8;
      std::shared_ptr<const Seg> prev;
      int32_t at = 0;
      for (uint32_t i = 0; i < ns; ++i) {
        int32_t from = 0, to = 0;
        std::memcpy(&from, p + i * 8, 4);
        std::memcpy(&to, p + i * 8 + 4, 4);
        if (from != at || to < from || static_cast<uint32_t>(to) > nt) throw std::runtime_error("bad segment table");
        auto s = std::make_shared<Seg>();
        s->prev = prev;
        s->from = from;
        s->to = to;
        s->bytes.assign(data, data + static_cast<size_t>(to - from) * row_bytes_);
        if (!rows_finite(ctx_, s->bytes.data(), static_cast<uint64_t>(to - from)))
          throw std::runtime_error("cache rows hold values that are not finite numbers");
        s->counter = live_bytes_;
        live_bytes_->fetch_add(s->bytes.size());
        data += s->bytes.size();
        prev = std::move(s);
        at = to;
      }
      if (static_cast<uint32_t>(at) != nt) throw std::runtime_error("segments do not cover the tokens");
      auto st = std::make_shared<Seg>();
      st->from = st->to = -1;
      st->bytes.assign(data, data + state_bytes_);
      if (!state_finite(st->bytes.data(), st->bytes.size()))
        throw std::runtime_error("KDA states hold values that are not finite numbers");
      st->counter = live_bytes_;
      live_bytes_->fetch_add(st->bytes.size());
      e.toks = d.toks;
      e.rows = std::move(prev);
      e.state = std::move(st);
      e.on_disk = true;
    } catch (const std::exception& ex) {
      err = ex.what();
    }
    if (!err.empty()) {
      warn(fmt::format("skipping {}: {}", d.path, err));
      std::lock_guard<std::mutex> lk(mu_);
      std::error_code ec;
      fs::remove(d.path, ec);
      std::erase_if(disk_, [&](const DiskEntry& x) { return x.path == d.path; });
      ++st_.disk_skipped;
      return false;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& x : disk_)
        if (x.path == d.path) x.used = ++tick_;
      ++st_.disk_loads;
    }
    add_entry(std::move(e));
    Hit m;
    for (size_t i = 0; i < mem_.size(); ++i)
      if (mem_[i].toks == d.toks) m = {d.toks.size(), static_cast<int>(i), false};
    if (m.index < 0) {  // larger than the whole memory budget: load it from the file's copy anyway
      warn(fmt::format("{} is larger than --cache-ram", d.path));
      return false;
    }
    return load(m, seq);
  }
  check(h.index >= 0 && static_cast<size_t>(h.index) < mem_.size(), "prompt cache: no entry {}", h.index);
  Entry& e = mem_[static_cast<size_t>(h.index)];
  std::vector<const Seg*> chain;
  for (const Seg* s = e.rows.get(); s; s = s->prev.get()) chain.push_back(s);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    ctx_.seq_load_rows(seq, (*it)->from, (*it)->to, (*it)->bytes.data());
  ctx_.seq_load_state(seq, static_cast<int32_t>(e.toks.size()), e.state->bytes.data());
  e.used = ++tick_;
  std::lock_guard<std::mutex> lk(mu_);
  ++st_.hits;
  return true;
}

void PromptCache::save(int32_t seq, const std::vector<int32_t>& toks, size_t n) {
  if (o_.ram_bytes == 0 || n == 0 || n > toks.size()) return;
  const std::vector<int32_t> t(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(n));
  const Entry* parent = nullptr;
  for (Entry& e : mem_) {
    if (e.toks.size() == n && e.toks == t) {  // already there
      e.used = ++tick_;
      return;
    }
    if (e.toks.size() < n && (!parent || e.toks.size() > parent->toks.size()) && is_prefix(e.toks, t, n)) parent = &e;
  }
  Entry e;
  e.toks = t;
  const int32_t from = parent ? static_cast<int32_t>(parent->toks.size()) : 0;
  auto rows = std::make_shared<Seg>();
  rows->prev = parent ? parent->rows : nullptr;
  rows->from = from;
  rows->to = static_cast<int32_t>(n);
  rows->bytes.resize(static_cast<size_t>(row_bytes_ * (n - static_cast<size_t>(from))));
  ctx_.seq_save_rows(seq, from, static_cast<int32_t>(n), rows->bytes.data());
  rows->counter = live_bytes_;
  live_bytes_->fetch_add(rows->bytes.size());
  auto st = std::make_shared<Seg>();
  st->from = st->to = -1;
  st->bytes.resize(state_bytes_);
  ctx_.seq_save_state(seq, static_cast<int32_t>(n), st->bytes.data());
  st->counter = live_bytes_;
  live_bytes_->fetch_add(st->bytes.size());
  e.rows = std::move(rows);
  e.state = std::move(st);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.saves;
  }
  if (!o_.dir.empty()) enqueue_write(e);
  add_entry(std::move(e));
}

size_t PromptCache::drop_prefix(const std::vector<int32_t>& prefix) {
  if (prefix.empty()) return 0;
  auto starts = [&](const std::vector<int32_t>& t) { return t.size() >= prefix.size() && is_prefix(prefix, t, t.size()); };
  size_t n = std::erase_if(mem_, [&](const Entry& e) { return starts(e.toks); });
  n_entries_.store(mem_.size());
  std::lock_guard<std::mutex> lk(mu_);
  n += std::erase_if(queue_, [&](const Write& w) { return starts(w.e.toks); });
  std::erase_if(disk_, [&](const DiskEntry& d) {
    if (!starts(d.toks)) return false;
    std::error_code ec;
    fs::remove(d.path, ec);
    ++n;
    return true;
  });
  return n;
}

void PromptCache::add_entry(Entry&& e) {
  e.used = ++tick_;
  mem_.push_back(std::move(e));
  evict();
  n_entries_.store(mem_.size());
}

void PromptCache::evict() {
  while (!mem_.empty() && live_bytes_->load() > o_.ram_bytes) {
    size_t v = 0;
    for (size_t i = 1; i < mem_.size(); ++i)
      if (mem_[i].used < mem_[v].used) v = i;
    mem_.erase(mem_.begin() + static_cast<std::ptrdiff_t>(v));
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.evictions;
  }
  n_entries_.store(mem_.size());
}

PromptCacheStats PromptCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  PromptCacheStats s = st_;
  s.entries = n_entries_.load();
  s.bytes = live_bytes_->load();
  s.disk_entries = disk_.size();
  s.disk_bytes = 0;
  for (const auto& d : disk_) s.disk_bytes += d.size;
  return s;
}

// ---- files ----

void PromptCache::scan_dir() {
  std::vector<std::pair<fs::file_time_type, DiskEntry>> found;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(o_.dir, ec)) {
    const fs::path& p = de.path();
    const std::string fname = p.filename().string();
    const size_t t_old = fname.rfind(".kpc.tmp"), t_new = fname.rfind(".kpc.kimi-tmp.");
    if (t_old != std::string::npos || t_new != std::string::npos) {
      // a temporary of a server that died while writing it (its pid is gone): never renamed, removed
      const char* at = t_new != std::string::npos ? fname.c_str() + t_new + 14 : fname.c_str() + t_old + 8;
      const long pid = std::strtol(at, nullptr, 10);
      std::error_code rm;
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(p, rm);
      continue;
    }
    // a regular file itself: a symbolic link planted here is never followed
    if (p.extension() != ".kpc" || !de.is_regular_file(ec) || de.is_symlink(ec)) continue;
    const std::string path = p.string();
    std::string why;
    bool foreign = false;
    DiskEntry d;
    d.path = path;
    try {
      // the header and the tokens only; no link, FIFO or device, nothing larger than an entry can be
      const uint64_t n_ctx = static_cast<uint64_t>(ctx_.options().n_ctx_max);
      const std::string text = read_regular_file(path, max_file_bytes(n_ctx, row_bytes_, state_bytes_), fname,
                                                 kHeadBytes + 4 * n_ctx, &d.size);
      std::istringstream f(text);
      char head[kHeadBytes];
      f.read(head, kHeadBytes);
      if (f.gcount() != static_cast<std::streamsize>(kHeadBytes)) throw std::runtime_error("truncated header");
      if (std::memcmp(head, kMagic, 8) != 0) throw std::runtime_error("not a kimi prompt-cache file");
      if (std::string(head + 8, kIdLen) != identity_) {
        foreign = true;
        throw std::runtime_error("written for another model or engine configuration (identity " +
                                 std::string(head + 8, kIdLen) + ", this server " + identity_ + ")");
      }
      uint32_t nt = 0, ns = 0;
      uint64_t rb = 0, sb = 0;
      std::memcpy(&nt, head + 24, 4);
      std::memcpy(&ns, head + 28, 4);
      std::memcpy(&rb, head + 32, 8);
      std::memcpy(&sb, head + 40, 8);
      if (rb != row_bytes_ || sb != state_bytes_) throw std::runtime_error("row or state size differs");
      if (nt == 0 || ns == 0 || ns > nt) throw std::runtime_error("bad token or segment count");
      const uint64_t want = kHeadBytes + uint64_t{nt} * 4 + uint64_t{ns} * 8 + rb * nt + sb + 8;
      if (nt > static_cast<uint32_t>(ctx_.options().n_ctx_max)) throw std::runtime_error("more tokens than the context holds");
      if (d.size != want) throw std::runtime_error(fmt::format("truncated or padded ({} bytes, expected {})", d.size, want));
      d.toks.resize(nt);
      f.read(reinterpret_cast<char*>(d.toks.data()), static_cast<std::streamsize>(nt) * 4);
      if (f.gcount() != static_cast<std::streamsize>(nt) * 4) throw std::runtime_error("truncated tokens");
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    if (!why.empty()) {
      warn(fmt::format("skipping {}: {}", path, why));
      ++st_.disk_skipped;
      if (!foreign) fs::remove(p, ec);  // ours but unusable
      continue;
    }
    found.emplace_back(de.last_write_time(ec), std::move(d));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [t, d] : found) {
    d.used = ++tick_;
    disk_.push_back(std::move(d));
  }
}

void PromptCache::enqueue_write(const Entry& e) {
  const std::string name = fmt::format("{}-{:016x}-{}.kpc", identity_, token_hash(e.toks), e.toks.size());
  {
    std::lock_guard<std::mutex> lk(mu_);
    const std::string path = (fs::path(o_.dir) / name).string();
    for (auto& d : disk_)
      if (d.path == path && d.toks == e.toks) {
        d.used = ++tick_;
        return;
      }
    if (queue_.size() >= 32) queue_.pop_front();  // the disk is behind: drop the oldest pending write
    queue_.push_back({name, e});
  }
  cv_.notify_all();
}

void PromptCache::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return queue_.empty() && !writing_; });
}

void PromptCache::writer_loop() {
  for (;;) {
    Write w;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and everything written
      w = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const fs::path path = fs::path(o_.dir) / w.name;
    std::string tmp;
    std::string err;
    uint64_t size = 0;
    try {
      std::vector<const Seg*> chain;
      for (const Seg* s = w.e.rows.get(); s; s = s->prev.get()) chain.push_back(s);
      std::reverse(chain.begin(), chain.end());
      std::string head(kMagic, 8);
      head += identity_;
      put(head, static_cast<uint32_t>(w.e.toks.size()));
      put(head, static_cast<uint32_t>(chain.size()));
      put(head, row_bytes_);
      put(head, state_bytes_);
      head.append(reinterpret_cast<const char*>(w.e.toks.data()), w.e.toks.size() * 4);
      for (const Seg* s : chain) {
        put(head, s->from);
        put(head, s->to);
      }
      // an unpredictable new name (O_CREAT | O_EXCL | O_NOFOLLOW): a link planted in the folder is
      // never written through; renamed into place once complete
      TempFile tf = create_temp_file(path.string());
      tmp = tf.path;
      Checksum c;
      bool ok = true;
      auto wr = [&](const void* p, size_t n) {
        checksum_add(c, static_cast<const uint8_t*>(p), n);
        ok = ok && write_all(tf.fd, p, n);
        size += n;
      };
      wr(head.data(), head.size());
      for (const Seg* s : chain) wr(s->bytes.data(), s->bytes.size());
      wr(w.e.state->bytes.data(), w.e.state->bytes.size());
      const uint64_t sum = c.value();
      ok = ok && write_all(tf.fd, &sum, 8);
      size += 8;
      ok = ok && ::fsync(tf.fd) == 0;
      const int e = errno;
      ok = ::close(tf.fd) == 0 && ok;
      if (!ok) throw std::runtime_error(std::string("write failed: ") + std::strerror(e));
      commit_temp(tmp, path.string());
      tmp.clear();
    } catch (const std::exception& ex) {
      err = ex.what();
      if (!tmp.empty()) discard_temp(tmp);
    }
    if (!err.empty()) warn(fmt::format("cannot write {}: {}", path.string(), err));
    std::lock_guard<std::mutex> lk(mu_);
    if (err.empty()) {
      std::erase_if(disk_, [&](const DiskEntry& d) { return d.path == path.string(); });
      disk_.push_back({path.string(), w.e.toks, size, ++tick_});
      ++st_.disk_writes;
      trim_disk();
    }
    writing_ = false;
    cv_.notify_all();
  }
}

void PromptCache::trim_disk() {
  uint64_t total = 0;
  for (const auto& d : disk_) total += d.size;
  while (!disk_.empty() && total > o_.disk_bytes) {
    size_t v = 0;
    for (size_t i = 1; i < disk_.size(); ++i)
      if (disk_[i].used < disk_[v].used) v = i;
    std::error_code ec;
    fs::remove(disk_[v].path, ec);
    total -= disk_[v].size;
    disk_.erase(disk_.begin() + static_cast<std::ptrdiff_t>(v));
  }
}

// ---- one sequence as a file (POST /slots) ----

uint64_t save_sequence_file(const Context& ctx, const std::string& identity, int32_t seq,
                            const std::vector<int32_t>& toks, const std::string& path) {
  const auto n = static_cast<int32_t>(toks.size());
  check(n > 0 && n == ctx.seq_len(seq), "sequence {} holds {} positions, not the {} tokens to save", seq, ctx.seq_len(seq), n);
  check(identity.size() == kIdLen, "internal: identity '{}' is not {} characters", identity, kIdLen);
  const std::string name = fs::path(path).filename().string();  // errors name the file, never the folder
  const uint64_t rb = ctx.seq_row_bytes(), sb = ctx.seq_state_bytes();
  std::vector<uint8_t> rows(static_cast<size_t>(rb * static_cast<uint64_t>(n))), state(static_cast<size_t>(sb));
  ctx.seq_save_rows(seq, 0, n, rows.data());
  ctx.seq_save_state(seq, n, state.data());
  std::string head(kMagic, 8);
  head += identity;
  put(head, static_cast<uint32_t>(n));
  put(head, uint32_t{1});
  put(head, rb);
  put(head, sb);
  head.append(reinterpret_cast<const char*>(toks.data()), toks.size() * 4);
  put(head, int32_t{0});
  put(head, n);
  // an unpredictable new name (O_CREAT | O_EXCL | O_NOFOLLOW), renamed into place when complete: a
  // symbolic link planted in the folder is never written through
  TempFile tf;
  try {
    tf = create_temp_file(path);
  } catch (const std::exception&) {
    fail("cannot create a file next to '{}' in the slot folder: {}", name, std::strerror(errno));
  }
  Checksum c;
  bool ok = true;
  uint64_t size = 0;
  auto wr = [&](const void* p, size_t len) {
    c.add(p, len);
    ok = ok && write_all(tf.fd, p, len);
    size += len;
  };
  wr(head.data(), head.size());
  wr(rows.data(), rows.size());
  wr(state.data(), state.size());
  const uint64_t sum = c.value();
  ok = ok && write_all(tf.fd, &sum, 8);
  size += 8;
  ok = ok && ::fsync(tf.fd) == 0;
  const int e = errno;
  ok = ::close(tf.fd) == 0 && ok;
  if (ok) {
    try {
      commit_temp(tf.path, path);
      return size;
    } catch (const std::exception&) {
    }
  }
  const int why = ok ? errno : e;
  discard_temp(tf.path);
  fail("cannot write '{}' in the slot folder: {}", name, std::strerror(why));
}

bool rows_finite(const Context& ctx, const uint8_t* p, uint64_t k) {
  const ContextOptions& o = ctx.options();
  const bool fast = o.precision == Precision::Fast;
  const uint64_t elt = fast && o.cache_type == CacheType::F16 ? 2 : 4;
  const bool i8 = fast && o.indexer_int8;
  const uint64_t d = ctx.model().hparams().idx_dim;
  for (const uint64_t b : ctx.seq_row_parts()) {
    const uint8_t* q = p;
    p += b * k;
    if (i8 && b == d + 8) {  // int8 indexer keys: the values, then the row's f32 scale and int32 sum
      for (uint64_t r = 0; r < k; ++r) {
        uint32_t u = 0;
        std::memcpy(&u, q + r * b + d, 4);
        if (!f32_finite(u)) return false;
      }
    } else if (elt == 2 && b % 2 == 0) {
      for (uint64_t i = 0; i < b * k / 2; ++i) {
        uint16_t h = 0;
        std::memcpy(&h, q + i * 2, 2);
        if (!f16_finite(h)) return false;
      }
    } else if (b % 4 == 0) {
      for (uint64_t i = 0; i < b * k / 4; ++i) {
        uint32_t u = 0;
        std::memcpy(&u, q + i * 4, 4);
        if (!f32_finite(u)) return false;
      }
    }
  }
  return true;
}

bool state_finite(const uint8_t* p, uint64_t bytes) {
  for (uint64_t i = 0; i + 4 <= bytes; i += 4) {
    uint32_t u = 0;
    std::memcpy(&u, p + i, 4);
    if (!f32_finite(u)) return false;
  }
  return true;
}

SequenceFile read_sequence_file(const Context& ctx, const std::string& identity, const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  const uint64_t rb = ctx.seq_row_bytes(), sb = ctx.seq_state_bytes();
  const uint64_t n_ctx = static_cast<uint64_t>(ctx.options().n_ctx_max);
  // no link, FIFO or device; never more than this server's context can hold
  const std::string buf = read_regular_file(path, max_file_bytes(n_ctx, rb, sb), name);
  check(buf.size() >= kHeadBytes + 8, "truncated: shorter than the header");
  check(std::memcmp(buf.data(), kMagic, 8) == 0, "not a kimi slot or prompt-cache file (bad magic)");
  const std::string id(buf.data() + 8, kIdLen);
  check(id == identity, "written for another model or engine configuration (identity {}, this server {})", id, identity);
  uint32_t nt = 0, ns = 0;
  uint64_t frb = 0, fsb = 0;
  std::memcpy(&nt, buf.data() + 24, 4);
  std::memcpy(&ns, buf.data() + 28, 4);
  std::memcpy(&frb, buf.data() + 32, 8);
  std::memcpy(&fsb, buf.data() + 40, 8);
  check(frb == rb && fsb == sb, "row or state size differs from this server's");
  check(nt > 0 && ns >= 1 && ns <= nt, "bad token or segment count ({} tokens, {} segments)", nt, ns);
  check(nt <= static_cast<uint32_t>(ctx.options().n_ctx_max), "{} tokens do not fit this server's context of {}", nt,
        ctx.options().n_ctx_max);
  const uint64_t want = kHeadBytes + uint64_t{nt} * 4 + uint64_t{ns} * 8 + rb * nt + sb + 8;
  check(buf.size() == want, "truncated or padded (not the {} bytes its header says)", want);
  Checksum c;
  c.add(buf.data(), buf.size() - 8);
  uint64_t stored = 0;
  std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
  check(c.value() == stored, "checksum mismatch (corrupt)");
  SequenceFile out;
  out.bytes = buf.size();
  out.toks.resize(nt);
  std::memcpy(out.toks.data(), buf.data() + kHeadBytes, size_t{nt} * 4);
  const char* seg = buf.data() + kHeadBytes + size_t{nt} * 4;
  int32_t at = 0;
  for (uint32_t i = 0; i < ns; ++i) {
    int32_t from = 0, to = 0;
    std::memcpy(&from, seg + i * 8, 4);
    std::memcpy(&to, seg + i * 8 + 4, 4);
    check(from == at && to >= from && static_cast<uint32_t>(to) <= nt, "bad segment table");
    at = to;
  }
  check(static_cast<uint32_t>(at) == nt, "the segments do not cover the tokens");
  // a token id, or an image key of the server's prompts (server/job.h image_key: -2^30..-1)
  for (int32_t t : out.toks) check(t >= -(int32_t{1} << 30) && t < ctx.n_vocab(), "token id {} is out of range", t);
  const char* data = seg + size_t{ns} * 8;
  out.rows.assign(data, data + rb * nt);
  out.state.assign(data + rb * nt, data + rb * nt + sb);
  // every segment is checked for values that are not numbers (a crafted file with a valid checksum)
  at = 0;
  const uint8_t* rp = out.rows.data();
  for (uint32_t i = 0; i < ns; ++i) {
    int32_t to = 0;
    std::memcpy(&to, seg + i * 8 + 4, 4);
    check(rows_finite(ctx, rp, static_cast<uint64_t>(to - at)), "its cache rows hold values that are not finite numbers (NaN or Inf)");
    rp += rb * static_cast<uint64_t>(to - at);
    at = to;
  }
  check(state_finite(out.state.data(), out.state.size()), "its KDA states hold values that are not finite numbers (NaN or Inf)");
  return out;
}

void load_sequence_file(Context& ctx, int32_t seq, const SequenceFile& f) {
  const auto n = static_cast<int32_t>(f.toks.size());
  ctx.seq_load_rows(seq, 0, n, f.rows.data());
  ctx.seq_load_state(seq, n, f.state.data());
}

}  // namespace kimi::server
