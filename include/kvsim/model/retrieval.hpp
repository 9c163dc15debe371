// kvsim: retrieval tasks for the closed loop (`kvsim task`, docs/tasks.md) — the prompts the field
// judges cache policies by, generated from real text with a seeded needle:
//   passkey  a random 5-digit key hidden in filler (Mohtashami & Jaggi 2023, "Landmark Attention",
//            §4.2's pass-key retrieval; the evaluation of StreamingLLM, H2O's successors and kvpress);
//   word     a key–value sentence ("The secret word for Lisbon is "anchor".") hidden in prose and
//            asked back (the single-needle task of RULER, Hsieh et al. 2024, §3.1, with words as values).
// A trial's prompt is exactly L tokens: [BOS] · prefix · filler[0, at) · needle · filler[at, F) · question
// (BOS where the tokenizer adds one to a document, Tokenizer::add_bos: Gemma 3, not SmolLM2), the
// filler a contiguous slice of a real text's tokens at a seeded offset, the needle placed at depth d
// (the share of the filler before it, snapped back to the end of a sentence). The templates are text
// with `{key}` and `{value}` placeholders; chat markers such as `<|im_start|>` that name a control
// token of the vocabulary are encoded as that token (as Hugging Face tokenizers do with special tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/model/tokenizer.hpp"

