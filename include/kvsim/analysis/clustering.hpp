// kvsim: clustering helpers shared by `subgen_kcenter` and `kvsim clusters`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/core/types.hpp"

namespace kvsim {

/// Greedy k-center (Gonzalez 1985; SubGen ref. [8]): start from row 0, repeatedly add the row
/// farthest from the chosen centers (ties: the earliest row). A 2-approximation of the optimal
/// k-center radius. Returns min(k, rows) row indices in the order chosen.
std::vector<int64_t> greedy_kcenter(const MatD& X, int64_t k);

/// Index of the row of `centers` nearest to x (squared Euclidean distance; ties: the first).
int64_t nearest_row(const MatD& centers, const VecD& x);

/// `kvsim clusters`: SubGen Fig. 1-style clusterability of a recording's keys and values.
struct ClusterStudy {
  std::string name = "clusterability";
  std::string path;                 ///< recording
  double delta_rel = 0.5;           ///< δ = delta_rel × median norm of the layer's keys (resp. values)
  int64_t centers = 16;             ///< greedy k-center centers marked in the PCA scatter
  std::vector<int> layers;          ///< empty = every global layer (all, without layer_windows)
  /// premises.csv: δ multiples of the median key norm swept per KV head, and Theorem 1's ε.
  std::vector<double> premise_deltas = {0.125, 0.25, 0.5, 1.0};
  double premise_eps = 0.5;
};

/// Parse a clusters config (TOML: name, [data] path, [clusters] delta_rel, centers, layers);
/// unknown keys are errors naming key and line.
ClusterStudy load_cluster_study(const std::string& path, const std::vector<std::string>& overrides = {});

/// Runs the study and writes, atomically, into out_dir: clusters.csv (layer, kv_head, tensor, n,
/// clusters — m' of SubGen's online δ-clustering after n tokens, n = 2^j and the last n),
/// clusters_fit.csv (layer, tensor, delta, delta_r, gamma: log-log slope of the KV-head-mean m' over
/// n ≥ 16; delta_r = δ × max scaled query norm for keys), pca.csv (layer, tensor, index, pc1, pc2,
/// center: KV head 0 projected on its top-2 principal components, greedy k-center centers flagged) and
/// premises.csv (SubGen Theorem 1's premises per layer, KV head and δ multiple: r, δ·r vs ln n, γ,
/// Theorem 1's t and s, stored vs full vectors, and a verdict). Returns a printable summary.
std::string run_cluster_study(const ClusterStudy& s, const std::string& out_dir);

}  // namespace kvsim
