// The RULER suite's generators and scorer (include/kvsim/model/retrieval.hpp, sim/model/ruler.cpp;
// docs/tasks.md): every kind's prompt is exactly L tokens and an oracle reading it finds the answer,
// while the same prompt without its evidence tokens cannot be answered (the negative control); the
// draws are seeded; settings that cannot fit are refused by key; the score is RULER's string_match_all
// and a wrong value scores nothing. Self-contained: a byte-level vocabulary and a made-up filler text.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>

#include "byte_tokenizer.hpp"
#include "kvsim/model/retrieval.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;
using test::text_of;

namespace {

/// Sentences over 400 made-up words of three syllables (a filler with enough distinct words for
/// common_words' lists), as tokens.
std::vector<int> word_filler(const Tokenizer& tok) {
  const char* syl[] = {"ba", "ko", "ri", "mu", "te", "sa", "lo", "ni", "pe", "du", "fa", "gi"};
  std::vector<std::string> words;
  for (int i = 0; i < 400; ++i) words.push_back(std::string(syl[i % 12]) + syl[(i / 12) % 12] + syl[(i / 144) % 12] + "n");
  std::string text;
  for (int r = 0; r < 12; ++r)
    for (size_t i = 0; i + 2 < words.size(); i += 3) text += "The " + words[i] + " saw a " + words[i + 1] + " near the " + words[i + 2] + ".\n";
  return tok.encode(text, false, false);
}

TrialSpec spec_of(const std::string& kind, int L, double depth = 0.4, int index = 0) {
  TrialSpec s;
  s.kind = kind, s.length = L, s.depth = depth, s.index = index, s.seed = 7;
  s.settings.format = "plain";  // the byte vocabulary has no chat markers
  s.templ = default_template(kind, s.settings);
  return s;
}

/// The prompt without the tokens of `drop`.
std::vector<int> without(const std::vector<int>& ids, const std::vector<Span>& drop) {
  std::vector<int> out;
  for (int i = 0; i < int(ids.size()); ++i)
    if (std::none_of(drop.begin(), drop.end(), [&](const Span& s) { return i >= s.begin && i < s.end; })) out.push_back(ids[size_t(i)]);
  return out;
}

std::string last_after(const std::string& text, const std::string& mark) {
  const size_t at = text.rfind(mark);
  return at == std::string::npos ? "" : text.substr(at + mark.size());
}

/// The words of `list` ("1. a 2. b …" or "a b …"), most frequent first (ties alphabetical), "..." left out.
std::vector<std::string> by_count(const std::string& list) {
  std::map<std::string, int> n;
  const std::regex word("[a-z.]+");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), word); it != std::sregex_iterator(); ++it)
    if (it->str() != "." && it->str().find('.') == std::string::npos) ++n[it->str()];
  std::vector<std::pair<int, std::string>> v;
  for (const auto& [w, c] : n) v.push_back({-c, w});
  std::sort(v.begin(), v.end());
  std::vector<std::string> out;
  for (const auto& p : v) out.push_back(p.second);
  return out;
}

/// An oracle that reads the prompt's text as a careful reader would and answers the question.
std::string oracle(const std::string& kind, const std::string& prompt) {
  const std::string context = prompt.substr(0, prompt.rfind("\nWhat") != std::string::npos && kind.rfind("niah", 0) == 0
                                                    ? prompt.rfind("\nWhat")
                                                    : prompt.rfind("\nQuestion:"));
  const std::string question = prompt.substr(context.size());
  std::string answer;
  if (kind.rfind("niah", 0) == 0) {
    std::smatch m;
    std::regex_search(question, m, std::regex(" for (.*) mentioned in the provided text\\?"));
    const std::string keys = " " + m[1].str() + ",";  // " A, B, and C,": a key is asked when " key," is in it
    const std::regex needle("magic [a-z]+ for ([a-z-]+) is: ([0-9a-z-]+)\\.");
    for (auto it = std::sregex_iterator(context.begin(), context.end(), needle); it != std::sregex_iterator(); ++it)
      if (keys.find(" " + (*it)[1].str() + ",") != std::string::npos) answer += (*it)[2].str() + " ";
  } else if (kind == "variable_tracking") {
    std::smatch m;
    std::regex_search(question, m, std::regex("assigned the value ([0-9]+) in"));
    std::set<std::string> bound = {m[1].str()};
    const std::regex stmt("VAR ([A-Z]+) = (VAR )?([A-Z0-9]+)\\.");
    for (bool grew = true; grew;) {  // follow the chain: a name is bound when what it copies is
      grew = false;
      for (auto it = std::sregex_iterator(context.begin(), context.end(), stmt); it != std::sregex_iterator(); ++it)
        if (bound.count((*it)[3].str()) && bound.insert((*it)[1].str()).second) grew = true, answer += (*it)[1].str() + " ";
    }
  } else if (kind == "common_words") {
    const auto w = by_count(last_after(context, "appear most often.\n"));
    for (size_t i = 0; i < std::min<size_t>(10, w.size()); ++i) answer += w[i] + " ";
  } else {
    const auto w = by_count(last_after(context, "coded words."));
    for (size_t i = 0; i < std::min<size_t>(3, w.size()); ++i) answer += w[i] + " ";
  }
  return answer;
}

