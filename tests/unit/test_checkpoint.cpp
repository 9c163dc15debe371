// llama2.c checkpoint formats (legacy, version 1, version 2 / Q8_0) and the byte-level tokenizer, on
// tiny models written here: the three formats of the same weights give the same model, the Q8_0
// layout is read where llama2.c's export writes it, and damaged headers are refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "helpers.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/model/checkpoint.hpp"
#include "kvsim/model/llama.hpp"
#include "kvsim/model/tokenizer.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;

namespace {

/// A tiny model: dim 16, hidden 24, 2 layers, 4 heads / 2 KV heads (head_dim 4), vocab 259, seq 32,
/// Q8_0 group size 8. Quantized tensors hold code × scale with power-of-two scales, so the float32
/// files of versions 0 and 1 carry exactly the weights version 2 dequantizes to.
struct Tiny {
  static constexpr int D = 16, Hd = 24, L = 2, H = 4, KVH = 2, V = 259, S = 32, GS = 8;
  bool shared = true;
  std::vector<float> rms_att, rms_ffn, rms_final;
  // Quantized tensors, one entry per exported tensor (per layer for wq..w3): codes and scales.
  struct Q {
    std::vector<int8_t> codes;
    std::vector<float> scales;
    std::vector<float> values() const {
      std::vector<float> v(codes.size());
      for (size_t i = 0; i < v.size(); ++i) v[i] = float(codes[i]) * scales[i / GS];
      return v;
    }
  };
  std::vector<Q> q;  // token_embedding, wq×L, wk×L, wv×L, wo×L, w1×L, w2×L, w3×L, [wcls]

  explicit Tiny(bool shared_classifier = true) : shared(shared_classifier) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    auto norm = [&](int n) { std::vector<float> v(n); for (auto& x : v) x = u(rng); return v; };
    rms_att = norm(L * D);
    rms_ffn = norm(L * D);
    rms_final = norm(D);
    const int kv = D / H * KVH;
    std::vector<int64_t> sizes{int64_t(V) * D};
    for (int64_t n : {D * D, kv * D, kv * D, D * D, Hd * D, D * Hd, Hd * D})
      for (int l = 0; l < L; ++l) sizes.push_back(n);
    if (!shared) sizes.push_back(int64_t(V) * D);
    std::uniform_int_distribution<int> code(-127, 127);
    for (int64_t n : sizes) {
      Q t;
      for (int64_t i = 0; i < n; ++i) t.codes.push_back(int8_t(code(rng)));
      for (int64_t g = 0; g < n / GS; ++g) t.scales.push_back(std::ldexp(1.0f, -7 - int(g % 3)));
      q.push_back(t);
    }
  }
  template <class T>
  static void put(std::string& b, const std::vector<T>& v) {
    b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  static void put_i32(std::string& b, int32_t x) { b.append(reinterpret_cast<const char*>(&x), 4); }
  std::string header_ints(bool legacy) const {
    std::string b;
    for (int32_t x : {D, Hd, L, H, KVH, (legacy && !shared) ? -V : V, S}) put_i32(b, x);
    return b;
  }
  std::string bytes(int version) const {
    std::string b;
    if (version == 0) {
      b = header_ints(true);
      put(b, q[0].values());
      put(b, rms_att);
      for (int t = 0; t < 4; ++t)
        for (int l = 0; l < L; ++l) put(b, q[1 + t * L + l].values());
      put(b, rms_ffn);
      for (int t = 4; t < 7; ++t)
        for (int l = 0; l < L; ++l) put(b, q[1 + t * L + l].values());
      put(b, rms_final);
      put(b, std::vector<float>(S * (D / H), 7.0f));  // freq_cis tables: skipped by the reader
      if (!shared) put(b, q.back().values());
      return b;
    }
    put_i32(b, int32_t(0x616B3432));
    put_i32(b, version);
    b += header_ints(false);
    b.push_back(char(shared ? 1 : 0));
    if (version == 2) put_i32(b, GS);
    b.resize(256, '\0');
    put(b, rms_att);
    put(b, rms_ffn);
    put(b, rms_final);
    for (const auto& t : q) {
      if (version == 1) {
        put(b, t.values());
      } else {
        put(b, t.codes);
        put(b, t.scales);
      }
    }
    return b;
  }
};

std::string write(const test::TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string p = dir.file(name);
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return p;
}

std::vector<float> logits_after(const std::string& path, const std::vector<int>& tokens) {
  LlamaModel m(path);
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); ++i) out = m.forward(tokens[i], int(i));
  return out;
}

