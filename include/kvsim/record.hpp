// kvsim: `kvsim record` — run a llama2.c checkpoint and write its post-rotary q, k and v of every
// layer and head (plus the model's own per-head attention output) in the recording schema.
#pragma once
#include <string>
#include <vector>

namespace kvsim {

struct RecordOptions {
  std::string checkpoint;
  std::string tokenizer;
  std::string text_path;    ///< teacher-forced mode: encode this text (with BOS)
  int tokens = 256;         ///< teacher-forced: number of tokens (≤ the model's seq_len)
  int generate = 0;         ///< >0: greedy generation of up to this many positions
  std::string prompt;       ///< generation mode: optional prompt (else BOS only)
  std::string out;          ///< output .h5 (written atomically); empty = do not write
  bool with_attn = true;    ///< also store /layer_*/attn (the model's attention output)
};

struct RecordResult {
  std::vector<int> tokens;
  std::vector<float> cross_entropy;  ///< teacher-forced: nats, size tokens-1
  double mean_cross_entropy = 0;
  std::string text;                  ///< decoded text of the recorded tokens
};

/// Runs the model; throws kvsim::Error naming the file at fault.
RecordResult record_model(const RecordOptions& opt);

}  // namespace kvsim
