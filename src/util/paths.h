// Safe file access for inputs and outputs.
//
// Inputs: every file the program reads by name goes through open_input_file / read_input_file, which
// refuse anything but a regular file (a FIFO, device, socket or directory) *without blocking*: a FIFO
// in place of config.json would otherwise hang open() or read() forever.
//
// Outputs: check_outputs_distinct refuses, before anything is written, an output path that is the same
// file as one of the inputs (same device + inode, so through symlinks and hard links; for an output that
// does not exist yet, the same parent directory + name).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kimi {

// Opens PATH read-only (O_CLOEXEC) and returns the descriptor; throws kimi::Error naming the path when
// it cannot be opened or is not a regular file. Never blocks on a FIFO.
int open_input_file(const std::string& path);

// The whole content of the regular file PATH (see open_input_file); refuses files larger than max_bytes.
std::string read_input_file(const std::string& path, uint64_t max_bytes = uint64_t(1) << 32);

// Throws kimi::Error unless PATH names an existing regular file (after following symlinks). For code
// that hands the path to a library which opens it itself.
void check_input_regular(const std::string& path);

// Throws kimi::Error "output 'O' is the input file 'I' (the same file): choose another output path"
// when an output is the same file as an input; `what` prefixes the message (e.g. "--logits-out").
// Inputs that do not exist are ignored unless an output has the same parent directory and name.
void check_outputs_distinct(const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                            const std::string& what = "");

// True when A and B name the same file (same device + inode; for a missing path: parent + name).
bool same_file(const std::string& a, const std::string& b);

}  // namespace kimi
