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

/// The prompt templates of one task kind (docs/tasks.md lists the defaults).
struct TaskTemplate {
  std::string prefix;    ///< before the filler (system turn, the user's instruction)
  std::string needle;    ///< the hidden sentence; `{value}` is the answer, `{key}` what the question names
  std::string question;  ///< after the filler: the question and the assistant turn's opening
};

/// The default template of `kind` ("passkey" or "word"; SmolLM2-Instruct's chat format). Throws
/// kvsim::Error naming the kind otherwise.
TaskTemplate default_template(const std::string& kind);

/// What makes a trial: the task kind and template, prompt length L, depth d ∈ [0, 1], trial index.
struct TrialSpec {
  std::string kind = "passkey";
  TaskTemplate templ;
  int length = 1024;
  double depth = 0.5;
  int index = 0;
  uint64_t seed = 1;
};

/// One generated trial. Positions are 0-based token indices of `tokens`.
struct TaskTrial {
  std::vector<int> tokens;  ///< the prompt, exactly `length` tokens
  int needle_begin = 0, needle_end = 0;  ///< the needle's tokens [begin, end)
  int question_begin = 0;   ///< first token of the question: the context is [0, question_begin)
  double depth = 0;         ///< the needle's actual depth: filler tokens before it / filler tokens
  int64_t filler_offset = 0;  ///< the filler slice's first token in the filler text's token stream
  std::string key, value;   ///< what the question names (empty for passkey) and the answer
};

/// `text` encoded with `tok` (no BOS), each `<|name|>` marker that is a control token of the
/// vocabulary (Tokenizer::control_id) as that single token. Throws kvsim::Error naming `what` for a
/// marker the vocabulary lacks.
std::vector<int> encode_template(const Tokenizer& tok, const std::string& text, const std::string& what);

/// Builds trial (kind, length, depth, index) from the filler's tokens, every random choice (key,
/// value, filler offset) from derive_seed(seed, kind, length, depth, index): the same spec gives the
/// same trial. Throws kvsim::Error naming `task.lengths` when L leaves fewer than 16 filler tokens,
/// and `task.filler` when the filler has fewer tokens than a trial needs.
TaskTrial make_trial(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler);

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
