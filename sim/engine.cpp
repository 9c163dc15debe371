#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <tuple>
#include <mutex>
#include <thread>

#include "kvsim/error.hpp"
#include "kvsim/results.hpp"
#include "kvsim/experiment.hpp"
#include "kvsim/cuda_reference.hpp"
#include "kvsim/objectives.hpp"
#include "kvsim/reference.hpp"
#include "kvsim/rng.hpp"

namespace kvsim {

const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> n{"rel_err",     "eps_spectral", "tau_rel_err",  "kept_mass",
                                          "oracle_mass", "mass_ratio",   "attention_loss", "cache_tokens",
                                          "cache_bytes", "clusters",     "policy_ns",  "log_value",
                                          "log_opt",     "fl_value",     "fl_greedy",    "fl_opt",
                                          "fl_ratio",    "thm44"};
  return n;
}

double metric_value(const MetricRow& r, size_t i) {
  const double v[] = {r.rel_err,    r.eps_spectral,   r.tau_rel_err,  r.kept_mass, r.oracle_mass,
                      r.mass_ratio, r.attention_loss, r.cache_tokens, r.cache_bytes, r.clusters, r.policy_ns,
                      r.log_value,  r.log_opt,        r.fl_value,     r.fl_greedy, r.fl_opt,
                      r.fl_ratio,   r.thm44};
  return v[i];
}

std::vector<int64_t> eval_steps(const EvalSpec& e, int64_t n) {
  std::vector<int64_t> s;
  for (int64_t t = std::max<int64_t>(1, e.from); t <= n; t += e.every) s.push_back(t);
  if (s.empty() || s.back() != n) s.push_back(n);
  return s;
}

