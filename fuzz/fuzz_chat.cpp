// libFuzzer target: the Kimi-K3 chat format (src/tokenizer/chat.*). The first input byte picks:
//   bit 0 = 0: render. The rest is a request JSON (messages, tools, tool_choice, response_format,
//              thinking, ...), parsed depth-limited as every JSON input is, then rendered with
//              render_chat_request, plus the Python-compatible dumps the template uses
//              (py_json_dumps, json_sorted, py_str) on the whole body.
//   bit 0 = 1: parse. The rest is model output text (reasoning, response, tool calls with typed
//              arguments or json blocks, in any tag order); bit 1 = start_in_think. It is fed to
//              one ChatParser at once and to another in chunks (sizes from the input), and the
//              two parsed messages must be identical (the parser promises "any chunking"), as
//              must the concatenated deltas and the message text; each tool call starts once in the
//              deltas, its streamed argument pieces concatenate to its arguments_json, and that is one
//              JSON object in compact form (what the server sends: its own dump, byte for byte).
// A malformed input must end in kimi::Error (render) or be parsed as text (parse); a crash, a
// sanitizer report, any other exception or a mismatch is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat.h"
#include "util/error.h"
#include "util/json.h"

using namespace kimi;
using tok::ojson;

namespace {
[[noreturn]] void mismatch(const char* what) {
  std::fprintf(stderr, "fuzz_chat: %s\n", what);
  std::abort();
}

struct Fed {
  std::string reasoning, content;
  size_t completed = 0;
  std::vector<std::string> args;  // [call]: the argument pieces so far
  std::vector<int> started, done;  // [call]: start / done deltas seen
  void add(const tok::ChatDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    completed += d.tool_calls_completed.size();
    for (const auto& t : d.tool_call_deltas) {
      if (t.call >= args.size()) {
        if (t.call != args.size()) mismatch("a tool-call delta skips a call");
        args.emplace_back(), started.push_back(0), done.push_back(0);
      }
      if (t.started) ++started[t.call];
      if (!started[t.call]) mismatch("argument pieces before the call's start delta");
      if (done[t.call] && (!t.arguments.empty() || t.done)) mismatch("a tool-call delta after the call's done delta");
      args[t.call] += t.arguments;
      if (t.done) ++done[t.call];
    }
  }
};

void same_message(const tok::ParsedMessage& a, const tok::ParsedMessage& b) {
  if (a.reasoning != b.reasoning) mismatch("chunked parse: reasoning differs");
  if (a.content != b.content) mismatch("chunked parse: content differs");
  if (a.done != b.done) mismatch("chunked parse: done differs");
  if (a.tool_calls.size() != b.tool_calls.size()) mismatch("chunked parse: number of tool calls differs");
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    const auto &x = a.tool_calls[i], &y = b.tool_calls[i];
    if (x.name != y.name || x.index != y.index || x.raw_json != y.raw_json || x.complete != y.complete ||
        x.arguments != y.arguments || x.arguments_json != y.arguments_json)
      mismatch("chunked parse: a tool call differs");
  }
}

void check_fed(const Fed& f, const tok::ParsedMessage& m) {
  if (f.reasoning != m.reasoning) mismatch("reasoning deltas do not add up to the message");
  if (f.content != m.content) mismatch("content deltas do not add up to the message");
  size_t complete = 0;
  for (const auto& c : m.tool_calls) complete += c.complete;
  if (f.completed != complete) mismatch("completed tool-call deltas do not match the message");
  if (f.args.size() > m.tool_calls.size()) mismatch("deltas name more tool calls than the message holds");
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const std::string& a = m.tool_calls[i].arguments_json;
    const std::string pieces = i < f.args.size() ? f.args[i] : std::string();
    if (pieces != a) mismatch("argument pieces do not concatenate to the call's arguments_json");
    if (i < f.started.size() && f.started[i] != 1) mismatch("a tool call started more than once");
    if (a.empty()) continue;
    const ojson v = ojson::parse(a, nullptr, false);
    if (v.is_discarded() || !v.is_object()) mismatch("a call's arguments_json is not one JSON object");
    if (v.dump(-1, ' ', false, ojson::error_handler_t::replace) != a)
      mismatch("a call's arguments_json is not in the compact form the server writes");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t sink = 0;
  if (!(mode & 1)) {
    ojson body;
    try {
      body = parse_json<ojson>(rest, "fuzz request");
    } catch (const JsonError&) {
      return 0;
    }
    sink += tok::py_json_dumps(body).size() + tok::json_sorted(body).size() + tok::py_str(body).size();
    try {
      sink += tok::render_chat_request(body).size();
    } catch (const Error&) {
    }
  } else {
    const bool think = mode & 2;
    tok::ChatParser whole(think), chunked(think);
    Fed fw, fc;
    fw.add(whole.push(rest));
    fw.add(whole.finish());
    uint32_t state = mode * 2654435761u + static_cast<uint32_t>(size);
    for (size_t pos = 0; pos < rest.size();) {
      state = state * 1103515245u + 12345u;
      const size_t n = 1 + (state >> 16) % 17;  // 1..17 bytes, so tags get split anywhere
      fc.add(chunked.push(rest.substr(pos, n)));
      pos += n;
    }
    fc.add(chunked.finish());
    same_message(whole.message(), chunked.message());
    check_fed(fw, whole.message());
    check_fed(fc, chunked.message());
    sink += whole.message().content.size();
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
