// kvsim: how a run is carried out — a config's [runtime] table (docs/config.md, "[runtime]").
//
//   [runtime]
//   cuda_workers = 0                     # host threads driving GPU cells (0: automatic)
//   cuda_layer_batch = "auto"            # "auto", "on" or "off"
//   cuda_exact = "auto"                  # "auto", "flash", "gemm" or "kernel"
//   cuda_exact_rows = 64                 # query rows per KV head and chunk of the gemm/kernel exact pass
//   cuda_state_in_shared_memory = true   # policy kernels keep their per-head state in shared memory
//   cuda_deadline_s = 1800.0             # the longest one wait for the device may take
//   profile = false                      # print thread-seconds per phase after the run
//   mpi_coordinator_only = false         # under MPI, rank 0 replays no cell itself
//
// These keys choose how the numbers are computed, never which: the CPU results do not depend on them
// at all, and the GPU's choices are held to the CPU within tolerance by the CUDA parity tests. Each
// key has one environment variable that overrides the config (apply_runtime_environment below is the
// only place they are read), and results.h5 keeps the resolved values (root attribute `runtime`) and the
// resolved config's [runtime] table, so a result says how it was produced.
//
// Header-only: the CUDA module (libkvsim_cuda.so, which links nothing of kvsim_core) reads the same
// table for its defaults.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvsim/core/error.hpp"

namespace kvsim {

struct Runtime {
  int cuda_workers = 0;                     ///< 0: twice the threads with the GPU layer batch, the threads otherwise
  std::string cuda_layer_batch = "auto";    ///< "auto" (batch when more cells than threads), "on", "off"
  std::string cuda_exact = "auto";          ///< "auto" (flash for head_dim 64/128, gemm otherwise), "flash", "gemm", "kernel"
  int cuda_exact_rows = 64;                 ///< 1..4096
  bool cuda_state_in_shared_memory = true;  ///< false keeps the policy kernels' state in global memory
  double cuda_deadline_s = 1800;            ///< seconds, > 0
  bool profile = false;
  bool mpi_coordinator_only = false;        ///< rank 0 hands out cells but replays none (tests)
};

namespace runtime_detail {

[[noreturn]] inline void refuse(const std::string& who, const std::string& text, const std::string& why) {
  throw Error(who + " = '" + text + "': " + why);
}

inline long long integer(const std::string& who, const std::string& text, long long lo, long long hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || v < lo || v > hi)
    refuse(who, text, "not an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  return v;
}

inline bool boolean(const std::string& who, const std::string& text) {
  if (text == "true" || text == "1" || text == "on") return true;
  if (text == "false" || text == "0" || text == "off") return false;
  refuse(who, text, "not a boolean (true/false, 1/0, on/off)");
}

inline std::string choice(const std::string& who, const std::string& text, const std::vector<std::string>& allowed) {
  std::string list;
  for (const auto& a : allowed) {
    if (a == text) return text;
    list += (list.empty() ? "" : ", ") + a;
  }
  refuse(who, text, "not one of " + list);
}

inline double seconds(const std::string& who, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v)) refuse(who, text, "not a positive number of seconds");
  return v;
}

inline std::string quoted(const std::string& s) { return "\"" + s + "\""; }
inline std::string flag(bool b) { return b ? "true" : "false"; }
inline std::string number(double x) {  // the shortest form that reads back as the same double, a TOML float
  char buf[64];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string t = buf;
  if (t.find_first_of(".eEn") == std::string::npos) t += ".0";
  return t;
}

}  // namespace runtime_detail

/// One [runtime] key, declared once: its name, the environment variable that overrides it, its type
/// and doc, how its text sets it (throwing kvsim::Error "WHO = 'TEXT': why") and how it reads as TOML.
struct RuntimeKey {
  const char* key;
  const char* env;
  const char* type;  ///< "integer", "string", "boolean" or "float" (as TOML writes it)
  const char* doc;
  void (*set)(Runtime& r, const std::string& text, const std::string& who);
  std::string (*toml)(const Runtime& r);
};

