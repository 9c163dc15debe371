// Per-phase thread-time of a run (sim/replay/phase_clock.hpp).
#include "phase_clock.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "kvsim/core/runtime.hpp"

namespace kvsim::phase {
namespace {
std::array<std::atomic<long long>, kCount> g_ns{};
std::array<std::atomic<long long>, kCount> g_calls{};
constexpr const char* kNames[kCount] = {"streams", "reference", "opnorm", "global", "policies", "metrics",
                                        "batch_inputs", "batch_replay"};
std::mutex g_named_mu;
std::map<std::string, std::pair<long long, long long>> g_named;  // name → (ns, calls)
std::atomic<int> g_on{-1};  // -1: from the environment (runtime_from_environment) on first use
}  // namespace

bool enabled() {
  int v = g_on.load(std::memory_order_relaxed);
  if (v < 0) {
    v = runtime_from_environment().profile ? 1 : 0;
    g_on.store(v);
  }
  return v == 1;
}

void set_enabled(bool on) { g_on.store(on ? 1 : 0); }

void add(Phase p, double ns) {
  g_ns[p].fetch_add((long long)ns, std::memory_order_relaxed);
  g_calls[p].fetch_add(1, std::memory_order_relaxed);
}

void add_named(const std::string& name, double ns) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(g_named_mu);
  auto& e = g_named[name];
  e.first += (long long)ns;
  ++e.second;
}

std::string report_and_reset() {
  if (!enabled()) return {};
  std::string out = "KVSIM_PROFILE: thread-seconds by phase (summed over threads; policies include the GPU replays they wait for)\n";
  char buf[160];
  for (int p = 0; p < kCount; ++p) {
    const long long ns = g_ns[p].exchange(0), calls = g_calls[p].exchange(0);
    std::snprintf(buf, sizeof buf, "  %-13s %10.3f s  %9lld calls\n", kNames[p], double(ns) * 1e-9, calls);
    out += buf;
  }
  std::lock_guard<std::mutex> lk(g_named_mu);
  for (const auto& [name, e] : g_named) {
    std::snprintf(buf, sizeof buf, "    %-28s %10.3f s  %9lld calls\n", name.c_str(), double(e.first) * 1e-9, e.second);
    out += buf;
  }
  g_named.clear();
  return out;
}

}  // namespace kvsim::phase
