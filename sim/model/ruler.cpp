// The RULER suite's task kinds for `kvsim task` (Hsieh et al. 2024, "RULER: What's the Real Context Size
// of Your Long-Context Language Models?", §3 and Appendix B), written from the paper's description and
// the defaults of its released generator (`synthetic.yaml`; templates and answer prefixes of
// `constants.py`), with real text as the haystack where RULER uses essays:
//   niah_single        one needle "One of the special magic numbers for {key} is: {value}.", asked back;
//   niah_multikey      that needle among `needles` − 1 distractors with other keys (one key asked);
//   niah_multivalue    one key with `needles` values, each in its own needle, all to be returned;
//   niah_multiquery    `needles` keys, all asked at once;
//   variable_tracking  a chain "VAR A = 12345", "VAR B = VAR A", … of hops + 1 names, all to be returned
//                      (RULER §3.2, multi-hop tracing), beside chains − 1 distractor chains;
//   common_words       a numbered list in which `common` words appear often, the rest rarely (§3.3, CWE);
//   frequent_words     coded words with Zipf(α) counts; the three most frequent after the noise "..."
//                      (§3.3, FWE).
// Keys are adjective-noun words (RULER's `words`), values 7-digit numbers, adjective-noun words or
// version-4 UUIDs. Every draw comes from the trial's engine (derive_seed of seed, kind, L, depth, index).
#include <algorithm>
#include <boost/math/special_functions/zeta.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "kvsim/core/error.hpp"
#include "retrieval_detail.hpp"

