// kvsim: step logic shared by the CPU path and the CUDA path: one source of truth,
// compiled as __host__ __device__ code by nvcc and as plain inline C++ otherwise, so the CPU tests
// exercise exactly the logic the kernels run.
//
//  - OnlineSoftmax: running max m, Σ e^{l−m} and Σ e^{2(l−m)} of a stream of logits (the
//    flash-attention recurrence, Milakov & Gimelshein 2018), mergeable across threads; gives
//    log τ = m + log s1 (docs/architecture.md, a replay step by step) and ‖a‖₂ = √s2 / s1 (the ‖softmax(Kq)‖ of SubGen Eq. 3).
//  - philox4x32_10: the counter-based generator of Salmon et al. (SC'11, Random123), so CPU and GPU
//    draw identical random numbers from (counter, key) without shared state.
//  - sink_window_slot: where token t goes in a sink + ring-window cache (StreamingLLM / window), and
//    sink_window_token: the same cache's content in closed form (the GPU answers any step directly).
//  - h2o_evictable / h2o_prefer: H2O's eviction rule (H2O §4.1 Algorithm 1): the victim is the
//    lowest accumulated score outside the recent window, ties to the oldest. A total order, so a
//    parallel arg-min on the GPU picks exactly the CPU's victim.
//  - group_combine: group_agg (mean | max | sum) of a KV group's per-query-head attention.
//  - philox_uniform_int / reservoir_slot: `uniform`'s reservoir sampling (Vitter's Algorithm R) with
//    each token's draw a pure function of (stream seed, token): identical samples on both paths.
//  - topk_prefer / bitonic_compare_swap: oracle_topk's order (larger score first, ties to the older
//    position: a total order) and the compare-swap of a bitonic sorting network over it, so the GPU's
//    parallel sort selects exactly the CPU's std::nth_element set.
//  - key_sqdist / kcenter_insert: subgen_kcenter's streaming clustering (Charikar et al.'s doubling
//    algorithm, SubGen ref. [3]) over token ids, with squared key distances summed in a fixed order
//    with explicit fma, so CPU and GPU make bit-identical join/merge decisions.
//  - philox_u01: SubGen Algorithm 1's coin flips as pure functions of (stream seed, token, slot).
//  - buzz_evict: BUZZ's eviction (BUZZ §3.3, Algorithm 2: local max sampling of new tokens,
//    interval sampling of old ones), and buzz_log_scale (§3.5, Eq. 7-8).
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KVSIM_HD __host__ __device__ __forceinline__
#else
#define KVSIM_HD inline
#endif

namespace kvsim::hd {

template <class T>
struct OnlineSoftmax {
  T m = -INFINITY;  ///< running max of the logits
  T s1 = 0;         ///< Σ e^{l − m}
  T s2 = 0;         ///< Σ e^{2(l − m)}

