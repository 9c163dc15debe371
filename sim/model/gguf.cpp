// GGUF reading and GGML dequantization (see include/kvsim/model/gguf.hpp).
//
// This file is compiled with -ffp-contract=off (CMakeLists.txt): GGML's reference dequantizers and
// the `gguf` package compute d·q + m as a product then a sum, each rounded to float32; a fused
// multiply-add would round once and differ in the last bit.
#include "kvsim/model/gguf.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "kvsim/core/error.hpp"

namespace kvsim::gguf {

namespace {

struct TypeRow {
  uint32_t id;
  const char* name;
  int values;  // per block; 0 = not supported
  int bytes;
};

// Supported types with their block geometry (ggml-common.h block_q*), then the names of the others.
constexpr TypeRow kTypes[] = {
    {F32, "F32", 1, 4},       {F16, "F16", 1, 2},       {BF16, "BF16", 1, 2},     {Q4_0, "Q4_0", 32, 18},
    {Q4_1, "Q4_1", 32, 20},   {Q5_0, "Q5_0", 32, 22},   {Q5_1, "Q5_1", 32, 24},   {Q8_0, "Q8_0", 32, 34},
    {Q4_K, "Q4_K", 256, 144}, {Q5_K, "Q5_K", 256, 176}, {Q6_K, "Q6_K", 256, 210},
    {Q8_1, "Q8_1", 0, 0},     {Q2_K, "Q2_K", 0, 0},     {Q3_K, "Q3_K", 0, 0},     {Q8_K, "Q8_K", 0, 0},
    {16, "IQ2_XXS", 0, 0},    {17, "IQ2_XS", 0, 0},     {18, "IQ3_XXS", 0, 0},    {19, "IQ1_S", 0, 0},
    {20, "IQ4_NL", 0, 0},     {21, "IQ3_S", 0, 0},      {22, "IQ2_S", 0, 0},      {23, "IQ4_XS", 0, 0},
    {24, "I8", 0, 0},         {25, "I16", 0, 0},        {26, "I32", 0, 0},        {27, "I64", 0, 0},
    {28, "F64", 0, 0},        {29, "IQ1_M", 0, 0},      {34, "TQ1_0", 0, 0},      {35, "TQ2_0", 0, 0},
    {39, "MXFP4", 0, 0},
};

const TypeRow* type_row(uint32_t t) {
  for (const auto& r : kTypes)
    if (r.id == t) return &r;
  return nullptr;
}

constexpr const char* kValueTypes[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32", "FLOAT32",
                                       "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
constexpr int kValueSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // 0: variable
constexpr uint32_t kString = 8, kArray = 9;
constexpr int64_t kMaxValues = int64_t(1) << 40;  // per tensor, and per dimension

inline uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- dequantizers: one block each; `y` receives block_values floats ----

void dq_q4_0(const uint8_t* b, float* y) {  // d (f16), qs[16]: value j = (nibble − 8)·d
  const float d = half_to_float(rd16(b));
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(qs[j] & 0x0F) - 8);
    y[j + 16] = d * float(int(qs[j] >> 4) - 8);
  }
}

void dq_q4_1(const uint8_t* b, float* y) {  // d, m (f16), qs[16]: value = d·nibble + m
  const float d = half_to_float(rd16(b)), m = half_to_float(rd16(b + 2));
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(qs[j] & 0x0F) + m;
    y[j + 16] = d * float(qs[j] >> 4) + m;
  }
}

void dq_q5_0(const uint8_t* b, float* y) {  // d, qh (32 high bits), qs[16]: (nibble | high<<4) − 16
  const float d = half_to_float(rd16(b));
  const uint32_t qh = rd32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = int(qs[j] & 0x0F) | int(((qh >> j) & 1u) << 4);
    const int hi = int(qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * float(lo - 16);
    y[j + 16] = d * float(hi - 16);
  }
}

void dq_q5_1(const uint8_t* b, float* y) {  // d, m, qh, qs[16]: d·(nibble | high<<4) + m
  const float d = half_to_float(rd16(b)), m = half_to_float(rd16(b + 2));
  const uint32_t qh = rd32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = int(qs[j] & 0x0F) | int(((qh >> j) & 1u) << 4);
    const int hi = int(qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * float(lo) + m;
    y[j + 16] = d * float(hi) + m;
  }
}

