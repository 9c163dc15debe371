// GGUF reading (see include/kvsim/model/gguf.hpp; dequantization is in ggml_quants.cpp).
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

namespace {

constexpr const char* kValueTypes[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32", "FLOAT32",
                                       "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
constexpr int kValueSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // 0: variable
constexpr uint32_t kString = 8, kArray = 9;
constexpr int64_t kMaxValues = int64_t(1) << 40;  // per tensor, and per dimension

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

std::string value_type_name(const Value& v) {
  if (v.type == kArray) return std::string("ARRAY[") + (v.elem_type <= 12 ? kValueTypes[v.elem_type] : "?") + "]";
  return v.type <= 12 ? kValueTypes[v.type] : "?";
}

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::memcmp(m, "GGUF", 4) == 0;
}

namespace {

void read_metadata(Cursor& c, uint64_t n_kv, std::map<std::string, Value>& kv) {
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = c.str("metadata key " + std::to_string(k));
    if (key.empty()) c.bad("metadata key " + std::to_string(k) + " is empty");
    const uint32_t type = c.get<uint32_t>("the type of metadata key '" + key + "'");
    if (type > 12) c.bad("metadata key '" + key + "' has an unknown value type " + std::to_string(type));
    Value v;
    read_value(c, type, v, "metadata key '" + key + "'", 0);
    if (!kv.emplace(key, std::move(v)).second) c.bad("metadata key '" + key + "' appears twice");
  }
}

TensorInfo read_tensor_info(Cursor& c, uint64_t k, uint64_t alignment) {
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
  return t;
}

/// Every tensor's bytes inside the data section and no two overlapping.
void check_data_ranges(const Cursor& c, const std::vector<TensorInfo>& tensors, uint64_t data_size) {
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors) {
    if (t.n_bytes > data_size || t.offset > data_size - t.n_bytes)
      c.bad("tensor '" + t.name + "' (" + std::to_string(t.n_bytes) + " bytes at data offset " + std::to_string(t.offset) +
            ") runs past the end of the file (" + std::to_string(data_size) + " data bytes; truncated?)");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < order.size(); ++k)
    if (order[k - 1]->offset + order[k - 1]->n_bytes > order[k]->offset)
      c.bad("tensors '" + order[k - 1]->name + "' and '" + order[k]->name + "' overlap in the data section");
}

}  // namespace

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
    parse();
  } catch (...) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_t(size_));
    ::close(fd_);
    throw;
  }
}

void File::parse() {
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
  read_metadata(c, n_kv, kv_);
  uint64_t alignment = 32;
  if (const Value* a = find("general.alignment")) {
    if (!a->integral || a->type == 7 || a->i <= 0 || (a->i & (a->i - 1)) != 0 || a->i > 65536)
      c.bad("metadata key 'general.alignment' must be a power of two up to 65536");
    alignment = uint64_t(a->i);
  }
  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t = read_tensor_info(c, k, alignment);
    if (by_name_.count(t.name)) c.bad("tensor '" + t.name + "' appears twice");
    by_name_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  const uint64_t pad = (alignment - c.pos() % alignment) % alignment;
  data_offset_ = c.pos() + pad;
  if (data_offset_ > size_ && !tensors_.empty()) c.bad("the data section starts beyond the end of the file (truncated?)");
  check_data_ranges(c, tensors_, size_ > data_offset_ ? size_ - data_offset_ : 0);
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
