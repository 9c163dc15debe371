#include "kvsim/io/synth.hpp"

#include <unistd.h>

#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_01.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>
#include <sstream>

#include "kvsim/core/rng.hpp"

namespace kvsim {

const std::vector<std::string>& synth_presets() {
  static const std::vector<std::string> p{"gaussian", "clustered", "heavy_hitter"};
  return p;
}

void SynthParams::validate(const std::string& where) const {
  auto bad = [&](const std::string& key, const std::string& why) { throw Error(where + key + ": " + why); };
  bool known = false;
  for (auto& s : synth_presets()) known |= (s == preset);
  if (!known) bad("preset", "unknown synthetic preset '" + preset + "' (gaussian, clustered, heavy_hitter)");
  if (n <= 0 || n > (int64_t(1) << 31)) bad("n", "must be a number of tokens in [1, 2^31]");
  if (head_dim <= 0 || head_dim > 4096) bad("d", "head_dim must be in [1, 4096]");
  if (n_layers <= 0 || n_layers > 4096) bad("layers", "must be in [1, 4096]");
  if (n_heads <= 0 || n_heads > 4096) bad("heads", "must be in [1, 4096]");
  // One head's q, k and v in memory at once (float32), against this machine's physical memory.
  const double need = 3.0 * double(n) * double(head_dim) * 4.0;
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (phys > 0 && need > phys / 2)
    bad("n", "n = " + std::to_string(n) + " tokens × d = " + std::to_string(head_dim) + " needs " +
                 std::to_string(need / double(1 << 30)).substr(0, 6) + " GiB per head (q, k, v), more than half of this machine's " +
                 std::to_string(phys / double(1 << 30)).substr(0, 6) + " GiB");
  if (n_kv_heads <= 0 || n_heads % n_kv_heads) bad("kv_heads", "must be positive and divide heads");
  if (softmax_scale < 0 || !std::isfinite(softmax_scale)) bad("softmax_scale", "must be ≥ 0 (0 = 1/sqrt(d))");
  if (!(q_scale > 0 && k_scale > 0 && v_scale > 0)) bad("q_scale/k_scale/v_scale", "must be positive");
  if (!(cluster_c > 0)) bad("cluster_c", "must be positive");
  if (!(cluster_gamma >= 0 && cluster_gamma <= 1)) bad("cluster_gamma", "must be in [0, 1]");
  if (!(cluster_diameter >= 0)) bad("cluster_diameter", "must be ≥ 0");
  if (!(center_scale > 0)) bad("center_scale", "must be positive");
  if (!(query_norm >= 0)) bad("query_norm", "must be ≥ 0");
  if (n_heavy < 0) bad("n_heavy", "must be ≥ 0");
}

int64_t SynthParams::clusters_after(int64_t t) const {
  if (t <= 0) return 0;
  return static_cast<int64_t>(std::ceil(cluster_c * std::pow(double(t), cluster_gamma) - 1e-9));
}

SynthSource::SynthSource(const SynthParams& p) : p_(p) {
  p_.validate("synthetic.");
  meta_.model = "synthetic:" + p.preset;
  meta_.source = describe();
  meta_.rope = "none";
  meta_.n_layers = p.n_layers;
  meta_.n_heads = p.n_heads;
  meta_.n_kv_heads = p.n_kv_heads;
  meta_.head_dim = p.head_dim;
  meta_.n_tokens = p.n;
  meta_.softmax_scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(p.head_dim));
}

std::string SynthSource::describe() const {
  std::ostringstream s;
  s << "kvsim synth --preset " << p_.preset << " --n " << p_.n << " --d " << p_.head_dim << " --layers " << p_.n_layers
    << " --heads " << p_.n_heads << " --kv-heads " << p_.n_kv_heads << " --seed " << p_.seed;
  return s.str();
}

namespace {
enum Tag : uint64_t { kQ = 1, kK = 2, kV = 3, kCenter = 4, kLabels = 5, kDir = 6, kHeavy = 7 };

void fill_gaussian(MatF& m, Engine& eng, double sigma) {
  boost::random::normal_distribution<double> nd(0.0, sigma);
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) m(i, j) = static_cast<float>(nd(eng));
}

/// A uniform point in the d-ball of radius `radius`.
Eigen::VectorXd ball_point(Engine& eng, int d, double radius) {
  boost::random::normal_distribution<double> nd;
  boost::random::uniform_01<double> u;
  Eigen::VectorXd x(d);
  for (int j = 0; j < d; ++j) x[j] = nd(eng);
  double nrm = x.norm();
  if (nrm == 0) return Eigen::VectorXd::Zero(d);
  return x * (radius * std::pow(u(eng), 1.0 / d) / nrm);
}

Eigen::VectorXd unit_dir(Engine& eng, int d) {
  boost::random::normal_distribution<double> nd;
  Eigen::VectorXd x(d);
  for (int j = 0; j < d; ++j) x[j] = nd(eng);
  return x / x.norm();
}

/// Heavy positions: token 0 plus n_heavy-1 distinct random positions.
std::vector<int64_t> heavy_positions(const SynthParams& p, int layer, int kvh) {
  std::vector<int64_t> pos;
  if (p.n_heavy <= 0) return pos;
  pos.push_back(0);
  Engine eng = make_engine({p.seed, uint64_t(layer), uint64_t(kvh), kHeavy});
  boost::random::uniform_int_distribution<int64_t> ud(1, std::max<int64_t>(1, p.n - 1));
  int64_t want = std::min<int64_t>(p.n_heavy, p.n);
  while (int64_t(pos.size()) < want) {
    int64_t c = ud(eng);
    if (std::find(pos.begin(), pos.end(), c) == pos.end()) pos.push_back(c);
  }
  return pos;
}
}  // namespace