void dq_q8_0(const uint8_t* b, float* y) {  // d, int8 qs[32]
  const float d = half_to_float(rd16(b));
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

/// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (ggml `get_scale_min_k4`).
inline void scale_min_k4(int j, const uint8_t* s, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dq_q4_k(const uint8_t* b, float* y) {  // d, dmin (f16), scales[12], qs[128]; 8 sub-blocks of 32
  const float d = half_to_float(rd16(b)), dmin = half_to_float(rd16(b + 2));
  const uint8_t* sc6 = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    scale_min_k4(j, sc6, sc, mn);
    const float d1 = d * float(sc), m1 = dmin * float(mn);
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int i = 0; i < 32; ++i) y[j * 32 + i] = d1 * float((q[i] >> shift) & 0x0F) - m1;
  }
}

void dq_q5_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qh[32], qs[128]
  const float d = half_to_float(rd16(b)), dmin = half_to_float(rd16(b + 2));
  const uint8_t* sc6 = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    scale_min_k4(j, sc6, sc, mn);
    const float d1 = d * float(sc), m1 = dmin * float(mn);
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int i = 0; i < 32; ++i) {
      const int v = ((q[i] >> shift) & 0x0F) | (((qh[i] >> j) & 1) << 4);
      y[j * 32 + i] = d1 * float(v) - m1;
    }
  }
}

void dq_q6_k(const uint8_t* b, float* y) {  // ql[128], qh[64], int8 scales[16], d (f16)
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(rd16(b + 208));
  for (int h = 0; h < 2; ++h) {      // two halves of 128 values
    for (int c = 0; c < 4; ++c) {    // four rows of 32 in each half
      for (int i = 0; i < 32; ++i) {
        const int v = h * 128 + c * 32 + i;
        const int lo = (ql[h * 64 + (c % 2) * 32 + i] >> (4 * (c / 2))) & 0x0F;
        const int hi = (qh[h * 32 + i] >> (2 * c)) & 0x03;
        const float ds = d * float(scales[v / 16]);
        y[v] = ds * float((lo | (hi << 4)) - 32);
      }
    }
  }
}

std::string hex_sha256(const uint8_t* p, uint64_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(p, size_t(n), md, &len, EVP_sha256(), nullptr) != 1) throw Error("sha256: OpenSSL EVP_Digest failed");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

/// Bounds-checked reader over the mapping; every failure names the file and what was being read.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* p, uint64_t size) : path_(path), p_(p), size_(size) {}
  [[noreturn]] void bad(const std::string& why) const { throw Error(path_ + ": bad GGUF file: " + why); }
  uint64_t pos() const { return at_; }
  uint64_t left() const { return size_ - at_; }
  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      bad(what + " needs " + std::to_string(n) + " bytes at offset " + std::to_string(at_) + " but the file ends after " +
          std::to_string(left()) + " (truncated?)");
  }
  template <class T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t n = get<uint64_t>(what + " (string length)");
    need(n, what + " (a string of " + std::to_string(n) + " bytes)");
    std::string s(reinterpret_cast<const char*>(p_ + at_), size_t(n));
    at_ += n;
    return s;
  }
  void skip(uint64_t n, const std::string& what) {
    need(n, what);
    at_ += n;
  }

 private:
  const std::string& path_;
  const uint8_t* p_;
  uint64_t size_;
  uint64_t at_ = 0;
};

