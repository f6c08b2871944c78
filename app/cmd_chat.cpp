// kimi chat: an interactive terminal chat (also driven by a pipe: each input line is a user turn).
// The conversation lives in the context's caches and KDA states; each turn prefills only the new
// tokens (runtime/chat_session.h). On a terminal, lines are read with libedit when the build has it
// (line editing, history in a file); otherwise, and from a pipe, with read(2). See docs/chat.md.
#include <signal.h>
#include <unistd.h>
#ifdef KIMI_HAVE_LIBEDIT
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#endif

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <set>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "engine_args.h"
#include "model/model.h"
#include "runtime/chat_session.h"
#include "runtime/vision_input.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

volatile std::sig_atomic_t g_sigint = 0;
extern "C" void on_sigint(int) { g_sigint = 1; }

// SIGINT sets a flag; no SA_RESTART, so a blocking read() at the prompt returns EINTR.
struct SigintGuard {
  struct sigaction old {};
  SigintGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &old);
  }
  ~SigintGuard() { sigaction(SIGINT, &old, nullptr); }
};

// Line input from fd 0 with read(2), so that Ctrl-C at the prompt is seen (EINTR).
class LineReader {
 public:
  enum class Status { Line, Eof, Interrupted };
  // tty: a line not ended by Enter when Ctrl-D ends the input is dropped, not sent (from a pipe the
  // last line may lack its newline and is a message like any other).
  explicit LineReader(bool tty) : tty_(tty) {}
  bool dropped_partial() const { return dropped_; }
  Status next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line.assign(buf_, 0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Status::Line;
      }
      if (eof_) {
        if (buf_.empty()) return Status::Eof;
        if (tty_) {
          dropped_ = true;
          buf_.clear();
          return Status::Eof;
        }
        line.swap(buf_);
        buf_.clear();
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Status::Line;
      }
      char tmp[4096];
      const ssize_t n = ::read(0, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) return Status::Interrupted;
      if (n < 0) kimi::fail("reading standard input: {}", std::strerror(errno));
      if (n == 0) eof_ = true;
      else buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
  bool tty_ = false, dropped_ = false;
};

#ifdef KIMI_HAVE_LIBEDIT
// Line input on a terminal with libedit: emacs-style editing (~/.editrc is read), arrow keys, and a
// history that persists in a file (0600, the last 1000 distinct lines). Ctrl-D ends the input only
// on an empty line: on a partial line it deletes the character under the cursor, so an unfinished
// line is never sent. The editor converts with a UTF-8 character type (the environment's, or C.UTF-8
// when that is plain ASCII) set for this thread only, so typed UTF-8 arrives unchanged.
class LineEditor {
 public:
  explicit LineEditor(std::string history_file) : file_(std::move(history_file)) {
    loc_ = ::newlocale(LC_CTYPE_MASK, "", static_cast<locale_t>(0));
    if (loc_ == static_cast<locale_t>(0) || std::strcmp(::nl_langinfo_l(CODESET, loc_), "UTF-8") != 0) {
      if (loc_ != static_cast<locale_t>(0)) ::freelocale(loc_);
      loc_ = ::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    }
    const LocaleScope ls(loc_);
    hist_ = ::history_init();
    ::history(hist_, &ev_, H_SETSIZE, 1000);
    ::history(hist_, &ev_, H_SETUNIQUE, 1);
    if (!file_.empty() && ::access(file_.c_str(), F_OK) == 0 && ::history(hist_, &ev_, H_LOAD, file_.c_str()) < 0)
      std::fprintf(stderr, "kimi chat: warning: cannot read the history file %s (history is not saved)\n", file_.c_str());
    el_ = ::el_init("kimi", stdin, stdout, stderr);
    ::el_set(el_, EL_CLIENTDATA, this);
    ::el_set(el_, EL_EDITOR, "emacs");
    ::el_set(el_, EL_HIST, ::history, hist_);
    ::el_set(el_, EL_PROMPT, &LineEditor::prompt_of);
    ::el_set(el_, EL_SIGNAL, 1);  // the terminal is restored before a signal's own handler runs
    ::el_source(el_, nullptr);    // ~/.editrc
  }
  ~LineEditor() {
    const LocaleScope ls(loc_);
    ::el_end(el_);
    ::history_end(hist_);
    if (loc_ != static_cast<locale_t>(0)) ::freelocale(loc_);
  }
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  enum class Status { Line, Eof, Interrupted };
  Status next(std::string& line, const char* prompt) {
    prompt_ = prompt;
    const LocaleScope ls(loc_);
    // The terminal goes into the editor's mode BEFORE the prompt is drawn: el_gets draws it first and
    // switches at its first read, so keys typed right after the prompt appeared (or pasted) were
    // handled by the kernel's line discipline (its echo, its Ctrl-D/Ctrl-U) and could leave the
    // editor waiting on a line the user had already ended.
    ::el_set(el_, EL_PREP_TERM, 1);
    int n = 0;
    const char* s = ::el_gets(el_, &n);
    if (s == nullptr || n <= 0) {
      if (g_sigint) return Status::Interrupted;
      return Status::Eof;
    }
    line.assign(s, static_cast<size_t>(n));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return Status::Line;
  }
  // A typed line goes into the history (and its file) unless it is blank.
  void remember(const std::string& line) {
    if (line.find_first_not_of(" \t") == std::string::npos) return;
    const LocaleScope ls(loc_);
    ::history(hist_, &ev_, H_ENTER, line.c_str());
    if (!file_.empty() && !save_failed_ && ::history(hist_, &ev_, H_SAVE, file_.c_str()) < 0) {
      save_failed_ = true;
      std::fprintf(stderr, "kimi chat: warning: cannot write the history file %s\n", file_.c_str());
    }
  }

