// One GPU replay per (layer, policy) for all the layer's cells (sim/replay/gpu_layer_batch.hpp).
#include "gpu_layer_batch.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <system_error>

#include "cell_policies.hpp"
#include "kvsim/core/error.hpp"
#include "phase_clock.hpp"

namespace kvsim::cell {

GpuLayerBatch::GpuLayerBatch(const Experiment& ex, const StreamSource& src, const std::vector<Cell>& cells,
                             const std::vector<bool>& will_run, int64_t n, PolicyReplayFn replay)
    : ex_(ex), src_(src), cells_(cells), will_run_(will_run), n_(n),
      on_device_(!replay), replay_(replay ? std::move(replay) : PolicyReplayFn(cuda::replay_policy)) {
  if (will_run_.size() != cells_.size()) throw Error("internal: GpuLayerBatch: will_run has the wrong size");
}

namespace {
uint64_t next_streams_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

/// Lets a layer's device copies go. Called from destructors (GpuLayerBatch's, run's Release), so an
/// error is dropped: the copies then go with the process.
void drop_device_streams(uint64_t id) noexcept {
  try {
    cuda::release_shared_streams(id);
  } catch (...) {
  }
}
}  // namespace

GpuLayerBatch::~GpuLayerBatch() {
  if (!on_device_) return;
  for (const auto& [key, in] : inputs_) drop_device_streams(in->streams_id);  // layers left unfinished (an error)
}

int GpuLayerBatch::replays() const {
  std::lock_guard<std::mutex> lk(mu_);
  return replays_;
}

std::shared_ptr<GpuLayerBatch::Entry> GpuLayerBatch::entry(const Key& key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& e = entries_[key];
  if (!e) {
    e = std::make_shared<Entry>();
    e->remaining = running_cells(key.layer, key.group);
  }
  return e;
}

std::shared_ptr<GpuLayerBatch::Inputs> GpuLayerBatch::inputs(const Key& key, const std::vector<const Cell*>& group) {
  std::shared_ptr<Inputs> in;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = inputs_[{key.layer, key.group}];
    if (!slot) {
      slot = std::make_shared<Inputs>();
      slot->streams_id = next_streams_id();
      // As many releases as the layer has policies with a GPU replay (an instance of each, as built
      // for its first cell, tells).
      slot->remaining = int(gpu_policies(*group.front()).size());
    }
    in = slot;
  }
  fill(*in, key, group);
  return in;
}

std::vector<const Cell*> GpuLayerBatch::layer_group(int layer, size_t group) const {
  std::vector<const Cell*> out;
  for (const Cell& c : cells_)
    if (c.layer == layer && c.heads.size() == group) out.push_back(&c);
  return out;
}

int GpuLayerBatch::running_cells(int layer, size_t group) const {
  int count = 0;
  for (size_t i = 0; i < cells_.size(); ++i) count += will_run_[i] && cells_[i].layer == layer && cells_[i].heads.size() == group;
  return count;
}

std::vector<size_t> GpuLayerBatch::gpu_policies(const Cell& cell) const {
  std::vector<size_t> out;
  for (size_t p = 0; p < ex_.policies.size(); ++p)
    if (gpu_replay(*make_cell_policy(ex_, src_.meta(), cell, n_, p))) out.push_back(p);
  return out;
}

void GpuLayerBatch::fill(Inputs& in_ref, const Key& key, const std::vector<const Cell*>& group) {
  Inputs* in = &in_ref;
  std::call_once(in->once, [&] {
    phase::Scope ps(phase::batch_inputs);
    try {
      const int d = src_.meta().head_dim, G = int(key.group);
      const size_t nd = size_t(n_) * d, C = group.size();
      in->Q.resize(C * G * nd);
      in->K.resize(C * nd);
      in->V.resize(C * nd);
      // The cells' streams read side by side (a synthetic source generates them: 1.7 s a layer on
      // one thread at 32 heads × 8192 × 128), each into its own slice.
      const auto read_cell = [&](size_t c) {
        const Cell& cell = *group[c];
        const MatF k = src_.read(cell.layer, Tensor::k, cell.kv_head), v = src_.read(cell.layer, Tensor::v, cell.kv_head);
        std::copy_n(k.data(), nd, in->K.begin() + c * nd);
        std::copy_n(v.data(), nd, in->V.begin() + c * nd);
        for (int g = 0; g < G; ++g) {
          const MatF q = src_.read(cell.layer, Tensor::q, cell.heads[size_t(g)]);
          std::copy_n(q.data(), nd, in->Q.begin() + (c * G + g) * nd);
        }
      };
      const size_t T = std::min<size_t>(C, std::max(1u, std::thread::hardware_concurrency()));
      std::atomic<size_t> next{0};
      std::exception_ptr first;
      std::mutex emu;
      const auto work = [&] {
        for (size_t c; (c = next++) < C;) try {
            read_cell(c);
          } catch (...) {
            std::lock_guard<std::mutex> lk(emu);
            if (!first) first = std::current_exception();
          }
      };
      std::vector<std::thread> helpers;
      try {
        for (size_t i = 1; i < T; ++i) helpers.emplace_back(work);
      } catch (const std::system_error&) {
        // No more threads to be had: the ones started and this one share the rest (nothing is lost).
      }
      work();
      for (auto& h : helpers) h.join();
      if (first) std::rethrow_exception(first);
    } catch (...) {
      in->err = std::current_exception();
    }
  });
  if (in->err) std::rethrow_exception(in->err);
}

