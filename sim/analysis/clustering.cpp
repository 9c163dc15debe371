#include "kvsim/analysis/clustering.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kvsim/core/error.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/analysis/subgen_algorithm.hpp"

namespace kvsim {

std::vector<int64_t> greedy_kcenter(const MatD& X, int64_t k) {
  const int64_t n = X.rows();
  std::vector<int64_t> chosen;
  if (n == 0 || k <= 0) return chosen;
  VecD dist = VecD::Constant(n, INFINITY);
  int64_t next = 0;
  while (int64_t(chosen.size()) < std::min(k, n)) {
    chosen.push_back(next);
    double far = -1;
    int64_t farthest = 0;
    for (int64_t i = 0; i < n; ++i) {
      dist[i] = std::min(dist[i], (X.row(i) - X.row(next)).squaredNorm());
      if (dist[i] > far) {
        far = dist[i];
        farthest = i;
      }
    }
    next = farthest;
  }
  return chosen;
}

int64_t nearest_row(const MatD& centers, const VecD& x) {
  int64_t best = 0;
  double bd = INFINITY;
  for (int64_t i = 0; i < centers.rows(); ++i) {
    double d = (centers.row(i).transpose() - x).squaredNorm();
    if (d < bd) {
      bd = d;
      best = i;
    }
  }
  return best;
}

namespace {

double median_norm(const MatF& X) {
  std::vector<double> n(X.rows());
  for (int64_t i = 0; i < X.rows(); ++i) n[i] = X.row(i).norm();
  std::nth_element(n.begin(), n.begin() + n.size() / 2, n.end());
  return n[n.size() / 2];
}

/// m' after each power-of-two prefix (and the last n) of SubGen's online δ-clustering of X's rows.
std::vector<std::pair<int64_t, int64_t>> cluster_counts(const MatF& X, double delta) {
  SubGenConfig c;
  c.delta = delta;
  c.s = 1;
  c.t = 1;
  SubGen sg(c, int(X.cols()), 1);
  std::vector<std::pair<int64_t, int64_t>> out;
  const float zero_v = 0;
  std::vector<float> v(X.cols(), zero_v);
  for (int64_t i = 0; i < X.rows(); ++i) {
    sg.update(i, X.row(i).data(), v.data());
    const int64_t n = i + 1;
    if ((n & (n - 1)) == 0 || n == X.rows()) out.emplace_back(n, sg.clusters());
  }
  return out;
}

double loglog_slope(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() < 2) return NAN;
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += std::log(x[i]);
    my += std::log(y[i]);
  }
  mx /= double(x.size());
  my /= double(y.size());
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (std::log(x[i]) - mx) * (std::log(y[i]) - my);
    sxx += (std::log(x[i]) - mx) * (std::log(x[i]) - mx);
  }
  return sxx > 0 ? sxy / sxx : NAN;
}

/// pca.csv rows of one (layer, tensor): each vector's first two principal components and whether
/// greedy k-center picked it.
void pca_rows(const MatF& X, int64_t n_centers, int l, const char* tname, std::ostream& pca) {
  MatD Xd = X.cast<double>();
  VecD mu = Xd.colwise().mean().transpose();
  MatD C = Xd.rowwise() - mu.transpose();
  Eigen::SelfAdjointEigenSolver<MatD> es(C.transpose() * C);
  const int d = int(Xd.cols());
  MatD P = C * es.eigenvectors().rightCols(std::min(2, d)).rowwise().reverse();
  auto centers = greedy_kcenter(Xd, n_centers);
  std::vector<char> is_center(X.rows(), 0);
  for (int64_t c : centers) is_center[c] = 1;
  for (int64_t i = 0; i < X.rows(); ++i)
    pca << l << ',' << tname << ',' << i << ',' << P(i, 0) << ',' << (P.cols() > 1 ? P(i, 1) : 0.0) << ','
        << int(is_center[i]) << '\n';
}

/// Writes name → text files into out_dir, each atomically.
void write_files(const std::string& out_dir, const std::vector<std::pair<std::string, std::string>>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create output folder: " + ec.message());
  for (const auto& [name, body] : files) write_file_atomically((fs::path(out_dir) / name).string(), body);
}

