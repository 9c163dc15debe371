// The closed loop's caches are built for the stream the replay describes: a policy that reads the
// stream's RoPE or softmax scale (expected_attention turns its queries back before RoPE) must see the
// same description in `kvsim task` / `kvsim closed-loop` as in `kvsim run` on a recording of the same
// model. (Until 2026-11-28 the closed loop left RoPE and the scale unset, so expected_attention fitted
// its query statistics to post-RoPE queries there: docs/results.md, "kvsim's expected_attention beside
// kvpress".)
#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "../sim/cli/task_trial.hpp"

#include "kvsim/model/policy_attention.hpp"
#include "kvsim/model/record.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;

namespace {

/// The fields of two stream descriptions that differ ("" when none does), seeds aside.
std::string differences(const StreamInfo& a, const StreamInfo& b) {
  std::string d;
  auto cmp = [&](const char* name, bool same) { d += same ? "" : std::string(name) + " "; };
  cmp("n", a.n == b.n);
  cmp("head_dim", a.head_dim == b.head_dim);
  cmp("n_queries", a.n_queries == b.n_queries);
  cmp("group_agg", a.group_agg == b.group_agg);
  cmp("prefill", a.prefill == b.prefill);
  cmp("policy_f32", a.policy_f32 == b.policy_f32);
  cmp("softmax_scale", a.softmax_scale == b.softmax_scale);
  cmp("rope_theta", a.rope_theta == b.rope_theta);
  cmp("rope_halves", a.rope_halves == b.rope_halves);
  cmp("rope_applied", a.rope_applied == b.rope_applied);
  cmp("layer", a.layer == b.layer);
  cmp("kv_head", a.kv_head == b.kv_head);
  cmp("n_layers", a.n_layers == b.n_layers);
  cmp("managed_rank", a.managed_rank() == b.managed_rank());
  cmp("managed_count", a.managed_count() == b.managed_count());
  return d;
}

LlamaConfig model_config(bool hybrid) {
  LlamaConfig c;
  c.dim = 64, c.hidden_dim = 128, c.n_layers = 6, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 32, c.seq_len = 256;
  c.rope_theta = 500000.0, c.rope_halves = true;
  if (hybrid) {  // Gemma 3's shape: wide heads, its own query scale, local layers with another RoPE base
    c.head_dim_override = 32, c.query_scale = 0.0625, c.sliding_window = 16, c.local_pattern = 3;
    c.rope_theta = 1e6, c.rope_theta_local = 1e4;
  }
  return c;
}

}  // namespace

TEST_CASE("closed loop: a cache is built for the stream a replay of the same model's recording describes",
          "[model][closed_loop]") {
  const int64_t n = 200, P = 150;
  for (bool hybrid : {false, true})
    for (GqaMode gqa : {GqaMode::kv_head, GqaMode::query_head}) {
      const LlamaConfig cfg = model_config(hybrid);
      const RecordingMeta meta = model_recording_meta(cfg, "m", "s", n);
      Experiment ex;
      ex.eval.gqa = gqa;
      ex.eval.group_agg = GroupAgg::max;
      ex.eval.policy_precision = Precision::float32;
      ex.data.prefill = P;
      int compared = 0;
      for (int l = 0; l < cfg.n_layers; ++l) {
        if (cfg.layer_window(l) > 0) continue;  // a local layer keeps its exact window in the closed loop
        for (int kv = 0; kv < cfg.n_kv_heads; ++kv) {
          Cell cell{l, kv, {2 * kv, 2 * kv + 1}};
          const StreamInfo loop = model_cache_stream(cfg, l, kv, n, gqa, GroupAgg::max, P, true);
          const StreamInfo replay = cell_stream(ex, cell, n, meta);
          INFO("hybrid " << hybrid << ", layer " << l << ", KV head " << kv);
          CHECK(differences(loop, replay).empty());
          CHECK(loop.rope_applied);
          CHECK(loop.rope_theta == cfg.layer_rope_theta(l));
          ++compared;
        }
      }
      CHECK(compared == (hybrid ? 4 : 12));
    }
  // Negative controls: the comparison sees the closed loop's old description (no RoPE, no scale) and
  // a wrong RoPE base.
  const LlamaConfig cfg = model_config(false);
  Experiment ex;
  ex.data.prefill = P;
  const StreamInfo replay = cell_stream(ex, Cell{1, 0, {0, 1}}, n, model_recording_meta(cfg, "m", "s", n));
  StreamInfo old = model_cache_stream(cfg, 1, 0, n, GqaMode::kv_head, GroupAgg::mean, P, false);
  REQUIRE(differences(old, replay).empty());
  old.rope_applied = false, old.rope_theta = 0, old.softmax_scale = 0;
  CHECK(differences(old, replay) == "softmax_scale rope_theta rope_applied ");
  StreamInfo theta = model_cache_stream(cfg, 1, 0, n, GqaMode::kv_head, GroupAgg::mean, P, false);
  theta.rope_theta = 10000.0;
  CHECK(differences(theta, replay) == "rope_theta ");
}

