// Images through kimi serve (docs/server.md "Images", docs/engine.md "Images in the server") on the
// tiny synthetic model with its projector file (tiny_vision_dir, --precision f32):
//  - an OpenAI image_url part becomes the media tokens of docs/spec/vision.md §4 at the part's place
//    (the parsed prompt equals the template's text with the media text spliced in, tokenized), and
//    the first generated token's log-probabilities equal an in-process forward pass of that prompt
//    with the tower's rows at the <|media_pad|> positions (so the rows are the tower's, in order);
//  - usage counts the image tokens (the navit rule by hand: 100x70 -> 112x84 padded -> 8x6 patches
//    -> 12 tokens);
//  - the prompt cache: a follow-up turn with the same image resumes past the image, a same-size
//    different image does not resume inside it, and the cached answer equals a cold server's;
//  - the three APIs (OpenAI image_url, Anthropic image block, Responses input_image) give the same
//    prompt tokens and the same greedy text, in tool results too; count_tokens counts the image;
//  - streaming with an image; refusals: http(s) URLs, wrong media type, truncated data, bad base64,
//    too many images, too many bytes, too many pixels, a text-only server: 400 naming the field.
#include <gtest/gtest.h>
#include <png.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "server/api_anthropic.h"
#include "server/api_responses.h"
#include "server_fixture.h"
#include "image_fixture.h"
#include "runtime/vision_input.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

using namespace kimi;
using kimi::test::RunningServer;
using server::ojson;

namespace {

std::string vision_dir() { return test::tiny_vision_dir(1); }

server::ServerOptions vision_opts() {
  server::ServerOptions o = test::server_opts();
  o.model_path = vision_dir() + "/model.gguf";
  o.quiet = true;
  o.fixed_seed = true;
  o.image_max_count = 3;
  o.image_max_bytes = 100000;
  o.image_max_pixels = 1000000;
  return o;
}

image::Rgb pattern(int64_t w, int64_t h, uint32_t seed) { return kimi::test::random_image(w, h, seed); }

std::string png_bytes(const image::Rgb& im) {
  png_image p;
  std::memset(&p, 0, sizeof p);
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(im.width);
  p.height = static_cast<png_uint_32>(im.height);
  p.format = PNG_FORMAT_RGB;
  png_alloc_size_t n = 0;
  EXPECT_TRUE(png_image_write_to_memory(&p, nullptr, &n, 0, im.px.data(), 0, nullptr));
  std::string out(n, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&p, out.data(), &n, 0, im.px.data(), 0, nullptr));
  out.resize(n);
  return out;
}

std::string b64(const std::string& s) {
  static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k = 3; k >= 0; --k) o += A[(v >> (6 * k)) & 63];
  }
  if (i + 1 == s.size()) {
    const uint32_t v = uint8_t(s[i]) << 16;
    o += A[(v >> 18) & 63], o += A[(v >> 12) & 63], o += "==";
  } else if (i + 2 == s.size()) {
    const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    o += A[(v >> 18) & 63], o += A[(v >> 12) & 63], o += A[(v >> 6) & 63], o += '=';
  }
  return o;
}

const std::string kPngA = png_bytes(pattern(100, 70, 1));
const std::string kPngB = png_bytes(pattern(100, 70, 2));  // same size, other pixels
const int kTokens100x70 = 12;                              // 112 x 84 padded: 8 x 6 patches / 4

std::string data_url(const std::string& bytes, const std::string& mime = "image/png") {
  return "data:" + mime + ";base64," + b64(bytes);
}

ojson oa_image(const std::string& bytes) {
  return {{"type", "image_url"}, {"image_url", {{"url", data_url(bytes)}}}};
}

ojson oa_chat(const ojson& content, int max_tokens = 6) {
  return {{"messages", {{{"role", "user"}, {"content", content}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

int cached(const ojson& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }

struct Parsing {
  std::unique_ptr<Model> model = Model::load(vision_dir() + "/model.gguf");
  tok::Tokenizer tok = tok::Tokenizer::from_gguf(model->reader());
  std::unique_ptr<VisionModel> vm = VisionModel::load(vision_dir() + "/model.mmproj.gguf", model->hparams().n_embd);
  server::Limits lim;
  Parsing() {
    lim.n_ctx = 1024;
    lim.vision = vm.get();
  }
  // the prompt with image keys back to <|media_pad|>
  static std::vector<int32_t> real(const server::ParsedRequest& r) {
    std::vector<int32_t> p = r.prompt;
    for (auto& t : p)
      if (t < 0) t = r.gen.images->placeholder;
    return p;
  }
  static size_t first_pad(const server::ParsedRequest& r) {
    for (size_t i = 0; i < r.prompt.size(); ++i)
      if (r.prompt[i] < 0) return i;
    return r.prompt.size();
  }
};

Parsing& parsing() {
  static Parsing p;
  return p;
}

TEST(ServerVision, PromptIsTheTemplateWithTheMediaText) {
  Parsing& P = parsing();
  const ojson body = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "What is this?"}}});
  const server::ParsedRequest r = server::parse_chat_request(body.dump(), P.tok, P.lim);
  ASSERT_TRUE(r.gen.images);
  ASSERT_EQ(r.gen.images->images.size(), 1u);
  EXPECT_EQ(r.gen.images->n_rows, kTokens100x70);
  // the reference: the rendered text with the placeholder replaced by the media text, tokenized
  std::string media = "<|media_begin|>image 100x70<|media_content|>";
  for (int i = 0; i < kTokens100x70; ++i) media += "<|media_pad|>";
  media += "<|media_end|>";
  std::string text = r.rendered;
  const size_t at = text.find(tok::kImagePlaceholder);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, std::strlen(tok::kImagePlaceholder), media);
  EXPECT_EQ(Parsing::real(r), P.tok.encode(text, true));
  // the keys: negative, different per position, and different for another image of the same size
  const server::ParsedRequest rb =
      server::parse_chat_request(oa_chat({oa_image(kPngB), {{"type", "text"}, {"text", "What is this?"}}}).dump(),
                                 P.tok, P.lim);
  ASSERT_EQ(rb.prompt.size(), r.prompt.size());
  const size_t p0 = Parsing::first_pad(r);
  EXPECT_EQ(Parsing::first_pad(rb), p0);
  EXPECT_NE(r.prompt[p0], rb.prompt[p0]);
  EXPECT_NE(r.prompt[p0], r.prompt[p0 + 1]);
  EXPECT_TRUE(std::equal(r.prompt.begin(), r.prompt.begin() + static_cast<std::ptrdiff_t>(p0), rb.prompt.begin()));
}

class VisionServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { srv_ = new RunningServer(vision_opts()); }
  static void TearDownTestSuite() {
    delete srv_;
    srv_ = nullptr;
  }
  static RunningServer* srv_;
};
RunningServer* VisionServerTest::srv_ = nullptr;

TEST_F(VisionServerTest, FirstTokenLogprobsEqualTheEnginePath) {
  Parsing& P = parsing();
  ojson body = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "Describe it."}}}, 1);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  int st = 0;
  const ojson r = srv_->post("/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<int>(),
            static_cast<int>(server::parse_chat_request(body.dump(), P.tok, P.lim).prompt.size()));
  const ojson& lp = r["choices"][0]["logprobs"];
  const ojson* first = nullptr;
  if (lp.contains("reasoning_content") && !lp["reasoning_content"].empty()) first = &lp["reasoning_content"][0];
  else if (!lp["content"].empty()) first = &lp["content"][0];
  ASSERT_NE(first, nullptr) << r.dump();

  // the engine path: the tower's rows at the <|media_pad|> positions, one forward pass
  const server::ParsedRequest pr = server::parse_chat_request(body.dump(), P.tok, P.lim);
  const std::vector<int32_t> prompt = Parsing::real(pr);
  VisionRunner vr(vision_dir() + "/model.mmproj.gguf", P.model->hparams().n_embd, 2, Precision::F32);
  const std::vector<float> rows = vr.encode({&pr.gen.images->images[0]});
  ContextOptions co;
  co.n_threads = 2;
  co.precision = Precision::F32;
  co.n_ctx_max = 1024;
  Context ctx(*P.model, co);
  Batch b;
  add_prompt_with_images(b, prompt, pr.gen.images->placeholder, rows.data(), kTokens100x70,
                         P.model->hparams().n_embd, 0, 0, true);
  ctx.decode(b);
  const float* lg = ctx.logits(b.size() - 1);
  const int nv = ctx.n_vocab();
  double mx = -1e300, sum = 0;
  for (int i = 0; i < nv; ++i) mx = std::max(mx, double(lg[i]));
  for (int i = 0; i < nv; ++i) sum += std::exp(double(lg[i]) - mx);
  std::vector<double> ref(static_cast<size_t>(nv));
  for (int i = 0; i < nv; ++i) ref[static_cast<size_t>(i)] = double(lg[i]) - mx - std::log(sum);
  std::sort(ref.begin(), ref.end(), std::greater<>());
  ASSERT_EQ((*first)["top_logprobs"].size(), 3u);
  for (size_t k = 0; k < 3; ++k)
    EXPECT_NEAR((*first)["top_logprobs"][k]["logprob"].get<double>(), ref[k], 1e-4) << k;
  EXPECT_NEAR((*first)["logprob"].get<double>(), ref[0], 1e-4);  // greedy: the most likely token
}

TEST_F(VisionServerTest, UsageCountsTheImageTokens) {
  const ojson text_only = oa_chat({{{"type", "text"}, {"text", "Hello"}}}, 1);
  const ojson with_image = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "Hello"}}}, 1);
  int st = 0;
  const ojson a = srv_->post("/v1/chat/completions", text_only, &st);
  ASSERT_EQ(st, 200) << a.dump();
  const ojson b = srv_->post("/v1/chat/completions", with_image, &st);
  ASSERT_EQ(st, 200) << b.dump();
  const ojson wh = srv_->post("/tokenize", ojson{{"content", "image 100x70"}, {"special", false}});
  // <|media_begin|> "image 100x70" <|media_content|> 12 x <|media_pad|> <|media_end|>
  EXPECT_EQ(b["usage"]["prompt_tokens"].get<int>(),
            a["usage"]["prompt_tokens"].get<int>() + 3 + wh["count"].get<int>() + kTokens100x70);
}

TEST_F(VisionServerTest, ImageChangesTheAnswerDistribution) {
  auto first_top = [&](const std::string& png) {
    ojson body = oa_chat({oa_image(png), {{"type", "text"}, {"text", "Describe it."}}}, 1);
    body["logprobs"] = true;
    body["top_logprobs"] = 2;
    int st = 0;
    const ojson r = srv_->post("/v1/chat/completions", body, &st);
    EXPECT_EQ(st, 200) << r.dump();
    const ojson& lp = r["choices"][0]["logprobs"];
    return lp.contains("reasoning_content") ? lp["reasoning_content"][0]["top_logprobs"].dump()
                                            : lp["content"][0]["top_logprobs"].dump();
  };
  EXPECT_NE(first_top(kPngA), first_top(kPngB));
  EXPECT_EQ(first_top(kPngA), first_top(kPngA));
}