std::vector<int32_t> SynthSource::cluster_labels(int layer, int kvh) const {
  if (p_.preset != "clustered") return {};
  std::vector<int32_t> lab(p_.n);
  Engine eng = make_engine({p_.seed, uint64_t(layer), uint64_t(kvh), kLabels});
  int64_t open = 0;
  for (int64_t t = 1; t <= p_.n; ++t) {
    int64_t m = p_.clusters_after(t);
    if (m > open) {
      open = m;
      lab[t - 1] = static_cast<int32_t>(open - 1);  // the newest cluster gets its first member now
    } else {
      boost::random::uniform_int_distribution<int64_t> ud(0, open - 1);
      lab[t - 1] = static_cast<int32_t>(ud(eng));
    }
  }
  return lab;
}

MatF SynthSource::read(int layer, Tensor which, int head) const {
  const int d = p_.head_dim;
  const int64_t n = p_.n;
  int heads = (which == Tensor::q) ? p_.n_heads : p_.n_kv_heads;
  if (which == Tensor::attn) throw Error(describe() + ": synthetic streams have no recorded attention output");
  if (layer < 0 || layer >= p_.n_layers || head < 0 || head >= heads)
    throw Error(describe() + ": layer/head out of range (" + std::to_string(layer) + ", " + std::to_string(head) + ")");
  const int kvh = which == Tensor::q ? meta_.kv_head_of(head) : head;
  const uint64_t tag = which == Tensor::q ? kQ : which == Tensor::k ? kK : kV;
  Engine eng = make_engine({p_.seed, uint64_t(layer), uint64_t(head), tag});
  MatF m(n, d);
  const double scale = meta_.softmax_scale;

  if (which == Tensor::v) {
    fill_gaussian(m, eng, p_.v_scale);
    return m;
  }
  if (p_.preset == "gaussian") {
    fill_gaussian(m, eng, which == Tensor::q ? p_.q_scale : p_.k_scale);
  } else if (p_.preset == "clustered") {
    if (which == Tensor::q) {
      // ‖scale·q‖ ≤ r  ⇔  ‖q‖ ≤ r / scale.
      for (int64_t i = 0; i < n; ++i) m.row(i) = ball_point(eng, d, p_.query_norm / scale).cast<float>().transpose();
    } else {
      auto lab = cluster_labels(layer, kvh);
      int64_t m_total = p_.clusters_after(n);
      std::vector<Eigen::VectorXd> centers(m_total);
      boost::random::normal_distribution<double> nd(0.0, p_.center_scale);
      for (int64_t c = 0; c < m_total; ++c) {
        Engine ce = make_engine({p_.seed, uint64_t(layer), uint64_t(kvh), kCenter, uint64_t(c)});
        centers[c].resize(d);
        for (int j = 0; j < d; ++j) centers[c][j] = nd(ce);
      }
      for (int64_t i = 0; i < n; ++i) {
        // Each key lies within δ₀/2 of its center, so every cluster's diameter is ≤ δ₀. The float
        // rounding of the stored key is absorbed by shrinking the radius by 1e-4 relative.
        Eigen::VectorXd x = centers[lab[i]] + ball_point(eng, d, 0.5 * p_.cluster_diameter * (1 - 1e-4));
        m.row(i) = x.cast<float>().transpose();
      }
    }
  } else {  // heavy_hitter
    Engine de = make_engine({p_.seed, uint64_t(layer), uint64_t(kvh), kDir});
    Eigen::VectorXd u = unit_dir(de, d);
    double beta = std::sqrt(p_.heavy_strength / scale);
    fill_gaussian(m, eng, which == Tensor::q ? p_.q_scale : p_.k_scale);
    if (which == Tensor::q) {
      for (int64_t i = 0; i < n; ++i) m.row(i) += (beta * u).cast<float>().transpose();
    } else {
      for (int64_t pos : heavy_positions(p_, layer, kvh)) m.row(pos) += (beta * u).cast<float>().transpose();
    }
  }
  return m;
}

void write_synthetic(const SynthSource& src, const std::string& path) {
  const auto& meta = src.meta();
  RecordingWriter w(path, meta);
  const auto& p = src.params();
  w.set_attr("synthetic_preset", p.preset);
  w.set_attr("synthetic_seed", int64_t(p.seed));
  if (p.preset == "clustered") {
    w.set_attr("clusters_m", int64_t(p.clusters_after(p.n)));
    w.set_attr("cluster_diameter", p.cluster_diameter);
    w.set_attr("cluster_c", p.cluster_c);
    w.set_attr("cluster_gamma", p.cluster_gamma);
    w.set_attr("query_norm_bound", p.query_norm);
  }
  if (p.preset == "heavy_hitter") {
    w.set_attr("n_heavy", int64_t(p.n_heavy));
    w.set_attr("heavy_strength", p.heavy_strength);
  }
  for (int l = 0; l < meta.n_layers; ++l) {
    for (int h = 0; h < meta.n_heads; ++h) w.write(l, Tensor::q, h, src.read(l, Tensor::q, h));
    for (int h = 0; h < meta.n_kv_heads; ++h) {
      w.write(l, Tensor::k, h, src.read(l, Tensor::k, h));
      w.write(l, Tensor::v, h, src.read(l, Tensor::v, h));
    }
  }
  w.finish();
}

}  // namespace kvsim
