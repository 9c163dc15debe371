// kvsim CUDA path: the exact pass fused in one kernel (runtime.cuda_exact = flash, the default for
// head_dim 64 and 128). The flash-attention recurrence (Dao et al. 2022, Algorithm 1; Milakov &
// Gimelshein 2018's online softmax) in fp32 on the CUDA cores, so the logits never leave the chip,
// with the key range of each row tile split in chunks (split-K, "flash-decoding") so the causal
// triangle's long rows do not leave SMs idle:
//  - rows: the evaluated query rows of one KV head, [row][group member] flattened to M = rows·group
//    (GQA), in tiles of 64; row m attends to keys 0..t−1 with t = steps[m / group];
//  - one block per (row tile, key chunk, KV head): the scaled Q tile stays in shared memory; per tile
//    of 64 keys it forms S = Q Kᵀ (each thread 4 rows × 4 keys), masks each row at its step, updates
//    the row's running max m, Σ e^{l−m} and Σ e^{2(l−m)} (hd::OnlineSoftmax's three numbers) and
//    rescales its unnormalized output, and adds P V (each thread 4 rows × head_dim/16 dimensions);
//  - a combine kernel merges a tile's chunks (OnlineSoftmax::merge), writes the answer, log τ and ‖a‖;
//  - when the probabilities are asked for, the fused kernel writes each raw logit once and a last
//    kernel turns the row into e^{l − log τ} (0 past the step).
// Parity with the CPU reference is checked by tests/gpu/cuda_parity.cpp at ≤ 1e-4.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common.cuh"

