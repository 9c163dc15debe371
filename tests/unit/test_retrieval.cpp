// Retrieval tasks (include/kvsim/model/retrieval.hpp, docs/tasks.md): the trial generator (lengths,
// depths, seeds), the exact-match scorer, the Wilson interval, and the needle metrics of the replay
// engine (include/kvsim/replay/metrics.hpp) with a negative control. Self-contained: the tokenizer is
// a byte-level llama2.c vocabulary written here (token = byte + 3).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>

#include "byte_tokenizer.hpp"
#include "helpers.hpp"
#include "kvsim/io/spec.hpp"
#include "kvsim/model/retrieval.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;
using test::byte_tokenizer;
using test::text_of;

namespace {

const std::string kFiller =
    "Once upon a time there was a little dog. He liked to run in the park! Did he ever stop? No.\n"
    "The sun was warm and the grass was green. A bird sang a song for the dog and the dog was happy. ";

/// kFiller 40 times, as tokens.
std::vector<int> long_filler(const Tokenizer& tok) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += kFiller;
  return tok.encode(text, false, false);
}

TaskTemplate plain_template() { return {"Find the key.\n", "\nThe pass key is {value}. {value} is the key.\n", "\nWhat is the key?\n"}; }

}  // namespace

TEST_CASE("retrieval: a trial is exactly L tokens with the needle at its depth, after a sentence end", "[retrieval]") {
  test::TempDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  const std::vector<int> filler = long_filler(tok);
  for (int L : {160, 400, 1000})
    for (double depth : {0.0, 0.1, 0.5, 0.9, 1.0}) {
      INFO("L = " << L << ", depth " << depth);
      const TaskTrial tr = make_trial(TrialSpec{"passkey", plain_template(), L, depth, 3, 11}, tok, filler);
      REQUIRE(tr.tokens.size() == size_t(L));
      CHECK(tr.value.size() == 5);
      CHECK(tr.value.find_first_not_of("0123456789") == std::string::npos);
      CHECK(text_of(tok, tr.tokens, tr.needle_begin, tr.needle_end) == "\nThe pass key is " + tr.value + ". " + tr.value + " is the key.\n");
      CHECK(text_of(tok, tr.tokens, tr.question_begin, L) == "\nWhat is the key?\n");
      // This llama2.c-style vocabulary adds BOS to a document (Tokenizer::add_bos), so the prompt opens with it.
      REQUIRE(tok.add_bos());
      CHECK(tr.tokens[0] == tok.bos_id());
      CHECK(std::count(tr.tokens.begin(), tr.tokens.end(), tok.bos_id()) == 1);
      CHECK(text_of(tok, tr.tokens, 1, 15) == "Find the key.\n");
      const int prefix = 1 + 14, F = L - prefix - (tr.needle_end - tr.needle_begin) - (L - tr.question_begin);
      const int at = tr.needle_begin - prefix;  // filler tokens before the needle
      CHECK(tr.depth == Approx(double(at) / F));
      CHECK(at <= std::lround(depth * F));
      CHECK(at > std::lround(depth * F) - 64);
      if (at > 0) CHECK(std::string(".!?\n").find(char(tr.tokens[size_t(tr.needle_begin - 1)] - 3)) != std::string::npos);
      // The filler around the needle is one contiguous slice of the text's tokens.
      std::vector<int> slice(tr.tokens.begin() + prefix, tr.tokens.begin() + tr.needle_begin);
      slice.insert(slice.end(), tr.tokens.begin() + tr.needle_end, tr.tokens.begin() + tr.question_begin);
      CHECK(std::equal(slice.begin(), slice.end(), filler.begin() + tr.filler_offset));
    }
}

TEST_CASE("retrieval: trials are seeded: the same spec repeats, other indices and seeds differ", "[retrieval]") {
  test::TempDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  const std::vector<int> filler = long_filler(tok);
  const TrialSpec spec{"word", default_template("word"), 600, 0.5, 0, 5};
  // The default template's chat markers are no control tokens of a byte vocabulary: refused by name.
  CHECK_THROWS_WITH(make_trial(spec, tok, filler), Contains("task.prefix") && Contains("'<|im_start|>' is not a control token"));
  TrialSpec plain = spec;
  plain.templ = {"Remember.\n", "\nThe secret word for {key} is \"{value}\".\n", "\nWhat is the secret word for {key}?\n"};
  const TaskTrial a = make_trial(plain, tok, filler), b = make_trial(plain, tok, filler);
  CHECK(a.tokens == b.tokens);
  CHECK(!a.key.empty());
  CHECK(text_of(tok, a.tokens, a.question_begin, 600).find(a.key) != std::string::npos);
  std::set<std::string> values;
  std::set<int64_t> offsets;
  for (int i = 0; i < 12; ++i) {
    TrialSpec s = plain;
    s.index = i;
    const TaskTrial t = make_trial(s, tok, filler);
    values.insert(t.key + "/" + t.value);
    offsets.insert(t.filler_offset);
  }
  CHECK(values.size() >= 8);
  CHECK(offsets.size() >= 10);
  plain.seed = 6;
  CHECK(make_trial(plain, tok, filler).tokens != a.tokens);
}

