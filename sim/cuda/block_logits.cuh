// Internal: blocked stepping for the fused state kernels (h2o and buzz, state_kernels.cu). A block of
// `bk` consecutive steps t0 … t0+bk−1 can only attend to the tokens the cache holds when the block
// starts (S0 of them) and to the block's own tokens, since a token that leaves never returns. So the
// logits of every step of the block, for every query head of the group, are one product
//     T[(g, i)][c] = <scale · q_{g, t0+i}, k_{col c}>,   c < S0: the cache's c-th token, else token t0 + (c − S0),
// formed once per block by the whole thread block as a tiled SGEMM (64 × 64 output tiles, 4 × 4 per
// thread, key chunks of 16 through shared memory), so each key is read once per block and row tile
// instead of once per step and query head. The step walk then looks its logits up (tile_logit):
// a slot still holding a token from before t0 reads column "its index at t0"; a token that entered
// during the block reads its own column. Steps of the block that the cache has not reached yet are
// never read. fp32 products as warp_logits, summed in another order: answers equal the per-step
// kernels' up to rounding (tests/gpu/cuda_parity.cpp holds both to the CPU at 1e-4, identical kept sets).
#pragma once
#include <cuda_runtime.h>

#include "attend_step.cuh"

namespace kvsim::cuda_impl {

constexpr int kTileRows = 64, kTileCols = 64, kTileK = 16, kTilePad = kTileCols + 1;
/// Floats of shared scratch block_tile_logits needs (two kTileK × kTilePad panels).
constexpr int kTileScratchFloats = 2 * kTileK * kTilePad;

/// T[(g·bk + i)·ld + c] for g < group, i < bk, c < S0 + bk (see the header), rows with t0 + i ≥ n
/// and columns past n left unwritten. Q: [heads][n][d] (query head h0 + g), Kh: this KV head's
/// [n][d]; col_pos[c] (c < S0): the token of column c. `sm`: kTileScratchFloats of shared memory.
/// Every thread of the block must call it; it ends with a barrier (T is then readable by all).
__device__ inline void block_tile_logits(const float* Q, const float* Kh, float scale, int h0, int group, long long n,
                                         int d, long long t0, long long bk, const long long* col_pos, long long S0,
                                         float* T, long long ld, float* sm) {
  float* As = sm;                      // [kTileK][kTilePad]: the row tile's queries, k-major
  float* Bs = sm + kTileK * kTilePad;  // [kTileK][kTilePad]: the column tile's keys, k-major
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const long long R = group * bk, C = S0 + bk;
  constexpr int kLoads = kTileRows * kTileK / 256;  // per thread per panel (256 threads)
  for (long long r0 = 0; r0 < R; r0 += kTileRows)
    for (long long c0 = 0; c0 < C; c0 += kTileCols) {
      float acc[4][4] = {};
      for (int k0 = 0; k0 < d; k0 += kTileK) {
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int e = tid + 256 * u, row = e / kTileK, kk = e % kTileK, k = k0 + kk;
          float a = 0.f, b = 0.f;
          const long long gr = r0 + row, gc = c0 + row;
          if (gr < R && k < d) {
            const long long t = t0 + gr % bk;
            if (t < n) a = scale * __ldg(Q + ((long long)(h0 + gr / bk) * n + t) * d + k);
          }
          if (gc < C && k < d) {
            const long long kr = gc < S0 ? col_pos[gc] : t0 + (gc - S0);
            if (kr < n) b = __ldg(Kh + kr * d + k);
          }
          As[kk * kTilePad + row] = a;
          Bs[kk * kTilePad + row] = b;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTileK; ++kk) {
          float a[4], b[4];
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            a[x] = As[kk * kTilePad + ty * 4 + x];
            b[x] = Bs[kk * kTilePad + tx * 4 + x];
          }
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const long long gr = r0 + ty * 4 + i;
        if (gr >= R || t0 + gr % bk >= n) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const long long gc = c0 + tx * 4 + j;
          if (gc < C) T[gr * ld + gc] = acc[i][j];
        }
      }
    }
  __syncthreads();
}

/// The logit of the token at position `tok` for T's row `row` (query head g, step t0 + i): its own
/// column if it entered at or after t0, else column `col` (its index when the block started).
__device__ inline float tile_logit(const float* row, long long tok, long long t0, long long S0, long long col) {
  return tok >= t0 ? row[S0 + (tok - t0)] : row[col];
}

/// lg[j] for j < m, the step's logits over the cache for query row Qrow (query head h at step t):
/// with a tile (blocked stepping), looked up in its row for step t (`col_of(j)`: entry j's index at
/// t0, read only for tokens older than t0); without, by warp_logits over the scaled query (staged in
/// qs, shared). Every thread must call it; lg is readable by all after the caller's next barrier.
template <class PosOf, class ColOf>
__device__ inline void step_logits(const float* tile, long long bk, long long ld, int g, long long t, long long t0,
                                   long long S0, ColOf col_of, const float* Qrow, float scale, float* qs,
                                   const float* Kh, int d, long long m, PosOf pos_of, float* lg) {
  if (tile) {
    const float* row = tile + ((long long)g * bk + (t - t0)) * ld;
    for (long long j = threadIdx.x; j < m; j += blockDim.x) {
      const long long tok = pos_of(j);
      lg[j] = tile_logit(row, tok, t0, S0, tok >= t0 ? 0 : col_of(j, tok));
    }
    return;
  }
  for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = scale * Qrow[i];
  __syncthreads();
  warp_logits(qs, Kh, d, m, pos_of, lg);
}

}  // namespace kvsim::cuda_impl