  /// Adds one logit; returns the factor e^{m_old − m_new} by which earlier weights must be rescaled
  /// (1 when the max did not move), so an output accumulator can follow (acc·factor + w·v).
  KVSIM_HD T add(T l) {
    if (l > m) {
      const T f = (m == -INFINITY) ? T(0) : exp(m - l);
      s1 = s1 * f + T(1);
      s2 = s2 * f * f + T(1);
      m = l;
      return f;
    }
    const T w = exp(l - m);
    s1 += w;
    s2 += w * w;
    return T(1);
  }
  /// Merges another partial state (e.g. another thread's share of the keys).
  KVSIM_HD void merge(const OnlineSoftmax& o) {
    if (o.m == -INFINITY) return;
    if (m == -INFINITY) {
      *this = o;
      return;
    }
    const T mm = m > o.m ? m : o.m;
    const T a = exp(m - mm), b = exp(o.m - mm);
    s1 = s1 * a + o.s1 * b;
    s2 = s2 * a * a + o.s2 * b * b;
    m = mm;
  }
  /// Weight of logit l in the softmax: e^{l − m} / s1.
  KVSIM_HD T prob(T l) const { return exp(l - m) / s1; }
  KVSIM_HD T log_tau() const { return m + log(s1); }
  KVSIM_HD T prob_norm() const { return sqrt(s2) / s1; }
};

/// Philox4x32-10 (Random123): 10 rounds of the Philox S-box on a 128-bit counter with a 64-bit key.
struct Philox4 {
  uint32_t v[4];
};
KVSIM_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}
KVSIM_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c.v[0], hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c.v[2], hi1, lo1);
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}
/// A uniform double in [0, 1) from two 32-bit words (53 random bits).
KVSIM_HD double philox_uniform01(uint32_t a, uint32_t b) {
  const uint64_t x = (uint64_t(a) << 21) ^ uint64_t(b >> 11);
  return double(x & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/// An integer uniform in [0, range) (1 ≤ range ≤ 2³²) from Philox4x32-10 at counter (c0, c1, i, 0),
/// i = 0, 1, ...: Lemire's multiply-shift with rejection (ACM TOMACS 2019, "Fast random integer
/// generation in an interval"), so exactly uniform; a rejected word (probability < range / 2³²)
/// moves to the next of the four words, then to the next counter.
KVSIM_HD uint32_t philox_uniform_int(uint64_t range, uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1) {
  const uint32_t thr = uint32_t((uint64_t(1) << 32) % range);  // low words below thr are rejected
  for (uint32_t i = 0;; ++i) {
    const Philox4 r = philox4x32_10(Philox4{{c0, c1, i, 0u}}, k0, k1);
    for (int w = 0; w < 4; ++w) {
      const uint64_t m = uint64_t(r.v[w]) * range;
      if (uint32_t(m) >= thr) return uint32_t(m >> 32);
    }
  }
}

/// A uniform double in [0, 1) for draw (a, b) of a stream: Philox4x32-10 at counter (a, b, tag, 0)
/// with key (seed, seed >> 32). SubGen's coin flips (tags kDrawCluster, kDrawProduct, kDrawMerge).
KVSIM_HD double philox_u01(uint64_t seed, uint32_t a, uint32_t b, uint32_t tag) {
  const Philox4 r = philox4x32_10(Philox4{{a, b, tag, 0u}}, uint32_t(seed), uint32_t(seed >> 32));
  return philox_uniform01(r.v[0], r.v[1]);
}
enum SubGenDraw : uint32_t { kDrawCluster = 0, kDrawProduct = 1, kDrawMerge = 2 };

/// `uniform` (reservoir sampling, Vitter's Algorithm R): the slot token t (0-based) takes in a cache
/// of `budget` slots, or −1 when it is not sampled. Tokens 0..budget−1 fill slots in order; token
/// t ≥ budget draws j uniform in [0, t] (t + 1 tokens seen) from Philox at counter (t, t >> 32) with
/// key (seed, seed >> 32) and replaces slot j when j < budget: every token of the prefix is then in
/// the cache with probability budget / (t + 1). Needs t < 2³².
KVSIM_HD int64_t reservoir_slot(uint64_t seed, int64_t t, int64_t budget) {
  if (t < budget) return t;
  const uint32_t j = philox_uniform_int(uint64_t(t) + 1, uint32_t(seed), uint32_t(seed >> 32), uint32_t(t),
                                        uint32_t(uint64_t(t) >> 32));
  return int64_t(j) < budget ? int64_t(j) : -1;
}
/// `uniform`'s partition-function estimate: τ̂ = (t / m)·Σ_{j∈S} e^{⟨k_j, q̃⟩} over its m sampled
/// tokens out of t, in logs: log_sum + log(t / m) (unbiased for τ; kvsim README "Policies").
KVSIM_HD double uniform_log_tau(double log_sum, int64_t t, int64_t m) { return log_sum + log(double(t) / double(m)); }

/// BUZZ §3.5 (Eq. 7-8): the logit scale λ = log_512(t) after t tokens (t ≥ 1; 1 when off).
KVSIM_HD double buzz_log_scale(int64_t t, bool on) { return on ? log(double(t > 1 ? t : 1)) / log(512.0) : 1.0; }

/// BUZZ's eviction (BUZZ §3.3, Algorithms 1-2), run when the body (old + new) reaches the
/// threshold T. `Tok` has a `score` member (accumulated attention). Old tokens are kept every
/// ŝ = ⌊(s+1)/2⌋ positions (indices ŝ−1, 2ŝ−1, ...: interval sampling); the new tokens are cut into
/// segments of stride s and each full segment keeps its highest score (the first on ties: local max
/// sampling, Alg. 2); a trailing partial segment is dropped. The kept tokens, old then new, are
/// compacted into `old` (capacity ≥ n_old + n_new / s) and their count returned; `drop(tok)` is
/// called for every token not kept.
template <class Tok, class Drop>
KVSIM_HD int64_t buzz_evict(Tok* old, int64_t n_old, const Tok* neu, int64_t n_new, int64_t s, Drop drop) {
  const int64_t sh = (s + 1) / 2;
  int64_t k = 0;
  for (int64_t i = 0; i < n_old; ++i) {
    if (i % sh == sh - 1) old[k++] = old[i];  // k ≤ i: compaction in place
    else drop(old[i]);
  }
  int64_t b = 0;
  for (; b + s <= n_new; b += s) {
    int64_t best = b;
    for (int64_t i = b + 1; i < b + s; ++i)
      if (neu[i].score > neu[best].score) best = i;
    for (int64_t i = b; i < b + s; ++i)
      if (i != best) drop(neu[i]);
    old[k++] = neu[best];
  }
  for (; b < n_new; ++b) drop(neu[b]);
  return k;
}

/// Slot of token t (0-based) in a cache of `sink` first tokens + a ring of `window` recent ones:
/// t < sink + window fills slot t; later tokens replace the oldest window token, slot
/// sink + (t − sink) mod window.
KVSIM_HD int64_t sink_window_slot(int64_t t, int64_t sink, int64_t window) {
  return t < sink + window ? t : sink + (t - sink) % window;
}

/// The j-th cached token (0-based, increasing) of a sink + window cache after `t` tokens (t ≥ 1) have
/// joined: min(t, sink + window) tokens — all of them while t ≤ sink + window, else the first `sink`
/// and the last `window`. The closed form of what sink_window_slot's ring holds (tests/unit/test_hd.cpp).
KVSIM_HD int64_t sink_window_token(int64_t t, int64_t sink, int64_t window, int64_t j) {
  if (t <= sink + window || j < sink) return j;
  return t - window + (j - sink);
}
/// Tokens a sink + window cache holds after t tokens.
KVSIM_HD int64_t sink_window_count(int64_t t, int64_t sink, int64_t window) {
  return t < sink + window ? t : sink + window;
}

/// H2O: may the cached token at position `pos` be evicted when token `t` (0-based) is about to join
/// with the `recent` most recent positions protected (t − recent + 1 .. t)?
KVSIM_HD bool h2o_evictable(int64_t pos, int64_t t, int64_t recent) { return pos <= t - recent; }
/// H2O: is (score_a, pos_a) a better victim than (score_b, pos_b)? Lower score first, then older.
template <class T>
KVSIM_HD bool h2o_prefer(T score_a, int64_t pos_a, T score_b, int64_t pos_b) {
  return score_a < score_b || (score_a == score_b && pos_a < pos_b);
}

/// oracle_topk: does (score_a, pos_a) rank before (score_b, pos_b)? Larger score first, then the
/// older position (a total order on distinct positions, so any correct selection picks one set).
template <class T>
KVSIM_HD bool topk_prefer(T score_a, int64_t pos_a, T score_b, int64_t pos_b) {
  return score_a > score_b || (score_a == score_b && pos_a < pos_b);
}

/// One compare-swap of Batcher's bitonic sorting network over `keys[0, P)` (P a power of two):
/// stage (k, j) with k = 2, 4, ..., P and j = k/2, k/4, ..., 1, element i (any order within a stage:
/// a GPU block runs them in parallel). `before(a, b)` is a strict total order; after every stage has
/// run, keys are sorted by it.
template <class Key, class Before>
KVSIM_HD void bitonic_compare_swap(Key* keys, int64_t i, int64_t j, int64_t k, Before before) {
  const int64_t l = i ^ j;
  if (l <= i) return;
  const Key a = keys[i], b = keys[l];
  const bool ascending = (i & k) == 0;
  if (ascending ? before(b, a) : before(a, b)) {
    keys[i] = b;
    keys[l] = a;
  }
}

/// ‖a − b‖² of two float32 keys of length d, in double, in a fixed order with explicit fma: eight
/// lanes (element i into lane i mod 8, independent chains the CPU can overlap), combined pairwise;
/// bit-identical wherever it is computed (no compiler-chosen contraction or reordering).
KVSIM_HD double key_sqdist(const float* a, const float* b, int d) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= d; i += 8)
    for (int l = 0; l < 8; ++l) {
      const double x = double(a[i + l]) - double(b[i + l]);  // exact: a difference of floats fits a double
      acc[l] = fma(x, x, acc[l]);
    }
  for (int l = 0; i < d; ++i, ++l) {
    const double x = double(a[i]) - double(b[i]);
    acc[l] = fma(x, x, acc[l]);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// ‖a‖² of a float32 vector of length d, in double, in key_sqdist's fixed lane order (SubGen's ‖v‖²).
KVSIM_HD double key_sqnorm(const float* a, int d) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= d; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] = fma(double(a[i + l]), double(a[i + l]), acc[l]);
  for (int l = 0; i < d; ++i, ++l) acc[l] = fma(double(a[i]), double(a[i]), acc[l]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// The nearest center to token new_id: the first index of the smallest sqdist(id[i], new_id) (−1 and
/// +inf when n = 0). A GPU block may compute it in parallel under the (distance, index) order.
template <class SqDist>
KVSIM_HD int64_t kcenter_nearest(const int64_t* id, int64_t n, int64_t new_id, double* bd, SqDist sqdist) {
  int64_t best = -1;
  *bd = INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const double dd = sqdist(id[i], new_id);
    if (dd < *bd) {
      *bd = dd;
      best = i;
    }
  }
  return best;
}

/// kcenter_insert (below) after its nearest-center search: `best`/`bd` are kcenter_nearest's answer
/// (only read when k > 0, R > 0 and n > 0).
template <class SqDist>
KVSIM_HD int64_t kcenter_apply(int64_t* id, double* count, int64_t n, double& radius, int64_t k, int64_t new_id,
                               double new_count, int64_t best, double bd, int64_t* joined, SqDist sqdist) {
  *joined = -1;
  if (k == 0) return n;
  if (n > 0 && radius > 0 && best >= 0 && sqrt(bd) <= 2 * radius) {
    count[best] += new_count;
    *joined = best;
    return n;
  }
  id[n] = new_id;
  count[n] = new_count;
  ++n;
  if (n <= k) return n;
  if (radius == 0) {
    double md = INFINITY;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        const double dd = sqdist(id[i], id[j]);
        if (dd < md) md = dd;
      }
    md = sqrt(md) / 2;
    radius = md > 1e-12 ? md : 1e-12;
  }
  while (n > k) {
    radius *= 2;
    int64_t kept = 0;
    for (int64_t c = 0; c < n; ++c) {  // in place: kept ≤ c
      int64_t best = 0;
      double bd = INFINITY;
      for (int64_t j = 0; j < kept; ++j) {
        const double dd = sqdist(id[j], id[c]);
        if (dd < bd) {
          bd = dd;
          best = j;
        }
      }
      if (sqrt(bd) <= 2 * radius) count[best] += count[c];
      else {
        id[kept] = id[c];
        count[kept] = count[c];
        ++kept;
      }
    }
    n = kept;
  }
  return n;
}

