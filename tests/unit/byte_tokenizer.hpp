// A byte-level llama2.c vocabulary written for a test (token = byte + 3; <unk>, <s>, </s> first): a
// tokenizer whose encoding is known exactly, for the task generators' tests.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "kvsim/model/tokenizer.hpp"

namespace kvsim::test {

/// A byte-level tokenizer.bin in `dir` (259 pieces: <unk>, <s>, </s>, then "<0xHH>" for every byte).
inline Tokenizer byte_tokenizer(const TempDir& dir) {
  const std::string path = dir.file("bytes.bin");
  std::ofstream f(path, std::ios::binary);
  const int32_t max_len = 6;
  f.write(reinterpret_cast<const char*>(&max_len), 4);
  auto piece = [&](const std::string& s) {
    const float score = 0;
    const int32_t n = int32_t(s.size());
    f.write(reinterpret_cast<const char*>(&score), 4);
    f.write(reinterpret_cast<const char*>(&n), 4);
    f.write(s.data(), n);
  };
  piece("<unk>"), piece("<s>"), piece("</s>");
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    piece(hex);
  }
  f.close();
  return Tokenizer(path, 259);
}

/// The text of tokens [from, to) of `ids`.
inline std::string text_of(const Tokenizer& tok, const std::vector<int>& ids, int from, int to) {
  std::string s;
  for (int i = from; i < to; ++i) s += tok.decode(-1, ids[size_t(i)]);
  return s;
}

}  // namespace kvsim::test