namespace kvsim::retrieval_detail {

namespace {

const std::vector<std::string> kAdjectives = {
    "amber",  "ancient", "bitter", "blazing", "brisk",  "bronze", "calm",   "clever", "coral",  "crimson", "curly",  "dusty",
    "eager",  "electric", "fancy", "fierce",  "frosty", "gentle", "giant",  "gloomy", "golden", "hollow",  "humble", "icy",
    "jolly",  "lavish",  "lively", "lucky",   "mellow", "misty",  "modern", "narrow", "noble",  "olive",   "patient", "plain",
    "polite", "proud",   "quiet",  "rapid",   "rusty",  "scarlet", "shiny", "silent", "silver", "sleepy",  "smoky",  "snowy",
    "solemn", "spicy",   "steady", "stormy",  "sturdy", "sunny",  "swift",  "tidy",   "velvet", "vivid",   "wild",   "witty",
    "wooden", "zesty",   "brave",  "dapper"};
const std::vector<std::string> kNouns = {
    "anchor",  "violin",  "candle",  "rocket",  "pepper",  "mirror", "pillow",  "magnet", "cactus",  "lantern", "saddle",
    "kettle",  "helmet",  "walnut",  "ladder",  "trumpet", "compass", "blanket", "hammer", "pencil", "bucket",  "carpet",
    "feather", "button",  "barrel",  "cannon",  "teapot",  "wallet", "zipper",  "tunnel", "basket",  "harbor",  "glacier",
    "orchid",  "parrot",  "dolphin", "falcon",  "lobster", "penguin", "giraffe", "beetle", "spider",  "turtle",  "walrus",
    "salmon",  "hornet",  "camel",   "meadow",  "canyon",  "volcano", "castle",  "engine", "window",  "ribbon",  "thimble",
    "whistle", "pretzel", "muffin",  "radish",  "quartz",  "tulip",   "banjo",   "goblet", "kayak"};

size_t draw(Engine& rng, size_t n) { return boost::random::uniform_int_distribution<size_t>(0, n - 1)(rng); }
double uniform01(Engine& rng) { return boost::random::uniform_real_distribution<double>(0, 1)(rng); }

/// Fisher–Yates with the trial's engine (std::shuffle's order is not fixed by the standard).
template <class T>
void shuffle(std::vector<T>& v, Engine& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[draw(rng, i)]);
}

std::string letters(Engine& rng, int n, char first) {
  std::string s;
  for (int i = 0; i < n; ++i) s += char(first + int(draw(rng, 26)));
  return s;
}

/// A value of RULER's types: a 7-digit number, an adjective-noun word, or 128 random bits as a
/// version-4 UUID (RFC 4122 §4.4: version nibble 4, variant bits 10).
std::string draw_value(const std::string& type, Engine& rng) {
  if (type == "number") return std::to_string(boost::random::uniform_int_distribution<int64_t>(1000000, 9999999)(rng));
  if (type == "word") return kAdjectives[draw(rng, kAdjectives.size())] + "-" + kNouns[draw(rng, kNouns.size())];
  uint64_t hi = rng(), lo = rng();
  hi = (hi & ~0xF000ULL) | 0x4000ULL;
  lo = (lo & ~(3ULL << 62)) | (2ULL << 62);
  char b[40];
  std::snprintf(b, sizeof b, "%08llx-%04llx-%04llx-%04llx-%012llx", (unsigned long long)(hi >> 32),
                (unsigned long long)((hi >> 16) & 0xFFFF), (unsigned long long)(hi & 0xFFFF), (unsigned long long)(lo >> 48),
                (unsigned long long)(lo & 0xFFFFFFFFFFFFULL));
  return b;
}

/// `n` draws of `next`, all distinct from each other and from `taken` (which receives them).
template <class F>
std::vector<std::string> distinct(int n, std::set<std::string>& taken, F next) {
  std::vector<std::string> out;
  while (int(out.size()) < n)
    if (std::string v = next(); taken.insert(v).second) out.push_back(v);
  return out;
}

/// RULER's list of asked keys: "A", or "A, B, and C".
std::string join_keys(const std::vector<std::string>& k) {
  std::string s;
  for (size_t i = 0; i + 1 < k.size(); ++i) s += k[i] + ", ";
  return k.size() > 1 ? s + "and " + k.back() : k.at(0);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void make_variable_tracking(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng,
                            TaskTrial& tr, int64_t example_filler = -1);
void make_common_words(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng,
                       TaskTrial& tr, int64_t example_words = -1);

/// RULER's solved example before variable_tracking's and common_words' task (Appendix B; its generator's
/// one in-context example): the same kind in plain text, drawn from `seed`, followed by its answer —
/// variable_tracking's names, with 128 filler tokens below L = 4096 and 384 from 4096 (RULER's example
/// is 500 tokens); common_words' numbered list of 20 words, 3 and 1 repeats, below 4096, and of 40
/// words, 10 and 3 repeats, from 4096 (RULER's).
std::vector<int> example_tokens(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, uint64_t seed) {
  TrialSpec ex = spec;
  const bool short_task = spec.length < 4096;
  ex.settings.format = "plain";
  ex.settings.examples = 0;
  ex.templ = ruler_template(spec.kind, ex.settings);
  ex.depth = 0.25;
  Engine rng(seed);
  TaskTrial t;
  if (spec.kind == "common_words") {
    ex.settings.common_repeats = short_task ? 3 : 10;
    ex.settings.uncommon_repeats = short_task ? 1 : 3;
    make_common_words(ex, tok, filler, rng, t, short_task ? 20 : 40);
  } else {
    make_variable_tracking(ex, tok, filler, rng, t, short_task ? 128 : 384);
  }
  if (tok.add_bos()) t.tokens.erase(t.tokens.begin());
  std::string answer;
  for (size_t i = 0; i < t.answers.size(); ++i)
    answer += spec.kind == "common_words" ? " " + std::to_string(i + 1) + ". " + t.answers[i] : " " + t.answers[i];
  const auto a = tok.encode(answer + "\n", false, false);
  t.tokens.insert(t.tokens.end(), a.begin(), a.end());
  return t.tokens;
}

/// The prefix template encoded, with `settings.examples` solved examples where it says `{example}`.
std::vector<int> encode_prefix(const TrialSpec& spec, const Tokenizer& tok, const std::string& text,
                               const std::vector<int>& filler, Engine& rng) {
  const size_t at = text.find("{example}");
  if (at == std::string::npos) return encode_template(tok, text, "task.prefix");
  std::vector<int> out = encode_template(tok, text.substr(0, at), "task.prefix");
  for (int i = 0; i < spec.settings.examples; ++i) {
    const auto ex = example_tokens(spec, tok, filler, rng());
    out.insert(out.end(), ex.begin(), ex.end());
  }
  const auto rest = encode_template(tok, text.substr(at + 9), "task.prefix");
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

void make_niah(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng, TaskTrial& tr) {
  const TaskSettings& s = spec.settings;
  const bool mk = spec.kind == "niah_multikey", mv = spec.kind == "niah_multivalue", mq = spec.kind == "niah_multiquery";
  const int n_keys = mk || mq ? s.needles : 1, n_values = mv ? s.needles : 1, asked = mq ? s.needles : 1;
  std::set<std::string> taken;
  const auto keys = distinct(n_keys, taken, [&] { return draw_value("word", rng); });
  std::vector<Needle> needles;
  std::vector<std::string> asked_keys(keys.begin(), keys.begin() + asked);
  for (int i = 0; i < n_keys; ++i)
    for (const auto& v : distinct(n_values, taken, [&] { return draw_value(s.value_type, rng); })) {
      needles.push_back({encode_template(tok, retrieval_detail::fill(spec.templ.needle, keys[size_t(i)], v), "task.needle"), 0, i < asked});
      if (i < asked) tr.answers.push_back(v);
    }
  // The first asked needle at the trial's depth, every other at a depth drawn uniformly (RULER draws all).
  needles[0].target = spec.depth;
  for (size_t i = 1; i < needles.size(); ++i) needles[i].target = uniform01(rng);
  tr.key = join_keys(asked_keys);
  tr.value = join(tr.answers);
  const auto pre = encode_template(tok, retrieval_detail::fill(spec.templ.prefix, tr.key, ""), "task.prefix");
  const auto question = encode_template(tok, retrieval_detail::fill(spec.templ.question, tr.key, ""), "task.question");
  place_needles(spec, tok, filler, pre, needles, question, rng, mk || mv || mq ? "task.needles" : "", tr);
}

/// `example_filler` ≥ 0: a prompt of that many filler tokens instead of spec.length (example_tokens).
void make_variable_tracking(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng,
                            TaskTrial& tr, int64_t example_filler) {
  const TaskSettings& s = spec.settings;
  std::set<std::string> taken;
  const auto names = distinct((s.hops + 1) * s.chains, taken, [&] { return letters(rng, 5, 'A'); });
  std::set<std::string> taken_values;
  const auto values = distinct(s.chains, taken_values, [&] {
    return std::to_string(boost::random::uniform_int_distribution<int>(10000, 99999)(rng));
  });
  std::vector<Needle> needles;
  for (int c = 0; c < s.chains; ++c) {
    // The asked chain starts at the trial's depth and its later links follow at depths drawn from
    // [depth, 1]; another chain's links at depths drawn from [0, 1]. Links stay in the chain's order.
    const double lo = c == 0 ? spec.depth : 0;
    std::vector<double> at = {c == 0 ? spec.depth : lo + (1 - lo) * uniform01(rng)};
    for (int j = 0; j < s.hops; ++j) at.push_back(lo + (1 - lo) * uniform01(rng));
    std::sort(at.begin() + (c == 0 ? 1 : 0), at.end());
    for (int j = 0; j <= s.hops; ++j) {
      const std::string& name = names[size_t(c * (s.hops + 1) + j)];
      const std::string value = j == 0 ? values[size_t(c)] : "VAR " + names[size_t(c * (s.hops + 1) + j - 1)];
      needles.push_back({encode_template(tok, retrieval_detail::fill(spec.templ.needle, name, value), "task.needle"), at[size_t(j)], c == 0});
      if (c == 0) tr.answers.push_back(name);
    }
  }
  tr.value = join(tr.answers);
  const auto pre = encode_prefix(spec, tok, retrieval_detail::fill(spec.templ.prefix, "", values[0]), filler, rng);
  const auto question = encode_template(tok, retrieval_detail::fill(spec.templ.question, "", values[0]), "task.question");
  TrialSpec fit = spec;
  if (example_filler >= 0) {
    fit.length = int(example_filler + int64_t(pre.size() + question.size()) + (tok.add_bos() ? 1 : 0));
    for (const auto& n : needles) fit.length += int(n.tokens.size());
  }
  place_needles(fit, tok, filler, pre, needles, question, rng, "task.hops or task.chains", tr);
  tr.key = values[0];
}

/// The words of the filler text for common_words' lists: runs of 4+ ASCII letters, lower-cased, without
/// the text's 50 most frequent words (its function words), in alphabetical order.
std::vector<std::string> word_pool(const Tokenizer& tok, const std::vector<int>& filler) {
  std::string text;
  for (size_t i = 0; i < filler.size(); ++i) text += tok.decode(i ? filler[i - 1] : -1, filler[i]);
  std::map<std::string, int64_t> count;
  std::string w;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    if (std::isalpha(static_cast<unsigned char>(c)) && static_cast<unsigned char>(c) < 0x80) w += char(std::tolower(c));
    else if (!w.empty()) ++count[w], w.clear();
  }
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [word, n] : count) by_count.push_back({-n, word});
  std::sort(by_count.begin(), by_count.end());
  std::vector<std::string> pool;
  for (size_t i = 50; i < by_count.size(); ++i)
    if (by_count[i].second.size() >= 4) pool.push_back(by_count[i].second);
  std::sort(pool.begin(), pool.end());
  return pool;
}

/// Tokens of a word list, each word encoded as " word" and, in a numbered list, each number as "N."
/// (" N." after the first), as every part of a prompt is encoded apart; `spans` gets each word's tokens.
struct ListTokens {
  const Tokenizer& tok;
  std::map<std::string, std::vector<int>> cache;
  const std::vector<int>& enc(const std::string& s) {
    auto it = cache.find(s);
    return it != cache.end() ? it->second : cache.emplace(s, tok.encode(s, false, false)).first->second;
  }
  std::vector<int> build(const std::vector<std::string>& words, bool numbered, std::vector<Span>* spans) {
    std::vector<int> out;
    for (size_t i = 0; i < words.size(); ++i) {
      if (numbered) {
        const auto& n = enc((i ? " " : "") + std::to_string(i + 1) + ".");
        out.insert(out.end(), n.begin(), n.end());
      }
      const auto& t = enc(" " + words[i]);
      if (spans) spans->push_back({int(out.size()), int(out.size() + t.size())});
      out.insert(out.end(), t.begin(), t.end());
    }
    return out;
  }
};

/// The largest n in [lo, hi] with fits(n) (fits is monotone: true up to some n); lo − 1 when none.
template <class F>
int64_t largest_fitting(int64_t lo, int64_t hi, F fits) {
  int64_t best = lo - 1;
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) best = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  return best;
}

