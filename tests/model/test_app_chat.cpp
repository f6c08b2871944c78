// kimi chat and runtime/chat_session: multi-turn caching (only new tokens are prefilled, the cache
// always equals the tokenized rendering of the conversation, replies equal a fresh full-prompt run),
// /reset, /save, /system, multi-line input, interruption and bad flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/chat_session.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace kimi;
using kimi::tok::ojson;

namespace {

struct ChatFixture : ::testing::Test {
  static inline std::string gguf;
  static inline std::unique_ptr<Model> model;
  static inline std::unique_ptr<tok::Tokenizer> tokz;
  static void SetUpTestSuite() {
    gguf = test::tiny_gguf();
    model = Model::load(gguf);
    tokz = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_gguf(model->reader()));
  }
  static void TearDownTestSuite() {
    tokz.reset();
    model.reset();
  }
  static ContextOptions opts(int n_ctx = 2048, int n_batch = 64) {
    ContextOptions o;
    o.n_threads = 1;
    o.n_ctx_max = n_ctx;
    o.n_batch_max = n_batch;
    o.precision = Precision::F32;
    return o;
  }
  // The reference: the request body rendered by the chat template and tokenized, independently of
  // the session's bookkeeping.
  static std::vector<int32_t> tokens_of(const ojson& messages, bool thinking = true) {
    ojson body = {{"thinking", thinking}, {"messages", messages}};
    return tokz->encode(tok::render_chat_request(body));
  }
  static ojson msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }
};

// greedy generation from a fresh context holding `prompt` (one batch), stopping like the session
std::vector<int32_t> fresh_greedy(const Model& m, const tok::Tokenizer& tk, const std::vector<int32_t>& prompt, int n) {
  ContextOptions o;
  o.n_threads = 1;
  o.n_ctx_max = 2048;
  o.n_batch_max = 1024;
  o.precision = Precision::F32;
  Context ctx(m, o);
  Sampler s(SamplerParams{}, ctx.n_vocab());
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  ctx.decode(b);
  const float* lg = ctx.logits(b.size() - 1);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(lg);
    out.push_back(t);
    if (tk.is_eog(t) || t == m.hparams().eos_id || i + 1 == n) break;
    b.clear();
    b.add(t, 0, ctx.seq_len(0), true);
    ctx.decode(b);
    lg = ctx.logits(0);
  }
  return out;
}

TEST_F(ChatFixture, CachedTurnsEqualFreshFullPromptRun) {
  // (thinking, max tokens per reply): with this tiny model both the exact extension and the
  // re-tokenized-reply path occur (counted below)
  int n_exact = 0, n_rerendered = 0;
  for (auto [thinking, max_tokens] : {std::pair{true, 10}, std::pair{false, 8}, std::pair{false, 3}}) {
    Context ctx(*model, opts());
    ChatOptions co;
    co.max_tokens = max_tokens;
    co.thinking = thinking;
    ChatSession s(ctx, *tokz, SamplerParams{}, co);

    ojson msgs = ojson::array();
    std::vector<int32_t> prev_prompt;
    size_t prev_reply = 0;
    const std::vector<std::string> users = {"Hello, who are you?", "Tell me about rivers.", "And mountains?"};
    for (size_t k = 0; k < users.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "thinking " << thinking << ", turn " << k);
      msgs.push_back(msg("user", users[k]));
      const std::vector<int32_t> expect = tokens_of(msgs, thinking);
      const TurnStats st = s.prefill_turn(users[k]);
      ASSERT_FALSE(st.interrupted);
      // the context holds exactly the tokenized rendering of the whole conversation
      EXPECT_EQ(s.cached_tokens(), expect);
      EXPECT_EQ(ctx.seq_len(0), static_cast<int32_t>(expect.size()));
      EXPECT_EQ(st.n_prompt, static_cast<int>(expect.size()));
      EXPECT_EQ(st.n_reused + st.n_prefilled, st.n_prompt);
      if (k == 0) {
        EXPECT_EQ(st.n_reused, 0);
      } else if (!st.rerendered) {
        // everything cached (previous prompt + the evaluated reply tokens) was reused
        EXPECT_EQ(st.n_reused, static_cast<int>(prev_prompt.size() + prev_reply - 1));
        ++n_exact;
      } else {
        // the reply re-tokenized differently: back to the snapshot at the end of the previous prompt
        EXPECT_EQ(st.n_reused, static_cast<int>(prev_prompt.size())) << st.note;
        EXPECT_FALSE(st.note.empty());
        ++n_rerendered;
      }
      const ReplyStats r = s.generate();
      ASSERT_FALSE(r.tokens.empty());
      // caching is exact: the reply equals a fresh run of the full rendered prompt
      EXPECT_EQ(r.tokens, fresh_greedy(*model, *tokz, expect, co.max_tokens));
      ojson a = msg("assistant", r.content);
      if (thinking) a["reasoning_content"] = r.reasoning;
      msgs.push_back(a);
      prev_prompt = expect;
      prev_reply = r.tokens.size();
    }
    EXPECT_EQ(s.n_turns(), 3);
    EXPECT_EQ(s.messages(), msgs);
  }
  EXPECT_GT(n_exact, 0);
  EXPECT_GT(n_rerendered, 0);
}

