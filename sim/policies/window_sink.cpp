// `window` and `sink` (StreamingLLM): one ring of recent tokens, optionally behind fixed sink tokens.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvsim/policies/gpu_replay.hpp"
#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

/// `window` (local attention, H2O §5.1 "Local", BUZZ Fig. 1(b)) and `sink` (StreamingLLM: the first
/// `sink` tokens plus the most recent ones; BUZZ §2, SubGen §3.2). Budget B = sink + window.
class SinkWindowPolicy final : public Policy, public ClosedFormPolicy, public GpuReplayable {
 public:
  SinkWindowPolicy(int64_t sink, int64_t window, int d, bool f32)
      : sink_(sink), window_(window), cache_(sink + window, d, f32, /*lazy=*/true) {}
  void observe(int64_t t, const float* k, const float* v) override {
    // Shared with the CUDA path (include/kvsim/core/hd.hpp): the first sink + window tokens fill the
    // slots in order, later ones replace the oldest non-sink token (a ring over the window part).
    const int64_t slot = hd::sink_window_slot(t, sink_, window_);
    if (slot == cache_.size()) cache_.append(t, k, v);
    else cache_.put(slot, t, k, v);
  }
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return cache_.size(); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    cuda::PolicyReplay r;
    r.kind = sink_ > 0 ? cuda::ReplayKind::sink : cuda::ReplayKind::window;
    r.sink = sink_;
    r.window = window_;
    return r;
  }
  ClosedFormCache closed_form() const override { return ClosedFormCache{sink_, window_}; }

 private:
  int64_t sink_, window_;
  SlotCache cache_;
};

std::unique_ptr<Policy> make_window(ParamReader& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  if (b < 1) throw Error("parameter 'budget' must be at least 1 token" + p.where("budget"));
  return std::make_unique<SinkWindowPolicy>(0, b, s.head_dim, s.policy_f32);
}

std::unique_ptr<Policy> make_sink(ParamReader& p, const StreamInfo& s) {
  int64_t b = p.get_budget("budget", s.n);
  int64_t sink = p.get_int("sink");
  if (b <= sink)
    throw Error("budget (" + std::to_string(b) + " tokens) must exceed 'sink' (" + std::to_string(sink) +
                ") to leave room for a window" + p.where("budget"));
  return std::make_unique<SinkWindowPolicy>(sink, b - sink, s.head_dim, s.policy_f32);
}

}  // namespace

KVSIM_POLICY(window) {
  static const PolicyInfo info{"window",
                               "the `budget` most recent tokens (local attention)",
                               "H2O §5.1 \"Local\"; BUZZ Fig. 1(b)",
                               {{"budget", "tokens", "required", "cache size B: tokens, or a fraction of n"}},
                               make_window,
                               budget_memory_rule(),
                               "yes",
                               {example_params({{"budget", 0.25}})},
                               "#9467bd",  // figure colour
                               {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

KVSIM_POLICY(sink) {
  static const PolicyInfo info{"sink",
                               "the first `sink` tokens plus the most recent `budget − sink` (StreamingLLM)",
                               "StreamingLLM; BUZZ §2; SubGen §3.2",
                               {{"budget", "tokens", "required", "cache size B: tokens, or a fraction of n"}, {"sink", "int", "4", "attention-sink tokens kept from the start", "[0, inf)"}},
                               make_sink,
                               budget_memory_rule(),
                               "yes",
                               {example_params({{"budget", 0.25}})},
                               "#ff7f0e",  // figure colour
                               {example_params({{"budget", 0.25}}), false, true}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
