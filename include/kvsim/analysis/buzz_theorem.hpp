// kvsim: BUZZ (Zhao et al., 2024) helpers — the beehive body-size recurrence and Theorem 3.1's T/w rule.
//
// BUZZ §3.3 (Algorithms 1-2): the cache is sink (k) + beehive body + sliding window (w). Tokens
// leaving the window join the body as "new" tokens; when the body (old + new) reaches the threshold
// T, new tokens are cut into segments of stride s and the accumulated-attention argmax of each full
// segment is kept (local max sampling, Alg. 2), old tokens are kept every ŝ = ⌊(s+1)/2⌋ positions
// (interval sampling), and everything kept becomes old. So the body after the j-th eviction is
//     a_j = ⌊a_{j−1} / ŝ⌋ + ⌊(T − a_{j−1}) / s⌋,   a_1 = ⌊T/s⌋.
// This is Appendix D.1's recurrence (10) with its "2a_{n−1}/⌊(s+1)/2⌋" read as a_{n−1}/ŝ — the
// form its own inequality (11) uses (2a/(s+1) for odd s); the printed factor 2 would make the body
// grow past T and contradicts (11)-(12). Its fixed point gives Theorem 3.1 exactly:
//   odd s:  (s²+1)/(s²+s)·a* = T/s  (bounds (12): T/s − 2 < (s²+1)/(s²+s)·limsup a ≤ T/s)
//   even s: (s−1)/s·a*      = T/s  (same argument with ŝ = s/2)
// and "limsup a = w" gives T/w = (s²+1)/(s+1) (odd s) or s − 1 (even s), Eq. (6)/(9).
#pragma once
#include <cstdint>
#include <vector>

namespace kvsim {

inline int64_t buzz_s_hat(int64_t s) { return (s + 1) / 2; }

/// a_j for j = 1..steps (recurrence (10) as above).
std::vector<int64_t> buzz_body_recurrence(int64_t T, int64_t s, int steps);

/// Theorem 3.1 (Eq. 6): the T/w ratio predicted to be optimal for stride s.
double buzz_predicted_T_over_w(int64_t s);

/// The coefficient c(s) with c·limsup a ≈ T/s: (s²+1)/(s²+s) for odd s, (s−1)/s for even s.
double buzz_limit_coefficient(int64_t s);

}  // namespace kvsim
