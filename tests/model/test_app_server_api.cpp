// `kimi serve`: the OpenAI / llama-server features clients send — logprobs and top_logprobs
// (checked against log-softmax of the engine's own logits in float64), n > 1, /v1/models/{id},
// embeddings refused, /props, /slots, /health while loading, the per-request log line.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "model/model.h"
#include "runtime/context.h"
#include "server_fixture.h"
#include "tokenizer/tokenizer.h"

using namespace kimi;
using namespace kimi::test;
using namespace std::chrono_literals;

namespace {

struct RefStep {
  int32_t token;
  double logprob;
  std::vector<std::pair<int32_t, double>> top;  // best first
};

// Independent reference: greedy decoding on the engine directly, log-softmax in float64.
std::vector<RefStep> reference_logprobs(const std::vector<int32_t>& prompt, int n, int k) {
  auto m = Model::load(tiny_gguf());
  ContextOptions co;
  co.n_threads = 1;
  co.n_ctx_max = 1024;
  co.n_batch_max = 512;
  co.precision = Precision::F32;
  Context ctx(*m, co);
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  ctx.decode(b);
  const float* lg = ctx.logits(b.size() - 1);
  std::vector<RefStep> out;
  for (int i = 0; i < n; ++i) {
    const int V = ctx.n_vocab();
    double mx = -1e300;
    for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(lg[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(lg[v] - mx);
    const double lse = mx + std::log(sum);
    std::vector<int32_t> order(static_cast<size_t>(V));
    for (int v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return lg[a] > lg[c]; });
    RefStep s;
    s.token = order[0];
    s.logprob = lg[s.token] - lse;
    for (int j = 0; j < k; ++j) s.top.push_back({order[static_cast<size_t>(j)], lg[order[static_cast<size_t>(j)]] - lse});
    out.push_back(s);
    b.clear();
    b.add(s.token, 0, ctx.seq_len(0), true);
    ctx.decode(b);
    lg = ctx.logits(0);
  }
  return out;
}

const tok::Tokenizer& tiny_tok() {
  static auto m = Model::load(tiny_gguf());
  static tok::Tokenizer t = tok::Tokenizer::from_gguf(m->reader());
  return t;
}

// What a piece looks like in the JSON (bytes that are not UTF-8 become U+FFFD).
std::string in_json(const std::string& s) {
  return ojson::parse(ojson(s).dump(-1, ' ', false, ojson::error_handler_t::replace)).get<std::string>();
}

std::vector<int32_t> some_prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 24; ++i) p.push_back(40 + (i * 37) % 600);
  return p;
}

}  // namespace

