// The prompt-cache store of `kimi serve` (server/prompt_cache.h) on the tiny synthetic model:
// resuming from it answers exactly as a server without any cache (every log-probability equal),
// LRU eviction under a small --cache-ram, interleaved conversations all resume, --cache-dir
// survives a restart, and truncated / corrupt / foreign files are skipped with a warning line and
// the answer is still the cold one.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server_fixture.h"

using namespace kimi;
using kimi::test::RunningServer;
using kimi::test::TempDir;
using server::ojson;
namespace fs = std::filesystem;

namespace {

server::ServerOptions cache_opts(uint64_t ram = 64u << 20, const std::string& dir = "") {
  server::ServerOptions o = test::server_opts();
  o.sched.parallel = 1;
  o.sched.cache_slots = 0;  // one live sequence: anything resumed later comes from the store
  o.sched.cache_ram = ram;
  o.sched.cache_dir = dir;
  o.quiet = true;
  return o;
}

std::string words(int n, int seed) {
  static const char* w[] = {"alpha", "beta", "gamma", "delta", "tool", "read", "file", "grep", "edit", "shell"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(w[(i * 7 + seed * 3 + i / 5) % 10]) + (i % 9 == 8 ? ".\n" : " ");
  return s;
}

// a Claude-Code-like conversation: a long system prompt, then user / assistant / tool turns
ojson conversation(int who, int turns) {
  ojson m = ojson::array();
  m.push_back({{"role", "system"}, {"content", "You are agent " + std::to_string(who) + ". " + words(60, who)}});
  m.push_back({{"role", "user"}, {"content", "Task " + std::to_string(who) + ": " + words(12, who + 1)}});
  for (int t = 1; t < turns; ++t) {
    m.push_back({{"role", "assistant"}, {"content", "Step " + std::to_string(t) + " " + words(6, t)}});
    m.push_back({{"role", "user"}, {"content", "Tool result " + std::to_string(t) + ": " + words(15, who * 10 + t)}});
  }
  return m;
}

ojson chat(const RunningServer& s, const ojson& messages) {
  ojson body = {{"messages", messages}, {"max_tokens", 6}, {"temperature", 0}, {"thinking", false},
                {"logprobs", true}, {"top_logprobs", 5}, {"ignore_eos", true}};
  int status = 0;
  ojson r = s.post("/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 200) << r.dump();
  return r;
}

int cached(const ojson& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }
int prompt_tokens(const ojson& r) { return r["usage"]["prompt_tokens"].get<int>(); }
// what must not depend on the cache: the text and every log-probability (from the raw logits)
std::string answer(const ojson& r) { return r["choices"][0]["message"].dump() + r["choices"][0]["logprobs"].dump(); }

std::vector<fs::path> cache_files(const std::string& dir) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kpc") v.push_back(e.path());
  return v;
}

int count_lines(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(ServerCache, ResumeFromStoreEqualsColdPrefill) {
  RunningServer cold(test::cold_server_opts());
  RunningServer s(cache_opts());
  const ojson c1 = conversation(1, 1), c2 = conversation(1, 2);
  const ojson a1 = chat(s, c1);
  EXPECT_EQ(cached(a1), 0);
  EXPECT_EQ(answer(a1), answer(chat(cold, c1)));
  chat(s, conversation(7, 1));  // another conversation takes the only live sequence
  const ojson a2 = chat(s, c2);  // so this one resumes from the store
  EXPECT_GE(cached(a2), prompt_tokens(a1) - 1) << "turn 2 extends turn 1's prompt";
  EXPECT_LT(cached(a2), prompt_tokens(a2));
  EXPECT_EQ(answer(a2), answer(chat(cold, c2)));
  const auto st = s.s->scheduler().stats().cache;
  EXPECT_GE(st.hits, 1u);
  EXPECT_GE(st.saves, 3u);
  EXPECT_GT(st.bytes, 0u);
  auto c = s.client();
  const auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kimi_prompt_cache_hits_total " + std::to_string(st.hits) + "\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("kimi_prompt_cache_bytes " + std::to_string(st.bytes) + "\n"), std::string::npos) << m->body;
  // the same prompt again resumes at its last token
  const ojson a3 = chat(s, c2);
  EXPECT_EQ(cached(a3), prompt_tokens(a2) - 1);
  EXPECT_EQ(answer(a3), answer(a2));
}

TEST(ServerCache, LruEvictionUnderSmallBudget) {
  RunningServer cold(test::cold_server_opts());
  // the budget is a few entries' worth: measure one conversation first
  uint64_t one = 0;
  {
    RunningServer probe(cache_opts());
    chat(probe, conversation(1, 1));
    one = probe.s->scheduler().stats().cache.bytes;
  }
  ASSERT_GT(one, 0u);
  const uint64_t budget = one * 3 / 2;  // one conversation fits, two do not
  RunningServer s(cache_opts(budget));
  for (int who = 1; who <= 4; ++who) chat(s, conversation(who, 1));
  const auto st = s.s->scheduler().stats().cache;
  EXPECT_GT(st.evictions, 0u);
  EXPECT_LE(st.bytes, budget);
  // conversation 4 is still there, conversation 1 was evicted; both answer as the cold server
  const ojson last = chat(s, conversation(4, 2));
  EXPECT_GT(cached(last), prompt_tokens(last) / 2);
  EXPECT_EQ(answer(last), answer(chat(cold, conversation(4, 2))));
  const ojson first = chat(s, conversation(1, 2));
  EXPECT_EQ(cached(first), 0);
  EXPECT_EQ(answer(first), answer(chat(cold, conversation(1, 2))));
}

TEST(ServerCache, InterleavedConversationsAllHit) {
  RunningServer cold(test::cold_server_opts());
  server::ServerOptions o = cache_opts();
  o.sched.parallel = 2;
  RunningServer s(o);
  std::vector<int> prev(5, 0);
  int follow_ups = 0;
  for (int turn = 1; turn <= 3; ++turn)
    for (int who = 1; who <= 4; ++who) {
      const ojson r = chat(s, conversation(who, turn));
      if (turn > 1) {
        EXPECT_GE(cached(r), prev[static_cast<size_t>(who)] - 1) << "agent " << who << " turn " << turn;
        ++follow_ups;
      }
      prev[static_cast<size_t>(who)] = prompt_tokens(r);
      if (turn == 3) {
        EXPECT_EQ(answer(r), answer(chat(cold, conversation(who, turn))));
      }
    }
  EXPECT_EQ(follow_ups, 8);
  EXPECT_GE(s.s->scheduler().stats().cache.hits, 8u);
}

TEST(ServerCache, RestartWithCacheDirHits) {
  TempDir dir;
  const std::string d = dir.file("pc");
  RunningServer cold(test::cold_server_opts());
  int p1 = 0;
  {
    RunningServer s(cache_opts(64u << 20, d));
    p1 = prompt_tokens(chat(s, conversation(2, 1)));
  }  // shut down: the pending files are written
  ASSERT_FALSE(cache_files(d).empty());
  for (const auto& f : fs::directory_iterator(d)) EXPECT_EQ(f.path().extension(), ".kpc") << "no temporary left";
  // a temporary left by a server that died while writing (a pid that does not exist) is removed
  pid_t dead = 4000000;
  while (::kill(dead, 0) == 0 || errno != ESRCH) --dead;
  const std::string stale = d + "/x.kpc.tmp" + std::to_string(dead);
  std::ofstream(stale) << "partial";
  RunningServer s(cache_opts(64u << 20, d));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_GT(s.s->scheduler().stats().cache.disk_entries, 0u);
  const ojson r = chat(s, conversation(2, 2));
  EXPECT_GE(cached(r), p1 - 1);
  EXPECT_EQ(s.s->scheduler().stats().cache.disk_loads, 1u);
  EXPECT_EQ(answer(r), answer(chat(cold, conversation(2, 2))));
}

TEST(ServerCache, BadCacheFilesAreSkippedWithAWarning) {
  RunningServer cold(test::cold_server_opts());
  const ojson turn2 = conversation(3, 2);
  const std::string want = answer(chat(cold, turn2));
  enum Damage { Truncated, Corrupt, Foreign };
  for (Damage dmg : {Truncated, Corrupt, Foreign}) {
    SCOPED_TRACE(dmg == Truncated ? "truncated" : dmg == Corrupt ? "corrupt" : "foreign");
    TempDir dir;
    const std::string d = dir.file("pc");
    {
      RunningServer s(cache_opts(64u << 20, d));
      chat(s, conversation(3, 1));
    }
    const auto files = cache_files(d);
    ASSERT_FALSE(files.empty());
    for (const auto& f : files) {
      const auto size = fs::file_size(f);
      if (dmg == Truncated) {
        fs::resize_file(f, size / 2);
      } else {
        std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(dmg == Corrupt ? static_cast<std::streamoff>(size - 100) : 8);  // a state byte / the identity
        const char* bytes = dmg == Corrupt ? "\x5a" : "0123456789abcdef";
        io.write(bytes, dmg == Corrupt ? 1 : 16);
      }
    }
    testing::internal::CaptureStderr();
    ojson r;
    uint64_t skipped = 0;
    {
      RunningServer s(cache_opts(64u << 20, d));
      r = chat(s, turn2);
      skipped = s.s->scheduler().stats().cache.disk_skipped;
    }
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(answer(r), want);
    EXPECT_EQ(cached(r), 0);
    if (dmg == Corrupt) {  // found at load time: one file, one line, removed
      EXPECT_EQ(count_lines(err, "prompt cache: skipping"), 1) << err;
      EXPECT_NE(err.find("checksum"), std::string::npos) << err;
      EXPECT_EQ(skipped, 1u);
    } else {  // found at startup: one line per file
      EXPECT_EQ(count_lines(err, "prompt cache: skipping"), static_cast<int>(files.size())) << err;
      EXPECT_NE(err.find(dmg == Truncated ? "truncated" : "another model"), std::string::npos) << err;
      EXPECT_EQ(skipped, files.size());
      for (const auto& f : files) EXPECT_EQ(fs::exists(f), dmg == Foreign) << f << ": only foreign files are kept";
    }
  }
}

TEST(ServerCache, AnotherModelsFilesAreForeign) {
  TempDir dir;
  const std::string d = dir.file("pc");
  {
    RunningServer s(cache_opts(64u << 20, d));
    chat(s, conversation(5, 1));
  }
  const size_t n = cache_files(d).size();
  ASSERT_GT(n, 0u);
  server::ServerOptions o = cache_opts(64u << 20, d);
  o.model_path = test::tiny_gguf(2);  // same layout, other weights
  server::ServerOptions c = test::cold_server_opts();
  c.model_path = o.model_path;
  RunningServer cold(c);
  testing::internal::CaptureStderr();
  ojson r;
  {
    RunningServer s(o);
    r = chat(s, conversation(5, 2));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_lines(err, "another model"), static_cast<int>(n)) << err;
  EXPECT_EQ(cached(r), 0);
  EXPECT_EQ(answer(r), answer(chat(cold, conversation(5, 2))));
}

TEST(ServerCache, CacheDirWithoutAStoreIsAnError) {
  TempDir dir;
  const auto r = test::run_kimi("serve -m " + test::tiny_gguf() + " --port 0 --cache-ram 0 --cache-dir " + dir.file("pc"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--cache-dir needs the prompt-cache store"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.file("pc")));
}

// Issue 38: what others plant in --cache-dir. On main the startup scan followed a symbolic link out
// of the folder and the store served the outside file, and a file with NaN values under a valid
// checksum was loaded. Now: links (to valid files outside, to /dev/zero) and FIFOs are skipped
// without blocking, a file whose rows or states are not finite numbers is skipped when it is loaded
// (one warning line), the outside files are untouched, and the answers are the cold ones.
TEST(ServerCache, PlantedLinksFifosAndNonFiniteFilesAreNeverUsed) {
  RunningServer cold(test::cold_server_opts());
  const ojson turn2 = conversation(5, 2);
  const std::string want = answer(chat(cold, turn2));
  TempDir dir, outside;
  const std::string d = dir.file("pc");
  {
    RunningServer s(cache_opts(64u << 20, d));
    chat(s, conversation(5, 1));
  }
  const auto files = cache_files(d);
  ASSERT_FALSE(files.empty());
  std::vector<std::string> kept;  // the outside copies and their bytes
  for (const auto& f : files) {
    const std::string out = outside.file(f.filename().string());
    fs::rename(f, out);
    fs::create_symlink(out, f);
    kept.push_back(test::read_file(out));
  }
  ASSERT_EQ(::mkfifo((d + "/fifo.kpc").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", d + "/zero.kpc");
  {
    testing::internal::CaptureStderr();
    RunningServer s(cache_opts(64u << 20, d));  // the scan does not block on the FIFO
    const ojson r = chat(s, turn2);
    testing::internal::GetCapturedStderr();
    EXPECT_EQ(cached(r), 0) << "a linked file was used";
    EXPECT_EQ(answer(r), want);
    EXPECT_EQ(s.s->scheduler().stats().cache.disk_loads, 0u);
  }
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(test::read_file(outside.file(files[i].filename().string())), kept[i]);
  // the first turn's files alone (the second server wrote its own: removed) as regular files in the
  // folder, with a NaN in the KDA states (a valid checksum)
  fs::remove_all(d);
  fs::create_directories(d);
  for (size_t i = 0; i < files.size(); ++i)
    test::write_file(files[i].string(), test::with_bytes(kept[i], kept[i].size() - 12, 0x7fc00000u));
  testing::internal::CaptureStderr();
  ojson r;
  {
    RunningServer s(cache_opts(64u << 20, d));
    r = chat(s, turn2);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cached(r), 0);
  EXPECT_EQ(answer(r), want);
  EXPECT_NE(err.find("not finite"), std::string::npos) << err;
}