/// `example_words` > 0: a list of that many distinct words, the prompt as long as it comes out (example_tokens).
void make_common_words(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng,
                       TaskTrial& tr, int64_t example_words) {
  const TaskSettings& s = spec.settings;
  const int cr = s.common_repeats ? s.common_repeats : spec.length < 4096 ? 6 : 30;
  const int ur = s.uncommon_repeats ? s.uncommon_repeats : spec.length < 4096 ? 1 : 3;
  std::vector<std::string> pool = word_pool(tok, filler);
  if (int(pool.size()) < s.common + 1)
    throw Error("task.filler: its text has " + std::to_string(pool.size()) + " usable words; common_words needs more than task.common");
  shuffle(pool, rng);
  const uint64_t order_seed = rng();
  auto items = [&](int64_t n) {  // the list of n distinct words: the first `common` ones cr times, the rest ur times
    std::vector<std::string> v;
    for (int64_t i = 0; i < n; ++i) v.insert(v.end(), size_t(i < s.common ? cr : ur), pool[size_t(i)]);
    Engine r(order_seed);
    shuffle(v, r);
    return v;
  };
  ListTokens lt{tok, {}};
  const auto pre = encode_prefix(spec, tok, spec.templ.prefix, filler, rng);
  const auto question = encode_template(tok, spec.templ.question, "task.question");
  const int64_t room = int64_t(spec.length) - int64_t(pre.size() + question.size() + (tok.add_bos() ? 1 : 0));
  const int64_t n = example_words > 0 ? std::min<int64_t>(example_words, int64_t(pool.size()))
                                     : largest_fitting(s.common, int64_t(pool.size()), [&](int64_t k) {
                                         return int64_t(lt.build(items(k), true, nullptr).size()) <= room;
                                       });
  if (n < s.common)
    throw Error("task.lengths: " + std::to_string(spec.length) + " tokens cannot hold " + std::to_string(s.common) +
                " common words × " + std::to_string(cr) + " repeats; lower task.common or task.common_repeats");
  if (n == int64_t(pool.size()) && example_words <= 0)
    throw Error("task.filler: its text's " + std::to_string(pool.size()) + " usable words do not fill a " +
                std::to_string(spec.length) + "-token common_words list");
  const auto list = items(n);
  std::vector<Span> spans, evidence;
  const auto context = lt.build(list, true, &spans);
  const std::set<std::string> common(pool.begin(), pool.begin() + s.common);
  for (size_t i = 0; i < list.size(); ++i)
    if (common.count(list[i])) evidence.push_back(spans[i]);
  tr.answers.assign(pool.begin(), pool.begin() + s.common);
  tr.value = join(tr.answers);
  TrialSpec fit = spec;
  if (example_words > 0) fit.length = int(pre.size() + context.size() + question.size()) + (tok.add_bos() ? 1 : 0);
  place_context(fit, tok, pre, context, evidence, question, tr);
}

