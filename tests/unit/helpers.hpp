// Test helpers: temporary folders and small recordings.
#pragma once
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>

#include "kvsim/io/recording.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim::test {

/// Equal to the bit for the tests that claim identical results: equal values, or NaN on both sides
/// (a metric that does not apply).
inline bool same_bits(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

/// True when Catch is only asked to list (ctest's catch_discover_tests at build time): a binary whose
/// main() exits 77 without its model files must still list its cases.
inline bool listing_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).starts_with("--list")) return true;
  return false;
}

/// A fresh temporary folder removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("kvsim_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline SynthParams small_synth(const std::string& preset = "gaussian", int64_t n = 64, int d = 8, int layers = 2,
                               int heads = 4, int kv_heads = 2) {
  SynthParams p;
  p.preset = preset;
  p.n = n;
  p.head_dim = d;
  p.n_layers = layers;
  p.n_heads = heads;
  p.n_kv_heads = kv_heads;
  p.seed = 7;
  return p;
}

/// The stream a policy under test is built for: n tokens of head_dim d, `queries` query heads per KV head,
/// float32 arithmetic when f32 (the GPU twins' precision); every other field its default.
inline StreamInfo stream_info(int64_t n, int d, int queries = 1, bool f32 = false) {
  StreamInfo s;
  s.n = n;
  s.head_dim = d;
  s.n_queries = queries;
  s.policy_f32 = f32;
  return s;
}

}  // namespace kvsim::test

namespace kvsim::test {

/// A StreamSource over in-memory matrices (hand-made streams).
class MemorySource final : public StreamSource {
 public:
  MemorySource(int layers, int heads, int kv_heads, int64_t n, int d, double scale) {
    meta_.n_layers = layers;
    meta_.n_heads = heads;
    meta_.n_kv_heads = kv_heads;
    meta_.n_tokens = n;
    meta_.head_dim = d;
    meta_.softmax_scale = scale;
    q_.assign(layers, std::vector<MatF>(heads, MatF::Zero(n, d)));
    k_.assign(layers, std::vector<MatF>(kv_heads, MatF::Zero(n, d)));
    v_.assign(layers, std::vector<MatF>(kv_heads, MatF::Zero(n, d)));
  }
  const RecordingMeta& meta() const override { return meta_; }
  MatF read(int layer, Tensor which, int head) const override {
    switch (which) {
      case Tensor::q: return q_.at(layer).at(head);
      case Tensor::k: return k_.at(layer).at(head);
      case Tensor::v: return v_.at(layer).at(head);
      default: throw Error("memory source: no attn");
    }
  }
  std::string describe() const override { return "memory"; }
  MatF& q(int l, int h) { return q_[l][h]; }
  MatF& k(int l, int h) { return k_[l][h]; }
  MatF& v(int l, int h) { return v_[l][h]; }

 private:
  RecordingMeta meta_;
  std::vector<std::vector<MatF>> q_, k_, v_;
};

}  // namespace kvsim::test
