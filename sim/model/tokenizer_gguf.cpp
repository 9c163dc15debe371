// kvsim: the tokenizer a GGUF file carries (include/kvsim/model/tokenizer.hpp, part 2): SentencePiece
// "llama" and byte-level BPE "gpt2" vocabularies from `tokenizer.ggml.*` metadata, the PCRE2
// pre-tokenizers, and load_tokenizer.
#include <cstdio>
#include <cstring>
#include <functional>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "kvsim/core/error.hpp"
#include "kvsim/model/gguf.hpp"
#include "kvsim/model/tokenizer.hpp"

namespace kvsim {

namespace {

/// GPT-2's reversible map from bytes to printable Unicode characters (openai/gpt-2 encoder.py
/// `bytes_to_unicode`): printable Latin-1 bytes stand for themselves, the other 68 bytes for
/// U+0100 onwards. Returned as UTF-8 strings, one per byte.
std::vector<std::string> byte_to_unicode() {
  std::vector<int> cps(256, -1);
  for (int b = '!'; b <= '~'; ++b) cps[b] = b;
  for (int b = 0xA1; b <= 0xAC; ++b) cps[b] = b;
  for (int b = 0xAE; b <= 0xFF; ++b) cps[b] = b;
  int next = 256;
  for (int b = 0; b < 256; ++b)
    if (cps[b] < 0) cps[b] = next++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int c = cps[b];
    if (c < 0x80) out[b] = std::string(1, char(c));
    else out[b] = std::string{char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
  }
  return out;
}

const std::vector<std::string>& byte_map() {
  static const std::vector<std::string> m = byte_to_unicode();
  return m;
}

/// Length of the UTF-8 sequence starting with byte c (1 for a stray continuation byte).
inline size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

// llama.cpp llama-vocab.cpp: the pre-tokenizer expressions per `tokenizer.ggml.pre`.
const char* kGpt2Re = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const char* kLlama3Re =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::vector<std::string> pre_expressions(const std::string& pre) {
  if (pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo") return {kGpt2Re};
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell")
    return {"\\p{N}", kGpt2Re};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return {kLlama3Re};
  return {};
}

}  // namespace

/// Compiled pre-tokenizer expressions (PCRE2, UTF + Unicode properties, JIT when available).
struct Tokenizer::Regexes {
  std::vector<pcre2_code*> codes;
  pcre2_match_data* md = nullptr;
  ~Regexes() {
    for (auto* c : codes) pcre2_code_free(c);
    if (md) pcre2_match_data_free(md);
  }
  /// Splits s by expression k: matches and the unmatched runs between them, in order. With
  /// `validate`, the first match checks that all of s is valid UTF-8 (PCRE2 checks the whole subject
  /// on a call without PCRE2_NO_UTF_CHECK); later calls skip the check.
  void split(size_t k, const std::string& s, std::vector<std::string>& out, bool validate = false) const {
    size_t at = 0, gap = 0;
    while (at < s.size()) {
      const int rc = pcre2_match(codes[k], reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 validate ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
      validate = false;
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
        throw Error("tokenizer: the text is not valid UTF-8 (at byte " + std::to_string(pcre2_get_startchar(md)) + ")");
      if (rc < 0) throw Error("tokenizer: PCRE2 match error " + std::to_string(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // an empty match: step one character
        at = ov[0] + utf8_len(static_cast<unsigned char>(s[ov[0]]));
        continue;
      }
      if (ov[0] > gap) out.push_back(s.substr(gap, ov[0] - gap));
      out.push_back(s.substr(ov[0], ov[1] - ov[0]));
      at = gap = ov[1];
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
  }
};

Tokenizer::Tokenizer(const gguf::File& f) {
  const std::string& path = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model");
  pieces_ = f.get_strings("tokenizer.ggml.tokens");
  const int64_t V = int64_t(pieces_.size());
  if (V < 1 || V > (int64_t(1) << 24))
    throw Error(path + ": metadata key 'tokenizer.ggml.tokens' holds " + std::to_string(V) + " tokens (expected 1 to 2^24)");
  auto id_key = [&](const char* key, int64_t def) -> int {
    const int64_t id = f.get_int(key, def);
    if (id < -1 || id >= V)
      throw Error(path + ": metadata key '" + key + "' = " + std::to_string(id) + " is not a token id (vocabulary of " +
                  std::to_string(V) + ")");
    return int(id);
  };
  if (f.has("tokenizer.ggml.token_type")) {
    const auto& types = f.get_nums("tokenizer.ggml.token_type");
    if (int64_t(types.size()) != V)
      throw Error(path + ": metadata key 'tokenizer.ggml.token_type' has " + std::to_string(types.size()) +
                  " entries for " + std::to_string(V) + " tokens");
    control_.resize(size_t(V));
    for (int64_t i = 0; i < V; ++i) control_[size_t(i)] = types[size_t(i)] == 3;  // LLAMA_TOKEN_TYPE_CONTROL
  }
  if (model == "llama") {
    init_spm(f, id_key);
  } else if (model == "gpt2") {
    init_bpe(f, id_key);
  } else {
    throw Error(path + ": metadata key 'tokenizer.ggml.model' = '" + model +
                "' is a tokenizer kvsim does not implement (llama, gpt2)");
  }
}

void Tokenizer::init_spm(const gguf::File& f, const std::function<int(const char*, int64_t)>& id_key) {
  const std::string& path = f.path();
  const int64_t V = int64_t(pieces_.size());
  bos_ = id_key("tokenizer.ggml.bos_token_id", 1);
  eos_ = id_key("tokenizer.ggml.eos_token_id", 2);
  unk_ = id_key("tokenizer.ggml.unknown_token_id", 0);
  add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", true);
  bos_opens_sequence_ = add_bos_ && bos_ >= 0;
  space_prefix_ = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  const auto& scores = f.get_nums("tokenizer.ggml.scores");
  if (int64_t(scores.size()) != V)
    throw Error(path + ": metadata key 'tokenizer.ggml.scores' has " + std::to_string(scores.size()) + " entries for " +
                std::to_string(V) + " tokens");
  scores_.assign(scores.begin(), scores.end());
  // "▁" (U+2581) is SentencePiece's space; kvsim's merge loop works on real spaces.
  const std::string sp = "\xe2\x96\x81";
  for (auto& p : pieces_)
    for (size_t at = p.find(sp); at != std::string::npos; at = p.find(sp, at)) p.replace(at, sp.size(), " ");
  for (int64_t i = 0; i < V; ++i) lookup_.emplace(pieces_[size_t(i)], int(i));
  byte_ids_.assign(256, unk_);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    auto it = lookup_.find(hex);
    if (it != lookup_.end()) byte_ids_[size_t(b)] = it->second;
  }
}

void Tokenizer::init_bpe(const gguf::File& f, const std::function<int(const char*, int64_t)>& id_key) {
  const std::string& path = f.path();
  const int64_t V = int64_t(pieces_.size());
  bpe_ = true;
  bos_ = id_key("tokenizer.ggml.bos_token_id", -1);
  eos_ = id_key("tokenizer.ggml.eos_token_id", -1);
  add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", false);
  if (add_bos_ && bos_ < 0) throw Error(path + ": metadata says add_bos_token but has no tokenizer.ggml.bos_token_id");
  bos_opens_sequence_ = add_bos_;
  pre_ = f.get_string("tokenizer.ggml.pre", "gpt2");
  if (pre_ == "default") pre_ = "gpt2";
  const auto exprs = pre_expressions(pre_);
  if (exprs.empty())
    throw Error(path + ": metadata key 'tokenizer.ggml.pre' = '" + pre_ +
                "' names a pre-tokenizer kvsim does not implement (gpt2, smollm, starcoder, refact, command-r, "
                "codeshell, llama-bpe)");
  auto re = std::make_shared<Regexes>();
  for (const auto& e : exprs) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(e.c_str()), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!c) throw Error("tokenizer: cannot compile the pre-tokenizer expression (PCRE2 error " + std::to_string(err) + ")");
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
    re->codes.push_back(c);
  }
  re->md = pcre2_match_data_create(4, nullptr);
  re_ = re;
  const auto& merges = f.get_strings("tokenizer.ggml.merges");
  merge_rank_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    if (merges[r].find(' ') == std::string::npos || merges[r].find(' ') == 0)
      throw Error(path + ": metadata key 'tokenizer.ggml.merges' entry " + std::to_string(r) + " ('" + merges[r] +
                  "') is not 'left right'");
    merge_rank_.emplace(merges[r], int(r));  // first occurrence wins
  }
  for (int64_t i = 0; i < V; ++i) lookup_.emplace(pieces_[size_t(i)], int(i));
  int bytes = 0;
  for (int b = 0; b < 256; ++b) bytes += lookup_.count(byte_map()[size_t(b)]) ? 1 : 0;
  if (bytes < 128)
    throw Error(path + ": byte-level vocabulary holds pieces for only " + std::to_string(bytes) +
                " of the 256 bytes (not a GPT-2 style byte-level BPE)");
}

std::string Tokenizer::decode_bpe(const std::string& p) const {  // GPT-2 characters back to bytes
  static const auto inverse = [] {
    std::unordered_map<std::string, char> m;
    for (int b = 0; b < 256; ++b) m.emplace(byte_map()[size_t(b)], char(b));
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < p.size();) {
    const size_t n = utf8_len(static_cast<unsigned char>(p[i]));
    auto it = inverse.find(p.substr(i, n));
    if (it != inverse.end()) out += it->second;
    else out += p.substr(i, n);
    i += n;
  }
  return out;
}

void Tokenizer::encode_bpe(const std::string& text, std::vector<int>& toks) const {
  std::vector<std::string> parts{text}, next;
  for (size_t k = 0; k < re_->codes.size(); ++k) {
    next.clear();
    for (const auto& p : parts) re_->split(k, p, next, k == 0);  // the first pass validates the UTF-8
    parts.swap(next);
  }
  const auto& bm = byte_map();
  std::string mapped;
  for (const auto& p : parts) {
    auto hit = cache_.find(p);
    if (hit != cache_.end()) {
      toks.insert(toks.end(), hit->second.begin(), hit->second.end());
      continue;
    }
    mapped.clear();
    for (unsigned char b : p) mapped += bm[b];
    std::vector<int> ids;
    bpe_word(mapped, ids);
    toks.insert(toks.end(), ids.begin(), ids.end());
    if (cache_.size() < 200000) cache_.emplace(p, std::move(ids));
  }
}

void Tokenizer::bpe_word(const std::string& mapped, std::vector<int>& toks) const {
  // Symbols start as single (mapped) characters; merge the lowest-ranked adjacent pair, leftmost
  // first, until no pair has a rank (the merge loop of GPT-2's encoder.py `bpe`).
  std::vector<std::string> sym;
  for (size_t i = 0; i < mapped.size();) {
    const size_t n = utf8_len(static_cast<unsigned char>(mapped[i]));
    sym.push_back(mapped.substr(i, n));
    i += n;
  }
  while (sym.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
      if (it != merge_rank_.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    // Merge every occurrence of that pair, left to right (encoder.py merges all in one pass).
    const std::string a = sym[at], b = sym[at + 1];
    std::vector<std::string> out;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
        out.push_back(a + b);
        i += 2;
      } else {
        out.push_back(sym[i]);
        ++i;
      }
    }
    sym.swap(out);
  }
  for (const auto& s : sym) {
    auto it = lookup_.find(s);
    if (it != lookup_.end()) {
      toks.push_back(it->second);
    } else {  // a merged symbol absent from the vocabulary: fall back to its characters' pieces; a
              // byte with no piece at all (SmolLM2 has none for some control bytes) is dropped, as
              // Hugging Face's BPE without an unknown token does
      for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_len(static_cast<unsigned char>(s[i]));
        auto c = lookup_.find(s.substr(i, n));
        if (c != lookup_.end()) toks.push_back(c->second);
        i += n;
      }
    }
  }
}

Tokenizer load_tokenizer(const std::string& checkpoint, const std::string& tokenizer_path, int vocab_size) {
  if (gguf::is_gguf(checkpoint)) {
    if (!tokenizer_path.empty())
      throw Error(checkpoint + ": a GGUF file carries its own tokenizer; drop the tokenizer.bin (" + tokenizer_path + ")");
    Tokenizer t{gguf::File(checkpoint)};
    if (t.vocab_size() != vocab_size)
      throw Error(checkpoint + ": the tokenizer has " + std::to_string(t.vocab_size()) + " tokens but the model " +
                  std::to_string(vocab_size));
    return t;
  }
  if (tokenizer_path.empty())
    throw Error(checkpoint + ": a llama2.c checkpoint needs its tokenizer.bin (--tokenizer, or [model] tokenizer)");
  return Tokenizer(tokenizer_path, vocab_size);
}

}  // namespace kvsim