std::unique_ptr<StreamSource> open_source(const DataSpec& d) {
  if (d.synthetic) return std::make_unique<SynthSource>(d.synth);
  return std::make_unique<RecordingReader>(d.path);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Cell {
  int layer;
  int kv_head;
  std::vector<int> heads;  // selected query heads of this KV group
};

/// Top-m sum of probs[0..t) (the best any set of m tokens can keep).
double top_mass(const double* p, int64_t t, int64_t m, std::vector<double>& scratch) {
  if (m >= t) {
    double s = 0;
    for (int64_t j = 0; j < t; ++j) s += p[j];
    return s;
  }
  if (m <= 0) return 0;
  scratch.assign(p, p + t);
  std::nth_element(scratch.begin(), scratch.begin() + (m - 1), scratch.end(), std::greater<double>());
  double s = 0;
  for (int64_t j = 0; j < m; ++j) s += scratch[j];
  return s;
}

/// The instances of one policy spec inside a cell: one (kv_head mode) or one per query head.
struct PolicyRun {
  std::vector<std::unique_ptr<Policy>> inst;
  bool every = false, oracle = false;
  int64_t t = 0;                 // tokens observed so far
  int64_t memory_tokens = -1;    // equal-memory target (param `memory`), -1 = none
  double ns_since_eval = 0;
  int64_t steps_since_eval = 0;
};

void run_cell(const Experiment& ex, const StreamSource& src, const Cell& cell, int64_t n,
              std::vector<std::vector<MetricRow>>& out /* [policy] */) {
  const auto& meta = src.meta();
  const int d = meta.head_dim;
  const int G = static_cast<int>(cell.heads.size());
  const double scale = meta.softmax_scale;
  MatF Kf = src.read(cell.layer, Tensor::k, cell.kv_head).topRows(n);
  MatF Vf = src.read(cell.layer, Tensor::v, cell.kv_head).topRows(n);
  MatD K = Kf.cast<double>(), V = Vf.cast<double>();
  std::vector<MatF> Q(G);
  std::vector<MatD> Qs(G);
  for (int g = 0; g < G; ++g) {
    Q[g] = src.read(cell.layer, Tensor::q, cell.heads[g]).topRows(n);
    Qs[g] = Q[g].cast<double>() * scale;
  }
  const bool per_query = ex.eval.gqa == "query_head";
  const size_t P = ex.policies.size();
  std::vector<PolicyRun> runs(P);
  for (size_t p = 0; p < P; ++p) {
    StreamInfo info;
    info.n = n;
    info.head_dim = d;
    info.group_agg = ex.eval.group_agg;
    info.policy_f32 = ex.eval.policy_precision == "float32";
    int n_inst = per_query ? G : 1;
    info.n_queries = per_query ? 1 : G;
    for (int i = 0; i < n_inst; ++i) {
      uint64_t head_id = per_query ? uint64_t(cell.heads[i]) : uint64_t(cell.kv_head) + (1ULL << 32);
      info.seed = derive_seed({ex.seed, uint64_t(cell.layer), head_id, uint64_t(p), 0});
      auto inst = make_policy(ex.policies[p].name, ex.policies[p].params, info);
      // `[eval] device = "cuda"`: policies with a GPU replay run there (sim/policies/gpu_replay.cpp).
      if (ex.eval.device == "cuda")
        if (inst->gpu_replay()) {
          std::vector<const MatF*> qs;
          if (per_query) qs.push_back(&Q[i]);
          else
            for (int g = 0; g < G; ++g) qs.push_back(&Q[g]);
          inst = make_gpu_replay(std::move(inst), std::move(qs), Kf, Vf, scale, eval_steps(ex.eval, n));
        }
      runs[p].inst.push_back(std::move(inst));
    }
    runs[p].every = runs[p].inst[0]->needs_every_query();
    runs[p].memory_tokens = memory_target_tokens(ex.policies[p].params, n);
    runs[p].oracle = runs[p].inst[0]->needs_exact_probs();
  }

  // Global attention scores (column sums of the full causal attention) for non-causal oracles.
  bool want_global = false;
  for (auto& run : runs) want_global |= run.inst[0]->needs_global_scores();
  if (want_global) {
    std::vector<VecD> global(G);
    for (int g = 0; g < G; ++g) global[g] = global_attention_scores(Q[g], K, scale);
    for (auto& run : runs) {
      if (!run.inst[0]->needs_global_scores()) continue;
      for (size_t i = 0; i < run.inst.size(); ++i) {
        std::vector<const VecD*> mine;
        if (per_query) mine.push_back(&global[i]);
        else
          for (int g = 0; g < G; ++g) mine.push_back(&global[g]);
        run.inst[i]->set_global_scores(mine);
      }
    }
  }

  // Full causal attention of the first T_obj queries (for the facility-location objective).
  const int64_t t_obj = ex.eval.objectives ? std::min(n, ex.eval.objectives_max_t) : 0;
  std::vector<MatD> attn_all(G);
  if (t_obj > 0) {
    std::vector<int64_t> all(t_obj);
    for (int64_t t = 0; t < t_obj; ++t) all[t] = t + 1;
    ReferenceBlock blk;
    for (int g = 0; g < G; ++g) {
      exact_attention(Q[g], K, V, scale, all, blk);
      attn_all[g] = std::move(blk.probs);
    }
  }
  std::map<std::tuple<int, int64_t, int64_t>, std::pair<double, double>> greedy_cache;  // (g, t, m) -> greedy, opt

  const std::vector<int64_t> steps = eval_steps(ex.eval, n);
  for (size_t p = 0; p < P; ++p) out[p].reserve(size_t(G) * steps.size());  // exact: no growth slack
  OperatorNormTracker opn(d);
  int64_t opn_t = 0;
  std::vector<ReferenceBlock> ref(G);
  std::vector<VecD> prow(G);  // a float32 block's probability row, widened when read
  std::vector<double> scratch;
  MatD qgroup(G, d), qone(1, d);
  std::vector<Answer> answers(G), one(1);
  std::vector<const double*> probs_group(G), probs_one(1);

  const bool ref_f32 = ex.eval.reference_precision == "float32";
  size_t b0 = 0;
  while (b0 < steps.size()) {
    // Block of evaluated steps so that rows × t_max stays ≤ 4M doubles per query head.
    const size_t b1 = reference_block_end(steps, b0, ref_f32 ? kReferenceRowsF32 : 256);
    std::vector<int64_t> block(steps.begin() + b0, steps.begin() + b1);
    for (int g = 0; g < G; ++g) {
      if (ex.eval.device == "cuda") cuda::exact_attention_block(Q[g], Kf, Vf, scale, block, ref[g]);
      else if (ref_f32) exact_attention_f32(Q[g], Kf, Vf, scale, block, ref[g]);
      else exact_attention(Q[g], K, V, scale, block, ref[g]);
    }
    std::vector<double> opnorm(block.size());
    for (size_t r = 0; r < block.size(); ++r) {
      for (; opn_t < block[r]; ++opn_t) opn.add(Vf.row(opn_t).data());
      opnorm[r] = opn.op_norm();
    }
    for (size_t p = 0; p < P; ++p) {
      PolicyRun& run = runs[p];
      size_t r = 0;
      while (run.t < block.back()) {
        const int64_t t = run.t + 1;  // step t: token index t-1 joins, then query q_t
        const bool is_eval = (t == block[r]);
        auto t0 = Clock::now();
        for (auto& inst : run.inst) inst->observe(t - 1, Kf.row(t - 1).data(), Vf.row(t - 1).data());
        if (run.every || is_eval) {
          if (is_eval)  // fresh answers: nothing may leak from the previous policy's answer
            for (int g = 0; g < G; ++g) answers[g] = Answer{};
          if (per_query) {
            for (int g = 0; g < G; ++g) {
              qone.row(0) = Qs[g].row(t - 1);
              one[0] = Answer{};
              probs_one[0] = (is_eval && run.oracle) ? ref[g].probs_row(r, prow[g]) : nullptr;
              run.inst[g]->attend(t, qone, is_eval ? &one : nullptr, (is_eval && run.oracle) ? &probs_one : nullptr);
              if (is_eval) answers[g] = std::move(one[0]);
            }
          } else {
            for (int g = 0; g < G; ++g) {
              qgroup.row(g) = Qs[g].row(t - 1);
              probs_group[g] = (is_eval && run.oracle) ? ref[g].probs_row(r, prow[g]) : nullptr;
            }
            run.inst[0]->attend(t, qgroup, is_eval ? &answers : nullptr, (is_eval && run.oracle) ? &probs_group : nullptr);
          }
        }
        run.ns_since_eval += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        ++run.steps_since_eval;
        run.t = t;
        if (!is_eval) continue;
        double bytes = 0;
        for (auto& inst : run.inst) bytes += double(inst->cache_vectors()) * d * sizeof(float);
        if (run.memory_tokens > 0) {
          const bool capacity = run.inst[0]->capacity_matched();
          const double per_token = 2.0 * d * sizeof(float) * double(run.inst.size());
          const double target = double(capacity ? run.memory_tokens : std::min(run.memory_tokens, t)) * per_token;
          if (capacity ? bytes > 1.02 * target : std::abs(bytes - target) > 0.02 * target)
            throw Error("policy '" + ex.policies[p].label + "' cannot be matched on memory" +
                        (capacity ? std::string(" (capacity rule: never above the target)") : std::string(" at every step")) +
                        ": at step " + std::to_string(t) + " (layer " + std::to_string(cell.layer) + ", KV head " +
                        std::to_string(cell.kv_head) + ") it stores " + std::to_string(int64_t(bytes)) +
                        " bytes vs the target " + std::to_string(int64_t(target)) +
                        " (±2%); compare it with 'budget'-style parameters instead");
        }
        for (int g = 0; g < G; ++g) {
          const Answer& a = answers[g];
          const Policy& inst = *run.inst[per_query ? g : 0];
          const double* pr = ref[g].probs_row(r, prow[g]);
          MetricRow m;
          m.layer = cell.layer;
          m.head = cell.heads[g];
          m.step = t;
          if (a.z.size() != d) throw Error("policy '" + ex.policies[p].label + "' returned an answer of the wrong size");
          VecD diff = a.z - ref[g].out.row(r).transpose();
          double dn = diff.norm();
          double an = ref[g].out.row(r).norm();
          m.rel_err = an > 0 ? dn / an : (dn == 0 ? 0 : INFINITY);
          double denom = ref[g].probs_norm[r] * opnorm[r];
          m.eps_spectral = denom > 0 ? dn / denom : (dn == 0 ? 0 : INFINITY);
          m.tau_rel_err = std::isnan(a.log_tau) ? NAN : std::abs(std::expm1(a.log_tau - ref[g].log_tau[r]));
          double tokens = double(inst.cache_tokens());
          if (a.has_kept) {
            double km = 0;
            for (int64_t j : a.kept) km += pr[j];
            m.kept_mass = km;
            m.oracle_mass = top_mass(pr, t, int64_t(a.kept.size()), scratch);
            m.mass_ratio = m.oracle_mass > 0 ? km / m.oracle_mass : NAN;
            m.attention_loss = 1 - km;
            tokens = double(a.kept.size());
          } else {
            m.kept_mass = m.mass_ratio = m.attention_loss = NAN;
            m.oracle_mass = top_mass(pr, t, inst.cache_tokens(), scratch);
          }
          m.cache_tokens = tokens;
          m.cache_bytes = bytes;
          m.clusters = inst.clusters();
          m.policy_ns = run.ns_since_eval / double(run.steps_since_eval);
          if (ex.eval.objectives) {
            if (a.has_kept) m.log_value = std::log1p(m.kept_mass);
            m.log_opt = std::log1p(m.oracle_mass);
            const bool due = t <= t_obj && (t % ex.eval.objectives_every == 0 || t == n);
            if (due && a.has_kept) {
              m.fl_value = facility_value(attn_all[g], t, a.kept);
              const int64_t size = int64_t(a.kept.size());
              auto key = std::make_tuple(g, t, size);
              auto it = greedy_cache.find(key);
              if (it == greedy_cache.end())
                it = greedy_cache.emplace(key, std::make_pair(facility_greedy(attn_all[g], t, size),
                                                              facility_brute(attn_all[g], t, size))).first;
              m.fl_greedy = it->second.first;
              m.fl_opt = it->second.second;
              m.fl_ratio = m.fl_greedy > 0 ? m.fl_value / m.fl_greedy : NAN;
              m.thm44 = theorem44_verdict(m.fl_value, m.fl_greedy, m.fl_opt, ex.eval.theorem44_alpha,
                                          ex.eval.theorem44_beta);
            }
          }
          out[p].push_back(m);
        }
        run.ns_since_eval = 0;
        run.steps_since_eval = 0;
        ++r;
      }
    }
    b0 = b1;
  }
}

}  // namespace

