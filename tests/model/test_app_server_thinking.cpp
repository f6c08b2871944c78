// `kimi serve`: the thinking budget is a hard cap (chat `thinking_budget_tokens`, Anthropic
// `thinking.budget_tokens`, `kimi serve --reasoning-budget`). With budget B the think channel holds
// exactly the first B tokens the model would think, then the template's close sequence
// (<|close|>think<|sep|><|open|>response<|sep|>) follows as if sampled, and the answer continues
// exactly as greedy decoding of a fresh prompt that already contains those tokens (checked against
// the engine directly). On the tiny random-weight model greedy decoding thinks far longer than B,
// so without the cap the tests would fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "model/model.h"
#include "runtime/context.h"
#include "server_fixture.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

using namespace kimi;
using namespace kimi::test;
using namespace std::chrono_literals;

namespace {

constexpr int kB = 12;   // the budget of the tests
constexpr int kN = 40;   // max_tokens: room for thinking, the close sequence and some answer

RunningServer& srv() {
  static RunningServer s([] {
    server::ServerOptions o = server_opts();
    o.sched.parallel = 2;
    return o;
  }());
  return s;
}

const tok::Tokenizer& tiny_tok() {
  static auto m = Model::load(tiny_gguf());
  static tok::Tokenizer t = tok::Tokenizer::from_gguf(m->reader());
  return t;
}

const ojson kUser = ojson::array({{{"role", "user"}, {"content", "Hello, who are you?"}}});

ojson chat(const ojson& extra, int want_status = 200, const RunningServer& s = srv()) {
  ojson body = {{"messages", kUser}, {"temperature", 0}};
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  int st = 0;
  ojson r = s.post("/v1/chat/completions", body, &st);
  EXPECT_EQ(st, want_status) << body.dump() << " -> " << r.dump();
  return r;
}
const Model& tiny_model() {
  static const auto m = Model::load(tiny_gguf());
  return *m;
}

std::string reasoning_of(const ojson& r) { return r["choices"][0]["message"].value("reasoning_content", std::string()); }
std::string content_of(const ojson& r) {
  const ojson& c = r["choices"][0]["message"]["content"];
  return c.is_string() ? c.get<std::string>() : std::string();
}

// A chat request body through the server's own translation (parse_chat_request), run as a job on
// a server's scheduler: the prompt tokens and every generated token id and log-probability.
struct JobRun {
  std::vector<int32_t> prompt, ids;
  std::vector<float> lps;
  server::Job::Result result;
};
server::Limits limits() {
  server::Limits lim;
  lim.n_ctx = 1024;
  lim.max_token_bytes = tiny_tok().max_token_bytes();
  lim.sampling.temp = 0;
  return lim;
}
struct Submitted {
  std::shared_ptr<server::Job> job;
  std::vector<int32_t> prompt;
};
Submitted submit_job(const ojson& body, const RunningServer& s = srv()) {
  server::ParsedRequest pr = server::parse_chat_request(body.dump(), tiny_tok(), limits());
  pr.gen.logprobs = 0;
  auto job = std::make_shared<server::Job>(pr.prompt, pr.gen);
  EXPECT_TRUE(s.s->scheduler().submit(job));
  return {job, pr.prompt};
}
JobRun collect(const Submitted& j) {
  server::JobOutput out;
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (!j.job->wait(out, 100ms) && std::chrono::steady_clock::now() < until) {
  }
  JobRun r;
  r.prompt = j.prompt;
  r.result = j.job->result();
  for (const auto& l : out.logprobs) {
    r.ids.push_back(l.id);
    r.lps.push_back(l.logprob);
  }
  EXPECT_EQ(static_cast<int>(r.ids.size()), r.result.n_generated);
  return r;
}
JobRun run_job(const ojson& body, const RunningServer& s = srv()) { return collect(submit_job(body, s)); }

// Independent reference of the log-probabilities: the engine directly (F32), one fresh sequence
// holding prompt + ids in one batch, logits at every row; the log-softmax (float64) of ids[k] over
// the row before it.
std::vector<double> reference_logprobs(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ids) {
  ContextOptions co;
  co.n_threads = 1;
  co.n_ctx_max = 1024;
  co.n_batch_max = 512;
  co.precision = Precision::F32;
  Context ctx(tiny_model(), co);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), ids.begin(), ids.end());
  Batch b;
  for (size_t i = 0; i < all.size(); ++i) b.add(all[i], 0, static_cast<int32_t>(i), i + 1 >= prompt.size());
  ctx.decode(b);
  std::vector<double> out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const float* lg = ctx.logits(prompt.size() - 1 + k);
    double mx = lg[0];
    for (int v = 1; v < ctx.n_vocab(); ++v) mx = std::max(mx, static_cast<double>(lg[v]));
    double sum = 0;
    for (int v = 0; v < ctx.n_vocab(); ++v) sum += std::exp(static_cast<double>(lg[v]) - mx);
    out.push_back(static_cast<double>(lg[ids[k]]) - mx - std::log(sum));
  }
  return out;
}

