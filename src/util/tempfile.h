// Temporary outputs written next to their final path and renamed into place when complete.
//
// Names: FINAL.kimi-tmp.<pid>.<random>. Every temp is created exclusively (O_EXCL / mkdir), so
// concurrent runs never share one, and is registered so that SIGINT, SIGTERM, SIGHUP (and SIGPIPE,
// unless ignored) remove it
// (an async-signal-safe unlink in the handler, then the signal's previous action runs). A run that was
// killed harder (SIGKILL, power loss) leaves its temp behind; remove_stale_temps(FINAL), called by
// the next run writing FINAL, removes those whose pid is no longer alive.
#pragma once
#include <cstddef>
#include <string>

namespace kimi {

struct TempFile {
  std::string path;
  int fd = -1;  // open for writing (O_CLOEXEC)
};

// Creates a new empty temp file for FINAL (mode 0666 & ~umask) and registers it for signal cleanup.
TempFile create_temp_file(const std::string& final_path);
// Creates a new empty temp directory for FINAL (mode 0777 & ~umask) and registers it: on a signal, the
// files directly inside it and the directory itself are removed.
std::string create_temp_dir(const std::string& final_path);

// Stop removing PATH on a signal (after it was renamed into place or removed).
void unregister_temp(const std::string& path);
// Removes the temp (file, or directory with its contents) and unregisters it. Never throws.
void discard_temp(const std::string& path) noexcept;
// Renames the temp file/dir to FINAL (replacing a file there) and unregisters it; throws on failure.
void commit_temp(const std::string& temp_path, const std::string& final_path);

// Removes FINAL.kimi-tmp.<pid>.* (and the older naming FINAL.tmp<pid>) left by processes that are no
// longer running. Returns how many were removed. Never throws.
size_t remove_stale_temps(const std::string& final_path) noexcept;

// True when NAME (a file name, no directory) is a temp name of the file named BASE.
bool is_temp_name_of(const std::string& name, const std::string& base);

}  // namespace kimi
