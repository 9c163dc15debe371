#include "kvsim/io/recording.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

namespace kvsim {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

const char* tensor_name(Tensor t) {
  switch (t) {
    case Tensor::q: return "q";
    case Tensor::k: return "k";
    case Tensor::v: return "v";
    case Tensor::attn: return "attn";
  }
  return "?";
}

std::string layer_dataset(int layer, Tensor which) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/layer_%03d/%s", layer, tensor_name(which));
  return buf;
}

namespace {
/// An element type in words for errors: "float64", "int16 (unsigned)", "string", ….
std::string type_text(const h5::DatasetInfo& i) {
  const std::string bits = std::to_string(8 * i.type_size);
  switch (i.type_class) {
    case H5T_FLOAT:
      return (i.is_ieee_float(32) || i.is_ieee_float(16) || (i.type_size == 8 && i.mant_bits == 52) ? "float" : "non-IEEE float") + bits;
    case H5T_INTEGER: return std::string(i.is_signed ? "int" : "uint") + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    default: return "class " + std::to_string(int(i.type_class)) + ", " + bits + " bits";
  }
}

int positive_int_attr(const h5::File& f, const char* name) {
  int64_t v = f.attr_int(name);
  if (v <= 0 || v > (1LL << 31)) throw Error(f.path() + ": attribute '" + name + "' must be a positive integer, got " + std::to_string(v));
  return static_cast<int>(v);
}
bool in_probe_child = false;

constexpr int kProbeSeconds = 20;

/// libhdf5 (1.10) trusts some on-disk sizes and links: a damaged global heap makes H5Aread of a
/// variable-length string attribute copy past its buffer and crash the process, other damage sends
/// it into an endless loop or a huge allocation (all found by tests/fuzz/fuzz_inputs.py; kept in
/// tests/fuzz/fuzz_corpus). So a recording's metadata is first read — every attribute and dataset check
/// of the constructor below — in a forked child with its output discarded, at most kProbeSeconds of
/// CPU and (outside sanitizer builds) 4 GiB of address space. A child that dies or runs out of time
/// marks the file as damaged; a child that finds a schema error passes its message back through a
/// pipe; only a child that finds nothing wrong lets the parent read the file. Called with the HDF5
/// mutex held, so no other thread is inside libhdf5 when the process forks.
void probe_metadata(const std::string& path) {
  int fds[2];
  if (pipe(fds) != 0) return;  // cannot probe: read it directly, as before
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return;
  }
  if (pid == 0) {
    close(fds[0]);
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, 1);
      dup2(null, 2);
    }
    const rlimit cpu{kProbeSeconds, kProbeSeconds + 1};
    setrlimit(RLIMIT_CPU, &cpu);
    alarm(3 * kProbeSeconds);  // wall clock, for a child blocked in I/O
#ifndef __SANITIZE_ADDRESS__
    const rlimit as{rlim_t(4) << 30, rlim_t(4) << 30};
    setrlimit(RLIMIT_AS, &as);
