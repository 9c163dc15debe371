#include "kvsim/model/retrieval.hpp"

#include <boost/random/uniform_int_distribution.hpp>
#include <cctype>
#include <cmath>

#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"

namespace kvsim {

namespace {

// SmolLM2-Instruct's chat format (its GGUF's tokenizer.chat_template): a system turn, the user's turn
// holding the instruction, the filler with the needle and the question, then the assistant's turn.
constexpr const char* kSystem =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n";
constexpr const char* kAssistant = "<|im_end|>\n<|im_start|>assistant\n";

// The word task's keys (places the TinyStories filler never names) and values (common nouns).
const std::vector<std::string> kKeys = {"Lisbon", "Oslo",   "Cairo",  "Lima",   "Dublin", "Vienna", "Prague", "Madrid",
                                        "Tokyo",  "Nairobi", "Quito", "Helsinki", "Athens", "Havana", "Manila", "Seoul",
                                        "Warsaw", "Zurich", "Sydney", "Bogota", "Lagos",  "Hanoi",  "Riga",   "Tunis"};
const std::vector<std::string> kValues = {
    "anchor", "violin", "candle", "rocket", "pepper", "mirror", "pillow", "magnet", "cactus", "lantern", "saddle", "kettle",
    "helmet", "walnut", "ladder", "trumpet", "compass", "blanket", "hammer", "pencil", "bucket", "carpet", "marble", "feather",
    "button", "barrel", "cannon", "teapot", "wallet", "zipper", "tunnel", "basket", "harbor", "glacier", "orchid", "parrot",
    "dolphin", "falcon", "lobster", "penguin", "giraffe", "beetle", "spider", "turtle", "walrus", "salmon", "hornet", "camel"};

std::string fill(std::string s, const std::string& key, const std::string& value) {
  for (const auto& [name, v] : {std::pair<std::string, std::string>{"{key}", key}, {"{value}", value}})
    for (size_t at = s.find(name); at != std::string::npos; at = s.find(name, at + v.size())) s.replace(at, name.size(), v);
  return s;
}

/// True when the token's text ends a sentence or a line (where a needle may start).
bool ends_sentence(const Tokenizer& tok, int id) {
  const std::string p = tok.decode(-1, id);
  const size_t e = p.find_last_not_of(" ");
  return e != std::string::npos && (p[e] == '.' || p[e] == '!' || p[e] == '?' || p[e] == '\n');
}

uint64_t kind_tag(const std::string& kind) { return kind == "passkey" ? 0x9a55 : 0x30bd; }

}  // namespace

TaskTemplate default_template(const std::string& kind) {
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
  throw Error("task.kind must be \"passkey\" or \"word\", not '" + kind + "'");
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
  if (spec.kind == "passkey") {
    tr.value = std::to_string(boost::random::uniform_int_distribution<int>(10000, 99999)(rng));
  } else {
    tr.key = kKeys[boost::random::uniform_int_distribution<size_t>(0, kKeys.size() - 1)(rng)];
    tr.value = kValues[boost::random::uniform_int_distribution<size_t>(0, kValues.size() - 1)(rng)];
  }
  auto pre = encode_template(tok, fill(spec.templ.prefix, tr.key, tr.value), "task.prefix");
  if (tok.add_bos()) pre.insert(pre.begin(), tok.bos_id());  // as the model's tokenizer opens a document (Gemma 3; not SmolLM2)
  const auto needle = encode_template(tok, fill(spec.templ.needle, tr.key, tr.value), "task.needle");
  const auto question = encode_template(tok, fill(spec.templ.question, tr.key, tr.value), "task.question");
  const int64_t F = int64_t(spec.length) - int64_t(pre.size() + needle.size() + question.size());
  if (F < 16)
    throw Error("task.lengths: " + std::to_string(spec.length) + " tokens leave " + std::to_string(F) +
                " for the filler after the templates' " + std::to_string(pre.size() + needle.size() + question.size()) +
                " (need ≥ 16)");
  if (int64_t(filler.size()) < F)
    throw Error("task.filler: the filler text has " + std::to_string(filler.size()) + " tokens; a " +
                std::to_string(spec.length) + "-token prompt needs " + std::to_string(F));
  tr.filler_offset = boost::random::uniform_int_distribution<int64_t>(0, int64_t(filler.size()) - F)(rng);
  const int* f = filler.data() + tr.filler_offset;
  // Depth: the share of the filler before the needle, moved back to the nearest sentence end within
  // 64 tokens (so the needle does not split a word); depth 0 puts it first.
  int64_t at = std::llround(spec.depth * double(F));
  for (int64_t j = at; j > 0 && j > at - 64; --j)
    if (ends_sentence(tok, f[j - 1])) {
      at = j;
      break;
    }
  tr.tokens = pre;
  tr.tokens.insert(tr.tokens.end(), f, f + at);
  tr.needle_begin = int(tr.tokens.size());
  tr.tokens.insert(tr.tokens.end(), needle.begin(), needle.end());
  tr.needle_end = int(tr.tokens.size());
  tr.tokens.insert(tr.tokens.end(), f + at, f + F);
  tr.question_begin = int(tr.tokens.size());
  tr.tokens.insert(tr.tokens.end(), question.begin(), question.end());
  tr.depth = double(at) / double(F);
  return tr;
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