TEST_F(ChatFixture, EmptyRepliesExtendExactlyAndPrefillOnlyNewTokens) {
  for (bool thinking : {true, false}) {
    Context ctx(*model, opts());
    ChatOptions co;
    co.max_tokens = 0;  // the reply is empty: its re-rendering is exactly the closing tags
    co.thinking = thinking;
    co.system = "You are terse.";
    ChatSession s(ctx, *tokz, SamplerParams{}, co);
    ojson msgs = ojson::array({msg("system", "You are terse.")});
    size_t prev = 0;
    for (const char* u : {"one", "two", "three"}) {
      msgs.push_back(msg("user", u));
      const auto expect = tokens_of(msgs, thinking);
      const TurnStats st = s.prefill_turn(u);
      EXPECT_FALSE(st.rerendered) << st.note;
      EXPECT_EQ(st.n_reused, static_cast<int>(prev));
      EXPECT_EQ(st.n_prefilled, static_cast<int>(expect.size() - prev));
      EXPECT_EQ(s.cached_tokens(), expect);
      const ReplyStats r = s.generate();
      EXPECT_EQ(r.stop, StopReason::MaxTokens);
      EXPECT_TRUE(r.tokens.empty());
      ojson a = msg("assistant", "");
      if (thinking) a["reasoning_content"] = "";
      msgs.push_back(a);
      prev = expect.size();
    }
  }
}

TEST_F(ChatFixture, SystemChangeResetAndInterruptionKeepTheCacheConsistent) {
  Context ctx(*model, opts(2048, 16));
  ChatOptions co;
  co.max_tokens = 4;
  ChatSession s(ctx, *tokz, SamplerParams{}, co);
  s.prefill_turn("first");
  s.generate();

  // a new system message changes the start of the rendering: full re-prefill (KDA layers present)
  s.set_system("Answer in French.");
  ojson msgs = s.messages();
  msgs.push_back(msg("user", "second"));
  TurnStats st = s.prefill_turn("second");
  EXPECT_TRUE(st.rerendered);
  EXPECT_NE(st.note.find("re-prefilling all"), std::string::npos) << st.note;
  EXPECT_EQ(st.n_reused, 0);
  EXPECT_EQ(s.cached_tokens(), tokens_of(msgs));
  EXPECT_EQ(s.messages()[0], msg("system", "Answer in French."));
  const ReplyStats r = s.generate();
  EXPECT_EQ(r.tokens, fresh_greedy(*model, *tokz, tokens_of(msgs), co.max_tokens));

  // a prefill stopped after the first micro-batch drops the message; the next turn recovers
  int calls = 0;
  const size_t before = s.messages().size();
  st = s.prefill_turn("this one is interrupted", [&] { return ++calls > 1; });
  EXPECT_TRUE(st.interrupted);
  EXPECT_EQ(st.n_prefilled, 16);
  EXPECT_EQ(s.messages().size(), before);
  EXPECT_EQ(ctx.seq_len(0), static_cast<int32_t>(s.cached_tokens().size()));
  EXPECT_THROW(s.generate(), Error);
  msgs = s.messages();
  msgs.push_back(msg("user", "third"));
  st = s.prefill_turn("third");
  EXPECT_EQ(s.cached_tokens(), tokens_of(msgs));
  EXPECT_GT(st.n_reused, 0);  // back to the snapshot at the end of the previous prompt

  // generation stopped between tokens
  int n = 0;
  const ReplyStats ri = s.generate({}, [&] { return ++n > 2; });
  EXPECT_EQ(ri.stop, StopReason::Interrupted);
  EXPECT_EQ(ri.tokens.size(), 2u);

  // /reset: only the system message stays, the next turn starts from an empty cache
  s.reset();
  EXPECT_EQ(s.n_turns(), 0);
  EXPECT_EQ(ctx.seq_len(0), 0);
  st = s.prefill_turn("again");
  EXPECT_EQ(st.n_reused, 0);
  EXPECT_EQ(s.cached_tokens(), tokens_of(ojson::array({msg("system", "Answer in French."), msg("user", "again")})));
}