#endif
    in_probe_child = true;
    try {
      RecordingReader r(path);
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      if (write(fds[1], msg.data(), msg.size()) < 0) _exit(4);
      _exit(3);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    msg.append(buf, size_t(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3 && !msg.empty()) throw Error(msg);
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  throw Error(path + ": damaged HDF5 metadata (libhdf5 " +
              (sig == SIGXCPU || sig == SIGALRM ? "did not finish reading it in " + std::to_string(kProbeSeconds) + " s"
               : sig != 0                       ? "crashed reading it, signal " + std::to_string(sig)
                                                : "failed reading it, status " + std::to_string(WEXITSTATUS(status))) +
              "); re-export the recording");
}

/// The optional root attributes (docs/recordings.md, the schema): rope_theta, layer_windows, subset_layers,
/// rope_pairs.
void read_optional_attrs(const h5::File& f, const std::string& path, RecordingMeta& meta) {
  if (f.has_attr("rope_theta")) {
    meta.rope_theta = f.attr_double("rope_theta");
    if (!std::isfinite(meta.rope_theta) || meta.rope_theta <= 1)
      throw Error(path + ": attribute 'rope_theta' must be a finite number > 1");
  }
  if (f.has_attr("layer_windows")) {
    meta.layer_windows = f.attr_ints("layer_windows");
    if (int(meta.layer_windows.size()) != meta.n_layers)
      throw Error(path + ": attribute 'layer_windows' has " + std::to_string(meta.layer_windows.size()) + " entries for " +
                  std::to_string(meta.n_layers) + " layers");
    for (int64_t w : meta.layer_windows)
      if (w < 0) throw Error(path + ": attribute 'layer_windows' holds a negative window " + std::to_string(w));
  }
  if (f.has_attr("subset_layers")) {
    meta.subset_layers = f.attr_ints("subset_layers");
    if (int(meta.subset_layers.size()) != meta.n_layers)
      throw Error(path + ": attribute 'subset_layers' has " + std::to_string(meta.subset_layers.size()) + " entries for " +
                  std::to_string(meta.n_layers) + " layers");
    if (f.has_attr("model_n_layers")) {
      const int64_t total = f.attr_int("model_n_layers");
      if (total < meta.n_layers || total > 1024)
        throw Error(path + ": attribute 'model_n_layers' = " + std::to_string(total) + " is below n_layers or above 1024");
      meta.model_n_layers = int(total);
    }
    for (int64_t l : meta.subset_layers)
      if (l < 0 || (meta.model_n_layers > 0 && l >= meta.model_n_layers))
        throw Error(path + ": attribute 'subset_layers' holds layer " + std::to_string(l) + ", outside the model's layers");
  }
  if (f.has_attr("rope_pairs")) {
    const std::string pairs = f.attr_string("rope_pairs");
    if (pairs.rfind("halves", 0) != 0 && pairs.rfind("adjacent", 0) != 0)
      throw Error(path + ": attribute 'rope_pairs' = '" + pairs + "' is neither 'halves …' nor 'adjacent …'");
    meta.rope_halves = pairs.rfind("halves", 0) == 0;
  }
}
}  // namespace

RecordingReader::RecordingReader(const std::string& path) : path_(path) {
  // The forked probe inherits the mutex locked by its parent's thread: it must not lock it again.
  std::unique_lock<std::mutex> lock(hdf5_mutex(), std::defer_lock);
  if (!in_probe_child) {
    lock.lock();
    probe_metadata(path);
  }
  file_ = std::make_unique<h5::File>(h5::File::open_read(path));
  auto& f = *file_;
  int64_t schema = f.attr_int("kvsim_schema");
  if (schema != 1) throw Error(path + ": unsupported kvsim_schema " + std::to_string(schema) + " (this kvsim reads 1)");
  meta_.model = f.has_attr("model") ? f.attr_string("model") : "";
  meta_.source = f.has_attr("source") ? f.attr_string("source") : "";
  meta_.rope = f.has_attr("rope") ? f.attr_string("rope") : "none";
  meta_.n_layers = positive_int_attr(f, "n_layers");
  meta_.n_heads = positive_int_attr(f, "n_heads");
  meta_.n_kv_heads = positive_int_attr(f, "n_kv_heads");
  meta_.head_dim = positive_int_attr(f, "head_dim");
  int64_t n = f.attr_int("n_tokens");
  if (n <= 0) throw Error(path + ": attribute 'n_tokens' must be positive, got " + std::to_string(n) + " (an empty recording cannot be replayed)");
  meta_.n_tokens = n;
  if (meta_.n_heads % meta_.n_kv_heads != 0)
    throw Error(path + ": n_heads (" + std::to_string(meta_.n_heads) + ") is not a multiple of n_kv_heads (" +
                std::to_string(meta_.n_kv_heads) + ")");
  meta_.softmax_scale = f.has_attr("softmax_scale") ? f.attr_double("softmax_scale") : 1.0 / std::sqrt(double(meta_.head_dim));
  if (!std::isfinite(meta_.softmax_scale) || meta_.softmax_scale <= 0)
    throw Error(path + ": attribute 'softmax_scale' must be a positive finite number");
  read_optional_attrs(f, path, meta_);

  for (int l = 0; l < meta_.n_layers; ++l) {
    for (Tensor t : {Tensor::q, Tensor::k, Tensor::v, Tensor::attn}) {
      std::string ds = layer_dataset(l, t);
      if (t == Tensor::attn && !f.exists(ds)) continue;
      auto info = f.dataset_info(ds);  // throws "missing dataset" naming it
      hsize_t heads = (t == Tensor::q || t == Tensor::attn) ? meta_.n_heads : meta_.n_kv_heads;
      std::ostringstream want;
      want << "[" << heads << ", " << n << ", " << meta_.head_dim << "]";
      if (info.shape.size() != 3) throw Error(path + ": dataset '" + ds + "' must have rank 3 " + want.str() + ", has rank " + std::to_string(info.shape.size()));
      if (info.shape[0] != heads || info.shape[1] != hsize_t(n) || info.shape[2] != hsize_t(meta_.head_dim)) {
        std::ostringstream got;
        got << "[" << info.shape[0] << ", " << info.shape[1] << ", " << info.shape[2] << "]";
        throw Error(path + ": dataset '" + ds + "' has shape " + got.str() + ", expected " + want.str() +
                    " from the root attributes (n_heads/n_kv_heads, n_tokens, head_dim)");
      }
      if (!info.is_ieee_float(32) && !info.is_ieee_float(16))
        throw Error(path + ": dataset '" + ds + "' has element type " + type_text(info) +
                    "; the schema allows IEEE float32 or float16 only");
      f.check_storage(ds, info);
    }
  }
  if (f.exists("/tokens")) {
    auto info = f.dataset_info("/tokens");
    if (info.shape.size() != 1 || info.shape[0] != hsize_t(n))
      throw Error(path + ": dataset '/tokens' must have shape [" + std::to_string(n) + "]");
    if (info.type_class != H5T_INTEGER || info.type_size != 4 || !info.is_signed)
      throw Error(path + ": dataset '/tokens' has element type " + type_text(info) + "; the schema allows int32 only");
    f.check_storage("/tokens", info);
  }
  if (f.exists("/cross_entropy")) {
    auto info = f.dataset_info("/cross_entropy");
    if (info.shape.size() != 1 || info.shape[0] > hsize_t(n))
      throw Error(path + ": dataset '/cross_entropy' must be 1-D with at most n_tokens entries");
    if (!info.is_ieee_float(32))
      throw Error(path + ": dataset '/cross_entropy' has element type " + type_text(info) + "; the schema allows float32 only");
    f.check_storage("/cross_entropy", info);
  }
}

