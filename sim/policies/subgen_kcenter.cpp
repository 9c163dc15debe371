// `subgen_kcenter`: the practical SubGen variant evaluated in SubGen §3.2 / Table 1 — the r most
// recent tokens exactly plus k centers of the older keys by greedy k-center clustering (Gonzalez,
// SubGen ref. [8]), applied once at a prefill point; or, in streaming mode, maintained at every
// step by the incremental doubling algorithm of Charikar, Chekuri, Feder and Motwani (SubGen ref.
// [3]) so that the budget r + k holds at every step.
// Option `weighted` (kvsim's own addition, not in the paper): each center's logit gains
// log(cluster size), so a center stands for all the keys it absorbed in the softmax.
#include <cmath>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "kvsim/policies/gpu_replay.hpp"
#include "factories.hpp"
#include "kvsim/analysis/clustering.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/core/hd.hpp"

namespace kvsim::policies {
namespace {

struct Entry {
  int64_t pos;
  VecD k, v;
  VecF kf;           // the recorded float32 key (streaming mode's distances: hd::key_sqdist)
  double count = 1;  // keys this entry stands for
};

class KCenterPolicy final : public Policy, public GpuReplayable {
 public:
  KCenterPolicy(int d, int64_t recent, int64_t centers, int64_t prefill, bool streaming, bool weighted)
      : recent_(recent), k_(centers), prefill_(prefill), streaming_(streaming), weighted_(weighted), dim_(d) {}

