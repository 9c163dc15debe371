#include "kvsim/cli/inspect.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "kvsim/core/error.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/replay/reference.hpp"

namespace kvsim {

std::string inspect_recording(const std::string& path, int64_t max_tokens) {
  RecordingReader rec(path);
  const auto& m = rec.meta();
  std::ostringstream o;
  o << "file:          " << path << "\n"
    << "schema:        kvsim_schema 1\n"
    << "model:         " << m.model << "\n"
    << "source:        " << m.source << "\n"
    << "layers:        " << m.n_layers;
  if (!m.subset_layers.empty()) {
    o << " (the model's layers";
    for (size_t i = 0; i < m.subset_layers.size(); ++i) o << (i ? ", " : " ") << m.subset_layers[i];
    o << ": subset_layers)";
  }
  o << "\n"
    << "heads:         " << m.n_heads << " query, " << m.n_kv_heads << " kv (group size " << m.group_size() << ")\n"
    << "head_dim:      " << m.head_dim << "\n"
    << "tokens:        " << m.n_tokens << "\n"
    << "softmax_scale: " << m.softmax_scale << "\n"
    << "rope:          " << m.rope << "\n";
  auto ce = rec.cross_entropy();
  if (!ce.empty()) {
    double s = 0;
    for (double x : ce) s += x;
    o << "cross-entropy: " << s / double(ce.size()) << " nats/token over " << ce.size() << " predictions\n";
  }
  o << "datasets:      /layer_LLL/{q [" << m.n_heads << ", " << m.n_tokens << ", " << m.head_dim << "], k, v ["
    << m.n_kv_heads << ", " << m.n_tokens << ", " << m.head_dim << "]}" << (rec.has(0, Tensor::attn) ? " + attn" : "")
    << (rec.tokens().empty() ? "" : " + /tokens") << "\n\n";
  const int64_t n = std::min(m.n_tokens, max_tokens);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%5s %9s %9s %9s %9s %10s %10s %10s\n", "layer", "mean|q|", "mean|k|", "mean|v|",
                "max|q~|", "logit min", "logit max", "logit mean");
  o << buf;
  for (int l = 0; l < m.n_layers; ++l) {
    double sq = 0, sk = 0, sv = 0, rmax = 0, lmin = INFINITY, lmax = -INFINITY, lsum = 0;
    int64_t lcount = 0;
    std::vector<MatD> K(m.n_kv_heads);
    for (int h = 0; h < m.n_kv_heads; ++h) {
      MatF k = rec.read(l, Tensor::k, h);
      MatF v = rec.read(l, Tensor::v, h);
      sk += k.rowwise().norm().cast<double>().sum();
      sv += v.rowwise().norm().cast<double>().sum();
      K[h] = k.topRows(n).cast<double>();
    }
    for (int h = 0; h < m.n_heads; ++h) {
      MatF q = rec.read(l, Tensor::q, h);
      auto qn = q.rowwise().norm().cast<double>();
      sq += qn.sum();
      rmax = std::max(rmax, qn.maxCoeff() * m.softmax_scale);
      MatD L = (q.topRows(n).cast<double>() * m.softmax_scale) * K[m.kv_head_of(h)].transpose();
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i <= t; ++i) {
          double x = L(t, i);
          lmin = std::min(lmin, x);
          lmax = std::max(lmax, x);
          lsum += x;
          ++lcount;
        }
    }
    double nq = double(m.n_heads) * m.n_tokens, nk = double(m.n_kv_heads) * m.n_tokens;
    std::snprintf(buf, sizeof buf, "%5d %9.4g %9.4g %9.4g %9.4g %10.4g %10.4g %10.4g\n", l, sq / nq, sk / nk, sv / nk, rmax,
                  lmin, lmax, lsum / double(lcount));
    o << buf;
  }
  if (n < m.n_tokens) o << "(logit statistics over the first " << n << " tokens)\n";
  return o.str();
}

AttentionCheck check_recorded_attention(const std::string& path, const std::vector<int>& layers) {
  RecordingReader rec(path);
  const auto& m = rec.meta();
  AttentionCheck res;
  res.layers = layers;
  if (res.layers.empty())
    for (int l = 0; l < m.n_layers; ++l) res.layers.push_back(l);
  std::vector<int64_t> all_steps(m.n_tokens);
  for (int64_t t = 0; t < m.n_tokens; ++t) all_steps[t] = t + 1;
  for (int l : res.layers) {
    if (l < 0 || l >= m.n_layers)
      throw Error(path + ": layer " + std::to_string(l) + " out of range [0, " + std::to_string(m.n_layers) + ")");
    if (!rec.has(l, Tensor::attn))
      throw Error(path + ": /layer_" + std::to_string(l) +
                  " has no 'attn' dataset (record or export with the attention output to check fidelity)");
    double worst = 0;
    for (int kvh = 0; kvh < m.n_kv_heads; ++kvh) {
      const MatD K = rec.read(l, Tensor::k, kvh).cast<double>();
      const MatD V = rec.read(l, Tensor::v, kvh).cast<double>();
      for (int h = 0; h < m.n_heads; ++h) {
        if (m.kv_head_of(h) != kvh) continue;
        const MatF Q = rec.read(l, Tensor::q, h), A = rec.read(l, Tensor::attn, h);
        // A sliding-window layer: step t attends to its last w tokens (exact_attention's window).
        const int64_t window = m.is_local(l) ? m.layer_window(l) : 0;
        for (size_t b = 0; b < all_steps.size();) {
          const size_t e = reference_block_end(all_steps, b);
          ReferenceBlock ref;
          exact_attention(Q, K, V, m.softmax_scale, std::vector<int64_t>(all_steps.begin() + b, all_steps.begin() + e), ref,
                          window);
          for (size_t r = 0; r + b < e; ++r) {
            const int64_t t = all_steps[b + r] - 1;
            const double dn = (ref.out.row(r) - A.row(t).cast<double>()).norm(), an = ref.out.row(r).norm();
            worst = std::max(worst, an > 0 ? dn / an : dn);
          }
          b = e;
        }
      }
    }
    res.worst.push_back(worst);
  }
  return res;
}

}  // namespace kvsim
