#include "kvsim/inspect.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "kvsim/recording.hpp"

namespace kvsim {

std::string inspect_recording(const std::string& path, int64_t max_tokens) {
  RecordingReader rec(path);
  const auto& m = rec.meta();
  std::ostringstream o;
  o << "file:          " << path << "\n"
    << "schema:        kvsim_schema 1\n"
    << "model:         " << m.model << "\n"
    << "source:        " << m.source << "\n"
    << "layers:        " << m.n_layers << "\n"
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

}  // namespace kvsim
