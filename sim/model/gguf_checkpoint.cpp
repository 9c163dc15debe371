// kvsim: a GGUF file of the `llama` or `gemma3` architecture as a Checkpoint
// (include/kvsim/model/checkpoint.hpp). Gemma 3 adds, per layer, attn_q_norm and attn_k_norm {hd} and
// post_attention_norm and post_ffw_norm {D}; its heads have key_length channels; its RMSNorm weights
// are stored as (1 + w) by llama.cpp's converter, so they multiply as llama's do; its Q and K rows are
// not permuted.
//
// Tensor names and shapes (llama.cpp gguf-py/gguf/constants.py, MODEL_ARCH.LLAMA; ne = {in, out}):
//   token_embd.weight {D, V}, output_norm.weight {D}, output.weight {D, V} (absent when tied),
//   blk.L.attn_norm.weight {D}, blk.L.attn_q.weight {D, H·hd}, blk.L.attn_k.weight {D, KV·hd},
//   blk.L.attn_v.weight {D, KV·hd}, blk.L.attn_output.weight {H·hd, D}, blk.L.ffn_norm.weight {D},
//   blk.L.ffn_gate.weight {D, F} (w1), blk.L.ffn_up.weight {D, F} (w3), blk.L.ffn_down.weight {F, D} (w2).
//
// The Q/K permutation. Hugging Face Llama checkpoints rotate channel pairs (i, i + hd/2) of each head
// (transformers `rotate_half`); llama.cpp rotates adjacent pairs (2i, 2i+1). Its converter
// (convert_hf_to_gguf.py `LlamaModel.permute`) therefore reorders the rows of W_q and W_k within each
// head: GGUF row 2i + j holds HF row j·hd/2 + i (j ∈ {0, 1}, i < hd/2). kvsim undoes it on load and
// rotates halves (LlamaConfig::rope_halves), so a GGUF recording's q and k are channel for channel the
// tensors transformers computes from the same weights (attention scores are the same either way;
// channel-wise methods such as KIVI's per-channel key quantization are not).
#include <algorithm>
#include <cmath>
#include <map>

#include "kvsim/core/error.hpp"
#include "kvsim/model/checkpoint.hpp"
#include "kvsim/model/gguf.hpp"

