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
  std::string architecture = "llama";
  std::string model_name;    ///< GGUF general.name
  std::string tensor_types;  ///< GGUF: "Q4_1 ×210, F32 ×61, Q8_0 ×1" (tensors per type, most first)
  std::string sha256;        ///< GGUF: the file's sha256
  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return head_dim() * n_kv_heads; }
  /// "llama2.c legacy (float32)", "llama2.c version 1 (float32)", "llama2.c version 2 (Q8_0, group
  /// 64)" or "GGUF v3 (llama; Q4_1 ×210, F32 ×61, Q8_0 ×1)".
  std::string format_name() const;
};

struct Checkpoint {
  LlamaConfig cfg;
  /// float32 weights in one order for every format: token_embedding, rms_att, wq, wk, wv, wo,
  /// rms_ffn, w1, w2, w3, rms_final, then wcls when not shared.
  std::vector<float> weights;
};

/// Loads a checkpoint of any of the three formats. Throws kvsim::Error, one line naming the file, for
/// an unknown magic or version (a GGUF, zip/PyTorch or safetensors file is named as such), header
/// values out of range, a group size that does not divide dim, a file size other than the header
/// implies (truncated or extended), non-zero header padding, or a non-finite weight or scale.
/// A GGUF file (detected by its magic) goes to load_gguf_checkpoint.
Checkpoint load_checkpoint(const std::string& path);

/// Loads a GGUF file of the `llama` architecture (SmolLM2, TinyLlama, Llama 2, Llama 3 without rope
/// scaling, Mistral without a sliding window). Throws kvsim::Error (one line, naming the file and the
/// key or tensor), before allocating the weights, for: another architecture (named), rope scaling
/// (metadata or a rope_freqs tensor), a sliding window, mixture of experts, partial rotary, key/value
/// lengths other than dim / n_heads, a tensor type kvsim cannot dequantize, a missing, duplicate or
/// unexpected tensor, a tensor whose dimensions disagree with the metadata; after, for a non-finite
/// weight. File-level damage (truncation, misalignment, overlaps, overflow) is refused by gguf::File.
Checkpoint load_gguf_checkpoint(const std::string& path);

}  // namespace kvsim