TEST(ServerVisionCache, FollowUpResumesPastTheImageAndAnotherImageDoesNot) {
  Parsing& P = parsing();
  RunningServer srv(vision_opts());
  server::ServerOptions co = vision_opts();
  co.sched.parallel = 1;
  co.sched.prompt_cache = false;
  RunningServer cold(co);
  const ojson q1 = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "What is this?"}}}, 5);
  int st = 0;
  const ojson r1 = srv.post("/v1/chat/completions", q1, &st);
  ASSERT_EQ(st, 200) << r1.dump();
  const server::ParsedRequest p1 = server::parse_chat_request(q1.dump(), P.tok, P.lim);
  const size_t p0 = Parsing::first_pad(p1);
  const size_t image_end = p0 + kTokens100x70;  // the positions up to the image's last <|media_pad|>
  // the second turn: the same image, the answer, a new question
  ojson q2 = q1;
  q2["messages"].push_back({{"role", "assistant"}, {"content", r1["choices"][0]["message"]["content"]}});
  q2["messages"].push_back({{"role", "user"}, {"content", "And the colours?"}});
  const ojson r2 = srv.post("/v1/chat/completions", q2, &st);
  ASSERT_EQ(st, 200) << r2.dump();
  EXPECT_GE(cached(r2), static_cast<int>(image_end)) << r2["usage"].dump();
  const ojson c2 = cold.post("/v1/chat/completions", q2, &st);
  ASSERT_EQ(st, 200) << c2.dump();
  EXPECT_EQ(cached(c2), 0);
  EXPECT_EQ(r2["choices"][0]["message"], c2["choices"][0]["message"]);
  // another image of the same size: nothing at or after its first <|media_pad|> is reused
  const ojson q3 = oa_chat({oa_image(kPngB), {{"type", "text"}, {"text", "What is this?"}}}, 5);
  const ojson r3 = srv.post("/v1/chat/completions", q3, &st);
  ASSERT_EQ(st, 200) << r3.dump();
  EXPECT_LE(cached(r3), static_cast<int>(p0)) << r3["usage"].dump();
  const ojson c3 = cold.post("/v1/chat/completions", q3, &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(r3["choices"][0]["message"], c3["choices"][0]["message"]);
  // the first image again: the whole prompt but its last token comes from the cache
  const ojson r4 = srv.post("/v1/chat/completions", q1, &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(cached(r4), static_cast<int>(p1.prompt.size()) - 1);
  EXPECT_EQ(r4["choices"][0]["message"], r1["choices"][0]["message"]);
}

TEST_F(VisionServerTest, StreamWithAnImage) {
  ojson body = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "What is this?"}}}, 6);
  int st = 0;
  const ojson whole = srv_->post("/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const std::string sse = srv_->post_stream("/v1/chat/completions", body);
  std::string content, reasoning;
  int prompt_tokens = -1;
  for (const auto& [name, ev] : test::named_events(sse)) {
    if (ev.contains("usage") && ev["usage"].is_object()) prompt_tokens = ev["usage"]["prompt_tokens"].get<int>();
    if (!ev.contains("choices") || ev["choices"].empty()) continue;
    const ojson& d = ev["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
      reasoning += d["reasoning_content"].get<std::string>();
  }
  const ojson& m = whole["choices"][0]["message"];
  EXPECT_EQ(content, m["content"].is_string() ? m["content"].get<std::string>() : "");
  EXPECT_EQ(reasoning, m.contains("reasoning_content") && m["reasoning_content"].is_string()
                           ? m["reasoning_content"].get<std::string>()
                           : "");
  EXPECT_EQ(prompt_tokens, whole["usage"]["prompt_tokens"].get<int>());
}

// a 400 whose param and message name `param` and whose message contains `says`
void expect_refused(const RunningServer& s, const ojson& body, const std::string& param, const std::string& says) {
  int st = 0;
  const ojson r = s.post("/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], param) << r.dump();
  const std::string msg = r["error"]["message"].get<std::string>();
  EXPECT_NE(msg.find(says), std::string::npos) << msg;
  EXPECT_NE(msg.find(param), std::string::npos) << msg;
}

TEST_F(VisionServerTest, RefusedImages) {
  const std::string u = "messages[0].content[0].image_url.url";
  auto with_url = [](const std::string& url) {
    return oa_chat({{{"type", "image_url"}, {"image_url", {{"url", url}}}}, {{"type", "text"}, {"text", "?"}}});
  };
  expect_refused(*srv_, with_url("https://example.com/cat.png"), u, "data: URL");
  expect_refused(*srv_, with_url("HTTP://example.com/cat.png"), u, "fetches nothing");
  expect_refused(*srv_, with_url(data_url(kPngA, "image/jpeg")), u, "the data is a PNG");
  expect_refused(*srv_, with_url(data_url(kPngA, "image/bmp")), u, "image/bmp");
  expect_refused(*srv_, with_url(data_url(kPngA.substr(0, kPngA.size() / 2))), u, "PNG");
  expect_refused(*srv_, with_url("data:image/png;base64,@@@@"), u, "base64");
  expect_refused(*srv_, with_url("data:image/png,hello"), u, "base64");
  expect_refused(*srv_, with_url(data_url("hello, world")), u, "not a PNG, JPEG, WebP or GIF");
  // limits: 3 images, 100000 bytes, 1000000 pixels (vision_opts)
  ojson four = ojson::array();
  for (int i = 0; i < 4; ++i) four.push_back(oa_image(kPngA));
  expect_refused(*srv_, oa_chat(four), "messages[0].content[3]", "at most 3");
  expect_refused(*srv_, with_url(data_url(png_bytes(pattern(200, 200, 3)))), u, "100000");
  image::Rgb big;
  big.width = 1001;
  big.height = 1000;
  big.px.assign(static_cast<size_t>(big.width * big.height * 3), 40);
  expect_refused(*srv_, with_url(data_url(png_bytes(big))), u, "1000000");
  // the images' tokens beyond the prompt limit (ctx 1024): refused at the image that crosses it,
  // before any more is decoded (600 x 600 -> 616 x 616 padded, 44 x 44 patches: 484 tokens each)
  {
    image::Rgb flat;
    flat.width = flat.height = 600;
    flat.px.assign(600 * 600 * 3, 90);
    const std::string png = png_bytes(flat);
    const ojson three = oa_chat({oa_image(png), oa_image(png), oa_image(png)});
    int st = 0;
    const ojson r = srv_->post("/v1/chat/completions", three, &st);
    EXPECT_EQ(st, 400) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find("up to 'messages[0].content[2]' alone are 1452 tokens"),
              std::string::npos)
        << r.dump();
    EXPECT_EQ(r["error"]["code"], "context_length_exceeded") << r.dump();
  }
  // images only in user and tool messages
  ojson sys = oa_chat("hi");
  sys["messages"].insert(sys["messages"].begin(), ojson{{"role", "system"}, {"content", {oa_image(kPngA)}}});
  expect_refused(*srv_, sys, "messages[0].content[0]", "user and tool messages");
  // the server still answers
  int st = 0;
  srv_->post("/v1/chat/completions", oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "?"}}}, 1), &st);
  EXPECT_EQ(st, 200);
}

