// ResultSpill: a run's rows streamed to results.h5 cell by cell (include/kvsim/io/results.hpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <atomic>
#include <optional>

#include "kvsim/core/error.hpp"
#include "kvsim/io/cell_checkpoint.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/io/results.hpp"
#include "results_detail.hpp"

namespace kvsim {

using namespace results_detail;

struct ResultSpill::State {
  std::filesystem::path dir;
  bool made_dir = false;
  const Experiment& ex;
  /// The three output files under their final names and the temporary names they are written to
  /// (renamed only when the run has succeeded), indexed by the k*File constants.
  std::vector<std::string> finals, tmps;
  static constexpr size_t kResultsFile = 0, kSummaryFile = 1, kCellsFile = 2;
  std::unique_ptr<h5::File> f;
  std::vector<size_t> rows_per_cell, offset;
  size_t total = 0;
  std::vector<std::vector<std::string>> cell_lines;  // [cell][policy] cells.csv lines
  std::vector<MetricColumn> metrics;
  std::vector<std::string> keys;  // parameter columns (param_keys of the policies)
  std::vector<std::vector<Stat>> overall;  // [policy][metric] over all rows, after finish()
  bool finished = false;
  std::optional<ResumeMode> mode;          // checkpointing on (the CLI)
  std::unique_ptr<CellCheckpoint> ckpt;
  std::string manifest;
  std::atomic<size_t> saved{0};            // cells this process made durable
  State(const std::string& out_dir, const Experiment& e) : dir(out_dir), ex(e), keys(param_keys(e.policies)) {}
  void store(size_t cell, const std::vector<std::vector<MetricRow>>& rows);
};

ResultSpill::ResultSpill(const std::string& out_dir, const Experiment& ex, const ResumeMode* checkpoint)
    : st_(std::make_unique<State>(out_dir, ex)) {
  if (checkpoint) st_->mode = *checkpoint;
  for (const char* name : {"results.h5", "summary.csv", "cells.csv"}) {  // kResultsFile, kSummaryFile, kCellsFile
    st_->finals.push_back((st_->dir / name).string());
    st_->tmps.push_back(st_->finals.back() + ".tmp");
  }
}

ResultSpill::~ResultSpill() {
  if (st_->finished) return;
  std::error_code ec;
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    st_->f.reset();
  }
  for (const auto& t : st_->tmps) std::filesystem::remove(t, ec);
  // An error (not a kill): the checkpoint stays when it holds finished cells, to be resumed.
  if (st_->ckpt && !st_->ckpt->resumed() && st_->saved == 0) st_->ckpt->remove();
  if (st_->made_dir) std::filesystem::remove(st_->dir, ec);  // only if empty
}

// After begin(), the checkpoint's finished cells are exactly those whose rows were taken from it
// (a damaged fragment is forgotten there).
bool ResultSpill::cell_done(size_t cell) const { return st_->ckpt && cell < st_->ckpt->done().size() && st_->ckpt->done()[cell]; }

size_t ResultSpill::cells_resumed() const { return st_->ckpt ? st_->ckpt->done_count() : 0; }

void ResultSpill::begin(const std::vector<size_t>& rows_per_cell, const std::vector<MetricColumn>& metrics,
                        const RecordingMeta* meta) {
  st_->metrics = metrics;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(st_->dir)) {
    fs::create_directories(st_->dir, ec);
    if (ec) throw Error(st_->dir.string() + ": cannot create output folder: " + ec.message());
    st_->made_dir = true;
  }
  st_->rows_per_cell = rows_per_cell;
  st_->offset.assign(rows_per_cell.size(), 0);
  for (size_t c = 0; c < rows_per_cell.size(); ++c) {
    st_->offset[c] = st_->total;
    st_->total += rows_per_cell[c];
  }
  st_->cell_lines.assign(rows_per_cell.size(), std::vector<std::string>(st_->ex.policies.size()));
  if (st_->mode && meta) {
    st_->manifest = checkpoint_manifest(st_->ex, *meta);
    st_->ckpt = std::make_unique<CellCheckpoint>(st_->dir.string(), st_->manifest, rows_per_cell.size(), *st_->mode);
  }
  create_datasets();
  if (!st_->ckpt) return;
  for (size_t c = 0; c < rows_per_cell.size(); ++c) {
    if (!st_->ckpt->done()[c]) continue;
    std::vector<std::vector<MetricRow>> rows;
    try {
      rows = st_->ckpt->load(c, st_->ex.policies.size());
    } catch (const Error&) {
      st_->ckpt->forget(c);  // damaged: recompute it
      continue;
    }
    bool sized = true;
    for (const auto& rp : rows) sized = sized && rp.size() == rows_per_cell[c];
    if (!sized) {
      st_->ckpt->forget(c);
      continue;
    }
    st_->store(c, rows);
  }
}

