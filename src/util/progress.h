// Progress reporting for long streaming jobs (convert, verify, synth, quantize).
// On a terminal: one self-updating line (items, bytes, rate, ETA, current item), redrawn at most
// ~10 times a second. Otherwise: one plain line per finished item. Quiet: nothing.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kimi {

// "1.50 GiB", "12.0 MiB", "512 B"
std::string format_bytes(uint64_t n);
// "1h02m", "3m05s", "12.3s"
std::string format_duration(double seconds);
// Parses sizes like "500M", "2G", "1.5GB", "4096", "64K" (powers of 1000 for plain suffixes
// K/M/G/T and of 1024 for KiB/MiB/GiB/TiB). Throws kimi::Error naming the text.
uint64_t parse_size(const std::string& text);

class Progress {
 public:
  enum class Mode { Auto, Bar, Lines, Quiet };  // Auto: Bar when `out` is a terminal, else Lines
  Progress(std::string label, uint64_t total_items, uint64_t total_bytes, Mode mode = Mode::Auto,
           FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Add `bytes` to the running byte count (call as data is produced; cheap, throttled redraw).
  void add_bytes(uint64_t bytes);
  // Mark an item as finished; `what` names it (printed as a line in Lines mode).
  void item_done(const std::string& what);
  // Ends the bar line (idempotent). Called by the destructor too.
  void finish();

  uint64_t items_done() const { return items_; }
  uint64_t bytes_done() const { return bytes_; }
  double elapsed_seconds() const;
  Mode mode() const { return mode_; }

 private:
  void redraw(bool force);
  std::string label_;
  uint64_t total_items_, total_bytes_;
  uint64_t items_ = 0, bytes_ = 0;
  Mode mode_;
  FILE* out_;
  std::string current_;
  bool finished_ = false;
  size_t last_len_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kimi
