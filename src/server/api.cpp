#include "server/api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "runtime/vision_input.h"
#include "server/grammar.h"
#include "server/tool_grammar.h"
#include "tokenizer/tiktoken_file.h"
#include "util/error.h"
#include "util/json.h"

namespace kimi::server {

std::string error_type_for(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "server_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ojson error_json(int status, const std::string& message, const std::string& type, const std::string& param,
                 const std::string& code) {
  ojson e = ojson::object();
  e["message"] = message;
  e["type"] = type.empty() ? error_type_for(status) : type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  e["code"] = code.empty() ? ojson(nullptr) : ojson(code);
  return ojson{{"error", e}};
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // compares every byte of the longer string; the length difference is folded into the result
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

// Second pass over a body that failed to parse: follows the key path (SAX, no values built) up
// to the error, so that the message can name the field ("messages[0].content").
struct ErrorPath : nlohmann::json_sax<ojson> {
  struct Level {
    bool array;
    size_t index = 0;
    std::string key;
  };
  std::vector<Level> levels;
  size_t byte = 0;
  std::string message;

  void value_done() {
    if (!levels.empty() && levels.back().array) ++levels.back().index;
  }
  bool push(bool array) {
    if (levels.size() > static_cast<size_t>(kJsonMaxDepth)) return false;
    levels.push_back({array, 0, {}});
    return true;
  }
  bool pop() {
    if (!levels.empty()) levels.pop_back();
    value_done();
    return true;
  }
  bool null() override { return value_done(), true; }
  bool boolean(bool) override { return value_done(), true; }
  bool number_integer(number_integer_t) override { return value_done(), true; }
  bool number_unsigned(number_unsigned_t) override { return value_done(), true; }
  bool number_float(number_float_t, const string_t&) override { return value_done(), true; }
  bool string(string_t&) override { return value_done(), true; }
  bool binary(binary_t&) override { return value_done(), true; }
  bool start_object(std::size_t) override { return push(false); }
  bool key(string_t& k) override {
    if (!levels.empty()) levels.back().key = k;
    return true;
  }
  bool end_object() override { return pop(); }
  bool start_array(std::size_t) override { return push(true); }
  bool end_array() override { return pop(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    byte = position;
    message = ex.what();
    const size_t b = message.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] " prefix
    if (message.rfind("[json.exception.", 0) == 0 && b != std::string::npos) message.erase(0, b + 2);
    return false;
  }
  std::string path() const {
    std::string p;
    for (const Level& l : levels) {
      if (l.array) p += fmt::format("[{}]", l.index);
      else if (!l.key.empty()) p += (p.empty() ? "" : ".") + l.key;
    }
    return p;
  }
};

// First pass over a body: no object may have more than kJsonMaxKeys keys. An ordered_json object
// finds a key by a linear search, so building one of n keys costs n^2 / 2 comparisons (an 8 MB body
// of 400 000 keys: hours of CPU); this pass is linear and builds nothing.
constexpr size_t kJsonMaxKeys = 16384;
struct KeyCount : nlohmann::json_sax<ojson> {
  std::vector<size_t> keys;  // per open object / array (arrays count nothing)
  ErrorPath path;            // where the over-full object is
  bool too_many = false;
  bool null() override { return path.null(); }
  bool boolean(bool v) override { return path.boolean(v); }
  bool number_integer(number_integer_t v) override { return path.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) override { return path.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) override { return path.number_float(v, s); }
  bool string(string_t& v) override { return path.string(v); }
  bool binary(binary_t& v) override { return path.binary(v); }
  bool start_object(std::size_t n) override {
    keys.push_back(0);
    return path.start_object(n);
  }
  bool key(string_t& k) override {
    if (!keys.empty() && ++keys.back() > kJsonMaxKeys) {
      too_many = true;
      if (!path.levels.empty()) path.levels.back().key.clear();  // the path names the object
      return false;
    }
    return path.key(k);
  }
  bool end_object() override {
    if (!keys.empty()) keys.pop_back();
    return path.end_object();
  }
  bool start_array(std::size_t n) override {
    keys.push_back(0);
    return path.start_array(n);
  }
  bool end_array() override {
    if (!keys.empty()) keys.pop_back();
    return path.end_array();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

ojson parse_body(const std::string& body) {
  {
    KeyCount kc;
    ojson::sax_parse(body, &kc);
    if (kc.too_many) {
      const std::string where = kc.path.path();
      throw ApiError(400, fmt::format("request body: an object with more than {} keys{}", kJsonMaxKeys,
                                      where.empty() ? "" : " in '" + where + "'"),
                     "invalid_request_error", where, "invalid_json");
    }
  }
  ojson j;
  try {
    j = parse_json<ojson>(body, "request body");
  } catch (const JsonError& e) {
    if (e.too_deep)
      throw ApiError(400, fmt::format("request body: JSON nested deeper than {} levels", kJsonMaxDepth),
                     "invalid_request_error", "", "invalid_json");
    ErrorPath ep;
    ojson::sax_parse(body, &ep);
    const std::string where = ep.path();
    throw ApiError(400,
                   fmt::format("request body is not valid JSON (at byte {}{}): {}", ep.byte,
                               where.empty() ? "" : ", in '" + where + "'", ep.message.empty() ? e.what() : ep.message),
                   "invalid_request_error", where, "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object", "invalid_request_error");
  return j;
}

int prompt_limit(const Limits& lim) {
  return lim.max_prompt_tokens > 0 ? std::min(lim.max_prompt_tokens, lim.n_ctx - 1) : lim.n_ctx - 1;
}

namespace {

constexpr int64_t kMaxChoices = 16;      // n
constexpr int64_t kMaxTopLogprobs = 20;  // top_logprobs (OpenAI's limit)
constexpr size_t kMaxTools = 128;        // tools (OpenAI's limit)

const ojson* field(const ojson& b, const char* k) {
  auto it = b.find(k);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

double number(const ojson& b, const char* k, double dflt, double lo, double hi) {
  const ojson* v = field(b, k);
  if (!v) return dflt;
  if (!v->is_number()) bad(k, fmt::format("'{}' must be a number (got {})", k, v->type_name()));
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) bad(k, fmt::format("'{}' must be between {} and {} (got {})", k, lo, hi, d));
  return d;
}

int64_t integer(const ojson& b, const char* k, int64_t dflt, int64_t lo, int64_t hi) {
  const ojson* v = field(b, k);
  if (!v) return dflt;
  if (!v->is_number_integer()) {
    if (!v->is_number_float()) bad(k, fmt::format("'{}' must be an integer (got {})", k, v->type_name()));
    const double d = v->get<double>();
    if (std::floor(d) != d) bad(k, fmt::format("'{}' must be an integer (got {})", k, d));
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)))
      bad(k, fmt::format("'{}' must be between {} and {} (got {})", k, lo, hi, d));
    // 16.0 is accepted as 16
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad(k, fmt::format("'{}' must be between {} and {} (got {})", k, lo, hi, v->get<uint64_t>()));
  const int64_t x = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
  if (x < lo || x > hi) bad(k, fmt::format("'{}' must be between {} and {} (got {})", k, lo, hi, x));
  return x;
}

[[noreturn]] void too_long(const Limits& lim, bool chat, const std::string& size) {
  // what the operator can change: the prompt limit when --max-prompt-tokens set it, else the context
  const bool by_flag = lim.max_prompt_tokens > 0 && lim.max_prompt_tokens < lim.n_ctx - 1;
  const std::string fix = by_flag ? "kimi serve --max-prompt-tokens sets the limit"
                                  : "kimi serve -c N sets the context; coding agents send 20-100K-token prompts: "
                                    "-c 65536 or more";
  throw ApiError(400,
                 fmt::format("the prompt has {}, more than the limit of {} tokens (context {}; {})", size,
                             prompt_limit(lim), lim.n_ctx, fix),
                 "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
}

// Tokenizes a prompt text without working on more than the limit allows: a text that cannot fit
// at any tokenization (more bytes than limit * the longest token) is refused untokenized, and the
// tokenizer stops once the limit is passed.
std::vector<int32_t> encode_prompt(const tok::Tokenizer& tok, const std::string& text, const Limits& lim, bool chat) {
  const size_t limit = static_cast<size_t>(std::max(0, prompt_limit(lim)));
  if (lim.max_token_bytes > 0 && text.size() > limit * lim.max_token_bytes)
    too_long(lim, chat, fmt::format("{} bytes (at least {} tokens)", text.size(),
                                    (text.size() + lim.max_token_bytes - 1) / lim.max_token_bytes));
  std::vector<int32_t> ids = tok.encode_limited(text, limit, true);
  if (ids.size() > limit) too_long(lim, chat, fmt::format("more than {} tokens", limit));
  return ids;
}

bool boolean(const ojson& b, const char* k, bool dflt) {
  const ojson* v = field(b, k);
  if (!v) return dflt;
  if (!v->is_boolean()) bad(k, fmt::format("'{}' must be a boolean (got {})", k, v->type_name()));
  return v->get<bool>();
}

// The output constraint: response_format {"type":"json_object"} / {"type":"json_schema",
// "json_schema":{"schema":{...}}}, or llama.cpp's "json_schema": {...} / "grammar": "GBNF". At most
// one of them; an unsupported schema feature, a bad grammar or one beyond the compile budget is a 400
// naming it.
void constraint(const ojson& b, ParsedRequest& r, const Limits& lim) {
  std::string gbnf, param;
  auto one = [&](const std::string& p) {
    if (!param.empty()) bad(p, fmt::format("give only one of '{}' and '{}'", param, p));
    param = p;
  };
  if (const ojson* rf = field(b, "response_format")) {
    const ojson* t = rf->is_object() ? field(*rf, "type") : nullptr;
    if (t && *t == "json_object") {
      one("response_format");
      gbnf = grammar::json_object_gbnf();
    } else if (t && *t == "json_schema") {
      one("response_format");
      const ojson* js = field(*rf, "json_schema");
      if (js && !js->is_object()) bad("response_format.json_schema", "'response_format.json_schema' must be an object");
      const ojson* sc = js && js->is_object() ? field(*js, "schema") : nullptr;
      if (!sc) bad("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
      param = "response_format.json_schema.schema";
      gbnf = compile_schema(*sc, param, lim.budget);
    }
  }
  if (const ojson* js = field(b, "json_schema")) {
    one("json_schema");
    gbnf = compile_schema(*js, "json_schema", lim.budget);
  }
  if (const ojson* g = field(b, "grammar")) {
    one("grammar");
    if (!g->is_string()) bad("grammar", "'grammar' must be a string (GBNF)");
    gbnf = g->get<std::string>();
  }
  if (param.empty()) return;
  r.gen.grammar = compile_gbnf(gbnf, param, lim.budget);
  r.grammar_param = param;
}

// Fields shared by both endpoints.
void common_params(const ojson& b, ParsedRequest& r, const Limits& lim, bool chat) {
  if (!chat) constraint(b, r, lim);  // chat: before the prompt is rendered (parse_chat_request)
  if (const ojson* m = field(b, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    r.model = m->get<std::string>();
  }
  r.n = static_cast<int>(integer(b, "n", 1, 1, kMaxChoices));
  const int64_t best_of = integer(b, "best_of", r.n, 1, kMaxChoices);
  if (best_of != r.n) bad("best_of", fmt::format("only best_of = n is supported (got best_of {}, n {})", best_of, r.n));
  r.stream = boolean(b, "stream", false);
  if (const ojson* so = field(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  if (chat) {  // logprobs: bool, top_logprobs: 0..20 (needs logprobs)
    const bool lp = boolean(b, "logprobs", false);
    const int64_t top = integer(b, "top_logprobs", 0, 0, kMaxTopLogprobs);
    if (field(b, "top_logprobs") && !lp) bad("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    r.gen.logprobs = lp ? static_cast<int>(top) : -1;
  } else if (const ojson* lp = field(b, "logprobs")) {  // completions: logprobs = N alternatives
    if (lp->is_boolean()) r.gen.logprobs = lp->get<bool>() ? 0 : -1;
    else r.gen.logprobs = static_cast<int>(integer(b, "logprobs", 0, 0, kMaxTopLogprobs));
  }
  SamplerParams& sp = r.gen.sampler;
  const SamplerParams& def = lim.sampling;
  sp.temp = static_cast<float>(number(b, "temperature", def.temp, 0.0, 2.0));
  sp.top_p = static_cast<float>(number(b, "top_p", def.top_p, 0.0, 1.0));
  if (field(b, "top_p") && sp.top_p <= 0) bad("top_p", "'top_p' must be > 0");
  sp.top_k = static_cast<int>(integer(b, "top_k", def.top_k, 0, INT32_MAX));
  sp.min_p = static_cast<float>(number(b, "min_p", def.min_p, 0.0, 1.0));
  sp.repeat_penalty = static_cast<float>(number(b, "repeat_penalty", def.repeat_penalty, 1e-3, 100.0));
  // OpenAI's penalties: checked (a number in -2..2), not applied (repeat_penalty is the engine's)
  for (const char* k : {"presence_penalty", "frequency_penalty"}) number(b, k, 0.0, -2.0, 2.0);
  sp.repeat_last_n = def.repeat_last_n;
  if (const ojson* sd = field(b, "seed"); sd && sd->is_number_unsigned()) {
    sp.seed = sd->get<uint64_t>();  // any 64-bit seed
  } else if (sd) {
    sp.seed = static_cast<uint64_t>(integer(b, "seed", 0, INT64_MIN, INT64_MAX));
  } else if (lim.fixed_seed) {
    sp.seed = def.seed;
  } else {
    std::random_device rd;
    sp.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  r.gen.ignore_eos = boolean(b, "ignore_eos", false);
  // speculative decoding (docs/speculative.md): {"speculative": {"type", "n_max", "n_min"}}, or
  // llama-server's flat "speculative.n_max" / "speculative.n_min"
  auto spec_int = [&](const ojson& o, const char* k, const std::string& name) -> int {
    const ojson* v = field(o, k);
    if (!v) return -1;
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 256)
      bad(name, fmt::format("'{}' must be an integer in 0..256", name));
    return static_cast<int>(v->get<int64_t>());
  };
  if (const ojson* sp = field(b, "speculative")) {
    if (!sp->is_object())
      bad("speculative", "'speculative' must be an object: {\"type\": \"ngram\"|\"dspark\"|\"off\", \"n_max\": N, \"n_min\": N}");
    if (const ojson* t = field(*sp, "type")) {
      const std::string ts = t->is_string() ? t->get<std::string>() : std::string();
      if (ts == "off" || ts == "none") r.gen.spec_type = SpecType::Off;
      else if (ts == "ngram") r.gen.spec_type = SpecType::Ngram;
      else if (ts == "auto") r.gen.spec_type = SpecType::Auto;
      else if (ts == "dspark" && lim.dspark) r.gen.spec_type = SpecType::Dspark;
      else if (ts == "dspark")
        bad("speculative.type", "'speculative.type' dspark needs a draft model, which this server does not have (kimi serve -md FILE)");
      else bad("speculative.type", "'speculative.type' must be \"ngram\", \"dspark\", \"auto\" or \"off\"");
    }
    r.gen.spec_n_max = spec_int(*sp, "n_max", "speculative.n_max");
    r.gen.spec_n_min = spec_int(*sp, "n_min", "speculative.n_min");
  }
  if (const int v = spec_int(b, "speculative.n_max", "speculative.n_max"); v >= 0) r.gen.spec_n_max = v;
  if (const int v = spec_int(b, "speculative.n_min", "speculative.n_min"); v >= 0) r.gen.spec_n_min = v;
  if (const ojson* s = field(b, "stop")) {
    auto add = [&](const ojson& x) {
      if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      if (x.get<std::string>().empty()) bad("stop", "'stop' strings must not be empty");
      if (x.get<std::string>().size() > kMaxStopBytes)
        bad("stop", fmt::format("a 'stop' string may have at most {} bytes", kMaxStopBytes));
      r.gen.stop.push_back(x.get<std::string>());
    };
    if (s->is_array()) {
      if (s->size() > 4) bad("stop", "at most 4 stop sequences are allowed");
      for (const auto& x : *s) add(x);
    } else {
      add(*s);
    }
  }
  const int max_limit = lim.max_tokens > 0 ? lim.max_tokens : lim.n_ctx;
  const int max_prompt = prompt_limit(lim);
  const int64_t mt_dflt = chat ? (lim.default_max_tokens > 0 ? lim.default_max_tokens : max_limit) : 16;
  const char* key = field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.gen.max_tokens = static_cast<int>(integer(b, key, std::min<int64_t>(mt_dflt, max_limit), 1, max_limit));
  if (r.gen.grammar && lim.max_token_bytes > 0) {
    // the shortest sentence of the grammar must fit in max_tokens tokens of at most max_token_bytes
    const uint64_t need = r.gen.grammar->min_sentence_bytes();
    const uint64_t room = static_cast<uint64_t>(r.gen.max_tokens) * lim.max_token_bytes;
    if (need > room)
      bad(r.grammar_param, fmt::format("'{}': its shortest sentence has {} bytes, more than {} tokens can hold ({} = "
                                       "max_tokens, at most {} bytes each)",
                                       r.grammar_param, need, r.gen.max_tokens, r.gen.max_tokens, lim.max_token_bytes));
  }
  if (r.prompt.empty()) bad(chat ? "messages" : "prompt", "the prompt is empty");
  if (static_cast<int>(r.prompt.size()) > max_prompt) too_long(lim, chat, fmt::format("{} tokens", r.prompt.size()));
  if (lim.timeout_s > 0)
    r.gen.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(lim.timeout_s * 1000));
}

// The images of a chat request, decoded and preprocessed in the order of their parts.
struct ImageParts {
  const Limits& lim;
  std::vector<image::Patches> images;

  // an image_url part at `pw` (its role `role`)
  void add(const ojson& p, const std::string& pw, const std::string& role) {
    const std::string iw = pw + ".image_url";
    if (!lim.vision) bad(iw, no_vision_message(lim.model_path));
    if (role != "user" && role != "tool")
      bad(pw, fmt::format("'{}': images are allowed in user and tool messages only (this one is '{}')", pw, role));
    if (images.size() >= static_cast<size_t>(std::max(0, lim.image_max_count)))
      bad(pw, fmt::format("'{}': too many images: at most {} per request (kimi serve --image-max-count)", pw,
                          lim.image_max_count));
    if (!p.contains("image_url")) bad(iw, fmt::format("'{}' is required", iw));
    const ojson& iu = p["image_url"];
    const ojson* url = &iu;
    std::string uw = iw;
    if (iu.is_object()) {
      if (!iu.contains("url")) bad(iw + ".url", fmt::format("'{}.url' is required", iw));
      url = &iu["url"];
      uw = iw + ".url";
      if (iu.contains("detail") && !iu["detail"].is_null()) {  // accepted; every image is read at full resolution
        const ojson& d = iu["detail"];
        if (!d.is_string() || (d != "auto" && d != "low" && d != "high"))
          bad(iw + ".detail", fmt::format("'{}.detail' must be \"auto\", \"low\" or \"high\"", iw));
      }
    }
    if (!url->is_string()) bad(uw, fmt::format("'{}' must be a string (a data: URL)", uw));
    images.push_back(decode_data_url(url->get_ref<const std::string&>(), uw, lim));
    // the images' tokens alone over the prompt limit: refused before more images are decoded (the
    // patches a request holds stay bounded by the context)
    tokens += images.back().size.tokens;
    if (tokens > static_cast<int64_t>(prompt_limit(lim)))
      too_long(lim, true, fmt::format("more than {} tokens: the images up to '{}' alone are {} tokens", prompt_limit(lim),
                                      pw, tokens));
  }
  int64_t tokens = 0;

  static image::Patches decode_data_url(const std::string& u, const std::string& uw, const Limits& lim) {
    auto starts = [&](const char* pre) {
      const size_t n = std::strlen(pre);
      if (u.size() < n) return false;
      for (size_t i = 0; i < n; ++i)
        if (std::tolower(static_cast<unsigned char>(u[i])) != pre[i]) return false;
      return true;
    };
    if (starts("http://") || starts("https://"))
      bad(uw, fmt::format("'{}': the server fetches nothing from the network; send the image inline as a data: URL "
                          "(data:image/png;base64,...)",
                          uw));
    if (!starts("data:"))
      bad(uw, fmt::format("'{}' must be a data: URL (data:image/png;base64,...)", uw));
    const size_t comma = u.find(',');
    if (comma == std::string::npos) bad(uw, fmt::format("'{}': the data: URL has no ',' before its data", uw));
    std::string head = u.substr(5, comma - 5);
    for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const std::string b64 = ";base64";
    if (head.size() < b64.size() || head.compare(head.size() - b64.size(), b64.size(), b64) != 0)
      bad(uw, fmt::format("'{}': the data: URL must be base64 (data:image/png;base64,...)", uw));
    const std::string mime = head.substr(0, head.find(';'));
    const image::Format mf = image::format_from_mime(mime);
    if (mf == image::Format::Unknown)
      bad(uw, fmt::format("'{}': the media type '{}' is not one of image/png, image/jpeg, image/webp, image/gif", uw, mime));
    const size_t n64 = u.size() - comma - 1;
    if (n64 / 4 * 3 > lim.image_max_bytes + 2)
      bad(uw, fmt::format("'{}': the image is larger than {} bytes (kimi serve --image-max-bytes)", uw, lim.image_max_bytes));
    std::string bytes;
    if (!tok::base64_decode(std::string_view(u).substr(comma + 1), bytes))
      bad(uw, fmt::format("'{}': the data is not valid base64", uw));
    if (bytes.size() > lim.image_max_bytes)
      bad(uw, fmt::format("'{}': the image is {} bytes, more than {} (kimi serve --image-max-bytes)", uw, bytes.size(),
                          lim.image_max_bytes));
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    const image::Format f = image::sniff(data, bytes.size());
    if (f == image::Format::Unknown)
      bad(uw, fmt::format("'{}': the data is not a PNG, JPEG, WebP or GIF image", uw));
    if (f != mf)
      bad(uw, fmt::format("'{}': the media type is {} but the data is a {} image", uw, mime, image::format_name(f)));
    image::Limits il;
    il.max_bytes = lim.image_max_bytes;
    il.max_pixels = lim.image_max_pixels;
    try {
      return lim.vision->preprocess(image::decode(data, bytes.size(), il, uw));
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception& e) {  // kimi::Error naming the image, the format and what is wrong
      bad(uw, fmt::format("'{}': {}", uw, e.what()));
    }
  }
};

void check_content(const ojson& c, const std::string& where, bool allow_null, ImageParts* images = nullptr,
                   const std::string& role = "") {
  if (c.is_null()) {
    if (!allow_null) bad(where, fmt::format("'{}' is required", where));
    return;
  }
  if (c.is_string()) return;
  if (!c.is_array()) bad(where, fmt::format("'{}' must be a string or an array of content parts", where));
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string pw = fmt::format("{}[{}]", where, i);
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad(pw, fmt::format("'{}' must be an object with a string 'type'", pw));
    const std::string t = p["type"].get<std::string>();
    if (t == "text") {
      if (!p.contains("text") || !p["text"].is_string()) bad(pw, fmt::format("'{}.text' must be a string", pw));
    } else if (t == "image_url" && images) {
      images->add(p, pw, role);
    } else {
      bad(pw, fmt::format("content part type '{}' is not supported (text only)", t));
    }
  }
}

// The prompt's <|media_pad|> runs (image k's tokens, in order) become image keys; their rows in the
// tower's output are recorded (job.h PromptImages).
std::shared_ptr<const PromptImages> key_images(std::vector<int32_t>& prompt, std::vector<image::Patches> imgs,
                                               const tok::Tokenizer& tok) {
  auto pi = std::make_shared<PromptImages>();
  pi->placeholder = tok.token_id("<|media_pad|>");
  pi->row.assign(prompt.size(), -1);
  size_t k = 0;
  int64_t j = 0, row = 0;
  uint64_t h = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] != pi->placeholder) continue;
    while (k < imgs.size() && j == imgs[k].size.tokens) ++k, j = 0;
    if (k >= imgs.size()) throw Error("internal: more image positions in the prompt than the images have tokens");
    if (j == 0) h = image::content_hash(imgs[k]);
    prompt[i] = image_key(h, j++);
    pi->row[i] = static_cast<int32_t>(row++);
  }
  int64_t want = 0;
  for (const auto& im : imgs) want += im.size.tokens;
  if (row != want)
    throw Error(fmt::format("internal: the prompt has {} image positions, the images {} tokens", row, want));
  pi->n_rows = row;
  pi->images = std::move(imgs);
  return pi;
}

}  // namespace

ParsedRequest parse_chat_request(const std::string& body_text, const tok::Tokenizer& tok, const Limits& lim) {
  ojson b = parse_body(body_text);
  ParsedRequest r;
  constraint(b, r, lim);  // first: a schema beyond the compile budget is named as such, not as a long prompt
  const ojson* msgs = field(b, "messages");
  if (!msgs) bad("messages", "'messages' is required");
  if (!msgs->is_array()) bad("messages", "'messages' must be an array");
  if (msgs->empty()) bad("messages", "'messages' must not be empty");
  ojson req = ojson::object();  // what the template sees
  ojson out_msgs = ojson::array();
  ImageParts images{lim, {}};
  std::vector<std::string> dyn_names;  // tools declared by system messages
  ojson dyn_tools = ojson::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    ojson m = (*msgs)[i];
    const std::string w = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(w, fmt::format("'{}' must be an object", w));
    if (!m.contains("role") || !m["role"].is_string()) bad(w + ".role", fmt::format("'{}.role' must be a string", w));
    std::string role = m["role"].get<std::string>();
    if (role == "developer") m["role"] = role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(w + ".role", fmt::format("'{}.role' is '{}'; expected one of system, developer, user, assistant, tool", w, role));
    if (m.contains("name") && !m["name"].is_null() && !m["name"].is_string())
      bad(w + ".name", fmt::format("'{}.name' must be a string", w));
    const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    check_content(m.contains("content") ? m["content"] : ojson(nullptr), w + ".content",
                  role == "assistant" || (role == "system" && m.contains("tools") && !m["tools"].is_null()), &images,
                  role);
    if (role == "assistant") {
      for (const char* k : {"reasoning_content", "reasoning"})
        if (m.contains(k) && !m[k].is_null() && !m[k].is_string())
          bad(w + "." + k, fmt::format("'{}.{}' must be a string", w, k));
    }
    if (has_calls) {
      if (role != "assistant") bad(w + ".tool_calls", fmt::format("'{}.tool_calls' is only allowed for the assistant", w));
      const ojson& calls = m["tool_calls"];
      if (!calls.is_array()) bad(w + ".tool_calls", fmt::format("'{}.tool_calls' must be an array", w));
      for (size_t j = 0; j < calls.size(); ++j) {
        const ojson& c = calls[j];
        const std::string cw = fmt::format("{}.tool_calls[{}]", w, j);
        if (!c.is_object()) bad(cw, fmt::format("'{}' must be an object", cw));
        if (c.contains("id") && !c["id"].is_null() && !c["id"].is_string()) bad(cw + ".id", fmt::format("'{}.id' must be a string", cw));
        if (!c.contains("function") || !c["function"].is_object())
          bad(cw + ".function", fmt::format("'{}.function' must be an object", cw));
        const ojson& fn = c["function"];
        if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
          bad(cw + ".function.name", fmt::format("'{}.function.name' must be a non-empty string", cw));
        if (fn.contains("arguments") && !fn["arguments"].is_null()) {
          const ojson& a = fn["arguments"];
          if (a.is_string()) {
            const ojson pa = try_parse_json<ojson>(a.get<std::string>());
            if (!a.get<std::string>().empty() && (pa.is_discarded() || !pa.is_object()))
              bad(cw + ".function.arguments", fmt::format("'{}.function.arguments' must be a JSON object (as a string)", cw));
          } else if (!a.is_object()) {
            bad(cw + ".function.arguments", fmt::format("'{}.function.arguments' must be a string or an object", cw));
          }
        }
      }
    }
    if (role == "tool" && m.contains("tool_call_id") && !m["tool_call_id"].is_null() && !m["tool_call_id"].is_string())
      bad(w + ".tool_call_id", fmt::format("'{}.tool_call_id' must be a string", w));
    // dynamic tools (K3: a system message may declare tools): checked as request tools, and callable
    if (m.contains("tools") && !m["tools"].is_null()) {
      if (role != "system") bad(w + ".tools", fmt::format("'{}.tools': only a system message may declare tools (role '{}')", w, role));
      for (const std::string& n : check_tools(m["tools"], w + ".tools")) {
        if (std::find(dyn_names.begin(), dyn_names.end(), n) != dyn_names.end())
          bad(w + ".tools", fmt::format("'{}.tools': the tool name '{}' is declared twice", w, n));
        dyn_names.push_back(n);
      }
      for (const auto& t : m["tools"]) dyn_tools.push_back(t);
    }
    out_msgs.push_back(std::move(m));
  }
  req["messages"] = std::move(out_msgs);
  check_tool_call_ids(req["messages"]);
  std::vector<std::string> tool_names;
  if (const ojson* tools = field(b, "tools")) {
    tool_names = check_tools(*tools);
    if (!tools->empty()) req["tools"] = *tools;
  }
  for (size_t i = 0; i < dyn_names.size(); ++i) {  // one name space: request tools and message tools together
    if (std::find(tool_names.begin(), tool_names.end(), dyn_names[i]) != tool_names.end())
      bad("tools", fmt::format("'tools': the tool name '{}' is declared both in 'tools' and by a system message", dyn_names[i]));
  }
  ojson all_tools = req.contains("tools") ? req["tools"] : ojson::array();
  for (const auto& t : dyn_tools) all_tools.push_back(t);
  tool_names.insert(tool_names.end(), dyn_names.begin(), dyn_names.end());
  if (const ojson* tc = field(b, "tool_choice")) {
    check_tool_choice(*tc, tool_names);
    // the K3 template knows only the strings: a named function is passed as "required"
    req["tool_choice"] = tc->is_string() ? *tc : ojson("required");
  }
  if (const ojson* rf = field(b, "response_format")) {
    if (!rf->is_object()) bad("response_format", "'response_format' must be an object");
    if (const ojson* t = field(*rf, "type")) {
      if (!t->is_string() || (*t != "text" && *t != "json_object" && *t != "json_schema"))
        bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    if (const ojson* js = field(*rf, "json_schema")) {
      if (!js->is_object()) bad("response_format.json_schema", "'response_format.json_schema' must be an object");
      // OpenAI's shape: a name (^[a-zA-Z0-9_-]{1,64}$), strict a boolean
      const ojson* name = field(*js, "name");
      if (!name) bad("response_format.json_schema.name", "'response_format.json_schema.name' is required");
      if (!name->is_string() || !valid_tool_name(name->get_ref<const std::string&>()))
        bad("response_format.json_schema.name",
            fmt::format("'response_format.json_schema.name' must match ^[a-zA-Z0-9_-]{{1,64}}$ (got {})", name->dump()));
      if (const ojson* st = field(*js, "strict"); st && !st->is_boolean())
        bad("response_format.json_schema.strict", fmt::format("'response_format.json_schema.strict' must be a boolean (got {})", st->dump()));
    }
    req["response_format"] = *rf;
  }
  // what vLLM and SGLang take for K3: chat_template_kwargs thinking / thinking_effort /
  // preserve_thinking (the request's own fields win where both are given)
  const ojson* kw = field(b, "chat_template_kwargs");
  if (kw && !kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  auto kwarg = [&](const char* k) -> const ojson* { return kw ? field(*kw, k) : nullptr; };
  bool thinking = true;
  const ojson* th_effort = nullptr;  // thinking.effort (Kimi's API)
  if (const ojson* th = field(b, "thinking")) {
    // a boolean, or Kimi's {"type": "enabled" | "disabled", "effort": ...}
    if (th->is_object()) {
      const ojson* ty = field(*th, "type");
      if (ty && (!ty->is_string() || (*ty != "enabled" && *ty != "disabled" && *ty != "adaptive")))
        bad("thinking.type", fmt::format("'thinking.type' must be \"enabled\" or \"disabled\" (got {})", ty->dump()));
      thinking = !ty || *ty != "disabled";
      th_effort = field(*th, "effort");
    } else if (th->is_boolean()) {
      thinking = th->get<bool>();
    } else {
      bad("thinking", fmt::format("'thinking' must be a boolean or an object {{\"type\": \"enabled\" | \"disabled\"}} (got {})",
                                  th->dump()));
    }
  } else if (const ojson* kt = kwarg("thinking")) {
    if (!kt->is_boolean()) bad("chat_template_kwargs.thinking", "'chat_template_kwargs.thinking' must be a boolean");
    thinking = kt->get<bool>();
  }
  req["thinking"] = thinking;
  if (const ojson* pt = kwarg("preserve_thinking")) {
    if (!pt->is_boolean()) bad("chat_template_kwargs.preserve_thinking", "'chat_template_kwargs.preserve_thinking' must be a boolean");
    if (!pt->get<bool>())  // the reasoning of earlier assistant turns is not rendered
      for (auto& m : req["messages"])
        if (m.is_object() && m.value("role", "") == "assistant") {
          m.erase("reasoning_content");
          m.erase("reasoning");
        }
  }
  // the effort goes to the template, which refuses what the K3 template refuses, with its message
  const char* effort_key = nullptr;
  if (const ojson* e = field(b, "thinking_effort")) {
    req["thinking_effort"] = *e;
    effort_key = "thinking_effort";
  } else if (th_effort) {
    req["thinking_effort"] = *th_effort;
    effort_key = "thinking.effort";
  } else if (const ojson* ke = kwarg("thinking_effort")) {
    req["thinking_effort"] = *ke;
    effort_key = "chat_template_kwargs.thinking_effort";
  } else if (const ojson* oe = field(b, "reasoning_effort")) {
    // OpenAI's efforts through the map of api_responses.h (none: thinking off; xhigh: max)
    ojson m = ojson::object();
    const bool known = oe->is_string() && (*oe == "max" || map_reasoning_effort(oe->get<std::string>(), m));
    if (!known)
      bad("reasoning_effort", fmt::format("'reasoning_effort' is {}; expected one of none, minimal, low, medium, high, "
                                          "xhigh (or thinking_effort: low, medium, high, max)", oe->dump()));
    if (*oe == "max") m["thinking_effort"] = "max";
    if (m.contains("thinking_effort")) req["thinking_effort"] = m["thinking_effort"];
    if (m.contains("thinking") && !m["thinking"].get<bool>()) req["thinking"] = thinking = false;
  }
  try {
    r.prompt = render_chat_tokens(req, tok, lim, &r.rendered, images.images.empty() ? nullptr : &images.images);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {  // kimi::Error from the template, or a JSON type error
    const std::string m = e.what();
    if (effort_key && m.find("thinking_effort") != std::string::npos) bad(effort_key, m);
    bad("messages", "cannot render the chat: " + m);
  }
  if (!images.images.empty()) r.gen.images = key_images(r.prompt, std::move(images.images), tok);
  r.gen.chat = true;
  r.gen.start_in_think = thinking;
  // the thinking budget (an extension; Anthropic's thinking.budget_tokens arrives here): a hard cap
  // on the think channel's tokens, the server's --reasoning-budget when not given; no effect without thinking
  const int64_t budget = integer(b, "thinking_budget_tokens", lim.thinking_budget, 0, INT32_MAX);
  r.gen.thinking_budget = thinking ? static_cast<int>(budget) : -1;
  common_params(b, r, lim, true);
  // tool calls held to the tools' grammar (tool_grammar.h): required / named / auto / none;
  // parallel_tool_calls false: one call at most (without tools it changes nothing)
  const bool parallel = boolean(b, "parallel_tool_calls", true);
  set_tool_constraint(r.gen, all_tools, field(b, "tool_choice") ? *field(b, "tool_choice") : ojson(), thinking, !parallel);
  return r;
}

ParsedRequest parse_completion_request(const std::string& body_text, const tok::Tokenizer& tok, const Limits& lim) {
  ojson b = parse_body(body_text);
  ParsedRequest r;
  const ojson* p = field(b, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  if (field(b, "suffix")) bad("suffix", "'suffix' is not supported");
  if (boolean(b, "echo", false)) bad("echo", "'echo' is not supported");
  if (const ojson* rf = field(b, "response_format")) {
    if (!rf->is_object()) bad("response_format", "'response_format' must be an object");
    if (const ojson* t = field(*rf, "type"))
      if (!t->is_string() || (*t != "text" && *t != "json_object" && *t != "json_schema"))
        bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  }
  if (p->is_string()) {
    r.prompt = encode_prompt(tok, p->get_ref<const std::string&>(), lim, false);
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = encode_prompt(tok, (*p)[0].get_ref<const std::string&>(), lim, false);
  } else if (p->is_array()) {
    if (p->size() > static_cast<size_t>(std::max(0, prompt_limit(lim))))
      too_long(lim, false, fmt::format("{} tokens", p->size()));
    const int64_t nv = tok.n_vocab();
    for (size_t i = 0; i < p->size(); ++i) {
      const ojson& t = (*p)[i];
      if (!t.is_number_integer())
        bad("prompt", "'prompt' must be a string, an array with one string, or an array of token ids");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= nv) bad("prompt", fmt::format("'prompt[{}]': token id {} is out of range 0..{}", i, id, nv - 1));
      r.prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    bad("prompt", "'prompt' must be a string, an array with one string, or an array of token ids");
  }
  r.gen.chat = false;
  common_params(b, r, lim, false);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Checks shared by the APIs (api.h)

namespace {
// "grammar: grammar: ..." reads badly: the compilers' own prefix is dropped when the field says it
std::string named(const std::string& param, const char* what) {
  std::string_view w(what);
  if (w.rfind(param + ": ", 0) == 0) w.remove_prefix(param.size() + 2);
  return fmt::format("{}: {}", param, w);
}
}  // namespace

std::shared_ptr<const grammar::Grammar> compile_gbnf(const std::string& gbnf, const std::string& param,
                                                     const grammar::Budget& budget) {
  try {
    auto g = grammar::Grammar::parse(gbnf, budget);
    grammar::Matcher first(g);  // its first state within the matcher's limits (LimitError otherwise)
    return g;
  } catch (const grammar::LimitError& e) {
    throw ApiError(400, fmt::format("{} (limit {})", named(param, e.what()), e.limit), "invalid_request_error", param,
                   "grammar_too_complex");
  } catch (const grammar::GrammarError& e) {
    throw ApiError(400, named(param, e.what()), "invalid_request_error", param, "invalid_grammar");
  } catch (const std::bad_alloc&) {
    throw ApiError(400, fmt::format("{}: the grammar needs more memory than a request may use", param),
                   "invalid_request_error", param, "grammar_too_complex");
  } catch (const std::length_error&) {
    throw ApiError(400, fmt::format("{}: the grammar needs more memory than a request may use", param),
                   "invalid_request_error", param, "grammar_too_complex");
  }
}

std::string compile_schema(const ojson& schema, const std::string& param, const grammar::Budget& budget) {
  try {
    return grammar::schema_to_gbnf(schema, budget);
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, fmt::format("{}: {}", param, e.what()), "invalid_request_error", param, "unsupported_schema");
  } catch (const grammar::LimitError& e) {
    throw ApiError(400, fmt::format("{}: {} (limit {})", param, e.what(), e.limit), "invalid_request_error", param,
                   "grammar_too_complex");
  } catch (const std::bad_alloc&) {
    throw ApiError(400, fmt::format("{}: the schema needs more memory than a request may use", param),
                   "invalid_request_error", param, "grammar_too_complex");
  } catch (const std::length_error&) {
    throw ApiError(400, fmt::format("{}: the schema needs more memory than a request may use", param),
                   "invalid_request_error", param, "grammar_too_complex");
  }
}

bool valid_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}

void check_tool_name(const ojson& name, const std::string& param) {
  if (!name.is_string()) bad(param, fmt::format("'{}' must be a string", param));
  if (!valid_tool_name(name.get_ref<const std::string&>()))
    bad(param, fmt::format("'{}' must match ^[a-zA-Z0-9_-]{{1,64}}$ (got {})", param, name.dump()));
}

namespace {

// JSON Schema (draft 2020-12 / OpenAI function parameters) structure: every keyword this server or the
// grammar compiler reads has the right shape, types are JSON Schema's, $ref points at an existing
// #/$defs or #/definitions entry. Keywords the grammar engine cannot hold an answer to (pattern,
// minimum, format, ...) are accepted here: tool calls are not grammar-constrained (docs/server.md).
void check_schema_node(const ojson& s, const ojson& root, const std::string& where, int depth) {
  if (depth > kJsonMaxDepth) bad(where, fmt::format("'{}': the schema is nested too deeply", where));
  if (s.is_boolean()) return;
  if (!s.is_object()) bad(where, fmt::format("'{}' must be a JSON schema (an object or a boolean)", where));
  static const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
  if (auto it = s.find("type"); it != s.end()) {
    auto one = [&](const ojson& t) {
      if (!t.is_string() || !kTypes.count(t.get<std::string>()))
        bad(where + ".type", fmt::format("'{}.type' must be one of object, array, string, number, integer, boolean, null "
                                         "(got {})",
                                         where, t.dump()));
    };
    if (it->is_array()) {
      if (it->empty()) bad(where + ".type", fmt::format("'{}.type' must not be an empty list", where));
      for (const auto& t : *it) one(t);
    } else {
      one(*it);
    }
  }
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) bad(where + ".properties", fmt::format("'{}.properties' must be an object", where));
    for (auto p = it->begin(); p != it->end(); ++p)
      check_schema_node(p.value(), root, where + ".properties." + p.key(), depth + 1);
  }
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) bad(where + ".required", fmt::format("'{}.required' must be an array of strings", where));
    for (const auto& r : *it)
      if (!r.is_string()) bad(where + ".required", fmt::format("'{}.required' must be an array of strings", where));
  }
  for (const char* k : {"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else"})
    if (auto it = s.find(k); it != s.end()) {
      if (std::string(k) == "items" && it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i)
          check_schema_node((*it)[i], root, fmt::format("{}.items[{}]", where, i), depth + 1);
      } else {
        check_schema_node(*it, root, where + "." + k, depth + 1);
      }
    }
  for (const char* k : {"anyOf", "oneOf", "allOf", "prefixItems"})
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_array() || it->empty()) bad(where + "." + k, fmt::format("'{}.{}' must be a non-empty array of schemas", where, k));
      for (size_t i = 0; i < it->size(); ++i) check_schema_node((*it)[i], root, fmt::format("{}.{}[{}]", where, k, i), depth + 1);
    }
  for (const char* k : {"$defs", "definitions"})
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_object()) bad(where + "." + k, fmt::format("'{}.{}' must be an object of schemas", where, k));
      for (auto d = it->begin(); d != it->end(); ++d) check_schema_node(d.value(), root, where + "." + k + "." + d.key(), depth + 1);
    }
  if (auto it = s.find("enum"); it != s.end())
    if (!it->is_array() || it->empty()) bad(where + ".enum", fmt::format("'{}.enum' must be a non-empty array", where));
  for (const char* k : {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"})
    if (auto it = s.find(k); it != s.end())
      if (!it->is_number_unsigned()) bad(where + "." + k, fmt::format("'{}.{}' must be a non-negative integer", where, k));
  for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
    if (auto it = s.find(k); it != s.end())
      if (!it->is_number()) bad(where + "." + k, fmt::format("'{}.{}' must be a number", where, k));
  for (const char* k : {"pattern", "format", "description", "title"})
    if (auto it = s.find(k); it != s.end())
      if (!it->is_string()) bad(where + "." + k, fmt::format("'{}.{}' must be a string", where, k));
  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) bad(where + ".$ref", fmt::format("'{}.$ref' must be a string", where));
    const std::string ref = it->get<std::string>();
    if (!grammar::resolve_ref(root, ref))
      bad(where + ".$ref", fmt::format("'{}.$ref' ({}) is not a JSON pointer to a part of this schema (#/$defs/NAME, "
                                       "#/$defs/NAME/properties/KEY, ...)",
                                       where, ref));
  }
}

}  // namespace

