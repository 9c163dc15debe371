// Per-phase thread-time of a run (sim/replay/phase_clock.hpp).
#include "phase_clock.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvsim::phase {
namespace {
std::array<std::atomic<long long>, kCount> g_ns{};
std::array<std::atomic<long long>, kCount> g_calls{};
constexpr const char* kNames[kCount] = {"streams", "reference", "opnorm", "global", "policies", "metrics",
                                        "batch_inputs", "batch_replay"};
}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KVSIM_PROFILE");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

void add(Phase p, double ns) {
  g_ns[p].fetch_add((long long)ns, std::memory_order_relaxed);
  g_calls[p].fetch_add(1, std::memory_order_relaxed);
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
  return out;
}

}  // namespace kvsim::phase
