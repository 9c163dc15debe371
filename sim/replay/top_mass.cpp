// top_mass: the sum of a row's m largest entries by radix select (the metrics' oracle_mass and topk_mass,
// H2O Fig. 2's oracle), declared in include/kvsim/replay/metrics.hpp.
#include <algorithm>
#include <cstring>
#include <functional>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kvsim/replay/metrics.hpp"

namespace kvsim {

namespace {
/// A 64-bit key whose unsigned order is the doubles' order (negatives flipped whole, the sign bit
/// set on the others), so equal keys are equal values.
inline uint64_t order_key(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return (b >> 63) ? ~b : (b | (uint64_t(1) << 63));
}
}  // namespace

// Radix select, 11 bits of the key at a time from the top: per digit a histogram of counts and sums
// over the candidates; the buckets above the one holding the m-th largest are summed whole, and only
// that bucket's values go on to the next digit (and to nth_element once at most 64 are left). An
// attention row spans many binary orders of magnitude, so the first digit (sign and the exponent's
// top 10 bits) leaves few candidates: two passes over the row instead of nth_element's copy and
// partitioning passes (which were ~75% of the metrics' time: KVSIM_PROFILE, docs/performance.md).
// The sum is of the same m values as a full sort's; only its order of additions differs.
namespace {
constexpr int kTopBits = 11, kTopBuckets = 1 << kTopBits, kTopFirstShift = 64 - kTopBits;

/// The first digit's histogram of a row (or of candidates): counts and sums per bucket, in row order.
void first_digit(const double* cand, int64_t nc, int shift, TopMassDigit& h) {
  h.count.assign(kTopBuckets, 0);
  h.sum.assign(kTopBuckets, 0.0);
  for (int64_t i = 0; i < nc; ++i) {
    const unsigned b = unsigned(order_key(cand[i]) >> shift) & (kTopBuckets - 1);
    ++h.count[b];
    h.sum[b] += cand[i];
  }
}

/// Copies, in order, the candidates whose digit at `shift` is b into out (which may be cand itself: it writes
/// position k ≤ i after reading i); returns their count. Eight at a time with AVX-512's compress store where the
/// build has it (the same values in the same order as the scalar loop).
int64_t extract_bucket(const double* cand, int64_t nc, int shift, unsigned b, double* out) {
  int64_t k = 0, i = 0;
#if defined(__AVX512F__)
  const __m512i sign = _mm512_set1_epi64(INT64_MIN), ones = _mm512_set1_epi64(-1), zero = _mm512_setzero_si512();
  const __m512i digit_mask = _mm512_set1_epi64(kTopBuckets - 1), want = _mm512_set1_epi64(int64_t(b));
  const __m128i count = _mm_cvtsi32_si128(shift);
  for (; i + 8 <= nc; i += 8) {
    const __m512i x = _mm512_loadu_si512(cand + i);
    // order_key: negatives flipped whole, the sign bit set on the others.
    const __m512i key = _mm512_mask_mov_epi64(_mm512_or_si512(x, sign), _mm512_cmplt_epi64_mask(x, zero), _mm512_xor_si512(x, ones));
    const __mmask8 hit = _mm512_cmpeq_epi64_mask(_mm512_and_si512(_mm512_srl_epi64(key, count), digit_mask), want);
    _mm512_mask_compressstoreu_pd(out + k, hit, _mm512_castsi512_pd(x));
    k += __builtin_popcount(unsigned(hit));
  }
#endif
  for (; i < nc; ++i)
    if ((unsigned(order_key(cand[i]) >> shift) & (kTopBuckets - 1)) == b) out[k++] = cand[i];
  return k;
}

/// The top-`need` sum of cand[0..nc) added to `total`, from the digit at `shift` on, whose histogram `h`
/// holds (`own`: recomputed here for each later digit).
double refine(const double* cand, int64_t nc, int64_t need, double total, int shift, const TopMassDigit& first,
              std::vector<double>& scratch) {
  TopMassDigit own;
  const TopMassDigit* h = &first;
  for (;; shift = std::max(0, shift - kTopBits)) {
    if (h != &first || shift != kTopFirstShift) {
      first_digit(cand, nc, shift, own);
      h = &own;
    }
    int b = kTopBuckets - 1;
    for (; h->count[size_t(b)] < need; --b) {  // Σ count = nc ≥ need, so this stops at a bucket
      need -= h->count[size_t(b)];
      total += h->sum[size_t(b)];
    }
    if (h->count[size_t(b)] == need) return total + h->sum[size_t(b)];
    if (scratch.size() < size_t(h->count[size_t(b)])) scratch.resize(size_t(h->count[size_t(b)]));
    const int64_t k = extract_bucket(cand, nc, shift, unsigned(b), scratch.data());
    cand = scratch.data();
    nc = k;
    if (shift == 0) {  // every key resolved: the candidates are equal values
      for (int64_t i = 0; i < need; ++i) total += cand[i];
      return total;
    }
    if (nc <= 64) break;
    h = &own;  // the next digit's histogram is of the candidates
  }
  std::nth_element(scratch.begin(), scratch.begin() + (need - 1), scratch.begin() + nc, std::greater<double>());
  for (int64_t i = 0; i < need; ++i) total += scratch[size_t(i)];
  return total;
}
}  // namespace

void top_mass_digit(const double* p, int64_t t, TopMassDigit& h) { first_digit(p, t, kTopFirstShift, h); }

double top_mass(const double* p, int64_t t, int64_t m, std::vector<double>& scratch, const TopMassDigit* digit) {
  if (m >= t) {
    double s = 0;
    for (int64_t j = 0; j < t; ++j) s += p[j];
    return s;
  }
  if (m <= 0) return 0;
  TopMassDigit own;
  if (!digit) {
    top_mass_digit(p, t, own);
    digit = &own;
  }
  return refine(p, t, m, 0.0, kTopFirstShift, *digit, scratch);
}

}  // namespace kvsim
