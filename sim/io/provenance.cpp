#include "kvsim/io/provenance.hpp"

#include <boost/uuid/detail/sha1.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "kvsim/core/error.hpp"

#ifndef KVSIM_VERSION
#define KVSIM_VERSION "unknown"
#endif
#ifndef KVSIM_GIT_COMMIT
#define KVSIM_GIT_COMMIT "unknown"
#endif

namespace kvsim {

std::string kvsim_version() { return KVSIM_VERSION; }
std::string kvsim_git_commit() { return KVSIM_GIT_COMMIT; }

FileFingerprint fingerprint_file(const std::string& path) {
  namespace fs = std::filesystem;
  FileFingerprint f;
  std::error_code ec;
  f.path = fs::absolute(path, ec).lexically_normal().string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read (for its content hash)");
  boost::uuids::detail::sha1 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) {
      h.process_bytes(buf.data(), size_t(got));
      f.bytes += got;
    }
  }
  boost::uuids::detail::sha1::digest_type d;
  h.get_digest(d);
  char hex[48];
  for (int i = 0; i < 5; ++i) std::snprintf(hex + 8 * i, 9, "%08x", unsigned(d[i]));
  f.sha1 = hex;
  return f;
}

}  // namespace kvsim
