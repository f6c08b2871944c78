#include "convert/synth_corpus.h"

#include <array>
#include <cmath>
#include <string_view>
#include <vector>

namespace kimi::synth {
namespace {

// splitmix64: small, fast, good enough for text generation.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return unit() < p; }
  template <typename T, size_t N>
  const T& pick(const std::array<T, N>& a) { return a[below(N)]; }
};

constexpr std::array<std::string_view, 160> kCommon = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
    "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when",
    "will", "would", "who", "so", "no", "out", "up", "into", "some", "could", "them", "time", "than", "only",
    "other", "new", "about", "these", "two", "may", "first", "then", "do", "any", "like", "my", "now",
    "over", "such", "our", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before",
    "must", "through", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each",
    "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still",
    "own", "see", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day",
    "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come",
    "since", "against", "go", "came", "right", "used", "take", "three", "model", "data", "layer", "token",
    "memory", "system", "value", "number", "river", "market", "garden", "window", "science", "history",
    "music", "question", "answer", "reason"};

constexpr std::array<std::string_view, 24> kAccented = {
    "café", "naïve", "résumé", "über", "señor", "façade", "Zürich", "São", "Paulo", "crème", "brûlée",
    "déjà", "vu", "piñata", "jalapeño", "Ångström", "smörgåsbord", "Dvořák", "Łódź", "Kraków", "Mühle",
    "élan", "coöperate", "entrée"};

constexpr std::array<std::string_view, 16> kCjk = {
    "中文", "日本語", "你好世界", "机器学习", "模型", "数据", "语言", "天气很好", "北京", "上海", "东京",
    "学生", "我们", "大学", "时间", "问题"};

constexpr std::array<std::string_view, 8> kGreekCyrillic = {"λόγος", "θάλασσα", "φως", "Москва", "привет",
                                                            "книга", "αλφα", "мир"};

constexpr std::array<std::string_view, 14> kOnsets = {"b", "c", "d", "f", "g", "l", "m", "n", "p", "r", "s",
                                                      "t", "v", "z"};
constexpr std::array<std::string_view, 12> kClusters = {"br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh",
                                                        "st", "th", "tr"};
