// SlotAnswersStepper::step_block (sim/policies/slot_cache.hpp): a block of evaluated steps of a policy that
// answers with exact attention over its SlotCache, as two products over the store at the block's end and the
// tokens the steps held that left it before then.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

constexpr double kUnionGrowth = 1.1;  // a group's union of slots within this many times its largest set

/// MatD (S = double) or MatF (S = float): row-major as they are, which fixes the products' summation order.
template <class S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Row r's softmax over its own columns (cols, in slot order) of the logits' row L.row(r), written into the
/// same columns of P.row(r) (the others set to zero here, while the row is in cache); returns log Σ exp.
///  - float64: answer_group's arithmetic (attend_cached_group); l is unused.
///  - float32: float logits, softmax_f32 (exponentials in float, the sum in double), the probabilities rounded
///    to float for the values' product, as SlotCache::attend_group_f32.
/// The test hook g_blocked_masking_off hands every column instead.
template <class S>
double softmax_columns(const RowMat<S>& L, Eigen::Index r, const int32_t* cols, int64_t m, RowMat<S>& P, VecF& l, VecD& p) {
  const S* lr = L.row(r).data();
  S* pr = P.row(r).data();
  P.row(r).setZero();
  p.resize(m);
  if constexpr (std::is_same_v<S, double>) {
    for (int64_t j = 0; j < m; ++j) p[j] = lr[cols[j]];
    const double mx = p.maxCoeff();
    p = (p.array() - mx).exp().matrix();
    const double sum = p.sum();
    p /= sum;
    for (int64_t j = 0; j < m; ++j) pr[cols[j]] = p[j];
    return mx + std::log(sum);
  } else {
    l.resize(m);
    for (int64_t j = 0; j < m; ++j) l[j] = lr[cols[j]];
    const double ls = softmax_f32(l.data(), m, p.data());
    for (int64_t j = 0; j < m; ++j) pr[cols[j]] = float(p[j]);
    return ls;
  }
}

/// One group's products in scalar S. The columns are the store's m slots as it stands at the block's end (read
/// where they sit) and then the group's extra tokens, those evicted before the block's end (Ke, Ve [e, d], copied
/// from the stream). Q the steps' query rows, L = Q·[store | extra]ᵀ [rows, m + e] (a row's logits contiguous),
/// P its masked softmax, Z = P·[store | extra] [rows, d].
template <class S>
struct GroupProducts {
  RowMat<S> Ke, Ve, Q, L, P, Z;
};

}  // namespace

struct SlotAnswersStepper::Scratch {
  std::vector<int64_t> steps;   // the steps answer_steps answers
  std::vector<int64_t> slots;   // the evaluated steps' slot positions, one run per step
  std::vector<size_t> run0;     // run i is slots[run0[i], run0[i + 1])
  std::vector<int64_t> extra;   // a group's positions that left the store before the block's end
  std::vector<int32_t> col_of;  // [position] → a group's mark, or −2 while answer_steps collects extras (−1 between uses)
  std::vector<int32_t> store_col;    // [position] → its slot in the store at the block's end (−1: not there)
  std::vector<int32_t> run_cols_of;  // a group's runs as columns
  std::vector<int32_t> all;          // the test hook's columns: every row reads every column
  std::vector<double> log_sum;       // [step in group · G + g]
  GroupProducts<double> d;
  GroupProducts<float> f;
  VecF lf;
  VecD p;

  /// The group's products and softmaxes in S for the steps in `steps` (run_cols(i), run_len(i): step i's
  /// columns), the store's keys and values SK, SV (its first m rows); fills log_sum, and leaves the answers in g.Z.
  template <class S, class Cols, class Len>
  void products(GroupProducts<S>& g, const RowMat<S>& SK, const RowMat<S>& SV, Eigen::Index m, const MatF& K,
                const MatF& V, const std::vector<const MatD*>& q_scaled, Cols run_cols, Len run_len) {
    const auto e = Eigen::Index(extra.size()), d = Eigen::Index(K.cols()), G = Eigen::Index(q_scaled.size());
    g.Ke.resize(e, d);
    g.Ve.resize(e, d);
    for (Eigen::Index c = 0; c < e; ++c) {  // a float64 store holds the stream's float rows as doubles
      g.Ke.row(c) = K.row(extra[size_t(c)]).template cast<S>();
      g.Ve.row(c) = V.row(extra[size_t(c)]).template cast<S>();
    }
    block_queries(q_scaled, steps, d, g.Q);
    g.L.resize(g.Q.rows(), m + e);
    g.L.leftCols(m).noalias() = g.Q * SK.topRows(m).transpose();
    if (e > 0) g.L.rightCols(e).noalias() = g.Q * g.Ke.transpose();
    g.P.resize(g.Q.rows(), m + e);
    for (size_t i = 0; i < steps.size(); ++i)
      for (Eigen::Index h = 0; h < G; ++h)
        log_sum[i * size_t(G) + size_t(h)] = softmax_columns(g.L, Eigen::Index(i) * G + h, run_cols(i), run_len(i), g.P, lf, p);
    g.Z.noalias() = g.P.leftCols(m) * SV.topRows(m);
    if (e > 0) g.Z.noalias() += g.P.rightCols(e) * g.Ve;
  }
};