// The same image and question through the three APIs (thinking off in each).
ojson openai_body(const std::string& png) {
  ojson b = oa_chat({oa_image(png), {{"type", "text"}, {"text", "What is this?"}}}, 8);
  b["thinking"] = false;
  return b;
}
ojson anthropic_image(const std::string& png) {
  ojson src = {{"type", "base64"}, {"media_type", "image/png"}, {"data", b64(png)}};
  return {{"type", "image"}, {"source", src}};
}
ojson anthropic_body(const std::string& png) {
  ojson content = ojson::array({anthropic_image(png), ojson{{"type", "text"}, {"text", "What is this?"}}});
  ojson msg = {{"role", "user"}, {"content", content}};
  return {{"model", "m"}, {"max_tokens", 8}, {"temperature", 0}, {"messages", ojson::array({msg})}};
}
ojson responses_body(const std::string& png) {
  return {{"model", "m"},
          {"max_output_tokens", 8},
          {"temperature", 0},
          {"reasoning", {{"effort", "none"}}},
          {"input",
           {{{"role", "user"},
             {"content",
              {{{"type", "input_image"}, {"image_url", data_url(png)}}, {{"type", "input_text"}, {"text", "What is this?"}}}}}}}};
}

TEST(ServerVision, ThreeApisGiveTheSamePrompt) {
  Parsing& P = parsing();
  const server::ParsedRequest o = server::parse_chat_request(openai_body(kPngA).dump(), P.tok, P.lim);
  const server::AnthropicRequest ar = server::anthropic_to_chat(anthropic_body(kPngA), P.lim, false);
  const server::ParsedRequest a = server::parse_as_chat(ar.chat, ar.fields, P.tok, P.lim);
  const server::ResponsesRequest rr = server::responses_to_chat(responses_body(kPngA), P.lim);
  const server::ParsedRequest r = server::parse_as_chat(rr.chat, rr.fields, P.tok, P.lim);
  ASSERT_TRUE(o.gen.images && a.gen.images && r.gen.images);
  EXPECT_EQ(o.prompt, a.prompt);  // image keys included: the same image at the same place
  EXPECT_EQ(o.prompt, r.prompt);
  EXPECT_EQ(o.rendered, a.rendered);
  EXPECT_EQ(o.rendered, r.rendered);
}

