// `pyramidkv`: PyramidKV (Cai et al., 2024, "PyramidKV: Dynamic KV Cache Compression based on
// Pyramidal Information Funneling", §3.2-3.3). SnapKV's prompt selection (sim/policies/snapkv.hpp)
// with a budget that shrinks arithmetically with depth: lower layers, whose attention is spread
// wide, keep more; upper layers, whose attention has funnelled onto few tokens, keep fewer.
//
// Layer budgets (§3.3 and the authors' KVCache-Factory code, pyramidkv_utils.py): with a mean
// budget B, window w and β (default 20), the selected part of layer l of L is arithmetic from
// b_max = 2(B − w) − b_min at layer 0 down to b_min = (B − w)/β at layer L − 1, plus the window.
// kvsim makes the total exact: b_l are rounded so that Σ_l b_l = L·(B − w), i.e. the layers hold on
// average exactly a uniform budget B (the reference's integer steps leave the total a little above).
// With `memory = M` each layer is checked against its own B_l (LayerMemoryShare = B_l / M) and
// the summary's per-layer cache_tokens report the budgets.
//
// `budgets = "kvpress"` gives kvpress's PyramidKVPress instead (docs/kvpress.md): its layer budgets
// include the window, are arithmetic with mean B from min(2B − B/β, P − w) down, and fall back to
// SnapKV's uniform B when the bottom layer would hold less than the window.
#include <cmath>

#include "snapkv.hpp"

namespace kvsim::policies {

std::vector<int64_t> pyramidkv_layer_budgets(int64_t budget, int64_t window, double beta, int n_layers) {
  const double mean = double(budget - window), lo = mean / beta, hi = 2 * mean - lo;
  std::vector<int64_t> out(size_t(std::max(n_layers, 1)));
  double cum = 0;
  int64_t prev = 0;
  for (int l = 0; l < int(out.size()); ++l) {
    cum += n_layers > 1 ? hi - (hi - lo) * double(l) / double(n_layers - 1) : mean;
    const int64_t now = std::llround(cum);
    out[size_t(l)] = window + (now - prev);
    prev = now;
  }
  return out;
}

std::vector<int64_t> pyramidkv_kvpress_budgets(int64_t budget, int64_t window, double beta, int n_layers, int64_t prompt) {
  // kvpress 0.5's PyramidKVPress.get_layer_budget with q_len = P and P·(1 − compression_ratio) = budget.
  const double mean = double(budget);
  double lo = mean / beta, hi = 2 * mean - lo;
  if (hi >= double(prompt - window)) {
    hi = double(prompt - window);
    lo = 2 * mean - hi;
  }
  std::vector<int64_t> out(size_t(std::max(n_layers, 1)));
  // Python's round(): to nearest, ties to even (std::nearbyint in the default rounding mode).
  const bool fallback = !(double(prompt) >= hi && hi >= lo && lo >= double(window));
  const double steps = n_layers > 1 ? (hi - lo) / double(n_layers - 1) : 0.0;
  for (int l = 0; l < int(out.size()); ++l)
    out[size_t(l)] = fallback ? std::max<int64_t>(1, int64_t(std::nearbyint(mean)))
                              : int64_t(std::nearbyint(hi - double(l) * steps));
  return out;
}

namespace {

std::unique_ptr<Policy> make_pyramidkv(ParamReader& p, const StreamInfo& s) {
  const int64_t budget = p.get_budget("budget", s.n);
  const double beta = p.get_double("beta");  // ≥ 1: the top layer keeps (budget − window)/beta
  const int64_t window = snapkv_window(p, budget);  // the mean budget's window, shared by every layer
  if (budget < 2 || window < 1 || window > budget)
    return make_snapkv_like("pyramidkv", p, s, budget, 1.0, window);  // reports the bad parameter
  const std::string rule = p.get_string("budgets");
  // The paper's pyramid runs over the layers whose caches are compressed (a hybrid model's global
  // layers; StreamInfo::managed_rank); "kvpress" numbers every layer of the model, as PyramidKVPress does
  // with module.layer_idx over num_hidden_layers.
  const int rank = rule == "kvpress" ? s.layer : s.managed_rank();
  const int count = rule == "kvpress" ? s.n_layers : s.managed_count();
  if (rank < 0 || rank >= std::max(count, 1))
    throw Error("layer " + std::to_string(rank) + " outside the model's " + std::to_string(count) + " compressed layers");
  if (rule == "kvpress" && s.prefill <= 0)
    throw Error("budgets = \"kvpress\" sizes the layers from the prompt: set [data] prefill = P" + p.where("budgets"));
  const int64_t b = rule == "paper" ? pyramidkv_layer_budgets(budget, window, beta, count)[size_t(rank)]
                                    : pyramidkv_kvpress_budgets(budget, window, beta, count, s.prefill)[size_t(rank)];
  if (b < window)
    throw Error("layer " + std::to_string(s.layer) + "'s budget " + std::to_string(b) + " is below the window " +
                std::to_string(window) + p.where("budget"));
  return make_snapkv_like("pyramidkv", p, s, b, double(b) / double(budget), window);
}

std::vector<ParamInfo> params() {
  std::vector<ParamInfo> v{{"budget", "tokens", "required", "mean tokens per layer B (≥ 2); layer l keeps B_l"},
                           {"beta", "float", "20", "β: the top layer selects (B − window)/β prompt tokens", "[1, inf)"},
                           {"budgets", "string", "paper",
                            "\"paper\": B_l = window + the arithmetic selected part (KVCache-Factory); \"kvpress\": kvpress's "
                            "PyramidKVPress rule (B_l arithmetic with mean B, window inside, capped at P − window; SnapKV's B "
                            "when that leaves a layer below the window)",
                            "paper|kvpress"}};
  for (auto& q : snapkv_params()) v.push_back(q);
  return v;
}

}  // namespace

KVSIM_POLICY(pyramidkv) {
  static const PolicyInfo info{
      "pyramidkv",
      "snapkv with layer budgets B_l falling arithmetically with depth from 2(B − w) − (B − w)/β + w to (B − w)/β + w, "
      "averaging exactly B over the layers it compresses (a hybrid model's global layers). Needs [data] prefill",
      "PyramidKV (Cai et al., 2024) §3.2-3.3",
      params(),
      make_pyramidkv,
      MemoryRule{"budget = M as the layers' mean (layer l: B_l, checked per layer), decode_window = ⌊M/2⌋ unless given",
                 {"budget"},
                 prompt_memory_rule().apply},
      "no",
      {example_params({{"budget", 0.25}}),
       example_params({{"budget", 0.25}, {"beta", 4.0}, {"window", int64_t(4)}, {"kernel", int64_t(3)},
                       {"pooling", std::string("avg")}, {"decode_window", int64_t(4)}}),
       example_params({{"budget", 0.25}, {"window", int64_t(4)}, {"budgets", std::string("kvpress")}})},
                       "#fb9a99",  // figure colour
                       {example_params({{"memory", 0.25}}), true, false}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
