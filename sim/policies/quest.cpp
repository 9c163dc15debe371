// `quest`: Quest (Tang et al., 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference", §3.2-3.3, Algorithm 1 / Fig. 5). The whole KV cache is kept, in pages of S tokens
// (default 16) with each page's elementwise minimum m_p and maximum M_p of its keys. Each query
// loads only the pages that may matter: page p's criticality is the upper bound
//     U_p(q) = Σ_i max(q_i·m_{p,i}, q_i·M_{p,i})  ≥  max_{k ∈ page p} ⟨q, k⟩        (§3.2)
// and attention runs exactly over the top pages by U_p. The current (last, possibly partial) page is
// always loaded (it holds token t; implementations keep the recent page), the others compete.
// In kv_head mode the group's query heads' bounds combine by group_agg and the group loads one set
// of pages (the bytes are read once per KV head); gqa = "query_head" gives every head its own.
//
// Sizes: `budget` B tokens loaded per query = ⌊B/S⌋ pages (Quest's "token budget"; the page
// metadata is not counted, as in the paper). `memory = M` matches on *loaded* bytes instead
// (PartialLoad): the metadata (one key-sized min and max per page, i.e. one token's
// K+V worth per page) plus the loaded tokens never exceed M tokens' worth; with t ≤ M every token is
// loaded with no metadata (dense). cache_bytes counts everything stored: all t tokens and the pages'
// min/max. Stepping is stateless between queries (no score history); with blocked stepping (`[eval] stepping`)
// a block's evaluated steps choose their pages as attend() does and are answered in groups (step_block).
#include <algorithm>
#include <limits>
#include <numeric>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

// A group's cost in units of one query row's product over one token (d multiply-adds): reading a token's key and
// value for a group costs kReadCost of them. Measured on the bench's quest cell at n = 4096, 16384 and 32768
// (docs/performance.md): 8 and 16 alike and best; 32 and 128 lose the gain at 4096 (groups grow too wide).
constexpr double kReadCost = 8;
constexpr int64_t kChunkBytes = int64_t(1) << 18;  // the union's keys or values read 256 KiB at a time (fits L2)

class QuestPolicy final : public Policy, public PartialLoad, public BlockStepper {
 public:
  /// budget ≥ page (tokens loaded, `budget` mode) or memory M (`memory` mode, the other −1); page S ≥ 1.
  QuestPolicy(int64_t budget, int64_t memory, int64_t page, const StreamInfo& s)
      : budget_(budget), memory_(memory), S_(page), agg_(s.group_agg), d_(s.head_dim), cache_(s.n, s.head_dim),
        lo_((std::max<int64_t>(s.n, 1) + page - 1) / page, s.head_dim), hi_(lo_.rows(), s.head_dim) {}

  void observe(int64_t t, const float* k, const float* v) override {
    const int64_t p = t / S_;
    const Eigen::Map<const Eigen::Matrix<float, 1, Eigen::Dynamic>> key(k, d_);
    if (p >= lo_.rows()) throw Error("quest: token " + std::to_string(t) + " beyond the stream's " + std::to_string(lo_.rows()) + " pages");
    if (p >= pages_) {
      lo_.row(p) = key.cast<double>();
      hi_.row(p) = key.cast<double>();
      pages_ = p + 1;
    } else {
      lo_.row(p) = lo_.row(p).cwiseMin(key.cast<double>());
      hi_.row(p) = hi_.row(p).cwiseMax(key.cast<double>());
    }
    cache_.append(t, k, v);
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (choose(q, cache_.size())) {  // everything fits: dense attention, no metadata read
      if (out) cache_.answer_group(q, out);
      return;
    }
    if (out) attend_runs(q, *out);
  }

