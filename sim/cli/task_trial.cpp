#include "task_trial.hpp"

#include <algorithm>
#include <cmath>

#include "kvsim/core/error.hpp"
#include "kvsim/model/record.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim::task_detail {

TrialTensors exact_tensors(const LlamaModel& model, const std::vector<int>& tokens, int threads) {
  TrialTensors t;
  const int L = model.config().n_layers;
  t.q.resize(size_t(L));
  t.k.resize(size_t(L));
  t.v.resize(size_t(L));
  model.prefill(
      tokens, threads,
      [&](int l, const MatF& Q, const MatF& K, const MatF& V, const MatF&) {
        t.q[size_t(l)] = Q;
        t.k[size_t(l)] = K;
        t.v[size_t(l)] = V;
      },
      [](int, const MatF&) {});
  return t;
}

PromptTensors context_tensors(const TrialTensors& t, const LlamaConfig& cfg, int64_t P) {
  const int hd = cfg.head_dim();
  const double scale = cfg.attn_scale();
  PromptTensors pt;
  pt.P = P;
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      pt.k.push_back(t.k[size_t(l)].block(0, int64_t(h) * hd, P, hd));
      pt.v.push_back(t.v[size_t(l)].block(0, int64_t(h) * hd, P, hd));
    }
    for (int h = 0; h < cfg.n_heads; ++h)
      pt.q.push_back(cfg.layer_window(l) > 0 ? MatD() : MatD(t.q[size_t(l)].block(0, int64_t(h) * hd, P, hd).cast<double>() * scale));
  }
  return pt;
}

TrialSource::TrialSource(const TrialTensors& t, const LlamaConfig& cfg, const std::string& model)
    : t_(t), meta_(model_recording_meta(cfg, model, "kvsim task", t.q.empty() ? 0 : t.q[0].rows())) {}

MatF TrialSource::read(int layer, Tensor which, int head) const {
  const int hd = meta_.head_dim;
  const auto& src = which == Tensor::q ? t_.q : which == Tensor::k ? t_.k : which == Tensor::v ? t_.v : t_.q;
  if (which == Tensor::attn) throw Error("retrieval trial: no attention output is kept");
  return src.at(size_t(layer)).middleCols(int64_t(head) * hd, hd);
}

EvictSpanAttention::EvictSpanAttention(const LlamaConfig& cfg, const PromptTensors& prompt, const std::vector<Span>& evict)
    : cfg_(cfg), prompt_len_(prompt.P) {
  const int64_t P = prompt.P;
  std::vector<char> drop(size_t(P), 0);
  for (const Span& s : evict)
    for (int64_t j = std::max(0, s.begin); j < std::min<int64_t>(s.end, P); ++j) drop[size_t(j)] = 1;
  for (int64_t j = 0; j < P; ++j)
    if (!drop[size_t(j)]) kept_.push_back(j);
  const int64_t kept = int64_t(kept_.size());
  for (size_t i = 0; i < prompt.k.size(); ++i) {
    MatD K(kept, cfg.head_dim()), V(kept, cfg.head_dim());
    for (int64_t r = 0; r < kept; ++r) {
      K.row(r) = prompt.k[i].row(kept_[size_t(r)]).cast<double>();
      V.row(r) = prompt.v[i].row(kept_[size_t(r)]).cast<double>();
    }
    k_.push_back(std::move(K));
    v_.push_back(std::move(V));
  }
}