bool structural(int32_t t) {
  const std::string& p = tiny_tok().token_to_piece(t);
  return tiny_tok().is_special(t) && (p == "<|open|>" || p == "<|close|>" || p == "<|sep|>");
}

// Where the close sequence starts in `ids` (npos: nowhere).
size_t find_seq(const std::vector<int32_t>& ids, const std::vector<int32_t>& seq) {
  if (seq.empty() || ids.size() < seq.size()) return std::string::npos;
  for (size_t i = 0; i + seq.size() <= ids.size(); ++i)
    if (std::equal(seq.begin(), seq.end(), ids.begin() + static_cast<std::ptrdiff_t>(i))) return i;
  return std::string::npos;
}


}  // namespace

// The forced sequence is the template's own: what it writes between an assistant turn's reasoning
// and its answer, tokenized.
TEST(ServerThinking, CloseSequenceIsTheTemplates) {
  const std::vector<int32_t>& close = srv().s->scheduler().think_close();
  const std::string rendered = tok::render_chat_request(
      ojson{{"messages", ojson::array({{{"role", "user"}, {"content", "q"}},
                                       {{"role", "assistant"}, {"reasoning_content", "R"}, {"content", "A"}},
                                       {{"role", "user"}, {"content", "q2"}}})}});
  const size_t r = rendered.find("R<|close|>");
  ASSERT_NE(r, std::string::npos) << rendered;
  const size_t a = rendered.find('A', r);
  ASSERT_NE(a, std::string::npos);
  const std::string between = rendered.substr(r + 1, a - r - 1);
  EXPECT_EQ(between, "<|close|>think<|sep|><|open|>response<|sep|>");
  EXPECT_EQ(close, tiny_tok().encode(between, true));
  ASSERT_GE(close.size(), 4u);
  EXPECT_TRUE(structural(close.front()));
  EXPECT_TRUE(structural(close.back()));
}

