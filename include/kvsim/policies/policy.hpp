// kvsim: the KV-cache policy interface (docs/policies.md) and the parameter map policies are built from.
//
// Stream protocol per (layer, cache) cell, for t = 1..n (SubGen Algorithm 1 order: update, then query):
//   observe(t, k_t, v_t)               token t joins the stream (every policy sees every token)
//   attend(Q̃_t, answers?, probs?)      the group's scaled queries at step t. Called every step when
//                                      needs_every_query() (score-based policies), else only at
//                                      evaluated steps; `answers` is non-null exactly at evaluated steps.
// A policy owns only what a real cache would hold; the engine owns the exact reference.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "kvsim/core/choices.hpp"
#include "kvsim/core/params.hpp"
#include "kvsim/core/hd.hpp"
#include "kvsim/core/types.hpp"

namespace kvsim {

/// What the stream looks like to a policy instance.
struct StreamInfo {
  int64_t n = 0;             ///< total tokens in the stream (budgets given as fractions use it)
  int head_dim = 0;
  int n_queries = 1;         ///< query heads answered by this instance (group size in kv_head mode)
  GroupAgg group_agg = GroupAgg::mean;  ///< how score-based policies combine the group's scores
  uint64_t seed = 0;         ///< seed for this instance (config seed, layer, head, policy index, trial)
  /// `[eval] policy_precision = "float32"`: window, sink, h2o, buzz and uniform hold keys/values in float32
  /// and run their products in float32 (see sim/policies/slot_cache.hpp); false = double.
  bool policy_f32 = false;
  /// `[data] prefill = P` (docs/architecture.md, a replay step by step, prefill then decode): tokens 1..P are the prompt, handed to
  /// kvsim::prefill at once; decoding streams t = P+1..n. 0 = no prompt (every token streams).
  int64_t prefill = 0;
  int kv_head = 0;   ///< this cache's KV head (0-based; in query_head mode the KV head of its query head)
  int layer = 0;     ///< this cache's layer (0-based) ...
  int n_layers = 1;  ///< ... of the model's n_layers
  int n_kv_heads = 0;  ///< the model's KV heads per layer (0: not said; a budgets_file then refuses the stream)
  /// The layers whose caches the policies manage: on a hybrid model whose local sliding-window layers
  /// stay exact (Gemma 3, `[data] local_layers = "exact"`, and the closed loop), the global layers only.
  /// This cache's rank among them and their count; -1 / 0 = `layer` / `n_layers` (every layer managed).
  /// PyramidKV's layer budgets fall with depth over these layers, so they average B where caches exist.
  int managed_layer = -1;
  int n_managed_layers = 0;
  int managed_rank() const { return managed_layer >= 0 ? managed_layer : layer; }
  int managed_count() const { return n_managed_layers > 0 ? n_managed_layers : n_layers; }
  /// The recording's q·k multiplier: prefill's queries arrive multiplied by it (0: not given).
  double softmax_scale = 0;
  /// RoPE as recorded (docs/recordings.md, optional attributes): base θ, pair k turning by
  /// t · θ^(−2k/head_dim) at token t (0 when the recording does not say), on channels (k, k + head_dim/2)
  /// when rope_halves (Hugging Face's rotate_half order), else (2k, 2k + 1).
  double rope_theta = 0;
  bool rope_halves = true;
  bool rope_applied = false;  ///< the recording's rope = "applied": its q and k are post-RoPE
};

/// A policy's answer for one query head at an evaluated step.
struct Answer {
  VecD z;                    ///< the attention output estimate, [head_dim]
  double log_tau = std::numeric_limits<double>::quiet_NaN();  ///< log τ̂ if the policy estimates τ
  bool has_kept = false;     ///< true when the policy's output is attention over a subset of tokens
  std::vector<int64_t> kept; ///< that subset (0-based token indices) when has_kept
};

/// A cache whose content at every step is a closed form of the step: after t tokens it holds the
/// first `sink` tokens and the last `window` ones, [0, min(sink, t)) ∪ [max(sink, t − window), t)
/// (window: sink = 0; StreamingLLM's sink; exact: sink = 0, window = n). See ClosedFormPolicy.
struct ClosedFormCache {
  int64_t sink = 0;
  int64_t window = 0;
  /// The answer's log Σ_{j cached} exp(k_j·q̃) is the policy's log τ̂ (exact: the whole prefix, so τ
  /// itself); false: the policy does not estimate τ (Answer::log_tau stays NaN).
  bool log_tau = false;
  /// Answered in double whatever `[eval] policy_precision` says (exact: the pipeline's check, ~1e-15).
  bool double_only = false;
};

/// A KV-cache policy: what every policy implements. Optional capabilities are separate interfaces
/// a policy class derives from as well (below: PromptCompressor, ClosedFormPolicy, ExactProbsOracle,
/// GlobalScoresOracle, PartialLoad, LayerMemoryShare; the GPU replay's GpuReplayable lives in
/// include/kvsim/policies/gpu_replay.hpp, so a plain policy neither sees nor compiles against CUDA).
/// The engine asks for them with the free functions after these classes.
class Policy {
 public:
  virtual ~Policy() = default;
  virtual void observe(int64_t t, const float* k, const float* v) = 0;
  /// `q_scaled` is [n_queries, head_dim] = softmax_scale · q. `exact_probs[i]`, when given (only to
  /// ExactProbsOracle baselines, and only at evaluated steps), points at the exact a_t (length t) of
  /// query i.
  virtual void attend(int64_t t, const MatD& q_scaled, std::vector<Answer>* answers,
                      const std::vector<const double*>* exact_probs) = 0;
  /// True when attend() must see every step's query (score-based policies); otherwise it is called
  /// only at evaluated steps.
  virtual bool needs_every_query() const { return false; }
  /// Tokens held in the cache now.
  virtual int64_t cache_tokens() const = 0;
  /// Stored vectors of dimension head_dim now (keys + values + representatives...).
  virtual int64_t cache_vectors() const { return 2 * cache_tokens(); }
  /// Bytes held now (cache_bytes, docs/policies.md): stored vectors × head_dim × 4 (float32, kvsim's full
  /// precision); quantized caches (kivi) count their codes, scales and zero points instead.
  virtual double cache_bytes(int head_dim) const { return double(cache_vectors()) * head_dim * sizeof(float); }
  /// Number of key clusters the policy maintains (SubGen's m', k-center's centers); NaN if none.
  virtual double clusters() const { return std::numeric_limits<double>::quiet_NaN(); }
  /// Equal-memory matching rule under `memory = M`: false (default) — the cache holds exactly
  /// min(M, t) tokens' worth of vectors at every step (±2%); true — the policy's size oscillates by
  /// design (BUZZ's batch evictions, k-center's merges, SubGen's cluster merges), so it is matched
  /// on *capacity*: it never stores more than M tokens' worth (+2%), and its mean occupancy
  /// (summary cache_bytes) shows how much of M it actually uses.
  virtual bool capacity_matched() const { return false; }
};

/// Compresses a prompt at prefill (`[data] prefill = P`: snapkv, pyramidkv): receives the prompt's P
/// tokens at once, before decoding step P+1. K, V are [≥ P, head_dim] (rows 0..P−1 are the prompt);
/// q_scaled[i] is [≥ P, head_dim], the scaled queries of the i-th query head this instance answers.
class PromptCompressor {
 public:
  virtual ~PromptCompressor() = default;
  virtual void prefill(int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled) = 0;
};

/// A cache whose kept set at step t is a closed form of t (ClosedFormCache) and whose answer is
/// exact attention over it, in the stream and after a prefill alike, with no state beyond it. The
/// CPU engine then answers a block of evaluated steps at once with banded masked GEMMs
/// (include/kvsim/replay/banded.hpp; `[eval] closed_form = "per_step"` turns that off) and never
/// steps the instance: its cache size is the closed form's min(t, sink + window) tokens.
class ClosedFormPolicy {
 public:
  virtual ~ClosedFormPolicy() = default;
  virtual ClosedFormCache closed_form() const = 0;
};

/// A non-causal oracle baseline that reads the exact attention row a_t at evaluated steps
/// (oracle_topk): the engine passes it as attend()'s `exact_probs`.
class ExactProbsOracle {
 public:
  virtual ~ExactProbsOracle() = default;
};

/// A non-causal oracle that ranks tokens by the attention of *all* queries (H2O's "global" heavy
/// hitters, H2O §3 / Fig. 2): when needs_global_scores(), the engine calls set_global_scores once
/// before the stream with, per query head answered, g(j) = Σ_{i ≥ j} a_i(j) over the whole stream.
class GlobalScoresOracle {
 public:
  virtual ~GlobalScoresOracle() = default;
  virtual bool needs_global_scores() const = 0;
  virtual void set_global_scores(const std::vector<const VecD*>& per_query_head) = 0;
};

/// A cache that loads part of what it stores to answer a query (quest: the page metadata and the
/// selected pages); `memory = M` is then matched on loaded_bytes instead of cache_bytes.
class PartialLoad {
 public:
  virtual ~PartialLoad() = default;
  /// Bytes read to answer one query (loaded_bytes, docs/policies.md).
  virtual double loaded_bytes(int head_dim) const = 0;
};

/// A cache whose share of the equal-memory target M depends on its layer (PyramidKV's layer budgets:
/// the layers' shares average to 1 over the model's layers).
class LayerMemoryShare {
 public:
  virtual ~LayerMemoryShare() = default;
  virtual double memory_share() const = 0;
};

/// The evaluated steps inside a block and what a BlockStepper fills for each (`[eval] every` = 1 puts every step
/// of a block here). `steps` ascending within [t_first, t_last]; answers[k] holds one Answer per query row, as
/// attend() fills them at step steps[k], and cache_bytes[k] the policy's cache_bytes(head_dim) then.
struct BlockAnswers {
  std::vector<int64_t> steps;
  std::vector<std::vector<Answer>> answers;
  std::vector<double> cache_bytes;
  /// cache_tokens() at each of `steps` (the metric reads it there, not at the block's end).
  std::vector<int64_t> cache_tokens;
  /// A PartialLoad's loaded_bytes(head_dim) at each of `steps` (what the step read); NaN for any other cache.
  std::vector<double> loaded_bytes;
  /// clusters() at each of `steps` (SubGen's m' grows inside a block; the metric reads it at the step).
  std::vector<double> clusters;
  /// `steps` with fresh answers (`rows` empty Answers each), cache_bytes, loaded_bytes and clusters (NaN), cache_tokens (−1).
  void reset(const std::vector<int64_t>& steps_in_block, size_t rows);
  /// What the metrics read from the cache itself at evaluated step k, taken from `p` now: cache_bytes(head_dim),
  /// cache_tokens() and clusters(). Every BlockStepper calls it at each evaluated step, as the step stands.
  void record_state(size_t k, const Policy& p, int head_dim);
  /// k with steps[k] == t, or −1 when step t is not evaluated.
  int64_t index_of(int64_t t) const;
  /// Throws Error (naming `who`) unless steps are ascending within [t_first, t_last] and sized as reset() sizes them.
  void check(int64_t t_first, int64_t t_last, const std::string& who) const;
};

/// Blocked stepping (`[eval] stepping = "blocked"`; docs/performance.md "Blocked stepping"): a policy that advances a run of
/// consecutive steps at once. step_block(t_first, t_last, …) must equal, for t = t_first … t_last in order,
/// observe(t − 1, K[t − 1], V[t − 1]) then attend(t, Q̃_t, …) with Q̃_t's row g = q_scaled[g]->row(t − 1),
/// with answers (when `out` is non-null) filled at every step in out->steps, from the cache as it stands at that
/// step. The logit q_t·k_j depends on the query and
/// the key, never on what the cache holds; the cache's state decides only which j are present. So the
/// run's logits can come from one GEMM over the keys present at its start plus its own keys, and the walk
/// that follows applies each step's eviction, softmax and score update in O(cache) per step. Equal to the
/// per-step path up to the dot products' summation order (float64: ≤ 1e-12 relative; float32: ≤ 1e-5, kept
/// sets equal except near-ties). A policy that reads only the evaluated queries (kivi, quest, subgen, and the policies that
/// answer from a slot store of the stream's own rows: SlotAnswersStepper, sim/policies/slot_cache.hpp) may be one
/// too: its block answers the evaluated steps it holds together, with no walk between them (subgen: its keys'
/// distances to the representatives come from one product per block). A PartialLoad that is one
/// (quest) reports what each evaluated step loaded in BlockAnswers::loaded_bytes.
class BlockStepper {
 public:
  virtual ~BlockStepper() = default;
  /// K, V: [≥ t_last, head_dim] (row t − 1 is token t − 1); q_scaled[g]: [≥ t_last, head_dim]. Throws Error
  /// when the steps fall outside the stream or out->steps outside [t_first, t_last] or not ascending.
  virtual void step_block(int64_t t_first, int64_t t_last, const MatF& K, const MatF& V,
                          const std::vector<const MatD*>& q_scaled, BlockAnswers* out) = 0;
  /// True for a policy that reads only the evaluated queries and answers a block's evaluated steps
  /// together (kivi); otherwise block_stepper() requires needs_every_query().
  virtual bool blocks_evaluated_steps() const { return false; }
};

/// A step_block call's arguments, checked once for every BlockStepper: throws Error (naming `who`) when the
/// steps fall outside the stream of K's rows or there is no query head, then out->check when `out` is given.
void check_step_block(int64_t t_first, int64_t t_last, const MatF& K, const std::vector<const MatD*>& q_scaled,
                      const BlockAnswers* out, const std::string& who);

/// The tokens t_first − 1 … t_last − 1 (rows of K, V) observed by `p` in order; at each of out's evaluated steps
/// (out may be null) its cache_bytes(K.cols()), cache_tokens() and clusters() are recorded there
/// (BlockAnswers::record_state) and `at_evaluated` is called: the first half of a block stepper that reads only
/// evaluated queries (kivi, quest, subgen, SlotAnswersStepper).
void observe_block(Policy& p, int64_t t_first, int64_t t_last, const MatF& K, const MatF& V, BlockAnswers* out,
                   const std::function<void()>& at_evaluated);

/// `p` as a BlockStepper, or null (also when it reads only evaluated queries and is not one that blocks
/// them, blocks_evaluated_steps()).
BlockStepper* block_stepper(Policy& p);
/// Steps per block for a cache of `cache_tokens` entries answering `n_queries` query heads: the block's
/// logits (b · n_queries rows × (cache_tokens + b) columns, in double) kept near 4 MiB, so they stay in
/// cache while the walk reads them, and b in [16, 256] so the GEMM has rows to amortize packing over.
int64_t stepping_block_size(int64_t cache_tokens, int n_queries);

/// Test hook (tests/unit/test_blocked.cpp's negative control): when true, a blocked walk leaves a slot
/// that a block token took over reading the *evicted* token's logit, as a block with its masking switched
/// off would. Never set outside tests.
extern bool g_blocked_masking_off;

/// The prompt's P tokens to `p`: PromptCompressor::prefill, or, for every other policy, the prompt
/// streamed through observe() (and attend() without answers when needs_every_query()), exactly as
/// without a prefill. `block` > 0: a BlockStepper streams the prompt `block` steps at a time (blocked
/// stepping); 0: one step at a time.
void prefill(Policy& p, int64_t P, const MatF& K, const MatF& V, const std::vector<const MatD*>& q_scaled,
             int64_t block = 0);
/// `p`'s closed form if it is a ClosedFormPolicy.
std::optional<ClosedFormCache> closed_form(const Policy& p);
bool needs_exact_probs(const Policy& p);
/// True when `p` is a GlobalScoresOracle that asks for the scores (h2o with score = "oracle").
bool needs_global_scores(const Policy& p);
/// GlobalScoresOracle::set_global_scores; throws kvsim::Error for any other policy.
void set_global_scores(Policy& p, const std::vector<const VecD*>& per_query_head);
/// Bytes read to answer one query: PartialLoad's, else cache_bytes.
double loaded_bytes(const Policy& p, int head_dim);
/// True when `memory = M` is matched on loaded_bytes (a PartialLoad cache) instead of cache_bytes.
bool matched_on_loaded(const Policy& p);
/// This cache's share of M: LayerMemoryShare's, else 1.
double memory_share(const Policy& p);

/// Combines a KV group's per-query-head vectors (attention, scores) by `group_agg` (docs/policies.md):
/// "sum" and "mean" add them ("mean" divides by the count in result()), "max" takes the elementwise
/// maximum. ranking() is the undivided accumulator, ordered like result(). The element rule is
/// hd::group_combine / hd::group_result, shared with the CUDA path.
class GroupAggregate {
 public:
  GroupAggregate(GroupAgg agg, Eigen::Index size) : agg_(static_cast<int>(agg)), acc_(VecD::Zero(size)) {}
  void add(const Eigen::Ref<const VecD>& p) {
    // hd::group_combine's rule, written with Eigen's vectorized max/+ (exact operations, so equal to
    // folding group_combine element by element: tests/unit/test_hd.cpp checks it).
    if (agg_ == hd::kAggMax) acc_ = acc_.cwiseMax(p);
    else acc_ += p;
    ++count_;
  }
  VecD result() const {
    VecD out;
    result_into(out);
    return out;
  }
  const VecD& ranking() const { return acc_; }
  /// Starts over for `size` entries (keeping the storage when the size is unchanged).
  void reset(Eigen::Index size) {
    acc_.setZero(size);
    count_ = 0;
  }
  /// result() written into `out` (no allocation when out already has the size).
  void result_into(VecD& out) const {
    if (count_ == 0) {
      out = acc_;
      return;
    }
    const int agg = agg_, c = count_;
    out = acc_.unaryExpr([agg, c](double a) { return hd::group_result(a, agg, c); });
  }