namespace kvsim {

namespace {

/// Rows of a [heads·hd, cols] matrix from GGUF's interleaved order back to the HF halves order.
void unpermute_rows(float* w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> tmp(size_t(hd * cols));
  for (int64_t h = 0; h < heads; ++h) {
    float* head = w + h * hd * cols;
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::copy(head + (2 * i + j) * cols, head + (2 * i + j + 1) * cols, tmp.data() + (j * hd / 2 + i) * cols);
    std::copy(tmp.begin(), tmp.end(), head);
  }
}

/// The model's shape and hyper-parameters from the metadata, with every refusal of what kvsim's
/// forward pass does not implement.
LlamaConfig read_config(const gguf::File& f) {
  const std::string& path = f.path();
  auto bad = [&](const std::string& why) -> Error { return Error(path + ": " + why); };
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "gemma3")
    throw bad("architecture '" + arch +
              "' is not supported (kvsim reads GGUF files of the 'llama' architecture: SmolLM2, TinyLlama, Llama 2, "
              "Llama 3 without rope scaling, Mistral without a sliding window; and 'gemma3')");
  const bool gemma = arch == "gemma3";
  const std::string p = arch + ".";
  auto meta_int = [&](const std::string& key, int64_t lo, int64_t hi) {
    const int64_t v = f.get_int(p + key);
    if (v < lo || v > hi)
      throw bad("metadata key '" + p + key + "' = " + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
    return int(v);
  };
  LlamaConfig c;
  c.gguf_version = int(f.version());
  c.architecture = arch;
  c.model_name = f.get_string("general.name", "");
  c.n_layers = meta_int("block_count", 1, 1024);
  c.dim = meta_int("embedding_length", 2, 65536);
  c.hidden_dim = meta_int("feed_forward_length", 1, 1 << 20);
  c.n_heads = meta_int("attention.head_count", 1, 4096);
  c.n_kv_heads = int(f.get_int(p + "attention.head_count_kv", c.n_heads));
  if (c.n_kv_heads < 1 || c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads)
    throw bad("metadata key '" + p + "attention.head_count_kv' = " + std::to_string(c.n_kv_heads) +
              " does not divide head_count " + std::to_string(c.n_heads));
  c.seq_len = meta_int("context_length", 1, 1 << 24);
  if (gemma) {
    // Gemma 3: heads of key_length channels (not dim / heads), the layers in groups of five local
    // (sliding-window, RoPE base 10,000) and one global (transformers' Gemma3TextConfig defaults:
    // sliding_window_pattern 6, rope_local_base_freq 10,000, which the GGUF file does not carry;
    // llama.cpp hard-codes the same), query_pre_attn_scalar = head_dim, embeddings × √dim.
    c.head_dim_override = meta_int("attention.key_length", 2, 4096);
    if (f.get_int(p + "attention.value_length", c.head_dim_override) != c.head_dim_override)
      throw bad("metadata key '" + p + "attention.value_length' differs from key_length (not supported)");
    c.sliding_window = meta_int("attention.sliding_window", 1, 1 << 24);
    c.local_pattern = 6;
    c.rope_theta_local = 10000.0;
    c.embed_scale = std::sqrt(double(c.dim));
    c.gelu_tanh = c.qk_norm = c.post_norms = true;
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
      if (f.has(p + k)) throw bad("metadata key '" + p + k + "' is set: logit soft-capping (Gemma 2) is not supported");
  } else if (c.dim % c.n_heads) {
    throw bad("embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count");
  }
  const int hd = c.head_dim();
  if (hd % 2) throw bad("head_dim " + std::to_string(hd) + " is odd (rotary embedding needs pairs)");
  for (const char* k : {"attention.key_length", "attention.value_length"})
    if (!gemma && f.has(p + k) && f.get_int(p + k) != hd)
      throw bad("metadata key '" + p + k + "' = " + std::to_string(f.get_int(p + k)) + " differs from embedding_length / head_count = " +
                std::to_string(hd) + " (kvsim reads models whose heads split the hidden state)");
  if (f.has(p + "rope.dimension_count") && f.get_int(p + "rope.dimension_count") != hd)
    throw bad("metadata key '" + p + "rope.dimension_count' = " + std::to_string(f.get_int(p + "rope.dimension_count")) +
              ": partial rotary embedding (head_dim " + std::to_string(hd) + ") is not supported");
  const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
  const double factor = f.get_float(p + "rope.scaling.factor", 1.0);
  if (scaling != "none" || (factor != 1.0 && factor != 0.0))
    throw bad("rope scaling (metadata key '" + p + "rope.scaling.type' = '" + scaling + "', factor " + std::to_string(factor) +
              ") is not supported");
  if (f.find_tensor("rope_freqs.weight"))
    throw bad("tensor 'rope_freqs.weight' (Llama 3.1-style rope scaling) is not supported");
  if (!gemma && f.get_int(p + "attention.sliding_window", 0) > 0)
    throw bad("metadata key '" + p + "attention.sliding_window' is set: sliding-window attention is not supported");
  if (f.get_int(p + "expert_count", 0) > 0) throw bad("metadata key '" + p + "expert_count' is set: mixture of experts is not supported");
  c.rope_theta = f.get_float(p + "rope.freq_base", 10000.0);
  c.rms_eps = f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  if (!(c.rope_theta > 1.0 && std::isfinite(c.rope_theta))) throw bad("metadata key '" + p + "rope.freq_base' must be a finite number > 1");
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) throw bad("metadata key '" + p + "attention.layer_norm_rms_epsilon' must be in (0, 1)");
  const auto& vocab = f.get_strings("tokenizer.ggml.tokens");
  c.vocab_size = int(vocab.size());
  if (f.has(p + "vocab_size") && f.get_int(p + "vocab_size") != c.vocab_size)
    throw bad("metadata key '" + p + "vocab_size' = " + std::to_string(f.get_int(p + "vocab_size")) + " but tokenizer.ggml.tokens holds " +
              std::to_string(c.vocab_size) + " tokens");
  c.rope_halves = true;
  c.shared_classifier = f.find_tensor("output.weight") == nullptr;
  return c;
}

struct Want {
  std::string name;
  std::vector<int64_t> ne;
  int slot;   ///< index in the canonical order of checkpoint.hpp
  int layer;
};

/// Every tensor the llama architecture needs, with its shape {in, out}.
std::vector<Want> expected_tensors(const LlamaConfig& c) {
  const int hd = c.head_dim();
  const int64_t D = c.dim, F = c.hidden_dim, L = c.n_layers, V = c.vocab_size, QD = int64_t(c.n_heads) * hd,
                KVD = c.kv_dim();
  std::vector<Want> want;
  want.push_back({"token_embd.weight", {D, V}, 0, 0});
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    want.push_back({b + "attn_norm.weight", {D}, 1, int(l)});
    want.push_back({b + "attn_q.weight", {D, QD}, 2, int(l)});
    want.push_back({b + "attn_k.weight", {D, KVD}, 3, int(l)});
    want.push_back({b + "attn_v.weight", {D, KVD}, 4, int(l)});
    want.push_back({b + "attn_output.weight", {QD, D}, 5, int(l)});
    want.push_back({b + "ffn_norm.weight", {D}, 6, int(l)});
    want.push_back({b + "ffn_gate.weight", {D, F}, 7, int(l)});
    want.push_back({b + "ffn_down.weight", {F, D}, 8, int(l)});
    want.push_back({b + "ffn_up.weight", {D, F}, 9, int(l)});
  }
  want.push_back({"output_norm.weight", {D}, 10, 0});
  if (!c.shared_classifier) want.push_back({"output.weight", {D, V}, 11, 0});
  for (int64_t l = 0; l < L && c.qk_norm; ++l) {  // Gemma 3 (llama.cpp's MODEL_ARCH.GEMMA3 names)
    const std::string b = "blk." + std::to_string(l) + ".";
    want.push_back({b + "attn_q_norm.weight", {hd}, 12, int(l)});
    want.push_back({b + "attn_k_norm.weight", {hd}, 13, int(l)});
    want.push_back({b + "post_attention_norm.weight", {D}, 14, int(l)});
    want.push_back({b + "post_ffw_norm.weight", {D}, 15, int(l)});
  }
  return want;
}

