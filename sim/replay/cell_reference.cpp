// The exact side of one replay cell (sim/replay/cell_reference.hpp).
#include "cell_reference.hpp"

#include "kvsim/core/error.hpp"
#include "kvsim/replay/gpu_reference.hpp"
#include "phase_clock.hpp"

namespace kvsim::cell {

Reference::Reference(const EvalSpec& eval, const Streams& streams, int64_t n, double scale, int64_t window)
    : eval_(eval), s_(streams), n_(n), scale_(scale), window_(window), ref_(streams.queries32.size()), prow_(streams.queries32.size()),
      opnorm_tracker_(int(streams.keys32.cols())), attn_all_(streams.queries32.size()) {}

void Reference::pass(const std::vector<int64_t>& block) {
  {  // the attention, apart from the operator norm below
    phase::Scope pr(phase::reference);
    for (size_t g = 0; g < ref_.size(); ++g) {
      if (eval_.device == Device::cuda) {
        if (window_ > 0) throw Error("data.local_layers = \"replay\": window attention is not on the GPU path yet; use [eval] device = \"cpu\"");
        cuda::exact_attention_block(s_.queries32[g], s_.keys32, s_.values32, scale_, block, ref_[g]);
      } else if (eval_.reference_precision == Precision::float32)
        exact_attention_f32(s_.queries32[g], s_.keys32, s_.values32, scale_, block, ref_[g], window_);
      else
        exact_attention(s_.queries32[g], s_.keys, s_.values, scale_, block, ref_[g], window_);
    }
  }
  phase::Scope po(phase::opnorm);
  opnorm_.resize(block.size());
  for (size_t r = 0; r < block.size(); ++r) {
    for (; opnorm_t_ < block[r]; ++opnorm_t_) opnorm_tracker_.add(s_.values32.row(opnorm_t_).data());
    opnorm_[r] = opnorm_tracker_.op_norm();
  }
}

void Reference::objective_attention() {
  t_obj_ = eval_.objectives ? std::min(n_, eval_.objectives_max_t) : 0;
  if (t_obj_ <= 0) return;
  std::vector<int64_t> all(t_obj_);
  for (int64_t t = 0; t < t_obj_; ++t) all[t] = t + 1;
  ReferenceBlock blk;
  for (size_t g = 0; g < attn_all_.size(); ++g) {
    exact_attention(s_.queries32[g], s_.keys, s_.values, scale_, all, blk, window_);
    attn_all_[g] = std::move(blk.probs);
  }
}

std::vector<VecD> Reference::global_scores() const {
  std::vector<VecD> global(s_.queries32.size());
  for (size_t g = 0; g < global.size(); ++g) global[g] = global_attention_scores(s_.queries32[g], s_.keys, scale_, window_);
  return global;
}

}  // namespace kvsim::cell
