// Writes the seed corpus of every target but fuzz_gguf (see fuzz_gguf_seeds) into DIR/<target>/,
// from the files the project itself makes: `kimi synth` configs, tokenizer files and checkpoint
// tensors, the converter's vocabulary, chat requests rendered and their replies, server bodies.
// Each seed starts with the mode byte its target reads first.
//   fuzz_seeds DIR
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common.h"
#include "convert/synth.h"
#include "convert/vocab.h"
#include "io/safetensors.h"
#include "server/grammar.h"
#include "tokenizer/chat.h"
#include "util/error.h"

using namespace kimi;
namespace fs = std::filesystem;

namespace {
std::string g_root;
int g_count = 0;

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_root + "/" + target);
  fuzz::write_file(g_root + "/" + target + "/" + name, bytes);
  ++g_count;
}
std::string with_mode(char mode, const std::string& s) { return std::string(1, mode) + s; }

void safetensors_seeds() {
  const std::string tmp = fuzz::temp_dir() + "/seed.safetensors";
  int n = 0;
  auto file = [&](auto&& declare_and_write) {
    {
      st::Writer w(tmp);
      declare_and_write(w);
      w.finish();
    }
    seed("safetensors", "file-" + std::to_string(n++), with_mode(0, fuzz::read_file(tmp)));
  };
  file([](st::Writer& w) {
    w.add_metadata("format", "pt");
    w.add_tensor("language_model.model.norm.weight", st::Dtype::BF16, {4});
    w.add_tensor("language_model.lm_head.weight", st::Dtype::F32, {2, 3});
    w.begin();
    const uint16_t a[4] = {0x3f80, 0, 0x8000, 0x7fc0};
    const float b[6] = {1, 2, 3, 4, 5, 6};
    w.write("language_model.model.norm.weight", a, sizeof a);
    w.write("language_model.lm_head.weight", b, sizeof b);
  });
  file([](st::Writer& w) {  // every dtype, a zero-size tensor, 3-D and 0-D shapes
    const st::Dtype all[] = {st::Dtype::BOOL, st::Dtype::U8,  st::Dtype::I8,      st::Dtype::I16,     st::Dtype::U16,
                             st::Dtype::F16,  st::Dtype::I32, st::Dtype::U32,     st::Dtype::F64,     st::Dtype::I64,
                             st::Dtype::U64,  st::Dtype::F8_E4M3, st::Dtype::F8_E5M2, st::Dtype::F8_E8M0};
    int i = 0;
    for (st::Dtype d : all) w.add_tensor("t" + std::to_string(i++), d, {2});
    w.add_tensor("empty", st::Dtype::F32, {0, 4});
    w.add_tensor("cube", st::Dtype::U8, {2, 2, 2});
    w.add_tensor("scalar", st::Dtype::F32, {});
    w.begin();
    const uint8_t bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    i = 0;
    for (st::Dtype d : all) w.write("t" + std::to_string(i++), bytes, 2 * st::dtype_size(d));
    w.write("empty", bytes, 0);
    w.write("cube", bytes, 8);
    w.write("scalar", bytes, 4);
  });
  file([](st::Writer& w) {  // an MXFP4 expert pair as compressed-tensors stores it
    w.add_tensor("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", st::Dtype::U8, {2, 16});
    w.add_tensor("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", st::Dtype::U8, {2, 1});
    w.begin();
    std::vector<uint8_t> p(32, 0x21), s(2, 127);
    w.write("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", p.data(), p.size());
    w.write("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", s.data(), s.size());
  });
  // index files for the two shards the target provides (x in a, y and z in b)
  seed("safetensors", "index-0",
       with_mode(1, R"({"metadata": {"total_size": 22}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors", "z": "b.safetensors"}})"));
  seed("safetensors", "index-1", with_mode(1, R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})"));
  // the start of the tiny checkpoint's real index
  std::string idx = fuzz::read_file(fuzz::tiny_hf_dir() + "/model.safetensors.index.json");
  seed("safetensors", "index-tiny-head", with_mode(1, idx.substr(0, 600)));
}