bool RecordingReader::has(int layer, Tensor which) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  return file_->exists(layer_dataset(layer, which));
}

MatF RecordingReader::read(int layer, Tensor which, int head) const {
  std::string ds = layer_dataset(layer, which);
  int heads = (which == Tensor::q || which == Tensor::attn) ? meta_.n_heads : meta_.n_kv_heads;
  if (layer < 0 || layer >= meta_.n_layers) throw Error(path_ + ": layer " + std::to_string(layer) + " out of range [0, " + std::to_string(meta_.n_layers) + ")");
  if (head < 0 || head >= heads) throw Error(path_ + ": " + ds + ": head " + std::to_string(head) + " out of range [0, " + std::to_string(heads) + ")");
  MatF m(meta_.n_tokens, meta_.head_dim);
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    file_->read_slab(ds, H5T_NATIVE_FLOAT, {hsize_t(head), 0, 0}, {1, hsize_t(meta_.n_tokens), hsize_t(meta_.head_dim)}, m.data());
  }
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j)
      if (!std::isfinite(m(i, j)))
        throw Error(path_ + ": dataset '" + ds + "' has a non-finite value (" + std::to_string(m(i, j)) + ") at index [" +
                    std::to_string(head) + ", " + std::to_string(i) + ", " + std::to_string(j) + "]");
  return m;
}

std::vector<int32_t> RecordingReader::tokens() const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!file_->exists("/tokens")) return {};
  return file_->read_int_vector("/tokens");
}

std::vector<double> RecordingReader::cross_entropy() const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!file_->exists("/cross_entropy")) return {};
  return file_->read_double_vector("/cross_entropy");
}