RunResult run_experiment(const Experiment& ex, const StreamSource& src, int threads,
                         const std::function<void(int, int)>& progress, ResultSpill* spill) {
  const auto& meta = src.meta();
  if (ex.policies.empty()) throw Error("experiment '" + ex.name + "': no [[policy]] entries");
  if (ex.eval.every < 1) throw Error("eval.every must be ≥ 1");
  if (ex.eval.gqa != "kv_head" && ex.eval.gqa != "query_head")
    throw Error("eval.gqa must be \"kv_head\" or \"query_head\", got \"" + ex.eval.gqa + "\"");
  if (ex.eval.group_agg != "mean" && ex.eval.group_agg != "max" && ex.eval.group_agg != "sum")
    throw Error("eval.group_agg must be \"mean\", \"max\" or \"sum\", got \"" + ex.eval.group_agg + "\"");
  RunResult res;
  res.meta = meta;
  res.source = src.describe();
  res.n_tokens = ex.data.tokens > 0 ? std::min(ex.data.tokens, meta.n_tokens) : meta.n_tokens;
  res.threads = std::max(1, threads);
  std::vector<int> layers = ex.data.layers;
  if (layers.empty())
    for (int l = 0; l < meta.n_layers; ++l) layers.push_back(l);
  for (int l : layers)
    if (l < 0 || l >= meta.n_layers)
      throw Error("data.layers: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(meta.n_layers) + ")");
  std::vector<int> heads = ex.data.heads;
  if (heads.empty())
    for (int h = 0; h < meta.n_heads; ++h) heads.push_back(h);
  for (int h : heads)
    if (h < 0 || h >= meta.n_heads)
      throw Error("data.heads: head " + std::to_string(h) + " is out of range [0, " + std::to_string(meta.n_heads) + ")");
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  res.layers = layers;

  std::vector<Cell> cells;
  for (int l : layers)
    for (int kv = 0; kv < meta.n_kv_heads; ++kv) {
      Cell c{l, kv, {}};
      for (int h : heads)
        if (meta.kv_head_of(h) == kv) c.heads.push_back(h);
      if (!c.heads.empty()) cells.push_back(std::move(c));
    }
  // Validate policy parameters once, up front, so a typo fails before any work.
  {
    StreamInfo info;
    info.n = res.n_tokens;
    info.head_dim = meta.head_dim;
    for (const auto& p : ex.policies) make_policy(p.name, p.params, info);
  }

  if (spill) {
    const size_t per_head = eval_steps(ex.eval, res.n_tokens).size();
    std::vector<size_t> rows_per_cell;
    for (const auto& c : cells) rows_per_cell.push_back(c.heads.size() * per_head);
    spill->begin(rows_per_cell);
  }
  std::vector<std::vector<std::vector<MetricRow>>> cell_out(cells.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr err;
  std::mutex mu;
  int done = 0;
  auto t0 = Clock::now();
  auto worker = [&] {
    for (;;) {
      size_t i = next++;
      if (i >= cells.size() || failed) return;
      try {
        cell_out[i].resize(ex.policies.size());
        run_cell(ex, src, cells[i], res.n_tokens, cell_out[i]);
        if (spill) {
          spill->write_cell(i, cell_out[i]);
          std::vector<std::vector<MetricRow>>().swap(cell_out[i]);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!err) err = std::current_exception();
        failed = true;
        return;
      }
      std::lock_guard<std::mutex> lk(mu);
      ++done;
      if (progress) progress(done, int(cells.size()));
    }
  };
  std::vector<std::thread> pool;
  int nt = std::min<int>(res.threads, std::max<size_t>(1, cells.size()));
  for (int i = 1; i < nt; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
  res.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  res.policies.resize(ex.policies.size());
  for (size_t p = 0; p < ex.policies.size(); ++p) {
    res.policies[p].spec = ex.policies[p];
    // Exact reservation, then each cell's rows are moved and freed at once: the rows exist once in
    // memory (not twice, nor in a doubling vector's spare capacity).
    size_t total = 0;
    for (auto& c : cell_out) total += c.empty() ? 0 : c[p].size();
    auto& rows = res.policies[p].rows;
    rows.reserve(total);
    for (auto& c : cell_out) {
      if (c.empty()) continue;  // spilled to disk
      rows.insert(rows.end(), std::make_move_iterator(c[p].begin()), std::make_move_iterator(c[p].end()));
      std::vector<MetricRow>().swap(c[p]);
    }
  }
  return res;
}

}  // namespace kvsim
