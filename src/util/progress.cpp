#include "util/progress.h"

#include <unistd.h>

#include <cctype>
#include <cmath>

#include "util/error.h"

namespace kimi {

std::string format_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return fmt::format("{} B", n);
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (v >= 100) return fmt::format("{:.0f} {}", v, units[u]);
  if (v >= 10) return fmt::format("{:.1f} {}", v, units[u]);
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  uint64_t t = static_cast<uint64_t>(s + 0.5);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
}

uint64_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  check(i > 0, "invalid size '{}': expected a number with an optional K/M/G/T suffix, e.g. 500M or 2G", text);
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(text.substr(0, i), &used);
    check(used == i, "invalid size '{}'", text);
  } catch (const std::logic_error&) {
    fail("invalid size '{}': expected a number with an optional K/M/G/T suffix", text);
  }
  std::string suf;
  for (size_t j = i; j < text.size(); ++j) suf += static_cast<char>(std::toupper(static_cast<unsigned char>(text[j])));
  double mul = 1;
  if (suf.empty() || suf == "B") mul = 1;
  else if (suf == "K" || suf == "KB") mul = 1e3;
  else if (suf == "M" || suf == "MB") mul = 1e6;
  else if (suf == "G" || suf == "GB") mul = 1e9;
  else if (suf == "T" || suf == "TB") mul = 1e12;
  else if (suf == "KIB") mul = 1024.0;
  else if (suf == "MIB") mul = 1024.0 * 1024;
  else if (suf == "GIB") mul = 1024.0 * 1024 * 1024;
  else if (suf == "TIB") mul = 1024.0 * 1024 * 1024 * 1024;
  else fail("invalid size '{}': unknown suffix '{}' (use K, M, G, T or KiB, MiB, GiB, TiB)", text, text.substr(i));
  double r = v * mul;
  check(r >= 1 && r < 1.8e19, "invalid size '{}': must be at least 1 byte", text);
  return static_cast<uint64_t>(std::llround(r));
}

Progress::Progress(std::string label, uint64_t total_items, uint64_t total_bytes, Mode mode, FILE* out)
    : label_(std::move(label)), total_items_(total_items), total_bytes_(total_bytes), mode_(mode), out_(out) {
  if (mode_ == Mode::Auto) mode_ = (out_ && ::isatty(::fileno(out_))) ? Mode::Bar : Mode::Lines;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add_bytes(uint64_t bytes) {
  bytes_ += bytes;
  if (mode_ == Mode::Bar) redraw(false);
}

void Progress::item_done(const std::string& what) {
  ++items_;
  current_ = what;
  if (mode_ == Mode::Lines) {
    std::fprintf(out_, "%s [%*llu/%llu] %s\n", label_.c_str(), static_cast<int>(std::to_string(total_items_).size()),
                 static_cast<unsigned long long>(items_), static_cast<unsigned long long>(total_items_), what.c_str());
    std::fflush(out_);
  } else if (mode_ == Mode::Bar) {
    redraw(items_ == total_items_);
  }
}

void Progress::redraw(bool force) {
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double el = std::chrono::duration<double>(now - start_).count();
  double rate = el > 0 ? bytes_ / el : 0;
  double frac = total_bytes_ ? static_cast<double>(bytes_) / total_bytes_
                             : (total_items_ ? static_cast<double>(items_) / total_items_ : 1.0);
  if (frac > 1) frac = 1;
  double eta = (frac > 0 && frac < 1) ? el * (1 - frac) / frac : 0;
  const int width = 24;
  int filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.append(width - filled, '.');
  std::string cur = current_;
  if (cur.size() > 40) cur = "..." + cur.substr(cur.size() - 37);
  std::string line = fmt::format("\r{} [{}] {:3.0f}% {}/{} tensors {}/{} {}/s ETA {} {}", label_, bar, frac * 100,
                                 items_, total_items_, format_bytes(bytes_), format_bytes(total_bytes_),
                                 format_bytes(static_cast<uint64_t>(rate)), format_duration(eta), cur);
  size_t len = line.size();
  if (len < last_len_) line.append(last_len_ - len, ' ');
  last_len_ = len;
  std::fputs(line.c_str(), out_);
  std::fflush(out_);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (mode_ == Mode::Bar) {
    if (items_ != total_items_ || last_len_ == 0) redraw(true);  // the last item_done drew the final state
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

}  // namespace kimi