 private:
  struct LocaleScope {
    locale_t old;
    explicit LocaleScope(locale_t l) : old(l != static_cast<locale_t>(0) ? ::uselocale(l) : static_cast<locale_t>(0)) {}
    ~LocaleScope() {
      if (old != static_cast<locale_t>(0)) ::uselocale(old);
    }
  };
  static char* prompt_of(EditLine* el) {
    void* self = nullptr;
    ::el_get(el, EL_CLIENTDATA, &self);
    return const_cast<char*>(static_cast<LineEditor*>(self)->prompt_.c_str());
  }
  std::string file_, prompt_;
  EditLine* el_ = nullptr;
  History* hist_ = nullptr;
  HistEvent ev_{};
  locale_t loc_ = static_cast<locale_t>(0);
  bool save_failed_ = false;
};
#endif

// Where chat keeps its line history: --history-file, else $KIMI_CHAT_HISTORY (empty or "off": no
// history), else ~/.kimi_chat_history; "" = none.
std::string history_path(const std::string& flag, bool no_history) {
  if (no_history) return "";
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("KIMI_CHAT_HISTORY")) return std::strcmp(e, "off") == 0 ? "" : e;
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + "/.kimi_chat_history" : "";
}

// Model text for a terminal: control characters other than newline and tab are shown as \xHH
// (an escape sequence from the model must not drive the terminal).
std::string escape_controls(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) o += fmt::format("\\x{:02x}", c);
    else o += static_cast<char>(c);
  }
  return o;
}

// Prints a reply as it streams: reasoning dimmed on a terminal (between <think> lines otherwise).
class ReplyPrinter {
 public:
  explicit ReplyPrinter(bool tty) : tty_(tty) {}
  void operator()(const kimi::tok::ChatDelta& d) {
    if (!d.reasoning.empty()) {
      if (where_ != Where::Reasoning) {
        where_ = Where::Reasoning;
        out(tty_ ? "\033[2m" : "<think>\n");
      }
      out(tty_ ? escape_controls(d.reasoning) : d.reasoning);
    }
    if (!d.content.empty()) {
      if (where_ == Where::Reasoning) out(tty_ ? "\033[0m\n" : "\n</think>\n");
      where_ = Where::Content;
      out(tty_ ? escape_controls(d.content) : d.content);
    }
    std::fflush(stdout);
  }
  void end() {
    if (where_ == Where::Reasoning) out(tty_ ? "\033[0m" : "\n</think>");
    out("\n");
    std::fflush(stdout);
    where_ = Where::None;
  }