/// The [runtime] keys, in the order the resolved config writes them.
inline const std::vector<RuntimeKey>& runtime_keys() {
  using namespace runtime_detail;
  using S = const std::string&;
  static const std::vector<RuntimeKey> keys = {
      {"cuda_workers", "KVSIM_CUDA_WORKERS", "integer",
       "host threads driving GPU cells, >= 0 (0: twice --threads with the layer batch, --threads otherwise)",
       [](Runtime& r, S t, S who) { r.cuda_workers = int(integer(who, t, 0, 4096)); },
       [](const Runtime& r) { return std::to_string(r.cuda_workers); }},
      {"cuda_layer_batch", "KVSIM_CUDA_LAYER_BATCH", "string",
       "replay a layer's GPU cells in one launch per policy: auto (when there are more cells than threads), on, off",
       [](Runtime& r, S t, S who) {  // the variable's historical values 1 and 0 read as on and off
         r.cuda_layer_batch = t == "1" ? "on" : t == "0" ? "off" : choice(who, t, {"auto", "on", "off"});
       },
       [](const Runtime& r) { return quoted(r.cuda_layer_batch); }},
      {"cuda_exact", "KVSIM_CUDA_EXACT", "string",
       "the exact pass on the GPU: auto (flash for head_dim 64 or 128, gemm otherwise), flash, gemm, kernel",
       [](Runtime& r, S t, S who) { r.cuda_exact = choice(who, t, {"auto", "flash", "gemm", "kernel"}); },
       [](const Runtime& r) { return quoted(r.cuda_exact); }},
      {"cuda_exact_rows", "KVSIM_CUDA_EXACT_ROWS", "integer", "query rows per KV head and chunk of the gemm/kernel exact pass, 1..4096",
       [](Runtime& r, S t, S who) { r.cuda_exact_rows = int(integer(who, t, 1, 4096)); },
       [](const Runtime& r) { return std::to_string(r.cuda_exact_rows); }},
      {"cuda_state_in_shared_memory", "KVSIM_CUDA_STATE_SMEM", "boolean",
       "policy kernels keep their per-head state in shared memory where it fits (false: global memory)",
       [](Runtime& r, S t, S who) { r.cuda_state_in_shared_memory = boolean(who, t); },
       [](const Runtime& r) { return flag(r.cuda_state_in_shared_memory); }},
      {"cuda_deadline_s", "KVSIM_CUDA_DEADLINE", "float", "seconds one wait for the device may take before the run fails, > 0",
       [](Runtime& r, S t, S who) { r.cuda_deadline_s = seconds(who, t); },
       [](const Runtime& r) { return number(r.cuda_deadline_s); }},
      {"profile", "KVSIM_PROFILE", "boolean", "print thread-seconds per phase of the replay after the run",
       [](Runtime& r, S t, S who) { r.profile = boolean(who, t); }, [](const Runtime& r) { return flag(r.profile); }},
      {"mpi_coordinator_only", "KVSIM_MPI_COORDINATOR_ONLY", "boolean",
       "under MPI, rank 0 hands out cells but replays none (the tests make a worker rank meet a failing cell)",
       [](Runtime& r, S t, S who) { r.mpi_coordinator_only = boolean(who, t); },
       [](const Runtime& r) { return flag(r.mpi_coordinator_only); }},
  };
  return keys;
}

/// The entry of `key` in runtime_keys(); throws kvsim::Error "WHO: unknown [runtime] key 'key'".
inline const RuntimeKey& runtime_key(const std::string& key, const std::string& who) {
  for (const auto& k : runtime_keys())
    if (key == k.key) return k;
  throw Error(who + ": unknown [runtime] key '" + key + "'");
}

/// Sets [runtime] key `key` from its text (a TOML value's text, or an environment variable's value);
/// `who` names the source in errors ("runtime.cuda_exact", "KVSIM_CUDA_EXACT"). Throws kvsim::Error
/// "WHO = 'TEXT': why" for a value out of its type or range, and for an unknown key.
inline void set_runtime_key(Runtime& r, const std::string& key, const std::string& text, const std::string& who) {
  runtime_key(key, who).set(r, text, who);
}

/// Applies every set, non-empty runtime environment variable of runtime_keys() over `r` (the
/// environment overrides the config). The only place these variables are read.
inline void apply_runtime_environment(Runtime& r) {
  for (const auto& k : runtime_keys())
    if (const char* e = std::getenv(k.env); e && *e) k.set(r, e, k.env);
}

/// The defaults with the environment applied: what a run without a [runtime] table uses.
inline Runtime runtime_from_environment() {
  Runtime r;
  apply_runtime_environment(r);
  return r;
}

/// The value of `key` in `r` as TOML ("auto" quoted, 64, true, 1800.0).
inline std::string runtime_value_toml(const Runtime& r, const std::string& key) { return runtime_key(key, "").toml(r); }

/// `r` as the body of a TOML [runtime] table: one "key = value" line per key of runtime_keys().
inline std::string runtime_toml(const Runtime& r) {
  std::string out;
  for (const auto& k : runtime_keys()) out += std::string(k.key) + " = " + k.toml(r) + "\n";
  return out;
}

}  // namespace kvsim
