// kvsim CUDA path, step 2: policy replays on the GPU for every KV head of a layer at once, with the
// step logic of include/kvsim/core/hd.hpp that the CPU policies run too. Two kinds of kernel:
//  - selection, then kept_attend_kernel: policies whose cache does not depend on attention get their
//    kept token lists first — window / sink (StreamingLLM) in closed form (hd::sink_window_token),
//    uniform by its Philox reservoir (hd::reservoir_slot, one thread per KV head walking the stream),
//    oracle_topk by a bitonic sort of the exact attention (hd::topk_prefer), subgen_kcenter's
//    streaming clustering (hd::kcenter_insert) — and one generic kernel then answers every (evaluated step, KV head) as an independent thread
//    block: the group's logits over the kept tokens (fp32), a block-merged hd::OnlineSoftmax in
//    double (the CPU's policy_precision = "float32"), and the output (one thread per dimension).
//  - fused state machines, one thread block per KV head over t = 0..n−1, for the policies whose
//    eviction reads attention scores: h2o (H2O §4.1 Algorithm 1: block arg-min under
//    hd::h2o_prefer, a total order, so the CPU's serial scan picks the same slot) and buzz (BUZZ, Zhao et al. 2024
//    §3.3: sink + beehive body + window, hd::buzz_evict run by thread 0 when the body reaches T;
//    log-n scaled answers, §3.5). Each step: every query head's attention over the cache, combined by
//    hd::group_combine into the accumulated scores (with PolicyReplay::step_block, a block's logits
//    first as one tiled product: block_logits.cuh); and subgen (SubGen Algorithm 1: online clustering
//    by a block arg-min, Philox coin flips per sample slot, merge rounds, lines 29-31 answers).
// Slots hold token positions; keys and values are read from the stream in device memory (a real
// cache would copy them: the arithmetic is the same).
// tests/gpu/cuda_parity.cpp compares it with the CPU policies wherever a device exists (first run and
// passed on an NVIDIA H200 and an H100, 2026-11-26: docs/performance.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common.cuh"
#include "kvsim/core/hd.hpp"
#include "kvsim/cuda/module.hpp"
#include "attend_step.cuh"
#include "policy_kernels.cuh"

