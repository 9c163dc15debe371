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

/// A KVAttention that routes each layer's attention through one policy per KV head (gqa = kv_head)
/// or per query head (query_head). Non-causal oracles (oracle_topk, h2o score = "oracle") are
/// refused: they need the future. Seeds derive from (seed, layer, head, 0) like the replay engine.
class PolicyKVAttention final : public KVAttention {
 public:
  PolicyKVAttention(const LlamaConfig& cfg, const PolicySpec& spec, int64_t n_tokens, uint64_t seed,
                    const std::string& gqa = "kv_head", const std::string& group_agg = "mean");
  void attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) override;
  /// Mean cached tokens per (layer, cache) now.
  double mean_cache_tokens() const;

 private:
  LlamaConfig cfg_;
  bool per_query_;
  std::vector<std::unique_ptr<Policy>> pol_;  // [layer][kv head or query head]
  std::vector<Answer> answers_;
};

/// Teacher-forced mean cross-entropy of `tokens` (predicting tokens[i+1] at position i) with an
/// optional attention override.
double teacher_forced_ce(LlamaModel& model, const std::vector<int>& tokens, KVAttention* attn);

/// Greedy continuation: feed `prompt`, then generate until `total` tokens; returns all tokens.
std::vector<int> greedy_tokens(LlamaModel& model, const std::vector<int>& prompt, int total, KVAttention* attn);

}  // namespace kvsim
