// Internal (sim/cli/task*.cpp): one retrieval trial's exact tensors, the stream source the open loop
// replays them from, and the evict_needle control cache.
#pragma once
#include <memory>
#include <vector>

#include "kvsim/io/recording.hpp"
#include "kvsim/model/llama.hpp"
#include "kvsim/model/policy_attention.hpp"
#include "kvsim/cli/task.hpp"
#include "kvsim/model/retrieval.hpp"

namespace kvsim::task_detail {

/// The exact model's per-layer tensors over a whole prompt of L tokens (one batched prefill). A global layer:
/// Q [L, n_heads·hd] (post-RoPE, unscaled), K and V [L, n_kv_heads·hd] (post-RoPE keys). A local layer (a sliding
/// window shorter than L, RecordingMeta::is_local) l keeps no query and only the key and value rows row0[l] … context_end − 1, row0[l] = max(0, context_end −
/// its window): all that a cache given the first context_end positions reads of it (its window's ring), since the
/// open loop replays the global layers only. At Gemma 3's 32k tokens this keeps 0.6 of 3.6 GB.
struct TrialTensors {
  std::vector<MatF> q, k, v;
  std::vector<int64_t> row0;  ///< [layer]: the first position a layer's K and V rows hold (0 on a global layer)
  int64_t tokens = 0;         ///< L
};
/// Throws kvsim::Error when context_end is outside [0, tokens.size()].
TrialTensors exact_tensors(const LlamaModel& model, const std::vector<int>& tokens, int threads, int64_t context_end);

/// The first P positions per head, as caches receive a prompt (PolicyKVAttention::load_prompt); a local layer's
/// K and V hold the last min(P, window) of them (PromptTensors). Throws kvsim::Error when `t` lacks them (P is
/// past the context_end it was made with, or its local rows start after P − window).
PromptTensors context_tensors(const TrialTensors& t, const LlamaConfig& cfg, int64_t P);

/// The trial's tensors as a recording (rope applied, softmax_scale 1/√hd, the model's RoPE base)
/// for the replay engine.
class TrialSource final : public StreamSource {
 public:
  TrialSource(const TrialTensors& t, const LlamaConfig& cfg, const std::string& model);
  const RecordingMeta& meta() const override { return meta_; }
  MatF read(int layer, Tensor which, int head) const override;
  std::string describe() const override { return "retrieval trial (in memory)"; }

 private:
  const TrialTensors& t_;
  RecordingMeta meta_;
};

/// The negative control: the exact cache without the tokens of `evict` (spans of the prompt it received)
/// (exact attention over every other token, and over every decoded token; a local layer of a
/// sliding-window model over those of its last sliding_window positions).
class EvictSpanAttention final : public KVAttention {
 public:
  EvictSpanAttention(const LlamaConfig& cfg, const PromptTensors& prompt, const std::vector<Span>& evict);
  void attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) override;
  double mean_cache_tokens() const override;

 private:
  LlamaConfig cfg_;
  int64_t prompt_len_;
  std::vector<int64_t> kept_;  ///< the prompt positions kept, ascending
  /// [layer · n_kv_heads + kvh] → [tokens, hd], appended as decoding goes: the kept prompt positions from
  /// kept_[first_[i]] on (0 on a global layer; a local layer's from its window's first position), then one row
  /// per decoded position.
  std::vector<MatD> k_, v_;
  std::vector<size_t> first_;
};

/// Per policy of `specs`, the means over its open-loop rows (layer, query head, step) at the steps
/// from `from` on (the link's steps, below) of the link's metrics and the offline scores, written into
/// rows[p] (sim/cli/task_scores.cpp).
void open_loop_link(const TaskConfig& c, const std::vector<PolicySpec>& specs, const TaskTrial& tr, const TrialSource& src,
                    int64_t from, int threads, std::vector<TaskRow*>& rows);

/// The tokens an answer stops at: EOS, and <|im_end|> and <end_of_turn> where the vocabulary has them.
std::vector<int> stop_tokens(const Tokenizer& tok);

/// The exact cache's greedy tokens for the trial's prompt (prompt + `c.generate` tokens), decoded alone
/// (the open loop's answer steps need them when no closed loop ran).
std::vector<int> exact_generation(const TaskConfig& c, const LlamaModel& model, const TrialTensors& tt, const TaskTrial& tr,
                                  int threads);

/// The open loop of one trial ([task] link_steps, docs/tasks.md "A trial, step by step"): the context
/// is the policies' prefill and the evaluated steps are either the question's ("question": the prompt's
/// tensors `tt`, steps question_begin + 1 … L) or those that produce the exact cache's answer ("answer":
/// the prompt followed by `exact_generated`'s tokens after the prompt up to the first of `stop`, its
/// tensors from one more prefill, steps L … L + answer length, whose queries are the prompt's last token
/// and each answer token). Fills rows as open_loop_link.
void link_trial(const TaskConfig& c, const LlamaModel& model, const std::vector<PolicySpec>& specs, const TaskTrial& tr,
                const TrialTensors& tt, const std::vector<int>& exact_generated, const std::vector<int>& stop, int threads,
                std::vector<TaskRow*>& rows);

}  // namespace kvsim::task_detail