void config_seeds() {
  auto add = [](const std::string& name, synth::Config c) { seed("hf_config", name, synth::config_json(c).dump(2)); };
  for (const auto& p : synth::preset_names()) add(p, synth::preset(p));
  synth::Config c = synth::preset("tiny");
  c.indexer = false;
  add("tiny-no-indexer", c);
  c = synth::preset("tiny");
  c.mxfp4_experts = false;
  add("tiny-bf16-experts", c);
  c = synth::preset("tiny");
  synth::set_layers(c, 2);
  add("tiny-2-layers", c);
  seed("hf_config", "tiny-file", fuzz::read_file(fuzz::tiny_hf_dir() + "/config.json"));
}

void tokenizer_seeds() {
  const std::string tk = fuzz::read_file(fuzz::tiny_hf_dir() + "/tiktoken.model");
  auto lines = [&](int n) {
    size_t end = 0;
    for (int i = 0; i < n && (end = tk.find('\n', end)) != std::string::npos; ++i) ++end;
    return tk.substr(0, end);
  };
  seed("tiktoken", "plain-300", lines(300));
  seed("tiktoken", "plain-260", lines(260));
  seed("tiktoken", "crlf", "IQ== 0\r\nIg== 1\r\n\r\nIyM= 2\r\n");
  // the npm tiktoken encoder JSON form with the first 270 ranks in two runs ("! START b64 b64 ...")
  std::string runs = "! 0";
  for (size_t pos = 0, r = 0; r < 270 && pos < tk.size(); ++r, pos = tk.find('\n', pos) + 1) {
    if (r == 100) runs += "\n! 100";
    runs += " " + tk.substr(pos, tk.find(' ', pos) - pos);
  }
  nlohmann::ordered_json npm;
  npm["pat_str"] = "\\s+|\\S+";
  npm["special_tokens"] = {{"<|endoftext|>", 270}, {"<|im_end|>", 271}};
  npm["bpe_ranks"] = runs;
  seed("tiktoken", "npm-json", npm.dump());

  // tokenizer_config.json: the synth file, and a short one
  const std::string tc = fuzz::read_file(fuzz::tiny_hf_dir() + "/tokenizer_config.json");
  seed("tokenizer_config", "tiny-tokenizer-config", with_mode(0, tc));
  nlohmann::ordered_json small = nlohmann::ordered_json::parse(tc);
  nlohmann::ordered_json atd = nlohmann::ordered_json::object();
  int k = 0;
  for (auto& [id, v] : small["added_tokens_decoder"].items())
    if (k++ < 12) atd[id] = v;
  small["added_tokens_decoder"] = atd;
  small["add_bos_token"] = false;
  small["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
  seed("tokenizer_config", "short-tokenizer-config", with_mode(0, small.dump(1)));
  // tokenizer.json (HF form) for the first 300 ranks, with merges and added tokens
  std::vector<std::string> by_rank = convert::parse_tiktoken(lines(300), "tiny");
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t r = 0; r < by_rank.size(); ++r) vocab[convert::gpt2_encode_bytes(by_rank[r])] = r;
  nlohmann::ordered_json tj;
  tj["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", convert::reconstruct_merges(by_rank)}};
  tj["added_tokens"] = nlohmann::ordered_json::array(
      {{{"id", 768}, {"content", "[BOS]"}, {"special", true}}, {{"id", 770}, {"content", "<|im_end|>"}, {"special", true}},
       {{"id", 299}, {"content", "re-added"}, {"special", false}}});
  seed("tokenizer_config", "tokenizer-json", with_mode(1, tj.dump()));
}

const char* const kRequests[] = {
    R"({"messages":[{"role":"user","content":"Hello!"}]})",
    R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo","reasoning_content":"r"},{"role":"user","content":"Again"}],"thinking":false})",
    R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"thinking_effort":"low"})",
    R"({"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"n\": 3}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather <x> & 'y'","parameters":{"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer","default":1}},"required":["city"]}}}],"tool_choice":"auto"})",
    R"({"messages":[{"role":"developer","content":"d"},{"role":"user","name":"bob","content":"q"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"integer"}}}}},"tool_choice":"required"})",
    R"({"messages":[{"role":"assistant","content":"a","tool_calls":[{"function":{"name":"f","arguments":{"x":[1,2.5,1e16,null,true]}}}]}],"add_generation_prompt":false})",
    R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"thinking":{"type":"enabled"}})",
};

