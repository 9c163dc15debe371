// `tova`: Token Omission Via Attention (Oren et al., 2024, "Transformers are Multi-State RNNs", §4,
// Eq. 6 and Fig. 1). When the cache is full, the token with the lowest attention weight from the
// current query is dropped: the cache is a multi-state RNN of fixed size whose state update keeps
// the B tokens the latest query attends to most.
//
// Step t in kvsim's order (docs/architecture.md, a replay step by step: the cache that answers q_t holds ≤ B tokens): observe(k_t)
// evicts the cached token with the lowest weight under q_{t−1} (ties: the oldest) and k_t takes its
// slot; q_t then attends over the B cached tokens and its weights become the scores. TOVA as
// published attends with q_t over S_{t−1} ∪ {t} (B + 1 tokens) and drops after, so kvsim's `tova` at
// budget B equals the paper's at B − 1 plus the current token, and is never larger than B. In kv_head
// mode the group's query heads' weights combine by group_agg (mean by default; the paper averages
// over heads in its layer-wise variant and keeps per-head caches in the head-wise one: gqa =
// "query_head").
#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "scorer.hpp"

namespace kvsim::policies {
namespace {

class TovaPolicy final : public ScorerPolicy {
 public:
  TovaPolicy(int64_t budget, const StreamInfo& s) : ScorerPolicy("tova", budget, /*sink=*/0, /*recent=*/0, s) {}

 private:
  /// The scores are the latest attention weights (replaced, not accumulated).
  void update_scores(int64_t, const ProbsD& P, std::vector<double>& score) override {
    const VecD step = group_weights(P);
    for (int64_t s = 0; s < P.rows(); ++s) score[size_t(s)] = step[s];
  }
};

std::unique_ptr<Policy> make_tova(ParamReader& p, const StreamInfo& s) {
  const int64_t b = p.get_budget("budget", s.n);
  return std::make_unique<TovaPolicy>(b, s);
}

}  // namespace

KVSIM_POLICY(tova) {
  static const PolicyInfo info{
      "tova",
      "keep the B tokens the latest query attends to most: when full, the token with the lowest attention weight "
      "under q_{t−1} (group_agg over the group's queries) is evicted before token t joins (kvpress's TOVAPress is a "
      "one-shot prefill variant over all the layer's heads: for it, capture TOVAPress with kvsim.kvpress and replay "
      "it with press_replay; docs/kvpress.md)",
      "TOVA (Oren et al., 2024) §4, Eq. 6",
      {{"budget", "tokens", "required", "cache size B (≥ 1)"}},
      make_tova,
      budget_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}})},
      "#bcbd22",  // figure colour
      {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
