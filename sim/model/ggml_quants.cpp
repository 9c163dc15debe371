// GGML's tensor types and their dequantization to float32 (include/kvsim/model/gguf.hpp).
//
// Block layouts: ggml-common.h `block_q4_0` … `block_q6_K`; arithmetic: ggml-quants.c
// `dequantize_row_*`, operation by operation as the `gguf` package's gguf/quants.py computes it.
// This file is compiled with -ffp-contract=off (CMakeLists.txt): GGML and numpy compute d·q + m as a
// product then a sum, each rounded to float32; a fused multiply-add would round once and differ in the
// last bit.
#include <cstring>

#include "kvsim/core/error.hpp"
#include "kvsim/model/gguf.hpp"

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

}  // namespace kvsim::gguf