const char* const kSampling[] = {
    R"(,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":42,"max_tokens":16,"stream":true,"stream_options":{"include_usage":true})",
    R"(,"stop":["\n\n","END"],"max_completion_tokens":8,"repeat_penalty":1.1,"n":1,"logprobs":false,"model":"kimi"})",
    R"(,"ignore_eos":true,"temperature":0,"reasoning_effort":"high")",
};

const char* const kReplies[] = {
    "Let me think <about> it.<|close|>think<|sep|><|open|>response<|sep|>Answer: a<|b.<|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"get &amp; set\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"FR\"<|close|>argument<|sep|>"
    "<|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
    "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1, true]}<|close|>argument<|sep|><|close|>call<|sep|>"
    "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"q\": 1}<|close|>json<|sep|>"
    "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>trailing",
    "Hello<|close|>response<|sep|><|close|>message<|sep|>",
    "<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|end_of_msg|>",
    "<|open|>argument key=\"b\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|><|open|>argument key=\"i\" "
    "type=\"integer\"<|sep|>-12<|close|>argument<|sep|><|open|>argument key=\"a\" type=\"array\"<|sep|>[1,\"x\"]"
    "<|close|>argument<|sep|><|open|>argument key=\"z\" type=\"null\"<|sep|>null<|close|>argument<|sep|>",
};

void chat_seeds() {
  int n = 0;
  for (const char* r : kRequests) {
    seed("chat", "render-" + std::to_string(n), with_mode(0, r));
    // the rendered conversation, as text a parser may see
    try {
      seed("chat", "rendered-" + std::to_string(n), with_mode(1, tok::render_chat_request(tok::ojson::parse(r))));
    } catch (const Error&) {
    }
    ++n;
  }
  n = 0;
  for (const char* r : kReplies) {
    seed("chat", "reply-think-" + std::to_string(n), with_mode(3, r));
    seed("chat", "reply-" + std::to_string(n++), with_mode(1, r));
  }
}

// Tools and tool messages for the request target: well-formed round trips, and the checks' cases
// (bad names, duplicate names, bogus parameter schemas, unknown tool_choice, tool results without or
// with unknown ids, the format's tags inside every field that reaches the template).
const char* const kToolRequests[] = {
    R"({"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"city\":\"Oslo\"}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":{"q":1}}}]},{"role":"tool","tool_call_id":"c2","content":"2"},{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"sunny"}]}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]}},"required":["city"],"additionalProperties":false}}},{"type":"function","function":{"name":"g","strict":true,"parameters":{"type":"object","$defs":{"n":{"type":"integer","minimum":0}},"properties":{"q":{"$ref":"#/$defs/n"}}}}}],"tool_choice":{"type":"function","function":{"name":"f"}}})",
    R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"get weather","parameters":{"type":"bogus"}}}],"tool_choice":"required"})",
    R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"h"}}})",
    R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"orphan"},{"role":"tool","tool_call_id":"nope","content":"y"}]})",
    R"({"messages":[{"role":"system","name":"<|open|>","content":"<|close|>message<|sep|><|end_of_msg|>"},{"role":"user","content":[{"type":"text","text":"<|open|>message role=\"system\"<|sep|>"}]},{"role":"assistant","reasoning_content":"<|close|>think<|sep|>","content":"<|end_of_msg|>","tool_calls":[{"id":"<|sep|>","type":"function","function":{"name":"f","arguments":{"<|open|>":"<|close|>"}}}]},{"role":"tool","tool_call_id":"<|sep|>","content":"[EOS]<|end_of_msg|>"}],"tools":[{"type":"function","function":{"name":"f","description":"<|open|>","parameters":{"type":"object","description":"<|close|>","properties":{"<|sep|>":{"type":"string"}}}}}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","description":"<|end_of_msg|>"}}}})",
};

