// Checkpointed cells (include/kvsim/io/cell_checkpoint.hpp): durable per-cell fragments and the manifest
// that --resume compares.
#include "kvsim/io/cell_checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "kvsim/core/error.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/io/provenance.hpp"

namespace kvsim {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'C', 'E', 'L', 'L', '1'};
static_assert(std::is_trivially_copyable_v<MetricRow>, "fragments store MetricRow bytes");

/// FNV-1a over the fragment's bytes: a damaged file is recomputed, never read as numbers.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream o;
  o << in.rdbuf();
  return o.str();
}

/// Writes `bytes` to `path` durably: PATH.tmp, fsync, rename, fsync of the folder.
void write_durably(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(tmp + ": cannot write checkpoint: " + std::strerror(errno));
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw Error(tmp + ": checkpoint write failed: " + why);
    }
    off += size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw Error(tmp + ": checkpoint fsync failed: " + std::strerror(errno));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(path + ": cannot move checkpoint into place: " + ec.message());
  const int dfd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

std::string manifest_difference(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  std::string la, lb;
  for (;;) {
    const bool ga = bool(std::getline(x, la)), gb = bool(std::getline(y, lb));
    if (!ga && !gb) return "identical";
    if (!ga) la = "(end)";
    if (!gb) lb = "(end)";
    if (la != lb) return "the checkpoint has '" + la + "', this run '" + lb + "'";
  }
}

std::string checkpoint_dir(const std::string& out_dir) { return (fs::path(out_dir) / ".kvsim_partial").string(); }

std::string checkpoint_manifest(const Experiment& ex, const RecordingMeta& meta) {
  std::ostringstream o;
  o << "kvsim_version = " << kvsim_version() << "\ngit_commit = " << kvsim_git_commit() << "\n";
  if (ex.data.synthetic) {
    o << "recording = synthetic (named by the resolved config below)\n";
  } else {
    std::error_code ec;
    const fs::path p = fs::absolute(ex.data.path, ec);
    const auto bytes = fs::file_size(p, ec);
    const auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
    o << "recording = " << p.string() << "\nrecording_bytes = " << bytes << "\nrecording_mtime = " << mtime << "\n";
  }
  o << "schema = n_layers " << meta.n_layers << ", n_heads " << meta.n_heads << ", n_kv_heads " << meta.n_kv_heads
    << ", head_dim " << meta.head_dim << ", n_tokens " << meta.n_tokens << ", softmax_scale " << meta.softmax_scale
    << ", rope " << meta.rope << ", model " << meta.model << "\n";
  o << "metric_row_bytes = " << sizeof(MetricRow) << "\n[resolved config]\n" << ex.resolved_text;
  return o.str();
}

CellCheckpoint::CellCheckpoint(const std::string& out_dir, const std::string& manifest, size_t cells, ResumeMode mode)
    : dir_(checkpoint_dir(out_dir)), done_(cells, false) {
  std::error_code ec;
  const std::string mpath = (fs::path(dir_) / "manifest.txt").string();
  if (fs::exists(dir_)) {
    if (mode.resume) {
      const std::string old = read_file(mpath);
      if (old != manifest)
        throw Error(out_dir + ": --resume: the unfinished run there differs from this one: " + manifest_difference(old, manifest) +
                    " (start over with --force)");
      for (size_t c = 0; c < cells; ++c) resumed_ = (done_[c] = fs::exists(cell_path(c))) || resumed_;
      return;
    }
    if (!mode.force)
      throw Error(out_dir + " holds an unfinished run (" + dir_ + "): continue it with --resume, or discard it with --force");
    fs::remove_all(dir_, ec);
    if (ec) throw Error(dir_ + ": cannot remove the old checkpoint: " + ec.message());
  }
  fs::create_directories(dir_, ec);
  if (ec) throw Error(dir_ + ": cannot create the checkpoint folder: " + ec.message());
  write_durably(mpath, manifest);
}

size_t CellCheckpoint::done_count() const {
  size_t n = 0;
  for (bool d : done_) n += d;
  return n;
}

void CellCheckpoint::forget(size_t cell) {
  std::error_code ec;
  fs::remove(cell_path(cell), ec);
  done_[cell] = false;
}

std::string CellCheckpoint::cell_path(size_t cell) const {
  char name[32];
  std::snprintf(name, sizeof name, "cell_%06zu.rows", cell);
  return (fs::path(dir_) / name).string();
}

void CellCheckpoint::save(size_t cell, const std::vector<std::vector<MetricRow>>& rows) const {
  std::string b(kMagic, sizeof kMagic);
  auto put = [&](uint64_t v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(cell);
  put(rows.size());
  for (const auto& rp : rows) {
    put(rp.size());
    b.append(reinterpret_cast<const char*>(rp.data()), rp.size() * sizeof(MetricRow));
  }
  put(fnv1a(b));
  write_durably(cell_path(cell), b);
}

std::vector<std::vector<MetricRow>> CellCheckpoint::load(size_t cell, size_t n_policies) const {
  const std::string path = cell_path(cell);
  const std::string b = read_file(path);
  auto bad = [&](const std::string& why) { return Error(path + ": damaged checkpoint fragment (" + why + "); delete it to recompute the cell"); };
  if (b.size() < sizeof kMagic + 3 * 8 || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) throw bad("bad header");
  uint64_t sum;
  std::memcpy(&sum, b.data() + b.size() - 8, 8);
  if (fnv1a(b.substr(0, b.size() - 8)) != sum) throw bad("checksum mismatch");
  size_t off = sizeof kMagic;
  auto get = [&]() {
    uint64_t v;
    if (off + 8 > b.size() - 8) throw bad("truncated");
    std::memcpy(&v, b.data() + off, 8);
    off += 8;
    return v;
  };
  if (get() != cell) throw bad("another cell's rows");
  if (get() != n_policies) throw bad("another number of policies");
  std::vector<std::vector<MetricRow>> rows(n_policies);
  for (auto& rp : rows) {
    const uint64_t n = get();
    if (n > (b.size() - off) / sizeof(MetricRow)) throw bad("truncated rows");
    rp.resize(n);
    std::memcpy(static_cast<void*>(rp.data()), b.data() + off, n * sizeof(MetricRow));
    off += n * sizeof(MetricRow);
  }
  if (off != b.size() - 8) throw bad("trailing bytes");
  return rows;
}

void CellCheckpoint::remove() const {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace kvsim
