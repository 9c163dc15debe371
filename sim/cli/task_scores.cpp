// kvsim task's offline scores (TaskRow::topk_kept …; docs/tasks.md, "Offline scores"): scores of a
// policy's open-loop replay at the link's steps ([task] link_steps) that need no needle position and no policy's generation,
// the candidates for predicting whether the model still answers.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "kvsim/cli/task.hpp"
#include "kvsim/replay/engine.hpp"
#include "kvsim/replay/metrics.hpp"
#include "task_trial.hpp"

namespace kvsim {
namespace {

/// A mean that skips NaN (a metric that does not apply to the row).
struct Mean {
  double sum = 0;
  int64_t n = 0;
  void add(double x) {
    if (!std::isnan(x)) sum += x, ++n;
  }
  double value() const { return n ? sum / double(n) : NAN; }
};

}  // namespace

/// The offline scores of TaskRow, as trials.csv's and the checkpoint's columns (after needle_kept_share).
const std::vector<ScoreColumn>& offline_score_columns() {
  static const std::vector<ScoreColumn> columns = {
      {"topk_kept", &TaskRow::topk_kept},
      {"rel_err_rheads", &TaskRow::rel_err_rheads},
      {"kept_mass_rheads", &TaskRow::kept_mass_rheads},
      {"topk_kept_rheads", &TaskRow::topk_kept_rheads},
      {"rel_err_worst_layer", &TaskRow::rel_err_worst_layer},
      {"kept_mass_worst_layer", &TaskRow::kept_mass_worst_layer},
      {"topk_kept_worst_layer", &TaskRow::topk_kept_worst_layer},
  };
  return columns;
}

/// The retrieval heads of an open loop (TaskRow's offline scores): the ⌈10%⌉ of its (layer, query
/// head) pairs with the largest mean topk_mass (a property of the exact rows, the same for every
/// policy), ties to the earlier pair.
std::set<std::pair<int, int>> retrieval_heads(const RunResult& res) {
  const size_t kTm = metric_index("topk_mass");
  std::map<std::pair<int, int>, Mean> conc;
  for (const auto& pol : res.policies)
    for (const auto& row : pol.rows) conc[{row.layer, row.head}].add(row.value[kTm]);
  std::vector<std::pair<double, std::pair<int, int>>> order;
  for (const auto& [key, m] : conc)
    if (m.n) order.push_back({m.value(), key});
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const size_t r = std::min(order.size(), std::max<size_t>(1, (order.size() + 9) / 10));
  std::set<std::pair<int, int>> out;
  for (size_t i = 0; i < r; ++i) out.insert(order[i].second);
  return out;
}

/// Per policy, the offline scores that need no needle position (TaskRow::topk_kept …) from its rows.
void offline_scores(const PolicyResult& pol, const std::set<std::pair<int, int>>& rheads, TaskRow& r) {
  const size_t idx[3] = {metric_index("rel_err"), metric_index("kept_mass"), metric_index("topk_kept")};
  Mean all_topk, rh[3];
  std::map<int, std::array<Mean, 3>> layer;
  for (const auto& row : pol.rows) {
    all_topk.add(row.value[idx[2]]);
    const bool retrieval = rheads.count({row.layer, row.head}) > 0;
    for (int i = 0; i < 3; ++i) {
      if (retrieval) rh[i].add(row.value[idx[i]]);
      layer[row.layer][size_t(i)].add(row.value[idx[i]]);
    }
  }
  double worst[3] = {NAN, NAN, NAN};  // rel_err: the largest layer mean; kept_mass, topk_kept: the smallest
  for (const auto& [l, m] : layer)
    for (int i = 0; i < 3; ++i) {
      const double v = m[size_t(i)].value();
      if (std::isnan(v)) continue;
      if (std::isnan(worst[i]) || (i == 0 ? v > worst[i] : v < worst[i])) worst[i] = v;
    }
  r.topk_kept = all_topk.value();
  r.rel_err_rheads = rh[0].value(), r.kept_mass_rheads = rh[1].value(), r.topk_kept_rheads = rh[2].value();
  r.rel_err_worst_layer = worst[0], r.kept_mass_worst_layer = worst[1], r.topk_kept_worst_layer = worst[2];
}

namespace task_detail {

/// Per policy, the means over its open-loop rows (layer, query head, step ≥ from) of the link's
/// metrics and the offline scores, written into rows[p].
void open_loop_link(const TaskConfig& c, const std::vector<PolicySpec>& specs, const TaskTrial& tr, const TrialSource& src,
                    int64_t from, int threads, std::vector<TaskRow*>& rows) {
  Experiment ex;
  ex.name = c.name;
  ex.seed = c.seed;
  ex.data.prefill = tr.question_begin;
  ex.eval = c.eval;
  ex.eval.from = from;
  ex.eval.every = 1;
  if (ex.eval.topk == 0) ex.eval.topk = 16;  // TaskRow's offline scores
  for (const Span& sp : tr.evidence) ex.eval.needle_spans.push_back({sp.begin, sp.end});
  ex.policies = specs;
  const RunResult res = run_experiment(ex, src, threads);
  const std::set<std::pair<int, int>> rheads = retrieval_heads(res);
  const size_t kRel = metric_index("rel_err"), kKept = metric_index("kept_mass"), kNm = metric_index("needle_mass"),
               kNkm = metric_index("needle_kept_mass"), kNk = metric_index("needle_kept"), kEps = metric_index("eps_spectral");
  for (size_t p = 0; p < specs.size(); ++p) {
    double sum[6] = {0, 0, 0, 0, 0, 0}, nkm_all = 0, nm_all = 0;
    int64_t cnt[6] = {0, 0, 0, 0, 0, 0};
    for (const auto& row : res.policies[p].rows) {
      const size_t idx[6] = {kRel, kKept, kNm, kNkm, kNk, kEps};
      for (int i = 0; i < 6; ++i)
        if (!std::isnan(row.value[idx[i]])) sum[i] += row.value[idx[i]], ++cnt[i];
      if (!std::isnan(row.value[kNkm])) nkm_all += row.value[kNkm], nm_all += row.value[kNm];
    }
    auto mean = [&](int i) { return cnt[i] ? sum[i] / double(cnt[i]) : NAN; };
    TaskRow& r = *rows[p];
    r.rel_err = mean(0), r.kept_mass = mean(1), r.needle_mass = mean(2), r.needle_kept_mass = mean(3), r.needle_kept = mean(4), r.eps = mean(5);
    r.needle_kept_share = nm_all > 0 ? nkm_all / nm_all : NAN;
    offline_scores(res.policies[p], rheads, r);
  }
}

}  // namespace task_detail
}  // namespace kvsim