 private:
  enum class Where { None, Reasoning, Content };
  static void out(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }
  bool tty_;
  Where where_ = Where::None;
};

const char* kHelp =
    "commands:\n"
    "  /reset          forget the conversation (the system message stays)\n"
    "  /save FILE      write the conversation as JSON ({\"thinking\", \"messages\": [...]})\n"
    "  /system TEXT    set the system message (no TEXT: remove it); applies from the next turn\n"
    "  /image FILE     send the image (PNG, JPEG, WebP, GIF) with the next message (needs MODEL.mmproj.gguf)\n"
    "  /help           this text\n"
    "  /exit, /quit    leave (also Ctrl-D, or Ctrl-C twice at the prompt)\n"
    "input: a line ending in '\\' continues on the next line; a line starting with \"\"\" opens a block\n"
    "closed by a line ending in \"\"\"; start a message with // to send a literal leading '/'.\n"
    "Ctrl-C stops the current reply.\n";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

int cmd_chat(int argc, char** argv) {
  CLI::App app{"Interactive chat with a kimi-k3 GGUF model (stdin may be a pipe: one user turn per line)",
               "kimi chat"};
  kimi::app::EngineArgs ea;
  kimi::app::add_engine_options(app, ea);
  kimi::ChatOptions co;
  kimi::SamplerParams sp;
  std::string thinking = "on";
  app.add_option("--system", co.system, "system message");
  app.add_option("--thinking", thinking, "thinking mode of the chat template (reply starts in <think>)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--thinking-effort", co.thinking_effort, "thinking effort: low, high, max (template default: max)")
      ->check(CLI::IsMember({"low", "high", "max"}));
  app.add_option("-n,--n-predict", co.max_tokens, "maximum tokens per reply (-1 = until end of message or a full context)")
      ->check(CLI::Range(-1, 1 << 30));
  std::string history_file;
  bool no_history = false;
  app.add_option("--history-file", history_file,
                 "line history of the terminal editor (default: $KIMI_CHAT_HISTORY, else ~/.kimi_chat_history)");
  app.add_flag("--no-history", no_history, "keep no line history in a file (also KIMI_CHAT_HISTORY=off)");
  std::vector<std::string> first_images;
  std::string mmproj;
  app.add_option("--image", first_images, "an image for the first message (repeatable; later: /image FILE)");
  app.add_option("--mmproj", mmproj, "the vision projector file (default: MODEL.mmproj.gguf next to the model)");
  kimi::app::add_sampling_options(app, sp);
  kimi::app::SpecArgs sa;
  kimi::app::add_spec_options(app, sa);
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;
  co.thinking = thinking == "on";
  const kimi::SpecParams spec = kimi::app::spec_params(sa);

  auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
  kimi::check(model->reader().has("tokenizer.ggml.tokens"),
              "{}: kimi chat needs a tokenizer (tokenizer.ggml.tokens) in the GGUF", ea.model);
  const kimi::tok::Tokenizer tok = kimi::tok::Tokenizer::from_gguf(model->reader());
  const uint32_t train = model->hparams().n_ctx_train;
  const int n_ctx = ea.ctx > 0 ? ea.ctx : static_cast<int>(train > 0 ? std::min<uint32_t>(train, 4096) : 4096);
  std::unique_ptr<kimi::Drafter> drafter = kimi::app::make_drafter(
      sa, *model, n_ctx + 64, ea.threads, ea.precision == "f32" ? kimi::Precision::F32 : kimi::Precision::Fast,
      !sa.draft_model.empty() ? kimi::app::side_backend(ea) : nullptr);
  kimi::ContextOptions cop = kimi::app::context_options(ea, n_ctx, std::min(ea.batch, n_ctx));
  if (drafter) {  // a verify step in one micro-batch; one snapshot slot for its rollback (docs/speculative.md)
    cop.n_batch_max = std::max(cop.n_batch_max, std::min(ea.batch, 3 * spec.n_max + 2));
    cop.n_snapshots_max += 1;
  }
  kimi::Context ctx(*model, cop);
  kimi::app::print_engine_summary(ea, ctx);
  if (drafter) ctx.set_tap_layers({drafter->tap_layers().begin(), drafter->tap_layers().end()});
  kimi::ChatSession session(ctx, tok, sp, co);
  if (drafter) session.set_drafter(drafter.get(), spec);
  // images (docs/engine.md, "Images"): the tower is loaded on the first one
  std::unique_ptr<kimi::VisionRunner> vision;
  std::vector<std::string> pending_images = first_images;
  auto attach_pending = [&](std::string& text) {
    if (pending_images.empty()) return;
    if (!vision) {
      if (mmproj.empty()) mmproj = kimi::find_mmproj(ea.model);
      kimi::check(!mmproj.empty(), "{}", kimi::no_vision_message(ea.model));
      vision = std::make_unique<kimi::VisionRunner>(mmproj, model->hparams().n_embd, ea.threads,
                                                    ea.precision == "f32" ? kimi::Precision::F32 : kimi::Precision::Fast,
                                                    kimi::app::side_backend(ea));
    }
    std::vector<kimi::image::Patches> ps;
    std::string media;
    for (const auto& f : pending_images) {
      ps.push_back(vision->preprocess(kimi::image::decode_file(f, {})));
      media += kimi::media_text(ps.back());
    }
    std::vector<const kimi::image::Patches*> pp;
    for (const auto& p : ps) pp.push_back(&p);
    session.attach_image_rows(vision->encode(pp), vision->model().hp().placeholder);
    pending_images.clear();
    text = media + text;
  };

  const bool tty_in = ::isatty(0) != 0, tty_out = ::isatty(1) != 0;
  SigintGuard sig;
  LineReader reader(tty_in);
#ifdef KIMI_HAVE_LIBEDIT
  // the editor on a terminal (both ends: it draws on stdout); a pipe keeps the plain reader
  std::unique_ptr<LineEditor> editor;
  if (tty_in && tty_out) editor = std::make_unique<LineEditor>(history_path(history_file, no_history));
#else
  (void)history_path(history_file, no_history);
#endif
  // one line of input: from the editor (which shows the prompt), or plain (prompt on a terminal)
  auto read_line = [&](std::string& l, const char* prompt) -> LineReader::Status {
#ifdef KIMI_HAVE_LIBEDIT
    if (editor) {
      switch (editor->next(l, prompt)) {
        case LineEditor::Status::Line: editor->remember(l); return LineReader::Status::Line;
        case LineEditor::Status::Interrupted: return LineReader::Status::Interrupted;
        case LineEditor::Status::Eof: return LineReader::Status::Eof;
      }
    }
#endif
    if (tty_in) {
      std::fputs(prompt, stdout);
      std::fflush(stdout);
    }
    return reader.next(l);
  };
  std::set<std::string> notes_shown;  // a note (e.g. the template re-rendering a turn) is shown once
  auto stop = [] { return g_sigint != 0; };
  if (tty_in)
    std::fprintf(stderr, "kimi chat: %s, context %d tokens. /help for commands, Ctrl-C stops a reply.\n",
                 ea.model.c_str(), n_ctx);

  bool last_was_sigint = false;
  for (;;) {
    // ---- read one message (possibly several lines)
    g_sigint = 0;
    std::string line;
    LineReader::Status s = read_line(line, "> ");
    if (s == LineReader::Status::Interrupted) {
      if (last_was_sigint) {
        std::fputs("\n", stdout);
        break;
      }
      last_was_sigint = true;
      std::fputs("\n(Ctrl-C again, /exit or Ctrl-D to quit)\n", stderr);
      continue;
    }
    if (s == LineReader::Status::Eof) {
      if (tty_in) std::fputs("\n", stdout);
      if (reader.dropped_partial()) std::fputs("(the unfinished line was not sent)\n", stderr);
      break;
    }
    last_was_sigint = false;
    std::string text;
    bool interrupted = false;
    auto more = [&](std::string& l) {
      const LineReader::Status st = read_line(l, "... ");
      if (st == LineReader::Status::Interrupted) interrupted = true;
      return st == LineReader::Status::Line;
    };
    auto closes = [](const std::string& l) { return l.size() >= 3 && l.compare(l.size() - 3, 3, "\"\"\"") == 0; };
    if (line.rfind("\"\"\"", 0) == 0) {  // """ block: up to a line ending in """
      std::vector<std::string> lines;
      std::string cur = line.substr(3);
      bool done = closes(cur);
      if (done) cur.resize(cur.size() - 3);
      if (!cur.empty()) lines.push_back(cur);  // text on the opening line
      while (!done && more(cur)) {
        done = closes(cur);
        if (done) cur.resize(cur.size() - 3);
        if (!done || !cur.empty()) lines.push_back(cur);
      }
      for (size_t i = 0; i < lines.size(); ++i) text += (i ? "\n" : "") + lines[i];
    } else {
      text = line;
      while (!text.empty() && text.back() == '\\') {
        text.back() = '\n';
        std::string next;
        if (!more(next)) break;
        text += next;
      }
    }
    if (interrupted) {
      last_was_sigint = true;
      std::fputs("\n(input discarded)\n", stderr);
      continue;
    }
    if (trim(text).empty()) continue;

    // ---- commands
    if (text[0] == '/' && text.rfind("//", 0) != 0) {
      const size_t sp_pos = text.find_first_of(" \t\n");
      const std::string cmd = text.substr(0, sp_pos);
      const std::string arg = sp_pos == std::string::npos ? "" : trim(text.substr(sp_pos + 1));
      try {
        if (cmd == "/exit" || cmd == "/quit") break;
        if (cmd == "/help") {
          std::fputs(kHelp, stderr);
        } else if (cmd == "/reset") {
          session.reset();
          std::fputs("(conversation cleared)\n", stderr);
        } else if (cmd == "/save") {
          kimi::check(!arg.empty(), "/save needs a file name: /save FILE");
          session.save(arg);
          std::fprintf(stderr, "(saved %zu messages to %s)\n", session.messages().size(), arg.c_str());
        } else if (cmd == "/image") {
          kimi::check(!arg.empty(), "/image needs a file name: /image FILE");
          pending_images.push_back(arg);
          std::fprintf(stderr, "(image %s goes with the next message)\n", arg.c_str());
        } else if (cmd == "/system") {
          session.set_system(arg);
          std::fputs(arg.empty() ? "(system message removed)\n" : "(system message set; it applies from the next turn)\n",
                     stderr);
        } else {
          std::fprintf(stderr, "unknown command %s (try /help; start with // to send a message beginning with '/')\n",
                       cmd.c_str());
        }
      } catch (const kimi::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
      }
      continue;
    }
    if (text.rfind("//", 0) == 0) text.erase(0, 1);

    // ---- one turn
    g_sigint = 0;
    kimi::TurnStats ts;
    try {
      attach_pending(text);
      ts = session.prefill_turn(text, stop);
    } catch (const kimi::Error& e) {
      pending_images.clear();
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    // the same kind of note (its text up to the numbers in parentheses) is shown once
    if (!ts.note.empty() && notes_shown.insert(ts.note.substr(0, ts.note.find(" ("))).second)
      std::fprintf(stderr, "note: %s (shown once)\n", ts.note.c_str());
    if (ts.interrupted) {
      std::fprintf(stderr, "(interrupted while reading the prompt; the message was dropped)\n");
      last_was_sigint = true;
      continue;
    }
    ReplyPrinter printer(tty_out);
    const kimi::ReplyStats rs = session.generate(std::ref(printer), stop);
    printer.end();
    if (rs.stop == kimi::StopReason::Interrupted) last_was_sigint = true;
    std::fprintf(stderr,
                 "[prompt %d tokens: %d new, %d reused, %.2f tok/s | reply %zu tokens, %.2f tok/s, %s]\n",
                 ts.n_prompt, ts.n_prefilled, ts.n_reused, ts.n_prefilled / std::max(ts.seconds, 1e-9),
                 rs.tokens.size(), rs.tokens_per_second(), kimi::stop_reason_name(rs.stop));
    std::fflush(stderr);
  }
  if (drafter) std::fprintf(stderr, "%s\n", kimi::app::spec_summary(sa, session.spec_stats()).c_str());
  return 0;
}

kimi::app::Registrar reg_chat("chat", "interactive chat (multi-turn, cached; stdin may be a pipe)", cmd_chat);

}  // namespace