namespace kvsim::cuda_impl {

namespace {

/// A replay's Q, K and V on the device: its own copies, or a layer's shared ones (StreamSet).
struct DeviceStreams {
  DeviceBuffer<float> q, k, v;
  size_t qn, kn;
  DeviceStreams(size_t qn_, size_t kn_, bool stream_ordered) : q(qn_, stream_ordered), k(kn_, stream_ordered), v(kn_, stream_ordered), qn(qn_), kn(kn_) {}
  void upload(const float* Q, const float* K, const float* V) {
    q.upload(Q, qn, "copy Q");
    k.upload(K, kn, "copy K");
    v.upload(V, kn, "copy V");
  }
};

/// The streams uploaded under a streams_id (replay_policy), shared by the replays that name it: the
/// first uploads (the others wait for it), release_streams drops the set's reference, and the device
/// memory goes when the last replay holding it ends. One layer's Q, K, V is 400 MB at 32 heads ×
/// 8192 × 128, copied once for all its policies instead of once per policy.
struct StreamSet {
  std::once_flag once;
  std::exception_ptr err;
  std::shared_ptr<DeviceStreams> streams;
};
std::mutex streams_mu;
std::map<uint64_t, std::shared_ptr<StreamSet>> stream_sets;

std::shared_ptr<DeviceStreams> shared_streams(uint64_t id, const float* Q, const float* K, const float* V, size_t qn, size_t kn) {
  std::shared_ptr<StreamSet> set;
  {
    std::lock_guard<std::mutex> lk(streams_mu);
    auto& slot = stream_sets[id];
    if (!slot) slot = std::make_shared<StreamSet>();
    set = slot;
  }
  std::call_once(set->once, [&] {
    try {
      auto s = std::make_shared<DeviceStreams>(qn, kn, false);
      s->upload(Q, K, V);
      set->streams = std::move(s);
    } catch (...) {
      set->err = std::current_exception();
    }
  });
  if (set->err) std::rethrow_exception(set->err);
  if (set->streams->qn != qn || set->streams->kn != kn)
    throw Error("cuda::replay_policy: streams_id " + std::to_string(id) + " was uploaded with other sizes");
  return set->streams;
}

/// A device pointer under the name the replays read (b.d_keys.p, ...).
struct DevicePtr {
  float* p;
};

/// The device copies of a replay's inputs and outputs (replay_policy's layout).
struct ReplayBuffers {
  std::shared_ptr<DeviceStreams> streams;
  DevicePtr d_queries, d_keys, d_values;
  DeviceBuffer<float> d_answers;
  DeviceBuffer<double> d_log_sum;
  DeviceBuffer<long long> d_kept, d_steps;
  ReplayBuffers(std::shared_ptr<DeviceStreams> s, int H, int kv_heads, int d, int rows, long long cap)
      : streams(std::move(s)), d_queries{streams->q.p}, d_keys{streams->k.p}, d_values{streams->v.p}, d_answers(size_t(H) * rows * d),
        d_log_sum(size_t(H) * rows), d_kept(size_t(kv_heads) * rows * cap), d_steps(size_t(rows)) {}
};

}  // namespace

bool state_in_shared_memory() { return settings().state_smem.load(); }
void set_state_in_shared_memory(bool on) { settings().state_smem.store(on); }

namespace {

/// Whether `dyn` bytes of dynamic shared memory fit beside kernel f's static ones on this device;
/// the first call raises f's limit to all the device allows a block (once, so replays on other
/// threads never see it change between their check and their launch). runtime.cuda_state_in_shared_memory
/// = false (KVSIM_CUDA_STATE_SMEM=0) keeps the state kernels' state in global memory (the measured before of docs/performance.md).
template <class F>
bool dynamic_smem_fits(F* f, long long dyn) {
  if (!state_in_shared_memory()) return false;
  struct Limit {
    std::once_flag once;
    long long bytes = 0;
  };
  static std::mutex mu;
  static std::map<const void*, std::shared_ptr<Limit>> limits;
  std::shared_ptr<Limit> lim;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto& slot = limits[reinterpret_cast<const void*>(f)];
    if (!slot) slot = std::make_shared<Limit>();
    lim = slot;
  }
  std::call_once(lim->once, [&] {
    int dev = 0, optin = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "shared memory per block");
    cudaFuncAttributes a{};
    check(cudaFuncGetAttributes(&a, f), "cudaFuncGetAttributes");
    const long long room = (long long)optin - (long long)a.sharedSizeBytes;
    if (room > 0 && cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(room)) == cudaSuccess)
      lim->bytes = room;
    else
      (void)cudaGetLastError();
  });
  return dyn <= lim->bytes;
}

/// The kept-slot capacity of `p` after checking its sizes (cuda::kReplayKindTable) and the shapes;
/// throws kvsim::Error.
long long validate_replay(const cuda::PolicyReplay& p, int kv_heads, int group, int64_t n, int d,
                          const std::vector<int64_t>& steps) {
  check_shapes_and_steps(kv_heads >= 1 && group >= 1 && d >= 1 && n >= 1, steps, n, "cuda::replay_policy");
  const int k = int(p.kind);
  if (k < 0 || k >= cuda::kReplayKindCount) throw Error("cuda::replay_policy: unknown replay kind " + std::to_string(k));
  const cuda::ReplayKindInfo& info = cuda::replay_kind_info(p.kind);
  const long long cap = info.capacity(p);
  if (cap < 1 || !info.sizes_ok(p, kv_heads, n))
    throw Error("cuda::replay_policy: bad sizes for policy '" + std::string(info.name) + "'");
  return cap;
}

