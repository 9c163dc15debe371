#include "task_trial.hpp"

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
  const double scale = 1.0 / std::sqrt(double(hd));
  PromptTensors pt;
  pt.P = P;
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      pt.k.push_back(t.k[size_t(l)].block(0, int64_t(h) * hd, P, hd));
      pt.v.push_back(t.v[size_t(l)].block(0, int64_t(h) * hd, P, hd));
    }
    for (int h = 0; h < cfg.n_heads; ++h) pt.q.push_back(t.q[size_t(l)].block(0, int64_t(h) * hd, P, hd).cast<double>() * scale);
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

EvictSpanAttention::EvictSpanAttention(const LlamaConfig& cfg, const PromptTensors& prompt, int64_t begin, int64_t end)
    : cfg_(cfg) {
  const int64_t P = prompt.P, kept = P - (std::min(end, P) - std::min(begin, P));
  for (size_t i = 0; i < prompt.k.size(); ++i) {
    MatD K(kept, cfg.head_dim()), V(kept, cfg.head_dim());
    int64_t r = 0;
    for (int64_t j = 0; j < P; ++j)
      if (j < begin || j >= end) {
        K.row(r) = prompt.k[i].row(j).cast<double>();
        V.row(r++) = prompt.v[i].row(j).cast<double>();
      }
    k_.push_back(std::move(K));
    v_.push_back(std::move(V));
  }
}

void EvictSpanAttention::attend(int layer, int, const float* q, const float* k, const float* v, float* out) {
  const int hd = cfg_.head_dim(), G = cfg_.n_heads / cfg_.n_kv_heads;
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int kvh = 0; kvh < cfg_.n_kv_heads; ++kvh) {
    MatD& K = k_[size_t(layer) * cfg_.n_kv_heads + kvh];
    MatD& V = v_[size_t(layer) * cfg_.n_kv_heads + kvh];
    K.conservativeResize(K.rows() + 1, Eigen::NoChange);
    V.conservativeResize(V.rows() + 1, Eigen::NoChange);
    K.row(K.rows() - 1) = Eigen::Map<const VecF>(k + kvh * hd, hd).cast<double>().transpose();
    V.row(V.rows() - 1) = Eigen::Map<const VecF>(v + kvh * hd, hd).cast<double>().transpose();
    for (int g = 0; g < G; ++g) {
      const int h = kvh * G + g;
      const VecD qh = Eigen::Map<const VecF>(q + h * hd, hd).cast<double>() * scale;
      VecD z;
      double ls;
      attend_cached(K, V, K.rows(), qh, z, ls);
      Eigen::Map<VecF>(out + h * hd, hd) = z.cast<float>();
    }
  }
}

double EvictSpanAttention::mean_cache_tokens() const {
  double s = 0;
  for (const auto& K : k_) s += double(K.rows());
  return k_.empty() ? 0 : s / double(k_.size());
}

}  // namespace kvsim::task_detail
