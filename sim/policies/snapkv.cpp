// `snapkv`: SnapKV (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before
// Generation", §4.1, Algorithm 1, Eq. 1-2). Compresses the prompt once at prefill: the last w prompt
// queries (observation window, default 32) vote for earlier prompt tokens, the votes are max-pooled
// over positions (kernel 7), and the top B − w tokens plus the window are kept; decoded tokens are
// appended (or, with decode_window = D, the cache stays at B: see sim/policies/snapkv.hpp).
// Needs `[data] prefill = P`.
#include "snapkv.hpp"

namespace kvsim::policies {
namespace {

std::unique_ptr<Policy> make_snapkv(ParamReader& p, const StreamInfo& s) {
  const int64_t budget = p.get_budget("budget", s.n);
  return make_snapkv_like("snapkv", p, s, budget, 1.0, snapkv_window(p, budget));
}

std::vector<ParamInfo> params() {
  std::vector<ParamInfo> v{{"budget", "tokens", "required", "tokens kept from the prompt, B (≥ 2); with decode_window the cache size"}};
  for (auto& q : snapkv_params()) v.push_back(q);
  return v;
}

}  // namespace

KVSIM_POLICY(snapkv) {
  static const PolicyInfo info{
      "snapkv",
      "prefill: the last `window` prompt queries' attention, pooled over positions, picks B − window prompt tokens, "
      "kept with the window; decoded tokens are appended (decode_window = D: the D newest decoded tokens replace "
      "the window, then the lowest-scored prompt tokens, so the cache never exceeds B). Needs [data] prefill",
      "SnapKV (Li et al., 2024) §4.1, Algorithm 1, Eq. 1-2",
      params(),
      make_snapkv,
      prompt_memory_rule(),
      "no",
      {example_params({{"budget", 0.25}}),
       example_params({{"budget", 0.25}, {"window", int64_t(4)}, {"kernel", int64_t(5)}, {"pooling", std::string("avg")},
                       {"decode_window", int64_t(4)}})},
                       "#e7298a",  // figure colour
                       {example_params({{"memory", 0.25}}), true, false}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
