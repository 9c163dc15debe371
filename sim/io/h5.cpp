#include "kvsim/io/h5.hpp"

#include <algorithm>
#include <sstream>

namespace kvsim::h5 {
namespace {

struct Quiet {
  Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};

/// HDF5's automatic error-stack printing is per thread in thread-safe builds (Debian's is): switched
/// off in every thread before its first HDF5 call — File::hid() and the two File factories — so a
/// failure is only ever kvsim's one-line error.
void quiet_this_thread() { thread_local const Quiet q; (void)q; }

std::string dims_text(const std::vector<hsize_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string filter_name(H5Z_filter_t f) {
  switch (f) {
    case H5Z_FILTER_DEFLATE: return "deflate";
    case H5Z_FILTER_SHUFFLE: return "shuffle";
    case H5Z_FILTER_FLETCHER32: return "fletcher32";
    case H5Z_FILTER_SZIP: return "szip";
    case H5Z_FILTER_NBIT: return "nbit";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset";
    case 32000: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32015: return "zstd";
    default: return "filter " + std::to_string(f);
  }
}

/// Layout, chunking, filters and sizes of an open dataset into `info`.
void read_storage(hid_t d, DatasetInfo& info) {
  Handle dcpl(H5Dget_create_plist(d));
  info.layout = H5Pget_layout(dcpl.get());
  info.external_files = H5Pget_external_count(dcpl.get());
  info.storage_bytes = H5Dget_storage_size(d);
  if (info.layout == H5D_CONTIGUOUS) info.offset = H5Dget_offset(d);
  if (info.layout != H5D_CHUNKED) return;
  const int rank = H5Pget_chunk(dcpl.get(), 0, nullptr);
  if (rank > 0 && rank <= 32) {
    info.chunk.resize(size_t(rank));
    H5Pget_chunk(dcpl.get(), rank, info.chunk.data());
  }
  const int nf = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < nf && i < 64; ++i) {
    unsigned flags = 0, cd[8];
    size_t ncd = 8;
    info.filters.push_back(H5Pget_filter2(dcpl.get(), unsigned(i), &flags, &ncd, cd, 0, nullptr, nullptr));
  }
  hsize_t n = 0;
  Handle space(H5Dget_space(d));
  if (H5Dget_num_chunks(d, space.get(), &n) >= 0) info.allocated_chunks = n;
}

}  // namespace

void Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

hid_t File::hid() const {
  quiet_this_thread();
  return h_.get();
}

void File::fail(const std::string& what) const { throw Error(path_ + ": " + what); }

bool DatasetInfo::is_ieee_float(int bits) const {
  if (type_class != H5T_FLOAT) return false;
  if (bits == 32) return type_size == 4 && exp_bits == 8 && mant_bits == 23 && exp_bias == 127;
  if (bits == 16) return type_size == 2 && exp_bits == 5 && mant_bits == 10 && exp_bias == 15;
  return false;
}

File File::open_read(const std::string& path) {
  quiet_this_thread();
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(path + ": not an HDF5 file (or cannot be opened)");
  Handle h(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!h.valid()) throw Error(path + ": cannot open HDF5 file for reading");
  return File(std::move(h), path);
}

File File::create(const std::string& path) {
  quiet_this_thread();
  Handle h(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!h.valid()) throw Error(path + ": cannot create HDF5 file");
  return File(std::move(h), path);
}

bool File::exists(const std::string& obj) const {
  // Check each path component so that a missing intermediate group is not an error.
  std::string acc;
  std::stringstream ss(obj);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    acc += "/" + part;
    if (H5Lexists(hid(), acc.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

bool File::has_attr(const std::string& name, const std::string& obj) const {
  return H5Aexists_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

int64_t File::attr_int(const std::string& name, const std::string& obj) const {
  if (!has_attr(name, obj)) fail("missing attribute '" + name + "' on '" + obj + "'");
  Handle a(H5Aopen_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  Handle t(H5Aget_type(a.get()));
  if (H5Tget_class(t.get()) != H5T_INTEGER) fail("attribute '" + name + "' must be an integer");
  Handle sp(H5Aget_space(a.get()));
  if (H5Sget_simple_extent_npoints(sp.get()) != 1) fail("attribute '" + name + "' must be a scalar");
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

std::vector<int64_t> File::attr_ints(const std::string& name, const std::string& obj) const {
  if (!has_attr(name, obj)) fail("missing attribute '" + name + "' on '" + obj + "'");
  Handle a(H5Aopen_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  Handle t(H5Aget_type(a.get()));
  if (H5Tget_class(t.get()) != H5T_INTEGER) fail("attribute '" + name + "' must be integers");
  Handle sp(H5Aget_space(a.get()));
  if (H5Sget_simple_extent_ndims(sp.get()) > 1) fail("attribute '" + name + "' must be a scalar or a 1-D array");
  std::vector<int64_t> v(size_t(std::max<hssize_t>(0, H5Sget_simple_extent_npoints(sp.get()))));
  if (!v.empty() && H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

double File::attr_double(const std::string& name, const std::string& obj) const {
  if (!has_attr(name, obj)) fail("missing attribute '" + name + "' on '" + obj + "'");
  Handle a(H5Aopen_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  Handle t(H5Aget_type(a.get()));
  auto cls = H5Tget_class(t.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) fail("attribute '" + name + "' must be numeric");
  Handle sp(H5Aget_space(a.get()));
  if (H5Sget_simple_extent_npoints(sp.get()) != 1) fail("attribute '" + name + "' must be a scalar");
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

std::string File::attr_string(const std::string& name, const std::string& obj) const {
  if (!has_attr(name, obj)) fail("missing attribute '" + name + "' on '" + obj + "'");
  Handle a(H5Aopen_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  Handle t(H5Aget_type(a.get()));
  if (H5Tget_class(t.get()) != H5T_STRING) fail("attribute '" + name + "' must be a string");
  if (H5Tis_variable_str(t.get()) > 0) {
    Handle mt(H5Tcopy(H5T_C_S1));
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(t.get()));
    char* buf = nullptr;
    if (H5Aread(a.get(), mt.get(), &buf) < 0) fail("cannot read attribute '" + name + "'");
    std::string s = buf ? buf : "";
    H5free_memory(buf);
    return s;
  }
  size_t sz = H5Tget_size(t.get());
  std::string s(sz, '\0');
  Handle mt(H5Tcopy(H5T_C_S1));
  H5Tset_size(mt.get(), sz);
  H5Tset_cset(mt.get(), H5Tget_cset(t.get()));
  H5Tset_strpad(mt.get(), H5T_STR_NULLPAD);
  if (H5Aread(a.get(), mt.get(), s.data()) < 0) fail("cannot read attribute '" + name + "'");
  auto z = s.find('\0');
  if (z != std::string::npos) s.resize(z);
  return s;
}

namespace {
void write_attr(hid_t file, const std::string& path, const std::string& obj, const std::string& name,
                hid_t ftype, hid_t mtype, const void* data) {
  if (H5Aexists_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT) > 0)
    H5Adelete_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT);
  Handle sp(H5Screate(H5S_SCALAR));
  Handle a(H5Acreate_by_name(file, obj.c_str(), name.c_str(), ftype, sp.get(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT));
  if (!a.valid() || H5Awrite(a.get(), mtype, data) < 0)
    throw Error(path + ": cannot write attribute '" + name + "' on '" + obj + "'");
}
}  // namespace

void File::set_attr(const std::string& obj, const std::string& name, int64_t v) {
  write_attr(hid(), path_, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}
void File::set_attr(const std::string& obj, const std::string& name, const std::vector<int64_t>& v) {
  if (H5Aexists_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT) > 0)
    H5Adelete_by_name(hid(), obj.c_str(), name.c_str(), H5P_DEFAULT);
  const hsize_t n = v.size();
  Handle sp(H5Screate_simple(1, &n, nullptr));
  Handle a(H5Acreate_by_name(hid(), obj.c_str(), name.c_str(), H5T_STD_I64LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT));
  if (!a.valid() || (n > 0 && H5Awrite(a.get(), H5T_NATIVE_INT64, v.data()) < 0))
    throw Error(path_ + ": cannot write attribute '" + name + "' on '" + obj + "'");
}
void File::set_attr(const std::string& obj, const std::string& name, double v) {
  write_attr(hid(), path_, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}
void File::set_attr(const std::string& obj, const std::string& name, const std::string& v) {
  // Variable-length UTF-8: h5py returns str (not bytes) for these; attr_string reads both kinds.
  Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  const char* p = v.c_str();
  write_attr(hid(), path_, obj, name, t.get(), t.get(), &p);
}

void File::remove(const std::string& obj) {
  if (H5Ldelete(hid(), obj.c_str(), H5P_DEFAULT) < 0) fail("cannot remove '" + obj + "'");
}

void File::create_group(const std::string& name) {
  Handle g(H5Gcreate2(hid(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) fail("cannot create group '" + name + "'");
}

DatasetInfo File::dataset_info(const std::string& name) const {
  if (!exists(name)) fail("missing dataset '" + name + "'");
  Handle d(H5Dopen2(hid(), name.c_str(), H5P_DEFAULT));
  if (!d.valid()) fail("'" + name + "' is not a dataset");
  Handle sp(H5Dget_space(d.get()));
  Handle t(H5Dget_type(d.get()));
  DatasetInfo info;
  int rank = H5Sget_simple_extent_ndims(sp.get());
  if (rank < 0) fail("cannot read the shape of dataset '" + name + "'");
  if (rank > 32) fail("dataset '" + name + "' has rank " + std::to_string(rank));
  info.shape.resize(rank);
  H5Sget_simple_extent_dims(sp.get(), info.shape.data(), nullptr);
  info.type_class = H5Tget_class(t.get());
  info.type_size = H5Tget_size(t.get());
  if (info.type_class == H5T_FLOAT) {
    size_t spos, epos, mpos;
    H5Tget_fields(t.get(), &spos, &epos, &info.exp_bits, &mpos, &info.mant_bits);
    info.exp_bias = H5Tget_ebias(t.get());
  } else if (info.type_class == H5T_INTEGER) {
    info.is_signed = H5Tget_sign(t.get()) == H5T_SGN_2;
  }
  read_storage(d.get(), info);
  return info;
}

void File::check_storage(const std::string& name, const DatasetInfo& info) const {
  const std::string ds = "dataset '" + name + "'";
  if (info.external_files != 0) fail(ds + " keeps its data in external files (not read, for safety)");
  const hsize_t n = info.elements();
  const hsize_t bytes = n * hsize_t(info.type_size);
  if (info.type_size == 0 || (n != 0 && bytes / n != hsize_t(info.type_size))) fail(ds + ": impossible size");
  if (info.layout == H5D_CONTIGUOUS || info.layout == H5D_COMPACT) {
    if (info.storage_bytes != bytes)
      fail(ds + ": storage holds " + std::to_string(info.storage_bytes) + " bytes, its shape " + dims_text(info.shape) +
           " and " + std::to_string(info.type_size) + "-byte type need " + std::to_string(bytes) +
           (info.storage_bytes == 0 ? " (no data was ever written)" : " (corrupt or truncated)"));
    if (info.layout == H5D_CONTIGUOUS && n != 0) {
      hsize_t file_size = 0;
      H5Fget_filesize(hid(), &file_size);
      if (info.offset == HADDR_UNDEF || info.offset + bytes > file_size)
        fail(ds + ": its data lies beyond the end of the file (" + std::to_string(file_size) + " bytes; truncated?)");
    }
    return;
  }
  if (info.layout != H5D_CHUNKED) fail(ds + " has a virtual or unknown storage layout (kvsim reads contiguous, compact or chunked)");
  if (info.chunk.size() != info.shape.size()) fail(ds + ": chunk rank does not match its rank " + std::to_string(info.shape.size()));
  hsize_t chunk_elems = 1, expected_chunks = 1;
  for (size_t i = 0; i < info.shape.size(); ++i) {
    const hsize_t c = info.chunk[i], dim = info.shape[i];
    if (c == 0 || c > std::max<hsize_t>(dim, 1))
      fail(ds + ": chunk dims " + dims_text(info.chunk) + " do not fit its shape " + dims_text(info.shape));
    chunk_elems *= c;
    expected_chunks *= (dim + c - 1) / c;
  }
  for (H5Z_filter_t f : info.filters) {
    if (f != H5Z_FILTER_DEFLATE && f != H5Z_FILTER_SHUFFLE && f != H5Z_FILTER_FLETCHER32)
      fail(ds + " uses the " + filter_name(f) + " filter (kvsim reads deflate, shuffle and fletcher32; re-export without it)");
    if (H5Zfilter_avail(f) <= 0) fail(ds + ": the " + filter_name(f) + " filter is not available in this HDF5 library");
  }
  if (n != 0 && info.allocated_chunks != expected_chunks)
    fail(ds + ": " + std::to_string(info.allocated_chunks) + " of its " + std::to_string(expected_chunks) +
         " chunks hold data (the rest would read as fill values; incomplete or corrupt)");
  if (info.filters.empty() && info.storage_bytes != info.allocated_chunks * chunk_elems * info.type_size)
    fail(ds + ": storage holds " + std::to_string(info.storage_bytes) + " bytes, " + std::to_string(info.allocated_chunks) +
         " chunks of " + dims_text(info.chunk) + " need " + std::to_string(info.allocated_chunks * chunk_elems * info.type_size));
  if (!info.filters.empty() && n != 0 && info.storage_bytes == 0) fail(ds + ": no data was ever written");
}

void File::create_dataset(const std::string& name, hid_t file_type, const std::vector<hsize_t>& shape,
                          const std::vector<hsize_t>& chunk, bool compress, int deflate_level) {
  Handle sp(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (!chunk.empty()) {
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (compress) {
      H5Pset_shuffle(dcpl.get());
      H5Pset_deflate(dcpl.get(), unsigned(deflate_level));
    }
  }
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Handle d(H5Dcreate2(hid(), name.c_str(), file_type, sp.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!d.valid()) fail("cannot create dataset '" + name + "'");
}

void File::read_slab(const std::string& name, hid_t mem_type, const std::vector<hsize_t>& offset,
                     const std::vector<hsize_t>& count, void* out) const {
  Handle d(H5Dopen2(hid(), name.c_str(), H5P_DEFAULT));
  if (!d.valid()) fail("missing dataset '" + name + "'");
  Handle fs(H5Dget_space(d.get()));
  if (H5Sget_simple_extent_ndims(fs.get()) != static_cast<int>(offset.size()))
    fail("dataset '" + name + "' has the wrong rank");
  if (H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, offset.data(), nullptr, count.data(), nullptr) < 0)
    fail("bad hyperslab on dataset '" + name + "'");
  Handle ms(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  if (H5Dread(d.get(), mem_type, ms.get(), fs.get(), H5P_DEFAULT, out) < 0)
    fail("cannot read dataset '" + name + "' (corrupt data or unsupported type)");
}

void File::write_slab(const std::string& name, hid_t mem_type, const std::vector<hsize_t>& offset,
                      const std::vector<hsize_t>& count, const void* data) {
  Handle d(H5Dopen2(hid(), name.c_str(), H5P_DEFAULT));
  if (!d.valid()) fail("missing dataset '" + name + "'");
  Handle fs(H5Dget_space(d.get()));
  if (H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, offset.data(), nullptr, count.data(), nullptr) < 0)
    fail("bad hyperslab on dataset '" + name + "'");
  Handle ms(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  if (H5Dwrite(d.get(), mem_type, ms.get(), fs.get(), H5P_DEFAULT, data) < 0)
    fail("cannot write dataset '" + name + "'");
}

namespace {
template <class T>
void write_vec(File& f, const std::string& name, const std::vector<T>& v, hid_t ftype, hid_t mtype) {
  std::vector<hsize_t> shape{v.size()};
  std::vector<hsize_t> chunk;
  if (v.size() > 4096) chunk = {4096};
  f.create_dataset(name, ftype, shape, chunk);
  if (!v.empty()) f.write_slab(name, mtype, {0}, shape, v.data());
}
}  // namespace

void File::write_vector(const std::string& name, const std::vector<double>& v) {
  write_vec(*this, name, v, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE);
}
void File::write_vector(const std::string& name, const std::vector<float>& v) {
  write_vec(*this, name, v, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
}
void File::write_vector(const std::string& name, const std::vector<int64_t>& v) {
  write_vec(*this, name, v, H5T_STD_I64LE, H5T_NATIVE_INT64);
}
void File::write_vector(const std::string& name, const std::vector<int32_t>& v) {
  write_vec(*this, name, v, H5T_STD_I32LE, H5T_NATIVE_INT32);
}

std::vector<int32_t> File::read_int_vector(const std::string& name) const {
  auto info = dataset_info(name);
  if (info.shape.size() != 1) fail("dataset '" + name + "' must be 1-D");
  if (info.type_class != H5T_INTEGER) fail("dataset '" + name + "' must hold integers");
  check_storage(name, info);
  std::vector<int32_t> v(info.shape[0]);
  if (!v.empty()) read_slab(name, H5T_NATIVE_INT32, {0}, {info.shape[0]}, v.data());
  return v;
}

std::vector<double> File::read_double_vector(const std::string& name) const {
  auto info = dataset_info(name);
  if (info.shape.size() != 1) fail("dataset '" + name + "' must be 1-D");
  if (info.type_class != H5T_FLOAT && info.type_class != H5T_INTEGER) fail("dataset '" + name + "' must hold numbers");
  check_storage(name, info);
  std::vector<double> v(info.shape[0]);
  if (!v.empty()) read_slab(name, H5T_NATIVE_DOUBLE, {0}, {info.shape[0]}, v.data());
  return v;
}

std::vector<std::string> File::list(const std::string& group) const {
  std::vector<std::string> names;
  Handle g(H5Gopen2(hid(), group.c_str(), H5P_DEFAULT));
  if (!g.valid()) fail("missing group '" + group + "'");
  H5G_info_t info;
  H5Gget_info(g.get(), &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::vector<char> buf(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, buf.data(), buf.size(), H5P_DEFAULT);
    names.emplace_back(buf.data());
  }
  return names;
}

void File::flush() { H5Fflush(hid(), H5F_SCOPE_GLOBAL); }

}  // namespace kvsim::h5