TEST_F(ChatFixture, PromptTooLongForTheContextIsAnErrorAndNothingChanges) {
  Context ctx(*model, opts(96, 32));
  ChatSession s(ctx, *tokz, SamplerParams{}, {});
  try {
    s.prefill_turn("hello");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context of 96 tokens"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.messages().size(), 0u);
  EXPECT_EQ(ctx.seq_len(0), 0);
}

TEST_F(ChatFixture, SaveWritesTheRequestBodyAndRenderSingleTurnMatchesTheTemplate) {
  Context ctx(*model, opts());
  ChatOptions co;
  co.max_tokens = 3;
  co.system = "sys \"quoted\"";
  ChatSession s(ctx, *tokz, SamplerParams{}, co);
  s.prefill_turn("hi\nthere");
  const ReplyStats r = s.generate();
  test::TempDir d;
  s.save(d.file("c.json"));
  const ojson j = ojson::parse(test::read_file(d.file("c.json")));
  EXPECT_EQ(j["thinking"], true);
  ASSERT_EQ(j["messages"].size(), 3u);
  EXPECT_EQ(j["messages"][0], msg("system", "sys \"quoted\""));
  EXPECT_EQ(j["messages"][1], msg("user", "hi\nthere"));
  EXPECT_EQ(j["messages"][2]["role"], "assistant");
  EXPECT_EQ(j["messages"][2]["reasoning_content"], r.reasoning);
  EXPECT_EQ(j["messages"][2]["content"], r.content);
  EXPECT_THROW(s.save(d.file("no/such/dir/c.json")), Error);

  const ojson body = {{"thinking", false}, {"messages", {msg("system", "S"), msg("user", "U")}}};
  EXPECT_EQ(render_single_turn("U", "S", false), tok::render_chat_request(body));
  const std::string p = render_single_turn("U");
  EXPECT_EQ(p.substr(p.size() - std::string("<|open|>think<|sep|>").size()), "<|open|>think<|sep|>");
}

// ---- the command

struct TurnLine {
  int prompt, fresh, reused, reply;
};
std::vector<TurnLine> turn_lines(const std::string& out) {
  std::vector<TurnLine> v;
  const std::regex re(R"(\[prompt (\d+) tokens: (\d+) new, (\d+) reused, [^|]*\| reply (\d+) tokens)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3]), std::stoi((*it)[4])});
  return v;
}

TEST_F(ChatFixture, PipedThreeTurnConversationPrefillsOnlyNewTokens) {
  test::TempDir d;
  const std::string conv = d.file("conv.json");
  test::write_file(d.file("in.txt"), "What is a river?\nname two\\\nrivers\n\"\"\"\nblock line\n\nlast line\"\"\"\n/save " +
                                         conv + "\n");
  const auto r = test::run_kimi("chat -m " + gguf + " -n 8 -t 1 < " + d.file("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto turns = turn_lines(r.out);
  ASSERT_EQ(turns.size(), 3u) << r.out;
  EXPECT_NE(r.out.find("(saved 6 messages to " + conv + ")"), std::string::npos) << r.out;

  const ojson j = ojson::parse(test::read_file(conv));
  const ojson& m = j["messages"];
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0], msg("user", "What is a river?"));
  EXPECT_EQ(m[2], msg("user", "name two\nrivers"));
  EXPECT_EQ(m[4], msg("user", "block line\n\nlast line"));
  ojson hist = ojson::array();
  size_t prev = 0;
  int n_rerendered = 0;
  for (size_t k = 0; k < 3; ++k) {
    hist.push_back(m[2 * k]);
    const size_t n = tokens_of(hist).size();
    EXPECT_EQ(turns[k].prompt, static_cast<int>(n));
    EXPECT_EQ(turns[k].fresh + turns[k].reused, turns[k].prompt);
    EXPECT_LE(turns[k].reply, 8);  // -n 8
    if (k == 0) {
      EXPECT_EQ(turns[k].reused, 0);
    } else {
      // only the new tokens: everything cached (previous prompt + the evaluated reply tokens) is
      // reused, or, when the reply re-tokenized differently (noted), everything up to its start
      const int all = static_cast<int>(prev) + turns[k - 1].reply - 1;
      EXPECT_TRUE(turns[k].reused == all || turns[k].reused == static_cast<int>(prev)) << r.out;
      n_rerendered += turns[k].reused != all;
    }
    hist.push_back(m[2 * k + 1]);
    prev = n;
  }
  size_t n_notes = 0;
  for (size_t p = r.out.find("note: the conversation re-renders differently"); p != std::string::npos;
       p = r.out.find("note: the conversation re-renders differently", p + 1))
    ++n_notes;
  EXPECT_EQ(n_notes, static_cast<size_t>(n_rerendered)) << r.out;
}

TEST_F(ChatFixture, PipedResetSystemAndCommands) {
  test::TempDir d;
  test::write_file(d.file("in.txt"),
                   "hello\n/bogus\n/save\n/reset\n//slash text\n/system Be brief.\nok\n/save " + d.file("c.json") +
                       "\n/exit\nnever sent\n");
  const auto r = test::run_kimi("chat -m " + gguf + " -n 3 -t 1 --thinking off < " + d.file("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("unknown command /bogus"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/save needs a file name"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(conversation cleared)"), std::string::npos) << r.out;
  const auto turns = turn_lines(r.out);
  ASSERT_EQ(turns.size(), 3u) << r.out;
  // after /reset the conversation is just the new message
  const auto single = tokens_of(ojson::array({msg("user", "/slash text")}), false);
  EXPECT_EQ(turns[1].prompt, static_cast<int>(single.size()));
  EXPECT_EQ(turns[1].reused, 0);
  // the new system message re-renders from the start: full re-prefill with a note
  EXPECT_NE(r.out.find("re-prefilling all"), std::string::npos) << r.out;
  EXPECT_EQ(turns[2].reused, 0);
  const ojson j = ojson::parse(test::read_file(d.file("c.json")));
  EXPECT_EQ(j["thinking"], false);
  ASSERT_EQ(j["messages"].size(), 5u);
  EXPECT_EQ(j["messages"][0], msg("system", "Be brief."));
  EXPECT_EQ(j["messages"][1], msg("user", "/slash text"));
  EXPECT_EQ(j["messages"][3], msg("user", "ok"));
  EXPECT_FALSE(j["messages"][2].contains("reasoning_content"));
  EXPECT_EQ(turns[2].prompt, static_cast<int>(tokens_of(ojson::array({j["messages"][0], j["messages"][1],
                                                                        j["messages"][2], j["messages"][3]}),
                                                            false)
                                                   .size()));
}

TEST_F(ChatFixture, TooLongMessageIsReportedAndTheChatContinues) {
  test::TempDir d;
  test::write_file(d.file("in.txt"), std::string(600, 'x') + " " + std::string(600, 'y') + "\nshort\n");
  const auto r = test::run_kimi("chat -m " + gguf + " -n 2 -t 1 -c 240 < " + d.file("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("error: the conversation is"), std::string::npos) << r.out;
  EXPECT_EQ(turn_lines(r.out).size(), 1u) << r.out;
}

TEST_F(ChatFixture, RunChatWrapsThePromptInTheChatFormat) {
  const auto r = test::run_kimi("run -m " + gguf + " -p 'Hi there' --chat -n 2 -t 1 --ids");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t n = tokens_of(ojson::array({msg("user", "Hi there")})).size();
  EXPECT_NE(r.out.find("prompt: " + std::to_string(n) + " tokens"), std::string::npos) << n << "\n" << r.out;
  const auto bad = test::run_kimi("run -m " + gguf + " --tokens 1,2 --chat -n 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--chat needs -p/--prompt"), std::string::npos) << bad.out;
}

// kimi chat --spec dspark -md DRAFT (and --spec ngram): a three-turn greedy conversation equals the
// one without speculation (the saved messages, thinking included), with prompts prefilled in several
// batches (-b 16: the draft gets the target's hidden states of every chunk, or it could not draft
// after the first turn), and the summary line says how many tokens were drafted.
TEST_F(ChatFixture, SpeculativeRepliesEqualPlainReplies) {
  test::TempDir d;
  auto r = test::run_kimi("synth --preset dspark-tiny --seed 2 -q -o " + d.file("draft-hf"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = test::run_kimi("convert " + d.file("draft-hf") + " -o " + d.file("draft.gguf") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto conversation = [&](const std::string& spec, const std::string& name) {
    const std::string conv = d.file(name + ".json");
    test::write_file(d.file(name + ".txt"), "What is a river?\nname two rivers\n/reset\nand a lake\nwhy\n/save " + conv + "\n");
    auto out = test::run_kimi("chat -m " + gguf + " -n 24 -t 1 -b 16 --temp 0 " + spec + " < " + d.file(name + ".txt"));
    EXPECT_EQ(out.exit_code, 0) << out.out;
    EXPECT_EQ(turn_lines(out.out).size(), 4u) << out.out;
    return std::make_pair(out.out, ojson::parse(test::read_file(conv)));
  };
  const auto [off_out, off] = conversation("--spec off", "off");
  ASSERT_EQ(off["messages"].size(), 4u) << off.dump();
  EXPECT_EQ(off_out.find("speculative ("), std::string::npos);
  for (const std::string& spec : {"--spec dspark -md " + d.file("draft.gguf") + " --draft-max 7", std::string("--spec ngram")}) {
    const auto [out, got] = conversation(spec, spec.substr(7, 5));
    EXPECT_EQ(got["messages"], off["messages"]) << spec;
    // "speculative (dspark): S steps, V with a draft: D drafted, ..."
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(speculative \((\w+)[^)]*\): \d+ steps, (\d+) with a draft: (\d+) drafted)"))) << out;
    if (m[1] == "dspark") {
      EXPECT_GE(std::stoi(m[2]), 10) << out;  // it drafts (the prompts were prefilled in 16-token batches)
      EXPECT_GT(std::stoi(m[3]), std::stoi(m[2])) << out;
    }
  }
}

TEST_F(ChatFixture, BadFlagsAreErrors) {
  auto r = test::run_kimi("chat -m " + gguf + " --thinking maybe < /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--thinking"), std::string::npos) << r.out;
  r = test::run_kimi("chat < /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--model"), std::string::npos) << r.out;
  r = test::run_kimi("chat -m /nonexistent/m.gguf < /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("/nonexistent/m.gguf"), std::string::npos) << r.out;
  r = test::run_kimi("chat -m " + gguf + " -n -2 < /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--n-predict"), std::string::npos) << r.out;
  r = test::run_kimi("chat -m " + gguf + " --thinking-effort huge < /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--thinking-effort"), std::string::npos) << r.out;
  r = test::run_kimi("chat -m " + gguf + " --bogus < /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--bogus"), std::string::npos) << r.out;
  // an empty pipe is a valid (empty) conversation
  r = test::run_kimi("chat -m " + gguf + " < /dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace
