// Retrieval tasks (include/kvsim/model/retrieval.hpp): passkey and word, what every kind shares (needles
// placed in real filler, the scorers, the Wilson interval); the RULER suite's kinds are in ruler.cpp.
#include "kvsim/model/retrieval.hpp"

#include <algorithm>
#include <boost/random/uniform_int_distribution.hpp>
#include <cctype>
#include <cmath>

#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"
#include "retrieval_detail.hpp"

namespace kvsim {

namespace {

using retrieval_detail::kAssistant;
using retrieval_detail::kSystem;

// The word task's keys (places the TinyStories filler never names) and values (common nouns).
const std::vector<std::string> kKeys = {"Lisbon", "Oslo",   "Cairo",  "Lima",   "Dublin", "Vienna", "Prague", "Madrid",
                                        "Tokyo",  "Nairobi", "Quito", "Helsinki", "Athens", "Havana", "Manila", "Seoul",
                                        "Warsaw", "Zurich", "Sydney", "Bogota", "Lagos",  "Hanoi",  "Riga",   "Tunis"};
const std::vector<std::string> kValues = {
    "anchor", "violin", "candle", "rocket", "pepper", "mirror", "pillow", "magnet", "cactus", "lantern", "saddle", "kettle",
    "helmet", "walnut", "ladder", "trumpet", "compass", "blanket", "hammer", "pencil", "bucket", "carpet", "marble", "feather",
    "button", "barrel", "cannon", "teapot", "wallet", "zipper", "tunnel", "basket", "harbor", "glacier", "orchid", "parrot",
    "dolphin", "falcon", "lobster", "penguin", "giraffe", "beetle", "spider", "turtle", "walrus", "salmon", "hornet", "camel"};

/// True when the token's text ends a sentence or a line (where a needle may start).
bool ends_sentence(const Tokenizer& tok, int id) {
  const std::string p = tok.decode(-1, id);
  const size_t e = p.find_last_not_of(" ");
  return e != std::string::npos && (p[e] == '.' || p[e] == '!' || p[e] == '?' || p[e] == '\n');
}

uint64_t kind_tag(const std::string& kind) {
  return kind == "passkey" ? 0x9a55 : kind == "word" ? 0x30bd : retrieval_detail::name_tag(kind);
}

}  // namespace

namespace retrieval_detail {

uint64_t name_tag(const std::string& kind) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : kind) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::string fill(std::string s, const std::string& key, const std::string& value) {
  for (const auto& [name, v] : {std::pair<std::string, std::string>{"{key}", key}, {"{value}", value}})
    for (size_t at = s.find(name); at != std::string::npos; at = s.find(name, at + v.size())) s.replace(at, name.size(), v);
  return s;
}

void place_needles(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, std::vector<int> pre,
                   const std::vector<Needle>& needles, const std::vector<int>& question, Engine& rng, const std::string& lower,
                   TaskTrial& tr) {
  if (tok.add_bos()) pre.insert(pre.begin(), tok.bos_id());  // as the model's tokenizer opens a document (Gemma 3; not SmolLM2)
  size_t fixed = pre.size() + question.size();
  for (const auto& n : needles) fixed += n.tokens.size();
  const int64_t F = int64_t(spec.length) - int64_t(fixed);
  if (F < 16)
    throw Error("task.lengths: " + std::to_string(spec.length) + " tokens leave " + std::to_string(F) +
                " for the filler after the templates' " + std::to_string(fixed) + " (need ≥ 16)" +
                (lower.empty() ? "" : "; lower " + lower + " or raise the length"));
  if (int64_t(filler.size()) < F)
    throw Error("task.filler: the filler text has " + std::to_string(filler.size()) + " tokens; a " +
                std::to_string(spec.length) + "-token prompt needs " + std::to_string(F));
  tr.filler_offset = boost::random::uniform_int_distribution<int64_t>(0, int64_t(filler.size()) - F)(rng);
  const int* f = filler.data() + tr.filler_offset;
  // A needle's place: its share of the filler before it, moved back to the nearest sentence end within
  // 64 tokens (so it does not split a word); share 0 puts it first. The move keeps the targets' order.
  std::vector<std::pair<int64_t, size_t>> at;
  for (size_t i = 0; i < needles.size(); ++i) {
    int64_t a = std::llround(std::clamp(needles[i].target, 0.0, 1.0) * double(F));
    for (int64_t j = a; j > 0 && j > a - 64; --j)
      if (ends_sentence(tok, f[j - 1])) {
        a = j;
        break;
      }
    at.push_back({a, i});
  }
  std::sort(at.begin(), at.end());
  tr.tokens = pre;
  tr.needles.clear(), tr.evidence.clear();
  tr.depth = NAN;
  int64_t from = 0;
  for (const auto& [a, i] : at) {
    tr.tokens.insert(tr.tokens.end(), f + from, f + a);
    from = a;
    const Span sp{int(tr.tokens.size()), int(tr.tokens.size() + needles[i].tokens.size())};
    tr.tokens.insert(tr.tokens.end(), needles[i].tokens.begin(), needles[i].tokens.end());
    tr.needles.push_back(sp);
    if (needles[i].evidence) {
      if (tr.evidence.empty()) tr.depth = double(a) / double(F);
      tr.evidence.push_back(sp);
    }
  }
  tr.tokens.insert(tr.tokens.end(), f + from, f + F);
  tr.question_begin = int(tr.tokens.size());
  tr.tokens.insert(tr.tokens.end(), question.begin(), question.end());
  tr.needle_begin = tr.evidence.empty() ? -1 : tr.evidence[0].begin;
  tr.needle_end = tr.evidence.empty() ? -1 : tr.evidence[0].end;
}

void place_context(const TrialSpec& spec, const Tokenizer& tok, std::vector<int> pre, const std::vector<int>& context,
                   const std::vector<Span>& evidence, const std::vector<int>& question, TaskTrial& tr) {
  if (tok.add_bos()) pre.insert(pre.begin(), tok.bos_id());
  const int64_t pad = int64_t(spec.length) - int64_t(pre.size() + context.size() + question.size());
  if (pad < 0)
    throw Error("task.lengths: " + std::to_string(spec.length) + " tokens cannot hold the templates and the list (" +
                std::to_string(pre.size() + context.size() + question.size()) + ")");
  const auto nl = tok.encode("\n", false, false);
  tr.tokens = pre;
  tr.tokens.insert(tr.tokens.end(), context.begin(), context.end());
  for (int64_t i = 0; i < pad; ++i) tr.tokens.push_back(nl.empty() ? tok.eos_id() : nl[0]);  // blank lines up to L
  tr.question_begin = int(tr.tokens.size());
  tr.tokens.insert(tr.tokens.end(), question.begin(), question.end());
  tr.needles.clear(), tr.evidence.clear();
  for (const Span& e : evidence) tr.evidence.push_back({e.begin + int(pre.size()), e.end + int(pre.size())});
  tr.needle_begin = tr.evidence.empty() ? -1 : tr.evidence[0].begin;
  tr.needle_end = tr.evidence.empty() ? -1 : tr.evidence[0].end;
  tr.depth = NAN;
  tr.filler_offset = -1;
}

}  // namespace retrieval_detail

const std::vector<std::string>& task_kinds() {
  static const std::vector<std::string> kinds = {"passkey",         "word",           "niah_single",       "niah_multikey",
                                                 "niah_multivalue", "niah_multiquery", "variable_tracking", "common_words",
                                                 "frequent_words"};
  return kinds;
}

bool task_has_needles(const std::string& kind) { return kind != "common_words" && kind != "frequent_words"; }

TaskTemplate default_template(const std::string& kind, const TaskSettings& s) {
  if (kind == "passkey")
    return {std::string(kSystem) +
                "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
                "about it.\n\n",
            "\nThe pass key is {value}. Remember it. {value} is the pass key.\n",
            "\n\nWhat is the pass key? Answer with the 5-digit number." + std::string(kAssistant)};
  if (kind == "word")
    return {std::string(kSystem) +
                "A secret word is hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
                "about it.\n\n",
            "\nThe secret word for {key} is \"{value}\". Remember it.\n",
            "\n\nWhat is the secret word for {key}? Answer with the word." + std::string(kAssistant)};
  if (std::find(task_kinds().begin(), task_kinds().end(), kind) != task_kinds().end())
    return retrieval_detail::ruler_template(kind, s);
  std::string all;
  for (const auto& k : task_kinds()) all += (all.empty() ? "" : ", ") + k;
  throw Error("task.kind must be one of " + all + ", not '" + kind + "'");
}