TEST_F(VisionServerTest, ThreeApisGiveTheSameGreedyText) {
  int st = 0;
  const ojson o = srv_->post("/v1/chat/completions", openai_body(kPngA), &st);
  ASSERT_EQ(st, 200) << o.dump();
  const ojson a = srv_->post("/v1/messages", anthropic_body(kPngA), &st);
  ASSERT_EQ(st, 200) << a.dump();
  const ojson r = srv_->post("/v1/responses", responses_body(kPngA), &st);
  ASSERT_EQ(st, 200) << r.dump();
  const std::string ot = o["choices"][0]["message"]["content"].is_string()
                             ? o["choices"][0]["message"]["content"].get<std::string>()
                             : "";
  std::string at, rt;
  for (const auto& b : a["content"])
    if (b["type"] == "text") at += b["text"].get<std::string>();
  for (const auto& it : r["output"])
    if (it["type"] == "message")
      for (const auto& c : it["content"])
        if (c["type"] == "output_text") rt += c["text"].get<std::string>();
  EXPECT_FALSE(ot.empty()) << o.dump();
  EXPECT_EQ(ot, at);
  EXPECT_EQ(ot, rt);
  // the prompt counted the same: usage and count_tokens
  const int n = o["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(a["usage"]["input_tokens"].get<int>() + a["usage"]["cache_read_input_tokens"].get<int>(), n);
  EXPECT_EQ(r["usage"]["input_tokens"].get<int>(), n);
  ojson ct = anthropic_body(kPngA);
  ct.erase("max_tokens");
  ct.erase("temperature");
  const ojson c = srv_->post("/v1/messages/count_tokens", ct, &st);
  ASSERT_EQ(st, 200) << c.dump();
  EXPECT_EQ(c["input_tokens"].get<int>(), n);
  // a different image changes the count by nothing (same size) but not the prompt's keys (checked above)
}

TEST(ServerVision, ImagesInToolResults) {
  Parsing& P = parsing();
  // Anthropic: a tool_result whose content holds an image; Responses: a function_call_output with an input_image
  const ojson tools = {{{"name", "shot"}, {"description", "takes a screenshot"}, {"input_schema", {{"type", "object"}}}}};
  ojson a_body = ojson::parse(R"({"model": "m", "max_tokens": 8, "messages": [
      {"role": "user", "content": "Look at the screen."},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "here"}]}]}]})");
  a_body["tools"] = tools;
  a_body["messages"][2]["content"][0]["content"].push_back(anthropic_image(kPngA));
  const server::AnthropicRequest ar = server::anthropic_to_chat(a_body, P.lim, false);
  const server::ParsedRequest a = server::parse_as_chat(ar.chat, ar.fields, P.tok, P.lim);
  ASSERT_TRUE(a.gen.images);
  EXPECT_EQ(a.gen.images->n_rows, kTokens100x70);
  ojson r_body = ojson::parse(R"({"model": "m", "tools": [{"type": "function", "name": "shot", "parameters": {"type": "object"}}],
      "input": [{"role": "user", "content": "Look at the screen."},
                {"type": "function_call", "call_id": "t1", "name": "shot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "t1", "output": [{"type": "input_text", "text": "here"}]}]})");
  r_body["input"][2]["output"].push_back({{"type", "input_image"}, {"image_url", data_url(kPngA)}});
  const server::ResponsesRequest rr = server::responses_to_chat(r_body, P.lim);
  const server::ParsedRequest r = server::parse_as_chat(rr.chat, rr.fields, P.tok, P.lim);
  ASSERT_TRUE(r.gen.images);
  EXPECT_EQ(r.gen.images->n_rows, kTokens100x70);
  // the media text sits inside the tool message, after "here"
  for (const std::string* t : {&a.rendered, &r.rendered}) {
    const size_t tool = t->find("role=\"tool\"");
    const size_t here = t->find("here", tool);
    const size_t img = t->find(tok::kImagePlaceholder, tool);
    EXPECT_NE(tool, std::string::npos) << *t;
    EXPECT_LT(here, img) << *t;
    EXPECT_NE(img, std::string::npos) << *t;
  }
}

TEST_F(VisionServerTest, AnthropicAndResponsesStreamsWithAnImageEqualTheWholeAnswer) {
  int st = 0;
  const ojson o = srv_->post("/v1/chat/completions", openai_body(kPngA), &st);
  ASSERT_EQ(st, 200) << o.dump();
  const std::string want = o["choices"][0]["message"]["content"].get<std::string>();
  ojson a = anthropic_body(kPngA);
  a["stream"] = true;
  std::string at;
  int a_in = -1;
  for (const auto& [name, ev] : test::named_events(srv_->post_stream("/v1/messages", a))) {
    if (name == "content_block_delta" && ev["delta"]["type"] == "text_delta") at += ev["delta"]["text"].get<std::string>();
    if (name == "message_start") a_in = ev["message"]["usage"]["input_tokens"].get<int>();
  }
  EXPECT_EQ(at, want);
  EXPECT_EQ(a_in, o["usage"]["prompt_tokens"].get<int>());
  ojson r = responses_body(kPngA);
  r["stream"] = true;
  std::string rt;
  int r_in = -1;
  for (const auto& [name, ev] : test::named_events(srv_->post_stream("/v1/responses", r))) {
    if (name == "response.output_text.delta") rt += ev["delta"].get<std::string>();
    if (name == "response.completed" || name == "response.incomplete") r_in = ev["response"]["usage"]["input_tokens"].get<int>();
  }
  EXPECT_EQ(rt, want);
  EXPECT_EQ(r_in, o["usage"]["prompt_tokens"].get<int>());
}

TEST_F(VisionServerTest, RefusedImagesNameTheirApisFields) {
  int st = 0;
  // Anthropic: a url source, a wrong media type (named by the block's path)
  ojson a = anthropic_body(kPngA);
  a["messages"][0]["content"][0]["source"] = {{"type", "url"}, {"url", "https://example.com/a.png"}};
  ojson e = srv_->post("/v1/messages", a, &st);
  EXPECT_EQ(st, 400) << e.dump();
  EXPECT_NE(e.dump().find("messages[0].content[0].source.type"), std::string::npos) << e.dump();
  EXPECT_NE(e.dump().find("fetches nothing"), std::string::npos) << e.dump();
  a = anthropic_body(kPngA);
  a["messages"][0]["content"][0]["source"]["media_type"] = "image/webp";
  e = srv_->post("/v1/messages", a, &st);
  EXPECT_EQ(st, 400) << e.dump();
  EXPECT_NE(e.dump().find("messages[0].content[0].source.data"), std::string::npos) << e.dump();
  EXPECT_NE(e.dump().find("PNG"), std::string::npos) << e.dump();
  // Responses: an http URL, named input[0].content[0].image_url
  ojson r = responses_body(kPngA);
  r["input"][0]["content"][0]["image_url"] = "http://example.com/a.png";
  e = srv_->post("/v1/responses", r, &st);
  EXPECT_EQ(st, 400) << e.dump();
  EXPECT_EQ(e["error"]["param"], "input[0].content[0].image_url") << e.dump();
  EXPECT_NE(e.dump().find("data: URL"), std::string::npos) << e.dump();
}

TEST(ServerVisionTextOnly, ImageOnATextModelSaysHowToGetAVisionFile) {
  server::ServerOptions o = vision_opts();
  o.no_mmproj = true;
  RunningServer s(o);
  const ojson body = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "?"}}});
  int st = 0;
  const ojson r = s.post("/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "messages[0].content[0].image_url");
  const std::string msg = r["error"]["message"].get<std::string>();
  EXPECT_NE(msg.find("--mmproj"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kimi convert"), std::string::npos) << msg;
  s.post("/v1/chat/completions", oa_chat("hello", 1), &st);
  EXPECT_EQ(st, 200);
}

// ---- the tower worker and the tower-output cache (docs/engine.md "Images in the server") ----

// SchedulerOptions::vision_hook: counts the tower runs and holds the tower while closed
struct TowerGate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  int calls = 0, images = 0;
  void hook(int n) {
    std::unique_lock<std::mutex> lk(mu);
    ++calls;
    images += n;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
  }
  void set(bool o) {
    std::lock_guard<std::mutex> lk(mu);
    open = o;
    cv.notify_all();
  }
  int n_calls() {
    std::lock_guard<std::mutex> lk(mu);
    return calls;
  }
  // waits until the tower was entered n times (a bound only against a hang: the condition decides)
  bool wait_calls(int n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(300), [&] { return calls >= n; });
  }
};
// opens the gate when the test ends (before the server that waits for its tower run is destroyed)
struct GateOpener {
  TowerGate& g;
  ~GateOpener() { g.set(true); }
};

