// Internal (sim/model/retrieval.cpp, sim/model/ruler.cpp): what the task kinds share — placeholder
// filling, and placing needles in a slice of real filler text at their depths.
#pragma once
#include <string>
#include <vector>

#include "kvsim/core/rng.hpp"
#include "kvsim/model/retrieval.hpp"

namespace kvsim::retrieval_detail {

// SmolLM2-Instruct's chat format (its GGUF's tokenizer.chat_template): a system turn, the user's turn
// holding the instruction, the filler with the needle and the question, then the assistant's turn.
inline constexpr const char* kSystem =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n";
inline constexpr const char* kAssistant = "<|im_end|>\n<|im_start|>assistant\n";

/// `s` with every `{key}` and `{value}` replaced.
std::string fill(std::string s, const std::string& key, const std::string& value);

/// A sentence to hide: its tokens, where it should go (a share of the filler before it, in [0, 1]) and
/// whether it holds the answer (TaskTrial::evidence).
struct Needle {
  std::vector<int> tokens;
  double target = 0.5;
  bool evidence = true;
};

/// [BOS] · pre · filler with the needles · question, exactly spec.length tokens: the filler is one
/// contiguous slice of `filler` at an offset drawn from `rng`; each needle goes at its target share of
/// the filler, moved back to the nearest sentence or line end within 64 tokens; needles at the same
/// place keep their order in `needles`. Fills tokens, needles, evidence, needle_begin/end,
/// question_begin, depth (the first evidence needle's) and filler_offset. Throws kvsim::Error naming
/// task.lengths (with `lower`, the setting to lower, when not empty) or task.filler.
void place_needles(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, std::vector<int> pre,
                   const std::vector<Needle>& needles, const std::vector<int>& question, Engine& rng, const std::string& lower,
                   TaskTrial& tr);

/// [BOS] · pre · context · newline padding · question, exactly spec.length tokens, for the kinds whose
/// context is generated (common_words, frequent_words); `evidence` are spans of `context`. Throws
/// kvsim::Error naming task.lengths when the parts exceed L.
void place_context(const TrialSpec& spec, const Tokenizer& tok, std::vector<int> pre, const std::vector<int>& context,
                   const std::vector<Span>& evidence, const std::vector<int>& question, TaskTrial& tr);

/// The RULER suite's trials (sim/model/ruler.cpp): every kind of task_kinds() but passkey and word.
void make_ruler_trial(const TrialSpec& spec, const Tokenizer& tok, const std::vector<int>& filler, Engine& rng, TaskTrial& tr);

/// The suite's default templates (ruler.cpp).
TaskTemplate ruler_template(const std::string& kind, const TaskSettings& s);

/// FNV-1a of a kind's name: the kind's part of a trial's seed.
uint64_t name_tag(const std::string& kind);

}  // namespace kvsim::retrieval_detail
