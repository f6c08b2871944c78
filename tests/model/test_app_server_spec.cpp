// kimi serve with speculative decoding per request ("speculative": {"type": "ngram", ...}): greedy
// answers with drafts equal those without, token for token and logprob for logprob, while another
// request without speculation runs in the same batches (n-gram drafts, and the DSpark draft of -md);
// the counters in /metrics; bad values 400.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <thread>

#include "runtime/speculative.h"
#include "server_fixture.h"

using namespace kimi;
using namespace kimi::test;

namespace {

std::vector<int32_t> ids(int n, uint32_t seed) {
  std::vector<int32_t> v;
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v.push_back(static_cast<int32_t>(300 + (x >> 8) % 600));
  }
  return v;
}

ojson completion(const std::vector<int32_t>& prompt, int n, const ojson& spec = nullptr) {
  ojson b = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 1}};
  if (!spec.is_null()) b["speculative"] = spec;
  return b;
}

// the DSpark draft of the tiny test model (kimi synth --preset dspark-tiny + kimi convert), made once
const std::string& dspark_draft() {
  static TempDir dir;
  static const std::string path = [] {
    const std::string hf = dir.file("draft-hf"), gguf = dir.file("draft.gguf");
    auto r = run_kimi(fmt::format("synth --preset dspark-tiny --seed 3 -q -o {}", hf));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    r = run_kimi(fmt::format("convert {} -o {} --quiet", hf, gguf));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return gguf;
  }();
  return path;
}

double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

}  // namespace

// A prompt the model's greedy continuation of which it then sees again: P + G + P, where G is what
// the model writes after P; after the second P the n-gram drafter proposes G (mostly right).
TEST(ServerSpec, NgramEqualsPlainWithABatchNeighbour) {
  auto o = server_opts();
  o.quiet = true;
  RunningServer s(o);
  auto m = Model::load(o.model_path);
  const std::vector<int32_t> P = ids(24, 5);
  const std::vector<int32_t> G = reference_greedy_ids(*m, P, 40);
  std::vector<int32_t> prompt = P;
  prompt.insert(prompt.end(), G.begin(), G.end());
  prompt.insert(prompt.end(), P.begin(), P.end());

  int st = 0;
  const ojson plain = s.post("/v1/completions", completion(prompt, 48), &st);
  ASSERT_EQ(st, 200) << plain.dump();
  const ojson plain_b = s.post("/v1/completions", completion(ids(30, 9), 24), &st);
  ASSERT_EQ(st, 200) << plain_b.dump();

  // the neighbour: a long request without speculation, running when the speculative one starts
  ojson neighbour;
  std::thread tb([&] {
    ojson body = completion(ids(30, 9), 300);
    neighbour = s.post("/v1/completions", body);
  });
  // wait until it is decoding (a condition, not a delay)
  for (int i = 0; i < 20000; ++i) {
    const ojson slots = s.get("/slots");
    bool busy = false;
    for (const auto& sl : slots)
      if (sl.value("is_processing", false) && sl.contains("request") && sl["request"].value("n_decoded", 0) > 0)
        busy = true;
    if (busy) break;
    std::this_thread::yield();
  }
  const ojson spec = s.post("/v1/completions", completion(prompt, 48, {{"type", "ngram"}, {"n_max", 6}}), &st);
  tb.join();
  ASSERT_EQ(st, 200) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
  EXPECT_EQ(spec["choices"][0]["logprobs"]["tokens"], plain["choices"][0]["logprobs"]["tokens"]);
  EXPECT_EQ(spec["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
  EXPECT_EQ(spec["usage"]["completion_tokens"], 48);
  // the neighbour's first 24 tokens are the short plain run's
  ASSERT_EQ(neighbour["choices"][0]["logprobs"]["token_logprobs"].size(), 300u);
  for (size_t i = 0; i < 24; ++i)
    EXPECT_EQ(neighbour["choices"][0]["logprobs"]["token_logprobs"][i], plain_b["choices"][0]["logprobs"]["token_logprobs"][i]) << i;

  auto c = s.client();
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  const double drafted = metric(res->body, "kimi_spec_drafted_tokens_total");
  const double accepted = metric(res->body, "kimi_spec_accepted_tokens_total");
  EXPECT_GT(drafted, 0) << res->body;  // (the synthetic model rarely repeats: few drafts are right)
  EXPECT_GE(accepted, 0) << res->body;
  EXPECT_LE(accepted, drafted);
  EXPECT_GT(metric(res->body, "kimi_spec_verify_steps_total"), 0);

  // the same with the server's default (--spec ngram) and a request that turns it off
  auto o2 = o;
  o2.sched.spec_type = SpecType::Ngram;
  o2.sched.spec.n_max = 3;
  RunningServer s2(o2);
  const ojson d = s2.post("/v1/completions", completion(prompt, 48), &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(d["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
  const ojson off = s2.post("/v1/completions", completion(prompt, 48, {{"type", "off"}}), &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(off["choices"][0]["text"], plain["choices"][0]["text"]);
}

namespace {

// Proposes the reference answer, wrong at one block position (-1: never): acceptances and rejections
// where the test wants them.
struct OracleDrafter final : Drafter {
  std::shared_ptr<std::vector<int32_t>> truth;
  int wrong_at = -1, block = 4;
  std::string name() const override { return "oracle"; }
  int propose(std::span<const int32_t> t, int n_max, std::vector<int32_t>& draft) override {
    draft.clear();
    const auto& T = *truth;
    if (t.size() >= T.size() || !std::equal(t.begin(), t.end(), T.begin())) return 0;
    for (int j = 0; j < std::min(n_max, block) && t.size() + static_cast<size_t>(j) < T.size(); ++j)
      draft.push_back(j == wrong_at ? (T[t.size() + static_cast<size_t>(j)] + 1) % 1000 : T[t.size() + static_cast<size_t>(j)]);
    return static_cast<int>(draft.size());
  }
};

// Quiet server options whose n-gram drafter is an OracleDrafter reading `truth` and `wrong` (set
// them before each request: every sequence's drafter is made when its request is admitted).
auto oracle_server_opts(std::shared_ptr<std::vector<int32_t>> truth, std::shared_ptr<int> wrong) {
  auto o = server_opts();
  o.quiet = true;
  o.sched.make_drafter = [truth, wrong] {
    auto d = std::make_unique<OracleDrafter>();
    d->truth = truth;
    d->wrong_at = *wrong;
    return d;
  };
  return o;
}

// Returns once some slot of `s` has decoded a token (checked up to 20 000 times).
void wait_until_a_slot_decodes(RunningServer& s) {
  for (int i = 0; i < 20000; ++i) {
    for (const auto& sl : s.get("/slots"))
      if (sl.value("is_processing", false) && sl.contains("request") && sl["request"].value("n_decoded", 0) > 0) return;
    std::this_thread::yield();
  }
}

}  // namespace

// Drafts right up to block position j and wrong there, for every j (and always right): the answer is
// the plain greedy answer token for token and logprob for logprob, while a request without drafts
// decodes in the same steps; the accepted and recomputed counters move as the positions say.
TEST(ServerSpec, RejectionAtEveryBlockPositionEqualsPlain) {
  auto truth = std::make_shared<std::vector<int32_t>>();
  auto wrong = std::make_shared<int>(-1);
  auto o = oracle_server_opts(truth, wrong);
  RunningServer s(o);
  auto m = Model::load(o.model_path);
  const std::vector<int32_t> P = ids(20, 7);
  *truth = P;
  const std::vector<int32_t> G = reference_greedy_ids(*m, P, 40);
  truth->insert(truth->end(), G.begin(), G.end());
  int st = 0;
  const ojson plain = s.post("/v1/completions", completion(P, 40), &st);
  ASSERT_EQ(st, 200) << plain.dump();
  double last_acc = 0;
  for (int j = -1; j < 4; ++j) {
    *wrong = j;
    ojson neighbour;
    std::thread tb([&] { neighbour = s.post("/v1/completions", completion(ids(30, 9), 60)); });
    wait_until_a_slot_decodes(s);  // the neighbour decoding first (a condition, not a delay)
    const ojson got = s.post("/v1/completions", completion(P, 40, {{"type", "ngram"}, {"n_max", 4}}), &st);
    tb.join();
    ASSERT_EQ(st, 200) << got.dump();
    EXPECT_EQ(got["choices"][0]["text"], plain["choices"][0]["text"]) << j;
    EXPECT_EQ(got["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]) << j;
    EXPECT_EQ(neighbour["usage"]["completion_tokens"], 60);
    auto c = s.client();
    auto res = c.Get("/metrics");
    ASSERT_TRUE(res);
    const double acc = metric(res->body, "kimi_spec_accepted_tokens_total");
    if (j != 0) {
      EXPECT_GT(acc, last_acc) << j << res->body;  // drafts kept
    } else {
      EXPECT_EQ(acc, last_acc) << res->body;  // wrong at 0: nothing kept
    }
    if (j >= 0) EXPECT_GT(metric(res->body, "kimi_spec_recomputed_tokens_total"), 0) << res->body;
    last_acc = acc;
  }
}

// "speculative": {"type": "auto"} decides per request from the verify-cost model and the request's
// running acceptance (SpecAuto, docs/speculative.md "auto in kimi serve"): a drafter that is always
// wrong drafts in its first step (the probe) and then only in the probes after 8 and 16 plain steps
// (60 tokens: 59 steps, the last with no room for a draft; 3 probes of 4 drafts, 8 + 16 + 31 plain
// steps) where the same drafter as "ngram" drafts in nearly every step; one that is always right drafts in every step, beside a request without drafts
// too. Greedy answers equal the plain answers token for token and logprob for logprob in both cases.
TEST(ServerSpec, AutoStopsWrongDraftsAndKeepsRightOnes) {
  auto truth = std::make_shared<std::vector<int32_t>>();
  auto wrong = std::make_shared<int>(-1);
  auto o = oracle_server_opts(truth, wrong);
  auto m = Model::load(o.model_path);
  const std::vector<int32_t> P = ids(20, 7);
  const int N = 60;
  *truth = P;
  const std::vector<int32_t> G = reference_greedy_ids(*m, P, N + 8);
  truth->insert(truth->end(), G.begin(), G.end());
  auto counters = [](RunningServer& s) {
    auto c = s.client();
    auto res = c.Get("/metrics");
    EXPECT_TRUE(res);
    return std::array<double, 4>{metric(res->body, "kimi_spec_drafted_tokens_total"),
                                 metric(res->body, "kimi_spec_accepted_tokens_total"),
                                 metric(res->body, "kimi_spec_verify_steps_total"),
                                 metric(res->body, "kimi_spec_paused_steps_total")};
  };
  int st = 0;
  ojson plain;
  {
    RunningServer s(o);
    plain = s.post("/v1/completions", completion(P, N), &st);
    ASSERT_EQ(st, 200) << plain.dump();
    ASSERT_EQ(plain["choices"][0]["logprobs"]["token_logprobs"].size(), static_cast<size_t>(N));
  }
  {  // always wrong (at block position 0: nothing is ever kept)
    *wrong = 0;
    RunningServer s(o);
    const ojson got = s.post("/v1/completions", completion(P, N, {{"type", "auto"}, {"n_max", 4}}), &st);
    ASSERT_EQ(st, 200) << got.dump();
    EXPECT_EQ(got["choices"][0]["text"], plain["choices"][0]["text"]);
    EXPECT_EQ(got["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
    const auto c = counters(s);
    EXPECT_EQ(c[0], 12) << "drafted";  // probes at steps 1, 10 and 27, 4 drafts each
    EXPECT_EQ(c[1], 0) << "accepted";
    EXPECT_EQ(c[2], 3) << "verify steps";
    EXPECT_EQ(c[3], 55) << "plain steps";  // 8 + 16 + 31: the rest of the 58 steps with room for a draft
    // the same drafter as "ngram" (no cost decision) drafts in every step but those that commit the
    // kept tokens waiting after rollbacks (one in 6 here)
    const ojson ng = s.post("/v1/completions", completion(P, N, {{"type", "ngram"}, {"n_max", 4}}), &st);
    ASSERT_EQ(st, 200) << ng.dump();
    EXPECT_EQ(ng["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
    const auto c2 = counters(s);
    EXPECT_GT(c2[0] - c[0], 10 * c[0]) << "ngram drafted";
    EXPECT_GT(c2[2] - c[2], 40) << "ngram verify steps";
    EXPECT_EQ(c2[3], c[3]);  // "ngram" never pauses
  }
  {  // always right: drafts in every step, alone and beside a request without drafts
    *wrong = -1;
    RunningServer s(o);
    const ojson got = s.post("/v1/completions", completion(P, N, {{"type", "auto"}, {"n_max", 4}}), &st);
    ASSERT_EQ(st, 200) << got.dump();
    EXPECT_EQ(got["choices"][0]["text"], plain["choices"][0]["text"]);
    EXPECT_EQ(got["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
    auto c = counters(s);
    EXPECT_EQ(c[3], 0) << "plain steps";
    EXPECT_EQ(c[1], c[0]);
    // 59 steps' worth of tokens in verify steps of up to 4 drafts + 1: at least 11 steps, each drafting
    EXPECT_GE(c[0], 44);
    EXPECT_LE(c[2], 15);

    ojson neighbour;
    std::thread tb([&] { neighbour = s.post("/v1/completions", completion(ids(30, 9), 200)); });
    wait_until_a_slot_decodes(s);  // the neighbour decoding first (a condition, not a delay)
    const ojson got2 = s.post("/v1/completions", completion(P, N, {{"type", "auto"}, {"n_max", 4}}), &st);
    tb.join();
    ASSERT_EQ(st, 200) << got2.dump();
    EXPECT_EQ(got2["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
    EXPECT_EQ(neighbour["usage"]["completion_tokens"], 200);
    const auto c2 = counters(s);
    EXPECT_EQ(c2[3], 0) << "plain steps";
    EXPECT_GE(c2[0] - c[0], 44);
    EXPECT_EQ(c2[1] - c[1], c2[0] - c[0]);
  }
}

// "speculative": {"type": "dspark"} with the server's DSpark draft (-md): greedy answers equal the
// plain answers token for token and logprob for logprob, with a request without speculation and an
// n-gram request decoding in the same steps; the random synthetic draft is almost never right, so
// nearly every verify step rolls back (rows and KDA states). A second identical request reuses its
// sequence's cached prompt (the draft saw it) and drafts again.
TEST(ServerSpec, DsparkEqualsPlainWithBatchNeighbours) {
  auto o = server_opts();
  o.quiet = true;
  o.sched.draft_model = dspark_draft();
  o.sched.draft_threads = 1;
  RunningServer s(o);
  const std::vector<int32_t> P = ids(40, 11), Q = ids(30, 9), R = ids(26, 4);
  int st = 0;
  const ojson plain = s.post("/v1/completions", completion(P, 40), &st);
  ASSERT_EQ(st, 200) << plain.dump();
  const ojson plain_r = s.post("/v1/completions", completion(R, 30), &st);
  ASSERT_EQ(st, 200) << plain_r.dump();
  const ojson plain_q = s.post("/v1/completions", completion(Q, 24), &st);
  ASSERT_EQ(st, 200) << plain_q.dump();
  double last_drafted = 0;
  for (int round = 0; round < 2; ++round) {
    ojson neighbour, ngram;
    std::thread tb([&] { neighbour = s.post("/v1/completions", completion(Q, 200)); });
    std::thread tc([&] { ngram = s.post("/v1/completions", completion(R, 30, {{"type", "ngram"}, {"n_max", 3}})); });
    wait_until_a_slot_decodes(s);  // the neighbour decoding first (a condition, not a delay)
    const ojson ds = s.post("/v1/completions", completion(P, 40, {{"type", "dspark"}, {"n_max", 7}}), &st);
    tb.join();
    tc.join();
    ASSERT_EQ(st, 200) << ds.dump();
    EXPECT_EQ(ds["choices"][0]["text"], plain["choices"][0]["text"]) << round;
    EXPECT_EQ(ds["choices"][0]["logprobs"]["tokens"], plain["choices"][0]["logprobs"]["tokens"]) << round;
    EXPECT_EQ(ds["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]) << round;
    EXPECT_EQ(ngram["choices"][0]["logprobs"]["token_logprobs"], plain_r["choices"][0]["logprobs"]["token_logprobs"]);
    // the second time the prompt is resumed from the sequence whose draft saw it
    if (round == 1) EXPECT_GT(ds["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 30) << ds.dump();
    ASSERT_EQ(neighbour["choices"][0]["logprobs"]["token_logprobs"].size(), 200u);
    for (size_t i = 0; i < 24; ++i)
      EXPECT_EQ(neighbour["choices"][0]["logprobs"]["token_logprobs"][i], plain_q["choices"][0]["logprobs"]["token_logprobs"][i]) << i;
    auto c = s.client();
    auto res = c.Get("/metrics");
    ASSERT_TRUE(res);
    const double drafted = metric(res->body, "kimi_spec_drafted_tokens_total");
    EXPECT_GT(drafted, last_drafted + 40) << round << res->body;  // it drafted at (nearly) every step
    EXPECT_GT(metric(res->body, "kimi_spec_recomputed_tokens_total"), 0) << res->body;  // KDA rollbacks
    last_drafted = drafted;
  }
  {  // "auto" drafts with the -md draft, and stops: the random draft is (nearly) never right
    const ojson au = s.post("/v1/completions", completion(P, 40, {{"type", "auto"}, {"n_max", 7}}), &st);
    ASSERT_EQ(st, 200) << au.dump();
    EXPECT_EQ(au["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
    auto c = s.client();
    auto res = c.Get("/metrics");
    ASSERT_TRUE(res);
    EXPECT_GT(metric(res->body, "kimi_spec_drafted_tokens_total"), last_drafted) << res->body;  // the probe
    EXPECT_GT(metric(res->body, "kimi_spec_paused_steps_total"), 20) << res->body;
  }
  // the server's default: --spec dspark; a request may turn it off
  auto o2 = o;
  o2.sched.spec_type = SpecType::Dspark;
  o2.sched.spec.n_max = 5;
  RunningServer s2(o2);
  const ojson d = s2.post("/v1/completions", completion(P, 40), &st);
  ASSERT_EQ(st, 200) << d.dump();
  EXPECT_EQ(d["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
  auto c2 = s2.client();
  auto res2 = c2.Get("/metrics");
  ASSERT_TRUE(res2);
  EXPECT_GT(metric(res2->body, "kimi_spec_drafted_tokens_total"), 40) << res2->body;
}

TEST(ServerSpec, BadSpeculativeFieldsAre400) {
  auto o = server_opts();
  o.quiet = true;
  RunningServer s(o);
  for (const ojson& bad : {ojson("ngram"), ojson{{"type", "medusa"}}, ojson{{"type", 3}}, ojson{{"n_max", -1}},
                           ojson{{"n_max", 1000}}, ojson{{"n_min", "2"}}, ojson{{"type", "dspark"}}}) {
    int st = 0;
    const ojson r = s.post("/v1/completions", completion(ids(5, 1), 4, bad), &st);
    EXPECT_EQ(st, 400) << bad.dump() << " -> " << r.dump();
    EXPECT_NE(r.dump().find("speculative"), std::string::npos) << r.dump();
  }
  int st = 0;
  ojson flat = completion(ids(5, 1), 4);
  flat["speculative.n_max"] = 4;  // llama-server's flat form
  s.post("/v1/completions", flat, &st);
  EXPECT_EQ(st, 200);
  flat["speculative.n_max"] = -3;
  s.post("/v1/completions", flat, &st);
  EXPECT_EQ(st, 400);
}