/// A byte-level tokenizer.bin as MikeBertin/prometheus tokenizer_export.py writes it; `extra` adds a
/// merge piece (then it is no longer byte-level: the negative control).
std::string byte_tokenizer(const test::TempDir& dir, bool extra = false) {
  std::vector<std::string> pieces{"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    pieces.push_back((b >= 32 && b <= 126) || b == 9 || b == 10 || b == 13 ? std::string(1, char(b)) : hex);
  }
  if (extra) pieces.push_back("ab");
  std::string b;
  Tiny::put_i32(b, 6);
  for (const auto& p : pieces) {
    float score = 0;
    b.append(reinterpret_cast<const char*>(&score), 4);
    Tiny::put_i32(b, int32_t(p.size()));
    b += p;
  }
  return write(dir, extra ? "tok260.bin" : "byte_tok.bin", b);
}

}  // namespace

TEST_CASE("checkpoint: legacy, version 1 and version 2 files of the same weights are the same model", "[checkpoint]") {
  test::TempDir dir;
  for (bool shared : {true, false}) {
    Tiny t(shared);
    const std::string p0 = write(dir, "v0.bin", t.bytes(0)), p1 = write(dir, "v1.bin", t.bytes(1)),
                      p2 = write(dir, "v2.bin", t.bytes(2));
    Checkpoint c0 = load_checkpoint(p0), c1 = load_checkpoint(p1), c2 = load_checkpoint(p2);
    CHECK(c0.cfg.format_version == 0);
    CHECK(c1.cfg.format_version == 1);
    CHECK(c2.cfg.format_version == 2);
    CHECK(c2.cfg.group_size == Tiny::GS);
    CHECK(c2.cfg.format_name() == "llama2.c version 2 (Q8_0, group 8)");
    for (const auto* c : {&c0, &c1, &c2}) {
      CHECK(c->cfg.shared_classifier == shared);
      CHECK(c->cfg.vocab_size == Tiny::V);
      CHECK(c->cfg.head_dim() == 4);
    }
    CHECK(c0.weights == c1.weights);
    CHECK(c1.weights == c2.weights);
    const std::vector<int> toks{1, 40, 75, 13, 200, 3};
    const auto l0 = logits_after(p0, toks);
    CHECK(l0 == logits_after(p1, toks));
    CHECK(l0 == logits_after(p2, toks));
    // Negative control: one changed code changes the model.
    Tiny u = t;
    u.q[1].codes[5] = int8_t(u.q[1].codes[5] == 100 ? 101 : 100);
    CHECK(logits_after(write(dir, "v2b.bin", u.bytes(2)), toks) != l0);
  }
}

TEST_CASE("checkpoint: a Q8_0 code lands at its tensor, layer and group in the canonical order", "[checkpoint]") {
  test::TempDir dir;
  Tiny t;
  const Checkpoint base = load_checkpoint(write(dir, "a.bin", t.bytes(2)));
  // wk of layer 1 is exported tensor 1 + 1·L + 1; its value 13 belongs to group 1 (scale 2^-8).
  const int kv = Tiny::D / Tiny::H * Tiny::KVH;
  Tiny u = t;
  u.q[1 + Tiny::L + 1].codes[13] = int8_t(t.q[1 + Tiny::L + 1].codes[13] + (t.q[1 + Tiny::L + 1].codes[13] > 0 ? -1 : 1));
  const Checkpoint changed = load_checkpoint(write(dir, "b.bin", u.bytes(2)));
  const int64_t D = Tiny::D, L = Tiny::L;
  const int64_t at = int64_t(Tiny::V) * D + L * D + L * D * D + 1 * kv * D + 13;  // emb, rms_att, wq, wk[layer 1]
  REQUIRE(changed.weights.size() == base.weights.size());
  for (size_t i = 0; i < base.weights.size(); ++i) {
    if (int64_t(i) == at) CHECK(std::abs(changed.weights[i] - base.weights[i]) == std::ldexp(1.0f, -8));
    else REQUIRE(changed.weights[i] == base.weights[i]);
  }
}