/// Selection kernel of window/sink/uniform/oracle_topk/subgen_kcenter, then kept-list attention.
void replay_selection(const cuda::PolicyReplay& p, ReplayBuffers& b, int kv_heads, int group, int64_t n, int d,
                      double scale, int rows, long long cap) {
  using cuda::ReplayKind;
  auto &d_queries = b.d_queries, &d_keys = b.d_keys, &d_values = b.d_values;
  auto& d_answers = b.d_answers;
  auto& d_log_sum = b.d_log_sum;
  auto &d_kept = b.d_kept, &d_steps = b.d_steps;
  const size_t qbytes = size_t(d) * sizeof(float);
  std::unique_ptr<DeviceBuffer<double>> bias;
  if (p.kind == ReplayKind::subgen_kcenter) {
    bias = std::make_unique<DeviceBuffer<double>>(size_t(kv_heads) * rows * cap);
    DeviceBuffer<int64_t> ids(size_t(kv_heads) * (p.budget + 1));
    DeviceBuffer<double> counts(size_t(kv_heads) * (p.budget + 1));
    kcenter_select_kernel<<<kv_heads, kKcenterThreads>>>(d_keys.p, n, d, p.recent, p.budget, p.weighted, d_steps.p, rows, cap,
                                                        ids.p, counts.p, d_kept.p, bias->p);
    check(cudaGetLastError(), "kcenter_select_kernel launch");
    sync("kcenter_select_kernel");
  } else if (p.kind == ReplayKind::oracle_topk) {
    // Rows in chunks so the per-row scratch (score, logit, index: 24 bytes × n_pad) stays ≤ ~1 GiB.
    long long n_pad = 1;
    while (n_pad < n) n_pad <<= 1;
    const long long per_row = 24 * n_pad * kv_heads;
    const int chunk = int(std::max<long long>(1, std::min<long long>(rows, (1ll << 30) / per_row)));
    DeviceBuffer<double> score_scratch(size_t(chunk) * kv_heads * n_pad), logit_scratch(size_t(chunk) * kv_heads * n_pad);
    DeviceBuffer<long long> idx(size_t(chunk) * kv_heads * n_pad);
    for (int r0 = 0; r0 < rows; r0 += chunk) {
      const int cr = std::min(chunk, rows - r0);
      oracle_select_kernel<<<dim3(cr, kv_heads), kPolicyThreads, size_t(d) * sizeof(double)>>>(
          d_queries.p, d_keys.p, group, n, d, scale, cap, p.group_agg, d_steps.p, rows, r0, n_pad, score_scratch.p, logit_scratch.p, idx.p, d_kept.p);
      check(cudaGetLastError(), "oracle_select_kernel launch");
    }
    sync("oracle_select_kernel");
  } else if (p.kind == ReplayKind::uniform) {
    DeviceBuffer<unsigned long long> seeds(p.seeds.size());
    const std::vector<unsigned long long> sd(p.seeds.begin(), p.seeds.end());
    seeds.upload(sd.data(), sd.size(), "copy seeds");
    DeviceBuffer<long long> pos(size_t(kv_heads) * cap);
    uniform_select_kernel<<<kv_heads, kPolicyThreads>>>(seeds.p, cap, d_steps.p, rows, pos.p, d_kept.p);
    check(cudaGetLastError(), "uniform_select_kernel launch");
    sync("uniform_select_kernel");
  } else {
    sink_window_select_kernel<<<dim3(rows, kv_heads), kPolicyThreads>>>(p.sink, p.window, d_steps.p, rows, d_kept.p);
    check(cudaGetLastError(), "sink_window_select_kernel launch");
  }
  DeviceBuffer<float> logits(size_t(kv_heads) * rows * cap);
  kept_attend_kernel<<<dim3(rows, kv_heads), kPolicyThreads, qbytes>>>(d_queries.p, d_keys.p, d_values.p, group, n, d, float(scale), d_steps.p,
                                                                       rows, d_kept.p, cap, bias ? bias->p : nullptr,
                                                                       d_answers.p, d_log_sum.p, logits.p);
  check(cudaGetLastError(), "kept_attend_kernel launch");
  sync("kept_attend_kernel");
}

/// The state kernels' steps per block (PolicyReplay::step_block, at most n; 0: one at a time).
long long step_block(const cuda::PolicyReplay& p, int64_t n) {
  if (p.step_block < 0) throw Error("cuda::replay_policy: step_block " + std::to_string(p.step_block) + " is negative");
  return std::min<long long>(p.step_block, n);
}

