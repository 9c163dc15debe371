// kvsim: a small RAII wrapper over the HDF5 C API (only what kvsim needs).
// Every failure throws kvsim::Error naming the file and the object at fault; the HDF5 library's own
// error-stack printing is switched off so that users see one clear message.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvsim/core/error.hpp"

namespace kvsim::h5 {

/// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) { reset(); id_ = o.id_; o.id_ = H5I_INVALID_HID; }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

/// Information about an n-D dataset.
struct DatasetInfo {
  std::vector<hsize_t> shape;
  H5T_class_t type_class = H5T_NO_CLASS;
  size_t type_size = 0;
  // Floating-point layout (H5Tget_fields/H5Tget_ebias): IEEE binary32 is 8 exponent bits, 23
  // mantissa bits, bias 127; binary16 is 5, 10, 15. Integers: whether signed.
  size_t exp_bits = 0, mant_bits = 0, exp_bias = 0;
  bool is_signed = false;
  // Storage, checked against shape and type by File::check_storage before any read.
  H5D_layout_t layout = H5D_LAYOUT_ERROR;
  std::vector<hsize_t> chunk;         ///< chunk dims (chunked layout only)
  std::vector<H5Z_filter_t> filters;  ///< filter pipeline (chunked layout only)
  int external_files = 0;             ///< external raw-data files (refused)
  hsize_t storage_bytes = 0;          ///< H5Dget_storage_size
  hsize_t allocated_chunks = 0;       ///< H5Dget_num_chunks (chunked layout only)
  haddr_t offset = HADDR_UNDEF;       ///< file address of contiguous data
  /// Number of elements (product of shape).
  hsize_t elements() const {
    hsize_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  /// IEEE binary32 (`bits` 32) or binary16 (`bits` 16), either byte order.
  bool is_ieee_float(int bits) const;
};

/// An open HDF5 file. `path` is kept for error messages.
class File {
 public:
  static File open_read(const std::string& path);
  /// Create (truncate) a file for writing.
  static File create(const std::string& path);

  const std::string& path() const { return path_; }
  hid_t id() const { return hid(); }

  bool exists(const std::string& obj) const;
  /// Unlinks a dataset or group (its space is not reclaimed); throws naming it on failure.
  void remove(const std::string& obj);
  bool has_attr(const std::string& name, const std::string& obj = "/") const;
  int64_t attr_int(const std::string& name, const std::string& obj = "/") const;
  /// An integer attribute as a vector (a scalar gives one value).
  std::vector<int64_t> attr_ints(const std::string& name, const std::string& obj = "/") const;
  double attr_double(const std::string& name, const std::string& obj = "/") const;
  std::string attr_string(const std::string& name, const std::string& obj = "/") const;
  void set_attr(const std::string& obj, const std::string& name, int64_t v);
  /// A 1-D int64 array attribute (e.g. a recording's layer_windows).
  void set_attr(const std::string& obj, const std::string& name, const std::vector<int64_t>& v);
  void set_attr(const std::string& obj, const std::string& name, double v);
  void set_attr(const std::string& obj, const std::string& name, const std::string& v);

  void create_group(const std::string& name);
  DatasetInfo dataset_info(const std::string& name) const;
  /// Throws naming the dataset unless its storage is one kvsim reads safely and completely:
  /// contiguous, compact or chunked layout (no virtual or external data); filters only deflate,
  /// shuffle and fletcher32; chunk dims of the dataset's rank within its shape; every element
  /// written (contiguous/compact: exactly elements × type size bytes inside the file; chunked: every
  /// chunk allocated, and unfiltered chunks exactly chunk × type size bytes each).
  void check_storage(const std::string& name, const DatasetInfo& info) const;

  /// Create a float32 (or int32/float64/int64) dataset of `shape`; `chunk` empty = contiguous.
  /// With `chunk` and `compress`, shuffle + deflate at `deflate_level` (1-9) are applied.
  void create_dataset(const std::string& name, hid_t file_type, const std::vector<hsize_t>& shape,
                      const std::vector<hsize_t>& chunk, bool compress = true, int deflate_level = 4);

  /// Read the hyperslab [offset, offset+count) of dataset `name` into `out` (converted to the memory
  /// type `mem_type`, e.g. H5T_NATIVE_FLOAT; any floating file type converts, float16 included).
  void read_slab(const std::string& name, hid_t mem_type, const std::vector<hsize_t>& offset,
                 const std::vector<hsize_t>& count, void* out) const;
  void write_slab(const std::string& name, hid_t mem_type, const std::vector<hsize_t>& offset,
                  const std::vector<hsize_t>& count, const void* data);

  /// Convenience: write a whole 1-D dataset.
  void write_vector(const std::string& name, const std::vector<double>& v);
  void write_vector(const std::string& name, const std::vector<int64_t>& v);
  void write_vector(const std::string& name, const std::vector<int32_t>& v);
  void write_vector(const std::string& name, const std::vector<float>& v);
  std::vector<int32_t> read_int_vector(const std::string& name) const;
  std::vector<double> read_double_vector(const std::string& name) const;
  std::vector<std::string> list(const std::string& group) const;

  void flush();

 private:
  File(Handle h, std::string path) : h_(std::move(h)), path_(std::move(path)) {}
  [[noreturn]] void fail(const std::string& what) const;
  /// The file's HDF5 id, after switching HDF5's error printing off in the calling thread.
  hid_t hid() const;
  Handle h_;
  std::string path_;
};

}  // namespace kvsim::h5