void ResultSpill::create_datasets() {
  const std::vector<size_t>& rows_per_cell = st_->rows_per_cell;
  const std::vector<MetricColumn>& metrics = st_->metrics;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  st_->f = std::make_unique<h5::File>(h5::File::create(st_->tmps[State::kResultsFile]));
  if (st_->total > size_t(UINT32_MAX)) throw Error("results: more than 2^32 metric rows per policy");
  // One chunk per cell's rows. When every cell yields the same number of rows (the usual case), each
  // cell writes whole chunks at chunk-aligned offsets, so chunks are compressed (shuffle + deflate)
  // once and never read back and rewritten; otherwise chunks straddle cells and stay uncompressed
  // (compressed 64K-row chunks that straddled cells made streaming 4x slower).
  size_t per = 1;
  bool equal = !rows_per_cell.empty();
  for (size_t c : rows_per_cell) {
    per = std::max(per, c);
    equal = equal && c == rows_per_cell.front() && c > 0;
  }
  const hsize_t chunk = hsize_t(std::min<size_t>(per, std::max<size_t>(st_->total, 1)));
  const bool compress = equal;
  for (size_t p = 0; p < st_->ex.policies.size(); ++p) {
    const std::string g = policy_group(p);
    write_policy_group(*st_->f, g, st_->ex.policies[p]);
    st_->f->create_dataset(g + "/layer", H5T_STD_I32LE, {hsize_t(st_->total)}, {chunk}, compress);
    st_->f->create_dataset(g + "/head", H5T_STD_I32LE, {hsize_t(st_->total)}, {chunk}, compress);
    st_->f->create_dataset(g + "/step", H5T_STD_I64LE, {hsize_t(st_->total)}, {chunk}, compress);
    for (const auto& m : metrics) {
      st_->f->create_dataset(g + "/" + m.name, H5T_IEEE_F64LE, {hsize_t(st_->total)}, {chunk}, compress);
      describe_metric(*st_->f, g, m);
    }
  }
}

void ResultSpill::write_cell(size_t cell, std::vector<std::vector<MetricRow>>&& rows) {
  if (!st_->f || cell >= st_->rows_per_cell.size() || rows.size() != st_->ex.policies.size())
    throw Error("results: write_cell before begin() or for an unknown cell");
  for (size_t p = 0; p < rows.size(); ++p)
    if (rows[p].size() != st_->rows_per_cell[cell])
      throw Error("results: cell " + std::to_string(cell) + " produced " + std::to_string(rows[p].size()) +
                  " rows, expected " + std::to_string(st_->rows_per_cell[cell]));
  if (st_->ckpt) {
    st_->ckpt->save(cell, rows);  // durable first: a kill from here on keeps this cell
    ++st_->saved;
  }
  st_->store(cell, rows);
}