void replay_h2o(const cuda::PolicyReplay& p, ReplayBuffers& b, int kv_heads, int group, int64_t n, int d, double scale,
                int rows, long long cap) {
  auto &d_queries = b.d_queries, &d_keys = b.d_keys, &d_values = b.d_values;
  auto& d_answers = b.d_answers;
  auto& d_log_sum = b.d_log_sum;
  auto &d_kept = b.d_kept, &d_steps = b.d_steps;
  const size_t qbytes = size_t(d) * sizeof(float);
  DeviceBuffer<long long> pos(size_t(kv_heads) * cap);
  DeviceBuffer<double> score(size_t(kv_heads) * cap), probs(size_t(kv_heads) * cap), head_probs(size_t(kv_heads) * cap);
  DeviceBuffer<float> logits(size_t(kv_heads) * cap);
  DeviceFlag err;
  const long long bk = step_block(p, n);
  DeviceBuffer<float> tiles(bk > 0 ? size_t(kv_heads) * group * bk * (cap + bk) : 1);
  const long long sbytes = h2o_smem_bytes(d, cap);
  const bool smem = dynamic_smem_fits(h2o_kernel, sbytes);
  h2o_kernel<<<kv_heads, kStateThreads, smem ? size_t(sbytes) : qbytes>>>(
      d_queries.p, d_keys.p, d_values.p, group, n, d, float(scale), cap, p.recent, p.group_agg, d_steps.p, rows, d_answers.p,
      d_log_sum.p, d_kept.p, pos.p, score.p, probs.p, head_probs.p, logits.p, err.buf.p, smem, bk, tiles.p);
  check(cudaGetLastError(), "h2o_kernel launch");
  sync("h2o_kernel");
  if (err.raised()) throw Error("cuda::replay_policy: h2o found no evictable token (recent window ≥ budget)");
}

void replay_subgen(const cuda::PolicyReplay& p, ReplayBuffers& b, int kv_heads, int group, int64_t n, int d,
                   double scale, int rows) {
  auto &d_queries = b.d_queries, &d_keys = b.d_keys, &d_values = b.d_values;
  auto& d_answers = b.d_answers;
  auto& d_log_sum = b.d_log_sum;
  auto &d_kept = b.d_kept, &d_steps = b.d_steps;
  // Clusters: at most max_clusters + 1 (the cap) or n (Algorithm 1 as published).
  const long long cap_m = p.max_clusters > 0 ? std::min<long long>(p.max_clusters + 1, n) : n;
  const double bytes = double(kv_heads) * (double(cap_m) * (3 * 8 + 16 * p.t) + 24.0 * p.s);
  if (bytes > 8e9)
    throw Error("cuda::replay_policy: subgen's scratch (" + std::to_string(int64_t(bytes / 1e9)) +
                " GB for up to " + std::to_string(cap_m) + " clusters × t = " + std::to_string(p.t) +
                ") is too large for the GPU replay; set max_clusters or use the CPU");
  DeviceBuffer<unsigned long long> seeds(p.seeds.size());
  const std::vector<unsigned long long> sd(p.seeds.begin(), p.seeds.end());
  seeds.upload(sd.data(), sd.size(), "copy seeds");
  DeviceBuffer<long long> rep(size_t(kv_heads) * cap_m), cnt(size_t(kv_heads) * cap_m), keep(size_t(kv_heads) * cap_m),
      cluster_samples(size_t(kv_heads) * cap_m * p.t), product_samples(size_t(kv_heads) * p.s);
  DeviceBuffer<double> sample_norms(size_t(kv_heads) * p.s), sample_logits(size_t(kv_heads) * (cap_m * p.t + p.s));
  DeviceFlag err;
  subgen_kernel<<<kv_heads, kPolicyThreads, size_t(d) * sizeof(double)>>>(
      d_queries.p, d_keys.p, d_values.p, group, n, d, scale, p.delta, p.s, p.t, p.max_clusters, cap_m, seeds.p, d_steps.p, rows, d_answers.p, d_log_sum.p,
      d_kept.p, rep.p, cnt.p, keep.p, cluster_samples.p, product_samples.p, sample_norms.p, sample_logits.p, err.buf.p);
  check(cudaGetLastError(), "subgen_kernel launch");
  sync("subgen_kernel");
  if (err.raised()) throw Error("cuda::replay_policy: subgen exceeded its cluster capacity (internal)");
}