/// premises.csv rows for one layer: per KV head and per δ multiple, SubGen Theorem 1's premises —
/// r = max ‖q̃‖ over the head's query group, δ·r against ln n, the per-head cluster growth exponent γ,
/// and the sizes Theorem 1 asks for at ε (s = c_s·d/ε², t = c_t·e^{2δr}·ln n/ε²: kvsim's constants) —
/// with a verdict: "sublinear" when δ·r ≤ ln n (a finite-n stand-in for δ·r = o(log n)), γ < 1 and
/// the stored vectors m'(1 + t) + 2s are fewer than the full cache's 2n; else the failing premises.
void premise_rows(RecordingReader& rec, int l, const ClusterStudy& s, std::ostream& out, std::ostream& summary,
                  const std::string& data) {
  const auto& m = rec.meta();
  const int G = m.n_heads / m.n_kv_heads;
  const double ln_n = std::log(double(std::max<int64_t>(m.n_tokens, 2))), eps = s.premise_eps;
  out << std::setprecision(12);
  for (int h = 0; h < m.n_kv_heads; ++h) {
    double r = 0;
    for (int g = 0; g < G; ++g)
      r = std::max(r, double(rec.read(l, Tensor::q, h * G + g).rowwise().norm().maxCoeff()) * m.softmax_scale);
    const MatF K = rec.read(l, Tensor::k, h);
    const double med = median_norm(K);
    for (double rel : s.premise_deltas) {
      const double delta = rel * med, dr = delta * r;
      std::vector<double> xs, ys;
      int64_t last = 0;
      for (auto [n, c] : cluster_counts(K, delta)) {
        last = c;
        if (n >= 16) xs.push_back(double(n)), ys.push_back(double(c));
      }
      const double gamma = loglog_slope(xs, ys);
      const double t = 0.05 / (eps * eps) * std::exp(2 * dr) * ln_n, sv = std::ceil(32.0 * m.head_dim / (eps * eps));
      const double vectors = double(last) * (1 + std::ceil(t)) + 2 * sv, full = 2.0 * double(m.n_tokens);
      std::string verdict;
      if (!(dr <= ln_n)) verdict += "delta*r > ln n;";
      if (!(gamma < 1)) verdict += "keys do not cluster (gamma >= 1);";
      if (!(vectors < full)) verdict += "m'(1+t)+2s >= 2n;";
      if (verdict.empty()) verdict = "sublinear";
      else verdict.pop_back();
      out << l << ',' << h << ',' << rel << ',' << delta << ',' << r << ',' << dr << ',' << ln_n << ',' << gamma << ','
          << last << ',' << t << ',' << sv << ',' << vectors << ',' << full << ',' << csv_field(verdict) << data;
      char buf[256];
      std::snprintf(buf, sizeof buf, "%5d %7d %6.2f %8.3g %7.3g %6.3f %6lld %10.3g %s\n", l, h, rel, dr, r, gamma,
                    (long long)last, t, verdict.c_str());
      summary << buf;
    }
  }
}

/// The layers a study covers: clusters.layers, or by default the global layers, as `kvsim run`
/// replays them. A local (sliding-window) layer's keys beyond its window are never attended to, so
/// their clusters say nothing about what a cache there must hold; name such layers to study them anyway.
std::vector<int> study_layers(const ClusterStudy& s, const RecordingMeta& m) {
  std::vector<int> layers = s.layers;
  if (layers.empty()) {
    for (int l = 0; l < m.n_layers; ++l)
      if (!m.is_local(l)) layers.push_back(l);
    if (layers.empty()) throw Error(s.path + ": every layer is local (layer_windows); name them in clusters.layers");
  }
  for (int l : layers)
    if (l < 0 || l >= m.n_layers) throw Error("clusters.layers: layer " + std::to_string(l) + " out of range");
  return layers;
}

}  // namespace

