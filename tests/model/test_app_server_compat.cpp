// `kimi serve` as llama.cpp / OpenAI users call it: the README's curl example as written, bodies
// without a JSON content type, and the llama-server style endpoints.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server_fixture.h"

using namespace kimi;
using namespace kimi::test;

namespace {

// The JSON body of the README's `curl ... /v1/chat/completions -d '...'` line.
std::string readme_curl_body() {
  std::ifstream f(std::string(KIMI_SOURCE_DIR) + "/README.md");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("curl -s localhost:8080/v1/chat/completions -d '", 0) != 0) continue;
    const size_t a = line.find('\''), b = line.rfind('\'');
    if (a != std::string::npos && b > a) return line.substr(a + 1, b - a - 1);
  }
  return {};
}

}  // namespace

// The README's example, sent the way curl -d sends it (application/x-www-form-urlencoded), shows an
// answer in `content` (not only reasoning).
TEST(ServerCompat, ReadmeCurlExampleShowsAnAnswer) {
  const std::string body = readme_curl_body();
  ASSERT_FALSE(body.empty()) << "no curl example in README.md";
  auto o = server_opts();
  o.fixed_seed = true;  // the example has no seed; a fixed server seed makes the output reproducible
  o.sampling.seed = 7;
  RunningServer r(o);
  int st = 0;
  const ojson j = r.post("/v1/chat/completions", body, &st, "application/x-www-form-urlencoded");
  ASSERT_EQ(st, 200) << j.dump();
  const ojson& m = j["choices"][0]["message"];
  EXPECT_FALSE(m.contains("reasoning_content")) << m.dump();
  ASSERT_TRUE(m["content"].is_string());
  EXPECT_FALSE(m["content"].get<std::string>().empty()) << j.dump();
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
}

// curl -d / --data-binary send `application/x-www-form-urlencoded` (or nothing); a JSON body over
// 8 KiB is read as JSON all the same.
TEST(ServerCompat, LargeJsonBodyWithoutJsonContentType) {
  auto o = server_opts();
  o.ctx = 4096;
  RunningServer r(o);
  ojson prompt = ojson::array();
  for (int i = 0; i < 2500; ++i) prompt.push_back(100 + i % 500);
  const std::string body = ojson{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  ASSERT_GT(body.size(), 8192u);
  for (const char* ct : {"application/x-www-form-urlencoded", "text/plain", ""}) {
    int st = 0;
    const ojson j = r.post("/v1/completions", body, &st, ct);
    EXPECT_EQ(st, 200) << ct << ": " << j.dump().substr(0, 300);
    EXPECT_EQ(j["usage"]["prompt_tokens"], 2500) << ct;
  }
}

// thinking_effort follows the K3 template: what it refuses is a 400 with the template's message.
TEST(ServerCompat, ThinkingEffortAsTheTemplateSays) {
  RunningServer r(server_opts());
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", "hi"}}});
  int st = 0;
  for (const char* k : {"thinking_effort", "reasoning_effort"}) {
    const ojson j = r.post("/v1/chat/completions", ojson{{"messages", msgs}, {k, "extreme"}, {"max_tokens", 2}}, &st);
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], k);
    // thinking_effort: the template's own message; reasoning_effort: OpenAI's values (mapped onto K3's)
    EXPECT_NE(j["error"]["message"].get<std::string>().find(
                  std::string(k) == "thinking_effort"
                      ? "Unsupported thinking_effort=extreme; supported values are low, medium, high, and max."
                      : "expected one of none, minimal, low, medium, high, xhigh"),
              std::string::npos)
        << j.dump();
  }
  r.post("/v1/chat/completions", ojson{{"messages", msgs}, {"thinking_effort", "low"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 200);
  // thinking off: the template does not look at the effort
  r.post("/v1/chat/completions",
         ojson{{"messages", msgs}, {"thinking", false}, {"thinking_effort", "extreme"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 200);
}
