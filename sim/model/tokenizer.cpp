#include "kvsim/model/tokenizer.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>

#include "kvsim/core/error.hpp"

namespace kvsim {

std::string Tokenizer::kind_name() const {
  if (bpe_) return "byte-level BPE (pre-tokenizer " + pre_ + ")";
  if (byte_level_) return "llama2.c bytes";
  return "sentencepiece";
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

int Tokenizer::control_id(const std::string& piece) const {
  const auto it = lookup_.find(piece);
  if (it == lookup_.end() || control_.empty() || !control_[size_t(it->second)]) return -1;
  return it->second;
}

std::string Tokenizer::decode(int prev, int token) const {
  std::string p = pieces_.at(token);
  if (byte_level_) return token >= 3 ? std::string(1, static_cast<char>(token - 3)) : std::string();
  if (!control_.empty() && control_[size_t(token)]) return {};
  if (bpe_) return decode_bpe(p);
  if (prev == bos_ && !p.empty() && p[0] == ' ') p.erase(0, 1);
  unsigned byte = 0;
  if (p.size() == 6 && std::sscanf(p.c_str(), "<0x%02X>", &byte) == 1) return std::string(1, static_cast<char>(byte));
  return p;
}

}  // namespace kvsim