namespace {

/// A prompt of P positions with random keys, values and (global layers') scaled queries; a local layer's K and V
/// cut to the rows [P − rows, P − rows + keep) when rows > 0 (keep = rows unless given), else whole.
PromptTensors random_prompt(const LlamaConfig& cfg, int64_t P, int64_t rows, uint64_t seed, int64_t keep = -1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  auto rnd = [&](int64_t r) {
    MatF m(r, cfg.head_dim());
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
    return m;
  };
  PromptTensors pt;
  pt.P = P;
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      MatF k = rnd(P), v = rnd(P);
      if (cfg.layer_window(l) > 0 && rows > 0) {
        k = MatF(k.middleRows(P - rows, keep < 0 ? rows : keep)), v = MatF(v.middleRows(P - rows, keep < 0 ? rows : keep));
      }
      pt.k.push_back(k), pt.v.push_back(v);
    }
    for (int h = 0; h < cfg.n_heads; ++h) pt.q.push_back(cfg.layer_window(l) > 0 ? MatD() : MatD(rnd(P).cast<double>() * 0.1));
  }
  return pt;
}

/// The outputs [layer][n_heads · head_dim] of `a` at positions P … P + steps − 1 for seeded random q, k, v.
std::vector<std::vector<float>> decode_outputs(KVAttention& a, const LlamaConfig& cfg, int64_t P, int steps) {
  std::mt19937_64 rng(99);
  std::normal_distribution<float> nd;
  const int hd = cfg.head_dim();
  std::vector<std::vector<float>> out;
  for (int s = 0; s < steps; ++s)
    for (int l = 0; l < cfg.n_layers; ++l) {
      std::vector<float> q(size_t(cfg.n_heads) * hd), k(size_t(cfg.n_kv_heads) * hd), v(k.size()), o(q.size());
      for (auto* x : {&q, &k, &v})
        for (float& f : *x) f = nd(rng);
      a.attend(l, int(P + s), q.data(), k.data(), v.data(), o.data());
      out.push_back(o);
    }
  return out;
}

}  // namespace

TEST_CASE("closed loop: a local layer's prompt may hold only its window's rows, for every cache and the evict_needle control",
          "[model][closed_loop]") {
  const LlamaConfig cfg = model_config(true);  // sliding window 16
  const int64_t P = 40, w = cfg.sliding_window;
  REQUIRE(cfg.layer_window(0) == w);
  const PromptTensors full = random_prompt(cfg, P, 0, 5), tail = random_prompt(cfg, P, w, 5);
  // Negative control: the window's rows shifted by one position (the last 16 rows but one, and one before them).
  const PromptTensors shifted = random_prompt(cfg, P, w + 1, 5, w);
  REQUIRE(tail.k[0].rows() == w);
  REQUIRE(tail.k[0].row(0) == full.k[0].row(P - w));
  Params budget;
  budget.set("budget", int64_t(20));
  auto policy_outputs = [&](const PromptTensors& pt) {
    PolicyKVAttention a(cfg, PolicySpec{"h2o", "h2o", budget}, P + 8, 3, GqaMode::kv_head, GroupAgg::mean, P);
    a.load_prompt(pt);
    return decode_outputs(a, cfg, P, 8);
  };
  CHECK(policy_outputs(tail) == policy_outputs(full));
  CHECK(policy_outputs(shifted) != policy_outputs(full));
  PromptTensors short_tail = random_prompt(cfg, P, w - 1, 5);
  CHECK_THROWS_WITH(policy_outputs(short_tail), Catch::Contains("local layer 0 holds 15 key rows"));
  // evict_needle: spans inside a local window (and before it) drop the same tokens either way.
  for (const std::vector<Span>& evict : {std::vector<Span>{{30, 33}}, std::vector<Span>{{2, 5}, {35, 37}}}) {
    task_detail::EvictSpanAttention a_full(cfg, full, evict), a_tail(cfg, tail, evict), a_shift(cfg, shifted, evict);
    const auto o = decode_outputs(a_full, cfg, P, 20);  // 20 steps: the window slides past the prompt's rows
    CHECK(decode_outputs(a_tail, cfg, P, 20) == o);
    CHECK(decode_outputs(a_shift, cfg, P, 20) != o);
    CHECK(a_tail.mean_cache_tokens() == a_full.mean_cache_tokens());
  }
}
