// kvsim: a llama2.c model whose attention runs through KV-cache policies (the closed loop's core):
// every (layer, KV head) cache is managed by a policy, so later tokens are computed from compressed
// attention exactly as a deployed cache would behave.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kvsim/core/params.hpp"
#include "kvsim/model/llama.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {

/// A prompt's tensors per head, in the form kvsim::prefill takes them: built once from the model's
/// batched prefill and handed to every policy's cache (PolicyKVAttention::load_prompt).
struct PromptTensors {
  int64_t P = 0;
  /// [layer · n_kv_heads + kvh] → [P, head_dim], post-RoPE keys; values. A local (sliding-window, w) layer's may hold
  /// only the prompt's last rows, at least min(P, w) of them (all its window's ring reads): row r is position
  /// P − rows + r.
  std::vector<MatF> k, v;
  /// [layer · n_heads + h] → [P, head_dim], post-RoPE queries · 1/√head_dim; empty (0 × 0) on a local
  /// (sliding-window) layer, whose cache is its exact window and reads no query (Gemma 3: 15 of 18 layers, 4 GB
  /// of doubles at 32k tokens saved).
  std::vector<MatD> q;
  std::vector<float> last_logits;  ///< [vocab], the prompt's prediction of token P
};

/// Runs LlamaModel::prefill over `prompt` (exact causal attention, `threads` threads) and splits its
/// per-layer Q, K, V into PromptTensors. Throws kvsim::Error on an empty prompt or a bad token.
PromptTensors prompt_tensors(const LlamaModel& model, const std::vector<int>& prompt, int threads);

/// The stream a closed-loop cache of `layer` and `kv_head` is built for (all but its seed): what the
/// replay of a recording of this model gives the same cell (cell_stream over model_recording_meta) —
/// n_tokens, head_dim, the query group, post-RoPE queries scaled by attn_scale(), the layer's RoPE base
/// and pair order, the prompt, the managed (global) layers. tests/unit/test_closed_loop_stream.cpp
/// compares the two field by field.
StreamInfo model_cache_stream(const LlamaConfig& cfg, int layer, int kv_head, int64_t n_tokens, GqaMode gqa,
                              GroupAgg group_agg, int64_t prefill, bool policy_f32);

/// A KVAttention that routes each layer's attention through one policy per KV head (gqa = kv_head)
/// or per query head (query_head). Non-causal oracles (oracle_topk, h2o score = "oracle") are
/// refused: they need the future. Seeds derive from (seed, layer, head, 0) like the replay engine.
/// With `prefill` = P ≥ 1 (`[model] prefill`), positions 0..P−1 are the prompt: they attend exactly
/// over the prompt so far (a real prefill computes full attention), and at position P−1 every cache
/// receives the prompt's keys, values and scaled queries at once (kvsim::prefill); decoding from
/// position P goes through the policies.
/// Sliding-window models (Gemma 3): policies manage the global layers' caches only; a local layer
/// (LlamaConfig::layer_window(l) = w > 0) keeps its exact last w tokens, as the model was trained —
/// cache compression matters on the global layers (the recording's data.local_layers = "exact").
/// Scores use the model's softmax scale (LlamaConfig::attn_scale: 1/√head_dim, or Gemma's
/// query_pre_attn_scalar^(−1/2)).
/// `prompt_block`: how a cache that reads every query (BlockStepper) receives the prompt — 0 one step at a
/// time, B > 0 in blocks of B steps, −1 in blocks of the engine's size (`[eval] stepping = "blocked"`:
/// prompt_block_of(), include/kvsim/io/spec.hpp).
class PolicyKVAttention final : public KVAttention {
 public:
  PolicyKVAttention(const LlamaConfig& cfg, const PolicySpec& spec, int64_t n_tokens, uint64_t seed,
                    GqaMode gqa = GqaMode::kv_head, GroupAgg group_agg = GroupAgg::mean, int64_t prefill = 0,
                    bool policy_f32 = false, int64_t prompt_block = 0);
  void attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) override;
  /// The prompt at once (instead of feeding positions 0..P−1 through attend): every cache receives
  /// kvsim::prefill with the prompt's keys, values and scaled queries; decoding then starts at
  /// position P. Requires prompt.P = the constructor's `prefill`; throws kvsim::Error otherwise.
  void load_prompt(const PromptTensors& prompt);
  /// Mean cached tokens per (global layer, cache) now: the policies' caches (a local layer's window
  /// holds min(pos + 1, sliding_window) tokens and is not counted).
  double mean_cache_tokens() const override;

 private:
  /// A prompt position: exact attention over the buffered prompt, then kvsim::prefill at its end.
  void attend_prompt(int layer, int pos, const float* q, const float* k, const float* v, float* out);
  /// kvsim::prefill of every cache of `layer` with the prompt's tensors (the prompt's end).
  void prefill_layer(int layer, const PromptTensors& prompt);

  LlamaConfig cfg_;
  bool per_query_;
  int64_t prefill_ = 0;
  int64_t prompt_block_ = 0;
  bool loaded_ = false;  // load_prompt ran: positions < prefill_ are done
  PromptTensors prompt_;  // the prompt buffered position by position (attend_prompt); last_logits unused
  std::vector<std::unique_ptr<Policy>> pol_;  // [layer][kv head or query head]; null on local layers
  /// A local layer's exact sliding-window cache per KV head: the last w keys and values in a ring
  /// (row = position mod w); empty on global layers.
  struct Window {
    MatD k, v;
  };
  std::vector<Window> window_;  // [layer · n_kv_heads + kvh]
  std::vector<Answer> answers_;
};

/// One sequence's cache behind a guard: a cache that drives the activations to inf/NaN (kvsim::Error
/// naming a non-finite value) is stopped there — its attention reads zeros from then on and broken()
/// gives the reason — while the other sequences of a batch go on. Other errors propagate.
class GuardedAttention final : public KVAttention {
 public:
  GuardedAttention(std::unique_ptr<KVAttention> a, int out_size) : a_(std::move(a)), out_size_(out_size) {}
  void attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) override;
  double mean_cache_tokens() const override { return a_->mean_cache_tokens(); }
  KVAttention& inner() { return *a_; }
  const std::string& broken() const { return broken_; }

 private:
  std::unique_ptr<KVAttention> a_;
  int out_size_;
  std::string broken_;
};

/// Greedy decoding of B = attn.size() sequences together (LlamaModel::decode_step): every cache holds
/// positions < `start`; positions start..prompt.size()−1 feed the prompt's tokens (teacher-forced),
/// then each sequence appends its own argmax token until it has `total` tokens. With `last_logits`
/// (a prompt loaded whole: start = prompt.size()) the first new token is its argmax for every
/// sequence. Returns each sequence's tokens, the prompt first.
std::vector<std::vector<int>> batched_greedy(const LlamaModel& model, const std::vector<int>& prompt, int start, int total,
                                             const std::vector<float>* last_logits, const std::vector<KVAttention*>& attn,
                                             int threads);

/// Teacher-forced mean cross-entropy of `tokens` (predicting tokens[i+1] at position i, for positions
/// i ≥ from: with a prompt of P tokens, from = P scores only the decoded positions) with an optional
/// attention override.
double teacher_forced_ce(LlamaModel& model, const std::vector<int>& tokens, KVAttention* attn, int from = 0);

/// Greedy continuation: feed `prompt`, then generate until `total` tokens; returns all tokens.
std::vector<int> greedy_tokens(LlamaModel& model, const std::vector<int>& prompt, int total, KVAttention* attn);

}  // namespace kvsim
