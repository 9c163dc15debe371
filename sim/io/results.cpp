#include "kvsim/io/results.hpp"

#include "kvsim/core/blas.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <variant>

#include "kvsim/core/error.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/io/provenance.hpp"
#include "results_detail.hpp"

namespace kvsim {

std::string param_cells(const PolicySpec& spec, const std::vector<std::string>& keys) {
  std::string cells;
  for (const auto& k : keys) cells += "," + (spec.params.has(k) ? csv_field(param_to_string(spec.params.values().at(k))) : "");
  return cells;
}

std::vector<std::string> param_keys(const std::vector<PolicySpec>& specs) {
  std::set<std::string> keys;
  for (const auto& s : specs)
    for (const auto& [k, v] : s.params.values()) keys.insert(k);
  return {keys.begin(), keys.end()};
}

Stat summarize(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  Stat s;
  s.count = int64_t(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  auto q = [&](double p) {  // linear interpolation between order statistics
    double pos = p * double(v.size() - 1);
    size_t lo = size_t(std::floor(pos));
    size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
  };
  s.median = q(0.5);
  s.p95 = q(0.95);
  s.max = v.back();
  return s;
}

namespace results_detail {

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string policy_group(size_t p) {
  char g[32];
  std::snprintf(g, sizeof g, "/policy_%02zu", p);
  return g;
}

void write_root_attrs(h5::File& f, const RunResult& r, const Experiment& ex) {
  f.set_attr("/", "experiment", ex.name);
  f.set_attr("/", "kvsim_version", kvsim_version());
  f.set_attr("/", "git_commit", kvsim_git_commit());
  f.set_attr("/", "runtime_env", runtime_environment());
  f.set_attr("/", "runtime", runtime_toml(ex.runtime));  // the resolved [runtime] table (environment applied)
  if (!ex.data.synthetic && !ex.data.path.empty()) {  // the recording, by absolute path, size and content hash
    const FileFingerprint fp = fingerprint_file(ex.data.path);
    f.set_attr("/", "recording_path", fp.path);
    f.set_attr("/", "recording_bytes", fp.bytes);
    f.set_attr("/", "recording_sha1", fp.sha1);
  }
  f.set_attr("/", "source", r.source);
  f.set_attr("/", "config", ex.config_text);
  if (!ex.resolved_text.empty()) f.set_attr("/", "resolved_config", ex.resolved_text);
  f.set_attr("/", "n_tokens", int64_t(r.n_tokens));
  f.set_attr("/", "seed", int64_t(ex.seed));
  f.set_attr("/", "n_layers", int64_t(r.meta.n_layers));
  f.set_attr("/", "n_heads", int64_t(r.meta.n_heads));
  f.set_attr("/", "n_kv_heads", int64_t(r.meta.n_kv_heads));
  if (!r.layers.empty()) {  // the layers replayed, and which of them are local (window attention as exact)
    std::vector<int64_t> replayed, local;
    for (int l : r.layers) {
      replayed.push_back(l);
      if (r.meta.is_local(l)) local.push_back(l);
    }
    f.set_attr("/", "layers", replayed);
    if (!r.meta.layer_windows.empty()) f.set_attr("/", "local_layers", local);
    if (!r.meta.subset_layers.empty()) {  // a layer-subset recording: the replayed layers' indices in the model
      std::vector<int64_t> model;
      for (int l : r.layers) model.push_back(r.meta.model_layer(l));
      f.set_attr("/", "model_layers", model);
      f.set_attr("/", "model_n_layers", int64_t(r.meta.model_layer_count()));
    }
  }
  f.set_attr("/", "head_dim", int64_t(r.meta.head_dim));
  f.set_attr("/", "model", r.meta.model);
  f.set_attr("/", "gqa", std::string(to_string(ex.eval.gqa)));
  f.set_attr("/", "device", std::string(to_string(ex.eval.device)));
  f.set_attr("/", "reference_precision", std::string(to_string(ex.eval.reference_precision)));
  f.set_attr("/", "policy_precision", std::string(to_string(ex.eval.policy_precision)));
  f.set_attr("/", "gemm_backend", reference_gemm_backend());  // the float32 reference's GEMM (include/kvsim/core/blas.hpp)
  f.set_attr("/", "closed_form", std::string(to_string(ex.eval.closed_form)));
  f.set_attr("/", "stepping", std::string(to_string(ex.eval.stepping)));
  f.set_attr("/", "threads", int64_t(r.threads));
  f.set_attr("/", "wall_seconds", r.wall_seconds);
}

void write_policy_group(h5::File& f, const std::string& g, const PolicySpec& spec) {
  f.create_group(g);
  f.set_attr(g, "name", spec.name);
  f.set_attr(g, "label", spec.label);
  f.set_attr(g, "params", spec.params.to_string());
  for (const auto& [k, v] : spec.params.values()) {  // each parameter typed, as param_<name>
    const std::string a = "param_" + k;
    if (auto p = std::get_if<int64_t>(&v)) f.set_attr(g, a, *p);
    else if (auto d = std::get_if<double>(&v)) f.set_attr(g, a, *d);
    else if (auto b = std::get_if<bool>(&v)) f.set_attr(g, a, int64_t(*b));
    else f.set_attr(g, a, std::get<std::string>(v));
  }
}

std::string stats_header(const std::vector<std::string>& keys, const std::string& flag_header) {
  std::string h = ",metric,count,mean,median,p95,max" + flag_header;
  for (const auto& k : keys) h += "," + csv_field(k);
  return h + "\n";
}

/// CSV lines (count, mean, median, p95, max) of one group of one policy, metric by metric.
void stat_lines(std::ostream& o, const PolicySpec& spec, const std::string& group,
                const std::vector<MetricColumn>& metrics, const std::vector<std::string>& keys,
                const std::function<Stat(size_t metric)>& stat_of, const std::string& flags) {
  const std::string cells = flags + param_cells(spec, keys);
  for (size_t m = 0; m < metrics.size(); ++m) {
    const Stat st = stat_of(m);
    if (st.count == 0) continue;
    o << csv_field(spec.name) << ',' << csv_field(spec.label) << ',' << group << ',' << metrics[m].name << ','
      << st.count << ',' << num(st.mean) << ',' << num(st.median) << ',' << num(st.p95) << ',' << num(st.max) << cells << '\n';
  }
}

/// The registry's unit, description and source as attributes of a metric dataset.
void describe_metric(h5::File& f, const std::string& g, const MetricColumn& m) {
  const std::string ds = g + "/" + m.name;
  f.set_attr(ds, "unit", m.unit);
  f.set_attr(ds, "description", m.description);
  f.set_attr(ds, "source", m.source);
}

void write_h5(const RunResult& r, const Experiment& ex, const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  auto f = h5::File::create(path);
  write_root_attrs(f, r, ex);
  for (size_t p = 0; p < r.policies.size(); ++p) {
    const auto& pr = r.policies[p];
    const std::string g = policy_group(p);
    write_policy_group(f, g, pr.spec);
    std::vector<int32_t> layer, head;
    std::vector<int64_t> step;
    for (const auto& row : pr.rows) {
      layer.push_back(row.layer);
      head.push_back(row.head);
      step.push_back(row.step);
    }
    f.write_vector(std::string(g) + "/layer", layer);
    f.write_vector(std::string(g) + "/head", head);
    f.write_vector(std::string(g) + "/step", step);
    for (size_t m = 0; m < r.metrics.size(); ++m) {
      std::vector<double> col;
      col.reserve(pr.rows.size());
      for (const auto& row : pr.rows) col.push_back(row[r.metrics[m].index]);
      if (std::all_of(col.begin(), col.end(), [](double x) { return std::isnan(x); })) continue;  // does not apply
      f.write_vector(std::string(g) + "/" + r.metrics[m].name, col);
      describe_metric(f, g, r.metrics[m]);
    }
  }
  f.flush();
}

/// Aggregates (count, mean, median, p95, max) of every metric per group of rows. `key` maps a row to
/// its group's CSV cells (e.g. "3" or "3,5"); groups are written in key order of first appearance
/// (rows are ordered by layer, KV head, step), then an "all" group when `with_all`.
void write_stats(const RunResult& r, std::ostream& o, const std::string& key_header,
                 const std::function<std::string(const MetricRow&)>& key, bool with_all) {
  std::vector<PolicySpec> specs;
  for (const auto& pr : r.policies) specs.push_back(pr.spec);
  const std::vector<std::string> keys = param_keys(specs);
  o << "policy,label," << key_header << stats_header(keys, with_all ? ",all_layers" : "");
  for (const auto& pr : r.policies) {
    std::vector<std::string> order;
    std::map<std::string, std::vector<size_t>> groups;
    for (size_t i = 0; i < pr.rows.size(); ++i) {
      auto k = key(pr.rows[i]);
      auto [it, fresh] = groups.try_emplace(k);
      if (fresh) order.push_back(k);
      it->second.push_back(i);
    }
    if (with_all) {
      std::vector<size_t> all(pr.rows.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = i;
      groups[kAllLayers] = std::move(all);
      order.push_back(kAllLayers);
    }
    for (const auto& g : order)
      stat_lines(o, pr.spec, g, r.metrics, keys, [&](size_t m) {
        std::vector<double> v;
        v.reserve(groups[g].size());
        for (size_t i : groups[g]) v.push_back(pr.rows[i][r.metrics[m].index]);
        return summarize(std::move(v));
      }, !with_all ? "" : g == kAllLayers ? ",1" : ",0");
  }
}

void write_stats_file(const RunResult& r, const std::string& path, bool per_head) {
  std::ofstream o(path);
  if (!o) throw Error(path + ": cannot write");
  if (per_head) write_cells_csv(r, o);
  else write_summary_csv(r, o);
  o.flush();
  if (!o) throw Error(path + ": write failed (disk full?)");
}

}  // namespace results_detail

using namespace results_detail;

void write_summary_csv(const RunResult& r, std::ostream& o) {
  write_stats(r, o, "layer", [](const MetricRow& m) { return std::to_string(m.layer); }, true);
}

void write_cells_csv(const RunResult& r, std::ostream& o) {
  write_stats(r, o, "layer,head", [](const MetricRow& m) { return std::to_string(m.layer) + "," + std::to_string(m.head); },
              false);
}

std::vector<std::vector<Stat>> overall_stats(const RunResult& r) {
  std::vector<std::vector<Stat>> all(r.policies.size(), std::vector<Stat>(r.metrics.size()));
  for (size_t p = 0; p < r.policies.size(); ++p)
    for (size_t m = 0; m < r.metrics.size(); ++m) {
      std::vector<double> v;
      v.reserve(r.policies[p].rows.size());
      for (const auto& row : r.policies[p].rows) v.push_back(row[r.metrics[m].index]);
      all[p][m] = summarize(std::move(v));
    }
  return all;
}

void write_results(const RunResult& r, const Experiment& ex, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create output folder: " + ec.message());
  const std::string h5 = (fs::path(out_dir) / "results.h5").string();
  const std::string csv = (fs::path(out_dir) / "summary.csv").string();
  const std::string cells = (fs::path(out_dir) / "cells.csv").string();
  const std::vector<std::string> finals{h5, csv, cells};
  std::vector<std::string> tmps;
  for (const auto& f : finals) tmps.push_back(f + ".tmp");
  try {
    write_h5(r, ex, tmps[0]);
    write_stats_file(r, tmps[1], false);
    write_stats_file(r, tmps[2], true);
  } catch (...) {
    for (const auto& t : tmps) fs::remove(t, ec);
    throw;
  }
  for (size_t i = 0; i < finals.size(); ++i) {
    fs::rename(tmps[i], finals[i], ec);
    if (ec) throw Error(finals[i] + ": cannot move into place: " + ec.message());
  }
}

namespace results_detail {
struct TableCol {
  const char* metric;
  const char* head;
  bool p95;
};
const TableCol kTableCols[] = {{"rel_err", "rel_err", false},        {"rel_err", "rel_err p95", true},
                               {"eps_spectral", "eps", false},        {"eps_spectral", "eps p95", true},
                               {"kept_mass", "kept_mass", false},     {"mass_ratio", "mass_ratio", false},
                               {"tau_rel_err", "tau_rel_err", false}, {"cache_tokens", "cache_tok", false},
                               {"policy_ns", "ns/step", false}};

size_t column_index(const std::vector<MetricColumn>& metrics, const std::string& name) {
  for (size_t i = 0; i < metrics.size(); ++i)
    if (metrics[i].name == name) return i;
  return metrics.size();
}

/// The table from each policy's statistics over all rows: all_stats[p][metric index].
std::string format_table(const std::vector<std::string>& labels, const std::vector<MetricColumn>& metrics,
                         const std::vector<std::vector<Stat>>& all_stats) {
  size_t w0 = 6;
  for (const auto& l : labels) w0 = std::max(w0, l.size());
  std::ostringstream o;
  char buf[64];
  auto pad = [&](const std::string& s) { return s + std::string(w0 - s.size(), ' '); };
  o << pad("policy");
  for (const auto& c : kTableCols) {
    std::snprintf(buf, sizeof buf, " %11s", c.head);
    o << buf;
  }
  o << '\n';
  for (size_t p = 0; p < labels.size(); ++p) {
    o << pad(labels[p]);
    for (const auto& c : kTableCols) {
      const size_t m = column_index(metrics, c.metric);
      const double x = m == metrics.size() ? NAN : c.p95 ? all_stats[p][m].p95 : all_stats[p][m].mean;
      if (std::isnan(x)) std::snprintf(buf, sizeof buf, " %11s", "-");
      else if (std::string(c.metric) == "cache_tokens" || std::string(c.metric) == "policy_ns")
        std::snprintf(buf, sizeof buf, " %11.1f", x);
      else std::snprintf(buf, sizeof buf, " %11.3e", x);
      o << buf;
    }
    o << '\n';
  }
  return o.str();
}
}  // namespace results_detail

std::string summary_table(const RunResult& r) {
  std::vector<std::string> labels;
  std::vector<std::vector<Stat>> all(r.policies.size(), std::vector<Stat>(r.metrics.size()));
  for (size_t p = 0; p < r.policies.size(); ++p) {
    labels.push_back(r.policies[p].spec.label);
    for (const auto& c : kTableCols) {
      const size_t m = column_index(r.metrics, c.metric);
      if (m == r.metrics.size()) continue;
      std::vector<double> v;
      for (const auto& row : r.policies[p].rows) v.push_back(row[r.metrics[m].index]);
      all[p][m] = summarize(std::move(v));
    }
  }
  return format_table(labels, r.metrics, all);
}

}  // namespace kvsim