namespace kvsim::cuda_impl {
namespace {

constexpr int BM = 64, BN = 64, kThreads = 256;

template <int D>
constexpr size_t flash_smem_bytes(bool async) {
  return sizeof(float) * size_t(BM * D + (async ? 2 : 1) * BN * D + BN * BM);
}

/// cp.async (sm_80+): 16 bytes global → shared without passing through registers, zero-filled when
/// !valid (src-size 0; `g` must still be a valid address).
__device__ __forceinline__ void cp_async16(float* s, const float* g, bool valid) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(s));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

/// The flash kernel's pieces, one thread's share: rows ty·4 + i (i < 4) of the block's 64, key
/// columns tx + 16c (c < 4) of each key tile, output dimensions tx·4 + 64cc (cc < D/64).
/// O += P V over the key tile's first jn keys (P transposed, float4 groups swizzled by j & 15).
template <int D>
__device__ __forceinline__ void tile_pv(const float* Ps, const float* Vs, int jn, int tx, int ty, float (&O)[4][D / 16]) {
  for (int j = 0; j < jn; ++j) {
    const float4 p = *reinterpret_cast<const float4*>(Ps + j * BM + 4 * (ty ^ (j & 15)));
    for (int cc = 0; cc < D / 64; ++cc) {
      const float4 v = *reinterpret_cast<const float4*>(Vs + j * D + tx * 4 + 64 * cc);
      const float pr[4] = {p.x, p.y, p.z, p.w};
      for (int i = 0; i < 4; ++i) {
        O[i][4 * cc + 0] = fmaf(pr[i], v.x, O[i][4 * cc + 0]);
        O[i][4 * cc + 1] = fmaf(pr[i], v.y, O[i][4 * cc + 1]);
        O[i][4 * cc + 2] = fmaf(pr[i], v.z, O[i][4 * cc + 2]);
        O[i][4 * cc + 3] = fmaf(pr[i], v.w, O[i][4 * cc + 3]);
      }
    }
  }
}

/// Row i of the thread's four: scales and masks its logits of the key tile (key j0 + tx + 16c valid
/// below k1 and the row's step), writes them when asked, updates the online softmax (the row max
/// over its 16 threads by shuffles; s1, s2 this thread's shares), rescales O[i] and writes the
/// weights to P[j][row].
template <int D>
__device__ __forceinline__ void row_softmax(int i, float (&S)[4][4], float scale, int j0, int k1, int m0, int kv, int group,
                                            int rows, long long t_max, int tx, int ty, const int (&t_row)[4],
                                            float (&mx)[4], float (&s1)[4], float (&s2)[4], float (&O)[4][D / 16],
                                            float* logits, float* Ps) {
  constexpr int CW = D / 64;
  const int m = m0 + ty * 4 + i;
  float rmax = -INFINITY;
  bool valid[4];
  for (int c = 0; c < 4; ++c) {
    const int j = j0 + tx + 16 * c;
    S[i][c] *= scale;
    valid[c] = j < k1 && j < t_row[i];
    if (valid[c]) rmax = fmaxf(rmax, S[i][c]);
    if (valid[c] && logits)
      logits[((long long)(kv * group + m % group) * rows + m / group) * t_max + j] = S[i][c];
  }
  for (int off = 8; off > 0; off >>= 1) rmax = fmaxf(rmax, __shfl_xor_sync(0xffffffffu, rmax, off));
  const float mnew = fmaxf(mx[i], rmax);
  float f = 1.f, ps = 0.f, ps2 = 0.f, p[4] = {0.f, 0.f, 0.f, 0.f};
  if (mnew != -INFINITY) {
    f = mx[i] == -INFINITY ? 0.f : expf(mx[i] - mnew);
    for (int c = 0; c < 4; ++c)
      if (valid[c]) {
        p[c] = expf(S[i][c] - mnew);
        ps += p[c];
        ps2 += p[c] * p[c];
      }
  }
  // s1, s2: this thread's share of the row's sums (its 4 key columns of each tile), all shares
  // relative to the same running max; summed over the 16 threads of the row at the end.
  s1[i] = s1[i] * f + ps;
  s2[i] = s2[i] * f * f + ps2;
  mx[i] = mnew;
  for (int c = 0; c < 4 * CW; ++c) O[i][c] *= f;
  // P[j][row] with j = tx + 16c (so j & 15 = tx), row = ty·4 + i.
  for (int c = 0; c < 4; ++c) Ps[(tx + 16 * c) * BM + 4 * (ty ^ tx) + i] = p[c];
}

/// Sums the thread's shares of Σ e^{l−max} and Σ e^{2(l−max)} over the row's 16 threads and writes
/// chunk `item`'s partial result.
template <int D>
__device__ __forceinline__ void store_partials(long long item, int tx, int ty, const float (&O)[4][D / 16], const float (&mx)[4],
                                               float (&s1)[4], float (&s2)[4], float* part_o, float* part_st) {
  for (int i = 0; i < 4; ++i)
    for (int off = 8; off > 0; off >>= 1) {
      s1[i] += __shfl_xor_sync(0xffffffffu, s1[i], off);
      s2[i] += __shfl_xor_sync(0xffffffffu, s2[i], off);
    }
  for (int i = 0; i < 4; ++i) {
    const long long row = item * BM + ty * 4 + i;
    for (int cc = 0; cc < D / 64; ++cc)
      *reinterpret_cast<float4*>(part_o + row * D + tx * 4 + 64 * cc) =
          make_float4(O[i][4 * cc], O[i][4 * cc + 1], O[i][4 * cc + 2], O[i][4 * cc + 3]);
    if (tx == 0) {
      part_st[row * 3 + 0] = mx[i];
      part_st[row * 3 + 1] = s1[i];
      part_st[row * 3 + 2] = s2[i];
    }
  }
}

/// One block: row tile items[b].x of KV head blockIdx.y against keys [items[b].y, items[b].z).
/// Layouts: Q [kv][M][D] (scale not applied), K, V [kv][n][D]; part_o [kv][item][BM][D] (unnormalized,
/// relative to the row's max), part_st [kv][item][BM][3] = (max, Σ e^{l−max}, Σ e^{2(l−max)});
/// logits (optional) [h][row][t_max], raw scaled logits of keys < t written.
/// Shared memory: Q [BM][D]; K [BN][D] with row r's float4 groups XOR-swizzled by r & 7 (the 16
/// threads of a half-warp read 16 different key rows at one offset: conflict-free); V [BN][D] (read
/// along a row: conflict-free as is), its own buffer when ASYNC (cp.async loads the value tile during
/// the logits and the next key tile during P V), else K's; P [BN][BM] transposed, its float4 groups
/// swizzled by j & 15. load_rows: 64 rows from r0 of src into dst, zero from row `limit` on, float4
/// groups swizzled when `swz`. A warp (rows 8w..8w+7) whose rows all end at or before a key tile
/// skips the tile's arithmetic (in the diagonal chunk of a row tile); warp-uniform, so its shuffles
/// stay whole.
template <int D, bool ASYNC>
__global__ void __launch_bounds__(kThreads, 2)
    flash_kernel(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V, int group,
                 long long n, int M, float scale, const long long* __restrict__ steps, const int4* __restrict__ items,
                 float* __restrict__ part_o, float* __restrict__ part_st, float* __restrict__ logits, long long t_max,
                 int rows) {
  constexpr int G4 = D / 4, CW = D / 64;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + BM * D;
  float* Vs = ASYNC ? Ks + BN * D : Ks;
  float* Ps = Vs + BN * D;
  const int kv = blockIdx.y, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int4 it = items[blockIdx.x];
  const int m0 = it.x * BM, k0 = it.y, k1 = it.z;
  const float* Qh = Q + (long long)kv * M * D;
  const float* Kh = K + (long long)kv * n * D;
  const float* Vh = V + (long long)kv * n * D;
  auto load_rows = [&](float* dst, const float* src, int r0, int limit, bool swz) {
    for (int e = tid; e < 64 * G4; e += kThreads) {
      const int r = e / G4, c = e % G4;
      const bool ok = r0 + r < limit;
      const float* g = src + (long long)(ok ? r0 + r : 0) * D + 4 * c;
      float* sp = dst + r * D + 4 * (swz ? c ^ (r & 7) : c);
      if (ASYNC) cp_async16(sp, g, ok);
      else *reinterpret_cast<float4*>(sp) = ok ? *reinterpret_cast<const float4*>(g) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_rows(Qs, Qh, m0, M, false);
  if (ASYNC) {
    load_rows(Ks, Kh, k0, k1, true);
    cp_async_commit();
  }
  int t_row[4];  // each row's step (≤ 2^30, checked by flash_on_device)
  float mx[4], s1[4], s2[4], O[4][4 * CW];
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty * 4 + i;
    t_row[i] = m < M ? int(steps[m / group]) : 0;
    mx[i] = -INFINITY, s1[i] = 0.f, s2[i] = 0.f;
    for (int c = 0; c < 4 * CW; ++c) O[i][c] = 0.f;
  }
  int warp_t = max(max(t_row[0], t_row[1]), max(t_row[2], t_row[3]));
  warp_t = __reduce_max_sync(0xffffffffu, warp_t);
  const float* Krow = Ks + tx * D;  // this thread's key rows tx + 16c, all with swizzle tx & 7
  const int swz = 4 * (tx & 7);
  for (int j0 = k0; j0 < k1; j0 += BN) {
    if (ASYNC) {
      load_rows(Vs, Vh, j0, k1, false);
      cp_async_commit();
      cp_async_wait1();  // Q and this key tile have landed
    } else {
      __syncthreads();  // the previous tile's P V is done with the buffer and P
      load_rows(Ks, Kh, j0, k1, true);
    }
    __syncthreads();
    const bool skip = j0 >= warp_t;
    float S[4][4] = {};
    if (!skip) {
#pragma unroll
      for (int k = 0; k < D; k += 4) {
        float4 a[4], b[4];
        for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(Qs + (ty * 4 + i) * D + k);
        const int off = k ^ swz;
        for (int c = 0; c < 4; ++c) b[c] = *reinterpret_cast<const float4*>(Krow + 16 * c * D + off);
        for (int i = 0; i < 4; ++i)
          for (int c = 0; c < 4; ++c)
            S[i][c] = fmaf(a[i].w, b[c].w, fmaf(a[i].z, b[c].z, fmaf(a[i].y, b[c].y, fmaf(a[i].x, b[c].x, S[i][c]))));
      }
    }
    for (int i = 0; i < 4 && !skip; ++i)
      row_softmax<D>(i, S, scale, j0, k1, m0, kv, group, rows, t_max, tx, ty, t_row, mx, s1, s2, O, logits, Ps);
    __syncthreads();  // P complete; the key tile no longer read
    if (ASYNC) {
      if (j0 + BN < k1) load_rows(Ks, Kh, j0 + BN, k1, true);
      cp_async_commit();
      cp_async_wait1();  // the value tile has landed
    } else {
      load_rows(Vs, Vh, j0, k1, false);
    }
    __syncthreads();
    tile_pv<D>(Ps, Vs, skip ? 0 : min(BN, k1 - j0), tx, ty, O);
    if (ASYNC) __syncthreads();  // the value tile and P are free for the next tile
  }
  store_partials<D>((long long)kv * gridDim.x + blockIdx.x, tx, ty, O, mx, s1, s2, part_o, part_st);
}

/// One block per (row m, KV head), a thread per output dimension: merges the row's chunks
/// [first[tile], first[tile + 1]) of its tile (OnlineSoftmax::merge) and writes out [kv][M][D], log τ
/// and ‖a‖ [h][row].
__global__ void flash_combine(const float* __restrict__ part_o, const float* __restrict__ part_st,
                              const int* __restrict__ first, int items, int M, int D, int group, int rows,
                              float* __restrict__ out, float* __restrict__ log_tau, float* __restrict__ pnorm) {
  const int m = blockIdx.x, kv = blockIdx.y, tile = m / BM, r = m % BM;
  const int b = first[tile], e = first[tile + 1];
  float mm = -INFINITY;
  for (int s = b; s < e; ++s) mm = fmaxf(mm, part_st[(((long long)kv * items + s) * BM + r) * 3]);
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float S1 = 0.f, S2 = 0.f, acc = 0.f;
    for (int s = b; s < e; ++s) {
      const long long row = ((long long)kv * items + s) * BM + r;
      const float ms = part_st[row * 3];
      if (ms == -INFINITY) continue;  // a chunk wholly past this row's step
      const float w = expf(ms - mm);
      S1 += part_st[row * 3 + 1] * w;
      S2 += part_st[row * 3 + 2] * w * w;
      acc += part_o[row * D + c] * w;
    }
    out[((long long)kv * M + m) * D + c] = acc / S1;
    if (c == 0) {
      const int h = kv * group + m % group, rr = m / group;
      log_tau[h * rows + rr] = mm + logf(S1);
      pnorm[h * rows + rr] = sqrtf(S2) / S1;
    }
  }
}

/// One block per (row, query head): the raw logits of keys < t become e^{l − log τ}, the rest of the
/// row up to t_max 0 (hd::OnlineSoftmax::prob up to rounding).
__global__ void flash_probs(float* probs, const float* __restrict__ log_tau, const long long* __restrict__ steps,
                            int rows, long long t_max) {
  const int r = blockIdx.x, h = blockIdx.y;
  const long long t = steps[r];
  const float lt = log_tau[h * rows + r];
  float* row = probs + ((long long)h * rows + r) * t_max;
  for (long long j = threadIdx.x; j < t_max; j += blockDim.x) row[j] = j < t ? expf(row[j] - lt) : 0.f;
}

template <int D>
void launch(ExactDevice& x, float scale, int chunk_keys, bool async, unsigned phases) {
  const int M = x.rows * x.group, tiles = (M + BM - 1) / BM;
  // Key chunks (split-K) of `chunk_keys`, by default ≥ 1024 keys and at most 16 per tile (on an
  // H100 at n = 8192, chunks of 1024 ran 12% faster than 512; docs/performance.md).
  const long long chunk = chunk_keys > 0 ? (chunk_keys + BN - 1) / BN * BN : std::max<long long>(1024, (x.t_max / 16 + BN - 1) / BN * BN);
  std::vector<int4> items;
  std::vector<int> first(1, 0);
  for (int tile = 0; tile < tiles; ++tile) {
    const long long t_tile = x.step_list[size_t(std::min(M, (tile + 1) * BM) - 1) / x.group];
    for (long long k0 = 0; k0 < t_tile; k0 += chunk) items.push_back(make_int4(tile, int(k0), int(std::min(t_tile, k0 + chunk)), 0));
    first.push_back(int(items.size()));
  }
  const int n_items = int(items.size());
  DeviceBuffer<int4> d_items(items.size());
  DeviceBuffer<int> d_first(first.size());
  check(cudaMemcpyAsync(d_items.p, items.data(), items.size() * sizeof(int4), cudaMemcpyHostToDevice, cudaStreamPerThread), "copy items");
  check(cudaMemcpyAsync(d_first.p, first.data(), first.size() * sizeof(int), cudaMemcpyHostToDevice, cudaStreamPerThread), "copy items");
  DeviceBuffer<float> part_o(size_t(x.kv_heads) * n_items * BM * D), part_st(size_t(x.kv_heads) * n_items * BM * 3);
  const size_t smem = flash_smem_bytes<D>(async);
  auto kernel = async ? flash_kernel<D, true> : flash_kernel<D, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "flash smem");
  float* logits = x.has_probs ? x.probs.p : nullptr;
  if (phases & kPhaseLogits)
    kernel<<<dim3(n_items, x.kv_heads), kThreads, smem>>>(x.q.p, x.k.p, x.v.p, x.group, x.n, M, scale, x.steps.p, d_items.p,
                                                        part_o.p, part_st.p, logits, x.t_max, x.rows);
  check(cudaGetLastError(), "flash_kernel launch");
  if (!(phases & kPhaseSoftmax)) return;
  flash_combine<<<dim3(M, x.kv_heads), D>>>(part_o.p, part_st.p, d_first.p, n_items, M, D, x.group, x.rows, x.out.p,
                                                  x.log_tau.p, x.pnorm.p);
  check(cudaGetLastError(), "flash_combine launch");
  if (logits) {
    flash_probs<<<dim3(x.rows, x.heads), 256>>>(logits, x.log_tau.p, x.steps.p, x.rows, x.t_max);
    check(cudaGetLastError(), "flash_probs launch");
  }
}

}  // namespace

bool flash_supports(int d) { return d == 64 || d == 128; }

void flash_on_device(ExactDevice& x, float scale, int chunk_keys, bool async, unsigned phases) {
  if (x.t_max > (1LL << 30)) throw Error("runtime.cuda_exact = flash: more than 2^30 tokens");
  if (x.d == 64) launch<64>(x, scale, chunk_keys, async, phases);
  else if (x.d == 128) launch<128>(x, scale, chunk_keys, async, phases);
  else throw Error("runtime.cuda_exact = flash: head_dim " + std::to_string(x.d) + " is not 64 or 128 (use gemm)");
}

}  // namespace kvsim::cuda_impl