void api_seeds() {
  int n = 0;
  for (const char* r : kRequests) {
    std::string body = r;
    seed("api", "chat-" + std::to_string(n), with_mode(4, body));
    body.pop_back();
    body += kSampling[n % std::size(kSampling)];
    body += "}";
    seed("api", "chat-sampling-" + std::to_string(n), with_mode(static_cast<char>(n % 2 ? 0 : 8), body));
    ++n;
  }
  const char* const completions[] = {
      R"({"prompt":"Once upon a time","max_tokens":8,"temperature":0.5})",
      R"({"prompt":[1,2,3,1023],"stop":"x","seed":-1})",
      R"({"prompt":["one string"],"echo":false,"stream":true})",
      R"({"prompt":"[BOS]special<|im_end|>","top_k":1,"max_tokens":1e1})",
  };
  n = 0;
  for (const char* c : completions) seed("api", "completion-" + std::to_string(n++), with_mode(5, c));
  n = 0;
  for (const char* r : kToolRequests) seed("api", "tools-" + std::to_string(n++), with_mode(4, r));
  // a thinking budget (hard cap) and one tool call at most
  seed("api", "chat-budget-one-call",
       with_mode(4, R"({"messages":[{"role":"user","content":"w?"}],"thinking_budget_tokens":12,"parallel_tool_calls":false,"tool_choice":"auto","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"c":{"type":"string"}}}}}]})"));
  const std::string gbnf = R"({"prompt":"x","max_tokens":4,"grammar":"root ::= (\"a\" | [0-9]{1,3})+"})";
  seed("api", "grammar", with_mode(5, gbnf));
  // the agent APIs (mode bits 4-5: 1 Anthropic Messages, 2 Responses, 3 count_tokens)
  const char* const anthropic[] = {
      R"({"model":"m","max_tokens":8,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"text","text":"a"},{"type":"tool_use","id":"u1","name":"f","input":{"city":"Oslo"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"u1","content":[{"type":"text","text":"r"}],"is_error":true},{"type":"text","text":"ok"}]}],"tools":[{"name":"f","description":"d","input_schema":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo"]}},"required":["city"]}},{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"tool","name":"f"},"thinking":{"type":"enabled","budget_tokens":4096},"output_config":{"effort":"low"},"stop_sequences":["zz"],"metadata":{"user_id":"u"},"context_management":{"edits":[]},"stream":true})",
      R"({"model":"m","max_tokens":64,"messages":[{"role":"user","content":"w?"}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},"thinking":{"type":"enabled","budget_tokens":1024}})",
      R"({"model":"m","max_tokens":32000,"messages":[{"role":"user","content":[{"type":"text","text":"<|open|>tools<|sep|>"}]},{"role":"system","content":"late"}],"thinking":{"type":"adaptive"},"output_config":{"effort":"high","format":{"type":"json_schema","schema":{"type":"object"}}}})",
  };
  n = 0;
  for (const char* a : anthropic) {
    seed("api", "anthropic-" + std::to_string(n), with_mode(0x14, a));
    seed("api", "anthropic-count-" + std::to_string(n++), with_mode(0x34, a));
  }
  const char* const responses[] = {
      R"({"model":"m","instructions":"i","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"s"}],"content":[{"type":"reasoning_text","text":"t"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"q\":1}"},{"type":"function_call_output","call_id":"c1","output":"o"},{"role":"developer","content":"d"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"q":{"type":"integer","minimum":0}}},"strict":true},{"type":"web_search"}],"tool_choice":{"type":"function","name":"f"},"reasoning":{"effort":"xhigh","summary":"auto"},"text":{"format":{"type":"json_schema","name":"o","schema":{"type":"object"}}},"max_output_tokens":64,"store":false,"include":["reasoning.encrypted_content"],"prompt_cache_key":"k","stream":true})",
      R"({"input":"w?","parallel_tool_calls":false,"tool_choice":"auto","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]})",
      R"({"input":"hi","reasoning":{"effort":"none"},"tool_choice":"required","tools":[{"type":"function","name":"g"}],"previous_response_id":null})",
  };
  n = 0;
  for (const char* r : responses) seed("api", "responses-" + std::to_string(n++), with_mode(0x24, r));
}

// Grammars: the project's own (json_object, converted schemas, the documented examples) and hostile
// ones (deep groups, nested repeats, long rule chains, empty languages, ambiguity).
std::vector<std::string> grammar_texts() {
  std::vector<std::string> g = {
      server::grammar::json_object_gbnf(),
      R"(root ::= "yes" | "no" | [0-9]+ "%"   # a comment)",
      "root ::= (\"ab\"){2,3} x?\nx ::= [^a-c]\n",
      "root ::= [\\u00e0-\\u00ff] \"\\n\" \"\\u20ac\"",
      "root ::= ([a-z ] | \"\\u20ac\" | \"\\U0001F600\")* \"!\"",
      R"(root ::= (("a"{0,100}){0,100}){0,100})",
      "root ::= b{0,60}\nb ::= c{0,60}\nc ::= \"a\"{0,60}\n",
      "root ::= \"a\" root",
      "root ::= x\nx ::= \"\" root",
      "root ::= [^\\x00-\\U0010FFFF]",
      std::string("root ::= ") + std::string(70, '(') + "\"a\"" + std::string(70, ')'),
      std::string("root ::= ") + std::string(60, '(') + "\"a\"" + std::string(60, ')') + "{0,3}",
      "root ::= \"" + std::string(2000, 'x') + "\"{1000}",
  };
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 300; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " | \"\"\n";
  g.push_back(chain + "r300 ::= \"a\"\n");
  return g;
}

