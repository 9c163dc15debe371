// Fused state-machine kernels (see policies.cu's header): h2o and buzz, one block per KV head; their
// per-step attention is attend_step.cuh's.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kvsim/core/hd.hpp"
#include "attend_step.cuh"
#include "block_logits.cuh"
#include "policy_kernels.cuh"

namespace kvsim::cuda_impl {
// block_tile_logits borrows the kernels' value-reduction scratch (red) for its panels.
static_assert(kTileScratchFloats * sizeof(float) <= kStateWarps * kValueDims * sizeof(double), "tile scratch fits red");
static_assert(kStateThreads == 256, "block_tile_logits lays 256 threads over a 64 × 64 tile");

namespace {
struct NoDrop {
  __device__ void operator()(const BuzzTok&) const {}
};

/// BuzzPolicy::observe(t) on one thread: sink first; then the window; the window's oldest token joins
/// the body as new; the body evicts (hd::buzz_evict) when old + new reaches T.
__device__ void buzz_observe(long long t, long long sink, long long w, long long T, long long stride, BuzzTok* sk,
                             BuzzTok* ring, BuzzTok* neu, BuzzTok* old, long long& n_sink, long long& n_old,
                             long long& n_new, long long& ring_head, long long& ring_count) {
  const BuzzTok x{t, 0.0};
  if (n_sink < sink) sk[n_sink++] = x;
  else if (ring_count < w) ring[(ring_head + ring_count++) % w] = x;
  else {
    neu[n_new++] = ring[ring_head];
    ring[ring_head] = x;
    ring_head = (ring_head + 1) % w;
    if (n_old + n_new >= T) {
      n_old = hd::buzz_evict(old, n_old, neu, n_new, stride, NoDrop{});
      n_new = 0;
    }
  }
}

/// buzz_kernel's state arrays laid out in shared memory from p (buzz_smem_bytes): the same arrays,
/// read and written every step, at shared-memory latency instead of global.
__device__ void buzz_state_in_smem(char* p, long long ns, long long w, long long T, long long cap, BuzzTok*& sk,
                                   BuzzTok*& ring, BuzzTok*& neu, BuzzTok*& old, long long*& lst, double*& pr, double*& pa,
                                   float*& lg) {
  sk = reinterpret_cast<BuzzTok*>(p);
  ring = sk + ns;
  neu = ring + w;
  old = neu + T;
  p = reinterpret_cast<char*>(old + T);
  lst = reinterpret_cast<long long*>(p);
  pr = reinterpret_cast<double*>(p + 8 * cap);
  pa = reinterpret_cast<double*>(p + 16 * cap);
  lg = reinterpret_cast<float*>(p + 24 * cap);
}

/// H2O's victim among the B full slots at step t: the lowest score outside the recent window under
/// hd::h2o_prefer (a total order, ties to the oldest), so this block-wide arg-min (per thread, per
/// warp by shuffles, then over the warps in order) is the CPU's serial pick; −1 when none is
/// evictable. ws, wp, wb: shared, kStateWarps entries each. Every thread calls it and gets the slot.
__device__ long long h2o_victim(const long long* pos, const double* score, long long B, long long t, long long recent,
                                double* ws, long long* wp, long long* wb) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  long long b = -1, bp = 0;
  double bs = 0.0;
  for (long long s = tid; s < B; s += blockDim.x) {
    const long long ps = pos[s];
    const double sc = score[s];
    if (hd::h2o_evictable(ps, t, recent) && (b < 0 || hd::h2o_prefer(sc, ps, bs, bp))) {
      b = s;
      bs = sc;
      bp = ps;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const long long ob = __shfl_xor_sync(0xffffffffu, b, off), op = __shfl_xor_sync(0xffffffffu, bp, off);
    const double os = __shfl_xor_sync(0xffffffffu, bs, off);
    if (ob >= 0 && (b < 0 || hd::h2o_prefer(os, op, bs, bp))) {
      b = ob;
      bs = os;
      bp = op;
    }
  }
  if (lane == 0) {
    wb[warp] = b;
    ws[warp] = bs;
    wp[warp] = bp;
  }
  __syncthreads();
  long long slot = -1;
  for (int w = 0; w < kStateWarps; ++w)
    if (wb[w] >= 0 && (slot < 0 || hd::h2o_prefer(ws[w], wp[w], bs, bp))) {
      slot = wb[w];
      bs = ws[w];
      bp = wp[w];
    }
  __syncthreads();
  return slot;
}

/// kept row `kr` [cap]: the cache's tokens pos_of(j) for j < m, −1 beyond (every thread calls it).
template <class PosOf>
__device__ void write_kept_row(long long* kr, long long cap, long long m, PosOf pos_of) {
  for (long long j = threadIdx.x; j < cap; j += blockDim.x) kr[j] = j < m ? pos_of(j) : -1;
}

/// buzz at a block's start (lst[0, m0): the cache then): col[tok] = the token's index there, then the
/// block's tile (block_tile_logits).
__device__ void buzz_block_start(const float* Q, const float* Kh, float scale, int h0, int group, long long n, int d,
                                 long long t0, long long bk, const long long* lst, long long m0, int* col, float* tile,
                                 long long ld, double* red) {
  for (long long j = threadIdx.x; j < m0; j += blockDim.x) col[lst[j]] = int(j);
  block_tile_logits(Q, Kh, scale, h0, group, n, d, t0, bk, lst, m0, tile, ld, reinterpret_cast<float*>(red));
}

}  // namespace

/// h2o: grid (kv_heads), one block of kStateThreads per KV head, stepping t = 0..n−1. State (global):
/// pos [kv_heads][B], score [kv_heads][B] (double), the step's combined attention pr [kv_heads][B] and
/// one query head's pa [kv_heads][B] (double), logits lg [kv_heads][B]. Outputs as
/// sink_window_kernel (kept: slot order, −1 padded); *error set to 1 if no token was evictable
/// (recent ≥ budget: refused on the host already). bk > 0: blocked stepping (block_logits.cuh), the
/// block's logits in tile_all [kv_heads][group·bk][B + bk]; 0: each step's logits by warp_logits.
__global__ void h2o_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, float scale,
                           long long B, long long recent, int agg, const long long* steps, int rows, float* z,
                           double* log_sum, long long* kept, long long* pos_all, double* score_all, double* pr_all,
                           double* pa_all, float* lg_all, int* error, bool smem_state, long long bk, float* tile_all) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  extern __shared__ __align__(16) float qs[];  // [d], then (smem_state) the state below
  long long* pos = pos_all + (long long)kvh * B;
  double* score = score_all + (long long)kvh * B;
  double* pr = pr_all + (long long)kvh * B;
  double* pa = pa_all + (long long)kvh * B;
  float* lg = lg_all + (long long)kvh * B;
  if (smem_state) {  // the same arrays in shared memory (h2o_smem_bytes): every step reads them all
    char* p = reinterpret_cast<char*>(qs) + state_offset(d);
    pos = reinterpret_cast<long long*>(p);
    score = reinterpret_cast<double*>(p + 8 * B);
    pr = reinterpret_cast<double*>(p + 16 * B);
    pa = reinterpret_cast<double*>(p + 24 * B);
    lg = reinterpret_cast<float*>(p + 32 * B);
  }
  __shared__ hd::OnlineSoftmax<double> sw[kStateWarps];
  __shared__ double red[kStateWarps * kValueDims];
  __shared__ double ws[kStateWarps];
  __shared__ long long wp[kStateWarps], wb[kStateWarps];  // h2o_victim's per-warp bests
  auto slot_pos = [&](long long s) { return pos[s]; };
  const long long ld = B + bk;
  float* tile = bk > 0 ? tile_all + (long long)kvh * group * bk * ld : nullptr;
  long long size = 0, t0 = 0, size0 = 0;
  int r = 0;
  for (long long t = 0; t < n; ++t) {
    if (bk > 0 && t % bk == 0) {  // a block starts: its logits over the cache as it is now, and its own tokens
      t0 = t, size0 = size;
      block_tile_logits(Q, Kh, scale, kvh * group, group, n, d, t0, bk, pos, size0, tile, ld, reinterpret_cast<float*>(red));
    }
    // observe(t): fill, or evict the lowest-score non-recent token (hd::h2o_prefer, a total order with
    // ties to the oldest, so this arg-min picks the CPU's serial victim).
    long long slot = size;
    if (size == B) {
      slot = h2o_victim(pos, score, B, t, recent, ws, wp, wb);
      if (slot < 0) {
        if (tid == 0) *error = 1;
        return;
      }
    } else {
      ++size;
    }
    if (tid == 0) {
      pos[slot] = t;
      score[slot] = 0.0;
    }
    for (long long s = tid; s < size; s += blockDim.x) pr[s] = 0.0;
    __syncthreads();
    // attend(q_{t+1}): each query head's attention over the cache, combined into the scores.
    const bool eval = r < rows && steps[r] == t + 1;
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      step_logits(tile, bk, ld, g, t, t0, size0, [](long long s, long long) { return s; }, Q + ((long long)h * n + t) * d,
                  scale, qs, Kh, d, size, slot_pos, lg);
      __syncthreads();
      hd::OnlineSoftmax<double> st;
      for (long long s = tid; s < size; s += blockDim.x) st.add(double(lg[s]));
      const hd::OnlineSoftmax<double> tot = block_merge_shfl(st, sw);
      for (long long s = tid; s < size; s += blockDim.x) {
        const double p = tot.prob(double(lg[s]));
        pa[s] = p;
        pr[s] = hd::group_combine(pr[s], p, agg);
      }
      __syncthreads();
      if (eval) {
        warp_values(pa, Vh, d, size, slot_pos, red, z + ((long long)h * rows + r) * d);
        if (tid == 0) log_sum[(long long)h * rows + r] = tot.log_tau();
      }
    }
    for (long long s = tid; s < size; s += blockDim.x) score[s] += hd::group_result(pr[s], agg, group);
    if (eval) write_kept_row(kept + ((long long)kvh * rows + r++) * B, B, size, slot_pos);
    __syncthreads();
  }
}