std::vector<int> encode_template(const Tokenizer& tok, const std::string& text, const std::string& what) {
  std::vector<int> out;
  size_t from = 0;
  while (from < text.size()) {
    const size_t open = text.find("<|", from), close = open == std::string::npos ? open : text.find("|>", open + 2);
    const size_t end = close == std::string::npos ? text.size() : open;
    if (end > from) {
      const auto ids = tok.encode(text.substr(from, end - from), false, false);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (close == std::string::npos) break;
    const std::string marker = text.substr(open, close + 2 - open);
    const int id = tok.control_id(marker);
    if (id < 0) throw Error(what + ": '" + marker + "' is not a control token of the model's vocabulary");
    out.push_back(id);
    from = close + 2;
  }
  return out;
}

TaskTrial make_trial(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler) {
  if (!(spec.depth >= 0 && spec.depth <= 1)) throw Error("task.depths: " + std::to_string(spec.depth) + " is not in [0, 1]");
  Engine rng = make_engine({spec.seed, kind_tag(spec.kind), uint64_t(spec.length),
                            uint64_t(std::llround(spec.depth * 1e6)), uint64_t(spec.index)});
  TaskTrial tr;
  if (spec.kind != "passkey" && spec.kind != "word") {
    retrieval_detail::make_ruler_trial(spec, tok, filler, rng, tr);
    return tr;
  }
  using retrieval_detail::fill;
  if (spec.kind == "passkey") {
    tr.value = std::to_string(boost::random::uniform_int_distribution<int>(10000, 99999)(rng));
  } else {
    tr.key = kKeys[boost::random::uniform_int_distribution<size_t>(0, kKeys.size() - 1)(rng)];
    tr.value = kValues[boost::random::uniform_int_distribution<size_t>(0, kValues.size() - 1)(rng)];
  }
  tr.answers = {tr.value};
  const auto pre = encode_template(tok, retrieval_detail::fill(spec.templ.prefix, tr.key, tr.value), "task.prefix");
  const auto needle = encode_template(tok, retrieval_detail::fill(spec.templ.needle, tr.key, tr.value), "task.needle");
  const auto question = encode_template(tok, retrieval_detail::fill(spec.templ.question, tr.key, tr.value), "task.question");
  retrieval_detail::place_needles(spec, tok, filler, pre, {{needle, spec.depth, true}}, question, rng, "", tr);
  return tr;
}

double answer_score(const std::string& generated, const std::vector<std::string>& answers, const std::string& match) {
  if (answers.empty()) return 0;
  auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string g = lower(generated);
  int found = 0;
  for (const auto& a : answers)
    found += match == "word" ? answer_matches(generated, a) : (!a.empty() && g.find(lower(a)) != std::string::npos);
  return double(found) / double(answers.size());
}

bool answer_matches(const std::string& generated, const std::string& answer) {
  if (answer.empty()) return false;
  auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string g = lower(generated), a = lower(answer);
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  for (size_t at = g.find(a); at != std::string::npos; at = g.find(a, at + 1)) {
    const bool left = at == 0 || !word_char(g[at - 1]);
    const bool right = at + a.size() == g.size() || !word_char(g[at + a.size()]);
    if (left && right) return true;
  }
  return false;
}

std::string valid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t j = 1; ok && j < n; ++j) ok = (static_cast<unsigned char>(s[i + j]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the byte that starts no valid sequence
      ++i;
    }
  }
  return out;
}

std::string generated_text(const Tokenizer& tok, const std::vector<int>& ids, const std::vector<int>& stop) {
  std::string s;
  int prev = -1;
  for (int id : ids) {
    bool end = false;
    for (int st : stop) end |= id == st;
    if (end) break;
    s += tok.decode(prev, id);
    prev = id;
  }
  return valid_utf8(s);
}

std::pair<double, double> wilson_interval(int64_t k, int64_t n) {
  if (n <= 0) return {NAN, NAN};
  const double z = 1.959963984540054, p = double(k) / double(n), z2n = z * z / double(n);
  const double centre = (p + z2n / 2) / (1 + z2n);
  const double half = z / (1 + z2n) * std::sqrt(p * (1 - p) / double(n) + z2n / (4 * double(n)));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

}  // namespace kvsim