/// subgen_kcenter streaming (SubGen §3.2's practical variant; Charikar, Chekuri, Feder, Motwani's
/// doubling algorithm, SubGen ref. [3]): token `new_id` (weight new_count) joins the nearest of the
/// n centers (ids `id[0, n)`, weights `count`) when within 2R; otherwise it becomes a center, and
/// while there are more than k centers R doubles and each center (in order) merges into the nearest
/// earlier kept one within 2R (weights add). R starts, at the first overflow, at half the closest
/// pair's distance (≥ 1e-12). sqdist(a, b) is ‖k_a − k_b‖² of the tokens with ids a and b (ties in
/// "nearest" go to the lower index). Arrays hold ≥ k + 1 entries. Returns the new n; *joined is the
/// center the token joined, or −1 when the center set changed.
template <class SqDist>
KVSIM_HD int64_t kcenter_insert(int64_t* id, double* count, int64_t n, double& radius, int64_t k, int64_t new_id,
                                double new_count, int64_t* joined, SqDist sqdist) {
  double bd = INFINITY;
  const int64_t best = (k > 0 && radius > 0) ? kcenter_nearest(id, n, new_id, &bd, sqdist) : -1;
  return kcenter_apply(id, count, n, radius, k, new_id, new_count, best, bd, joined, sqdist);
}

/// subgen_kcenter streaming: the window token in ring row j (0 ≤ j < min(T, recent)) after T tokens —
/// row t mod recent holds token t, so the rows hold the last `recent` tokens.
KVSIM_HD int64_t kcenter_window_token(int64_t T, int64_t recent, int64_t j) {
  if (T <= recent) return j;
  const int64_t first = T - recent;  // oldest window token
  return first + ((j - first % recent) % recent + recent) % recent;
}

/// group_agg codes shared by both paths.
enum GroupAgg : int { kAggMean = 0, kAggMax = 1, kAggSum = 2 };
/// Folds one query head's attention p into the accumulator (start from 0 for every agg: attention
/// is ≥ 0); group_result divides by the group size for the mean.
template <class T>
KVSIM_HD T group_combine(T acc, T p, int agg) { return agg == kAggMax ? (p > acc ? p : acc) : acc + p; }
template <class T>
KVSIM_HD T group_result(T acc, int agg, int group) { return agg == kAggMean ? acc / T(group) : acc; }

}  // namespace kvsim::hd