/// buzz: grid (kv_heads), one block of kStateThreads per KV head, the CPU policy's state in global
/// scratch: sink [kv_heads][sink], window ring [kv_heads][w], new and old body tokens
/// [kv_heads][T] each; per step the cached list (sink, old, new, window oldest first: the CPU's
/// answer order) in lst [kv_heads][cap], its step attention pr [kv_heads][cap], one query head's
/// λ-scaled weights pa [kv_heads][cap] and logits lg [kv_heads][cap]. Outputs as kept_attend_kernel,
/// z and log_sum of the λ-scaled logits. bk > 0: blocked stepping as h2o_kernel's (tile_all
/// [kv_heads][group·bk][cap + bk]; col_all [kv_heads][n], a token's index in the list at the block's start).
__global__ void buzz_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, float scale,
                            long long sink, long long w, long long T, long long stride, bool log_scale, int agg,
                            const long long* steps, int rows, float* z, double* log_sum, long long* kept, long long cap,
                            BuzzTok* sink_all, BuzzTok* ring_all, BuzzTok* new_all, BuzzTok* old_all, long long* lst_all,
                            double* pr_all, double* pa_all, float* lg_all, bool smem_state, long long bk,
                            float* tile_all, int* col_all) {
  const int kvh = blockIdx.x, tid = threadIdx.x;
  const float* Kh = K + (long long)kvh * n * d;
  const float* Vh = V + (long long)kvh * n * d;
  const long long ns = sink > 0 ? sink : 1;
  BuzzTok* sk = sink_all + (long long)kvh * ns;
  BuzzTok* ring = ring_all + (long long)kvh * w;
  BuzzTok *neu = new_all + (long long)kvh * T, *old = old_all + (long long)kvh * T;
  long long* lst = lst_all + (long long)kvh * cap;
  double* pr = pr_all + (long long)kvh * cap;
  double* pa = pa_all + (long long)kvh * cap;
  float* lg = lg_all + (long long)kvh * cap;
  extern __shared__ __align__(16) float qs[];  // [d], then (smem_state) the state below
  if (smem_state) buzz_state_in_smem(reinterpret_cast<char*>(qs) + state_offset(d), ns, w, T, cap, sk, ring, neu, old, lst, pr, pa, lg);
  __shared__ hd::OnlineSoftmax<double> sw[kStateWarps];
  __shared__ double red[kStateWarps * kValueDims];
  __shared__ long long n_sink, n_old, n_new, ring_head, ring_count;
  if (tid == 0) n_sink = n_old = n_new = ring_head = ring_count = 0;
  __syncthreads();
  // Entry j of the cached list, in the CPU's order: sink, old, new, then the window oldest first.
  auto at = [&](long long j) -> BuzzTok& {
    if (j < n_sink) return sk[j];
    j -= n_sink;
    if (j < n_old) return old[j];
    j -= n_old;
    if (j < n_new) return neu[j];
    return ring[(ring_head + (j - n_new)) % w];
  };
  auto list_pos = [&](long long j) { return lst[j]; };
  const long long ld = cap + bk;
  float* tile = bk > 0 ? tile_all + (long long)kvh * group * bk * ld : nullptr;
  int* col = bk > 0 ? col_all + (long long)kvh * n : nullptr;  // a token's index in the list at t0
  long long m_prev = 0, t0 = 0, m0 = 0;
  int r = 0;
  for (long long t = 0; t < n; ++t) {
    if (bk > 0 && t % bk == 0) {  // a block starts: lst[0, m_prev) is the cache as it is now
      t0 = t, m0 = m_prev;
      buzz_block_start(Q, Kh, scale, kvh * group, group, n, d, t0, bk, lst, m0, col, tile, ld, red);
    }
    // observe(t) (BuzzPolicy::observe): sink first; then the window; the window's oldest token
    // joins the body as new; the body evicts (hd::buzz_evict) when old + new reaches T.
    if (tid == 0) buzz_observe(t, sink, w, T, stride, sk, ring, neu, old, n_sink, n_old, n_new, ring_head, ring_count);
    __syncthreads();
    const long long m = n_sink + n_old + n_new + ring_count;
    for (long long j = tid; j < m; j += blockDim.x) {
      lst[j] = at(j).pos;
      pr[j] = 0.0;
    }
    __syncthreads();
    // attend(q_{t+1}) (BuzzPolicy::attend): scores from the unscaled softmax, the answer from the
    // λ-scaled one (λ = log_512(t + 1) with log_scale, else 1).
    const bool eval = r < rows && steps[r] == t + 1;
    const double lambda = hd::buzz_log_scale(t + 1, log_scale);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      step_logits(tile, bk, ld, g, t, t0, m0, [&](long long, long long tok) { return (long long)col[tok]; },
                  Q + ((long long)h * n + t) * d, scale, qs, Kh, d, m, list_pos, lg);
      __syncthreads();
      hd::OnlineSoftmax<double> st, sl;
      for (long long j = tid; j < m; j += blockDim.x) {
        st.add(double(lg[j]));
        if (eval) sl.add(lambda * double(lg[j]));
      }
      const hd::OnlineSoftmax<double> tot = block_merge_shfl(st, sw);
      for (long long j = tid; j < m; j += blockDim.x) pr[j] = hd::group_combine(pr[j], tot.prob(double(lg[j])), agg);
      if (eval) {
        const hd::OnlineSoftmax<double> tl = block_merge_shfl(sl, sw);
        for (long long j = tid; j < m; j += blockDim.x) pa[j] = tl.prob(lambda * double(lg[j]));
        __syncthreads();
        warp_values(pa, Vh, d, m, list_pos, red, z + ((long long)h * rows + r) * d);
        if (tid == 0) log_sum[(long long)h * rows + r] = tl.log_tau();
      }
      __syncthreads();
    }
    for (long long j = tid; j < m; j += blockDim.x) at(j).score += hd::group_result(pr[j], agg, group);
    if (eval) write_kept_row(kept + ((long long)kvh * rows + r++) * cap, cap, m, list_pos);
    m_prev = m;
    __syncthreads();
  }
}

}  // namespace kvsim::cuda_impl
