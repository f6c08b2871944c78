// parse_json: depth limit at parse time, error naming the document, normal documents unchanged.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

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

// Built by our own SAX handler (linear; nlohmann's callback parser walked the whole enclosing array
// at the end of every object): the same values as nlohmann's own parser, repeated keys included
// (the last value at the first key's place in an ordered_json object).
TEST(UtilJson, SameValuesAsNlohmannIncludingRepeatedKeys) {
  const char* docs[] = {R"({"a":[1,2,{"b":null}],"c":"x","a":5,"d":{"x":1,"x":[2]}})",
                        R"({"k":1,"j":2,"k":3,"m":{"z":1,"y":2,"z":0},"e":{},"f":[]})",
                        "[1.5e3,-2,18446744073709551615,-9223372036854775808,true,false,null,{},[[]],\"\\u00e9\"]",
                        "7", "\"s\"", "null"};
  for (const char* d : docs) {
    EXPECT_EQ(kimi::parse_json<nlohmann::ordered_json>(d, "doc").dump(), nlohmann::ordered_json::parse(d).dump()) << d;
    EXPECT_EQ(kimi::parse_json<nlohmann::json>(d, "doc").dump(), nlohmann::json::parse(d).dump()) << d;
  }
}

// An array of 200 000 objects and an object of 200 000 keys come out whole and in order (the
// request bodies of issue 38: 100 000 `{}` took 7.3 s on main, 200 001 messages 68 s).
TEST(UtilJson, ManyObjectsAndManyKeysComeOutWhole) {
  constexpr int n = 200000;
  std::string arr = "[", obj = "{";
  for (int i = 0; i < n; ++i) {
    arr += i ? ",{\"i\":" + std::to_string(i) + "}" : "{\"i\":0}";
    obj += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  }
  arr += "]";
  obj += ",\"k0\":-1}";  // repeated: its last value, at its first place
  const auto a = kimi::parse_json<nlohmann::ordered_json>(arr, "doc");
  ASSERT_EQ(a.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; i += 997) EXPECT_EQ(a[static_cast<size_t>(i)]["i"].get<int>(), i);
  const auto o = kimi::parse_json<nlohmann::ordered_json>(obj, "doc");
  ASSERT_EQ(o.size(), static_cast<size_t>(n));
  EXPECT_EQ(o.begin().key(), "k0");
  EXPECT_EQ(o["k0"].get<int>(), -1);
  int i = 0;
  for (auto it = o.begin(); it != o.end(); ++it, ++i) {
    if (i % 1009 != 0 || i == 0) continue;
    EXPECT_EQ(it.key(), "k" + std::to_string(i));
    EXPECT_EQ(it.value().get<int>(), i);
  }
  const auto m = kimi::parse_json<nlohmann::json>(obj, "doc");
  EXPECT_EQ(m.size(), static_cast<size_t>(n));
  EXPECT_EQ(m["k0"].get<int>(), -1);
}

// parse_json_with tells its callback the events and depths nlohmann's parser callback gets.
TEST(UtilJson, ExtraSeesTheEventsOfNlohmannsCallback) {
  const std::string d = R"({"a":[1,{"b":2,"c":[]}],"d":"x","e":{"f":null}})";
  using E = std::tuple<int, int, std::string>;
  std::vector<E> ours, ref;
  kimi::parse_json_with<nlohmann::json>(d, "doc", [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
    ours.emplace_back(depth, static_cast<int>(ev), v.dump());
    return true;
  });
  (void)nlohmann::json::parse(d, [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
    ref.emplace_back(depth, static_cast<int>(ev), v.dump());
    return true;
  });
  EXPECT_EQ(ours, ref);
}

}  // namespace
