#include "kvsim/model/tokenizer.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "kvsim/core/error.hpp"
#include "kvsim/model/gguf.hpp"

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
  /// Splits [s, s+n) by expression k: matches and the unmatched runs between them, in order.
  void split(size_t k, const std::string& s, std::vector<std::string>& out) const {
    size_t at = 0, gap = 0;
    while (at < s.size()) {
      const int rc = pcre2_match(codes[k], reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
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

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

std::string Tokenizer::kind_name() const {
  if (bpe_) return "byte-level BPE (pre-tokenizer " + pre_ + ")";
  if (byte_level_) return "llama2.c bytes";
  return "sentencepiece";
}

Tokenizer::Tokenizer(const gguf::File& f) {
  const std::string& path = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model");
  pieces_ = f.get_strings("tokenizer.ggml.tokens");
  const int64_t V = int64_t(pieces_.size());
  if (V < 1 || V > (int64_t(1) << 24))
    throw Error(path + ": metadata key 'tokenizer.ggml.tokens' holds " + std::to_string(V) + " tokens (expected 1 to 2^24)");
  auto id_key = [&](const char* key, int64_t def) {
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
    bos_ = id_key("tokenizer.ggml.bos_token_id", 1);
    eos_ = id_key("tokenizer.ggml.eos_token_id", 2);
    unk_ = id_key("tokenizer.ggml.unknown_token_id", 0);
    add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", true);
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
  } else if (model == "gpt2") {
    bpe_ = true;
    bos_ = id_key("tokenizer.ggml.bos_token_id", -1);
    eos_ = id_key("tokenizer.ggml.eos_token_id", -1);
    add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", false);
    if (add_bos_ && bos_ < 0) throw Error(path + ": metadata says add_bos_token but has no tokenizer.ggml.bos_token_id");
    pre_ = f.get_string("tokenizer.ggml.pre", "gpt2");
    if (pre_ == "default") pre_ = "gpt2";
    const auto exprs = pre_expressions(pre_);
    if (exprs.empty())
      throw Error(path + ": metadata key 'tokenizer.ggml.pre' = '" + pre_ +
                  "' names a pre-tokenizer kvsim does not implement (gpt2, smollm, starcoder, refact, command-r, "
                  "codeshell, llama-bpe)");
    re_ = std::make_unique<Regexes>();
    for (const auto& e : exprs) {
      int err = 0;
      PCRE2_SIZE off = 0;
      pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(e.c_str()), PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
      if (!c) throw Error("tokenizer: cannot compile the pre-tokenizer expression (PCRE2 error " + std::to_string(err) + ")");
      pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
      re_->codes.push_back(c);
    }
    re_->md = pcre2_match_data_create(4, nullptr);
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
  } else {
    throw Error(path + ": metadata key 'tokenizer.ggml.model' = '" + model +
                "' is a tokenizer kvsim does not implement (llama, gpt2)");
  }
}

Tokenizer::Tokenizer(const std::string& path, int vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open tokenizer file");
  int32_t max_len = 0;
  if (!in.read(reinterpret_cast<char*>(&max_len), 4) || max_len <= 0 || max_len > 4096)
    throw Error(path + ": not a llama2.c tokenizer.bin (bad max_token_length header)");
  pieces_.resize(vocab_size);
  scores_.resize(vocab_size);
  for (int i = 0; i < vocab_size; ++i) {
    int32_t len = 0;
    if (!in.read(reinterpret_cast<char*>(&scores_[i]), 4) || !in.read(reinterpret_cast<char*>(&len), 4))
      throw Error(path + ": truncated at token " + std::to_string(i) + " of " + std::to_string(vocab_size) +
                  " (does this tokenizer belong to the model?)");
    if (len < 0 || len > max_len) throw Error(path + ": token " + std::to_string(i) + " has a bad length " + std::to_string(len));
    pieces_[i].resize(len);
    if (len && !in.read(pieces_[i].data(), len)) throw Error(path + ": truncated in token " + std::to_string(i));
  }
  char extra;
  if (in.read(&extra, 1))
    throw Error(path + ": has more than " + std::to_string(vocab_size) +
                " tokens — this tokenizer does not match the model's vocab_size");
  for (int i = 0; i < vocab_size; ++i) lookup_.emplace(pieces_[i], i);  // first occurrence wins
  byte_ids_.resize(256);
  for (int b = 0; b < 256; ++b) byte_ids_[size_t(b)] = b + 3 < vocab_size ? b + 3 : 0;
  byte_level_ = vocab_size == 259;
  for (int b = 0; b < 256 && byte_level_; ++b) {
    const std::string& p = pieces_[size_t(b) + 3];
    unsigned hex = 0;
    byte_level_ = (p.size() == 1 && static_cast<unsigned char>(p[0]) == b) ||
                  (p.size() == 6 && std::sscanf(p.c_str(), "<0x%02X>", &hex) == 1 && hex == unsigned(b));
  }
}

std::vector<int> Tokenizer::encode_document(const std::string& text) const {
  if (!byte_level_) return encode(text, add_bos_, false);
  std::vector<int> out;
  out.reserve(text.size() + text.size() / 64 + 1);
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    if (end > at) {
      out.push_back(kBos);
      for (size_t i = at; i < end; ++i) out.push_back(static_cast<unsigned char>(text[i]) + 3);
      out.push_back('\n' + 3);
      out.push_back('\n' + 3);
    }
    at = end + 2;
  }
  return out;
}

std::vector<int> Tokenizer::encode(const std::string& text, bool bos, bool eos) const {
  std::vector<int> toks;
  if (bos && bos_ >= 0) toks.push_back(bos_);
  if (byte_level_) {
    for (unsigned char b : text) toks.push_back(int(b) + 3);
  } else if (bpe_) {
    encode_bpe(text, toks);
  } else {
    encode_pieces(text, toks);
  }
  if (eos && eos_ >= 0) toks.push_back(eos_);
  return toks;
}

void Tokenizer::encode_pieces(const std::string& text, std::vector<int>& toks) const {
  const bool bos = !toks.empty();
  if (!text.empty() && space_prefix_) {
    auto it = lookup_.find(" ");
    if (it != lookup_.end()) toks.push_back(it->second);
  }
  // Per UTF-8 code point.
  size_t i = 0;
  while (i < text.size()) {
    size_t len = 1;
    unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) {
      while (i + len < text.size() && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80 && len < 4) ++len;
    }
    std::string cp = text.substr(i, len);
    auto it = lookup_.find(cp);
    if (it != lookup_.end()) {
      toks.push_back(it->second);
    } else {
      for (unsigned char b : cp) toks.push_back(byte_ids_[b]);
    }
    i += len;
  }
  // BPE merges over a doubly linked list; the heap orders candidate pairs by (score desc, left
  // position asc), which is exactly the pair llama2.c's linear scan picks (strict '>' on scores).
  const size_t start = bos ? 1 : 0;
  const size_t m = toks.size();
  std::vector<long> prev(m), next(m);
  std::vector<int> id(toks.begin(), toks.end());
  std::vector<bool> alive(m, true);
  std::vector<unsigned> version(m, 0);
  for (size_t k = 0; k < m; ++k) {
    prev[k] = long(k) - 1;
    next[k] = (k + 1 < m) ? long(k + 1) : -1;
  }
  struct Cand {
    float score;
    long left;
    unsigned vl, vr;
    long right;
    int merged;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto push_pair = [&](long l) {
    if (l < long(start) || l < 0) return;
    long r = next[l];
    if (r < 0) return;
    auto it = lookup_.find(pieces_[id[l]] + pieces_[id[r]]);
    if (it == lookup_.end()) return;
    heap.push(Cand{scores_[it->second], l, version[l], version[r], r, it->second});
  };
  for (size_t k = start; k < m; ++k) push_pair(long(k));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || version[c.left] != c.vl || version[c.right] != c.vr || next[c.left] != c.right)
      continue;
    id[c.left] = c.merged;
    ++version[c.left];
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    if (prev[c.left] >= long(start)) push_pair(prev[c.left]);
    push_pair(c.left);
  }
  toks.clear();
  for (size_t k = 0; k < m; ++k)
    if (alive[k]) toks.push_back(id[k]);
}