void make_frequent_words(const TrialSpec& spec, const Tokenizer& tok, Engine& rng, TaskTrial& tr) {
  const TaskSettings& s = spec.settings;
  const int V = s.vocab ? s.vocab : spec.length / 50;
  if (V < 5) throw Error("task.vocab: frequent_words needs ≥ 5 coded words, not " + std::to_string(V) + " (L / 50 by default)");
  std::set<std::string> taken = {"..."};
  std::vector<std::string> vocab = {"..."};  // rank 1 is noise, as RULER's vocab[0] = '...'
  for (const auto& w : distinct(V - 1, taken, [&] { return letters(rng, 6, 'a'); })) vocab.push_back(w);
  const double zeta = boost::math::zeta(s.alpha);
  auto counts = [&](int64_t n) {  // RULER: int(n · k^−α / ζ(α)) copies of the rank-k word
    std::vector<int64_t> c;
    for (int k = 1; k <= V; ++k) c.push_back(int64_t(double(n) * std::pow(double(k), -s.alpha) / zeta));
    return c;
  };
  const uint64_t order_seed = rng();
  auto words = [&](int64_t n) {
    std::vector<std::string> v;
    const auto c = counts(n);
    for (int k = 0; k < V; ++k) v.insert(v.end(), size_t(c[size_t(k)]), vocab[size_t(k)]);
    Engine r(order_seed);
    shuffle(v, r);
    return v;
  };
  ListTokens lt{tok, {}};
  const auto pre = encode_template(tok, spec.templ.prefix, "task.prefix");
  const auto question = encode_template(tok, spec.templ.question, "task.question");
  const int64_t room = int64_t(spec.length) - int64_t(pre.size() + question.size() + (tok.add_bos() ? 1 : 0));
  const int64_t n = largest_fitting(1, 4 * std::max<int64_t>(room, 1) + 64,
                                    [&](int64_t k) { return int64_t(lt.build(words(k), false, nullptr).size()) <= room; });
  const auto c = counts(std::max<int64_t>(n, 0));
  if (n < 1 || !(c[1] > c[2] && c[2] > c[3] && c[3] > c[4]))
    throw Error("task.lengths: " + std::to_string(spec.length) +
                " tokens are too few for frequent_words' ranks 2-5 to differ; lower task.alpha or raise the length");
  // The tokens a larger n would overshoot are noise words "...", put at drawn places (rank 1 grows a
  // little); what is left below one "..." is padded with blank lines (place_context).
  auto list = words(n);
  Engine r(order_seed + 1);
  for (int64_t gap = room - int64_t(lt.build(list, false, nullptr).size()), t = int64_t(lt.enc(" ...").size()); gap >= t; gap -= t)
    list.insert(list.begin() + int64_t(draw(r, list.size() + 1)), "...");
  std::vector<Span> spans, evidence;
  const auto context = lt.build(list, false, &spans);
  tr.answers = {vocab[1], vocab[2], vocab[3]};
  for (size_t i = 0; i < list.size(); ++i)
    if (std::find(tr.answers.begin(), tr.answers.end(), list[i]) != tr.answers.end()) evidence.push_back(spans[i]);
  tr.value = join(tr.answers);
  place_context(spec, tok, pre, context, evidence, question, tr);
}

}  // namespace