std::vector<std::string> schema_texts() {
  std::vector<std::string> s = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"count":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","count"],"additionalProperties":false})",
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"type":"object","properties":{"kind":{"const":"list"},"head":{"$ref":"#/$defs/node"},"xs":{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3}},"required":["kind","head","xs"]})",
      R"({"type":["string","null","array"],"items":{"enum":[1,"a",null,{"k":[]}]},"maxItems":1000,"minLength":2,"maxLength":1000})",
      R"({"type":"array","items":{"type":"array","items":{"type":"string","maxLength":1000},"maxItems":1000},"maxItems":1000})",
      R"({"oneOf":[{"type":"string","pattern":"a"},{"type":"bogus"},{"$ref":"#/definitions/x"}],"definitions":{"x":true}})",
      R"({"$ref":"#"})",
  };
  std::string defs;
  for (int i = 0; i < 100; ++i)
    defs += (i ? ",\"d" : "\"d") + std::to_string(i) + "\":{\"$ref\":\"#/$defs/d" + std::to_string(i + 1) + "\"}";
  s.push_back("{\"$defs\":{" + defs + ",\"d100\":{\"type\":\"string\"}},\"$ref\":\"#/$defs/d0\"}");
  std::string nested = R"({"type":"string"})";
  for (int i = 0; i < 60; ++i) nested = R"({"type":"array","items":)" + nested + "}";
  s.push_back(nested);
  std::string values;
  for (int i = 0; i < 2000; ++i) values += (i ? ",\"v" : "\"v") + std::to_string(i) + "\"";
  s.push_back("{\"enum\":[" + values + "]}");
  return s;
}

void grammar_seeds() {
  int n = 0;
  for (const std::string& g : grammar_texts()) {
    seed("grammar", "g-" + std::to_string(n++), g);
    seed("grammar", "g-feed-" + std::to_string(n), g + std::string(1, '\0') + "aaaa{\"yes\": 1}");
  }
  n = 0;
  for (const std::string& sc : schema_texts()) {
    seed("json_schema", "s-" + std::to_string(n++), sc);
    seed("json_schema", "s-doc-" + std::to_string(n), sc + std::string(1, '\0') + R"({"name": "ab", "count": 3})");
    try {  // the converter's output as a grammar seed too
      seed("grammar", "from-schema-" + std::to_string(n), server::grammar::schema_to_gbnf(tok::ojson::parse(sc)));
    } catch (const std::exception&) {
    }
  }
}

void model_seeds() {
  // the unmodified model with each context option set, and a few single edits
  for (int o = 0; o < 8; ++o) seed("model", "unmodified-" + std::to_string(o), std::string(1, static_cast<char>(o)));
  seed("model", "key-small", std::string("\x00\x00\x20\x00\x05", 5));   // a key to 5
  seed("model", "key-special", std::string("\x01\x00\x21\x02\x1e\x03", 6));  // a key to 2^32-1
  seed("model", "tensor-dim", std::string("\x00\x03\x05\x00\x00\x00\x02\x00\x00", 9));
  seed("model", "tensor-type", std::string("\x02\x04\x30\x00\x00\x00\x03", 7));
  seed("model", "head-count-kv", std::string("\x00\x02\x00\x00\x03\x01", 6));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  g_root = argv[1];
  try {
    safetensors_seeds();
    config_seeds();
    tokenizer_seeds();
    chat_seeds();
    api_seeds();
    grammar_seeds();
    model_seeds();
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
    return 1;
  }
  std::printf("fuzz_seeds: wrote %d seeds under %s\n", g_count, g_root.c_str());
  return 0;
}
