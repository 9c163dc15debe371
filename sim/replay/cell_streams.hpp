// Internal to the replay (sim/replay/cell.cpp): one (layer, KV head) cell's tensors, read once.
#pragma once
#include <vector>

#include "kvsim/core/types.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/replay/engine.hpp"

namespace kvsim::cell {

/// The cell's first n tokens: keys and values as stored (float32) and widened to double, and each
/// query head's queries, unscaled (float32, what the GPU and float32 paths take) and scaled by the
/// softmax scale in double (q̃_t = scale · q_t, what policies and the double reference take).
/// Query head g of the cell is cell.heads[g].
struct Streams {
  Streams(const StreamSource& src, const Cell& cell, int64_t n, double scale) {
    keys32 = src.read(cell.layer, Tensor::k, cell.kv_head).topRows(n);
    values32 = src.read(cell.layer, Tensor::v, cell.kv_head).topRows(n);
    keys = keys32.cast<double>();
    values = values32.cast<double>();
    const size_t G = cell.heads.size();
    queries32.resize(G);
    queries_scaled.resize(G);
    for (size_t g = 0; g < G; ++g) {
      queries32[g] = src.read(cell.layer, Tensor::q, cell.heads[g]).topRows(n);
      queries_scaled[g] = queries32[g].cast<double>() * scale;
    }
  }
  MatF keys32, values32;              ///< [n, head_dim]
  MatD keys, values;                  ///< the same in double
  std::vector<MatF> queries32;        ///< per query head, [n, head_dim], unscaled
  std::vector<MatD> queries_scaled;   ///< per query head, [n, head_dim], × softmax scale
};

}  // namespace kvsim::cell
