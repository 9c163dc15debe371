// Internal to the replay: where a run's thread-time goes, by phase, when the config's [runtime]
// profile = true (or KVSIM_PROFILE=1; off otherwise: one relaxed load per scope). run_experiment prints the totals to
// stderr after the cells, as thread-seconds summed over the worker threads (so they may exceed the
// wall time) — the breakdown used to find the host's share of a `--device cuda` run, where no
// sampling profiler is at hand (docs/performance.md).
#pragma once
#include <chrono>
#include <string>

namespace kvsim::phase {

enum Phase : int {
  streams,        ///< a cell's q, k, v read (synthetic streams generated) and widened
  reference,      ///< the exact reference's attention (CPU or GPU) per block
  opnorm,         ///< ‖V_t‖_op at the evaluated steps (OperatorNormTracker)
  global,         ///< global attention scores and the objectives' full attention
  policies,       ///< policies stepped (observe + attend; GPU replays waited for)
  metrics,        ///< metric rows recorded at evaluated steps (a part of policies)
  batch_inputs,   ///< GpuLayerBatch: a layer's streams read for the device
  batch_replay,   ///< GpuLayerBatch: one (layer, policy) replay on the device, transfers included
  kCount
};

bool enabled();
/// Turns profiling on or off (run_experiment: the run's runtime.profile); until called, as the environment says.
void set_enabled(bool on);
void add(Phase p, double ns);
/// Adds ns to a named line under the phases (the GPU replays by policy: what a --device cuda run's
/// batch_replay time is made of), when enabled.
void add_named(const std::string& name, double ns);
/// The totals so far as a table ("" when profiling is off), and resets them.
std::string report_and_reset();

/// Adds the scope's wall time to phase p (when enabled).
class Scope {
 public:
  explicit Scope(Phase p) : p_(p), on_(enabled()) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (on_) add(p_, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0_).count());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Phase p_;
  bool on_;
  std::chrono::steady_clock::time_point t0_{};
};

/// Adds the scope's wall time to the named line `name` (add_named), when enabled.
class NamedScope {
 public:
  explicit NamedScope(std::string name) : on_(enabled()) {
    if (on_) {
      name_ = std::move(name);
      t0_ = std::chrono::steady_clock::now();
    }
  }
  ~NamedScope() {
    if (on_) add_named(name_, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0_).count());
  }
  NamedScope(const NamedScope&) = delete;
  NamedScope& operator=(const NamedScope&) = delete;

 private:
  std::string name_;
  bool on_;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace kvsim::phase