TaskTemplate ruler_template(const std::string& kind, const TaskSettings& s) {
  const bool chat = s.format == "chatml";
  const std::string open = chat ? kSystem : "", close = chat ? std::string(kAssistant) : std::string(" ");
  if (kind.rfind("niah_", 0) == 0) {
    const std::string types = s.value_type + "s", type = s.value_type;
    const bool one = kind == "niah_single" || kind == "niah_multikey";  // RULER's singular wording: one value asked
    const std::string what = one ? type : types;
    return {open + (one ? "A special magic " + type + " is" : "Some special magic " + types + " are") +
                " hidden within the following text. Make sure to memorize it. I will quiz you about the " + what +
                " afterwards.\n",
            " One of the special magic " + types + " for {key} is: {value}.",
            "\n" + std::string(one ? "What is the special magic " : "What are all the special magic ") + what +
                " for {key} mentioned in the provided text?" + close + "The special magic " + what +
                " for {key} mentioned in the provided text " + (one ? "is" : "are")};
  }
  if (kind == "variable_tracking")
    return {open + "{example}Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n", " VAR {key} = {value}.",
            "\nQuestion: Find all variables that are assigned the value {value} in the text above." + close +
                "Answer: According to the chain(s) of variable assignment in the text above, " + std::to_string(s.hops + 1) +
                " variables are assigned the value {value}, they are:"};
  if (kind == "common_words")
    return {open + "{example}Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
                   "that appear most often.\n",
            "",
            "\nQuestion: What are the " + std::to_string(s.common) + " most common words in the above list?" + close +
                "Answer: The top " + std::to_string(s.common) + " words that appear most often in the list are:"};
  if (kind == "frequent_words")
    return {open + "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
                   "appeared coded words.",
            "",
            "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently "
            "appeared words in the above coded text?" +
                close + "Answer: According to the coded text above, the three most frequently appeared words are:"};
  throw Error("task.kind: no RULER template for '" + kind + "'");
}

void make_ruler_trial(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng, TaskTrial& tr) {
  if (spec.kind.rfind("niah_", 0) == 0) make_niah(spec, tok, filler, rng, tr);
  else if (spec.kind == "variable_tracking") make_variable_tracking(spec, tok, filler, rng, tr);
  else if (spec.kind == "common_words") make_common_words(spec, tok, filler, rng, tr);
  else if (spec.kind == "frequent_words") make_frequent_words(spec, tok, rng, tr);
  else throw Error("task.kind: '" + spec.kind + "' is not a RULER kind");
}

}  // namespace kvsim::retrieval_detail