void check_tool_parameters(const ojson& parameters, const std::string& param) {
  if (!parameters.is_object()) bad(param, fmt::format("'{}' must be a JSON schema object", param));
  if (parameters.contains("type") && parameters["type"] != "object")
    bad(param + ".type", fmt::format("'{}' must be a schema of \"type\": \"object\" (got {})", param, parameters["type"].dump()));
  check_schema_node(parameters, parameters, param, 0);
}

std::vector<std::string> check_tools(const ojson& tools, const std::string& param) {
  if (!tools.is_array()) bad(param, fmt::format("'{}' must be an array", param));
  if (tools.size() > kMaxTools) bad(param, fmt::format("'{}' has {} tools; at most {} are allowed", param, tools.size(), kMaxTools));
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string w = fmt::format("{}[{}]", param, i);
    if (!t.is_object()) bad(w, fmt::format("'{}' must be an object", w));
    if (t.contains("type") && t["type"] != "function") bad(w + ".type", fmt::format("'{}.type' must be \"function\"", w));
    if (!t.contains("function") || !t["function"].is_object()) bad(w + ".function", fmt::format("'{}.function' must be an object", w));
    const ojson& fn = t["function"];
    if (!fn.contains("name")) bad(w + ".function.name", fmt::format("'{}.function.name' is required", w));
    check_tool_name(fn["name"], w + ".function.name");
    const std::string name = fn["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), name) != names.end())
      bad(w + ".function.name", fmt::format("'{}.function.name': the tool name '{}' is declared twice", w, name));
    names.push_back(name);
    if (fn.contains("description") && !fn["description"].is_null() && !fn["description"].is_string())
      bad(w + ".function.description", fmt::format("'{}.function.description' must be a string", w));
    if (fn.contains("strict") && !fn["strict"].is_null() && !fn["strict"].is_boolean())
      bad(w + ".function.strict", fmt::format("'{}.function.strict' must be a boolean", w));
    if (fn.contains("parameters") && !fn["parameters"].is_null()) check_tool_parameters(fn["parameters"], w + ".function.parameters");
  }
  return names;
}

