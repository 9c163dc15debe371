// A run's plan (include/kvsim/replay/engine.hpp, RunPlan): the config checked against the stream and
// split into (layer, KV head) cells, before any work.
#include <algorithm>
#include <filesystem>
#include <set>

#include "kvsim/core/error.hpp"
#include "kvsim/replay/engine.hpp"

namespace kvsim {

std::vector<int64_t> eval_steps(const EvalSpec& e, int64_t n) {
  std::vector<int64_t> s;
  for (int64_t t = std::max<int64_t>(1, e.from); t <= n; t += e.every) s.push_back(t);
  if (s.empty() || s.back() != n) s.push_back(n);
  return s;
}

bool is_objective_step(const EvalSpec& e, int64_t t, int64_t n) {
  return e.objectives && t <= std::min(n, e.objectives_max_t) && (t % e.objectives_every == 0 || t == n);
}

void check_objective_steps(const EvalSpec& e, int64_t n) {
  if (!e.objectives) return;
  for (int64_t t : eval_steps(e, n))
    if (is_objective_step(e, t, n)) return;
  throw Error("eval.objectives = true, but no evaluated step is an objective step: eval.every = " + std::to_string(e.every) +
              " from eval.from = " + std::to_string(e.from) + " never meets a multiple of eval.objectives_every = " +
              std::to_string(e.objectives_every) + " up to eval.objectives_max_t = " + std::to_string(e.objectives_max_t) +
              " (n = " + std::to_string(n) + "), so every H2O objective would be missing");
}

std::unique_ptr<StreamSource> open_source(const DataSpec& d) {
  if (d.synthetic) return std::make_unique<SynthSource>(d.synth);
  if (!std::filesystem::exists(d.path)) {
    // The recipe (a shell command run from the repository root) only when it makes this file:
    // it names the file, or, for `kvsim record --windows`, the file without its `_wNN` suffix.
    std::string file = std::filesystem::path(d.path).filename().string();
    const size_t w = file.rfind("_w");
    if (d.recipe.find(file) == std::string::npos && w != std::string::npos && file.size() == w + 7 &&
        file.compare(w + 4, 3, ".h5") == 0)
      file = file.substr(0, w) + ".h5";
    throw Error(d.path + ": no such recording" +
                (file.empty() || d.recipe.find(file) == std::string::npos
                     ? std::string(" (make one with kvsim record, kvsim synth or datasets/export_hf.py)")
                     : "; make it with: " + d.recipe));
  }
  return std::make_unique<RecordingReader>(d.path);
}

namespace {

void validate_eval(const Experiment& ex) {
  if (ex.policies.empty()) throw Error("experiment '" + ex.name + "': no [[policy]] entries");
  if (ex.eval.every < 1) throw Error("eval.every must be ≥ 1");
}

/// `data.layers` / `data.heads` (empty = all layers, or the global ones when the recording has
/// local sliding-window layers shorter than itself and `data.local_layers` is "exact": cache policies
/// matter on global layers), range-checked; the (layer, KV head) cells they select. A local layer is
/// replayed only with `data.local_layers = "replay"` (its exact reference is then window attention).
std::vector<Cell> plan_cells(const DataSpec& data, const RecordingMeta& meta, std::vector<int>& layers) {
  layers = data.layers;
  if (layers.empty())
    for (int l = 0; l < meta.n_layers; ++l)
      if (data.replay_local || !meta.is_local(l)) layers.push_back(l);
  if (layers.empty()) throw Error("the recording has no global layer (layer_windows: every layer is local)");
  for (int l : layers) {
    if (l < 0 || l >= meta.n_layers) {
      std::string held;  // a layer-subset recording numbers its layers 0, 1, …: say which model layers they are
      for (size_t i = 0; i < meta.subset_layers.size(); ++i)
        held += (i ? ", " : "") + std::to_string(meta.subset_layers[i]) + " as " + std::to_string(i);
      throw Error("data.layers: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(meta.n_layers) + ")" +
                  (held.empty() ? "" : " (this recording holds the model's layers " + held + ")"));
    }
    if (meta.is_local(l) && !data.replay_local)
      throw Error("data.layers: layer " + std::to_string(l) + " is a local layer (sliding window of " +
                  std::to_string(meta.layer_window(l)) + " tokens); set data.local_layers = \"replay\" to replay it against window attention");
  }
  std::vector<int> heads = data.heads;
  if (heads.empty())
    for (int h = 0; h < meta.n_heads; ++h) heads.push_back(h);
  for (int h : heads)
    if (h < 0 || h >= meta.n_heads)
      throw Error("data.heads: head " + std::to_string(h) + " is out of range [0, " + std::to_string(meta.n_heads) + ")");
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  std::vector<Cell> cells;
  for (int l : layers)
    for (int kv = 0; kv < meta.n_kv_heads; ++kv) {
      Cell c{l, kv, {}};
      for (int h : heads)
        if (meta.kv_head_of(h) == kv) c.heads.push_back(h);
      if (!c.heads.empty()) cells.push_back(std::move(c));
    }
  return cells;
}

}  // namespace

std::vector<size_t> RunPlan::rows_per_cell() const {
  std::vector<size_t> out;
  for (const auto& c : cells) out.push_back(c.heads.size() * steps.size());
  return out;
}

RunPlan plan_run(const Experiment& ex, const StreamSource& src) {
  const auto& meta = src.meta();
  validate_eval(ex);
  RunPlan plan;
  plan.ex = &ex;
  plan.src = &src;
  plan.n = ex.data.tokens > 0 ? std::min(ex.data.tokens, meta.n_tokens) : meta.n_tokens;
  const int64_t n = plan.n;
  if (ex.data.prefill < 0 || ex.data.prefill >= n)
    throw Error("data.prefill (" + std::to_string(ex.data.prefill) + ") must be in [0, " + std::to_string(n) +
                "): the stream has " + std::to_string(n) + " tokens and at least one must be decoded");
  if (ex.data.prefill > 0 && ex.eval.from <= ex.data.prefill)
    throw Error("eval.from (" + std::to_string(ex.eval.from) + ") must be > data.prefill (" +
                std::to_string(ex.data.prefill) + "): the prompt's steps are not decoded");
  plan.metrics = metric_columns(ex.eval);
  check_objective_steps(ex.eval, n);
  plan.cells = plan_cells(ex.data, meta, plan.layers);
  if (ex.eval.device == Device::cuda)
    for (int l : plan.layers)
      if (meta.is_local(l))
        throw Error("data.local_layers = \"replay\": layer " + std::to_string(l) +
                    " is local, and window attention is not on the GPU path yet (use [eval] device = \"cpu\")");
  // The policies' parameters checked once against the real stream, before any work: one instance of
  // each policy per planned cell shape (its layer and group size), as the cells will build them.
  std::set<std::pair<int, size_t>> shapes;
  for (const auto& c : plan.cells)
    if (shapes.insert({c.layer, c.heads.size()}).second)
      for (size_t p = 0; p < ex.policies.size(); ++p) make_cell_policy(ex, meta, c, n, p);
  plan.steps = eval_steps(ex.eval, n);
  return plan;
}

}  // namespace kvsim