std::string Tokenizer::decode(int prev, int token) const {
  std::string p = pieces_.at(token);
  if (byte_level_) return token >= 3 ? std::string(1, static_cast<char>(token - 3)) : std::string();
  if (!control_.empty() && control_[size_t(token)]) return {};
  if (bpe_) {  // GPT-2 characters back to bytes
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
  if (prev == bos_ && !p.empty() && p[0] == ' ') p.erase(0, 1);
  unsigned byte = 0;
  if (p.size() == 6 && std::sscanf(p.c_str(), "<0x%02X>", &byte) == 1) return std::string(1, static_cast<char>(byte));
  return p;
}

void Tokenizer::encode_bpe(const std::string& text, std::vector<int>& toks) const {
  {  // PCRE2 in UTF mode needs valid UTF-8; say where it is not.
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* probe = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("x"), 1, PCRE2_UTF, &err, &off, nullptr);
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    const int rc = pcre2_match(probe, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
    const PCRE2_SIZE bad = rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21 ? pcre2_get_startchar(md) : 0;
    pcre2_match_data_free(md);
    pcre2_code_free(probe);
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
      throw Error("tokenizer: the text is not valid UTF-8 (at byte " + std::to_string(bad) + ")");
  }
  std::vector<std::string> parts{text}, next;
  for (size_t k = 0; k < re_->codes.size(); ++k) {
    next.clear();
    for (const auto& p : parts) re_->split(k, p, next);
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