  /// Blocked (BlockStepper, include/kvsim/policies/policy.hpp): the block's tokens join as in observe(); each
  /// evaluated step e then chooses its pages as attend() does, from the same bounds (the pages before e's current
  /// one were complete at e, so their extrema at the block's end are those at e): one pair of products over the
  /// page extrema for every step of the block. The steps are then answered in groups (group_end): one product of
  /// the group's query rows against the union of the tokens they load forms the logits, each row masked to its own
  /// step's tokens before its softmax, and a second forms the answers. A group reads each union token once for all
  /// its steps but forms every row's products over the whole union, so steps whose pages differ much are better
  /// answered apart. Quest's criticality per query is unchanged; only the attention over the loaded pages is batched.
  void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
                  BlockAnswers* out) override {
    check_step_block(t_first, t_last, K, q_scaled, out, "quest");
    m_at_.clear();
    observe_block(*this, t_first, t_last, K, V, out, [&] { m_at_.push_back(cache_.size()); });
    if (m_at_.empty()) return;
    const auto G = Eigen::Index(q_scaled.size());
    const size_t E = m_at_.size();
    block_queries(q_scaled, out->steps, d_, Qb_);
    page_bounds(Qb_, (m_at_.back() + S_ - 1) / S_ - 1);  // every step's bounds in one pair of products
    step_runs_.assign(E, {});
    loaded_.assign(E, 0);
    for (size_t i = 0; i < E; ++i) {
      q_step_ = Qb_.middleRows(Eigen::Index(i) * G, G);
      choose(q_step_, m_at_[i], &U_, Eigen::Index(i) * G);
      step_runs_[i] = runs_;
      loaded_[i] = int64_t(rows_.size());
      out->loaded_bytes[i] = loaded_bytes(d_);
      for (Eigen::Index g = 0; g < G; ++g) {
        Answer& a = out->answers[i][size_t(g)];
        a.has_kept = true;
        a.kept = rows_;
      }
    }
    if (page_len_.size() < size_t(pages_)) page_len_.assign(size_t(pages_), 0), col_of_page_.assign(size_t(pages_), 0);
    for (size_t i0 = 0; i0 < E;) {
      const size_t i1 = group_end(i0, G);
      answer_group(i0, i1, K, V, G, out);
      i0 = i1;
    }
  }
  bool blocks_evaluated_steps() const override { return true; }

  int64_t cache_tokens() const override { return cache_.size(); }
  int64_t cache_vectors() const override { return 2 * cache_.size() + 2 * pages_; }
  double loaded_bytes(int head_dim) const override { return double(2 * loaded_tokens_) * head_dim * sizeof(float); }
  bool capacity_matched() const override { return true; }

 private:
  /// The pages the group's query rows q load when the cache holds m tokens (Quest §3.2-3.3): fills runs_ (the
  /// loaded tokens as runs [a, b), ascending), rows_ (those tokens) and loaded_tokens_. True when every token fits
  /// (dense: no metadata read), false when the current page and the top pages by U were chosen. `bounds`: U for
  /// these rows already formed, rows [row0, row0 + q.rows()) of it, columns ≥ the pages before the current one.
  bool choose(const MatD& q, int64_t m, const MatD* bounds = nullptr, Eigen::Index row0 = 0) {
    const int64_t pages = (m + S_ - 1) / S_;
    const int64_t dense_limit = memory_ >= 0 ? memory_ : budget_;
    rows_.clear();
    runs_.clear();
    if (m <= dense_limit) {
      loaded_tokens_ = m;
      for (int64_t j = 0; j < m; ++j) rows_.push_back(j);
      runs_.emplace_back(0, m);
      return true;
    }
    const int64_t last = pages - 1, last_len = m - last * S_;
    const int64_t others = memory_ >= 0 ? (memory_ - pages - last_len) / S_ : budget_ / S_ - 1;
    if (others < 0)
      throw Error("quest: memory " + std::to_string(memory_) + " cannot hold the " + std::to_string(pages) +
                  " pages' min/max and the current page at step " + std::to_string(m));
    // The group's bounds per page (group_agg), top `others` pages (ties: the earlier page) + the last. With
    // m_p ≤ M_p, max(q_i·m_{p,i}, q_i·M_{p,i}) is q_i·M_{p,i} where q_i ≥ 0 and q_i·m_{p,i} where q_i < 0, so
    // U = max(Q, 0)·Mᵀ + min(Q, 0)·mᵀ: two products over the pages' extrema for the whole group (the same terms
    // as §3.2's sum; only their summation order is the GEMM's).
    if (!bounds) {
      page_bounds(q, last);
      bounds = &U_;
      row0 = 0;
    }
    GroupAggregate agg(agg_, last);
    VecD u(last);
    for (Eigen::Index g = 0; g < q.rows(); ++g) {
      u = bounds->row(row0 + g).head(last).transpose();
      agg.add(u);
    }
    const VecD score = agg.result();
    std::vector<int64_t> order(static_cast<size_t>(last));
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = std::min(others, last);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
    order.resize(size_t(k));
    order.push_back(last);
    std::sort(order.begin(), order.end());
    // The loaded pages as runs of consecutive tokens (order is sorted): attention reads them where they sit.
    for (int64_t p : order) {
      const int64_t a = p * S_, b = std::min(m, (p + 1) * S_);
      for (int64_t j = a; j < b; ++j) rows_.push_back(j);
      if (!runs_.empty() && runs_.back().second == a) runs_.back().second = b;
      else runs_.emplace_back(a, b);
    }
    loaded_tokens_ = int64_t(rows_.size()) + pages;  // + the metadata: one token's K+V worth per page
    return false;
  }

  /// U_ = max(Q, 0)·Mᵀ + min(Q, 0)·mᵀ over the first `pages` pages: [Q.rows(), pages].
  void page_bounds(const MatD& q, int64_t pages) {
    q_pos_ = q.cwiseMax(0.0);
    q_neg_ = q.cwiseMin(0.0);
    U_.noalias() = q_pos_ * hi_.topRows(pages).transpose();
    U_.noalias() += q_neg_ * lo_.topRows(pages).transpose();
  }

  /// Exact attention of the group's query rows over the loaded tokens (runs_), one product per run of consecutive
  /// tokens read where it sits and once for the whole group (K and V stream from memory once per query group, not
  /// once per query head): the softmax of attend_cached_group (policy.cpp) without gathering the rows first.
  void attend_runs(const MatD& q, std::vector<Answer>& out) {
    const int64_t r = int64_t(rows_.size());
    const auto G = q.rows();
    const MatD& K = cache_.keys();
    const MatD& V = cache_.values();
    // Token by token (a run is too short and G too small for a GEMM to repay packing K and V): the row of K and of
    // V is read once for the whole group.
    logits_.resize(r, G);  // column-major: each query's logits contiguous for the softmax
    int64_t c = 0;
    for (const auto& [a, b] : runs_)
      for (int64_t j = a; j < b; ++j, ++c)
        for (Eigen::Index g = 0; g < G; ++g) logits_(c, g) = K.row(j).dot(q.row(g));
    for (Eigen::Index g = 0; g < G; ++g) {
      auto p = logits_.col(g);
      const double mx = p.maxCoeff();
      p = (p.array() - mx).exp().matrix();
      p /= p.sum();
    }
    z_.setZero(G, V.cols());
    c = 0;
    for (const auto& [a, b] : runs_)
      for (int64_t j = a; j < b; ++j, ++c)
        for (Eigen::Index g = 0; g < G; ++g) z_.row(g) += logits_(c, g) * V.row(j);
    for (Eigen::Index g = 0; g < G; ++g) {
      Answer& ans = out[size_t(g)];
      ans.z = z_.row(g).transpose();
      ans.has_kept = true;
      ans.kept = rows_;
    }
  }

  /// The end of the group of evaluated steps that opens at i0 (step_block). With R rows (G per step) over a union of
  /// u tokens a group costs about kReadCost·u + R·u (reads, products); step i, loading n_i tokens of which `fresh`
  /// are not yet in the union, joins when that grows by no more than answering it alone would cost:
  ///     kReadCost·fresh + R·fresh + G·(u + fresh)  ≤  (kReadCost + G)·n_i.
  /// The union is kept as each page's loaded prefix (page_len_; a step loads a page from its first token), the pages
  /// in touched_, for answer_group, which clears them. The test hook (g_blocked_masking_off) makes the whole block one
  /// group.
  size_t group_end(size_t i0, Eigen::Index G) {
    const size_t E = step_runs_.size();
    int64_t u = 0;
    touched_.clear();
    size_t i = i0;
    for (; i < E; ++i) {
      int64_t fresh = 0;
      for (const auto& [a, b] : step_runs_[i])
        for (int64_t p = a / S_; p * S_ < b; ++p) fresh += std::max<int64_t>(0, std::min(b, (p + 1) * S_) - p * S_ - page_len_[size_t(p)]);
      const double R = double(i - i0) * double(G), g = double(G);
      if (i > i0 && !g_blocked_masking_off &&
          (kReadCost + R) * double(fresh) + g * double(u + fresh) > (kReadCost + g) * double(loaded_[i]))
        break;
      for (const auto& [a, b] : step_runs_[i])
        for (int64_t p = a / S_; p * S_ < b; ++p) {
          if (page_len_[size_t(p)] == 0) touched_.push_back(p);
          page_len_[size_t(p)] = std::max(page_len_[size_t(p)], std::min(b, (p + 1) * S_) - p * S_);
        }
      u += fresh;
    }
    return i;
  }

  /// Answers evaluated steps [i0, i1) of the block (one group of group_end): the logits of the group's query rows
  /// against the union of the tokens they load, L = Q·K_uᵀ [rows, u], each row's softmax over its own step's tokens
  /// (the rest of its row of P zero), and Z = P·V_u. K_u and V_u are never formed whole: by_chunks reads the
  /// stream's rows a chunk at a time.
  void answer_group(size_t i0, size_t i1, const MatF& K, const MatF& V, Eigen::Index G, BlockAnswers* out) {
    std::sort(touched_.begin(), touched_.end());
    union_.clear();
    int64_t u = 0;
    for (int64_t p : touched_) {  // the union as ascending runs of tokens; each page's first column
      const int64_t a = p * S_, b = a + page_len_[size_t(p)];
      col_of_page_[size_t(p)] = u;
      u += b - a;
      if (!union_.empty() && union_.back().second == a) union_.back().second = b;
      else union_.emplace_back(a, b);
      page_len_[size_t(p)] = 0;
    }
    const auto rows = Eigen::Index(i1 - i0) * G;
    const auto Q = Qb_.middleRows(Eigen::Index(i0) * G, rows);
    L_.resize(rows, u);
    by_chunks(K, u, [&](int64_t c, int64_t len) { L_.middleCols(c, len).noalias() = Q * chunk_.topRows(len).transpose(); });
    P_.resize(rows, u);
    for (size_t i = i0; i < i1; ++i) {
      // Step i's runs as column ranges of the union (a run's pages before its last are full: consecutive columns).
      cols_.clear();
      if (g_blocked_masking_off) cols_.emplace_back(0, u);  // the test hook: every row reads the whole union
      else for (const auto& [a, b] : step_runs_[i]) cols_.emplace_back(col_of_page_[size_t(a / S_)], b - a);
      for (Eigen::Index g = 0; g < G; ++g) {
        const Eigen::Index row = Eigen::Index(i - i0) * G + g;
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (const auto& [c, len] : cols_) mx = std::max(mx, L_.row(row).segment(c, len).maxCoeff());
        P_.row(row).setZero();
        for (const auto& [c, len] : cols_) {
          auto p = P_.row(row).segment(c, len);
          p = (L_.row(row).segment(c, len).array() - mx).exp().matrix();
          sum += p.sum();
        }
        for (const auto& [c, len] : cols_) P_.row(row).segment(c, len) /= sum;
      }
    }
    Z_.setZero(rows, d_);
    by_chunks(V, u, [&](int64_t c, int64_t len) { Z_.noalias() += P_.middleCols(c, len) * chunk_.topRows(len); });
    for (size_t i = i0; i < i1; ++i)
      for (Eigen::Index g = 0; g < G; ++g) out->answers[i][size_t(g)].z = Z_.row(Eigen::Index(i - i0) * G + g).transpose();
  }

  /// Calls f(first column, tokens) once per chunk of the union's u rows of X (the stream's keys or values), copied as
  /// doubles into chunk_ [tokens, d], at most kChunkBytes: the products read a chunk from cache, not the whole union
  /// copied out first.
  template <class F>
  void by_chunks(const MatF& X, int64_t u, F&& f) {
    const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(u, kChunkBytes / (int64_t(sizeof(double)) * d_)));
    chunk_.resize(cap, d_);
    int64_t col = 0, fill = 0;
    for (auto [a, b] : union_)
      while (a < b) {
        const int64_t take = std::min(b - a, cap - fill);
        chunk_.middleRows(fill, take) = X.middleRows(a, take).template cast<double>();
        fill += take, a += take;
        if (fill == cap) f(col, fill), col += fill, fill = 0;
      }
    if (fill > 0) f(col, fill);
  }

  const int64_t budget_, memory_, S_;
  const GroupAgg agg_;
  const int d_;
  SlotCache cache_;  // double storage: slot j holds token j
  MatD lo_, hi_;      // pages' elementwise key minimum m_p and maximum M_p, rows [0, pages_)
  int64_t pages_ = 0;
  MatD q_pos_, q_neg_, U_;  // attend() scratch: max(Q, 0), min(Q, 0), the bounds [G, pages − 1]
  int64_t loaded_tokens_ = 0;
  std::vector<int64_t> rows_;
  std::vector<std::pair<int64_t, int64_t>> runs_;  // the loaded tokens as runs [a, b)
  Eigen::MatrixXd logits_;  // attend_runs(): the loaded tokens' logits, then probabilities [loaded, G]
  MatD z_;
  // step_block() scratch: the cache size at each evaluated step, the block's query rows, each step's runs and loaded
  // token count, a group's pages (each page's loaded prefix, first column, the pages touched), its union, a row's
  // runs as union columns (first, length), a chunk of the union's keys or values, logits, probabilities, answers.
  std::vector<int64_t> m_at_, loaded_;
  MatD Qb_, q_step_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> step_runs_;
  std::vector<int64_t> page_len_, col_of_page_, touched_;
  std::vector<std::pair<int64_t, int64_t>> union_, cols_;
  MatD chunk_, L_, P_, Z_;
};