const std::vector<std::string> kSuite = {"niah_single",       "niah_multikey", "niah_multivalue", "niah_multiquery",
                                         "variable_tracking", "common_words",  "frequent_words"};

}  // namespace

TEST_CASE("ruler: every kind is L tokens, and an oracle answers it but not once its evidence is removed", "[retrieval][ruler]") {
  test::TempDir dir;
  const Tokenizer tok = test::byte_tokenizer(dir);
  const std::vector<int> filler = word_filler(tok);
  for (const auto& kind : kSuite)
    for (int L : {2400, 3000})
      for (int index : {0, 1, 2}) {
        INFO(kind << " at L = " << L << ", trial " << index);
        const TrialSpec s = spec_of(kind, L, 0.2 + 0.3 * index, index);
        const TaskTrial tr = make_trial(s, tok, filler);
        REQUIRE(tr.tokens.size() == size_t(L));
        REQUIRE(!tr.answers.empty());
        REQUIRE(!tr.evidence.empty());
        for (size_t e = 0; e < tr.evidence.size(); ++e) {
          CHECK(tr.evidence[e].begin < tr.evidence[e].end);
          CHECK(tr.evidence[e].end <= tr.question_begin);
          if (e) CHECK(tr.evidence[e - 1].end <= tr.evidence[e].begin);
        }
        CHECK(tr.needle_begin == tr.evidence[0].begin);
        const std::string prompt = text_of(tok, tr.tokens, 1, L);  // after BOS
        const std::string answer = oracle(kind, prompt);
        CHECK(answer_score(answer, tr.answers, "word") == 1);
        // The negative control: the prompt without the evidence's tokens leaves no answer to read.
        const auto cut = without(tr.tokens, tr.evidence);
        const std::string blind = oracle(kind, text_of(tok, cut, 1, int(cut.size())));
        CHECK(answer_score(blind, tr.answers, "word") < 1);
        if (kind != "niah_multiquery" && kind != "niah_multivalue") CHECK(answer_score(blind, tr.answers, "word") == 0);
      }
}