void read_scalar(Cursor& c, uint32_t type, Value& v, const std::string& what) {
  switch (type) {
    case 0: v.u = c.get<uint8_t>(what); v.i = int64_t(v.u); v.f = double(v.u); v.integral = true; break;
    case 1: v.i = c.get<int8_t>(what); v.f = double(v.i); v.integral = true; break;
    case 2: v.u = c.get<uint16_t>(what); v.i = int64_t(v.u); v.f = double(v.u); v.integral = true; break;
    case 3: v.i = c.get<int16_t>(what); v.f = double(v.i); v.integral = true; break;
    case 4: v.u = c.get<uint32_t>(what); v.i = int64_t(v.u); v.f = double(v.u); v.integral = true; break;
    case 5: v.i = c.get<int32_t>(what); v.f = double(v.i); v.integral = true; break;
    case 6: v.f = c.get<float>(what); break;
    case 7: {
      const uint8_t b = c.get<uint8_t>(what);
      if (b > 1) c.bad(what + " is a BOOL holding " + std::to_string(b));
      v.b = b != 0;
      v.i = b;
      v.integral = true;
      break;
    }
    case 10: v.u = c.get<uint64_t>(what); v.i = v.u <= uint64_t(INT64_MAX) ? int64_t(v.u) : INT64_MAX; v.f = double(v.u); v.integral = true; break;
    case 11: v.i = c.get<int64_t>(what); v.f = double(v.i); v.integral = true; break;
    case 12: v.f = c.get<double>(what); break;
    default: c.bad(what + " has an unknown value type " + std::to_string(type));
  }
}

void read_value(Cursor& c, uint32_t type, Value& v, const std::string& what, int depth) {
  v.type = type;
  if (type == kString) {
    v.s = c.str(what);
  } else if (type == kArray) {
    if (depth >= 4) c.bad(what + ": arrays nested deeper than 4");
    const uint32_t et = c.get<uint32_t>(what + " (array element type)");
    if (et > 12) c.bad(what + " is an array of unknown value type " + std::to_string(et));
    const uint64_t n = c.get<uint64_t>(what + " (array length)");
    v.elem_type = et;
    v.count = n;
    // Each element takes at least its fixed size (a string its 8-byte length, an array its 12-byte
    // header), so a count that could not fit in the rest of the file is refused before reserving.
    const uint64_t min_size = et == kString ? 8 : et == kArray ? 12 : uint64_t(kValueSizes[et]);
    if (n > c.left() / min_size)
      c.bad(what + " claims " + std::to_string(n) + " elements, more than the " + std::to_string(c.left()) +
            " bytes left in the file hold");
    if (et == kString) {
      v.strs.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) v.strs.push_back(c.str(what + "[" + std::to_string(k) + "]"));
    } else if (et == kArray) {
      for (uint64_t k = 0; k < n; ++k) {
        Value inner;
        read_value(c, kArray, inner, what + "[" + std::to_string(k) + "]", depth + 1);
      }
    } else {
      v.nums.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) {
        Value e;
        read_scalar(c, et, e, what);
        v.nums.push_back(e.integral ? (et == 10 ? double(e.u) : double(e.i)) : e.f);
      }
    }
  } else {
    read_scalar(c, type, v, what);
  }
}

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / nan (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | (uint32_t(112 - e) << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string type_name(uint32_t type) {
  const TypeRow* r = type_row(type);
  return r ? r->name : "unknown id " + std::to_string(type);
}
bool supported(uint32_t type) {
  const TypeRow* r = type_row(type);
  return r && r->values > 0;
}
int block_values(uint32_t type) {
  const TypeRow* r = type_row(type);
  return r ? r->values : 0;
}
int block_bytes(uint32_t type) {
  const TypeRow* r = type_row(type);
  return r ? r->bytes : 0;
}

void dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const int bv = block_values(type), bb = block_bytes(type);
  if (bv == 0) throw Error("GGML type " + type_name(type) + " cannot be dequantized by kvsim");
  if (n < 0 || n % bv != 0)
    throw Error("GGML type " + type_name(type) + ": " + std::to_string(n) + " values are not a whole number of " +
                std::to_string(bv) + "-value blocks");
  const int64_t blocks = n / bv;
  switch (type) {
    case F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(rd16(src + 2 * i));
      return;
    case BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t(rd16(src + 2 * i)) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    default: break;
  }
  void (*fn)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case Q4_0: fn = dq_q4_0; break;
    case Q4_1: fn = dq_q4_1; break;
    case Q5_0: fn = dq_q5_0; break;
    case Q5_1: fn = dq_q5_1; break;
    case Q8_0: fn = dq_q8_0; break;
    case Q4_K: fn = dq_q4_k; break;
    case Q5_K: fn = dq_q5_k; break;
    case Q6_K: fn = dq_q6_k; break;
    default: throw Error("GGML type " + type_name(type) + " cannot be dequantized by kvsim");
  }
  for (int64_t k = 0; k < blocks; ++k) fn(src + k * bb, dst + k * bv);
}

