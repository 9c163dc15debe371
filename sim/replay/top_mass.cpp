// top_mass: the sum of a row's m largest entries by radix select (the metrics' oracle_mass and topk_mass,
// H2O Fig. 2's oracle), declared in include/kvsim/replay/metrics.hpp.
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#if defined(__AVX512F__) || defined(__AVX2__)
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
/// position k ≤ i after reading i); returns their count. Eight at a time with AVX-512's compress store, or four
/// with an AVX2 permutation, where the build has it (the same values in the same order as the scalar loop).
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
#elif defined(__AVX2__)
  // AVX2 has no compress store: the hits of four doubles are moved to the front by a permutation chosen by
  // their 4-bit mask, all four are stored at out + k, and k advances by the hits. The lanes past the hits
  // land at out[k + hits …k + 3], which the next store overwrites; when out is cand they are positions ≤ i + 3,
  // already read. The caller leaves 4 doubles of room past the bucket's count.
  static const auto kCompress = [] {
    std::array<std::array<int32_t, 8>, 16> lut{};
    for (unsigned mask = 0; mask < 16; ++mask) {
      unsigned at = 0;
      for (unsigned j = 0; j < 4; ++j)
        if (mask >> j & 1u) lut[mask][2 * at] = int32_t(2 * j), lut[mask][2 * at + 1] = int32_t(2 * j + 1), ++at;
      for (; at < 4; ++at) lut[mask][2 * at] = 0, lut[mask][2 * at + 1] = 1;
    }
    return lut;
  }();
  const __m256i sign = _mm256_set1_epi64x(INT64_MIN), ones = _mm256_set1_epi64x(-1), zero = _mm256_setzero_si256();
  const __m256i digit_mask = _mm256_set1_epi64x(kTopBuckets - 1), want = _mm256_set1_epi64x(int64_t(b));
  const __m128i count = _mm_cvtsi32_si128(shift);
  for (; i + 4 <= nc; i += 4) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cand + i));
    // order_key: negatives flipped whole, the sign bit set on the others.
    const __m256i key = _mm256_blendv_epi8(_mm256_or_si256(x, sign), _mm256_xor_si256(x, ones), _mm256_cmpgt_epi64(zero, x));
    const __m256i hit = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_srl_epi64(key, count), digit_mask), want);
    const unsigned mask = unsigned(_mm256_movemask_pd(_mm256_castsi256_pd(hit)));
    const __m256i perm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kCompress[mask].data()));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_permutevar8x32_epi32(x, perm));
    k += __builtin_popcount(mask);
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
    // 4 doubles past the bucket's count: extract_bucket's AVX2 path stores four at a time.
    if (scratch.size() < size_t(h->count[size_t(b)]) + 4) scratch.resize(size_t(h->count[size_t(b)]) + 4);
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