TEST_CASE("retrieval: prompts that do not fit are refused by key", "[retrieval]") {
  test::TempDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  const std::vector<int> filler = tok.encode(kFiller, false, false);
  CHECK_THROWS_WITH(make_trial(TrialSpec{"passkey", plain_template(), 60, 0.5, 0, 1}, tok, filler), Contains("task.lengths: 60 tokens"));
  CHECK_THROWS_WITH(make_trial(TrialSpec{"passkey", plain_template(), 2000, 0.5, 0, 1}, tok, filler), Contains("task.filler"));
  CHECK_THROWS_WITH(make_trial(TrialSpec{"passkey", plain_template(), 400, 1.5, 0, 1}, tok, filler), Contains("task.depths"));
  CHECK_THROWS_WITH(default_template("haystack"), Contains("task.kind"));
}

TEST_CASE("retrieval: the answer must appear as a whole word", "[retrieval]") {
  CHECK(answer_matches("The pass key is 27611.", "27611"));
  CHECK(answer_matches("27611", "27611"));
  CHECK(answer_matches("The secret word for Oslo is \"Anchor\".", "anchor"));
  CHECK_FALSE(answer_matches("The pass key is 127611.", "27611"));
  CHECK_FALSE(answer_matches("The pass key is 27612.", "27611"));
  CHECK_FALSE(answer_matches("anchors aweigh", "anchor"));
  CHECK_FALSE(answer_matches("The pass key is 2761", "27611"));
  CHECK_FALSE(answer_matches("anything", ""));
}

TEST_CASE("retrieval: generated text is valid UTF-8", "[retrieval]") {
  CHECK(valid_utf8("is \"anchor\" (\xC3\xA9)") == "is \"anchor\" (\xC3\xA9)");  // é kept
  CHECK(valid_utf8("is \"tej\" (\xD8") == "is \"tej\" (\xEF\xBF\xBD");          // cut inside a character
  CHECK(valid_utf8("\xFF\x80" "a") == "\xEF\xBF\xBD\xEF\xBF\xBD" "a");
  CHECK(valid_utf8("\xE2\x82\xAC") == "\xE2\x82\xAC");                        // €
}

TEST_CASE("retrieval: Wilson score intervals", "[retrieval]") {
  // Textbook values (Newcombe 1998, Table I: 0/10, 5/10 and 81/263).
  auto [lo0, hi0] = wilson_interval(0, 10);
  CHECK(lo0 == 0);
  CHECK(hi0 == Approx(0.2775).margin(1e-4));
  auto [lo5, hi5] = wilson_interval(5, 10);
  CHECK(lo5 == Approx(0.2366).margin(1e-4));
  CHECK(hi5 == Approx(0.7634).margin(1e-4));
  auto [lo81, hi81] = wilson_interval(81, 263);
  CHECK(lo81 == Approx(0.2553).margin(1e-4));
  CHECK(hi81 == Approx(0.3662).margin(1e-4));
  CHECK(std::isnan(wilson_interval(0, 0).first));
}

TEST_CASE("retrieval: needle metrics see the needle in a cache that keeps it, none in one that evicts it", "[retrieval]") {
  Experiment ex;
  ex.data.synthetic = true;
  ex.data.synth = test::small_synth("gaussian", 96, 8, 1, 2, 1);
  ex.eval.from = 80;
  ex.eval.needle_spans = {{10, 20}};
  Params w;
  w.set("budget", int64_t(32));
  ex.policies = {PolicySpec{"exact", "exact", Params{}}, PolicySpec{"window", "window", w}};
  auto src = open_source(ex.data);
  const RunResult r = run_experiment(ex, *src, 1);
  REQUIRE(!r.policies[0].rows.empty());
  for (size_t i = 0; i < r.policies[0].rows.size(); ++i) {
    const MetricRow &e = r.policies[0].rows[i], &win = r.policies[1].rows[i];
    const double nm = metric_of(e, "needle_mass");
    CHECK(nm > 0);
    CHECK(nm < 1);
    CHECK(metric_of(e, "needle_kept_mass") == Approx(nm).epsilon(1e-12));
    CHECK(metric_of(e, "needle_kept") == 1);
    CHECK(metric_of(win, "needle_mass") == nm);  // a property of the data
    CHECK(metric_of(win, "needle_kept_mass") == 0);
    CHECK(metric_of(win, "needle_kept") == 0);
  }
  // Without a needle the metrics are not reported.
  ex.eval.needle_spans.clear();
  const RunResult none = run_experiment(ex, *src, 1);
  for (const auto& m : none.metrics) CHECK(std::string(m.name).rfind("needle", 0) != 0);
}