void ResultSpill::State::store(size_t cell, const std::vector<std::vector<MetricRow>>& rows) {
  for (size_t p = 0; p < rows.size(); ++p) {
    const auto& rp = rows[p];
    // cells.csv lines of this cell: its (layer, head) groups in order of first appearance.
    std::vector<std::string> order;
    std::map<std::string, std::vector<size_t>> groups;
    for (size_t i = 0; i < rp.size(); ++i) {
      auto k = std::to_string(rp[i].layer) + "," + std::to_string(rp[i].head);
      auto [it, fresh] = groups.try_emplace(k);
      if (fresh) order.push_back(k);
      it->second.push_back(i);
    }
    std::ostringstream lines;
    for (const auto& g : order)
      stat_lines(lines, ex.policies[p], g, metrics, keys, [&](size_t m) {
        std::vector<double> v;
        for (size_t i : groups[g]) v.push_back(rp[i][metrics[m].index]);
        return summarize(std::move(v));
      });
    cell_lines[cell][p] = lines.str();
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  const hsize_t off = offset[cell], cnt = rows_per_cell[cell];
  if (cnt == 0) return;
  for (size_t p = 0; p < rows.size(); ++p) {
    const auto& rp = rows[p];
    const std::string g = policy_group(p);
    std::vector<int32_t> layer(cnt), head(cnt);
    std::vector<int64_t> step(cnt);
    for (size_t i = 0; i < cnt; ++i) {
      layer[i] = rp[i].layer;
      head[i] = rp[i].head;
      step[i] = rp[i].step;
    }
    f->write_slab(g + "/layer", H5T_NATIVE_INT32, {off}, {cnt}, layer.data());
    f->write_slab(g + "/head", H5T_NATIVE_INT32, {off}, {cnt}, head.data());
    f->write_slab(g + "/step", H5T_NATIVE_INT64, {off}, {cnt}, step.data());
    std::vector<double> col(cnt);
    for (size_t m = 0; m < metrics.size(); ++m) {
      for (size_t i = 0; i < cnt; ++i) col[i] = rp[i][metrics[m].index];
      f->write_slab(g + "/" + metrics[m].name, H5T_NATIVE_DOUBLE, {off}, {cnt}, col.data());
    }
  }
}

std::string ResultSpill::finish(const RunResult& r) {
  namespace fs = std::filesystem;
  const auto& ex = st_->ex;
  const auto& metrics = st_->metrics;
  std::vector<std::string> labels;
  std::vector<std::vector<Stat>> all(ex.policies.size(), std::vector<Stat>(metrics.size()));
  {
    std::ofstream o(st_->tmps[State::kSummaryFile]);
    if (!o) throw Error(st_->tmps[State::kSummaryFile] + ": cannot write");
    const std::vector<std::string>& keys = st_->keys;
    o << "policy,label,layer" << stats_header(keys, ",all_layers");
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    write_root_attrs(*st_->f, r, ex);
    if (st_->ckpt) st_->f->set_attr("/", "run_manifest", st_->manifest);
    for (size_t p = 0; p < ex.policies.size(); ++p) {
      labels.push_back(ex.policies[p].label);
      const std::string g = policy_group(p);
      // summary.csv: per layer (in order of first appearance) and all layers (layer −1, all_layers = 1), one metric column at a time.
      // Row indices of each layer, once (not a scan of every row per layer and metric).
      std::vector<int32_t> order;
      std::vector<std::vector<uint32_t>> rows_of;
      {
        const std::vector<int32_t> layer = st_->f->read_int_vector(g + "/layer");
        std::map<int32_t, size_t> slot;
        for (size_t i = 0; i < layer.size(); ++i) {
          auto [it, fresh] = slot.try_emplace(layer[i], order.size());
          if (fresh) {
            order.push_back(layer[i]);
            rows_of.emplace_back();
          }
          rows_of[it->second].push_back(uint32_t(i));
        }
      }
      std::vector<std::vector<Stat>> per(order.size() + 1, std::vector<Stat>(metrics.size()));
      for (size_t m = 0; m < metrics.size(); ++m) {
        const std::vector<double> col = st_->f->read_double_vector(g + "/" + metrics[m].name);
        for (size_t k = 0; k < order.size(); ++k) {
          std::vector<double> v;
          v.reserve(rows_of[k].size());
          for (uint32_t i : rows_of[k]) v.push_back(col[i]);
          per[k][m] = summarize(std::move(v));
        }
        per[order.size()][m] = summarize(col);
        all[p][m] = per[order.size()][m];
        if (all[p][m].count == 0) st_->f->remove(g + "/" + metrics[m].name);  // all NaN: does not apply
      }
      for (size_t k = 0; k <= order.size(); ++k)
        stat_lines(o, ex.policies[p], k < order.size() ? std::to_string(order[k]) : std::string(kAllLayers), metrics, keys,
                   [&](size_t m) { return per[k][m]; }, k < order.size() ? ",0" : ",1");
    }
    st_->f->flush();
    st_->f.reset();
    o.flush();
    if (!o) throw Error(st_->tmps[State::kSummaryFile] + ": write failed (disk full?)");
  }
  {
    std::ofstream o(st_->tmps[State::kCellsFile]);
    if (!o) throw Error(st_->tmps[State::kCellsFile] + ": cannot write");
    o << "policy,label,layer,head" << stats_header(st_->keys);
    for (size_t p = 0; p < ex.policies.size(); ++p)
      for (const auto& cell : st_->cell_lines) o << cell[p];
    o.flush();
    if (!o) throw Error(st_->tmps[State::kCellsFile] + ": write failed (disk full?)");
  }
  std::error_code ec;
  for (size_t i = 0; i < st_->finals.size(); ++i) {
    fs::rename(st_->tmps[i], st_->finals[i], ec);
    if (ec) throw Error(st_->finals[i] + ": cannot move into place: " + ec.message());
  }
  st_->finished = true;
  if (st_->ckpt) st_->ckpt->remove();  // the results are in place: nothing left to resume
  st_->overall = all;
  return format_table(labels, metrics, all);
}

const std::vector<std::vector<Stat>>& ResultSpill::overall() const { return st_->overall; }

std::optional<std::vector<std::vector<Stat>>> ResultSpill::finished(const std::string& out_dir, const std::string& manifest,
                                                                     const std::vector<MetricColumn>& metrics,
                                                                     size_t n_policies) {
  namespace fs = std::filesystem;
  const std::string h5path = (fs::path(out_dir) / "results.h5").string();
  if (fs::exists(checkpoint_dir(out_dir)) || !fs::exists(h5path)) return std::nullopt;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  std::optional<h5::File> f;
  std::string found;
  try {
    f.emplace(h5::File::open_read(h5path));
    found = f->attr_string("run_manifest");
  } catch (const Error&) {
    throw Error(out_dir + ": --resume: nothing to resume (no checkpoint, and its results.h5 was not written by a "
                "checkpointed run); run without --resume to replace it");
  }
  if (found != manifest)
    throw Error(out_dir + ": --resume: its finished results are another run's: " + manifest_difference(found, manifest) +
                " (run without --resume to replace them)");
  try {
    std::vector<std::vector<Stat>> all(n_policies, std::vector<Stat>(metrics.size()));
    for (size_t p = 0; p < n_policies; ++p)
      for (size_t m = 0; m < metrics.size(); ++m) {
        const std::string ds = policy_group(p) + "/" + metrics[m].name;
        if (f->exists(ds)) all[p][m] = summarize(f->read_double_vector(ds));  // absent: did not apply (count 0)
      }
    return all;
  } catch (const Error& e) {
    throw Error(h5path + ": --resume: cannot read the finished results (" + std::string(e.what()) + ")");
  }
}

void MemoryRows::begin(const std::vector<size_t>& rows_per_cell, const std::vector<MetricColumn>&, const RecordingMeta*) {
  cells_.assign(rows_per_cell.size(), {});
}

void MemoryRows::write_cell(size_t cell, std::vector<std::vector<MetricRow>>&& rows) {
  // Each cell has its own slot, sized by begin(): workers never touch the same one.
  if (cell >= cells_.size()) throw Error("results: write_cell before begin() or for an unknown cell");
  cells_[cell] = std::move(rows);
}

void MemoryRows::take(std::vector<PolicyResult>& policies) {
  for (size_t p = 0; p < policies.size(); ++p) {
    size_t total = 0;
    for (const auto& c : cells_) total += c.size() > p ? c[p].size() : 0;
    auto& rows = policies[p].rows;
    rows.reserve(rows.size() + total);
    for (auto& c : cells_) {
      if (c.size() <= p) continue;  // a cell held elsewhere (never computed here)
      rows.insert(rows.end(), std::make_move_iterator(c[p].begin()), std::make_move_iterator(c[p].end()));
      std::vector<MetricRow>().swap(c[p]);
    }
  }
  cells_.clear();
}

}  // namespace kvsim