std::string value_type_name(const Value& v) {
  if (v.type == kArray) return std::string("ARRAY[") + (v.elem_type <= 12 ? kValueTypes[v.elem_type] : "?") + "]";
  return v.type <= 12 ? kValueTypes[v.type] : "?";
}

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::memcmp(m, "GGUF", 4) == 0;
}

File::File(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(path + ": not a regular file");
  }
  size_ = uint64_t(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) {
      ::close(fd_);
      throw Error(path + ": cannot map the file (" + std::strerror(errno) + ")");
    }
    base_ = static_cast<const uint8_t*>(m);
  }
  try {
    Cursor c(path_, base_, size_);
    c.need(4, "the magic");
    if (std::memcmp(base_, "GGUF", 4) != 0) c.bad("the magic is not \"GGUF\"");
    c.skip(4, "the magic");
    version_ = c.get<uint32_t>("the version");
    if (version_ == 1) c.bad("GGUF version 1 (2023's first draft, 32-bit counts) is not read; convert it with a current llama.cpp");
    if (version_ != 2 && version_ != 3)
      c.bad("GGUF version " + std::to_string(version_) + " is not supported (kvsim reads versions 2 and 3)");
    const uint64_t n_tensors = c.get<uint64_t>("the tensor count");
    const uint64_t n_kv = c.get<uint64_t>("the metadata count");
    // A metadata entry takes ≥ 8 + 1 + 4 + 1 bytes and a tensor info ≥ 8 + 1 + 4 + 8 + 4 + 8.
    if (n_kv > c.left() / 14) c.bad("the header claims " + std::to_string(n_kv) + " metadata entries, more than the file holds");
    if (n_tensors > c.left() / 33) c.bad("the header claims " + std::to_string(n_tensors) + " tensors, more than the file holds");
    for (uint64_t k = 0; k < n_kv; ++k) {
      const std::string key = c.str("metadata key " + std::to_string(k));
      if (key.empty()) c.bad("metadata key " + std::to_string(k) + " is empty");
      const uint32_t type = c.get<uint32_t>("the type of metadata key '" + key + "'");
      if (type > 12) c.bad("metadata key '" + key + "' has an unknown value type " + std::to_string(type));
      Value v;
      read_value(c, type, v, "metadata key '" + key + "'", 0);
      if (!kv_.emplace(key, std::move(v)).second) c.bad("metadata key '" + key + "' appears twice");
    }
    uint64_t alignment = 32;
    if (const Value* a = find("general.alignment")) {
      if (!a->integral || a->type == 7 || a->i <= 0 || (a->i & (a->i - 1)) != 0 || a->i > 65536)
        c.bad("metadata key 'general.alignment' must be a power of two up to 65536");
      alignment = uint64_t(a->i);
    }
    tensors_.reserve(size_t(n_tensors));
    for (uint64_t k = 0; k < n_tensors; ++k) {
      TensorInfo t;
      t.name = c.str("the name of tensor " + std::to_string(k));
      const std::string what = "tensor '" + t.name + "'";
      const uint32_t nd = c.get<uint32_t>(what + " (dimension count)");
      if (nd < 1 || nd > 4) c.bad(what + " has " + std::to_string(nd) + " dimensions (GGML allows 1 to 4)");
      t.n_values = 1;
      for (uint32_t d = 0; d < nd; ++d) {
        const uint64_t e = c.get<uint64_t>(what + " (dimension " + std::to_string(d) + ")");
        if (e < 1 || e > uint64_t(kMaxValues))
          c.bad(what + " has dimension " + std::to_string(d) + " = " + std::to_string(e) + " (must be in [1, 2^40])");
        if (uint64_t(t.n_values) > uint64_t(kMaxValues) / e) c.bad(what + " has more than 2^40 values (its dimensions overflow)");
        t.ne.push_back(int64_t(e));
        t.n_values *= int64_t(e);
      }
      t.type = c.get<uint32_t>(what + " (type)");
      t.offset = c.get<uint64_t>(what + " (offset)");
      if (t.offset % alignment != 0)
        c.bad(what + " starts at data offset " + std::to_string(t.offset) + ", not a multiple of the alignment " +
              std::to_string(alignment));
      const int bv = block_values(t.type), bb = block_bytes(t.type);
      if (bv > 0) {
        if (t.ne[0] % bv != 0)
          c.bad(what + " of type " + type_name(t.type) + " has a row of " + std::to_string(t.ne[0]) +
                " values, not a whole number of " + std::to_string(bv) + "-value blocks");
        t.n_bytes = uint64_t(t.n_values / bv) * uint64_t(bb);
      }
      if (by_name_.count(t.name)) c.bad(what + " appears twice");
      by_name_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    const uint64_t pad = (alignment - c.pos() % alignment) % alignment;
    data_offset_ = c.pos() + pad;
    if (data_offset_ > size_ && !tensors_.empty()) c.bad("the data section starts beyond the end of the file (truncated?)");
    const uint64_t data_size = size_ > data_offset_ ? size_ - data_offset_ : 0;
    // Data ranges: inside the file and pairwise disjoint (sorted by offset).
    std::vector<const TensorInfo*> order;
    for (const auto& t : tensors_) {
      if (t.n_bytes > data_size || t.offset > data_size - t.n_bytes)
        c.bad("tensor '" + t.name + "' (" + std::to_string(t.n_bytes) + " bytes at data offset " + std::to_string(t.offset) +
              ") runs past the end of the file (" + std::to_string(data_size) + " data bytes; truncated?)");
      order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < order.size(); ++k)
      if (order[k - 1]->offset + order[k - 1]->n_bytes > order[k]->offset)
        c.bad("tensors '" + order[k - 1]->name + "' and '" + order[k]->name + "' overlap in the data section");
  } catch (...) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_t(size_));
    ::close(fd_);
    throw;
  }
}

