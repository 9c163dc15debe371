// `subgen_kcenter`: the practical SubGen variant evaluated in SubGen §3.2 / Table 1 — the r most
// recent tokens exactly plus k centers of the older keys by greedy k-center clustering (Gonzalez,
// SubGen ref. [8]), applied once at a prefill point; or, in streaming mode, maintained at every
// step by the incremental doubling algorithm of Charikar, Chekuri, Feder and Motwani (SubGen ref.
// [3]) so that the budget r + k holds at every step.
// Option `weighted` (kvsim's own addition, not in the paper): each center's logit gains
// log(cluster size), so a center stands for all the keys it absorbed in the softmax.
#include <cmath>
#include <deque>

#include "factories.hpp"
#include "kvsim/clustering.hpp"
#include "kvsim/error.hpp"

namespace kvsim::policies {
namespace {

struct Entry {
  int64_t pos;
  VecD k, v;
  double count = 1;  // keys this entry stands for
};

class KCenterPolicy final : public Policy {
 public:
  KCenterPolicy(int d, int64_t recent, int64_t centers, int64_t prefill, bool streaming, bool weighted)
      : recent_(recent), k_(centers), prefill_(prefill), streaming_(streaming), weighted_(weighted), dim_(d) {}

  void observe(int64_t t, const float* kp, const float* vp) override {
    Entry e;
    e.pos = t;
    e.k = Eigen::Map<const VecF>(kp, dim_).cast<double>();
    e.v = Eigen::Map<const VecF>(vp, dim_).cast<double>();
    const int64_t n_seen = t + 1;
    if (streaming_) {
      // The window is the last `recent` tokens: token t takes ring row t mod recent of the
      // gathered matrices (rows [recent, recent + centers) hold the centers; see attend()).
      if (K_.rows() == 0) {
        K_.resize(recent_ + k_, dim_);
        V_.resize(recent_ + k_, dim_);
        bias_ = VecD::Zero(recent_ + k_);
        pos_.assign(size_t(recent_ + k_), -1);
      }
      const int64_t row = t % recent_;
      K_.row(row) = e.k.transpose();
      V_.row(row) = e.v.transpose();
      pos_[size_t(row)] = t;
      window_.push_back(std::move(e));
      while (int64_t(window_.size()) > recent_) {
        insert_streaming(std::move(window_.front()));
        window_.pop_front();
      }
      return;
    }
    window_.push_back(std::move(e));
    if (!clustered_) {
      if (n_seen == prefill_) prefill_cluster();
    } else {
      while (int64_t(window_.size()) > recent_) {  // after prefill: evicted tokens join their nearest center
        const Entry& old = window_.front();
        if (!centers_.empty()) centers_[nearest(old.k)].count += 1;
        window_.pop_front();
      }
    }
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (!out) return;
    if (streaming_) {
      attend_streaming(q, *out);
      return;
    }
    const int64_t m = int64_t(centers_.size() + window_.size());
    MatD K(m, dim_), V(m, dim_);
    VecD bias = VecD::Zero(m);
    std::vector<int64_t> pos(m);
    int64_t r = 0;
    for (const auto& c : centers_) {
      K.row(r) = c.k.transpose();
      V.row(r) = c.v.transpose();
      bias[r] = weighted_ ? std::log(c.count) : 0.0;
      pos[r++] = c.pos;
    }
    for (const auto& w : window_) {
      K.row(r) = w.k.transpose();
      V.row(r) = w.v.transpose();
      pos[r++] = w.pos;
    }
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = (*out)[i];
      VecD logits = K * q.row(i).transpose() + bias;
      double mx = logits.maxCoeff();
      VecD w = (logits.array() - mx).exp().matrix();
      a.z = V.transpose() * w / w.sum();
      a.has_kept = true;
      a.kept = pos;
    }
  }

  /// Streaming mode: the window rows are written as tokens arrive (observe) and the center rows
  /// only when the centers changed (centers_version_), instead of gathering every entry per step.
  void attend_streaming(const MatD& q, std::vector<Answer>& out) {
    const int64_t w = int64_t(window_.size()), c = int64_t(centers_.size());
    if (gathered_version_ != centers_version_) {
      for (int64_t i = 0; i < c; ++i) {
        const Entry& e = centers_[size_t(i)];
        K_.row(recent_ + i) = e.k.transpose();
        V_.row(recent_ + i) = e.v.transpose();
        bias_[recent_ + i] = weighted_ ? std::log(e.count) : 0.0;
        pos_[size_t(recent_ + i)] = e.pos;
      }
      gathered_version_ = centers_version_;
    }
    // Rows [0, w) are the window (w < recent only while no center exists), then the centers.
    const int64_t m = w + c;
    if (c > 0 && w != recent_) throw Error("subgen_kcenter: centers before the window is full (internal)");
    std::vector<int64_t> kept(pos_.begin(), pos_.begin() + m);
    auto Km = K_.topRows(m);
    auto Vm = V_.topRows(m);
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      Answer& a = out[i];
      logits_.noalias() = Km * q.row(i).transpose();
      logits_ += bias_.head(m);
      const double mx = logits_.maxCoeff();
      logits_ = (logits_.array() - mx).exp().matrix();
      a.z.noalias() = Vm.transpose() * logits_;
      a.z /= logits_.sum();
      a.has_kept = true;
      a.kept = kept;
    }
  }