void SlotAnswersStepper::step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V,
                                    const std::vector<const MatD*>& q_scaled, BlockAnswers* out) {
  check_step_block(t_first, t_last, K, q_scaled, out, "blocked slot answers");
  const SlotCache& store = answering_store();
  thread_local Scratch w;
  std::vector<int64_t>& slots = w.slots;
  std::vector<size_t>& run0 = w.run0;
  std::vector<int32_t>& col_of = w.col_of;
  slots.clear();
  run0.assign(1, 0);
  observe_block(stepper_policy(), t_first, t_last, K, V, out, [&] {
    slots.insert(slots.end(), store.positions(), store.positions() + store.size());
    run0.push_back(slots.size());
  });
  if (!out || out->steps.empty()) return;
  // The evaluated steps in groups whose union of slots stays within kUnionGrowth of their largest set: a cache that
  // evicts a token per step (keydiff, a full snapkv) would otherwise make the union grow with the block's span,
  // and the products with it. A cache that only grows (snapkv below its budget) keeps one group.
  if (col_of.size() < size_t(K.rows())) col_of.assign(size_t(K.rows()), -1);
  // The store as it stands at the block's end: each position's slot, the products' first columns.
  std::vector<int32_t>& store_col = w.store_col;
  if (store_col.size() < size_t(K.rows())) store_col.assign(size_t(K.rows()), -1);
  const int64_t* pos = store.positions();
  for (int64_t s = 0; s < store.size(); ++s) store_col[size_t(pos[s])] = int32_t(s);
  const size_t E = out->steps.size();
  int32_t gid = 0;
  size_t first = 0, u = 0, largest = 0;
  for (size_t i = 0; i < E; ++i) {
    const size_t m = run0[i + 1] - run0[i];
    size_t fresh = 0;
    for (size_t j = run0[i]; j < run0[i + 1]; ++j) fresh += col_of[size_t(slots[j])] != gid;
    if (i > first && double(u + fresh) > kUnionGrowth * double(std::max(largest, m))) {  // step i opens the next group
      answer_steps(w, first, i, K, V, q_scaled, out);
      first = i, u = 0, largest = 0, fresh = m;
      ++gid;
    }
    for (size_t j = run0[i]; j < run0[i + 1]; ++j) col_of[size_t(slots[j])] = gid;
    u += fresh;
    largest = std::max(largest, m);
  }
  answer_steps(w, first, E, K, V, q_scaled, out);  // each group's answer_steps left its marks at −1 again
  for (int64_t s = 0; s < store.size(); ++s) store_col[size_t(pos[s])] = -1;
}

void SlotAnswersStepper::answer_steps(Scratch& w, size_t i0, size_t i1, const MatF& K, const MatF& V,
                                      const std::vector<const MatD*>& q_scaled, BlockAnswers* out) const {
  const std::vector<int64_t>& slots = w.slots;
  const std::vector<size_t>& run0 = w.run0;
  std::vector<int32_t>& col_of = w.col_of;
  const std::vector<int32_t>& store_col = w.store_col;
  const SlotCache& store = answering_store();
  const auto G = Eigen::Index(q_scaled.size());
  const int64_t m = store.size();
  // The columns: the store's m slots at the block's end, then the group's tokens no longer in it (extra), in the
  // order the runs name them (col_of marks are the caller's: reset to −1 for every position the runs name).
  std::vector<int64_t>& extra = w.extra;
  extra.clear();
  for (size_t j = run0[i0]; j < run0[i1]; ++j) {
    const auto at = size_t(slots[j]);
    if (store_col[at] < 0 && col_of[at] != -2) col_of[at] = -2, extra.push_back(slots[j]);
  }
  for (size_t c = 0; c < extra.size(); ++c) col_of[size_t(extra[c])] = int32_t(m + int64_t(c));
  std::vector<int32_t>& run_cols_of = w.run_cols_of;  // each step's slots as columns
  run_cols_of.resize(run0[i1] - run0[i0]);
  for (size_t j = run0[i0]; j < run0[i1]; ++j) {
    const auto at = size_t(slots[j]);
    run_cols_of[j - run0[i0]] = store_col[at] >= 0 ? store_col[at] : col_of[at];
  }
  for (size_t j = run0[i0]; j < run0[i1]; ++j) col_of[size_t(slots[j])] = -1;
  std::vector<int32_t>& all = w.all;
  if (g_blocked_masking_off) {
    all.resize(size_t(m) + extra.size());
    for (size_t c = 0; c < all.size(); ++c) all[c] = int32_t(c);
  }
  const size_t E = i1 - i0;
  w.log_sum.resize(E * size_t(G));
  auto run_cols = [&](size_t i) { return g_blocked_masking_off ? all.data() : run_cols_of.data() + (run0[i0 + i] - run0[i0]); };
  auto run_len = [&](size_t i) { return g_blocked_masking_off ? int64_t(all.size()) : int64_t(run0[i0 + i + 1] - run0[i0 + i]); };
  w.steps.assign(out->steps.begin() + std::ptrdiff_t(i0), out->steps.begin() + std::ptrdiff_t(i1));
  if (!store.f32()) {
    w.products(w.d, store.keys(), store.values(), m, K, V, q_scaled, run_cols, run_len);
  } else {
    w.products(w.f, store.keys_f(), store.values_f(), m, K, V, q_scaled, run_cols, run_len);
    w.d.Z = w.f.Z.cast<double>();
  }
  const MatD& Z = w.d.Z;  // [E·G, d]
  for (size_t i = 0; i < E; ++i) {
    const size_t k = i0 + i;
    for (Eigen::Index g = 0; g < G; ++g) {
      Answer& a = out->answers[k][size_t(g)];
      a.z = Z.row(Eigen::Index(i) * G + g).transpose();
      a.has_kept = true;
      a.kept.assign(slots.begin() + std::ptrdiff_t(run0[k]), slots.begin() + std::ptrdiff_t(run0[k + 1]));
      a.log_tau = answer_log_tau(w.log_sum[i * size_t(G) + size_t(g)], out->steps[k], int64_t(run0[k + 1] - run0[k]));
    }
  }
}

}  // namespace kvsim::policies