RecordingWriter::RecordingWriter(const std::string& path, const RecordingMeta& meta, bool with_attn, int deflate)
    : path_(path), tmp_(path + ".tmp"), meta_(meta) {
  if (meta.n_layers <= 0 || meta.n_heads <= 0 || meta.n_kv_heads <= 0 || meta.head_dim <= 0 || meta.n_tokens <= 0)
    throw Error(path + ": cannot write a recording with empty dimensions");
  if (meta.n_heads % meta.n_kv_heads) throw Error(path + ": n_heads must be a multiple of n_kv_heads");
  if (deflate < 0 || deflate > 9) throw Error(path + ": deflate level " + std::to_string(deflate) + " is not 0-9");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {  // the output folder is created (a fresh clone has no results/recordings/)
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error(path + ": cannot create the folder " + dir.string() + ": " + ec.message());
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_ = std::make_unique<h5::File>(h5::File::create(tmp_));
  auto& f = *file_;
  f.set_attr("/", "kvsim_schema", int64_t(1));
  f.set_attr("/", "model", meta.model);
  f.set_attr("/", "source", meta.source);
  f.set_attr("/", "rope", meta.rope);
  f.set_attr("/", "n_layers", int64_t(meta.n_layers));
  f.set_attr("/", "n_heads", int64_t(meta.n_heads));
  f.set_attr("/", "n_kv_heads", int64_t(meta.n_kv_heads));
  f.set_attr("/", "head_dim", int64_t(meta.head_dim));
  f.set_attr("/", "n_tokens", int64_t(meta.n_tokens));
  double scale = meta.softmax_scale > 0 ? meta.softmax_scale : 1.0 / std::sqrt(double(meta.head_dim));
  f.set_attr("/", "softmax_scale", scale);
  if (meta.rope_theta > 0) {
    f.set_attr("/", "rope_theta", meta.rope_theta);
    f.set_attr("/", "rope_pairs", std::string(meta.rope_halves ? "halves (k, k + head_dim/2): Hugging Face channel order"
                                                               : "adjacent (2k, 2k + 1): llama2.c channel order"));
  }
  if (!meta.layer_windows.empty()) f.set_attr("/", "layer_windows", meta.layer_windows);
  hsize_t n = meta.n_tokens, d = meta.head_dim;
  std::vector<hsize_t> chunk{1, std::min<hsize_t>(n, 1024), d};
  for (int l = 0; l < meta.n_layers; ++l) {
    f.create_dataset(layer_dataset(l, Tensor::q), H5T_IEEE_F32LE, {hsize_t(meta.n_heads), n, d}, chunk, deflate > 0, deflate);
    f.create_dataset(layer_dataset(l, Tensor::k), H5T_IEEE_F32LE, {hsize_t(meta.n_kv_heads), n, d}, chunk, deflate > 0, deflate);
    f.create_dataset(layer_dataset(l, Tensor::v), H5T_IEEE_F32LE, {hsize_t(meta.n_kv_heads), n, d}, chunk, deflate > 0, deflate);
    if (with_attn) f.create_dataset(layer_dataset(l, Tensor::attn), H5T_IEEE_F32LE, {hsize_t(meta.n_heads), n, d}, chunk, deflate > 0, deflate);
  }
}

RecordingWriter::~RecordingWriter() {
  if (!done_) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    file_.reset();
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

void RecordingWriter::write(int layer, Tensor which, int head, const MatF& m) {
  if (m.rows() != meta_.n_tokens || m.cols() != meta_.head_dim)
    throw Error(path_ + ": write of " + layer_dataset(layer, which) + " has the wrong shape");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->write_slab(layer_dataset(layer, which), H5T_NATIVE_FLOAT, {hsize_t(head), 0, 0},
                    {1, hsize_t(m.rows()), hsize_t(m.cols())}, m.data());
}

void RecordingWriter::write_tokens(const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->write_vector("/tokens", tokens);
}

void RecordingWriter::write_cross_entropy(const std::vector<float>& ce) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->write_vector("/cross_entropy", ce);
}

void RecordingWriter::set_attr(const std::string& name, double v) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->set_attr("/", name, v);
}
void RecordingWriter::set_attr(const std::string& name, int64_t v) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->set_attr("/", name, v);
}
void RecordingWriter::set_attr(const std::string& name, const std::vector<int64_t>& v) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->set_attr("/", name, v);
}
void RecordingWriter::set_attr(const std::string& name, const std::string& v) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->set_attr("/", name, v);
}

void RecordingWriter::finish() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  file_->flush();
  file_.reset();
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) throw Error(path_ + ": cannot move finished recording into place: " + ec.message());
  done_ = true;
}

}  // namespace kvsim
