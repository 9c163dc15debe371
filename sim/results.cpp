#include "kvsim/results.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvsim/error.hpp"
#include "kvsim/h5.hpp"
#include "kvsim/recording.hpp"

namespace kvsim {

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

namespace {

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

void write_h5(const RunResult& r, const Experiment& ex, const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  auto f = h5::File::create(path);
  f.set_attr("/", "experiment", ex.name);
  f.set_attr("/", "source", r.source);
  f.set_attr("/", "config", ex.config_text);
  f.set_attr("/", "n_tokens", int64_t(r.n_tokens));
  f.set_attr("/", "seed", int64_t(ex.seed));
  f.set_attr("/", "n_layers", int64_t(r.meta.n_layers));
  f.set_attr("/", "n_heads", int64_t(r.meta.n_heads));
  f.set_attr("/", "n_kv_heads", int64_t(r.meta.n_kv_heads));
  f.set_attr("/", "head_dim", int64_t(r.meta.head_dim));
  f.set_attr("/", "model", r.meta.model);
  f.set_attr("/", "gqa", ex.eval.gqa);
  f.set_attr("/", "threads", int64_t(r.threads));
  f.set_attr("/", "wall_seconds", r.wall_seconds);
  for (size_t p = 0; p < r.policies.size(); ++p) {
    const auto& pr = r.policies[p];
    char g[32];
    std::snprintf(g, sizeof g, "/policy_%02zu", p);
    f.create_group(g);
    f.set_attr(g, "name", pr.spec.name);
    f.set_attr(g, "label", pr.spec.label);
    f.set_attr(g, "params", pr.spec.params.to_string());
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
    for (size_t m = 0; m < metric_names().size(); ++m) {
      std::vector<double> col;
      col.reserve(pr.rows.size());
      for (const auto& row : pr.rows) col.push_back(metric_value(row, m));
      f.write_vector(std::string(g) + "/" + metric_names()[m], col);
    }
  }
  f.flush();
}

void write_csv(const RunResult& r, const std::string& path) {
  std::ofstream o(path);
  if (!o) throw Error(path + ": cannot write");
  o << "policy,label,layer,metric,count,mean,median,p95,max\n";
  for (const auto& pr : r.policies) {
    std::vector<std::string> scopes;
    for (int l : r.layers) scopes.push_back(std::to_string(l));
    scopes.push_back("all");
    for (const auto& scope : scopes) {
      for (size_t m = 0; m < metric_names().size(); ++m) {
        std::vector<double> v;
        for (const auto& row : pr.rows)
          if (scope == "all" || std::to_string(row.layer) == scope) v.push_back(metric_value(row, m));
        Stat s = summarize(v);
        if (s.count == 0) continue;
        o << csv_escape(pr.spec.name) << ',' << csv_escape(pr.spec.label) << ',' << scope << ',' << metric_names()[m]
          << ',' << s.count << ',' << num(s.mean) << ',' << num(s.median) << ',' << num(s.p95) << ',' << num(s.max) << '\n';
      }
    }
  }
  o.flush();
  if (!o) throw Error(path + ": write failed (disk full?)");
}

}  // namespace

void write_results(const RunResult& r, const Experiment& ex, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create output folder: " + ec.message());
  const std::string h5 = (fs::path(out_dir) / "results.h5").string();
  const std::string csv = (fs::path(out_dir) / "summary.csv").string();
  const std::string h5_tmp = h5 + ".tmp", csv_tmp = csv + ".tmp";
  try {
    write_h5(r, ex, h5_tmp);
    write_csv(r, csv_tmp);
  } catch (...) {
    fs::remove(h5_tmp, ec);
    fs::remove(csv_tmp, ec);
    throw;
  }
  fs::rename(h5_tmp, h5, ec);
  if (ec) throw Error(h5 + ": cannot move into place: " + ec.message());
  fs::rename(csv_tmp, csv, ec);
  if (ec) throw Error(csv + ": cannot move into place: " + ec.message());
}

std::string summary_table(const RunResult& r) {
  struct Col {
    const char* metric;
    const char* head;
    bool p95;
  };
  const Col cols[] = {{"rel_err", "rel_err", false},        {"rel_err", "rel_err p95", true},
                      {"eps_spectral", "eps", false},        {"eps_spectral", "eps p95", true},
                      {"kept_mass", "kept_mass", false},     {"mass_ratio", "mass_ratio", false},
                      {"tau_rel_err", "tau_rel_err", false}, {"cache_tokens", "cache_tok", false},
                      {"policy_ns", "ns/step", false}};
  size_t w0 = 6;
  for (const auto& pr : r.policies) w0 = std::max(w0, pr.spec.label.size());
  std::ostringstream o;
  char buf[64];
  auto pad = [&](const std::string& s) { return s + std::string(w0 - s.size(), ' '); };
  o << pad("policy");
  for (const auto& c : cols) {
    std::snprintf(buf, sizeof buf, " %11s", c.head);
    o << buf;
  }
  o << '\n';
  for (const auto& pr : r.policies) {
    o << pad(pr.spec.label);
    for (const auto& c : cols) {
      size_t m = std::find(metric_names().begin(), metric_names().end(), c.metric) - metric_names().begin();
      std::vector<double> v;
      for (const auto& row : pr.rows) v.push_back(metric_value(row, m));
      Stat s = summarize(v);
      double x = c.p95 ? s.p95 : s.mean;
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

}  // namespace kvsim
