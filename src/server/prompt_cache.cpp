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

#include "util/error.h"

namespace kimi::server {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'M', 'I', 'P', 'C', '1', '\n'};
constexpr size_t kIdLen = 16;
constexpr size_t kHeadBytes = 8 + kIdLen + 4 + 4 + 8 + 8;

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
      std::ifstream f(d.path, std::ios::binary);
      if (!f) throw std::runtime_error("cannot open it");
      std::vector<char> buf(static_cast<size_t>(d.size));
      f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (static_cast<uint64_t>(f.gcount()) != d.size || f.peek() != std::char_traits<char>::eof())
        throw std::runtime_error("its size changed");
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
    if (const size_t t = fname.rfind(".kpc.tmp"); t != std::string::npos) {
      // a temporary of a server that died while writing it (its pid is gone): never renamed, removed
      const long pid = std::strtol(fname.c_str() + t + 8, nullptr, 10);
      std::error_code rm;
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(p, rm);
      continue;
    }
    if (p.extension() != ".kpc" || !de.is_regular_file()) continue;
    const std::string path = p.string();
    std::string why;
    bool foreign = false;
    DiskEntry d;
    d.path = path;
    try {
      std::ifstream f(path, std::ios::binary);
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
      d.size = de.file_size();
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
    const fs::path tmp = fs::path(o_.dir) / (w.name + fmt::format(".tmp{}", ::getpid()));
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
      FILE* f = std::fopen(tmp.string().c_str(), "wb");
      if (!f) throw std::runtime_error(std::string("cannot create: ") + std::strerror(errno));
      Checksum c;
      bool ok = true;
      auto wr = [&](const void* p, size_t n) {
        checksum_add(c, static_cast<const uint8_t*>(p), n);
        ok = ok && std::fwrite(p, 1, n, f) == n;
        size += n;
      };
      wr(head.data(), head.size());
      for (const Seg* s : chain) wr(s->bytes.data(), s->bytes.size());
      wr(w.e.state->bytes.data(), w.e.state->bytes.size());
      const uint64_t sum = c.value();
      ok = ok && std::fwrite(&sum, 1, 8, f) == 8;
      size += 8;
      ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
      ok = std::fclose(f) == 0 && ok;
      if (!ok) throw std::runtime_error(std::string("write failed: ") + std::strerror(errno));
      fs::rename(tmp, path);
    } catch (const std::exception& ex) {
      err = ex.what();
      std::error_code ec;
      fs::remove(tmp, ec);
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
  const std::string tmp = path + fmt::format(".tmp{}", ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  check(f != nullptr, "cannot create {}: {}", tmp, std::strerror(errno));
  Checksum c;
  bool ok = true;
  uint64_t size = 0;
  auto wr = [&](const void* p, size_t len) {
    c.add(p, len);
    ok = ok && std::fwrite(p, 1, len, f) == len;
    size += len;
  };
  wr(head.data(), head.size());
  wr(rows.data(), rows.size());
  wr(state.data(), state.size());
  const uint64_t sum = c.value();
  ok = ok && std::fwrite(&sum, 1, 8, f) == 8;
  size += 8;
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  ok = std::fclose(f) == 0 && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    const std::string why = ok ? ec.message() : std::string(std::strerror(errno));
    fs::remove(tmp, ec);
    fail("cannot write {}: {}", path, why);
  }
  return size;
}

SequenceFile read_sequence_file(const Context& ctx, const std::string& identity, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "no such file (or it cannot be read)");
  std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(buf.size() >= kHeadBytes + 8, "truncated: {} bytes, shorter than the header", buf.size());
  check(std::memcmp(buf.data(), kMagic, 8) == 0, "not a kimi slot or prompt-cache file (bad magic)");
  const std::string id(buf.data() + 8, kIdLen);
  check(id == identity, "written for another model or engine configuration (identity {}, this server {})", id, identity);
  uint32_t nt = 0, ns = 0;
  uint64_t rb = 0, sb = 0;
  std::memcpy(&nt, buf.data() + 24, 4);
  std::memcpy(&ns, buf.data() + 28, 4);
  std::memcpy(&rb, buf.data() + 32, 8);
  std::memcpy(&sb, buf.data() + 40, 8);
  check(rb == ctx.seq_row_bytes() && sb == ctx.seq_state_bytes(), "row or state size differs from this server's");
  check(nt > 0 && ns >= 1 && ns <= nt, "bad token or segment count ({} tokens, {} segments)", nt, ns);
  check(nt <= static_cast<uint32_t>(ctx.options().n_ctx_max), "{} tokens do not fit this server's context of {}", nt,
        ctx.options().n_ctx_max);
  const uint64_t want = kHeadBytes + uint64_t{nt} * 4 + uint64_t{ns} * 8 + rb * nt + sb + 8;
  check(buf.size() == want, "truncated or padded ({} bytes, expected {})", buf.size(), want);
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
  for (int32_t t : out.toks) check(t >= 0 && t < ctx.n_vocab(), "token id {} is out of range", t);
  const char* data = seg + size_t{ns} * 8;
  out.rows.assign(data, data + rb * nt);
  out.state.assign(data + rb * nt, data + rb * nt + sb);
  return out;
}

void load_sequence_file(Context& ctx, int32_t seq, const SequenceFile& f) {
  const auto n = static_cast<int32_t>(f.toks.size());
  ctx.seq_load_rows(seq, 0, n, f.rows.data());
  ctx.seq_load_state(seq, n, f.state.data());
}

}  // namespace kimi::server
