// kvsim: provenance of a result — which kvsim built it and from which input files.
#pragma once
#include <cstdint>
#include <string>

namespace kvsim {

/// kvsim's version (CMake project version).
std::string kvsim_version();
/// The git commit kvsim was configured from ("unknown" outside a git checkout), with "-dirty" when the
/// work tree had changes at configure time.
std::string kvsim_git_commit();

/// The `KVSIM_*` environment variables set in this process, sorted by name, as "NAME=value" lines
/// (empty when none): the switches outside a config that choose a run's schedule, kernels or files
/// (KVSIM_CUDA_LAYER_BATCH, KVSIM_CUDA_EXACT, KVSIM_CUDA_DEADLINE, KVSIM_SHARED_DATA, ... : docs/cli.md).
/// results.h5 keeps it as the root attribute `runtime_env`, so a result says how it was produced.
std::string runtime_environment();

/// A file's absolute path, size in bytes and SHA-1 of its contents (OpenSSL; hex, as `sha1sum`).
struct FileFingerprint {
  std::string path;
  int64_t bytes = 0;
  std::string sha1;
};
/// Throws kvsim::Error naming the file when it cannot be read.
FileFingerprint fingerprint_file(const std::string& path);

}  // namespace kvsim
