// Internal to the replay: with `[eval] device = "cuda"`, the GPU replays of a layer's cells run as one
// cuda::replay_policy call per (layer, policy) — one thread block per KV head in one launch — instead
// of one launch per cell (a sequential policy kernel such as h2o's occupies one multiprocessor per
// KV head, so a launch per cell leaves the rest of the GPU to whatever other cells run at the time).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "kvsim/io/recording.hpp"
#include "kvsim/policies/gpu_replay.hpp"
#include "kvsim/replay/engine.hpp"

namespace kvsim::cell {

/// Shared by the cells of one run. The first cell of a layer that needs policy p's replay builds each
/// cell's instance as the cell itself would (same seed: instance_seed) and replays them all in one
/// call over the layer's queries, keys and values (the cells with as many query heads as its own),
/// read once per layer for all its policies and freed after the layer's last GPU policy; the other
/// cells wait for it and take their slice. A layer's results are freed once every cell that will run
/// has taken its slice. The first error reaches every cell of the layer.
class GpuLayerBatch {
 public:
  /// `cells`: the run's planned cells; `will_run[i]`: cell i runs in this process (false: resumed
  /// from a checkpoint, or another MPI rank's). `replay` defaults to cuda::replay_policy.
  /// With the default, each layer's Q, K and V go to the device once for all its GPU policies
  /// (cuda::replay_policy_shared, released with the layer's streams here).
  GpuLayerBatch(const Experiment& ex, const StreamSource& src, const std::vector<Cell>& cells,
                const std::vector<bool>& will_run, int64_t n, PolicyReplayFn replay = {});
  ~GpuLayerBatch();
  GpuLayerBatch(const GpuLayerBatch&) = delete;
  GpuLayerBatch& operator=(const GpuLayerBatch&) = delete;
  /// The replay function to hand make_gpu_replay for `cell`'s (kv_head mode) instance of policy p.
  PolicyReplayFn replay_fn(const Cell& cell, size_t p);
  /// Calls of the replay function so far (one per layer, policy and group size): for tests.
  int replays() const;
 private:
  struct Key {
    int layer;
    size_t policy, group;
    bool operator<(const Key& o) const { return std::tie(layer, policy, group) < std::tie(o.layer, o.policy, o.group); }
  };
  /// A layer's streams for its batched replays: [cell][query head][n][d], [cell][n][d].
  struct Inputs {
    std::once_flag once;
    std::exception_ptr err;
    std::vector<float> Q, K, V;
    int remaining = 0;     // GPU policies still to replay over them
    uint64_t streams_id;   // their device copies' key (cuda::replay_policy_shared), unique in the process
  };
  struct Entry {
    std::once_flag once;
    std::exception_ptr err;
    std::vector<int> kv_heads;  // the batched cells' KV heads, in replay order
    std::vector<float> z;
    std::vector<double> log_sum;
    std::vector<int64_t> kept;
    int64_t cap = 0;
    int remaining = 0;  // cells still to take their slice
  };
  void run(const Key& key, Entry& e);
  /// The key's entry, created on first use (a cell asking after every cell has taken its slice, one
  /// not counted to run, gets a fresh replay).
  std::shared_ptr<Entry> entry(const Key& key);
  /// Runs the key's replay once (whichever cell comes first).
  void ensure_run(const Key& key, Entry& e);
  /// The layer's streams (read on first use), and the release after one policy's replay.
  std::shared_ptr<Inputs> inputs(const Key& key, const std::vector<const Cell*>& group);
  /// Reads them into `in` once (whoever comes first waits for nobody; the others wait for it).
  void fill(Inputs& in, const Key& key, const std::vector<const Cell*>& group);
  /// The cells of `layer` with `group` query heads, in cells_ order (a batched replay's KV heads).
  std::vector<const Cell*> layer_group(int layer, size_t group) const;
  /// How many of them run in this process.
  int running_cells(int layer, size_t group) const;
  /// The policies (indices) whose instance, as built for `cell`, has a GPU replay.
  std::vector<size_t> gpu_policies(const Cell& cell) const;
  void release(const Key& key);

  const Experiment& ex_;
  const StreamSource& src_;
  const std::vector<Cell>& cells_;
  std::vector<bool> will_run_;
  int64_t n_;
  bool on_device_;  // no stand-in given: replay through the shared device streams (cuda::replay_policy_shared)
  PolicyReplayFn replay_;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<Entry>> entries_;
  std::map<std::pair<int, size_t>, std::shared_ptr<Inputs>> inputs_;  // by (layer, group size)
  int replays_ = 0;
};

}  // namespace kvsim::cell
