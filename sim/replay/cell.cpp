// One (layer, KV head) cell of a replay, in named parts:
//   streams    (cell_streams.hpp)     the cell's q, k, v, read once
//   reference  (cell_reference.cpp)   per block of evaluated steps the exact reference and ‖V_t‖_op;
//                                     full attention for the H2O objectives; global scores for oracles
//   policies   (cell_policies.cpp)    the instances (GPU replays when [eval] device = "cuda"), the prompt
//   stepping   (cell_stepping.cpp)    every policy stepped to the block's end (observe every token;
//                                     attend every step or only at evaluated ones), or, for closed-form
//                                     caches (window, sink), the block's answers at once by banded GEMMs
//   metrics    (cell_metrics.cpp)     the equal-memory rule checked and the registry's metrics recorded
// Stream semantics (docs/architecture.md, a replay step by step): at step t token t−1 (0-based) joins
// the cache, then q_t is answered.
#include "cell_policies.hpp"
#include "gpu_layer_batch.hpp"
#include "phase_clock.hpp"
#include "kvsim/replay/engine.hpp"

namespace kvsim {

void replay_cell(const Experiment& ex, const StreamSource& src, const Cell& cell, int64_t n,
                 std::vector<std::vector<MetricRow>>& out, cell::GpuLayerBatch* batch) {
  const double scale = src.meta().softmax_scale;
  const cell::Streams streams = [&] {
    phase::Scope ps(phase::streams);
    return cell::Streams(src, cell, n, scale);
  }();
  // A local layer (data.local_layers = "replay") is measured against window attention.
  const int64_t window = src.meta().is_local(cell.layer) ? src.meta().layer_window(cell.layer) : 0;
  cell::Reference reference(ex.eval, streams, n, scale, window);
  cell::Metrics metrics(ex, cell, n, src.meta().head_dim, reference);
  cell::PolicySteps policies(ex, cell, n, src.meta(), streams, scale, reference, metrics, batch);
  policies.make();
  {
    phase::Scope ps(phase::global);
    policies.global_scores();
    reference.objective_attention();
  }
  const std::vector<int64_t> steps = eval_steps(ex.eval, n);
  for (size_t p = 0; p < policies.size(); ++p) out[p].reserve(cell.heads.size() * steps.size());  // exact: no growth slack
  const bool ref_f32 = ex.eval.reference_precision == Precision::float32;
  for (size_t b0 = 0; b0 < steps.size();) {
    // Block of evaluated steps so that rows × t_max stays ≤ 4M doubles per query head.
    const size_t b1 = reference_block_end(steps, b0, ref_f32 ? kReferenceRowsF32 : 256);
    const std::vector<int64_t> block(steps.begin() + b0, steps.begin() + b1);
    reference.pass(block);
    metrics.begin_block();
    phase::Scope ps(phase::policies);
    for (size_t p = 0; p < policies.size(); ++p) policies.step(p, block, out[p]);
    b0 = b1;
  }
}

}  // namespace kvsim
