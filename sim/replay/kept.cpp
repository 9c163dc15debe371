// The kept token set of a policy at one step (include/kvsim/replay/kept.hpp).
#include "kvsim/replay/kept.hpp"

#include <algorithm>
#include <string>

#include "cell_streams.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/replay/engine.hpp"

namespace kvsim {

std::vector<std::vector<int64_t>> kept_tokens(const Experiment& ex, const StreamSource& src, int layer, int kv_head,
                                              size_t policy, int64_t t) {
  const RecordingMeta& meta = src.meta();
  const int64_t n = ex.data.tokens > 0 ? std::min(ex.data.tokens, meta.n_tokens) : meta.n_tokens;
  const int64_t P = ex.data.prefill;
  if (t == 0) t = P + 1;
  if (policy >= ex.policies.size()) throw Error("kept_tokens: policy index " + std::to_string(policy) + " out of range");
  const std::string& label = ex.policies[policy].label;
  if (layer < 0 || layer >= meta.n_layers)
    throw Error("kept_tokens: layer " + std::to_string(layer) + " is out of range [0, " + std::to_string(meta.n_layers) + ")");
  if (kv_head < 0 || kv_head >= meta.n_kv_heads)
    throw Error("kept_tokens: KV head " + std::to_string(kv_head) + " is out of range [0, " + std::to_string(meta.n_kv_heads) + ")");
  if (t < P || (t == P && P == 0) || t > n)
    throw Error("kept_tokens: step " + std::to_string(t) + " is outside [" + std::to_string(std::max<int64_t>(P, 1)) + ", " +
                std::to_string(n) + "] (data.prefill = " + std::to_string(P) + ")");
  const int G = meta.n_heads / meta.n_kv_heads;
  Cell cell{layer, kv_head, {}};
  for (int g = 0; g < G; ++g) cell.heads.push_back(kv_head * G + g);
  const double scale = meta.softmax_scale;
  const cell::Streams s(src, cell, n, scale);
  const bool per_query = ex.eval.gqa == GqaMode::query_head;
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < (per_query ? G : 1); ++i) {
    auto inst = make_cell_policy(ex, meta, cell, n, policy, i);
    if (needs_exact_probs(*inst) || needs_global_scores(*inst))
      throw Error("kept_tokens: policy '" + label + "' is a non-causal oracle (it reads exact or future attention)");
    std::vector<int> heads;
    if (per_query) heads.push_back(i);
    else
      for (int g = 0; g < G; ++g) heads.push_back(g);
    MatD q(Eigen::Index(heads.size()), meta.head_dim);
    if (P > 0) {
      std::vector<const MatD*> qs;
      for (int g : heads) qs.push_back(&s.queries_scaled[size_t(g)]);
      prefill(*inst, P, s.keys32, s.values32, qs);
    }
    std::vector<Answer> answers(heads.size());
    for (int64_t step = P + 1; step <= t; ++step) {
      inst->observe(step - 1, s.keys32.row(step - 1).data(), s.values32.row(step - 1).data());
      if (step < t && !inst->needs_every_query()) continue;
      for (size_t g = 0; g < heads.size(); ++g) q.row(Eigen::Index(g)) = s.queries_scaled[size_t(heads[g])].row(step - 1);
      inst->attend(step, q, step == t ? &answers : nullptr, nullptr);
    }
    if (t == P) {  // the compressed prompt: its cache read with the prompt's last query
      for (size_t g = 0; g < heads.size(); ++g) q.row(Eigen::Index(g)) = s.queries_scaled[size_t(heads[g])].row(P - 1);
      inst->attend(P, q, &answers, nullptr);
    }
    if (!answers[0].has_kept)
      throw Error("kept_tokens: policy '" + label + "' answers without a kept token set (its output is not attention over a subset of tokens)");
    std::vector<int64_t> kept = answers[0].kept;
    std::sort(kept.begin(), kept.end());
    out.push_back(std::move(kept));
  }
  return out;
}

}  // namespace kvsim