 private:
  int agg_;
  VecD acc_;
  int count_ = 0;
};

/// Builds the registered policy `name` (include/kvsim/policies/registry.hpp) for one stream. A
/// `memory = M` parameter (tokens, or a fraction of n) is first replaced by the policy's equal-memory
/// rule (docs/policies.md: exact min(M, t) tokens' worth at every step, or a capacity for policies whose
/// size oscillates by design — Policy::capacity_matched); the engine checks the rule at every
/// evaluated step. With `budgets_file` (include/kvsim/policies/budgets.hpp) beside `memory`, M is this
/// cache's budget from the file (info.layer, info.kv_head). Throws kvsim::Error naming the policy and
/// parameter on bad input (unknown parameters included).
std::unique_ptr<Policy> make_policy(const std::string& name, const Params& params, const StreamInfo& info);

/// The checks of a [[policy]] entry that need no stream, made when a config is loaded (so a typo fails
/// before any data is read): the name is registered; every key is a documented parameter of it (or
/// `memory`, when it has an equal-memory rule, and then none of the parameters that rule replaces);
/// each value has its documented kind ("tokens": a count ≥ 0 or a fraction in (0, 1]); no "required"
/// parameter is missing unless `memory` is given. Everything that depends on the stream (n, head_dim,
/// the prompt, the layer) is checked once, by make_policy with the real stream (run_experiment's
/// up-front pass over the planned cells). Throws kvsim::Error naming the policy and the key.
void check_policy_spec(const std::string& name, const Params& params);

/// M in tokens for a `memory` parameter (a fraction is of n); −1 when `memory` is not given.
int64_t memory_target_tokens(const Params& params, int64_t n);

/// The equal-memory target of the cache `s` describes: its budget from the policy's `budgets_file`
/// (include/kvsim/policies/budgets.hpp) when it has one, else memory_target_tokens(params, s.n).
int64_t cell_memory_tokens(const Params& params, const StreamInfo& s);

/// Names accepted by make_policy.
std::vector<std::string> policy_names();

/// Exact attention over an explicit set of cached tokens, in double with a log-domain softmax.
/// keys/values are [m, d]; returns z (= softmax-weighted values) and log Σ exp(logits).
void attend_cached(const MatD& keys, const MatD& values, int64_t m, const Eigen::Ref<const VecD>& q, VecD& z,
                   double& log_sum);

/// The same for a group of G queries sharing one cache (a KV head's query group): q is [G, d];
/// on return P is [m, G] (column g = softmax of query g's logits, contiguous), Z is [G, d] and log_sum[g] =
/// log Σ exp(logits of query g). m = 0 gives Z = 0 and log_sum = −∞. with_values = false skips the
/// Vᵀp products and leaves Z = 0 (a policy that only scores its cache: a prompt streamed at prefill).
void attend_cached_group(const MatD& keys, const MatD& values, int64_t m, const MatD& q, ProbsD& P, MatD& Z,
                         VecD& log_sum, bool with_values = true);

}  // namespace kvsim
