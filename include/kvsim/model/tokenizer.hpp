// kvsim: the llama2.c tokenizer.bin format (sentencepiece BPE exported by llama2.c).
// File: int32 max_token_length, then per token: float32 score, int32 length, `length` bytes.
// Encoding (as llama2.c's `encode`): optional BOS (id 1), a dummy-prefix " " piece when the text is
// non-empty, one piece per UTF-8 code point (byte fallback to ids 3 + byte when a code point has no
// piece), then repeatedly merge the adjacent pair whose concatenation has the highest score
// (leftmost on ties) until no pair merges.
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
  const std::string& piece(int id) const { return pieces_.at(id); }
  static constexpr int kBos = 1;
  static constexpr int kEos = 2;

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
};

}  // namespace kvsim
