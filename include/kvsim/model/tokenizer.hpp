// kvsim: tokenizers of the checkpoints `kvsim record` reads.
//
// 1. llama2.c tokenizer.bin (sentencepiece BPE exported by llama2.c).
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
//
// 2. A GGUF file's own tokenizer (metadata `tokenizer.ggml.*`, llama.cpp's llama-vocab.cpp):
//  - model "llama": SentencePiece pieces with scores, as above ("▁" stands for a space in the file;
//    byte fallback to the "<0xHH>" pieces; a dummy-prefix space when `add_space_prefix`, default true).
//  - model "gpt2": byte-level BPE (GPT-2, Radford et al. 2019 §2.2): the text is split by the
//    pre-tokenizer the file names in `tokenizer.ggml.pre` (regular expressions run by PCRE2 with
//    Unicode properties, each splitting the pieces of the one before, unmatched runs kept as pieces:
//    llama.cpp's `unicode_regex_split`), each piece's bytes are mapped to GPT-2's printable
//    characters, then the adjacent pair with the lowest merge rank (`tokenizer.ggml.merges`, leftmost
//    on ties) is merged until none applies. Pre-tokenizers: "gpt2" (GPT-2's expression), "smollm"
//    (also starcoder, refact, command-r, codeshell: every digit alone, then GPT-2's), "llama-bpe"
//    (Llama 3's). Others are refused by name. Special (control) tokens are not parsed out of text.
//  BOS/EOS ids come from `tokenizer.ggml.bos_token_id` / `eos_token_id`; a document starts with BOS
//  only when `tokenizer.ggml.add_bos_token` says so (SmolLM2: false; "llama" files default to true).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvsim {

namespace gguf {
class File;
}

class Tokenizer {
 public:
  /// Loads a tokenizer.bin; `vocab_size` is the model's vocabulary size (the file holds that many
  /// pieces). Throws kvsim::Error naming the file on a short or malformed file.
  Tokenizer(const std::string& path, int vocab_size);
  /// The tokenizer a GGUF file carries. Throws kvsim::Error naming the file and key for a missing or
  /// malformed `tokenizer.ggml.*` entry, another tokenizer model, or an unsupported pre-tokenizer.
  explicit Tokenizer(const gguf::File& file);
  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  /// Encode text into token ids. O(L log L) in the text length L (priority-queue BPE, same merges
  /// as llama2.c's quadratic loop).
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const;
  /// Decode one token given the previous one (strips the leading space after BOS, maps <0xXX>;
  /// byte-level BPE pieces back to their bytes, control tokens to nothing).
  std::string decode(int prev, int token) const;
  /// Encode a whole document as the model's training stream saw it. Sentencepiece vocabularies:
  /// encode(text, bos = add_bos()) (one BOS at the start). Byte-level BPE: the same. llama2.c
  /// byte-level vocabularies: the text split at every
  /// "\n\n"; each non-empty paragraph becomes BOS, its bytes and "\n\n" (the byte-mode training
  /// stream of shakespeare-q80, MikeBertin/prometheus src/train.py `load_bytes`).
  std::vector<int> encode_document(const std::string& text) const;
  /// True for a byte-level vocabulary (see above).
  bool byte_level() const { return byte_level_; }
  const std::string& piece(int id) const { return pieces_.at(id); }
  /// The id of the control token spelled `piece` (a GGUF `tokenizer.ggml.token_type` of 3, e.g.
  /// SmolLM2's "<|im_start|>"), or −1 when the vocabulary has no such control token.
  int control_id(const std::string& piece) const;
  int bos_id() const { return bos_; }
  int eos_id() const { return eos_; }
  /// Whether a document starts with BOS (llama2.c: always).
  bool add_bos() const { return add_bos_; }
  /// Whether the model expects BOS at the start of every sequence it is fed: a GGUF tokenizer whose
  /// `tokenizer.ggml.add_bos_token` is true (Gemma 3, Llama; not SmolLM2). Then a window cut from a
  /// text stream is recorded as BOS + its text tokens, as inference would feed it. llama2.c models were
  /// trained on random chunks of the token stream (BOS only where a story starts), so their windows
  /// stay plain cuts of the stream (false).
  bool bos_opens_sequence() const { return bos_opens_sequence_; }
  /// "sentencepiece", "llama2.c bytes" or "byte-level BPE (pre-tokenizer smollm)".
  std::string kind_name() const;
  /// llama2.c's ids, the defaults of its tokenizer.bin.
  static constexpr int kBos = 1;
  static constexpr int kEos = 2;

 private:
  /// Sentencepiece encoding of `text` appended to `toks` (which holds BOS or nothing), merged.
  void encode_pieces(const std::string& text, std::vector<int>& toks) const;
  /// Byte-level BPE encoding of `text` appended to `toks`.
  void encode_bpe(const std::string& text, std::vector<int>& toks) const;
  void bpe_word(const std::string& mapped, std::vector<int>& toks) const;
  std::string decode_bpe(const std::string& piece) const;
  void init_spm(const gguf::File& f, const std::function<int(const char*, int64_t)>& id_key);
  void init_bpe(const gguf::File& f, const std::function<int(const char*, int64_t)>& id_key);
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
  bool byte_level_ = false;
  bool bpe_ = false;
  bool add_bos_ = true;
  bool bos_opens_sequence_ = false;
  bool space_prefix_ = true;
  int bos_ = kBos, eos_ = kEos, unk_ = 0;
  std::vector<int> byte_ids_;  ///< sentencepiece byte fallback: id of "<0xHH>" (or 3 + byte)
  std::vector<bool> control_;  ///< decode() prints nothing for these
  std::string pre_;            ///< BPE pre-tokenizer name
  std::unordered_map<std::string, int> merge_rank_;  ///< "left right" → rank
  struct Regexes;
  std::shared_ptr<const Regexes> re_;  ///< shared: Regexes is complete only in tokenizer_gguf.cpp
  mutable std::unordered_map<std::string, std::vector<int>> cache_;  ///< BPE: piece → ids
};

/// The tokenizer of a checkpoint: a GGUF checkpoint's own (metadata), else the llama2.c
/// tokenizer.bin at `tokenizer_path`. Throws kvsim::Error when a GGUF is given a tokenizer.bin (it
/// carries its own) or a llama2.c checkpoint none.
Tokenizer load_tokenizer(const std::string& checkpoint, const std::string& tokenizer_path, int vocab_size);

}  // namespace kvsim