void check_tool_choice(const ojson& tc, const std::vector<std::string>& tool_names, const std::string& param) {
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s != "none" && s != "auto" && s != "required")
      bad(param, fmt::format("'{}' must be \"none\", \"auto\", \"required\" or a function object", param));
    if (s == "required" && tool_names.empty()) bad(param, fmt::format("'{}' is \"required\" but no tools are given", param));
    return;
  }
  if (!tc.is_object()) bad(param, fmt::format("'{}' must be a string or an object", param));
  if (tc.contains("type") && tc["type"] != "function") bad(param + ".type", fmt::format("'{}.type' must be \"function\"", param));
  const ojson* fn = tc.contains("function") && tc["function"].is_object() ? &tc["function"] : nullptr;
  if (!fn || !fn->contains("name") || !(*fn)["name"].is_string())
    bad(param + ".function.name", fmt::format("'{}.function.name' must be a string", param));
  const std::string name = (*fn)["name"].get<std::string>();
  if (std::find(tool_names.begin(), tool_names.end(), name) == tool_names.end())
    bad(param + ".function.name", fmt::format("'{}.function.name' is '{}', which is not one of the declared tools", param, name));
}

void check_tool_call_ids(const ojson& messages, const std::string& param) {
  if (!messages.is_array()) return;
  std::set<std::string> issued;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) continue;
    const std::string w = fmt::format("{}[{}]", param, i);
    const ojson* role = m.contains("role") && m["role"].is_string() ? &m["role"] : nullptr;
    if (!role) continue;
    if (*role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      const ojson& calls = m["tool_calls"];
      for (size_t j = 0; j < calls.size(); ++j) {
        const std::string cw = fmt::format("{}.tool_calls[{}]", w, j);
        const ojson& c = calls[j];
        if (!c.is_object() || !c.contains("id") || !c["id"].is_string() || c["id"].get_ref<const std::string&>().empty())
          bad(cw + ".id", fmt::format("'{}.id' must be a non-empty string", cw));
        const std::string& id = c["id"].get_ref<const std::string&>();
        if (!issued.insert(id).second) bad(cw + ".id", fmt::format("'{}.id': the tool call id '{}' is used twice", cw, id));
        if (c.contains("function") && c["function"].is_object() && c["function"].contains("name"))
          check_tool_name(c["function"]["name"], cw + ".function.name");
      }
    } else if (*role == "tool") {
      if (!m.contains("tool_call_id") || m["tool_call_id"].is_null())
        bad(w + ".tool_call_id", fmt::format("'{}.tool_call_id' is required for a tool message", w));
      if (!m["tool_call_id"].is_string()) bad(w + ".tool_call_id", fmt::format("'{}.tool_call_id' must be a string", w));
      const std::string& id = m["tool_call_id"].get_ref<const std::string&>();
      if (!issued.count(id))
        bad(w + ".tool_call_id",
            fmt::format("'{}.tool_call_id' is '{}', which no earlier assistant message issued (tool_calls[].id)", w, id));
    }
  }
}

