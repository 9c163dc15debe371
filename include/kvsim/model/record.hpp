// kvsim: `kvsim record` — run a llama2.c checkpoint and write its post-rotary q, k and v of every
// layer and head (plus the model's own per-head attention output) in the recording schema.
#pragma once
#include <string>
#include <cmath>
#include <vector>

#include "kvsim/io/recording.hpp"
#include "kvsim/model/checkpoint.hpp"
#include "kvsim/policies/policy.hpp"
#include "kvsim/model/tokenizer.hpp"

namespace kvsim {

struct RecordOptions {
  std::string checkpoint;
  std::string tokenizer;
  std::string text_path;    ///< teacher-forced mode: encode this text (Tokenizer::encode_document)
  double text_tail = 0;     ///< > 0: only the last share of the text's tokens (text_tokens)
  int tokens = 256;         ///< teacher-forced: number of tokens (≤ the model's seq_len)
  int generate = 0;         ///< >0: greedy generation of up to this many positions (stops at BOS,
                            ///< except for byte-level vocabularies, where BOS separates paragraphs)
  std::string prompt;       ///< generation mode: optional prompt (else BOS only)
  std::string out;          ///< output .h5 (written atomically); empty = do not write
  bool with_attn = true;    ///< also store /layer_*/attn (the model's attention output)
  int deflate = 0;          ///< 0: tensors uncompressed; 1-9: shuffle + deflate level (RecordingWriter)
  std::vector<int> token_ids;  ///< teacher-forced: use these tokens instead of encoding text_path
  /// Teacher-forced: index of the first recorded token in text_path's token stream (after text_tail);
  /// record_windows sets text_windows' offset. Written as the attribute text_token_offset (provenance).
  int64_t text_token_offset = 0;
  /// Closed loop: a policy manages every (layer, KV head) cache while recording (`--policy`).
  std::string policy;
  Params policy_params;
  GqaMode gqa = GqaMode::kv_head;
  uint64_t seed = 1;
  /// Teacher-forced recordings without a policy: "batched" (LlamaModel::prefill: GEMMs over all
  /// positions, written layer by layer), "per-token" (the decoder's one-token path, double-precision
  /// attention), or "auto": batched for GGUF checkpoints, per-token for llama2.c ones (whose shipped
  /// experiments were recorded that way).
  std::string prefill = "auto";
  int threads = 0;  ///< batched prefill threads (0 = every hardware thread)
  /// `--layers`: "all" (default), "global" (the layers without a sliding window: Gemma 3's 5, 11, 17)
  /// or a comma list of layer indices ("5,11,17"). A subset is written renumbered 0, 1, … in
  /// ascending order, with the root attribute subset_layers holding the model's layer indices
  /// (the layout of datasets/subset_recording.py); the model still runs every layer.
  std::string layers = "all";
};

struct RecordResult {
  std::vector<int> tokens;
  std::vector<float> cross_entropy;  ///< teacher-forced: nats, size tokens-1
  double mean_cross_entropy = 0;
  std::string text;                  ///< decoded text of the recorded tokens
  /// Closed loop only: the exact run's mean cross-entropy (teacher-forced) and, when generating, the
  /// first position where the policy's greedy tokens differ from exact ones (-1 = never).
  double exact_cross_entropy = NAN;
  int diverge_at = -1;
  std::string path_taken;   ///< "batched prefill" or "per-token"
  double forward_seconds = 0;  ///< wall time of the model's forward passes (not loading or writing)
};

/// The recording attributes of a model's post-RoPE tensors over n_tokens positions (rope "applied",
/// the model's RoPE base and pair layout, softmax_scale 1/√head_dim): `kvsim record`'s files and
/// `kvsim task`'s in-memory trials share them.
RecordingMeta model_recording_meta(const LlamaConfig& cfg, const std::string& model, const std::string& source,
                                   int64_t n_tokens);

/// The model layers `spec` names (RecordOptions::layers: "all", "global" or "L,L,…"), ascending and
/// distinct. Throws kvsim::Error naming --layers for an unknown word, a layer out of [0, n_layers)
/// or an empty selection.
std::vector<int> record_layers(const std::string& spec, const LlamaConfig& cfg);

/// Runs the model; throws kvsim::Error naming the file at fault.
RecordResult record_model(const RecordOptions& opt);

/// The token stream of a text file (Tokenizer::encode_document: BOS first, and for a byte-level
/// vocabulary BOS at every blank-line paragraph). `tail` in (0, 1): keep only the last
/// ⌊tail · tokens⌋ tokens, as a training script's held-out split (shakespeare-q80: 0.05 of the Tiny
/// Shakespeare stream); the tail need not start with BOS. Throws kvsim::Error naming the file when
/// it cannot be read or yields fewer than `want` tokens (`need_name` names the option that asked).
std::vector<int> text_tokens(const std::string& path, const Tokenizer& tok, int64_t want, double tail,
                             const std::string& need_name);

/// `windows` disjoint consecutive windows of `tokens` tokens from text_tokens(path, tok, ·, tail), each
/// a fresh sequence as the model would be fed it: where the tokenizer says BOS opens every sequence
/// (Tokenizer::bos_opens_sequence: Gemma 3), each window is BOS followed by the stream's next
/// tokens − 1 text tokens (the stream's own leading BOS dropped), else a plain cut of `tokens` stream
/// tokens. `offsets` (optional) receives each window's first text token's index in that stream (BOS
/// excluded). Throws kvsim::Error naming the file when the text is too short (`need_name`).
std::vector<std::vector<int>> text_windows(const std::string& path, const Tokenizer& tok, int tokens, int windows,
                                           double tail, const std::string& need_name,
                                           std::vector<int64_t>* offsets = nullptr);

/// OUT with "_wNN" before its extension (results/x.h5 → results/x_w03.h5).
std::string window_path(const std::string& out, int w);

/// `kvsim record --windows N`: N disjoint consecutive windows of opt.tokens tokens of the text, cut by
/// text_windows (the first starts with BOS, every one does where the model expects BOS first; each is
/// recorded from position 0 with an empty cache, as a fresh sequence), written to window_path(opt.out, w). Returns the paths. Several sequences for one experiment
/// (`[data] path = [...]`).
std::vector<std::string> record_windows(const RecordOptions& opt, int windows);

}  // namespace kvsim