  void observe(int64_t t, const float* kp, const float* vp) override {
    Entry e;
    e.pos = t;
    e.k = Eigen::Map<const VecF>(kp, dim_).cast<double>();
    e.v = Eigen::Map<const VecF>(vp, dim_).cast<double>();
    if (streaming_) e.kf = Eigen::Map<const VecF>(kp, dim_);
    const int64_t n_seen = t + 1;
    if (streaming_) {
      // The window is the last `recent` tokens: token t takes ring row t mod recent of the
      // gathered matrices (rows [recent, recent + centers) hold the centers; see attend()).
      if (K_.rows() == 0) {
        K_.resize(recent_ + k_, dim_);
        V_.resize(recent_ + k_, dim_);
        bias_ = VecD::Zero(recent_ + k_);
        pos_.assign(size_t(recent_ + k_), -1);
        cid_.assign(size_t(k_ + 1), -1);
        ccount_.assign(size_t(k_ + 1), 0.0);
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
    const int64_t w = int64_t(window_.size()), c = n_centers_;
    if (gathered_version_ != centers_version_) {
      for (int64_t i = 0; i < c; ++i) {
        const Entry& e = store_.at(cid_[size_t(i)]);
        K_.row(recent_ + i) = e.k.transpose();
        V_.row(recent_ + i) = e.v.transpose();
        bias_[recent_ + i] = weighted_ ? std::log(ccount_[size_t(i)]) : 0.0;
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

  int64_t cache_tokens() const override { return n_center_entries() + int64_t(window_.size()); }
  double clusters() const override { return double(n_center_entries()); }
  std::optional<cuda::PolicyReplay> gpu_replay() const override {
    if (!streaming_) return std::nullopt;  // the prefill form stays on the CPU
    cuda::PolicyReplay r;
    r.kind = cuda::ReplayKind::subgen_kcenter;
    r.recent = recent_;
    r.budget = k_;
    r.weighted = weighted_;
    return r;
  }
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

  int64_t n_center_entries() const { return streaming_ ? n_centers_ : int64_t(centers_.size()); }

  /// Charikar et al.'s doubling algorithm (hd::kcenter_insert, shared with the GPU replay): a point
  /// within 2R of a center joins it; otherwise it becomes a center; with more than k centers, R
  /// doubles and centers within 2R of an earlier kept center merge into it (counts add). Distances
  /// are hd::key_sqdist of the recorded float32 keys, so both paths decide identically.
  void insert_streaming(Entry e) {
    if (k_ == 0) return;
    const int64_t id = e.pos;
    const double w = e.count;
    const float* key = store_.emplace(id, std::move(e)).first->second.kf.data();  // node-based: address stable
    if (int64_t(kptr_.size()) <= id) kptr_.resize(size_t(id) + 1, nullptr);
    kptr_[size_t(id)] = key;
    auto sqdist = [this](int64_t a, int64_t b) { return hd::key_sqdist(kptr_[size_t(a)], kptr_[size_t(b)], dim_); };
    int64_t joined = -1;
    n_centers_ = hd::kcenter_insert(cid_.data(), ccount_.data(), n_centers_, radius_, k_, id, w, &joined, sqdist);
    if (joined >= 0) {
      store_.erase(id);
      if (weighted_) ++centers_version_;  // its log-count bias changed
      return;
    }
    ++centers_version_;
    if (int64_t(store_.size()) > n_centers_) {  // merged centers leave the store
      std::unordered_set<int64_t> live(cid_.begin(), cid_.begin() + n_centers_);
      for (auto it = store_.begin(); it != store_.end();) it = live.count(it->first) ? std::next(it) : store_.erase(it);
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
  // Streaming mode's centers (hd::kcenter_insert): ids (token positions) and weights in slots
  // [0, n_centers_), each id's entry in store_.
  std::vector<int64_t> cid_;
  std::vector<double> ccount_;
  int64_t n_centers_ = 0;
  std::unordered_map<int64_t, Entry> store_;
  std::vector<const float*> kptr_;  // key of each stored id, by token position (valid while stored)
};

std::unique_ptr<Policy> make_subgen_kcenter(ParamReader& p, const StreamInfo& s) {
  const int64_t recent = p.get_budget("recent", s.n);
  const int64_t centers = p.get_budget("centers", s.n);
  if (recent < 1) throw Error("parameter 'recent' must be at least 1 token" + p.where("recent"));
  const std::string mode = p.get_string("mode");
  // Prefill point: the stream's prompt ([data] prefill = P: the centers are chosen from the prompt,
  // at the end of kvsim::prefill), else when the stream first holds recent + 4·centers tokens (so the
  // clustering has old tokens to choose from); a fraction of n or a token count otherwise.
  const int64_t def = s.prefill > 0 ? s.prefill : std::min<int64_t>(s.n, recent + 4 * centers);
  const int64_t prefill = p.get_budget("prefill", s.n, def);
  if (mode == "streaming" && p.has("prefill")) throw Error("'prefill' applies only to mode = \"prefill\"" + p.where("prefill"));
  if (mode == "prefill" && s.prefill > 0 && prefill != s.prefill)
    throw Error("parameter 'prefill' (" + std::to_string(prefill) + ") differs from [data] prefill (" +
                std::to_string(s.prefill) + "); leave it out to cluster the prompt" + p.where("prefill"));
  return std::make_unique<KCenterPolicy>(s.head_dim, recent, centers, prefill, mode == "streaming",
                                         p.get_bool("weighted"));
}

/// recent + centers = M (streaming mode unless `mode` is given).
void kcenter_memory(int64_t M, const Params& given, Params& out, const std::string& where) {
  const int64_t centers = M / 2;
  out.set("centers", centers, where);
  out.set("recent", std::max<int64_t>(1, M - centers), where);
  if (!given.has("mode")) out.set("mode", std::string("streaming"), where);
}

}  // namespace

KVSIM_POLICY(subgen_kcenter) {
  static const PolicyInfo info{
      "subgen_kcenter",
      "`recent` most recent tokens + `centers` greedy k-center (Gonzalez) centers of the older keys, chosen once at "
      "`prefill` (before it the cache is full); `mode = \"streaming\"` keeps ≤ `centers` at every step with "
      "Charikar et al.'s doubling algorithm; `weighted = true` (kvsim's addition) adds log(cluster size) to a "
      "center's logit",
      "SubGen §3.2, refs [3], [8]",
      {{"recent", "tokens", "required", "most recent tokens kept exactly (≥ 1)"},
       {"centers", "tokens", "required", "k-center centers of the older keys"},
       {"mode", "string", "prefill", "\"prefill\" (cluster once) or \"streaming\" (doubling algorithm)", "prefill|streaming"},
       {"prefill", "tokens", "[data] prefill, else recent + 4·centers", "prefill mode: the step at which the centers are chosen"},
       {"weighted", "bool", "false", "add log(cluster size) to each center's logit"}},
      make_subgen_kcenter,
      MemoryRule{"capacity: centers = ⌊M/2⌋, recent = M − centers, mode = \"streaming\" unless given",
                 {"recent", "centers"},
                 kcenter_memory},
      "yes (mode = \"streaming\")",
      {example_params({{"recent", 0.1}, {"centers", 0.1}}),
       example_params({{"recent", 0.1}, {"centers", 0.1}, {"mode", std::string("streaming")}})},
       "#2ca02c",  // figure colour
       {example_params({{"recent", 0.125}, {"centers", 0.125}, {"mode", std::string("streaming")}}), false, false}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
