#include "kvsim/model/checkpoint.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "kvsim/core/error.hpp"

namespace kvsim {

std::string LlamaConfig::format_name() const {
  if (gguf_version > 0) return "GGUF v" + std::to_string(gguf_version) + " (" + architecture + "; " + tensor_types + ")";
  if (format_version == 2) return "llama2.c version 2 (Q8_0, group " + std::to_string(group_size) + ")";
  if (format_version == 1) return "llama2.c version 1 (float32)";
  return "llama2.c legacy (float32)";
}

namespace {

constexpr uint32_t kMagic = 0x616B3432;  // "ak42" little endian
constexpr int64_t kHeaderBytes = 256;    // versions 1 and 2

class Reader {
 public:
  Reader(std::ifstream& in, const std::string& path) : in_(in), path_(path) {}
  [[noreturn]] void bad(const std::string& why) const { throw Error(path_ + ": not a llama2.c checkpoint: " + why); }
  void floats(float* out, int64_t n, const char* what) {
    if (!in_.read(reinterpret_cast<char*>(out), n * 4)) bad(std::string("short read in ") + what);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(out[i])) bad(std::string(what) + " holds a non-finite value at index " + std::to_string(i));
  }
  /// One Q8_0 tensor of n values: int8 codes, then n / gs float32 scales; writes code × scale.
  void q80(float* out, int64_t n, int gs, const char* what) {
    codes_.resize(size_t(n));
    if (!in_.read(reinterpret_cast<char*>(codes_.data()), n)) bad(std::string("short read in ") + what + " codes");
    scales_.resize(size_t(n / gs));
    floats(scales_.data(), n / gs, (std::string(what) + " scales").c_str());
    for (int64_t i = 0; i < n; ++i) out[i] = float(codes_[size_t(i)]) * scales_[size_t(i / gs)];
  }