TEST(ServerApi, CompletionLogprobsMatchTheEngine) {
  RunningServer r(server_opts());
  const auto prompt = some_prompt();
  const int n = 6, k = 4;
  const auto ref = reference_logprobs(prompt, n, k);
  const ojson req = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"logprobs", k}, {"ignore_eos", true}};
  int st = 0;
  const ojson j = r.post("/v1/completions", req, &st);
  ASSERT_EQ(st, 200) << j.dump();
  const ojson& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n)) << lp.dump();
  std::string joined;  // raw bytes; text_offset counts bytes
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(lp["tokens"][i].get<std::string>(), in_json(tiny_tok().token_to_piece(ref[i].token)));
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), ref[i].logprob, 1e-4);
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size());
    joined += tiny_tok().token_to_piece(ref[i].token);
    const ojson& top = lp["top_logprobs"][i];
    ASSERT_LE(top.size(), static_cast<size_t>(k));  // two pieces that look alike in JSON share a key
    for (const auto& [id, v] : ref[i].top) {
      const std::string piece = in_json(tiny_tok().token_to_piece(id));
      if (piece.find("\xef\xbf\xbd") != std::string::npos) continue;  // U+FFFD: several pieces may share this key
      ASSERT_TRUE(top.contains(piece)) << piece << " in " << top.dump();
      EXPECT_NEAR(top[piece].get<double>(), v, 1e-4);
    }
  }
  EXPECT_EQ(in_json(joined), j["choices"][0]["text"].get<std::string>());

  // streamed: the same records, chunk by chunk, offsets continuing
  ojson sreq = req;
  sreq["stream"] = true;
  bool done = false;
  const auto ev = sse_events(r.post_stream("/v1/completions", sreq), &done);
  EXPECT_TRUE(done);
  std::vector<double> got;
  std::vector<size_t> offs;
  for (const ojson& e : ev) {
    const ojson& l = e["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (size_t i = 0; i < l["token_logprobs"].size(); ++i) {
      got.push_back(l["token_logprobs"][i].get<double>());
      offs.push_back(l["text_offset"][i].get<size_t>());
    }
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(got[i], ref[i].logprob, 1e-4) << i;
    EXPECT_EQ(offs[i], lp["text_offset"][i].get<size_t>()) << i;
  }
  // no logprobs asked: null
  const ojson plain = r.post("/v1/completions", ojson{{"prompt", prompt}, {"max_tokens", 2}});
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST(ServerApi, ChatLogprobsCoverTheAnswer) {
  RunningServer r(server_opts());
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", "hello there"}}});
  const ojson req = {{"messages", msgs}, {"max_tokens", 12}, {"temperature", 0}, {"thinking", false},
                     {"logprobs", true}, {"top_logprobs", 3}};
  int st = 0;
  const ojson j = r.post("/v1/chat/completions", req, &st);
  ASSERT_EQ(st, 200) << j.dump();
  const ojson& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(content.is_array()) << j.dump();
  ASSERT_FALSE(content.empty()) << j.dump();
  std::string joined;
  for (const ojson& e : content) {
    const double lp = e["logprob"].get<double>();
    EXPECT_LE(lp, 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_NEAR(e["top_logprobs"][0]["logprob"].get<double>(), lp, 1e-6) << "greedy: the chosen token is the best";
    for (size_t i = 1; i < 3; ++i)
      EXPECT_LE(e["top_logprobs"][i]["logprob"].get<double>(), e["top_logprobs"][i - 1]["logprob"].get<double>());
    std::string bytes;
    for (const ojson& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, e["token"].get<std::string>());
    joined += bytes;
  }
  EXPECT_EQ(joined, j["choices"][0]["message"]["content"].get<std::string>());
  // bad combinations
  for (const ojson& bad : {ojson{{"messages", msgs}, {"top_logprobs", 3}},
                           ojson{{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}},
                           ojson{{"messages", msgs}, {"logprobs", 2}}}) {
    r.post("/v1/chat/completions", bad, &st);
    EXPECT_EQ(st, 400) << bad.dump();
  }
}

TEST(ServerApi, SeveralChoices) {
  RunningServer r(server_opts());
  const auto prompt = some_prompt();
  // choice k is sampled with seed + k: choice 1 of n=3 equals a single request with seed + 1
  const ojson req = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 41}, {"n", 3},
                     {"ignore_eos", true}};
  int st = 0;
  const ojson j = r.post("/v1/completions", req, &st);
  ASSERT_EQ(st, 200) << j.dump();
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(j["choices"][k]["index"], k);
    ojson one = req;
    one["n"] = 1;
    one["seed"] = 41 + k;
    const ojson s = r.post("/v1/completions", one);
    EXPECT_EQ(j["choices"][k]["text"], s["choices"][0]["text"]) << k;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(prompt.size()));
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  // streamed chat with n = 2: each choice gets its deltas, its finish_reason, then one [DONE]
  const ojson creq = {{"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})},
                      {"max_tokens", 6}, {"n", 2}, {"stream", true}, {"thinking", false}, {"seed", 3}};
  bool done = false;
  const auto ev = sse_events(r.post_stream("/v1/chat/completions", creq), &done);
  EXPECT_TRUE(done);
  int finished[2] = {0, 0};
  for (const ojson& e : ev) {
    const int idx = e["choices"][0]["index"].get<int>();
    ASSERT_TRUE(idx == 0 || idx == 1) << e.dump();
    if (!e["choices"][0]["finish_reason"].is_null()) ++finished[idx];
  }
  EXPECT_EQ(finished[0], 1);
  EXPECT_EQ(finished[1], 1);
  r.post("/v1/completions", ojson{{"prompt", "a"}, {"n", 17}}, &st);
  EXPECT_EQ(st, 400);
  r.post("/v1/completions", ojson{{"prompt", "a"}, {"n", 2}, {"best_of", 3}}, &st);
  EXPECT_EQ(st, 400);
}

