// kvsim: checkpointed cells — a run's finished (layer, KV head) cells made durable one by one, so a
// killed run (kill -9, pre-emption, OOM, node failure) continues with `kvsim run --resume` and
// recomputes only the cells that had not finished (docs/cli.md "Resuming a killed run").
//
// Layout, in the output folder while a run is unfinished:
//   .kvsim_partial/manifest.txt       what the run is: kvsim version and git commit, the recording's
//                                     identity (absolute path, size, mtime, schema attributes; a
//                                     synthetic stream is named by its config) and the resolved config.
//                                     --resume refuses a different manifest, naming the first line
//                                     that differs. A finished results.h5 keeps it as the attribute
//                                     `run_manifest` (a multi-sequence --resume skips finished sequences).
//   .kvsim_partial/cell_NNNNNN.rows   one finished cell's rows for every policy (binary, with a
//                                     checksum), written to a temporary name, fsync'ed and renamed:
//                                     a file under this name is always complete.
// A finished run removes .kvsim_partial; its results (results.h5, summary.csv, cells.csv) replace
// any earlier ones atomically. A run that fails with an error (not killed) removes the checkpoint it
// started when no cell had finished, and keeps it otherwise.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "kvsim/io/results.hpp"

namespace kvsim {

/// How a run treats an output folder that holds an unfinished run's checkpoint.
struct ResumeMode {
  bool resume = false;  ///< continue it (the manifest must match)
  bool force = false;   ///< discard it and start over
};

class CellCheckpoint {
 public:
  /// Opens (or starts) the checkpoint of `out_dir` for a run described by `manifest` with `cells`
  /// cells. Throws kvsim::Error when the folder holds an unfinished run and neither --resume nor
  /// --force is given, or when --resume finds a different manifest (naming the first differing line).
  CellCheckpoint(const std::string& out_dir, const std::string& manifest, size_t cells, ResumeMode mode);
  /// Cells already finished (resume).
  const std::vector<bool>& done() const { return done_; }
  size_t done_count() const;
  /// True when the checkpoint held finished cells when it was opened (a --resume with progress).
  bool resumed() const { return resumed_; }
  /// Marks a cell unfinished and deletes its fragment (a damaged fragment is recomputed).
  void forget(size_t cell);
  /// A finished cell's rows per policy; throws kvsim::Error naming the file when it is damaged.
  std::vector<std::vector<MetricRow>> load(size_t cell, size_t n_policies) const;
  /// Makes cell `cell`'s rows durable (temporary file, fsync, rename). Thread-safe for distinct cells.
  void save(size_t cell, const std::vector<std::vector<MetricRow>>& rows) const;
  /// Removes the checkpoint folder (after the results are in place).
  void remove() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<bool> done_;
  bool resumed_ = false;
  std::string cell_path(size_t cell) const;
};

/// The manifest text of a run: kvsim version and commit, the recording's identity and the resolved
/// config (what --resume compares).
std::string checkpoint_manifest(const Experiment& ex, const RecordingMeta& meta);

/// Where two manifests differ: "the checkpoint has '<line>', this run '<line>'" (first differing line).
std::string manifest_difference(const std::string& checkpoint, const std::string& run);

/// The checkpoint folder of an output folder (`out_dir`/.kvsim_partial).
std::string checkpoint_dir(const std::string& out_dir);

}  // namespace kvsim