namespace kvsim {

/// The prompt templates of one task kind (docs/tasks.md lists the defaults). Placeholders: `{key}` (in
/// a needle, its key; in the question, the asked key or keys, "A, B, and C"), `{value}` (in a needle,
/// its value; in variable_tracking's question, the chain's number).
struct TaskTemplate {
  std::string prefix;    ///< before the filler (system turn, the user's instruction)
  std::string needle;    ///< the hidden sentence; `{value}` is the answer, `{key}` what the question names
  std::string question;  ///< after the filler: the question, the assistant turn's opening, RULER's answer prefix
};

/// Every `kvsim task` kind: "passkey", "word" (the two single needles kvsim started with) and the RULER
/// suite (Hsieh et al. 2024, §3 and Appendix B): "niah_single", "niah_multikey", "niah_multivalue",
/// "niah_multiquery", "variable_tracking", "common_words", "frequent_words".
const std::vector<std::string>& task_kinds();

/// True for kinds that hide needles in the filler (all but common_words and frequent_words).
bool task_has_needles(const std::string& kind);

/// What a kind draws beyond its template; the defaults are RULER's (Appendix B, `synthetic.yaml`).
/// A key that does not apply to the kind is refused by the config (docs/tasks.md).
struct TaskSettings {
  std::string value_type = "number";  ///< niah_*: "number" (7 digits), "word" (adjective-noun), "uuid"
  int needles = 4;             ///< multikey: keys hidden (one asked); multivalue: values of the key; multiquery: keys asked
  int hops = 4;                ///< variable_tracking: assignments after the first (hops + 1 names to return)
  int chains = 1;              ///< variable_tracking: chains hidden (the first one asked)
  int common = 10;             ///< common_words: words repeated often (all asked)
  int common_repeats = 0;      ///< common_words: repeats of a common word (0 = RULER's: 6 below L = 4096, else 30)
  int uncommon_repeats = 0;    ///< common_words: repeats of the others (0 = RULER's: 1 below 4096, else 3)
  double alpha = 2.0;          ///< frequent_words: Zipf exponent of the coded words' counts
  int vocab = 0;               ///< frequent_words: coded words (0 = RULER's L / 50)
  /// variable_tracking, common_words: solved examples before the task (RULER's one; `{example}` in the prefix)
  int examples = 1;
  std::string format = "chatml";  ///< "chatml" (SmolLM2-Instruct's turns) or "plain" (a base model's text)
  std::string match = "substring";  ///< "substring" (RULER's string_match_all) or "word" (whole words)
};

/// The default template of `kind` in `s.format` (SmolLM2-Instruct's chat turns, or plain text for a base
/// model). passkey and word keep kvsim's templates (chat format only); the suite's are RULER's
/// (`scripts/data/synthetic/constants.py`: instruction, question and answer prefix). Throws
/// kvsim::Error naming task.kind for an unknown kind.
TaskTemplate default_template(const std::string& kind, const TaskSettings& s = {});

/// What makes a trial: the task kind and template, prompt length L, depth d ∈ [0, 1], trial index.
struct TrialSpec {
  std::string kind = "passkey";
  TaskTemplate templ;
  int length = 1024;
  double depth = 0.5;
  int index = 0;
  uint64_t seed = 1;
  TaskSettings settings = {};
};

/// Tokens [begin, end) of a prompt.
struct Span {
  int begin = 0, end = 0;
};

/// One generated trial. Positions are 0-based token indices of `tokens`.
struct TaskTrial {
  std::vector<int> tokens;  ///< the prompt, exactly `length` tokens
  std::vector<Span> needles;   ///< every hidden sentence in prompt order: the asked ones and the distractors
  /// The tokens that hold the answer, ascending: the asked needles (variable_tracking: the asked chain's
  /// assignments; common_words / frequent_words: every occurrence of an answer word). The needle metrics
  /// and the evict_needle control use these.
  std::vector<Span> evidence;
  int needle_begin = 0, needle_end = 0;  ///< the first evidence span [begin, end) (−1, −1 when none)
  int question_begin = 0;   ///< first token of the question: the context is [0, question_begin)
  double depth = 0;         ///< the first evidence needle's depth: filler tokens before it / filler tokens (NaN: no needle)
  int64_t filler_offset = 0;  ///< the filler slice's first token in the filler text's token stream (−1: no filler)
  std::string key;          ///< what the question names ("" for passkey and the aggregation kinds)
  std::string value;        ///< the answers, joined by ", "
  std::vector<std::string> answers;  ///< every string the answer must hold (RULER's references)
};

/// `text` encoded with `tok` (no BOS), each `<|name|>` marker that is a control token of the
/// vocabulary (Tokenizer::control_id) as that single token. Throws kvsim::Error naming `what` for a
/// marker the vocabulary lacks.
std::vector<int> encode_template(const Tokenizer& tok, const std::string& text, const std::string& what);

/// Builds trial (kind, length, depth, index) from the filler's tokens, every random choice (keys,
/// values, filler offset, other needles' depths, word lists) from derive_seed(seed, kind, length, depth,
/// index): the same spec gives the same trial. Throws kvsim::Error naming `task.lengths` when L leaves
/// fewer than 16 filler tokens (or, for the aggregation kinds, cannot hold the list; the message names
/// the setting to lower), and `task.filler` when the filler has fewer tokens or words than a trial needs.
TaskTrial make_trial(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler);

/// RULER's score of one answer (Hsieh et al. 2024, Appendix B; `string_match_all`): the share of
/// `answers` found in `generated`, case-insensitively, as substrings (`match` = "substring") or as whole
/// words (`match` = "word", answer_matches). 0 when `answers` is empty.
double answer_score(const std::string& generated, const std::vector<std::string>& answers, const std::string& match);

/// Exact match: `answer` occurs in `generated` as a whole word — not inside a longer run of letters
/// or digits ("27611" matches "is 27611." but not "127611"); letters compare case-insensitively.
bool answer_matches(const std::string& generated, const std::string& answer);

/// `s` with every byte that starts no well-formed UTF-8 sequence replaced by U+FFFD (a generation
/// cut inside a multi-byte character ends in such a byte).
std::string valid_utf8(const std::string& s);

/// The text of generated tokens up to the first end-of-turn or end-of-sequence token (`stop` ids), as
/// valid UTF-8 (valid_utf8).
std::string generated_text(const Tokenizer& tok, const std::vector<int>& ids, const std::vector<int>& stop);

/// 95% Wilson score interval of k successes in n trials (Wilson 1927, with z = 1.959964): {low, high};
/// {NaN, NaN} when n = 0.
std::pair<double, double> wilson_interval(int64_t k, int64_t n);

}  // namespace kvsim