TEST(ServerApi, ModelsPropsSlotsEmbeddings) {
  auto o = server_opts();
  o.model_id = "tiny-test";
  o.sampling.temp = 0.5f;
  o.sampling.top_k = 7;
  o.reasoning_budget = 77;
  o.sched.parallel = 2;
  o.sched.cache_slots = 1;
  RunningServer r(o);
  int st = 0;
  ojson m = r.get("/v1/models/tiny-test", &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(m["id"], "tiny-test");
  EXPECT_EQ(m["object"], "model");
  m = r.get("/v1/models/gpt-4", &st);
  EXPECT_EQ(st, 404);
  EXPECT_NE(m["error"]["message"].get<std::string>().find("gpt-4"), std::string::npos);

  for (const char* p : {"/v1/embeddings", "/embeddings", "/embedding"}) {
    const ojson e = r.post(p, ojson{{"input", "hello"}}, &st);
    EXPECT_EQ(st, 501) << p;
    EXPECT_NE(e["error"]["message"].get<std::string>().find("embeddings are not supported"), std::string::npos) << p;
  }

  const ojson props = r.get("/props", &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(props["model"], "tiny-test");
  EXPECT_EQ(props["n_ctx"], 1024);
  EXPECT_EQ(props["total_slots"], 2);
  EXPECT_TRUE(props["chat_template"].is_string());
  EXPECT_EQ(props["default_generation_settings"]["temperature"], 0.5);
  EXPECT_EQ(props["default_generation_settings"]["top_k"], 7);
  EXPECT_EQ(props["default_generation_settings"]["thinking_budget_tokens"], 77);  // --reasoning-budget

  const auto prompt = some_prompt();
  r.post("/v1/completions", ojson{{"prompt", prompt}, {"max_tokens", 5}, {"ignore_eos", true}});
  const ojson slots = r.get("/slots", &st);
  ASSERT_EQ(st, 200);
  ASSERT_EQ(slots.size(), 3u) << slots.dump();  // 2 slots + 1 cache slot
  int holding = 0;
  for (const ojson& s : slots) {
    EXPECT_EQ(s["state"], "idle");
    // the prompt and every generated token but the last are in the cache
    if (s["n_tokens_cached"] == static_cast<int>(prompt.size()) + 4) ++holding;
  }
  EXPECT_EQ(holding, 1) << slots.dump();
}

TEST(ServerApi, HealthIs503WhileLoading) {
  auto o = server_opts();
  o.load_in_background = true;
  o.test_load_delay_ms = 1500;
  RunningServer r(o);
  int st = 0;
  const ojson h = r.get("/health", &st);
  EXPECT_EQ(st, 503);
  EXPECT_EQ(h["status"], "loading model");
  const ojson c = r.post("/v1/chat/completions", ojson{{"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})}}, &st);
  EXPECT_EQ(st, 503);
  EXPECT_EQ(c["error"]["code"], "loading");
  r.get("/props", &st);
  EXPECT_EQ(st, 503);
  for (int i = 0; i < 200 && !r.s->loaded(); ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(r.s->loaded());
  EXPECT_EQ(r.get("/health", &st)["status"], "ok");
  EXPECT_EQ(st, 200);
}

TEST(ServerApi, OneLogLinePerRequestWithSpeeds) {
  RunningServer r(server_opts());
  testing::internal::CaptureStderr();
  r.post("/v1/completions", ojson{{"prompt", some_prompt()}, {"max_tokens", 5}, {"ignore_eos", true}});
  const std::string err = testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (char ch : err) lines += ch == '\n';
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_NE(err.find("POST /v1/completions"), std::string::npos) << err;
  EXPECT_NE(err.find("prompt 24 tokens (0 cached)"), std::string::npos) << err;
  EXPECT_NE(err.find("generated 5 tokens"), std::string::npos) << err;
  EXPECT_NE(err.find(" tok/s; generated"), std::string::npos) << err;
}