void replay_buzz(const cuda::PolicyReplay& p, ReplayBuffers& b, int kv_heads, int group, int64_t n, int d, double scale,
                 int rows, long long cap) {
  auto &d_queries = b.d_queries, &d_keys = b.d_keys, &d_values = b.d_values;
  auto& d_answers = b.d_answers;
  auto& d_log_sum = b.d_log_sum;
  auto &d_kept = b.d_kept, &d_steps = b.d_steps;
  const size_t qbytes = size_t(d) * sizeof(float);
  DeviceBuffer<BuzzTok> sink_tokens(size_t(kv_heads) * (p.sink > 0 ? p.sink : 1)), window_ring(size_t(kv_heads) * p.window),
      new_tokens(size_t(kv_heads) * p.threshold), old_tokens(size_t(kv_heads) * p.threshold);
  DeviceBuffer<long long> kept_list(size_t(kv_heads) * cap);
  DeviceBuffer<double> probs(size_t(kv_heads) * cap), head_probs(size_t(kv_heads) * cap);
  DeviceBuffer<float> logits(size_t(kv_heads) * cap);
  const long long bk = step_block(p, n);
  DeviceBuffer<float> tiles(bk > 0 ? size_t(kv_heads) * group * bk * (cap + bk) : 1);
  DeviceBuffer<int> cols(bk > 0 ? size_t(kv_heads) * n : 1);
  const long long sbytes = buzz_smem_bytes(d, p.sink, p.window, p.threshold, cap);
  const bool smem = dynamic_smem_fits(buzz_kernel, sbytes);
  buzz_kernel<<<kv_heads, kStateThreads, smem ? size_t(sbytes) : qbytes>>>(
      d_queries.p, d_keys.p, d_values.p, group, n, d, float(scale), p.sink, p.window, p.threshold, p.stride, p.log_scale,
      p.group_agg, d_steps.p, rows, d_answers.p, d_log_sum.p, d_kept.p, cap, sink_tokens.p, window_ring.p, new_tokens.p,
      old_tokens.p, kept_list.p, probs.p, head_probs.p, logits.p, smem, bk, tiles.p, cols.p);
  check(cudaGetLastError(), "buzz_kernel launch");
  sync("buzz_kernel");
}

}  // namespace

void replay_policy(const cuda::PolicyReplay& p, const float* Q, const float* K, const float* V, int kv_heads,
                   int group, int64_t n, int d, double scale, const std::vector<int64_t>& steps, std::vector<float>& z,
                   std::vector<double>& log_sum, std::vector<int64_t>& kept, int64_t& kept_cap, uint64_t streams_id) {
  require_device();
  const long long cap = validate_replay(p, kv_heads, group, n, d, steps);
  kept_cap = cap;
  const int rows = int(steps.size()), H = kv_heads * group;
  const size_t qn = size_t(H) * n * d, kn = size_t(kv_heads) * n * d;
  std::shared_ptr<DeviceStreams> streams;
  if (streams_id != 0) streams = shared_streams(streams_id, Q, K, V, qn, kn);
  else {
    streams = std::make_shared<DeviceStreams>(qn, kn, true);
    streams->upload(Q, K, V);
  }
  ReplayBuffers b(std::move(streams), H, kv_heads, d, rows, cap);
  const std::vector<long long> st(steps.begin(), steps.end());
  b.d_steps.upload(st.data(), st.size(), "copy steps");
  switch (p.kind) {  // no default: every ReplayKind has its kernel
    case cuda::ReplayKind::window:
    case cuda::ReplayKind::sink:
    case cuda::ReplayKind::uniform:
    case cuda::ReplayKind::oracle_topk:
    case cuda::ReplayKind::subgen_kcenter: replay_selection(p, b, kv_heads, group, n, d, scale, rows, cap); break;
    case cuda::ReplayKind::h2o: replay_h2o(p, b, kv_heads, group, n, d, scale, rows, cap); break;
    case cuda::ReplayKind::subgen: replay_subgen(p, b, kv_heads, group, n, d, scale, rows); break;
    case cuda::ReplayKind::buzz: replay_buzz(p, b, kv_heads, group, n, d, scale, rows, cap); break;
  }
  z.resize(size_t(H) * rows * d);
  b.d_answers.download(z.data(), z.size(), "copy z");
  log_sum.resize(size_t(H) * rows);
  b.d_log_sum.download(log_sum.data(), log_sum.size(), "copy log_sum");
  std::vector<long long> kk(size_t(kv_heads) * rows * cap);
  b.d_kept.download(kk.data(), kk.size(), "copy kept");
  kept.assign(kk.begin(), kk.end());
}

void release_streams(uint64_t streams_id) {
  std::lock_guard<std::mutex> lk(streams_mu);
  stream_sets.erase(streams_id);
}

}  // namespace kvsim::cuda_impl