 private:
  std::ifstream& in_;
  const std::string& path_;
  std::vector<int8_t> codes_;
  std::vector<float> scales_;
};

/// Names files that are plainly something else, so the error says what was given.
std::string foreign_format(const unsigned char* b, int64_t size) {
  if (size >= 4 && std::memcmp(b, "PK\x03\x04", 4) == 0) return "a zip archive (a PyTorch .pt/.bin state dict?)";
  if (size >= 9 && b[8] == '{') {
    uint64_t len;
    std::memcpy(&len, b, 8);
    if (len > 1 && int64_t(len) < size) return "a safetensors file";
  }
  return "";
}

void check_header(const LlamaConfig& c, const Reader& r) {
  if (c.dim <= 0 || c.dim > 65536 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_layers > 1024 || c.n_heads <= 0 ||
      c.n_kv_heads <= 0 || c.vocab_size <= 0 || c.seq_len <= 0)
    r.bad("header values out of range");
  if (c.dim % c.n_heads) r.bad("dim is not a multiple of n_heads");
  if (c.n_heads % c.n_kv_heads) r.bad("n_heads is not a multiple of n_kv_heads");
  if (c.head_dim() % 2) r.bad("head_dim must be even for rotary embedding");
}


/// The header of any of the three formats (`head` holds the file's first min(size, 256) bytes).
LlamaConfig read_header(const unsigned char* head, int64_t size, const Reader& r) {
  LlamaConfig c;
  uint32_t magic;
  std::memcpy(&magic, head, 4);
  int32_t h[7];
  if (magic == kMagic) {
    int32_t version;
    std::memcpy(&version, head + 4, 4);
    if (version != 1 && version != 2)
      r.bad("llama2.c export version " + std::to_string(version) + " is not supported (kvsim reads legacy, 1 and 2)");
    if (size < kHeaderBytes) r.bad("too short for the 256-byte version " + std::to_string(version) + " header");
    c.format_version = version;
    std::memcpy(h, head + 8, sizeof h);
    if (head[36] > 1) r.bad("shared_classifier flag is " + std::to_string(head[36]) + ", not 0 or 1");
    c.shared_classifier = head[36] == 1;
    int pad_from = 37;
    if (version == 2) {
      std::memcpy(&c.group_size, head + 37, 4);
      pad_from = 41;
    }
    for (int i = pad_from; i < kHeaderBytes; ++i)
      if (head[i]) r.bad("header padding byte " + std::to_string(i) + " is not zero");
    if (h[5] <= 0) r.bad("header values out of range");
  } else {
    std::memcpy(h, head, sizeof h);
    if (h[5] == INT32_MIN) r.bad("vocab_size out of range");
    c.shared_classifier = h[5] > 0;
  }
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab_size = std::abs(h[5]);
  c.seq_len = h[6];
  check_header(c, r);
  if (c.format_version == 2 && (c.group_size <= 0 || c.dim % c.group_size))
    r.bad("Q8_0 group_size " + std::to_string(c.group_size) + " does not divide dim " + std::to_string(c.dim));
  return c;
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path + ": cannot open checkpoint");
  const int64_t size = in.tellg();
  in.seekg(0);
  Reader rd(in, path);
  unsigned char head[kHeaderBytes] = {};
  in.read(reinterpret_cast<char*>(head), std::min<int64_t>(size, kHeaderBytes));
  in.clear();
  if (size >= 4 && std::memcmp(head, "GGUF", 4) == 0) {
    in.close();
    return load_gguf_checkpoint(path);
  }
  if (size < 28) throw Error(path + ": too short for a llama2.c header");
  const std::string foreign = foreign_format(head, size);
  if (!foreign.empty()) throw Error(path + ": is " + foreign + ", not a llama2.c checkpoint (legacy, version 1 or 2)");
  Checkpoint ck;
  ck.cfg = read_header(head, size, rd);
  const LlamaConfig& c = ck.cfg;
  const int64_t D = c.dim, Hd = c.hidden_dim, L = c.n_layers, V = c.vocab_size, KV = c.kv_dim(), hs = c.head_dim();
  // Tensor sizes in the canonical order, and where the norms sit in it.
  const int64_t sizes[] = {V * D, L * D, L * D * D, L * KV * D, L * KV * D, L * D * D, L * D, L * Hd * D, L * D * Hd,
                           L * Hd * D, D, c.shared_classifier ? 0 : V * D};
  const char* names[] = {"token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "rms_final", "wcls"};
  int64_t floats = 0;
  for (int64_t s : sizes) floats += s;
  const int64_t norms = 2 * L * D + D;
  int64_t expect = 28 + 4 * (floats + int64_t(c.seq_len) * hs);  // legacy: + freq_cis tables
  if (c.format_version == 1) expect = kHeaderBytes + 4 * floats;
  if (c.format_version == 2) expect = kHeaderBytes + 4 * norms + (floats - norms) + 4 * ((floats - norms) / c.group_size);
  if (size != expect)
    rd.bad("file has " + std::to_string(size) + " bytes but the " + c.format_name() + " header implies " +
           std::to_string(expect));

  ck.weights.resize(size_t(floats));
  std::vector<float*> at(12);
  float* p = ck.weights.data();
  for (int t = 0; t < 12; ++t) {
    at[t] = p;
    p += sizes[t];
  }
  in.seekg(c.format_version == 0 ? 28 : kHeaderBytes);
  if (c.format_version == 0) {
    for (int t = 0; t < 11; ++t) rd.floats(at[t], sizes[t], names[t]);
    in.seekg(int64_t(c.seq_len) * hs * 4, std::ios::cur);  // freq_cis_real, freq_cis_imag
    rd.floats(at[11], sizes[11], names[11]);
    return ck;
  }
  for (int t : {1, 6, 10}) rd.floats(at[t], sizes[t], names[t]);  // the norms come first
  // Per-layer tensors are separate tensors in the export (each with its own scales).
  for (int t : {0, 2, 3, 4, 5, 7, 8, 9, 11}) {
    const bool per_layer = t != 0 && t != 11;
    const int parts = per_layer ? c.n_layers : 1;
    const int64_t n = sizes[t] / parts;
    for (int l = 0; l < parts && n > 0; ++l) {
      if (c.format_version == 1) rd.floats(at[t] + l * n, n, names[t]);
      else rd.q80(at[t] + l * n, n, c.group_size, names[t]);
    }
  }
  return ck;
}

}  // namespace kvsim
