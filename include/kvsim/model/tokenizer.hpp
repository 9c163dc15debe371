// kvsim: the llama2.c tokenizer.bin format (sentencepiece BPE exported by llama2.c).
// File: int32 max_token_length, then per token: float32 score, int32 length, `length` bytes.
// Encoding (as llama2.c's `encode`): optional BOS (id 1), a dummy-prefix " " piece when the text is
// non-empty, one piece per UTF-8 code point (byte fallback to ids 3 + byte when a code point has no
// piece), then repeatedly merge the adjacent pair whose concatenation has the highest score
// (leftmost on ties) until no pair merges.
//
// Byte-level vocabularies (259 pieces: <unk>, <s>, </s>, then piece 3 + b spells byte b, literally or
// as "<0xHH>" — e.g. shakespeare-q80's byte_tokenizer.bin) are detected on load and encoded the way
// such models are trained: token = byte + 3, no dummy-prefix space, no merges. llama2.c's run.c
// would prepend " " (its sentencepiece convention); kvsim does not, because the training stream has
// no such space.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

namespace kvsim {

class Tokenizer {
 public:
  /// Loads a tokenizer.bin; `vocab_size` is the model's vocabulary size (the file holds that many
  /// pieces). Throws kvsim::Error naming the file on a short or malformed file.
  Tokenizer(const std::string& path, int vocab_size);
  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  /// Encode text into token ids. O(L log L) in the text length L (priority-queue BPE, same merges
  /// as llama2.c's quadratic loop).
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const;
  /// Decode one token given the previous one (strips the leading space after BOS, maps <0xXX>).
  std::string decode(int prev, int token) const;
  /// Encode a whole document as the model's training stream saw it. Sentencepiece vocabularies:
  /// encode(text, bos = true) (one BOS at the start). Byte-level vocabularies: the text split at every
  /// "\n\n"; each non-empty paragraph becomes BOS, its bytes and "\n\n" (the byte-mode training
  /// stream of shakespeare-q80, MikeBertin/prometheus src/train.py `load_bytes`).
  std::vector<int> encode_document(const std::string& text) const;
  /// True for a byte-level vocabulary (see above).
  bool byte_level() const { return byte_level_; }
  const std::string& piece(int id) const { return pieces_.at(id); }
  static constexpr int kBos = 1;
  static constexpr int kEos = 2;

 private:
  /// Sentencepiece encoding of `text` appended to `toks` (which holds BOS or nothing), merged.
  void encode_pieces(const std::string& text, std::vector<int>& toks) const;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
  bool byte_level_ = false;
};

}  // namespace kvsim