void EvictSpanAttention::attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) {
  const int hd = cfg_.head_dim(), G = cfg_.n_heads / cfg_.n_kv_heads, w = cfg_.layer_window(layer);
  const double scale = cfg_.attn_scale();
  // A local layer sees the kept tokens at positions ≥ pos − w + 1: rows from r0 on (kept prompt
  // positions in order, then one row per decoded position from prompt_len_).
  int64_t r0 = 0;
  if (const int64_t lo = int64_t(pos) - w + 1; w > 0 && lo > 0)
    r0 = lo <= prompt_len_ ? int64_t(std::lower_bound(kept_.begin(), kept_.end(), lo) - kept_.begin())
                           : int64_t(kept_.size()) + (lo - prompt_len_);
  for (int kvh = 0; kvh < cfg_.n_kv_heads; ++kvh) {
    MatD& K = k_[size_t(layer) * cfg_.n_kv_heads + kvh];
    MatD& V = v_[size_t(layer) * cfg_.n_kv_heads + kvh];
    K.conservativeResize(K.rows() + 1, Eigen::NoChange);
    V.conservativeResize(V.rows() + 1, Eigen::NoChange);
    K.row(K.rows() - 1) = Eigen::Map<const VecF>(k + kvh * hd, hd).cast<double>().transpose();
    V.row(V.rows() - 1) = Eigen::Map<const VecF>(v + kvh * hd, hd).cast<double>().transpose();
    const MatD Kw = r0 ? MatD(K.bottomRows(K.rows() - r0)) : MatD(), Vw = r0 ? MatD(V.bottomRows(V.rows() - r0)) : MatD();
    for (int g = 0; g < G; ++g) {
      const int h = kvh * G + g;
      const VecD qh = Eigen::Map<const VecF>(q + h * hd, hd).cast<double>() * scale;
      VecD z;
      double ls;
      if (r0 == 0) attend_cached(K, V, K.rows(), qh, z, ls);
      else attend_cached(Kw, Vw, Kw.rows(), qh, z, ls);
      Eigen::Map<VecF>(out + h * hd, hd) = z.cast<float>();
    }
  }
}

double EvictSpanAttention::mean_cache_tokens() const {  // over the global layers, as PolicyKVAttention
  double s = 0;
  int64_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i)
    if (cfg_.layer_window(int(i / size_t(cfg_.n_kv_heads))) == 0) s += double(k_[i].rows()), ++n;
  return n ? s / double(n) : 0;
}

std::vector<int> stop_tokens(const Tokenizer& tok) {
  return {tok.eos_id(), tok.control_id("<|im_end|>"), tok.control_id("<end_of_turn>")};
}

std::vector<int> exact_generation(const TaskConfig& c, const LlamaModel& model, const TrialTensors& tt, const TaskTrial& tr,
                                  int threads) {
  const auto& cfg = model.config();
  const int total = int(tr.tokens.size()) + c.generate;
  PolicyKVAttention exact(cfg, PolicySpec{"exact", "exact", Params{}}, total, c.seed, c.eval.gqa, c.eval.group_agg,
                          tr.question_begin, c.eval.policy_precision == Precision::float32);
  exact.load_prompt(context_tensors(tt, cfg, tr.question_begin));
  return batched_greedy(model, tr.tokens, tr.question_begin, total, nullptr, {&exact}, threads).at(0);
}

void link_trial(const TaskConfig& c, const LlamaModel& model, const std::vector<PolicySpec>& specs, const TaskTrial& tr,
                const TrialTensors& tt, const std::vector<int>& exact_generated, const std::vector<int>& stop, int threads,
                std::vector<TaskRow*>& rows) {
  if (specs.empty()) return;
  if (c.link_steps == "question") {
    const TrialSource src(tt, model.config(), c.checkpoint);
    open_loop_link(c, specs, tr, src, tr.question_begin + 1, threads, rows);
    return;
  }
  const int64_t L = int64_t(tr.tokens.size());
  std::vector<int> tokens = tr.tokens;
  for (size_t i = size_t(L); i < exact_generated.size(); ++i) {
    if (std::find(stop.begin(), stop.end(), exact_generated[i]) != stop.end()) break;
    tokens.push_back(exact_generated[i]);
  }
  const TrialTensors ta = exact_tensors(model, tokens, threads);
  const TrialSource src(ta, model.config(), c.checkpoint);
  open_loop_link(c, specs, tr, src, L, threads, rows);
}

}  // namespace kvsim::task_detail
