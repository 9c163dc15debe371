#include "task_trial.hpp"

#include <algorithm>
#include <cmath>

#include "kvsim/core/error.hpp"
#include "kvsim/model/record.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim::task_detail {

TrialTensors exact_tensors(const LlamaModel& model, const std::vector<int>& tokens, int threads, int64_t context_end) {
  if (context_end < 0 || context_end > int64_t(tokens.size()))
    throw Error("retrieval trial: context end " + std::to_string(context_end) + " is outside the " +
                std::to_string(tokens.size()) + "-token prompt");
  const auto& cfg = model.config();
  TrialTensors t;
  t.tokens = int64_t(tokens.size());
  const int L = cfg.n_layers;
  t.q.resize(size_t(L));
  t.k.resize(size_t(L));
  t.v.resize(size_t(L));
  t.row0.assign(size_t(L), 0);
  model.prefill(
      tokens, threads,
      [&](int l, const MatF& Q, const MatF& K, const MatF& V, const MatF&) {
        // A local layer (a window shorter than the prompt, RecordingMeta::is_local): its window's rows before context_end.
        if (const int64_t w = cfg.layer_window(l); w > 0 && w < int64_t(tokens.size())) {
          const int64_t r0 = std::max<int64_t>(0, context_end - w);
          t.row0[size_t(l)] = r0;
          t.k[size_t(l)] = K.middleRows(r0, context_end - r0);
          t.v[size_t(l)] = V.middleRows(r0, context_end - r0);
          return;
        }
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
    const int64_t w = cfg.layer_window(l), lo = w > 0 ? std::max<int64_t>(0, P - w) : 0, r0 = t.row0.at(size_t(l));
    if (lo < r0 || P > r0 + t.k[size_t(l)].rows())
      throw Error("retrieval trial: layer " + std::to_string(l) + "'s tensors hold positions " + std::to_string(r0) + " … " +
                  std::to_string(r0 + t.k[size_t(l)].rows() - 1) + ", not the " + std::to_string(lo) + " … " +
                  std::to_string(P - 1) + " a " + std::to_string(P) + "-token context needs");
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      pt.k.push_back(t.k[size_t(l)].block(lo - r0, int64_t(h) * hd, P - lo, hd));
      pt.v.push_back(t.v[size_t(l)].block(lo - r0, int64_t(h) * hd, P - lo, hd));
    }
    for (int h = 0; h < cfg.n_heads; ++h)
      pt.q.push_back(w > 0 ? MatD() : MatD(t.q[size_t(l)].block(0, int64_t(h) * hd, P, hd).cast<double>() * scale));
  }
  return pt;
}

TrialSource::TrialSource(const TrialTensors& t, const LlamaConfig& cfg, const std::string& model)
    : t_(t), meta_(model_recording_meta(cfg, model, "kvsim task", t.tokens)) {}

MatF TrialSource::read(int layer, Tensor which, int head) const {
  const int hd = meta_.head_dim;
  const auto& src = which == Tensor::q ? t_.q : which == Tensor::k ? t_.k : which == Tensor::v ? t_.v : t_.q;
  if (which == Tensor::attn) throw Error("retrieval trial: no attention output is kept");
  if (meta_.is_local(layer)) throw Error("retrieval trial: local layer " + std::to_string(layer) + "'s tensors are not kept");
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
  for (size_t i = 0; i < prompt.k.size(); ++i) {
    const int64_t off = P - prompt.k[i].rows();  // a local layer's K and V may hold the prompt's last rows only
    const size_t first = size_t(std::lower_bound(kept_.begin(), kept_.end(), off) - kept_.begin());
    const int64_t kept = int64_t(kept_.size() - first);
    MatD K(kept, cfg.head_dim()), V(kept, cfg.head_dim());
    for (int64_t r = 0; r < kept; ++r) {
      K.row(r) = prompt.k[i].row(kept_[first + size_t(r)] - off).cast<double>();
      V.row(r) = prompt.v[i].row(kept_[first + size_t(r)] - off).cast<double>();
    }
    k_.push_back(std::move(K));
    v_.push_back(std::move(V));
    first_.push_back(first);
  }
}

void EvictSpanAttention::attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) {
  const int hd = cfg_.head_dim(), G = cfg_.n_heads / cfg_.n_kv_heads, w = cfg_.layer_window(layer);
  const double scale = cfg_.attn_scale();
  for (int kvh = 0; kvh < cfg_.n_kv_heads; ++kvh) {
    const size_t i = size_t(layer) * cfg_.n_kv_heads + kvh;
    MatD& K = k_[i];
    MatD& V = v_[i];
    // A local layer sees the kept tokens at positions ≥ pos − w + 1: rows from r0 on (kept prompt
    // positions in order from kept_[first_[i]], then one row per decoded position from prompt_len_).
    int64_t r0 = 0;
    if (const int64_t lo = int64_t(pos) - w + 1; w > 0 && lo > 0)
      r0 = (lo <= prompt_len_ ? int64_t(std::lower_bound(kept_.begin(), kept_.end(), lo) - kept_.begin())
                              : int64_t(kept_.size()) + (lo - prompt_len_)) - int64_t(first_[i]);
    if (r0 < 0) throw Error("evict_needle: position " + std::to_string(pos) + " reads layer " + std::to_string(layer) + "'s window before the rows it holds");
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
  const TrialTensors ta = exact_tensors(model, tokens, threads, 0);  // the open loop reads no local layer
  const TrialSource src(ta, model.config(), c.checkpoint);
  open_loop_link(c, specs, tr, src, L, threads, rows);
}

}  // namespace kvsim::task_detail