server::ServerOptions gated_opts(const std::shared_ptr<TowerGate>& g) {
  server::ServerOptions o = vision_opts();
  o.sched.vision_hook = [g](int n) { g->hook(n); };
  return o;
}

// polls a condition the server reaches by itself (the bound is only against a hang)
bool eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 60000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

uint64_t metric(const RunningServer& r, const std::string& key) {
  const std::string m = r.s->metrics_text();
  const size_t at = m.find("\n" + key + " ");
  if (at == std::string::npos) return ~uint64_t{0};
  return std::stoull(m.substr(at + key.size() + 2));
}

int busy_slots(const RunningServer& r) {
  int n = 0;
  for (const auto& si : r.s->scheduler().slots()) n += si.busy;
  return n;
}

// While the tower runs for one request, a text request alongside it is answered (the tower is on
// its own thread; the old code ran it on the scheduler thread and stalled every sequence), the
// image request reads its text up to the image meanwhile; once the tower is let go the image
// request's answer and log-probabilities equal a cold server's.
TEST(ServerVisionTower, TextRequestFinishesWhileTheTowerIsHeld) {
  Parsing& P = parsing();
  auto gate = std::make_shared<TowerGate>();
  gate->set(false);
  RunningServer srv(gated_opts(gate));
  GateOpener opener{*gate};
  ojson img_body = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "Describe it."}}}, 4);
  img_body["logprobs"] = true;
  img_body["top_logprobs"] = 3;
  ojson img_res;
  int img_st = 0;
  std::atomic<bool> img_done{false};
  std::thread t([&] {
    img_res = srv.post("/v1/chat/completions", img_body, &img_st);
    img_done = true;
  });
  ASSERT_TRUE(gate->wait_calls(1));
  // the text before the image is prefilled while the tower is held
  const size_t p0 = Parsing::first_pad(server::parse_chat_request(img_body.dump(), P.tok, P.lim));
  EXPECT_TRUE(eventually([&] {
    for (const auto& si : srv.s->scheduler().slots())
      if (si.busy && si.n_prompt_done == static_cast<int>(p0)) return true;
    return false;
  })) << "the image request's text up to its first image position (" << p0 << ") was not prefilled";
  const ojson text_body = oa_chat({{{"type", "text"}, {"text", "Hello there"}}}, 5);
  int st = 0;
  const ojson tr = srv.post("/v1/chat/completions", text_body, &st);
  ASSERT_EQ(st, 200) << tr.dump();
  EXPECT_GT(tr["usage"]["completion_tokens"].get<int>(), 0) << tr.dump();
  EXPECT_FALSE(img_done.load());  // still waiting for the tower
  EXPECT_EQ(gate->n_calls(), 1);
  gate->set(true);
  t.join();
  ASSERT_EQ(img_st, 200) << img_res.dump();
  // the reference: a cold server (one slot, no prompt cache, the tower not held)
  server::ServerOptions co = vision_opts();
  co.sched.parallel = 1;
  co.sched.prompt_cache = false;
  RunningServer cold(co);
  const ojson ci = cold.post("/v1/chat/completions", img_body, &st);
  ASSERT_EQ(st, 200) << ci.dump();
  EXPECT_EQ(img_res["choices"][0]["message"], ci["choices"][0]["message"]);
  EXPECT_EQ(img_res["choices"][0]["logprobs"], ci["choices"][0]["logprobs"]);
  const ojson ct = cold.post("/v1/chat/completions", text_body, &st);
  EXPECT_EQ(tr["choices"][0]["message"], ct["choices"][0]["message"]);
}