TEST_CASE("ruler: each kind hides what RULER's does", "[retrieval][ruler]") {
  test::TempDir dir;
  const Tokenizer tok = test::byte_tokenizer(dir);
  const std::vector<int> filler = word_filler(tok);
  auto region = [&](const TaskTrial& tr, const Span& s) { return text_of(tok, tr.tokens, s.begin, s.end); };
  const TaskTrial one = make_trial(spec_of("niah_single", 2400), tok, filler);
  REQUIRE(one.answers.size() == 1);
  CHECK(std::regex_match(one.answers[0], std::regex("[1-9][0-9]{6}")));
  CHECK(region(one, one.evidence[0]) == " One of the special magic numbers for " + one.key + " is: " + one.answers[0] + ".");
  CHECK(text_of(tok, one.tokens, one.question_begin, 2400).find("What is the special magic number for " + one.key) != std::string::npos);
  CHECK(one.depth == Approx(0.4).margin(0.05));
  // multikey: four needles with distinct keys, one of them asked.
  const TaskTrial mk = make_trial(spec_of("niah_multikey", 2400), tok, filler);
  CHECK(mk.needles.size() == 4);
  CHECK(mk.evidence.size() == 1);
  std::set<std::string> texts;
  for (const Span& n : mk.needles) texts.insert(region(mk, n).substr(0, region(mk, n).find(" is:")));
  CHECK(texts.size() == 4);
  // multivalue: four needles of the one key, four values to return; multiquery: four keys asked.
  const TaskTrial mv = make_trial(spec_of("niah_multivalue", 2400), tok, filler);
  CHECK(mv.evidence.size() == 4);
  CHECK(std::set<std::string>(mv.answers.begin(), mv.answers.end()).size() == 4);
  for (const Span& e : mv.evidence) CHECK(region(mv, e).find(" for " + mv.key + " is: ") != std::string::npos);
  const TaskTrial mq = make_trial(spec_of("niah_multiquery", 2400), tok, filler);
  CHECK(mq.answers.size() == 4);
  CHECK(std::count(mq.key.begin(), mq.key.end(), ',') == 3);
  CHECK(mq.key.find(", and ") != std::string::npos);
  // UUID values: version 4, RFC 4122 variant.
  TrialSpec u = spec_of("niah_single", 2400);
  u.settings.value_type = "uuid";
  u.templ = default_template("niah_single", u.settings);
  const TaskTrial uu = make_trial(u, tok, filler);
  CHECK(std::regex_match(uu.answers[0], std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
  // variable_tracking: the chain in order, each link copying the one before.
  const TaskTrial vt = make_trial(spec_of("variable_tracking", 2400), tok, filler);
  REQUIRE(vt.evidence.size() == 5);
  CHECK(region(vt, vt.evidence[0]) == " VAR " + vt.answers[0] + " = " + vt.key + ".");
  for (size_t j = 1; j < 5; ++j) CHECK(region(vt, vt.evidence[j]) == " VAR " + vt.answers[j] + " = VAR " + vt.answers[j - 1] + ".");
  // common_words: the asked words 6 times, every other once (RULER below 4096 tokens); frequent_words:
  // the answers are the counts' ranks 2-4, above all but the noise.
  const TaskTrial cw = make_trial(spec_of("common_words", 2400), tok, filler);
  const std::string list = last_after(text_of(tok, cw.tokens, 1, cw.question_begin), "appear most often.\n");
  const auto counted = by_count(list);
  for (const auto& a : cw.answers) CHECK(std::count(counted.begin(), counted.begin() + 10, a) == 1);
  CHECK(cw.evidence.size() == 60);
  const TaskTrial fw = make_trial(spec_of("frequent_words", 2400), tok, filler);
  const auto ranked = by_count(last_after(text_of(tok, fw.tokens, 1, fw.question_begin), "coded words."));
  CHECK(std::set<std::string>(ranked.begin(), ranked.begin() + 3) == std::set<std::string>(fw.answers.begin(), fw.answers.end()));
}

TEST_CASE("ruler: draws are seeded, and settings that cannot fit are refused by key", "[retrieval][ruler]") {
  test::TempDir dir;
  const Tokenizer tok = test::byte_tokenizer(dir);
  const std::vector<int> filler = word_filler(tok);
  for (const auto& kind : kSuite) {
    INFO(kind);
    const TaskTrial a = make_trial(spec_of(kind, 2400), tok, filler), b = make_trial(spec_of(kind, 2400), tok, filler);
    CHECK(a.tokens == b.tokens);
    CHECK(make_trial(spec_of(kind, 2400, 0.4, 1), tok, filler).answers != a.answers);
  }
  TrialSpec many = spec_of("niah_multikey", 600);
  many.settings.needles = 12;
  CHECK_THROWS_WITH(make_trial(many, tok, filler), Contains("task.lengths: 600 tokens") && Contains("task.needles"));
  TrialSpec long_chain = spec_of("variable_tracking", 600);
  long_chain.settings.hops = 20;
  CHECK_THROWS_WITH(make_trial(long_chain, tok, filler), Contains("task.hops"));
  TrialSpec cw = spec_of("common_words", 700);
  CHECK_THROWS_WITH(make_trial(cw, tok, filler), Contains("task.common"));
  CHECK_THROWS_WITH(make_trial(spec_of("frequent_words", 200), tok, filler), Contains("task.vocab"));
  CHECK_THROWS_WITH(make_trial(spec_of("common_words", 2400), tok, tok.encode("The cat sat. The dog ran.", false, false)),
                    Contains("task.filler"));
  CHECK_THROWS_WITH(default_template("haystack"), Contains("task.kind") && Contains("niah_multiquery"));
}

TEST_CASE("ruler: the score is RULER's string_match_all, and a wrong value scores nothing", "[retrieval][ruler]") {
  const std::vector<std::string> four = {"1234567", "7654321", "1111111", "2222222"};
  CHECK(answer_score("1234567, 7654321, 1111111 and 2222222", four, "substring") == 1);
  CHECK(answer_score("The numbers are 1234567 and 7654321.", four, "substring") == 0.5);
  CHECK(answer_score("1234568 7654320", four, "substring") == 0);  // near misses are misses
  CHECK(answer_score("KMQOA and kmqob", {"KMQOA", "KMQOB"}, "substring") == 1);  // case-insensitive
  // RULER matches substrings: a longer number holding the answer is credited; whole words are not.
  CHECK(answer_score("91234567", {"1234567"}, "substring") == 1);
  CHECK(answer_score("91234567", {"1234567"}, "word") == 0);
  CHECK(answer_score("anything", {}, "substring") == 0);
}