std::string run_cluster_study(const ClusterStudy& s, const std::string& out_dir) {
  namespace fs = std::filesystem;
  RecordingReader rec(s.path);
  const auto& m = rec.meta();
  const std::vector<int> layers = study_layers(s, m);
  if (!(s.delta_rel > 0)) throw Error("clusters.delta_rel must be > 0");
  std::ostringstream counts, fit, pca, summary;
  counts << "layer,kv_head,tensor,n,clusters\n";
  // The last columns name the data set (model and recording file names, tokens, δ multiple) for titles.
  fit << "layer,tensor,delta,delta_r,gamma,clusters_at_n,model,recording,n_tokens,delta_rel\n";
  std::ostringstream data_cols;
  data_cols << ',' << csv_field(fs::path(m.model).stem().string()) << ',' << csv_field(fs::path(s.path).filename().string())
            << ',' << m.n_tokens << ',' << s.delta_rel << '\n';
  const std::string data = data_cols.str();
  pca << "layer,tensor,index,pc1,pc2,center\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%5s %6s %9s %9s %7s %9s\n", "layer", "tensor", "delta", "delta*r", "gamma", "m'(n)");
  summary << "clusterability of " << s.path << " (" << m.n_tokens << " tokens), delta = " << s.delta_rel
          << " x median norm";
  if (int(layers.size()) < m.n_layers && s.layers.empty()) {
    summary << "; global layers";
    for (int l : layers) summary << ' ' << l;
    summary << " of " << m.n_layers << " (the others are local: clusters.layers names them)";
  }
  summary << '\n' << buf;
  for (int l : layers) {
    // r = the largest scaled query norm of the layer (SubGen Theorem 1's bound).
    double r = 0;
    for (int h = 0; h < m.n_heads; ++h)
      r = std::max(r, double(rec.read(l, Tensor::q, h).rowwise().norm().maxCoeff()) * m.softmax_scale);
    for (Tensor which : {Tensor::k, Tensor::v}) {
      const char* tname = which == Tensor::k ? "key" : "value";
      std::map<int64_t, double> mean_m;
      double delta_sum = 0;
      for (int h = 0; h < m.n_kv_heads; ++h) {
        MatF X = rec.read(l, which, h);
        const double delta = s.delta_rel * median_norm(X);
        delta_sum += delta;
        for (auto [n, c] : cluster_counts(X, delta)) {
          counts << l << ',' << h << ',' << tname << ',' << n << ',' << c << '\n';
          mean_m[n] += double(c) / m.n_kv_heads;
        }
        if (h == 0) pca_rows(X, s.centers, l, tname, pca);
      }
      std::vector<double> xs, ys;
      for (auto [n, c] : mean_m)
        if (n >= 16) {
          xs.push_back(double(n));
          ys.push_back(c);
        }
      const double gamma = loglog_slope(xs, ys);
      const double delta = delta_sum / m.n_kv_heads;
      const double dr = which == Tensor::k ? delta * r : NAN;
      const double last = mean_m.rbegin()->second;
      fit << l << ',' << tname << ',' << delta << ',' << dr << ',' << gamma << ',' << last << data;
      std::snprintf(buf, sizeof buf, "%5d %6s %9.4g %9.4g %7.3f %9.1f\n", l, tname, delta, dr, gamma, last);
      summary << buf;
    }
  }
  std::ostringstream prem;
  prem << "layer,kv_head,delta_rel,delta,r,delta_r,ln_n,gamma,clusters_at_n,t_thm1,s_thm1,subgen_vectors,full_vectors,"
          "verdict,model,recording,n_tokens,eps\n";
  std::snprintf(buf, sizeof buf, "%5s %7s %6s %8s %7s %6s %6s %10s %s\n", "layer", "kv_head", "delta", "delta*r", "r", "gamma",
                "m'(n)", "t (Thm 1)", "verdict");
  summary << "\nSubGen Theorem 1's premises per KV head (eps = " << s.premise_eps << ", delta = multiple x median key norm):\n" << buf;
  std::ostringstream pdata;
  pdata << ',' << csv_field(fs::path(m.model).stem().string()) << ',' << csv_field(fs::path(s.path).filename().string())
        << ',' << m.n_tokens << ',' << s.premise_eps << '\n';
  for (int l : layers) premise_rows(rec, l, s, prem, summary, pdata.str());
  write_files(out_dir, {{"clusters.csv", counts.str()}, {"clusters_fit.csv", fit.str()}, {"pca.csv", pca.str()},
                        {"premises.csv", prem.str()}});
  summary << "wrote " << out_dir << "/clusters.csv, clusters_fit.csv, pca.csv, premises.csv\n";
  return summary.str();
}

}  // namespace kvsim