File::~File() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_t(size_));
  if (fd_ >= 0) ::close(fd_);
}

const Value* File::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const Value& v, const char* want) {
  throw Error(path + ": metadata key '" + key + "' is " + value_type_name(v) + ", expected " + want);
}
}  // namespace

std::string File::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": metadata key '" + key + "' is missing");
  if (v->type != kString) wrong_type(path_, key, *v, "a STRING");
  return v->s;
}
std::string File::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}
int64_t File::get_int(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": metadata key '" + key + "' is missing");
  if (!v->integral || v->type == 7) wrong_type(path_, key, *v, "an integer");
  if (v->type == 10 && v->u > uint64_t(INT64_MAX)) throw Error(path_ + ": metadata key '" + key + "' is out of range");
  return v->i;
}
int64_t File::get_int(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }
double File::get_float(const std::string& key, double def) const {
  const Value* v = find(key);
  if (!v) return def;
  if (v->type == kString || v->type == kArray || v->type == 7) wrong_type(path_, key, *v, "a number");
  return v->integral ? double(v->i) : v->f;
}
bool File::get_bool(const std::string& key, bool def) const {
  const Value* v = find(key);
  if (!v) return def;
  if (v->type != 7) wrong_type(path_, key, *v, "a BOOL");
  return v->b;
}
const std::vector<std::string>& File::get_strings(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": metadata key '" + key + "' is missing");
  if (v->type != kArray || v->elem_type != kString) wrong_type(path_, key, *v, "an ARRAY[STRING]");
  return v->strs;
}
const std::vector<double>& File::get_nums(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": metadata key '" + key + "' is missing");
  if (v->type != kArray || v->elem_type == kString || v->elem_type == kArray) wrong_type(path_, key, *v, "an ARRAY of numbers");
  return v->nums;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void File::read(const TensorInfo& t, float* dst) const {
  if (!supported(t.type))
    throw Error(path_ + ": tensor '" + t.name + "' has type " + type_name(t.type) +
                ", which kvsim cannot dequantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  dequantize(t.type, data(t), t.n_values, dst);
}

std::string File::sha256() const {
  if (sha256_.empty()) sha256_ = hex_sha256(base_, size_);
  return sha256_;
}

}  // namespace kvsim::gguf
