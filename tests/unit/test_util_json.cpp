// parse_json: depth limit at parse time, error naming the document, normal documents unchanged.
#include <gtest/gtest.h>

#include <string>

#include "util/json.h"

namespace {

std::string nested(int levels, char open, char close) {
  return std::string(levels, open) + std::string(levels, close);
}

TEST(UtilJson, ParsesOrdinaryDocuments) {
  auto j = kimi::parse_json<nlohmann::json>(R"({"a":[1,2,{"b":null}],"c":"x"})", "doc");
  EXPECT_EQ(j["a"][1].get<int>(), 2);
  EXPECT_TRUE(j["a"][2]["b"].is_null());
  auto o = kimi::parse_json<nlohmann::ordered_json>(R"({"z":1,"a":2})", "doc");
  EXPECT_EQ(o.begin().key(), "z");
}

TEST(UtilJson, AcceptsNestingUpToTheLimit) {
  auto j = kimi::parse_json(nested(kimi::kJsonMaxDepth, '[', ']'), "doc");
  int depth = 0;
  const nlohmann::json* p = &j;
  while (p->is_array() && !p->empty()) { p = &(*p)[0]; ++depth; }
  EXPECT_EQ(depth, kimi::kJsonMaxDepth - 1);  // innermost array is empty
}

TEST(UtilJson, RefusesDeepNestingWithoutRecursing) {
  // 200 000 levels: a recursive copy or parse of this would overflow the stack
  for (char c : {'[', '{'}) {
    std::string s;
    if (c == '[') s = nested(200000, '[', ']');
    else for (int i = 0; i < 200000; ++i) s += "{\"a\":";
    try {
      kimi::parse_json<nlohmann::ordered_json>(s, "request body");
      FAIL() << "deep JSON accepted";
    } catch (const kimi::JsonError& e) {
      EXPECT_TRUE(e.too_deep);
      EXPECT_NE(std::string(e.what()).find("request body: JSON nested deeper than"), std::string::npos) << e.what();
    }
  }
}

TEST(UtilJson, MalformedIsNamedAndNotDeep) {
  try {
    kimi::parse_json("{\"a\":", "config.json");
    FAIL();
  } catch (const kimi::JsonError& e) {
    EXPECT_FALSE(e.too_deep);
    EXPECT_EQ(std::string(e.what()).rfind("config.json: invalid JSON", 0), 0u) << e.what();
  }
  std::string err;
  auto d = kimi::try_parse_json(nested(1000, '[', ']'), &err);
  EXPECT_TRUE(d.is_discarded());
  EXPECT_NE(err.find("nested deeper"), std::string::npos);
}

}  // namespace