TEST_CASE("checkpoint: damaged or foreign files are refused with one line naming the file", "[checkpoint]") {
  test::TempDir dir;
  const std::string good = Tiny().bytes(2);
  auto refused = [&](std::string bytes, const std::string& needle) {
    const std::string p = write(dir, "bad.bin", bytes);
    INFO(needle);
    CHECK_THROWS_WITH(load_checkpoint(p), Contains(p) && Contains(needle));
  };
  REQUIRE_NOTHROW(load_checkpoint(write(dir, "good.bin", good)));
  std::string b = good;
  b[4] = 3;
  refused(b, "export version 3 is not supported");
  refused(good.substr(0, good.size() - 1), "but the llama2.c version 2 (Q8_0, group 8) header implies");
  refused(good + '\0', "bytes but the");
  refused(good.substr(0, 100), "too short for the 256-byte version 2 header");
  b = good;
  const int32_t five = 5;
  std::memcpy(&b[37], &five, 4);
  refused(b, "group_size 5 does not divide dim 16");
  b = good;
  b[36] = 2;
  refused(b, "shared_classifier flag is 2");
  b = good;
  b[200] = 1;
  refused(b, "header padding byte 200 is not zero");
  b = good;
  const float nan = NAN;
  const size_t scale_at = 256 + 4 * (2 * 2 * 16 + 16) + 259 * 16 + 4 * 3;  // the embedding's 4th scale
  std::memcpy(&b[scale_at], &nan, 4);
  refused(b, "token_embedding scales holds a non-finite value at index 3");
  refused("GGUF" + good.substr(4), "bad GGUF file: the header claims");  // read as GGUF: its counts are garbage
  refused("PK\x03\x04" + good.substr(4), "zip archive");
  std::string legacy = Tiny().bytes(0);
  std::memcpy(&legacy[64], &nan, 4);
  refused(legacy, "token_embedding holds a non-finite value at index 9");
}

TEST_CASE("tokenizer: a byte-level vocabulary encodes bytes as token byte + 3 with BOS per paragraph", "[tokenizer]") {
  test::TempDir dir;
  Tokenizer tok(byte_tokenizer(dir), 259);
  REQUIRE(tok.byte_level());
  // No dummy-prefix space (a sentencepiece vocabulary would insert " " after BOS).
  CHECK(tok.encode("a\n\nb", true, false) == std::vector<int>{1, 'a' + 3, 13, 13, 'b' + 3});
  // Training stream: BOS + paragraph + "\n\n" for every non-empty "\n\n"-separated paragraph.
  CHECK(tok.encode_document("a\n\nb\n\n\n\nc") ==
        std::vector<int>{1, 'a' + 3, 13, 13, 1, 'b' + 3, 13, 13, 1, 'c' + 3, 13, 13});
  CHECK(tok.encode_document("\n\nx\n\n\ny") == std::vector<int>{1, 'x' + 3, 13, 13, 1, '\n' + 3, 'y' + 3, 13, 13});
  // Every byte, printable or spelled <0xHH>, decodes back to itself, also after BOS.
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  const auto ids = tok.encode(all, false, false);
  REQUIRE(ids.size() == 256);
  std::string back;
  for (size_t i = 0; i < ids.size(); ++i) back += tok.decode(i ? ids[i - 1] : Tokenizer::kBos, ids[i]);
  CHECK(back == all);
  CHECK(tok.decode(0, Tokenizer::kBos).empty());
  // Negative control: a vocabulary with a merge piece is not byte-level, and gets sentencepiece's
  // dummy-prefix space.
  Tokenizer sp(byte_tokenizer(dir, true), 260);
  CHECK_FALSE(sp.byte_level());
  CHECK(sp.encode("a", true, false) == std::vector<int>{1, ' ' + 3, 'a' + 3});
}