// Chat: with budget B the reasoning is the text of exactly the first B tokens (a request cut by
// max_tokens = B), the answer follows; without a budget the model thinks past B (and past kN).
TEST(ServerThinking, ChatBudgetIsAHardCap) {
  const ojson first_b = chat({{"max_tokens", kB}, {"ignore_eos", true}});
  EXPECT_EQ(first_b["usage"]["completion_tokens"], kB);
  EXPECT_EQ(first_b["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(content_of(first_b), "");
  const std::string r_b = reasoning_of(first_b);
  ASSERT_FALSE(r_b.empty());

  const ojson free = chat({{"max_tokens", kN}, {"ignore_eos", true}});
  EXPECT_EQ(content_of(free), "") << "the model closed its thinking by itself within " << kN << " tokens";
  EXPECT_GT(reasoning_of(free).size(), r_b.size());
  EXPECT_EQ(reasoning_of(free).rfind(r_b, 0), 0u);

  const ojson capped = chat({{"max_tokens", kN}, {"ignore_eos", true}, {"thinking_budget_tokens", kB}});
  EXPECT_EQ(reasoning_of(capped), r_b);
  EXPECT_FALSE(content_of(capped).empty());
  EXPECT_EQ(capped["usage"]["completion_tokens"], kN);  // the forced tokens count as generated
  EXPECT_EQ(capped["choices"][0]["finish_reason"], "length");

  // the streamed answer is the same
  ojson sb = {{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true},
              {"thinking_budget_tokens", kB}, {"stream", true}};
  bool done = false;
  std::string reasoning, content;
  for (const auto& e : sse_events(srv().post_stream("/v1/chat/completions", sb), &done)) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const ojson& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(reasoning, r_b);
  EXPECT_EQ(content, content_of(capped));
}

// Exactness (scheduler level, token ids): B thinking tokens without a tag, then the close sequence,
// then the engine's greedy continuation of a prompt that already contains all of them (prefill of
// the forced tokens == their decode). Budget 0: the close sequence comes first.
TEST(ServerThinking, ForcedCloseContinuesLikeAPromptThatContainsIt) {
  const std::vector<int32_t>& close = srv().s->scheduler().think_close();
  ASSERT_FALSE(close.empty());
  for (int budget : {kB, 0}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const JobRun r = run_job({{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true},
                           {"thinking_budget_tokens", budget}});
    ASSERT_EQ(static_cast<int>(r.ids.size()), kN);
    EXPECT_EQ(r.result.finish_reason, server::FinishReason::Length);
    for (int i = 0; i < budget; ++i) EXPECT_FALSE(structural(r.ids[static_cast<size_t>(i)])) << i;
    const size_t b = static_cast<size_t>(budget);
    ASSERT_EQ(find_seq(r.ids, close), b);
    const size_t head = b + close.size();
    std::vector<int32_t> p = r.prompt;
    p.insert(p.end(), r.ids.begin(), r.ids.begin() + static_cast<std::ptrdiff_t>(head));
    const std::vector<int32_t> ref = reference_greedy_ids(tiny_model(), p, kN - static_cast<int>(head));
    EXPECT_EQ(std::vector<int32_t>(r.ids.begin() + static_cast<std::ptrdiff_t>(head), r.ids.end()), ref);
    if (budget > 0) {  // and the thinking itself is the model's own greedy thinking
      const std::vector<int32_t> think = reference_greedy_ids(tiny_model(), r.prompt, budget);
      EXPECT_EQ(std::vector<int32_t>(r.ids.begin(), r.ids.begin() + budget), think);
    }
  }
}

// The forced close costs no decode step of its own: its tokens are fed in the step of the last
// thinking token, one chunk of the sequence (budget 0: in the prompt's last chunk). Same prompt and
// length: the run with a budget takes |close| decode steps fewer than the run without; one step
// per forced token (the old way) takes as many as it. The answer is the same as on a server with the prompt
// cache and another slot (srv()).
TEST(ServerThinking, ForcedCloseTakesNoDecodeStepOfItsOwn) {
  server::ServerOptions o = server_opts();
  o.sched.parallel = 1;
  o.sched.prompt_cache = false;  // every request prefills its whole prompt: the same prefill steps
  RunningServer s(o);
  const size_t nc = s.s->scheduler().think_close().size();
  ASSERT_GT(nc, 1u);
  // (decode steps, forced tokens, forced tokens decoded in an earlier token's step) of one request
  auto run = [&](int budget, JobRun* out) {
    ojson body = {{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true}};
    if (budget >= 0) body["thinking_budget_tokens"] = budget;
    const server::SchedulerStats a = s.s->scheduler().stats();
    *out = run_job(body, s);
    const server::SchedulerStats b = s.s->scheduler().stats();
    EXPECT_EQ(out->result.n_generated, kN);
    EXPECT_EQ(b.generated_tokens - a.generated_tokens, static_cast<uint64_t>(kN));
    return std::make_tuple(b.decode_steps - a.decode_steps, b.forced_tokens - a.forced_tokens,
                           b.forced_batched - a.forced_batched);
  };
  JobRun free, capped, zero;
  const auto [steps_free, forced_free, batched_free] = run(-1, &free);
  const auto [steps_b, forced_b, batched_b] = run(kB, &capped);
  const auto [steps_0, forced_0, batched_0] = run(0, &zero);
  EXPECT_EQ(forced_free, 0u);
  EXPECT_EQ(batched_free, 0u);
  EXPECT_EQ(steps_free - steps_b, nc) << steps_free << " steps without a budget, " << steps_b << " with";
  EXPECT_EQ(forced_b, nc);
  EXPECT_EQ(batched_b, nc);
  EXPECT_EQ(steps_free - steps_0, nc) << steps_free << " steps without a budget, " << steps_0 << " with 0";
  EXPECT_EQ(forced_0, nc);
  EXPECT_EQ(batched_0, nc);
  // /metrics counts the same forced tokens (two budgeted requests)
  const std::string m = s.s->metrics_text();
  const std::string key = "\nkimi_thinking_forced_tokens_total ";
  ASSERT_NE(m.find(key), std::string::npos) << m;
  EXPECT_EQ(std::stoull(m.substr(m.find(key) + key.size())), 2 * nc);
  EXPECT_EQ(find_seq(capped.ids, s.s->scheduler().think_close()), static_cast<size_t>(kB));
  EXPECT_EQ(find_seq(zero.ids, s.s->scheduler().think_close()), 0u);
  const ojson body = {{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true},
                      {"thinking_budget_tokens", kB}};
  const JobRun other = run_job(body);
  EXPECT_EQ(capped.ids, other.ids);
  EXPECT_EQ(capped.lps, other.lps);
}

// Batch == alone: a budgeted request decoded next to another one (whose prompt chunks and decode
// rows share its steps, --parallel 2) gives the same tokens and log-probabilities as alone, and
// every token's log-probability, the forced ones too, is the model's own at its position (the
// engine on a fresh prompt holding the tokens before it). Cut by max_tokens inside the close
// sequence, the request still counts exactly max_tokens and stops where the close stood.
TEST(ServerThinking, BudgetedAnswerInABatchIsTheSameAsAlone) {
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "Tell me about topic number " + std::to_string(i) + ", please. ";
  const ojson y = {{"messages", ojson::array({{{"role", "user"}, {"content", long_text}}})},
                   {"temperature", 0}, {"max_tokens", 60}, {"ignore_eos", true}};
  // next to a long prompt's prefill chunks, then next to a short prompt's decode rows
  const ojson z = {{"messages", ojson::array({{{"role", "user"}, {"content", "Write a poem."}}})},
                   {"temperature", 0}, {"max_tokens", 60}, {"ignore_eos", true}};
  const std::vector<int32_t>& close = srv().s->scheduler().think_close();
  for (int budget : {kB, 0}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const ojson x = {{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true},
                     {"thinking_budget_tokens", budget}};
    const JobRun alone = run_job(x);
    ASSERT_EQ(static_cast<int>(alone.ids.size()), kN);
    ASSERT_EQ(find_seq(alone.ids, close), static_cast<size_t>(budget));
    for (const ojson& other : {y, z}) {
      const Submitted so = submit_job(other);
      const Submitted sx = submit_job(x);
      const JobRun bx = collect(sx);
      const JobRun bo = collect(so);
      EXPECT_EQ(bx.ids, alone.ids);
      EXPECT_EQ(bx.lps, alone.lps);
      EXPECT_EQ(bo.ids, run_job(other).ids);
    }

    const std::vector<double> ref = reference_logprobs(alone.prompt, alone.ids);
    ASSERT_EQ(ref.size(), alone.lps.size());
    for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(alone.lps[k], ref[k], 1e-4) << "token " << k;

    for (size_t cut : {size_t{1}, close.size() / 2, close.size()}) {
      const std::ptrdiff_t m = budget + static_cast<std::ptrdiff_t>(cut);
      SCOPED_TRACE("max_tokens " + std::to_string(m));
      ojson c = x;
      c["max_tokens"] = m;
      const JobRun r = run_job(c);
      EXPECT_EQ(r.result.finish_reason, server::FinishReason::Length);
      EXPECT_EQ(r.ids, std::vector<int32_t>(alone.ids.begin(), alone.ids.begin() + m));
      EXPECT_EQ(r.lps, std::vector<float>(alone.lps.begin(), alone.lps.begin() + m));
    }
  }
}

// At the end of the context (1024 positions) the close is cut where one token per step ends the
// request: a prompt leaving room for B + 7 generated tokens ends by length after B + 7 tokens, inside
// the close, with the tokens of a request cut there by max_tokens (no position past the context).
TEST(ServerThinking, ForcedCloseCutByTheContext) {
  constexpr int kB4 = 4, kRoom = kB4 + 7;
  std::string text = "Hello";
  std::vector<int32_t> prompt;
  for (int i = 0; i < 4000; ++i) {
    const ojson body = {{"messages", ojson::array({{{"role", "user"}, {"content", text}}})}};
    prompt = server::parse_chat_request(body.dump(), tiny_tok(), limits()).prompt;
    if (static_cast<int>(prompt.size()) >= 1024 - kRoom) break;
    text += " a";
  }
  ASSERT_EQ(static_cast<int>(prompt.size()), 1024 - kRoom);
  const ojson x = {{"messages", ojson::array({{{"role", "user"}, {"content", text}}})}, {"temperature", 0},
                   {"max_tokens", 100}, {"ignore_eos", true}, {"thinking_budget_tokens", kB4}};
  ojson ref_body = x;
  ref_body["max_tokens"] = kRoom;
  const JobRun ref = run_job(ref_body);
  ASSERT_EQ(static_cast<int>(ref.ids.size()), kRoom);
  EXPECT_EQ(find_seq(ref.ids, std::vector<int32_t>(srv().s->scheduler().think_close().begin(),
                                                   srv().s->scheduler().think_close().begin() + (kRoom - kB4))),
            static_cast<size_t>(kB4));
  const JobRun r = run_job(x);
  EXPECT_EQ(r.result.finish_reason, server::FinishReason::Length);
  EXPECT_EQ(r.ids, ref.ids);
  EXPECT_EQ(r.lps, ref.lps);
}

// A stop string inside the forced close ends the answer at the token that completes it, as one
// token per step did (the rest of the close, decoded in the same step, stays in the sequence's
// cache, which the next identical request resumes from with the same answer).
TEST(ServerThinking, StopStringInsideTheForcedClose) {
  const ojson x = {{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true},
                   {"thinking_budget_tokens", kB}};
  const JobRun alone = run_job(x);
  const std::vector<int32_t>& close = srv().s->scheduler().think_close();
  ASSERT_EQ(find_seq(alone.ids, close), static_cast<size_t>(kB));
  // the token of the close whose text completes "think"
  std::string raw;
  size_t upto = 0;
  for (size_t i = 0; i < close.size() && upto == 0; ++i)
    if ((raw += tiny_tok().token_to_piece(close[i])).find("think") != std::string::npos) upto = i + 1;
  ASSERT_GT(upto, 0u);
  ASSERT_LT(upto, close.size());
  ojson st = x;
  st["stop"] = ojson::array({"think"});
  for (int rep = 0; rep < 2; ++rep) {
    SCOPED_TRACE(rep);
    const JobRun r = run_job(st);
    EXPECT_EQ(r.result.finish_reason, server::FinishReason::Stop);
    EXPECT_EQ(r.result.stop_string, "think");
    EXPECT_EQ(r.ids, std::vector<int32_t>(alone.ids.begin(), alone.ids.begin() + kB + static_cast<std::ptrdiff_t>(upto)));
    const ojson c = chat(st);
    EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(c["usage"]["completion_tokens"], kB + static_cast<int>(upto));
    EXPECT_EQ(content_of(c), "");
  }
  EXPECT_EQ(run_job(x).ids, alone.ids);
}

// Budget 0 with thinking on: an empty think channel (the prompt still ends inside it, unlike
// thinking off), the answer at once; thinking off ignores a budget.
TEST(ServerThinking, BudgetZeroIsAnEmptyThinkChannel) {
  const ojson zero = chat({{"max_tokens", 16}, {"ignore_eos", true}, {"thinking_budget_tokens", 0}});
  EXPECT_EQ(reasoning_of(zero), "");
  EXPECT_FALSE(content_of(zero).empty());
  const ojson off = chat({{"max_tokens", 16}, {"ignore_eos", true}, {"thinking", false}});
  const ojson off_b = chat({{"max_tokens", 16}, {"ignore_eos", true}, {"thinking", false}, {"thinking_budget_tokens", 3}});
  EXPECT_EQ(content_of(off_b), content_of(off));
  EXPECT_EQ(off_b["usage"]["completion_tokens"], off["usage"]["completion_tokens"]);
  EXPECT_EQ(off_b["usage"]["prompt_tokens"], off["usage"]["prompt_tokens"]);
  // the prompts differ: thinking on renders the think channel open
  EXPECT_NE(zero["usage"]["prompt_tokens"], off["usage"]["prompt_tokens"]);
}

// Anthropic: thinking.budget_tokens is the cap. The thinking block equals the chat reasoning of the
// same request (budget <= 2048: effort low) cut at B tokens, the text block its answer; streamed the same.
TEST(ServerThinking, AnthropicBudgetTokensIsAHardCap) {
  const ojson ref_b = chat({{"max_tokens", kB}, {"thinking_effort", "low"}});
  ASSERT_EQ(ref_b["usage"]["completion_tokens"], kB);
  const ojson ref = chat({{"max_tokens", kN}, {"thinking_effort", "low"}, {"thinking_budget_tokens", kB}});
  const ojson ref_free = chat({{"max_tokens", kN}, {"thinking_effort", "low"}});
  EXPECT_EQ(content_of(ref_free), "");
  ASSERT_GT(reasoning_of(ref_free).size(), reasoning_of(ref_b).size());

  const ojson body = {{"model", "m"}, {"max_tokens", kN}, {"temperature", 0}, {"messages", kUser},
                      {"thinking", {{"type", "enabled"}, {"budget_tokens", kB}}}};
  int st = 0;
  const ojson r = srv().post("/v1/messages", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  std::string thinking, text;
  std::vector<std::string> types;
  for (const auto& b : r["content"]) {
    types.push_back(b["type"]);
    if (b["type"] == "thinking") thinking += b["thinking"].get<std::string>();
    if (b["type"] == "text") text += b["text"].get<std::string>();
  }
  EXPECT_EQ(types, (std::vector<std::string>{"thinking", "text"})) << r.dump();
  EXPECT_EQ(thinking, reasoning_of(ref_b));
  EXPECT_EQ(thinking, reasoning_of(ref));
  EXPECT_EQ(text, content_of(ref));
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(r["usage"]["output_tokens"], ref["usage"]["completion_tokens"]);

  ojson sb = body;
  sb["stream"] = true;
  std::string s_thinking, s_text;
  for (const auto& [name, d] : named_events(srv().post_stream("/v1/messages", sb))) {
    if (name != "content_block_delta") continue;
    if (d["delta"]["type"] == "thinking_delta") s_thinking += d["delta"]["thinking"].get<std::string>();
    if (d["delta"]["type"] == "text_delta") s_text += d["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(s_thinking, thinking);
  EXPECT_EQ(s_text, text);
}

// An enforced tool call (tool_choice required, the grammar holds the think channel too) stays valid
// across the forced close: the close starts after B thinking tokens (or up to 3 more that complete
// a UTF-8 character) and the call parses. A response_format grammar starts after the forced tag.
TEST(ServerThinking, GrammarsStayValidAcrossTheForcedClose) {
  const ojson tools = ojson::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"},
                      {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}, {"maxLength", 8}}}}},
                                      {"required", {"city"}}}}}}}});
  const ojson body = {{"messages", kUser}, {"temperature", 0}, {"max_tokens", 200}, {"tools", tools},
                      {"tool_choice", "required"}, {"thinking_budget_tokens", kB}};
  const JobRun r = run_job(body);
  const size_t at = find_seq(r.ids, srv().s->scheduler().think_close());
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(at, static_cast<size_t>(kB));
  EXPECT_LE(at, static_cast<size_t>(kB + 3));
  const ojson j = chat(body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
  const ojson& calls = j["choices"][0]["message"]["tool_calls"];
  ASSERT_TRUE(calls.is_array() && !calls.empty()) << j.dump();
  for (const auto& c : calls) {
    EXPECT_EQ(c["function"]["name"], "get_weather");
    const ojson args = ojson::parse(c["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args.contains("city") && args["city"].is_string()) << args.dump();
  }
  // tool_choice none: the grammar holds think and response (no tools section); the same close
  const JobRun none = run_job({{"messages", kUser}, {"temperature", 0}, {"max_tokens", kN}, {"ignore_eos", true},
                               {"tools", tools}, {"tool_choice", "none"}, {"thinking_budget_tokens", kB}});
  const size_t at_none = find_seq(none.ids, srv().s->scheduler().think_close());
  ASSERT_NE(at_none, std::string::npos);
  EXPECT_GE(at_none, static_cast<size_t>(kB));
  EXPECT_LE(at_none, static_cast<size_t>(kB + 3));
  EXPECT_NE(none.result.finish_reason, server::FinishReason::GrammarDeadEnd);
  // without a budget the grammar-held thinking runs on past B (max_tokens leaves the call its room:
  // a required call closes thinking at max_tokens - (3T/2 + 16) at the latest)
  const JobRun unbudgeted = run_job({{"messages", kUser}, {"temperature", 0}, {"max_tokens", 200}, {"ignore_eos", true},
                                     {"tools", tools}, {"tool_choice", "required"}});
  EXPECT_EQ(find_seq(std::vector<int32_t>(unbudgeted.ids.begin(), unbudgeted.ids.begin() + std::min<size_t>(unbudgeted.ids.size(), kB + 3 + 14)),
                     srv().s->scheduler().think_close()),
            std::string::npos);

  const ojson js = chat({{"max_tokens", 300}, {"response_format", {{"type", "json_object"}}}, {"thinking_budget_tokens", kB}});
  const std::string fr = js["choices"][0]["finish_reason"];
  EXPECT_FALSE(content_of(js).empty()) << js.dump();
  if (fr == "stop") {
    const ojson v = ojson::parse(content_of(js), nullptr, false);
    EXPECT_TRUE(v.is_object()) << content_of(js);
  } else {
    EXPECT_EQ(fr, "length") << js.dump();
  }
}

// --reasoning-budget: the cap of requests that give none (Responses too: it has no budget field,
// and its usage counts the B thinking tokens); a request's own budget wins.
TEST(ServerThinking, ServerDefaultBudget) {
  server::ServerOptions o = server_opts();
  o.sched.parallel = 1;
  o.reasoning_budget = kB;
  RunningServer s(o);
  const std::string r_b = reasoning_of(chat({{"max_tokens", kB}, {"ignore_eos", true}}));
  const ojson dflt = chat({{"max_tokens", kN}, {"ignore_eos", true}}, 200, s);
  EXPECT_EQ(reasoning_of(dflt), r_b);
  EXPECT_FALSE(content_of(dflt).empty());
  const ojson own = chat({{"max_tokens", kN}, {"ignore_eos", true}, {"thinking_budget_tokens", 2 * kB}}, 200, s);
  EXPECT_GT(reasoning_of(own).size(), r_b.size());
  EXPECT_EQ(reasoning_of(own), reasoning_of(chat({{"max_tokens", kN}, {"ignore_eos", true}, {"thinking_budget_tokens", 2 * kB}})));

  int st = 0;
  const ojson resp = s.post("/v1/responses", ojson{{"model", "m"}, {"input", "Hello, who are you?"}, {"max_output_tokens", kN},
                                                   {"temperature", 0}},
                            &st);
  ASSERT_EQ(st, 200) << resp.dump();
  std::string reasoning, text;
  for (const auto& it : resp["output"]) {
    if (it["type"] == "reasoning")
      for (const auto& c : it["content"]) reasoning += c["text"].get<std::string>();
    if (it["type"] == "message")
      for (const auto& c : it["content"]) text += c["text"].get<std::string>();
  }
  const ojson ref = chat({{"max_tokens", kN}, {"thinking_budget_tokens", kB}});
  EXPECT_EQ(reasoning, reasoning_of(ref));
  EXPECT_EQ(text, content_of(ref));
  // usage: the thinking tokens the scheduler counted (the Responses API reports them)
  EXPECT_EQ(resp["usage"]["output_tokens_details"]["reasoning_tokens"], kB) << resp["usage"].dump();
  EXPECT_EQ(resp["usage"]["output_tokens"], kN);
  // /props shows the default (null: no cap)
  EXPECT_EQ(s.get("/props")["default_generation_settings"]["thinking_budget_tokens"], kB);
  EXPECT_TRUE(srv().get("/props")["default_generation_settings"]["thinking_budget_tokens"].is_null());

  server::ServerOptions bad = server_opts();
  bad.reasoning_budget = -2;
  EXPECT_THROW(server::Server{bad}, std::exception);
  const RunResult cli = run_kimi("serve -m " + tiny_gguf() + " --port 0 --reasoning-budget -2");
  EXPECT_NE(cli.exit_code, 0);
  EXPECT_NE(cli.out.find("--reasoning-budget"), std::string::npos) << cli.out;
}

TEST(ServerThinking, BadBudgetIs400NamingTheField) {
  for (const char* v : {"-1", "\"8\"", "1.5", "true", "4294967296", "[1]"}) {
    SCOPED_TRACE(v);
    const ojson r = chat({{"max_tokens", 4}, {"thinking_budget_tokens", ojson::parse(v)}}, 400);
    EXPECT_EQ(r["error"]["param"], "thinking_budget_tokens") << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find("thinking_budget_tokens"), std::string::npos) << r.dump();
  }
  for (const char* v : {"0", "-5", "\"1024\"", "2.5"}) {
    SCOPED_TRACE(v);
    int st = 0;
    const ojson r = srv().post("/v1/messages", ojson{{"model", "m"}, {"max_tokens", 8}, {"messages", kUser},
                                                     {"thinking", {{"type", "enabled"}, {"budget_tokens", ojson::parse(v)}}}},
                               &st);
    EXPECT_EQ(st, 400) << r.dump();
    EXPECT_EQ(r["error"]["type"], "invalid_request_error") << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find("thinking.budget_tokens"), std::string::npos) << r.dump();
  }
}

