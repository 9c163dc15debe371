// Internal: the policy-replay kernels of the CUDA module (select_kernels.cu, state_kernels.cu,
// subgen_kernel.cu), launched by replay_policy (policies.cu). Shapes and state are documented at
// each kernel's definition.
#pragma once
#include <cstdint>

namespace kvsim::cuda_impl {

constexpr int kPolicyThreads = 128;
/// kcenter_select_kernel's block: its nearest-center arg-min is a total order ((distance, index)), so
/// the block size never changes the answer.
constexpr int kKcenterThreads = 512;

/// Whether h2o_kernel and buzz_kernel keep their state in shared memory where it fits (default; the
/// runtime.cuda_state_in_shared_memory = false (KVSIM_CUDA_STATE_SMEM=0) turns it off; the bench sets it to time both).
bool state_in_shared_memory();
void set_state_in_shared_memory(bool on);

/// Bytes before a state kernel's shared-memory state: the scaled query (d floats), 16-byte aligned.
__host__ __device__ inline long long state_offset(int d) { return (4LL * d + 15) / 16 * 16; }
/// Dynamic shared memory of h2o_kernel with its state there: pos, score, pr, pa (8 bytes each) and
/// lg (4 bytes) per slot of the budget B.
inline long long h2o_smem_bytes(int d, long long B) { return state_offset(d) + 36 * B; }

/// A BUZZ cache entry: token position and accumulated (group-aggregated) attention score.
struct BuzzTok {
  long long pos;
  double score;
};

/// Dynamic shared memory of buzz_kernel with its state there: the sink, window, new and old token
/// lists (16-byte BuzzTok), then lst, pr, pa (8 bytes) and lg (4 bytes) per cached entry.
inline long long buzz_smem_bytes(int d, long long sink, long long w, long long T, long long cap) {
  return state_offset(d) + 16 * ((sink > 0 ? sink : 1) + w + 2 * T) + 28 * cap;
}

__global__ void kept_attend_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d,
                                   float scale, const long long* steps, int rows, const long long* kept, long long cap,
                                   const double* bias, float* z, double* log_sum, float* lg);

__global__ void sink_window_select_kernel(long long sink, long long window, const long long* steps, int rows,
                                          long long* kept);

__global__ void uniform_select_kernel(const unsigned long long* seeds, long long B, const long long* steps, int rows,
                                      long long* pos_all, long long* kept);

__global__ void oracle_select_kernel(const float* Q, const float* K, int group, long long n, int d, double scale,
                                     long long B, int agg, const long long* steps, int rows, int r0, long long n_pad,
                                     double* sc_all, double* lg_all, long long* idx_all, long long* kept);

__global__ void kcenter_select_kernel(const float* K, long long n, int d, long long recent, long long kc, bool weighted,
                                      const long long* steps, int rows, long long cap, int64_t* id_all,
                                      double* count_all, long long* kept, double* bias);

__global__ void h2o_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, float scale,
                           long long B, long long recent, int agg, const long long* steps, int rows, float* z,
                           double* log_sum, long long* kept, long long* pos_all, double* score_all, double* pr_all,
                           double* pa_all, float* lg_all, int* error, bool smem_state, long long bk, float* tile_all);

__global__ void subgen_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, double scale,
                              double delta0, long long s, long long tt, long long max_clusters, long long cap_m,
                              const unsigned long long* seeds, const long long* steps, int rows, float* z,
                              double* log_sum, long long* kept, long long* rep_all, long long* cnt_all,
                              long long* keep_all, long long* samp_all, long long* midx_all, double* mvsq_all,
                              double* lg_all, int* error);

__global__ void buzz_kernel(const float* Q, const float* K, const float* V, int group, long long n, int d, float scale,
                            long long sink, long long w, long long T, long long stride, bool log_scale, int agg,
                            const long long* steps, int rows, float* z, double* log_sum, long long* kept, long long cap,
                            BuzzTok* sink_all, BuzzTok* ring_all, BuzzTok* new_all, BuzzTok* old_all, long long* lst_all,
                            double* pr_all, double* pa_all, float* lg_all, bool smem_state, long long bk,
                            float* tile_all, int* col_all);

}  // namespace kvsim::cuda_impl