// The tower-output cache: with the prompt cache off (nothing resumes past an image), a second
// request with the same image does not run the tower and answers the same; an image of the same
// size with other pixels runs it; the n choices of a request run it once; --vision-cache 0 runs it
// every time.
TEST(ServerVisionTower, CachedTowerOutputSkipsTheTower) {
  auto gate = std::make_shared<TowerGate>();
  server::ServerOptions o = gated_opts(gate);
  o.sched.prompt_cache = false;
  RunningServer srv(o);
  server::ServerOptions co = vision_opts();
  co.sched.parallel = 1;
  co.sched.prompt_cache = false;
  co.sched.vision_cache = 0;
  co.vision_threads = 1;  // the tower's thread count does not change its rows
  RunningServer cold(co);
  ojson qa = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "What is this?"}}}, 5);
  qa["logprobs"] = true;
  qa["top_logprobs"] = 2;
  int st = 0;
  const ojson r1 = srv.post("/v1/chat/completions", qa, &st);
  ASSERT_EQ(st, 200) << r1.dump();
  EXPECT_EQ(gate->n_calls(), 1);
  EXPECT_EQ(metric(srv, "kimi_vision_images_total{source=\"tower\"}"), 1u);
  EXPECT_EQ(metric(srv, "kimi_vision_images_total{source=\"cache\"}"), 0u);
  EXPECT_EQ(metric(srv, "kimi_vision_cache_entries"), 1u);
  // 12 rows of the tiny model's hidden size, f32
  EXPECT_EQ(metric(srv, "kimi_vision_cache_bytes"), uint64_t(kTokens100x70) * parsing().model->hparams().n_embd * 4);
  const ojson r2 = srv.post("/v1/chat/completions", qa, &st);
  ASSERT_EQ(st, 200) << r2.dump();
  EXPECT_EQ(gate->n_calls(), 1) << "the same image ran the tower again";
  EXPECT_EQ(cached(r2), 0);  // not the prompt cache's doing
  EXPECT_EQ(metric(srv, "kimi_vision_images_total{source=\"cache\"}"), 1u);
  EXPECT_EQ(r2["choices"][0]["message"], r1["choices"][0]["message"]);
  EXPECT_EQ(r2["choices"][0]["logprobs"], r1["choices"][0]["logprobs"]);
  const ojson c1 = cold.post("/v1/chat/completions", qa, &st);
  EXPECT_EQ(c1["choices"][0]["message"], r1["choices"][0]["message"]);
  EXPECT_EQ(c1["choices"][0]["logprobs"], r1["choices"][0]["logprobs"]);
  // a different text before the same image: still no tower run
  ojson qa2 = oa_chat({{{"type", "text"}, {"text", "Look:"}}, oa_image(kPngA), {{"type", "text"}, {"text", "Colours?"}}}, 5);
  const ojson r3 = srv.post("/v1/chat/completions", qa2, &st);
  ASSERT_EQ(st, 200) << r3.dump();
  EXPECT_EQ(gate->n_calls(), 1);
  EXPECT_EQ(r3["choices"][0]["message"], cold.post("/v1/chat/completions", qa2, &st)["choices"][0]["message"]);
  // another image of the same size: the tower runs
  ojson qb = qa;
  qb["messages"][0]["content"][0] = oa_image(kPngB);
  const ojson r4 = srv.post("/v1/chat/completions", qb, &st);
  ASSERT_EQ(st, 200) << r4.dump();
  EXPECT_EQ(gate->n_calls(), 2);
  EXPECT_EQ(r4["choices"][0]["logprobs"], cold.post("/v1/chat/completions", qb, &st)["choices"][0]["logprobs"]);
  EXPECT_NE(r4["choices"][0]["logprobs"], r1["choices"][0]["logprobs"]);
  // n = 3 choices of a new image: one tower run for the three
  const std::string png_c = png_bytes(pattern(90, 120, 7));
  ojson qc = oa_chat({oa_image(png_c), {{"type", "text"}, {"text", "And this?"}}}, 4);
  qc["n"] = 3;
  const ojson r5 = srv.post("/v1/chat/completions", qc, &st);
  ASSERT_EQ(st, 200) << r5.dump();
  ASSERT_EQ(r5["choices"].size(), 3u);
  EXPECT_EQ(gate->n_calls(), 3);
  EXPECT_EQ(gate->images, 3);
  EXPECT_EQ(r5["choices"][1]["message"], r5["choices"][0]["message"]);
  EXPECT_EQ(r5["choices"][2]["message"], r5["choices"][0]["message"]);
  EXPECT_EQ(metric(srv, "kimi_vision_tower_runs_total"), 3u);
  EXPECT_EQ(metric(srv, "kimi_vision_images_total{source=\"cache\"}"), 4u);  // r2, r3, two of r5's choices
  // no cache: every request runs the tower
  EXPECT_EQ(metric(cold, "kimi_vision_tower_runs_total"), 3u);
  EXPECT_EQ(metric(cold, "kimi_vision_cache_entries"), 0u);
}

