// kvsim: synthetic query/key/value streams generated from a seed (no files needed).
//
// Presets (all per (layer, head), deterministic in (seed, layer, head, tensor)):
//  - gaussian:     q, k, v iid N(0, σ²) entries (σ = q_scale, k_scale, v_scale).
//  - clustered:    keys lie in clusters of diameter ≤ δ₀ (`cluster_diameter`) around centers; the
//                  number of clusters opened after t tokens is m(t) = ⌈c·t^γ⌉ (`cluster_c`,
//                  `cluster_gamma`), so the key stream is (m(n), δ₀)-clusterable in the sense of
//                  SubGen Definition 1 (§3) with m(n) known exactly. Scaled queries q̃ = scale·q have
//                  ‖q̃‖ ≤ r (`query_norm`), uniformly random direction. Values are N(0, v_scale²).
//  - heavy_hitter: ordinary Gaussian keys plus `n_heavy` tokens (always token 0 — an attention sink —
//                  and others at random positions) whose keys align with a direction the queries
//                  share, so they take most of the attention mass (H2O §3, BUZZ Fig. 1).
// Exact parameters are stored as recording attributes (`synthetic_*`).
#pragma once
#include <map>
#include <string>

#include "kvsim/io/recording.hpp"

namespace kvsim {

struct SynthParams {
  std::string preset = "gaussian";
  int64_t n = 1024;
  int head_dim = 64;
  int n_layers = 1;
  int n_heads = 4;
  int n_kv_heads = 4;
  uint64_t seed = 1;
  double softmax_scale = 0;  ///< 0 → 1/sqrt(head_dim)
  double q_scale = 1.0, k_scale = 1.0, v_scale = 1.0;
  // clustered
  double cluster_c = 1.0;
  double cluster_gamma = 0.5;
  double cluster_diameter = 0.5;   ///< δ₀, in key units (before softmax scale)
  double center_scale = 4.0;       ///< std-dev of cluster center entries
  double query_norm = 2.0;         ///< r, bound on ‖softmax_scale·q‖
  // heavy_hitter
  int n_heavy = 4;
  double heavy_strength = 6.0;     ///< logit boost of heavy keys along the shared direction

  /// Validate; throws kvsim::Error naming the offending parameter (prefix `where`).
  void validate(const std::string& where) const;
  /// Number of clusters m(t) = ⌈c·t^γ⌉ opened after t tokens (clustered preset).
  int64_t clusters_after(int64_t t) const;
};

/// The list of preset names.
const std::vector<std::string>& synth_presets();

class SynthSource final : public StreamSource {
 public:
  explicit SynthSource(const SynthParams& p);
  const RecordingMeta& meta() const override { return meta_; }
  MatF read(int layer, Tensor which, int head) const override;
  std::string describe() const override;
  const SynthParams& params() const { return p_; }
  /// Cluster label of every key of (layer, kv head) — clustered preset only (empty otherwise).
  std::vector<int32_t> cluster_labels(int layer, int kv_head) const;

 private:
  SynthParams p_;
  RecordingMeta meta_;
};

/// Write a synthetic source to a recording file (atomic), streaming one head at a time.
void write_synthetic(const SynthSource& src, const std::string& path);

}  // namespace kvsim
