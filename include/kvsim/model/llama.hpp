// kvsim: a Llama-architecture forward pass for llama2.c checkpoints, used by `kvsim record` to
// capture real query/key/value tensors (docs/recordings.md, "Recording from a model").
//
// Checkpoints: llama2.c legacy, version 1 (float32) and version 2 (Q8_0), and GGUF (llama, gemma3),
// see checkpoint.hpp.
// Block: x += Wo·Attn(RoPE(Wq·n(x)), RoPE(Wk·n(x)), Wv·n(x)); x += W2(silu(W1·n(x)) ⊙ W3·n(x)),
// n = RMSNorm (eps 1e-5); rotary on adjacent pairs (2i, 2i+1) of each head (halves for GGUF).
// Gemma 3 (Gemma 3 Technical Report §2; transformers' Gemma3DecoderLayer): embeddings × √dim;
// x += n_post(Wo·Attn(RoPE(n_q(Wq·n(x))), RoPE(n_k(Wk·n(x))), Wv·n(x))) with n_q, n_k RMSNorms per
// head; x += n_post'(W2(gelu_tanh(W1·n(x)) ⊙ W3·n(x))); local layers attend to their last
// sliding_window tokens with RoPE base rope_theta_local, global layers to all with rope_theta.
#pragma once
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kvsim/core/types.hpp"
#include "kvsim/model/checkpoint.hpp"

namespace kvsim {

/// What one layer computed for one token: post-rotary q [n_heads·hd], k and v [n_kv_heads·hd], and
/// the per-head attention output [n_heads·hd] (before Wo).
struct LayerTrace {
  const float* q;
  const float* k;
  const float* v;
  const float* attn;
};

/// Who computes attention inside the model. The default (no override) is exact attention over the
/// model's own cache; `kvsim record --policy` installs a cache policy instead (closed loop: later
/// tokens are computed from the compressed attention, as a deployed cache would behave).
class KVAttention {
 public:
  virtual ~KVAttention() = default;
  /// Token `pos` (0-based) of `layer`: q is [n_heads·hd] (post-rotary), k and v are [n_kv_heads·hd];
  /// write the per-head attention output [n_heads·hd] into `out`.
  virtual void attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) = 0;
  /// Mean tokens held per (layer, cache) now; NaN when the override does not say.
  virtual double mean_cache_tokens() const { return std::numeric_limits<double>::quiet_NaN(); }
};

class LlamaModel {
 public:
  /// Loads and validates a checkpoint of any llama2.c format (load_checkpoint).
  explicit LlamaModel(const std::string& path);
  const LlamaConfig& config() const { return cfg_; }
  const std::string& path() const { return path_; }

  /// Runs one token at position `pos` (0-based, positions must be fed in order from 0) and returns
  /// the logits [vocab]. The exact KV cache is kept internally. `trace`, if set, is called once per
  /// layer with that layer's tensors.
  const std::vector<float>& forward(int token, int pos,
                                    const std::function<void(int layer, const LayerTrace&)>& trace = {});
  /// Batched teacher-forced forward pass (a prefill) over `tokens` from position 0: every layer as
  /// GEMMs over all positions, causal attention in blocks of 128 queries (float32, exact softmax),
  /// `threads` threads. Calls on_layer(l, Q, K, V, A) once per layer, in order — Q and A are
  /// [n, n_heads·hd] (post-RoPE queries; the attention output before Wo), K and V [n, n_kv_heads·hd]
  /// (post-RoPE keys) — and on_logits(row0, L) for each block of up to 256 positions, L [rows, vocab]
  /// (row r predicts the token after position row0 + r). Leaves the one-token path's cache as it was.
  /// Same numbers as forward() up to float32 rounding (GEMM summation order, float32 attention).
  void prefill(const std::vector<int>& tokens, int threads,
               const std::function<void(int, const MatF&, const MatF&, const MatF&, const MatF&)>& on_layer,
               const std::function<void(int, const MatF&)>& on_logits) const;
  /// One decoding position for B independent sequences at once (a batched decode): sequence b feeds
  /// tokens[b] at position `pos` and its attention goes through attn[b] (its own cache, e.g. one
  /// PolicyKVAttention per policy; all non-null). The linear layers run as GEMMs over the B rows
  /// ([B, dim] · Wᵀ), so the weights are read once per position for all B sequences instead of once
  /// each — the closed loop's cost. `threads` threads split each GEMM's output features and the B
  /// attention calls (attn[b] is only ever called from one thread at a time). logits → [B, vocab].
  /// Same float32 arithmetic as prefill()'s linear layers, for every architecture prefill() runs
  /// (Gemma 3's norms, GeGLU and two RoPE bases included: attn[b] receives a local layer's q/k rotated
  /// with rope_theta_local and must itself restrict that layer to its window, as PolicyKVAttention
  /// does); throws kvsim::Error on a bad token or pos.
  void decode_step(const std::vector<int>& tokens, int pos, const std::vector<KVAttention*>& attn, int threads,
                   MatF& logits) const;
  /// Install (or with nullptr remove) an attention override; not owned. Positions restart at 0
  /// with a fresh exact cache whenever forward(·, 0) is called.
  void set_attention(KVAttention* a) { override_ = a; }

 private:
  LlamaConfig cfg_;
  std::string path_;
  std::vector<float> data_;
  // Weight pointers into data_.
  const float *emb_, *rms_att_, *wq_, *wk_, *wv_, *wo_, *rms_ffn_, *w1_, *w2_, *w3_, *rms_final_, *wcls_;
  // Gemma 3 only (null otherwise): per-layer q/k RMSNorm [L, hd] and post-attention/FFN RMSNorm [L, dim].
  const float *q_norm_ = nullptr, *k_norm_ = nullptr, *post_att_ = nullptr, *post_ffn_ = nullptr;
  // Activations and cache.
  std::vector<float> x_, xb_, q_, k_, v_, att_out_, hb_, hb2_, logits_;
  // Exact cache in double, one [seq_len, head_dim] matrix per (layer, kv head): the same arithmetic
  // as the `exact` policy (attend_cached), so a closed loop with `exact` reproduces it bit for bit.
  std::vector<MatD> key_cache_, value_cache_;
  KVAttention* override_ = nullptr;
};

/// Mean of a vector (helper for cross-entropy reports).
double mean_of(const std::vector<float>& v);

/// Cross-entropy (nats) of `target` under `logits`, log-sum-exp in double, stored as float — the one
/// definition `kvsim record` and the closed loop share, so their means agree bit for bit.
float token_cross_entropy(const std::vector<float>& logits, int target);
/// The same over logits[0..vocab) (a row of the batched prefill's logits block).
float token_cross_entropy(const float* logits, int vocab, int target);

}  // namespace kvsim
