// libFuzzer target: the JSON schema -> GBNF converter (src/server/json_schema.cpp) and the GBNF it
// makes, as `kimi serve` runs them for "json_schema" / response_format / tool parameters. The input
// is a JSON schema (parsed depth-limited, as request bodies are), optionally followed by a NUL byte
// and a JSON document. Under the compile budget a schema must convert or end in SchemaError /
// LimitError; the GBNF of a converted schema must compile (only a budget limit, an empty language or
// a schema that refers to itself before any character, {"$defs":{"n":{"anyOf":[{"$ref":"#/$defs/n"},
// ...]}}}, which is left-recursive, may refuse it: never a syntax error or an undefined rule). A document the grammar
// accepts as a whole sentence must be valid JSON. Anything else (a crash, a sanitizer report, a
// hang, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/grammar.h"
#include "util/json.h"

using namespace kimi::server::grammar;
using ojson = nlohmann::ordered_json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const ojson schema = kimi::try_parse_json<ojson>(in.substr(0, nul));
  if (schema.is_discarded()) return 0;
  const std::string_view doc = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  Budget b;
  b.max_size = 50000;
  b.max_seconds = 1.0;
  std::string gbnf;
  try {
    gbnf = schema_to_gbnf(schema, b);
  } catch (const SchemaError&) {
    return 0;
  } catch (const LimitError&) {
    return 0;
  }
  std::shared_ptr<const Grammar> g;
  try {
    g = Grammar::parse(gbnf, b);
  } catch (const LimitError&) {
    return 0;
  } catch (const GrammarError& e) {
    const std::string_view w(e.what());
    if (w.find("is empty") == std::string_view::npos && w.find("left-recursive") == std::string_view::npos)
      __builtin_trap();  // a converter bug
    return 0;
  }
  try {
    Matcher m(g);
    if (!doc.empty() && m.advance_bytes(doc) && m.can_end()) {
      const ojson j = kimi::try_parse_json<ojson>(doc);
      if (j.is_discarded()) __builtin_trap();  // the grammar accepted text that is not JSON
    }
  } catch (const LimitError&) {
    return 0;
  }
  return 0;
}