constexpr std::array<std::string_view, 11> kVowels = {"a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "y"};
constexpr std::array<std::string_view, 14> kCodas = {"",  "",   "n",  "r",  "s",  "t",   "l",
                                                     "nd", "ng", "st", "rk", "ll", "tion", "ment"};

constexpr std::array<std::string_view, 10> kKeywords = {"if", "for", "while", "return", "const", "auto",
                                                        "int", "float", "def", "class"};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_{seed ^ 0x6b696d692d636f72ull} {
    // A lexicon of pronounceable pseudo-words: the long tail the BPE has to compress.
    lexicon_.reserve(kLexicon);
    for (size_t i = 0; i < kLexicon; ++i) lexicon_.push_back(pseudo_word());
  }

  void paragraph(std::string& out) {
    double r = rng_.unit();
    if (r < 0.55) prose(out);
    else if (r < 0.72) code(out);
    else if (r < 0.82) numbers(out);
    else if (r < 0.91) markdown(out);
    else multilingual(out);
    out += rng_.chance(0.8) ? "\n\n" : "\n";
  }

 private:
  static constexpr size_t kLexicon = 24000;

  std::string pseudo_word() {
    std::string w;
    size_t syl = 1 + rng_.below(3);
    for (size_t s = 0; s < syl; ++s) {
      w += rng_.chance(0.25) ? rng_.pick(kClusters) : rng_.pick(kOnsets);
      w += rng_.pick(kVowels);
    }
    w += rng_.pick(kCodas);
    return w;
  }

  // Zipf-like choice: log-uniform rank, so frequent words repeat and the tail is long.
  std::string_view word() {
    if (rng_.chance(0.45)) {
      size_t r = static_cast<size_t>(std::exp(rng_.unit() * std::log(double(kCommon.size()) + 1.0))) - 1;
      return kCommon[r < kCommon.size() ? r : 0];
    }
    // flatter for the pseudo-words: density ~ rank^-1/2, so most of the lexicon shows up
    double u = rng_.unit();
    size_t r = static_cast<size_t>(u * u * double(kLexicon));
    return lexicon_[r < kLexicon ? r : kLexicon - 1];
  }

  static void capitalize(std::string& s, size_t at) {
    if (at < s.size() && s[at] >= 'a' && s[at] <= 'z') s[at] = static_cast<char>(s[at] - 'a' + 'A');
  }

  void sentence(std::string& out) {
    size_t start = out.size();
    size_t n = 4 + rng_.below(14);
    bool quote = rng_.chance(0.08);
    if (quote) out += '"';
    size_t word_start = out.size();
    for (size_t i = 0; i < n; ++i) {
      if (i) out += ' ';
      size_t ws = out.size();
      double r = rng_.unit();
      if (r < 0.02) out += rng_.pick(kAccented);
      else if (r < 0.03) out += std::to_string(rng_.below(2100));
      else {
        out += word();
        if (rng_.chance(0.04)) capitalize(out, ws);  // proper noun
        if (rng_.chance(0.03)) out += rng_.chance(0.5) ? "'s" : "n't";
        else if (rng_.chance(0.01)) out += "'ll";
      }
      if (i + 1 < n && rng_.chance(0.08)) out += rng_.chance(0.8) ? "," : ";";
      if (i + 1 < n && rng_.chance(0.01)) out += " —";
    }
    capitalize(out, word_start);
    double e = rng_.unit();
    out += e < 0.8 ? "." : e < 0.9 ? "?" : e < 0.97 ? "!" : "...";
    if (quote) out += '"';
    if (rng_.chance(0.04)) out += " (" + std::string(word()) + ")";
    (void)start;
  }

  void prose(std::string& out) {
    size_t n = 2 + rng_.below(6);
    for (size_t i = 0; i < n; ++i) {
      if (i) out += rng_.chance(0.1) ? "  " : " ";
      sentence(out);
    }
  }

  std::string ident() {
    std::string s(word());
    if (rng_.chance(0.5)) {
      s += rng_.chance(0.7) ? "_" : "";
      std::string t(word());
      if (s.back() != '_') capitalize(t, 0);
      s += t;
    }
    if (rng_.chance(0.1)) s += std::to_string(rng_.below(10));
    return s;
  }

  void code(std::string& out) {
    if (rng_.chance(0.5)) {  // python-like
      out += "def " + ident() + "(" + ident() + ", " + ident() + "=" + std::to_string(rng_.below(100)) + "):\n";
      size_t n = 1 + rng_.below(5);
      for (size_t i = 0; i < n; ++i) {
        out += "    ";
        double r = rng_.unit();
        if (r < 0.3) out += "if " + ident() + " > " + std::to_string(rng_.below(1000)) + ":\n        " + ident() + " += 1\n";
        else if (r < 0.6) out += ident() + " = [" + std::to_string(rng_.below(10)) + ", " + std::to_string(rng_.below(100)) + "]\n";
        else if (r < 0.8) out += "print(f\"" + std::string(word()) + " {" + ident() + "}\")\n";
        else out += "# " + std::string(word()) + " " + std::string(word()) + "\n";
      }
      out += "    return " + ident() + "\n";
    } else {  // C-like
      out += std::string(rng_.pick(kKeywords)) + " " + ident() + "(const std::vector<float>& " + ident() + ") {\n";
      out += "\tfor (int i = 0; i < n; ++i) {\n\t\t" + ident() + "[i] *= " +
             std::to_string(rng_.below(100)) + "." + std::to_string(rng_.below(100)) + "f;\n\t}\n";
      if (rng_.chance(0.5)) out += "\t// " + std::string(word()) + " -> " + std::string(word()) + "\n";
      out += "\treturn " + ident() + " != nullptr && x[0] >= 0x" + std::to_string(10 + rng_.below(90)) + ";\n}";
    }
  }

  void numbers(std::string& out) {
    size_t n = 3 + rng_.below(6);
    for (size_t i = 0; i < n; ++i) {
      if (i) out += rng_.chance(0.3) ? "\n" : ", ";
      switch (rng_.below(7)) {
        case 0:
          out += fmt_date();
          break;
        case 1:
          out += "$" + std::to_string(1 + rng_.below(999)) + "," + pad3(rng_.below(1000)) + "." + pad2(rng_.below(100));
          break;
        case 2:
          out += std::to_string(rng_.below(100)) + "." + std::to_string(rng_.below(10)) + "%";
          break;
        case 3:
          out += "v" + std::to_string(rng_.below(10)) + "." + std::to_string(rng_.below(20)) + "." + std::to_string(rng_.below(100));
          break;
        case 4:
          out += std::to_string(rng_.below(24)) + ":" + pad2(rng_.below(60)) + " " + std::string(word());
          break;
        case 5:
          out += "+1 (" + pad3(rng_.below(1000)) + ") " + pad3(rng_.below(1000)) + "-" + std::to_string(1000 + rng_.below(9000));
          break;
        default:
          out += std::to_string(rng_.next() % 100000000ull) + " " + std::string(word()) + "s";
      }
    }
    out += rng_.chance(0.5) ? " €" + std::to_string(rng_.below(500)) : ".";
  }

  void markdown(std::string& out) {
    out += rng_.chance(0.5) ? "## " : "### ";
    std::string h(word());
    capitalize(h, 0);
    out += h + " " + std::string(word()) + "\n\n";
    size_t n = 2 + rng_.below(4);
    for (size_t i = 0; i < n; ++i) {
      out += rng_.chance(0.6) ? "- " : std::to_string(i + 1) + ". ";
      out += "**" + std::string(word()) + "**: " + std::string(word()) + " " + std::string(word()) + "\n";
    }
    if (rng_.chance(0.4)) {
      out += "| " + std::string(word()) + " | " + std::string(word()) + " |\n|---|---|\n";
      out += "| " + std::to_string(rng_.below(100)) + " | " + std::to_string(rng_.below(1000)) + " |\n";
    }
  }

  void multilingual(std::string& out) {
    size_t n = 3 + rng_.below(8);
    for (size_t i = 0; i < n; ++i) {
      double r = rng_.unit();
      if (r < 0.35) {
        out += rng_.pick(kCjk);
        if (rng_.chance(0.5)) out += rng_.chance(0.5) ? "，" : "。";
      } else if (r < 0.6) {
        if (i) out += ' ';
        out += rng_.pick(kAccented);
      } else if (r < 0.72) {
        if (i) out += ' ';
        out += rng_.pick(kGreekCyrillic);
      } else {
        if (i) out += ' ';
        out += word();
      }
    }
    out += rng_.chance(0.5) ? " → ok…" : ".";
  }

  std::string fmt_date() {
    return std::to_string(1990 + rng_.below(40)) + "-" + pad2(1 + rng_.below(12)) + "-" + pad2(1 + rng_.below(28));
  }
  static std::string pad2(size_t v) { return (v < 10 ? "0" : "") + std::to_string(v); }
  static std::string pad3(size_t v) { return (v < 10 ? "00" : v < 100 ? "0" : "") + std::to_string(v); }

  Rng rng_;
  std::vector<std::string> lexicon_;
};

}  // namespace

std::string make_corpus(size_t min_bytes, uint64_t seed) {
  Generator g(seed);
  std::string out;
  out.reserve(min_bytes + 4096);
  while (out.size() < min_bytes) g.paragraph(out);
  return out;
}

}  // namespace kimi::synth