  int64_t cache_tokens() const override { return int64_t(centers_.size() + window_.size()); }
  double clusters() const override { return double(centers_.size()); }
  bool capacity_matched() const override { return true; }

 private:
  size_t nearest(const VecD& k) const {
    size_t best = 0;
    double bd = INFINITY;
    for (size_t i = 0; i < centers_.size(); ++i) {
      double d = (centers_[i].k - k).squaredNorm();
      if (d < bd) {
        bd = d;
        best = i;
      }
    }
    return best;
  }

  /// Greedy k-center (Gonzalez): start from the oldest old token, repeatedly add the token farthest
  /// from the chosen centers; then every old token is counted in its nearest center.
  void prefill_cluster() {
    clustered_ = true;
    std::vector<Entry> old;
    while (int64_t(window_.size()) > recent_) {
      old.push_back(std::move(window_.front()));
      window_.pop_front();
    }
    if (old.empty() || k_ == 0) return;
    MatD keys(int64_t(old.size()), dim_);
    for (size_t i = 0; i < old.size(); ++i) keys.row(i) = old[i].k.transpose();
    const std::vector<int64_t> chosen = greedy_kcenter(keys, k_);
    MatD ck(int64_t(chosen.size()), dim_);
    for (size_t c = 0; c < chosen.size(); ++c) {
      ck.row(c) = keys.row(chosen[c]);
      centers_.push_back(old[chosen[c]]);
      centers_.back().count = 0;
    }
    for (const auto& e : old) centers_[nearest_row(ck, e.k)].count += 1;
  }

  /// Charikar et al.'s doubling algorithm: a point within 2R of a center joins it; otherwise it
  /// becomes a center; with more than k centers, R doubles and centers within 2R of an earlier
  /// kept center merge into it (counts add).
  void insert_streaming(Entry e) {
    if (k_ == 0) return;
    if (!centers_.empty() && radius_ > 0) {
      size_t i = nearest(e.k);
      if ((centers_[i].k - e.k).norm() <= 2 * radius_) {
        centers_[i].count += e.count;
        if (weighted_) ++centers_version_;  // its log-count bias changed
        return;
      }
    }
    ++centers_version_;
    centers_.push_back(std::move(e));
    if (int64_t(centers_.size()) <= k_) return;
    if (radius_ == 0) {  // initialise R from the closest pair of the first k + 1 centers
      double md = INFINITY;
      for (size_t i = 0; i < centers_.size(); ++i)
        for (size_t j = 0; j < i; ++j) md = std::min(md, (centers_[i].k - centers_[j].k).norm());
      radius_ = std::max(md / 2, 1e-12);
    }
    while (int64_t(centers_.size()) > k_) {
      radius_ *= 2;
      std::vector<Entry> kept;
      for (auto& c : centers_) {
        size_t best = 0;
        double bd = INFINITY;
        for (size_t j = 0; j < kept.size(); ++j) {
          double d = (kept[j].k - c.k).norm();
          if (d < bd) {
            bd = d;
            best = j;
          }
        }
        if (bd <= 2 * radius_) kept[best].count += c.count;
        else kept.push_back(std::move(c));
      }
      centers_ = std::move(kept);
    }
  }

  int64_t recent_, k_, prefill_;
  bool streaming_, weighted_;
  int dim_;
  bool clustered_ = false;
  double radius_ = 0;
  std::deque<Entry> window_;
  std::vector<Entry> centers_;
  // Streaming mode's gathered cache: rows [0, recent) the window ring, [recent, recent + k) centers.
  MatD K_, V_;
  VecD bias_, logits_;
  std::vector<int64_t> pos_;
  uint64_t centers_version_ = 1, gathered_version_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_subgen_kcenter(const Params& p, const StreamInfo& s) {
  const int64_t recent = p.get_budget("recent", s.n);
  const int64_t centers = p.get_budget("centers", s.n);
  if (recent < 1) throw Error("parameter 'recent' must be at least 1 token" + p.where("recent"));
  const std::string mode = p.get_string("mode", "prefill");
  if (mode != "prefill" && mode != "streaming")
    throw Error("parameter 'mode' must be \"prefill\" or \"streaming\"" + p.where("mode"));
  // Prefill point: default when the stream first holds recent + 4·centers tokens (so the clustering
  // has old tokens to choose from); a fraction of n or a token count otherwise.
  const int64_t prefill = p.get_budget("prefill", s.n, std::min<int64_t>(s.n, recent + 4 * centers));
  if (mode == "streaming" && p.has("prefill")) throw Error("'prefill' applies only to mode = \"prefill\"" + p.where("prefill"));
  return std::make_unique<KCenterPolicy>(s.head_dim, recent, centers, prefill, mode == "streaming",
                                         p.get_bool("weighted", false));
}

}  // namespace kvsim::policies
