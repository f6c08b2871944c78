#include "server/vision_worker.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "image/image.h"
#include "runtime/vision_input.h"
#include "util/error.h"

namespace kimi::server {

namespace {

// A second 64-bit hash of the patch values, independent of image::content_hash (FNV-1a is not
// collision resistant): a multiply-rotate over the 32-bit words, then a final mix.
uint64_t second_hash(const image::Patches& p) {
  uint64_t h = 0xD6E8FEB86659FD93ull ^ static_cast<uint64_t>(p.values.size());
  const float* v = p.values.data();
  for (size_t i = 0; i < p.values.size(); ++i) {
    uint32_t w;
    std::memcpy(&w, v + i, 4);
    h = (h ^ w) * 0x9FB21C651E98DF25ull;
    h = (h << 29) | (h >> 35);
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

}  // namespace

VisionWorker::VisionWorker(VisionRunner& runner, int64_t d, uint64_t cache_bytes, std::function<void()> wake,
                           std::function<void(int)> hook)
    : runner_(runner), d_(d), budget_(cache_bytes), wake_(std::move(wake)), hook_(std::move(hook)) {
  thread_ = std::thread([this] { loop(); });
}

VisionWorker::~VisionWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    if (current_) current_->cancel();  // the tower stops before its next block
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<VisionWorker::Task> VisionWorker::submit(std::shared_ptr<const PromptImages> images,
                                                         std::vector<uint8_t> need) {
  auto t = std::make_shared<Task>();
  if (need.empty()) need.assign(images->images.size(), 1);
  check(need.size() == images->images.size(), "internal: {} image flags for {} images", need.size(),
        images->images.size());
  t->images_ = std::move(images);
  t->need_ = std::move(need);
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(t);
  }
  cv_.notify_all();
  return t;
}

VisionStats VisionWorker::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  VisionStats s = st_;
  s.cache_entries = lru_.size();
  return s;
}

std::shared_ptr<const std::vector<float>> VisionWorker::lookup(const Key& k) {
  const auto it = index_.find(k);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
  return it->second->rows;
}

void VisionWorker::insert(const Key& k, std::shared_ptr<const std::vector<float>> rows) {
  const uint64_t bytes = rows->size() * sizeof(float);
  if (bytes > budget_ || index_.count(k)) return;  // larger than the whole cache (or 0: no cache)
  while (!lru_.empty() && st_.cache_bytes + bytes > budget_) {
    const Entry& e = lru_.back();
    st_.cache_bytes -= e.rows->size() * sizeof(float);
    index_.erase(e.key);
    lru_.pop_back();
    ++st_.cache_evictions;
  }
  lru_.push_front(Entry{k, std::move(rows)});
  index_[k] = lru_.begin();
  st_.cache_bytes += bytes;
}

void VisionWorker::loop() {
  for (;;) {
    std::shared_ptr<Task> t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) {  // the scheduler is gone or going: nobody waits for these any more
        for (auto& q : queue_) {
          q->error = "the server is shutting down";
          q->done_.store(true, std::memory_order_release);
        }
        queue_.clear();
        break;
      }
      t = std::move(queue_.front());
      queue_.pop_front();
      current_ = t;
    }
    if (!t->cancelled_.load(std::memory_order_relaxed)) {
      try {
        run(*t);
      } catch (const std::exception& e) {
        t->rows.clear();
        t->error = e.what();
      }
    } else {
      t->error = "cancelled";
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      current_.reset();
    }
    t->done_.store(true, std::memory_order_release);
    if (wake_) wake_();
  }
}

void VisionWorker::run(Task& t) {
  const PromptImages& im = *t.images_;
  const size_t n = im.images.size();
  std::vector<Key> keys(n);
  std::vector<std::shared_ptr<const std::vector<float>>> out(n);
  std::vector<const image::Patches*> todo;
  std::vector<size_t> todo_at;
  int hits = 0;
  for (size_t k = 0; k < n; ++k) {
    if (!t.need_[k]) continue;
    const image::Patches& p = im.images[k];
    keys[k] = Key{image::content_hash(p), second_hash(p), p.size.gh, p.size.gw};
    {
      std::lock_guard<std::mutex> lk(mu_);
      out[k] = lookup(keys[k]);
    }
    if (out[k]) {
      ++hits;
      continue;
    }
    // the same image twice in one request: encoded once
    bool dup = false;
    for (size_t j : todo_at) dup = dup || keys[j] == keys[k];
    if (!dup) {
      todo.push_back(&p);
      todo_at.push_back(k);
    }
  }
  if (!todo.empty()) {
    if (hook_) hook_(static_cast<int>(todo.size()));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> rows = runner_.encode(todo, &t.cancelled_);  // a cancelled run keeps nothing
    t.tower_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t want = 0;
    for (const image::Patches* p : todo) want += p->size.tokens;
    check(static_cast<int64_t>(rows.size()) == want * d_, "the vision tower gave {} floats for {} rows of {}",
          rows.size(), want, d_);
    size_t off = 0;
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < todo.size(); ++i) {
      const size_t len = static_cast<size_t>(todo[i]->size.tokens * d_);
      auto r = std::make_shared<const std::vector<float>>(rows.begin() + static_cast<std::ptrdiff_t>(off),
                                                          rows.begin() + static_cast<std::ptrdiff_t>(off + len));
      off += len;
      out[todo_at[i]] = r;
      insert(keys[todo_at[i]], r);
    }
    ++st_.runs;
    st_.images_encoded += todo.size();
    st_.tower_s += t.tower_s;
  }
  for (size_t k = 0; k < n; ++k)  // a repeat within the request takes its first copy's rows
    if (t.need_[k] && !out[k])
      for (size_t j = 0; j < k && !out[k]; ++j)
        if (out[j] && keys[j] == keys[k]) out[k] = out[j];
  t.rows.assign(static_cast<size_t>(im.n_rows * d_), 0.0f);
  size_t off = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t len = static_cast<size_t>(im.images[k].size.tokens * d_);
    if (t.need_[k]) {
      check(out[k] && out[k]->size() == len, "internal: image {} has no rows", k);
      std::memcpy(t.rows.data() + off, out[k]->data(), len * sizeof(float));
    }
    off += len;
  }
  t.encoded = static_cast<int>(todo.size());
  t.cached = hits;
  std::lock_guard<std::mutex> lk(mu_);
  st_.images_cached += static_cast<uint64_t>(hits);
}

}  // namespace kimi::server
