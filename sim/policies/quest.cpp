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
// min/max. Stepping is stateless between queries (no score history).
#include <algorithm>
#include <numeric>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

class QuestPolicy final : public Policy, public PartialLoad {
 public:
  /// budget ≥ page (tokens loaded, `budget` mode) or memory M (`memory` mode, the other −1); page S ≥ 1.
  QuestPolicy(int64_t budget, int64_t memory, int64_t page, const StreamInfo& s)
      : budget_(budget), memory_(memory), S_(page), agg_(s.group_agg), d_(s.head_dim), cache_(s.n, s.head_dim) {}

  void observe(int64_t t, const float* k, const float* v) override {
    const int64_t p = t / S_;
    const Eigen::Map<const VecF> key(k, d_);
    if (p >= int64_t(lo_.size())) {
      lo_.push_back(key.cast<double>());
      hi_.push_back(key.cast<double>());
    } else {
      lo_[size_t(p)] = lo_[size_t(p)].cwiseMin(key.cast<double>());
      hi_[size_t(p)] = hi_[size_t(p)].cwiseMax(key.cast<double>());
    }
    cache_.append(t, k, v);
  }

  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    const int64_t m = cache_.size(), pages = int64_t(lo_.size());
    const int64_t dense_limit = memory_ >= 0 ? memory_ : budget_;
    if (m <= dense_limit) {  // everything fits: dense attention, no metadata read
      loaded_tokens_ = m;
      if (out) cache_.answer_group(q, out);
      return;
    }
    const int64_t last = pages - 1, last_len = m - last * S_;
    const int64_t others = memory_ >= 0 ? (memory_ - pages - last_len) / S_ : budget_ / S_ - 1;
    if (others < 0)
      throw Error("quest: memory " + std::to_string(memory_) + " cannot hold the " + std::to_string(pages) +
                  " pages' min/max and the current page at step " + std::to_string(m));
    // The group's bounds per page (group_agg), top `others` pages (ties: the earlier page) + the last.
    GroupAggregate agg(agg_, last);
    VecD u(last);
    for (Eigen::Index g = 0; g < q.rows(); ++g) {
      for (int64_t p = 0; p < last; ++p)
        u[p] = q.row(g).transpose().cwiseProduct(lo_[size_t(p)]).cwiseMax(q.row(g).transpose().cwiseProduct(hi_[size_t(p)])).sum();
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
    rows_.clear();
    for (int64_t p : order)
      for (int64_t j = p * S_; j < std::min(m, (p + 1) * S_); ++j) rows_.push_back(j);
    loaded_tokens_ = int64_t(rows_.size()) + pages;  // + the metadata: one token's K+V worth per page
    if (!out) return;
    const int64_t r = int64_t(rows_.size());
    keys_.resize(r, d_);
    values_.resize(r, d_);
    for (int64_t i = 0; i < r; ++i) {  // positions are slots: token j sits in slot j
      keys_.row(i) = cache_.keys().row(rows_[size_t(i)]);
      values_.row(i) = cache_.values().row(rows_[size_t(i)]);
    }
    attend_cached_group(keys_, values_, r, q, P_, Z_, ls_);
    for (Eigen::Index g = 0; g < q.rows(); ++g) {
      Answer& a = (*out)[g];
      a.z = Z_.row(g).transpose();
      a.has_kept = true;
      a.kept = rows_;
    }
  }

  int64_t cache_tokens() const override { return cache_.size(); }
  int64_t cache_vectors() const override { return 2 * cache_.size() + 2 * int64_t(lo_.size()); }
  double loaded_bytes(int head_dim) const override { return double(2 * loaded_tokens_) * head_dim * sizeof(float); }
  bool capacity_matched() const override { return true; }

 private:
  const int64_t budget_, memory_, S_;
  const GroupAgg agg_;
  const int d_;
  SlotCache cache_;  // double storage: slot j holds token j
  std::vector<VecD> lo_, hi_;
  int64_t loaded_tokens_ = 0;
  std::vector<int64_t> rows_;
  MatD keys_, values_, P_, Z_;
  VecD ls_;
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