/// Refuses unexpected, misshapen, undequantizable or missing tensors; returns "Q4_1 ×210, …".
std::string check_tensors(const gguf::File& f, const std::vector<Want>& want) {
  auto bad = [&](const std::string& why) -> Error { return Error(f.path() + ": " + why); };
  std::map<std::string, const Want*> expected;
  for (const auto& w : want) expected.emplace(w.name, &w);
  std::map<std::string, int> per_type;
  for (const auto& t : f.tensors()) {
    auto it = expected.find(t.name);
    if (it == expected.end())
      throw bad("unexpected tensor '" + t.name + "' (not part of the llama architecture kvsim reads" +
                (t.name.find(".bias") != std::string::npos ? ": biases are not" : "") + ")");
    std::vector<int64_t> ne = t.ne;
    while (ne.size() > it->second->ne.size() && ne.back() == 1) ne.pop_back();
    if (ne != it->second->ne) {
      auto show = [](const std::vector<int64_t>& v) {
        std::string s = "{";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
        return s + "}";
      };
      throw bad("tensor '" + t.name + "' has shape " + show(t.ne) + " but the metadata implies " + show(it->second->ne));
    }
    if (!gguf::supported(t.type))
      throw bad("tensor '" + t.name + "' has type " + gguf::type_name(t.type) +
                ", which kvsim cannot dequantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
    ++per_type[gguf::type_name(t.type)];
  }
  for (const auto& w : want)
    if (!f.find_tensor(w.name)) throw bad("tensor '" + w.name + "' is missing");
  std::vector<std::pair<int, std::string>> types;
  for (const auto& [name, n] : per_type) types.emplace_back(-n, name);
  std::sort(types.begin(), types.end());
  std::string out;
  for (size_t i = 0; i < types.size(); ++i) out += (i ? ", " : "") + types[i].second + " \u00d7" + std::to_string(-types[i].first);
  return out;
}

}  // namespace

Checkpoint load_gguf_checkpoint(const std::string& path) {
  gguf::File f(path);
  auto bad = [&](const std::string& why) -> Error { return Error(path + ": " + why); };
  LlamaConfig c = read_config(f);
  const bool gemma = c.architecture == "gemma3";
  const std::vector<Want> want = expected_tensors(c);
  c.tensor_types = check_tensors(f, want);
  const int hd = c.head_dim();
  const int64_t D = c.dim, F = c.hidden_dim, L = c.n_layers, V = c.vocab_size, QD = int64_t(c.n_heads) * hd,
                KVD = c.kv_dim();
  // Everything is validated: allocate (sizes are bounded by the tensors the file holds) and fill.
  Checkpoint ck;
  const int64_t G = c.qk_norm ? L : 0;
  const int64_t sizes[] = {V * D, L * D, L * QD * D, L * KVD * D, L * KVD * D, L * D * QD, L * D, L * F * D, L * D * F,
                           L * F * D, D, c.shared_classifier ? 0 : V * D, G * hd, G * hd, G * D, G * D};
  int64_t floats = 0, start[16];
  for (int t = 0; t < 16; ++t) {
    start[t] = floats;
    floats += sizes[t];
  }
  ck.weights.resize(size_t(floats));
  for (const auto& w : want) {
    const gguf::TensorInfo& t = *f.find_tensor(w.name);
    const int parts = (w.slot == 0 || w.slot == 10 || w.slot == 11) ? 1 : int(L);
    float* dst = ck.weights.data() + start[w.slot] + (parts > 1 ? int64_t(w.layer) * (sizes[w.slot] / parts) : 0);
    f.read(t, dst);
    for (int64_t i = 0; i < t.n_values; ++i)
      if (!std::isfinite(dst[i])) throw bad("tensor '" + w.name + "' holds a non-finite value at index " + std::to_string(i));
    // llama.cpp permutes Q and K for the llama architecture only (Gemma rotates halves: NEOX order).
    if (w.slot == 2 && !gemma) unpermute_rows(dst, c.n_heads, hd, D);
    if (w.slot == 3 && !gemma) unpermute_rows(dst, c.n_kv_heads, hd, D);
  }
  c.sha256 = f.sha256();
  ck.cfg = c;
  return ck;
}

}  // namespace kvsim