// Issue 38's repro: on the tiny model this request thinks past a bare <|close|> (one that no tag
// name and <|sep|> follow); the budget stopped counting there and the answer held 234 tokens of
// reasoning. The budget counts every think-channel token until a whole tag leaves the channel, and
// the bare tags do not reach the client.
TEST(ServerThinking, BudgetCountsPastABareCloseTag) {
  const ojson r = chat({{"messages", ojson::array({{{"role", "user"}, {"content", "say hi"}}})}, {"thinking_budget_tokens", 32},
                        {"max_tokens", 400}, {"seed", 91}, {"temperature", 1}, {"top_p", 1}});
  const std::string reasoning = reasoning_of(r);
  const JobRun j = run_job({{"messages", ojson::array({{{"role", "user"}, {"content", "say hi"}}})}, {"thinking_budget_tokens", 32},
                            {"max_tokens", 120}, {"seed", 91}, {"temperature", 1}, {"top_p", 1}, {"ignore_eos", true}});
  EXPECT_GE(j.result.n_thinking, 32);
  EXPECT_LE(j.result.n_thinking, 32 + 3) << r.dump();
  const size_t at = find_seq(j.ids, srv().s->scheduler().think_close());  // the forced close came
  EXPECT_GE(at, 32u);
  EXPECT_LE(at, 32u + 3u);
  for (const char* tag : {"<|open|>", "<|close|>", "<|sep|>"}) EXPECT_EQ(reasoning.find(tag), std::string::npos) << r.dump();
}
