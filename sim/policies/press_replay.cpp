// `press_replay`: a prompt compression decided elsewhere, replayed. The file (written by
// kvsim.kvpress.save, docs/kvpress.md) holds, per layer and KV head, the prompt positions a press kept
// (a kvpress press run on the same prompt through transformers); at prefill the cache keeps exactly
// those tokens, and every decoded token joins, as kvpress's decoding appends. kvsim then measures the
// press like its own policies: rel_err, ε, τ, kept_mass, cache and loaded bytes.
//
// File format (HDF5): root attributes `kvsim_press` = 1, `press` (its name), `prompt` = P (tokens),
// `n_layers`, `n_kv_heads`; datasets `/layer_LLL/kv_head_HH` (integers): the kept positions, each in
// [0, P), ascending, no repeats.
#include <cstdio>
#include <string>

#include "factories.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/h5.hpp"
#include "slot_cache.hpp"

namespace kvsim::policies {
namespace {

class PressReplay final : public Policy, public PromptCompressor, public SlotAnswersStepper {
 public:
  PressReplay(std::vector<int64_t> kept, const StreamInfo& s)
      : kept_(std::move(kept)), cache_(int64_t(kept_.size()) + std::max<int64_t>(0, s.n - s.prefill), s.head_dim, s.policy_f32) {}

  void prefill(int64_t, const MatF& K, const MatF& V, const std::vector<const MatD*>&) override {
    for (int64_t j : kept_) cache_.append(j, K.row(j).data(), V.row(j).data());
    prefilled_ = true;
  }
  void observe(int64_t t, const float* k, const float* v) override {
    if (!prefilled_) throw Error("press_replay: token " + std::to_string(t) + " arrived before the prompt (set [data] prefill = P)");
    cache_.append(t, k, v);
  }
  void attend(int64_t, const MatD& q, std::vector<Answer>* out, const std::vector<const double*>*) override {
    if (out) cache_.answer_group(q, out);
  }
  int64_t cache_tokens() const override { return cache_.size(); }

  // Blocked stepping over the answering store (SlotAnswersStepper).
  Policy& stepper_policy() override { return *this; }
  const SlotCache& answering_store() const override { return cache_; }

 private:
  std::vector<int64_t> kept_;
  SlotCache cache_;
  bool prefilled_ = false;
};

std::string dataset_of(int layer, int kv_head) {
  char name[48];
  std::snprintf(name, sizeof name, "/layer_%03d/kv_head_%02d", layer, kv_head);
  return name;
}

std::unique_ptr<Policy> make_press_replay(ParamReader& p, const StreamInfo& s) {
  const std::string path = p.get_string("file");  // required: a missing one is refused by name
  if (path.empty()) throw Error("parameter 'file' (a press's kept sets, written by kvsim.kvpress.save) is empty");
  if (s.prefill <= 0) throw Error("needs a prompt: set [data] prefill = P, the prompt the press compressed");
  const h5::File f = h5::File::open_read(path);
  if (!f.has_attr("kvsim_press") || f.attr_int("kvsim_press") != 1)
    throw Error(path + ": not a press file (no root attribute kvsim_press = 1; write it with kvsim.kvpress.save)");
  const int64_t P = f.attr_int("prompt");
  if (P != s.prefill)
    throw Error(path + ": the press compressed a prompt of " + std::to_string(P) + " tokens, but [data] prefill = " +
                std::to_string(s.prefill));
  const std::string name = dataset_of(s.layer, s.kv_head);
  if (!f.exists(name)) throw Error(path + ": no dataset " + name + " (the press file holds another model's layers or heads)");
  const std::vector<int32_t> raw = f.read_int_vector(name);
  std::vector<int64_t> kept(raw.begin(), raw.end());
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i] < 0 || kept[i] >= P || (i > 0 && kept[i] <= kept[i - 1]))
      throw Error(path + ": " + name + " must hold ascending positions in [0, " + std::to_string(P) + ") without repeats");
  return std::make_unique<PressReplay>(std::move(kept), s);
}

}  // namespace

KVSIM_POLICY(press_replay) {
  static const PolicyInfo info{
      "press_replay",
      "the prompt tokens another implementation's press kept (a file from kvsim.kvpress.save, per layer and KV head), "
      "then every decoded token, as kvpress decodes. Needs [data] prefill = the press's prompt",
      "kvpress (NVIDIA) presses, replayed: docs/kvpress.md",
      {{"file", "string", "required", "the press file (HDF5: /layer_LLL/kv_head_HH kept positions, root attribute prompt = P)"}},
      make_press_replay,
      std::nullopt,
      "no",
      {example_params({{"file", std::string("press.h5")}})},  // tests/unit/test_registry.cpp writes the file
      "#843c39",  // figure colour
      {{}, false, true}};  // kvsim bench: not benchmarked (needs a press file); its arithmetic follows policy_precision
  return info;
}

}  // namespace kvsim::policies
