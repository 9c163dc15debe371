// kvsim: reading GGUF files (llama.cpp's model format, versions 2 and 3) and dequantizing GGML's
// block types to float32.
//
// File layout (llama.cpp docs/gguf.md; all little endian):
//   "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_kv_count,
//   metadata: key (uint64 length + UTF-8 bytes), uint32 value type, value
//             (types 0..12: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64;
//              an array is uint32 element type, uint64 count, the elements),
//   tensor infos: name, uint32 n_dims (≤ 4), uint64 ne[n_dims] (ne[0] the contiguous dimension),
//                 uint32 ggml type, uint64 offset (from the data section, a multiple of the alignment),
//   padding to `general.alignment` (default 32), then the data section.
//
// Dequantization follows GGML's block layouts (ggml-quants.c `dequantize_row_*`) and, operation by
// operation, the `gguf` Python package's `gguf.quants` (products and sums in float32, no fused
// multiply-add), so the two agree bit for bit: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values
// per block) and the k-quants Q4_K, Q5_K, Q6_K (256 values per super-block).
//
// Every size read from a file is checked against the bytes that remain before anything is allocated
// from it, so a damaged or hostile file is refused in one line (kvsim::Error naming the file and the
// key or tensor), never a crash or an allocation sized by garbage.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvsim::gguf {

/// GGML tensor type ids (ggml.h `enum ggml_type`).
enum Type : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};

/// "Q4_K", "F32", …; "IQ2_XXS" and other known-but-unsupported names; "unknown id 77" otherwise.
std::string type_name(uint32_t type);
/// True for the types dequantize() handles.
bool supported(uint32_t type);
/// Values per block (1 for F32/F16/BF16, 32, or 256 for k-quants); 0 for an unsupported type.
int block_values(uint32_t type);
/// Bytes per block; 0 for an unsupported type.
int block_bytes(uint32_t type);
/// Dequantizes n values (a multiple of block_values(type)) from src (n / block_values · block_bytes
/// bytes) into dst. Throws kvsim::Error for an unsupported type or an n that is not a whole number of
/// blocks.
void dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst);
/// IEEE half → float, exactly (numpy's float16 → float32).
float half_to_float(uint16_t h);

/// One metadata value. Scalars fill `i`/`u`/`f`/`b` as their type allows (an unsigned value also
/// fills `i` when it fits); strings fill `s`; arrays of numbers fill `nums`, arrays of strings fill
/// `strs` (arrays of arrays are parsed and kept only as their count).
struct Value {
  uint32_t type = 0;       ///< the value's GGUF type (9 = array)
  uint32_t elem_type = 0;  ///< arrays: the element type
  uint64_t count = 0;      ///< arrays: the element count
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  bool integral = false;   ///< a scalar integer (or bool)
  std::string s;
  std::vector<double> nums;
  std::vector<std::string> strs;
};

/// "UINT32", "STRING", "ARRAY[FLOAT32]", …
std::string value_type_name(const Value& v);

struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;  ///< ne[0] contiguous: a PyTorch weight [out, in] has ne = {in, out}
  uint32_t type = 0;
  uint64_t offset = 0;      ///< from the start of the data section
  int64_t n_values = 0;
  uint64_t n_bytes = 0;
};

/// A GGUF file opened read-only (memory-mapped). Construction parses and validates the header,
/// every metadata value and every tensor info: version 2 or 3, counts and strings within the file,
/// known value types, unique keys and tensor names, 1–4 dimensions each in [1, 2^40] with a product
/// that neither overflows nor exceeds 2^40 values, ne[0] a whole number of blocks, offsets aligned,
/// every tensor's bytes inside the file and no two overlapping. Tensor types are not checked here
/// (a model loader refuses unsupported ones by name). Throws kvsim::Error naming the file and the
/// key or tensor at fault.
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t size() const { return size_; }
  const std::map<std::string, Value>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const Value* find(const std::string& key) const;
  /// Typed accessors: throw naming the key when it is missing (no default given) or of another type.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  const std::vector<double>& get_nums(const std::string& key) const;

  const TensorInfo* find_tensor(const std::string& name) const;
  /// The tensor's raw bytes (inside the mapping).
  const uint8_t* data(const TensorInfo& t) const { return base_ + data_offset_ + t.offset; }
  /// Dequantizes a whole tensor into dst (t.n_values floats, ne[0] contiguous); throws naming the
  /// tensor for an unsupported type.
  void read(const TensorInfo& t, float* dst) const;
  /// The file's sha256, lowercase hex (computed on first call).
  std::string sha256() const;

 private:
  void parse();  ///< header, metadata, tensor infos and data ranges (the constructor's checks)
  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  mutable std::string sha256_;
};

/// True when the first bytes of `path` are the GGUF magic.
bool is_gguf(const std::string& path);

/// sha256 of n bytes at p, lowercase hex (OpenSSL); used for checkpoints and recorded texts.
std::string hex_sha256(const uint8_t* p, uint64_t n);

}  // namespace kvsim::gguf