std::vector<int32_t> render_chat_tokens(const ojson& template_request, const tok::Tokenizer& tok, const Limits& lim,
                                        std::string* rendered, const std::vector<image::Patches>* images) {
  const std::string marked = tok::render_chat_marked(tok::ChatRequest::from_json(template_request));
  std::vector<std::pair<size_t, size_t>> user;
  std::string text = tok::strip_user_marks(marked, &user);
  const size_t limit = static_cast<size_t>(std::max(0, prompt_limit(lim)));
  if (lim.max_token_bytes > 0 && text.size() > limit * lim.max_token_bytes)
    too_long(lim, true, fmt::format("{} bytes (at least {} tokens)", text.size(),
                                    (text.size() + lim.max_token_bytes - 1) / lim.max_token_bytes));
  // the special tokens by first byte, longest first (encode's leftmost-longest match)
  std::vector<std::vector<int32_t>> by_byte(256);
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.is_special(id) && !tok.token_to_piece(id).empty())
      by_byte[static_cast<unsigned char>(tok.token_to_piece(id)[0])].push_back(id);
  for (auto& v : by_byte)
    std::stable_sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
      return tok.token_to_piece(a).size() > tok.token_to_piece(b).size();
    });
  // images: the template's placeholder of each image part becomes its media tokens
  const std::string_view ph = tok::kImagePlaceholder;
  size_t n_img = 0;
  int32_t media_begin = -1, media_content = -1, media_pad = -1, media_end = -1;
  if (images) {
    media_begin = tok.token_id("<|media_begin|>");
    media_content = tok.token_id("<|media_content|>");
    media_pad = tok.token_id("<|media_pad|>");
    media_end = tok.token_id("<|media_end|>");
    if (media_begin < 0 || media_content < 0 || media_pad < 0 || media_end < 0)
      throw ApiError(400, "the model's vocabulary lacks the media tokens (<|media_begin|>, <|media_content|>, "
                          "<|media_pad|>, <|media_end|>): it cannot read images", "invalid_request_error", "messages");
  }
  // special tokens are matched only in the template's own text: [from, to) between user ranges
  std::vector<int32_t> ids;
  size_t seg = 0;  // start of the text not yet encoded
  auto encode_to = [&](size_t end) {
    if (end > seg && ids.size() <= limit) {
      const std::vector<int32_t> part = tok.encode_limited(std::string_view(text).substr(seg, end - seg), limit - ids.size(), false);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    seg = end;
  };
  size_t u = 0;
  for (size_t pos = 0; pos < text.size() && ids.size() <= limit;) {
    if (u < user.size() && pos >= user[u].first) {  // user text: no special token inside
      pos = user[u].second;
      ++u;
      continue;
    }
    const size_t trusted_end = u < user.size() ? user[u].first : text.size();
    if (images && text.compare(pos, ph.size(), ph) == 0 && pos + ph.size() <= trusted_end) {
      encode_to(pos);
      if (n_img >= images->size()) throw Error("the chat has more image parts than images");
      const image::Patches& im = (*images)[n_img++];
      ids.push_back(media_begin);
      const std::vector<int32_t> wh = tok.encode(fmt::format("image {}x{}", im.width, im.height), false);
      ids.insert(ids.end(), wh.begin(), wh.end());
      ids.push_back(media_content);
      if (ids.size() + static_cast<size_t>(im.size.tokens) > limit + 1)
        too_long(lim, true, fmt::format("more than {} tokens (image {} alone is {} tokens)", limit, n_img, im.size.tokens));
      ids.insert(ids.end(), static_cast<size_t>(im.size.tokens), media_pad);
      ids.push_back(media_end);
      pos += ph.size();
      seg = pos;
      continue;
    }
    int32_t hit = -1;
    for (int32_t id : by_byte[static_cast<unsigned char>(text[pos])]) {
      const std::string& p = tok.token_to_piece(id);
      if (pos + p.size() <= trusted_end && text.compare(pos, p.size(), p) == 0) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      ++pos;
      continue;
    }
    encode_to(pos);
    ids.push_back(hit);
    pos += tok.token_to_piece(hit).size();
    seg = pos;
  }
  encode_to(text.size());
  if (ids.size() > limit) too_long(lim, true, fmt::format("more than {} tokens", limit));
  if (images && n_img != images->size())
    throw ApiError(400, fmt::format("{} of the {} images are not in the rendered prompt (images go in user and tool "
                                    "messages)", images->size() - n_img, images->size()),
                   "invalid_request_error", "messages");
  if (rendered) *rendered = std::move(text);
  return ids;
}

}  // namespace kimi::server