std::unique_ptr<Policy> make_quest(ParamReader& p, const StreamInfo& s) {
  const int64_t page = p.get_int("page_size");
  const bool by_memory = p.has("memory_tokens");
  if (by_memory == p.has("budget")) throw Error("give 'budget' (tokens loaded per query) or 'memory'");
  if (by_memory) {
    const int64_t M = p.get_int("memory_tokens", 0);
    const int64_t need = (s.n + page - 1) / page + page;  // worst case: every page's metadata + a full current page
    if (M < std::min(need, s.n))
      throw Error("memory " + std::to_string(M) + " is too small for quest: the " + std::to_string((s.n + page - 1) / page) +
                  " pages' min/max and the current page need " + std::to_string(need) + " tokens' worth (use a larger "
                  "memory or page_size)");
    return std::make_unique<QuestPolicy>(-1, M, page, s);
  }
  const int64_t b = p.get_budget("budget", s.n);
  if (b < page) throw Error("parameter 'budget' must be at least one page (" + std::to_string(page) + " tokens)" + p.where("budget"));
  return std::make_unique<QuestPolicy>(b, -1, page, s);
}

}  // namespace

KVSIM_POLICY(quest) {
  static const PolicyInfo info{
      "quest",
      "stores every token in pages of `page_size` with per-page min/max keys; each query loads the current page and "
      "the pages with the largest bound Σ_i max(q_i·min_i, q_i·max_i) (group_agg over the group) and attends over "
      "them exactly. loaded_bytes counts the metadata and loaded pages",
      "Quest (Tang et al., 2024) §3.2-3.3",
      {{"budget", "tokens", "required", "tokens loaded per query B (≥ page_size): ⌊B/page_size⌋ pages incl. the current one"},
       {"page_size", "int", "16", "tokens per page S", "[1, 4096]"},
       {"memory_tokens", "int", "none", "set by `memory = M` (loaded-bytes matching); not given directly"}},
      make_quest,
      MemoryRule{"matched on loaded_bytes (capacity): page metadata + loaded tokens ≤ M tokens' worth per query; "
                 "stores the whole stream",
                 {"budget", "memory_tokens"},
                 [](int64_t M, const Params&, Params& out, const std::string& where) { out.set("memory_tokens", M, where); }},
      "no",
      {example_params({{"budget", 0.5}}), example_params({{"memory_tokens", int64_t(40)}, {"page_size", int64_t(4)}})},
      "#000000",  // figure colour
      {example_params({{"budget", 0.25}}), false, false}};  // kvsim bench: parameters, after a prefill, float32 too
  return info;
}

}  // namespace kvsim::policies
