// Enforced tool calls: a grammar over K3's tool-call syntax (docs/server.md "Tool calls"), the
// declared tool names and each tool's parameter schema, for the scheduler's constrained sampling.
//
// K3 writes a call as
//   <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>ARGS<|close|>call<|sep|>...<|close|>tools<|sep|>
// where ARGS is <|open|>json type="object"<|sep|>{...}<|close|>json<|sep|> or one
// <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|> per argument (a string
// value raw, any other JSON). <|open|>, <|close|> and <|sep|> are special tokens: in these grammars
// they are the private-use code points U+E000, U+E001, U+E002 (kToolOpen, ...), which the scheduler
// feeds for them; no text token may produce those code points or the two characters "<|" where
// the grammar has text, so a constrained output parses back (tok::ChatParser) into exactly the calls
// the grammar allows.
//
// Modes (tool_choice): required / a named tool — from the first generated token: the think channel
// (thinking on) is free text, the response is empty, then one or more calls (of that tool);
// (one call when a tool is named, else 1..kMaxToolCalls); auto — lazy: free until the output ends with "<|open|>tools<|sep|>", then the calls; none — from
// the first token: think and response free, no tools section. `one_call` (the clients' "one tool
// call at most": parallel_tool_calls false, disable_parallel_tool_use true): the tools section holds
// exactly one call and then only its close (and the end of the message), in every mode; auto is then
// held from the first token too (think and response free text, then an optional tools section), so
// no call can be written outside the section either.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "server/grammar.h"
#include "server/job.h"

namespace kimi::server {

inline constexpr const char* kToolOpen = "\xEE\x80\x80";   // U+E000 stands for <|open|>
inline constexpr const char* kToolClose = "\xEE\x80\x81";  // U+E001 stands for <|close|>
inline constexpr const char* kToolSep = "\xEE\x80\x82";    // U+E002 stands for <|sep|>
// The raw output that switches the lazy (auto) constraint on.
inline constexpr const char* kToolTrigger = "<|open|>tools<|sep|>";

enum class ToolMode { Auto, Required, None };
// Calls in one message at most (a named tool: exactly one).
inline constexpr int kMaxToolCalls = 8;

// One declared tool: its name and parameter schema (null: any object).
struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;
};

// GBNF of the constraint. `forced`: the only tool allowed (a named tool_choice; "" any);
// thinking: the prompt ended inside the think channel (else inside the response channel).
// A schema (or part of one) the converter cannot hold to is relaxed (relax_schema); a tool whose
// schema still fails gets "any JSON object".
std::string tool_gbnf(const std::vector<ToolSpec>& tools, ToolMode mode, const std::string& forced, bool thinking,
                      bool one_call = false);

// The schema reduced to what schema_to_gbnf supports: keywords that only narrow the valid values
// (pattern, format, minimum, ...) are dropped, `allOf` merged, additionalProperties beside
// properties dropped (no extra properties are generated). Generation under the relaxed schema
// writes values the original may refuse only where those keywords would.
// coarse: also drop lengths above 64 and item counts above 4 (the fallback of a schema whose exact
// grammar exceeds the engine's limits).
nlohmann::ordered_json relax_schema(const nlohmann::ordered_json& schema, bool coarse = false);

// The compile budget of a whole tool grammar: the default one, with the expanded size allowed
// kMaxToolCalls + 1 times over (the tools section refers to the calls' rule once per call it may
// hold; each tool's own grammar is held to the default budget).
grammar::Budget tool_budget();

// Sets gen.tool_grammar / gen.tool_trigger for a chat request's `tools` and `tool_choice` (the
// OpenAI chat shapes, already checked; null when absent): required or a named function -> from the
// first token (a response grammar, which would constrain an empty response, is dropped); auto ->
// lazy (one_call: from the first token); none -> no tools section. No tools: nothing. thinking: the prompt ends in the think channel.
// one_call: at most one call in the message (chat's parallel_tool_calls false).
// Throws ApiError 400 (param "tools") when the grammar cannot be built.
void set_tool_constraint(GenParams& gen, const nlohmann::ordered_json& tools, const nlohmann::ordered_json& tool_choice,
                         bool thinking, bool one_call = false);

// Prefixes every rule that `gbnf` defines (and every reference to one) with `prefix`; references
// to rules it does not define are left as they are.
std::string prefix_gbnf(const std::string& gbnf, const std::string& prefix);

}  // namespace kimi::server