void GpuLayerBatch::release(const Key& key) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const auto it = inputs_.find({key.layer, key.group});
    if (it == inputs_.end() || --it->second->remaining > 0) return;
    id = it->second->streams_id;
    inputs_.erase(it);
  }
  // Outside the lock: freeing the device copies may wait for the device, and other cells need mu_.
  if (on_device_) drop_device_streams(id);
}

void GpuLayerBatch::run(const Key& key, Entry& e) {
  const auto& meta = src_.meta();
  const int d = meta.head_dim, G = int(key.group);
  const int64_t n = n_;
  const std::vector<const Cell*> group = layer_group(key.layer, key.group);
  const int kv_heads = int(group.size());
  const auto& pol = ex_.policies[key.policy];
  cuda::PolicyReplay spec;
  // Released whatever happens below, so the layer's streams go after its last policy.
  struct Release {
    GpuLayerBatch* b;
    const Key& k;
    ~Release() { b->release(k); }
  } release_after{this, key};
  const std::shared_ptr<Inputs> in = inputs(key, group);
  for (int c = 0; c < kv_heads; ++c) {
    const Cell& cell = *group[size_t(c)];
    // The instance exactly as the cell builds it (PolicySteps::make): its spec and, for uniform and
    // subgen, its seed.
    const std::optional<cuda::PolicyReplay> s = gpu_replay(*make_cell_policy(ex_, meta, cell, n, key.policy));
    if (!s) throw Error("internal: GpuLayerBatch: policy '" + pol.name + "' has no GPU replay");
    if (c == 0) {
      spec = *s;
      spec.seeds.clear();
      spec.step_block = gpu_step_block(ex_.eval);
    }
    spec.seeds.insert(spec.seeds.end(), s->seeds.begin(), s->seeds.end());
    e.kv_heads.push_back(cell.kv_head);
  }
  {
    phase::Scope ps(phase::batch_replay);
    phase::NamedScope by_policy(pol.label);  // the profile's batch_replay by policy (its label)
    if (on_device_)
      cuda::replay_policy_shared(in->streams_id, spec, in->Q.data(), in->K.data(), in->V.data(), kv_heads, G, n, d,
                                 meta.softmax_scale, eval_steps(ex_.eval, n), e.z, e.log_sum, e.kept, e.cap);
    else
      replay_(spec, in->Q.data(), in->K.data(), in->V.data(), kv_heads, G, n, d, meta.softmax_scale,
              eval_steps(ex_.eval, n), e.z, e.log_sum, e.kept, e.cap);
  }
  std::lock_guard<std::mutex> lk(mu_);
  ++replays_;
}

PolicyReplayFn GpuLayerBatch::replay_fn(const Cell& cell, size_t p) {
  const Key key{cell.layer, p, cell.heads.size()};
  return [this, key, kv = cell.kv_head](const cuda::PolicyReplay&, const float*, const float*, const float*, int kv_heads,
                                        int group, int64_t n, int d, double, const std::vector<int64_t>& steps,
                                        std::vector<float>& z, std::vector<double>& log_sum, std::vector<int64_t>& kept,
                                        int64_t& kept_cap) {
    if (kv_heads != 1 || size_t(group) != key.group || n != n_)
      throw Error("internal: GpuLayerBatch: a cell's replay differs from its layer's");
    std::shared_ptr<Entry> e = entry(key);
    ensure_run(key, *e);
    if (e->err) std::rethrow_exception(e->err);
    const auto it = std::find(e->kv_heads.begin(), e->kv_heads.end(), kv);
    if (it == e->kv_heads.end()) throw Error("internal: GpuLayerBatch: KV head not in its layer's replay");
    const size_t c = size_t(it - e->kv_heads.begin()), rows = steps.size(), G = key.group;
    const size_t zn = G * rows * size_t(d), ln = G * rows, kn = rows * size_t(e->cap);
    if (e->z.size() < (c + 1) * zn || e->log_sum.size() < (c + 1) * ln || e->kept.size() < (c + 1) * kn)
      throw Error("internal: GpuLayerBatch: the replay returned arrays of the wrong size");
    z.assign(e->z.begin() + c * zn, e->z.begin() + (c + 1) * zn);
    log_sum.assign(e->log_sum.begin() + c * ln, e->log_sum.begin() + (c + 1) * ln);
    kept.assign(e->kept.begin() + c * kn, e->kept.begin() + (c + 1) * kn);
    kept_cap = e->cap;
    std::lock_guard<std::mutex> lk(mu_);
    if (--e->remaining == 0) entries_.erase(key);  // the last cell of the layer: the results go
  };
}

void GpuLayerBatch::ensure_run(const Key& key, Entry& e) {
  std::call_once(e.once, [&] {
    try {
      run(key, e);
    } catch (...) {
      e.err = std::current_exception();
    }
  });
}

}  // namespace kvsim::cell