// A tower that fails fails its request with a 500 naming the failure; the other requests and the
// next image go on (the hook throws the first time, as a failing tower would).
TEST(ServerVisionTower, TowerFailureIsA500AndTheServerGoesOn) {
  server::ServerOptions o = vision_opts();
  auto calls = std::make_shared<std::atomic<int>>(0);
  o.sched.vision_hook = [calls](int) {
    if (calls->fetch_add(1) == 0) throw std::runtime_error("planted tower failure");
  };
  RunningServer srv(o);
  const ojson q = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "What is this?"}}}, 3);
  int st = 0;
  const ojson r1 = srv.post("/v1/chat/completions", q, &st);
  EXPECT_EQ(st, 500) << r1.dump();
  const std::string msg = r1["error"]["message"].get<std::string>();
  EXPECT_NE(msg.find("the vision tower failed: planted tower failure"), std::string::npos) << msg;
  EXPECT_EQ(metric(srv, "kimi_requests_total{result=\"error\"}"), 1u);
  EXPECT_EQ(metric(srv, "kimi_vision_cache_entries"), 0u);
  const ojson r2 = srv.post("/v1/chat/completions", q, &st);  // the tower runs again, and works
  EXPECT_EQ(st, 200) << r2.dump();
  EXPECT_EQ(calls->load(), 2);
  EXPECT_EQ(busy_slots(srv), 0);
}

// The cache is bounded by bytes, least recently used out first.
TEST(ServerVisionTower, CacheEvictsTheLeastRecentlyUsedImage) {
  auto gate = std::make_shared<TowerGate>();
  server::ServerOptions o = gated_opts(gate);
  o.sched.prompt_cache = false;
  const uint64_t one = uint64_t(kTokens100x70) * parsing().model->hparams().n_embd * 4;
  o.sched.vision_cache = 2 * one;  // room for two 100 x 70 images
  RunningServer srv(o);
  auto ask = [&](const std::string& png) {
    int st = 0;
    const ojson r = srv.post("/v1/chat/completions", oa_chat({oa_image(png), {{"type", "text"}, {"text", "?"}}}, 1), &st);
    EXPECT_EQ(st, 200) << r.dump();
  };
  const std::string png_c = png_bytes(pattern(100, 70, 3));
  ask(kPngA);
  ask(kPngB);
  EXPECT_EQ(gate->n_calls(), 2);
  ask(kPngA);  // a hit: A is now the most recently used
  EXPECT_EQ(gate->n_calls(), 2);
  ask(png_c);  // evicts B
  EXPECT_EQ(gate->n_calls(), 3);
  EXPECT_EQ(metric(srv, "kimi_vision_cache_evictions_total"), 1u);
  EXPECT_EQ(metric(srv, "kimi_vision_cache_bytes"), 2 * one);
  ask(kPngA);
  EXPECT_EQ(gate->n_calls(), 3);
  ask(kPngB);
  EXPECT_EQ(gate->n_calls(), 4);
}

// A request cancelled while the tower runs for it ends at once (the slot is free, the server
// answers) and its run stops before the tower's first block (nothing kept); a request cancelled
// while its tower run is still queued never runs the tower.
TEST(ServerVisionTower, CancelWhileTheTowerIsHeld) {
  auto gate = std::make_shared<TowerGate>();
  gate->set(false);
  server::ServerOptions o = gated_opts(gate);
  o.sched.prompt_cache = false;
  RunningServer srv(o);
  GateOpener opener{*gate};
  auto send_raw = [&](const ojson& body) {
    const int fd = test::raw_connect(srv.port);
    EXPECT_GE(fd, 0);
    const std::string b = body.dump();
    const std::string http = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                             std::to_string(b.size()) + "\r\n\r\n" + b;
    EXPECT_TRUE(test::raw_send(fd, http));
    return fd;
  };
  const ojson qa = oa_chat({oa_image(kPngA), {{"type", "text"}, {"text", "What is this?"}}}, 5);
  ojson qb = qa;
  qb["messages"][0]["content"][0] = oa_image(kPngB);
  const int fa = send_raw(qa);
  ASSERT_TRUE(gate->wait_calls(1));  // the tower runs for A (held)
  const int fb = send_raw(qb);       // B's tower run waits behind A's
  ASSERT_TRUE(eventually([&] { return metric(srv, "kimi_requests_total{result=\"started\"}") == 2; }));
  ASSERT_TRUE(eventually([&] { return busy_slots(srv) == 2; }));
  ::close(fb);
  ::close(fa);
  EXPECT_TRUE(eventually([&] {
    return metric(srv, "kimi_requests_total{result=\"cancelled\"}") == 2 && busy_slots(srv) == 0;
  })) << srv.s->metrics_text();
  // the server answers while the tower is still held
  int st = 0;
  const ojson tr = srv.post("/v1/chat/completions", oa_chat({{{"type", "text"}, {"text", "Hello"}}}, 3), &st);
  EXPECT_EQ(st, 200) << tr.dump();
  EXPECT_EQ(gate->n_calls(), 1);
  gate->set(true);
  // A's run stopped (no rows kept) and B's never started (the hook saw neither): A and B again run
  // the tower, each once
  const ojson ra = srv.post("/v1/chat/completions", qa, &st);
  EXPECT_EQ(st, 200) << ra.dump();
  EXPECT_EQ(gate->n_calls(), 2);
  const ojson rb = srv.post("/v1/chat/completions", qb, &st);
  EXPECT_EQ(st, 200) << rb.dump();
  EXPECT_EQ(gate->n_calls(), 3);
  EXPECT_EQ(metric(srv, "kimi_vision_tower_runs_total"), 2u);  // the stopped run is not counted
  EXPECT_EQ(metric(srv, "kimi_vision_images_total{source=\"tower\"}"), 2u);
  EXPECT_EQ(metric(srv, "kimi_vision_cache_entries"), 2u);
}

}  // namespace
