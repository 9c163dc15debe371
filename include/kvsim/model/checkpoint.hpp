// kvsim: reading llama2.c checkpoints in all three of llama2.c's formats (detected from the file).
//
//  - legacy ("version 0", llama2.c run.c): 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads,
//    n_kv_heads, vocab_size, seq_len; vocab_size < 0 means a separate classifier), then float32
//    token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
//    wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden],
//    w3 [L, hidden, dim], rms_final [dim], freq_cis_real/imag [seq_len, head_dim/2] (skipped: rotary
//    angles are recomputed with θ = 10000), then wcls [vocab, dim] when not shared.
//  - version 1 (llama2.c export.py `version1_export`): a 256-byte header — uint32 magic 0x616B3432
//    ("ak42"), int32 version = 1, the same 7 int32, uint8 shared_classifier, zero padding — then
//    float32 rms_att, rms_ffn, rms_final, token_embedding, wq, wk, wv, wo, w1, w2, w3, [wcls]; no
//    freq_cis tables.
//  - version 2 (`version2_export`, the int8 "Q8_0" format of runq.c): the version-1 header with
//    version = 2 and an int32 group_size after the classifier flag; then float32 rms_att, rms_ffn,
//    rms_final; then for each of token_embedding, wq of every layer, wk…, wv…, wo…, w1…, w2…, w3…,
//    [wcls] its int8 codes followed by its float32 scales (one per group of group_size consecutive
//    values). A weight is code × scale (runq.c `dequantize`), computed here once on load in float32 —
//    the same numbers runq.c's dequantized weights hold.
//
// And GGUF files (llama.cpp; versions 2 and 3) of the `llama` architecture, see gguf_checkpoint.cpp:
// every tensor dequantized to float32 into the same order, Q and K rows put back into the Hugging
// Face order (rotary pairs (i, i + head_dim/2)), RoPE θ and the RMSNorm ε from the file's metadata.
#pragma once
#include <cmath>
#include <string>
#include <vector>

namespace kvsim {

struct LlamaConfig {
  int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
  int format_version = 0;  ///< 0 legacy, 1 float32 export, 2 Q8_0 export
  int group_size = 0;      ///< Q8_0 group size (version 2), else 0
  int gguf_version = 0;    ///< 2 or 3 for a GGUF file, else 0
  double rope_theta = 10000.0;  ///< RoPE base θ (Su et al. 2021, RoFormer Eq. 15: θ_i = θ^(−2i/d))
  double rms_eps = 1e-5;        ///< RMSNorm ε (Zhang & Sennrich 2019)
  /// Rotary pairs: false = adjacent channels (2i, 2i+1) (llama2.c, Meta's reference code); true =
  /// halves (i, i + head_dim/2), the order of Hugging Face checkpoints and transformers'
  /// `rotate_half`, which a GGUF file's Q/K rows are put back into (gguf_checkpoint.cpp).
  bool rope_halves = false;
  std::string architecture = "llama";  ///< "llama" or (GGUF) "gemma3"
  // Gemma 3 (Gemma Team 2025, "Gemma 3 Technical Report" §2; transformers' Gemma3TextModel), all
  // neutral for llama:
  int head_dim_override = 0;     ///< head_dim when heads do not split the hidden state (Gemma 3: 256 × 4 > 640)
  double embed_scale = 1.0;      ///< token embeddings × this (Gemma: √dim)
  double query_scale = 0.0;      ///< attention logits × this (Gemma: query_pre_attn_scalar^−½); 0 = head_dim^−½
  bool gelu_tanh = false;        ///< FFN gate activation: GELU (tanh approximation) instead of SiLU
  bool qk_norm = false;          ///< per-head RMSNorm of q and k before RoPE (weights q_norm, k_norm)
  bool post_norms = false;       ///< RMSNorm of the attention and FFN outputs before each residual add
  int sliding_window = 0;        ///< tokens a local layer attends (its own included); 0 = all layers global
  int local_pattern = 0;         ///< layer l is global iff (l + 1) % local_pattern == 0 (Gemma 3: 6)
  double rope_theta_local = 10000.0;  ///< RoPE base of local layers (rope_theta: global layers)
  std::string model_name;    ///< GGUF general.name
  std::string tensor_types;  ///< GGUF: "Q4_1 ×210, F32 ×61, Q8_0 ×1" (tensors per type, most first)
  std::string sha256;        ///< GGUF: the file's sha256
  int head_dim() const { return head_dim_override ? head_dim_override : dim / n_heads; }
  int q_dim() const { return head_dim() * n_heads; }
  int kv_dim() const { return head_dim() * n_kv_heads; }
  double attn_scale() const { return query_scale > 0 ? query_scale : 1.0 / std::sqrt(double(head_dim())); }
  /// Tokens layer l attends: sliding_window on a local layer, 0 (all) on a global one.
  int layer_window(int l) const {
    return sliding_window > 0 && local_pattern > 0 && (l + 1) % local_pattern != 0 ? sliding_window : 0;
  }
  double layer_rope_theta(int l) const { return layer_window(l) ? rope_theta_local : rope_theta; }
  /// "llama2.c legacy (float32)", "llama2.c version 1 (float32)", "llama2.c version 2 (Q8_0, group
  /// 64)" or "GGUF v3 (llama; Q4_1 ×210, F32 ×61, Q8_0 ×1)".
  std::string format_name() const;
};

struct Checkpoint {
  LlamaConfig cfg;
  /// float32 weights in one order for every format: token_embedding, rms_att, wq, wk, wv, wo,
  /// rms_ffn, w1, w2, w3, rms_final, then wcls when not shared; then, for Gemma 3 only, q_norm
  /// [L, head_dim], k_norm [L, head_dim], post_attention_norm [L, dim], post_ffw_norm [L, dim].
  /// wq is [L, q_dim, dim], wo [L, dim, q_dim].
  std::vector<float> weights;
};

/// Loads a checkpoint of any of the three formats. Throws kvsim::Error, one line naming the file, for
/// an unknown magic or version (a GGUF, zip/PyTorch or safetensors file is named as such), header
/// values out of range, a group size that does not divide dim, a file size other than the header
/// implies (truncated or extended), non-zero header padding, or a non-finite weight or scale.
/// A GGUF file (detected by its magic) goes to load_gguf_checkpoint.
Checkpoint load_checkpoint(const std::string& path);

/// Loads a GGUF file of the `llama` architecture (SmolLM2, TinyLlama, Llama 2, Llama 3 without rope
/// scaling, Mistral without a sliding window) or the `gemma3` architecture (Gemma 3 270M). Throws kvsim::Error (one line, naming the file and the
/// key or tensor), before allocating the weights, for: another architecture (named), rope scaling
/// (metadata or a rope_freqs tensor), a sliding window, mixture of experts, partial rotary, key/value
/// lengths other than dim / n_heads, a tensor type kvsim cannot dequantize, a missing, duplicate or
/// unexpected tensor, a tensor whose dimensions disagree with the metadata; after, for a non-finite
/// weight. File-level damage (truncation, misalignment, overlaps, overflow) is refused by gguf::File.
Checkpoint load_gguf_checkpoint(const std::string& path);

}  // namespace kvsim
