// The prompt-cache store of `kimi serve`: host copies of context sequences at chosen positions
// (the end of a prompt, the last message boundary inside it, the end of a generation, a point
// where prompts diverge), kept apart from the live sequences, bounded by memory (LRU) and
// optionally written to a directory that a restarted server reads back.
//
// An entry is the tokens t[0, n) and what a sequence holding exactly them needs to continue: its
// cache rows [0, n) (MLA latent rows and indexer keys, every MLA layer) and its KDA states at n
// (conv + recurrent, every KDA layer). Rows at a position depend only on the tokens up to it, so
// an entry whose tokens extend another entry's stores only its new rows and shares the rest
// (a chain of row segments; a segment is freed when no entry uses it any more). Loading an entry
// into a sequence (Context::seq_load_rows / seq_load_state) makes that sequence bit for bit the
// one it was saved from: continuing it gives the logits of a full prefill.
//
// Files (--cache-dir): one per entry, "<identity>-<token hash>.kpc", written by a background
// thread to a temporary name and renamed (atomic), under a disk budget (least recently used
// files removed first). Layout (little-endian): "KIMIPC1\n", the 16-hex-digit identity
// (Context::state_identity: model file, precision, cache type, kernels), u32 n_tokens, u32
// n_segments, u64 row bytes per position, u64 state bytes, i32 tokens[n], {i32 from, i32 to}
// per segment, the segments' rows, the state, u64 checksum of everything before it. At startup
// the headers are read: a file of another identity is skipped with one warning line (and kept),
// a truncated or malformed one is skipped with a warning and removed; the checksum is verified
// when an entry is loaded (a corrupt file: warning, removed, the request prefills instead).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/context.h"

namespace kimi::server {

struct PromptCacheOptions {
  uint64_t ram_bytes = 0;   // memory budget of the entries (0: no store)
  std::string dir;          // entries written here and read back after a restart ("": memory only)
  uint64_t disk_bytes = 0;  // budget of the files in dir
};

struct PromptCacheStats {
  uint64_t entries = 0, bytes = 0;          // in memory now
  uint64_t saves = 0, hits = 0, evictions = 0;
  uint64_t disk_entries = 0, disk_bytes = 0;  // files in the directory now
  uint64_t disk_writes = 0, disk_loads = 0, disk_skipped = 0;
};

// Default memory budget: min(25 % of physical memory, 8 GiB).
uint64_t default_prompt_cache_ram();

// One whole sequence as a file of the layout above (one row segment): POST /slots/{id}?action=save
// and ?action=restore. save_sequence_file writes seq's first toks.size() positions (its length)
// under identity to path through a temporary name (fsync, rename: never a half-written file) and
// returns the bytes written. read_sequence_file reads and checks a whole file (magic, identity,
// sizes, checksum) without touching any sequence, throwing kimi::Error that says what is wrong;
// load_sequence_file then makes seq that sequence (tokens: SequenceFile::toks).
struct SequenceFile {
  std::vector<int32_t> toks;
  std::vector<uint8_t> rows, state;
  uint64_t bytes = 0;  // the file's size
};
uint64_t save_sequence_file(const Context& ctx, const std::string& identity, int32_t seq,
                            const std::vector<int32_t>& toks, const std::string& path);
SequenceFile read_sequence_file(const Context& ctx, const std::string& identity, const std::string& path);
void load_sequence_file(Context& ctx, int32_t seq, const SequenceFile& f);

class PromptCache {
 public:
  // ctx must outlive the cache; all calls but stats() come from the thread that runs ctx.
  PromptCache(Context& ctx, const PromptCacheOptions& o);
  ~PromptCache();  // finishes the pending file writes
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  struct Hit {
    size_t n = 0;     // tokens restored (0: none)
    int index = -1;   // entry (memory) or file (disk)
    bool disk = false;
  };
  // The longest entry whose tokens are a prefix of P[0, cap) (memory first on ties).
  Hit find(const std::vector<int32_t>& P, size_t cap) const;
  // Loads the hit into sequence seq; false (with a warning) when its file turned out bad, and seq
  // is then empty.
  bool load(const Hit& h, int32_t seq);
  // Saves the first n positions of seq, whose tokens are toks[0, n): n must be seq's length or
  // one of its snapshot positions. An entry with the same tokens is only marked as used.
  void save(int32_t seq, const std::vector<int32_t>& toks, size_t n);
  // Drops every entry (memory, files, pending writes) whose tokens start with `prefix`: what was made
  // from a slot file that is erased. Returns how many.
  size_t drop_prefix(const std::vector<int32_t>& prefix);
  // The longest common prefix of P with any entry's tokens (memory and disk).
  size_t longest_common(const std::vector<int32_t>& P) const;
  void flush();  // waits until every queued file is written
  PromptCacheStats stats() const;
  uint64_t entry_state_bytes() const { return state_bytes_; }
  uint64_t row_bytes() const { return row_bytes_; }

  // rows [from, to) of every part (Context::seq_row_parts layout), after the segments of prev;
  // the state of an entry is a segment too (from = to = -1, no prev)
  struct Seg {
    std::shared_ptr<const Seg> prev;
    int32_t from = 0, to = 0;
    std::vector<uint8_t> bytes;
    std::shared_ptr<std::atomic<uint64_t>> counter;  // live bytes of all segments
    ~Seg() {
      if (counter) counter->fetch_sub(bytes.size());
    }
  };
  struct Entry {
    std::vector<int32_t> toks;
    std::shared_ptr<const Seg> rows;   // covers [0, toks.size())
    std::shared_ptr<const Seg> state;  // KDA states at toks.size()
    uint64_t used = 0;
    bool on_disk = false;              // read from or written to the directory
  };
  struct DiskEntry {
    std::string path;
    std::vector<int32_t> toks;
    uint64_t size = 0, used = 0;
  };
  struct Write {
    std::string name;
    Entry e;
  };

 private:
  void add_entry(Entry&& e);
  void evict();
  void enqueue_write(const Entry& e);
  void writer_loop();
  void scan_dir();
  void trim_disk();  // under mu_
  void warn(const std::string& msg) const;

  std::shared_ptr<std::atomic<uint64_t>> live_bytes_;  // bytes of every segment alive
  Context& ctx_;
  PromptCacheOptions o_;
  std::string identity_;
  uint64_t row_bytes_ = 0, state_bytes_ = 0;
  std::vector<Entry> mem_;
  std::atomic<uint64_t> tick_{0};
  std::atomic<uint64_t> n_entries_{0};  // mem_.size(), for stats() from other threads  // LRU clock of entries and files

  mutable std::mutex mu_;  // guards everything below (the writer thread shares it)
  std::condition_variable cv_;
  std::vector<DiskEntry> disk_;
  std::deque<Write> queue_;
  bool writing_ = false, stop_ = false;
  PromptCacheStats st_;
  std::thread writer_;
};

}  // namespace kimi::server
