// `kvsim allocate` (include/kvsim/cli/allocate.hpp): a budget sweep's curves → a budgets file.
#include "kvsim/cli/allocate.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "kvsim/analysis/allocation.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/policies/budgets.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> result_files(const std::string& s) {
  if (fs::is_regular_file(s)) return {s};
  if (!fs::is_directory(s)) throw Error(s + ": no such results folder or file");
  if (fs::exists(fs::path(s) / "results.h5")) return {(fs::path(s) / "results.h5").string()};
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(s))
    if (e.is_directory() && e.path().filename().string().rfind("seq_", 0) == 0 && fs::exists(e.path() / "results.h5"))
      out.push_back((e.path() / "results.h5").string());
  std::sort(out.begin(), out.end());
  if (out.empty()) throw Error(s + ": no results.h5 (nor seq_NN/results.h5) in this folder");
  return out;
}

/// `memory` as a policy parameter: a value ≤ 1 is a fraction of n, a larger one whole tokens.
Params memory_param(double v) {
  Params p;
  if (v > 1) p.set("memory", int64_t(std::llround(v)));
  else p.set("memory", v);
  return p;
}

struct Shape {
  int64_t n = 0;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0;
  bool operator!=(const Shape& o) const {
    return n != o.n || n_layers != o.n_layers || n_heads != o.n_heads || n_kv_heads != o.n_kv_heads;
  }
};

using CellKey = std::pair<int, int>;  // (model layer, KV head)

struct Sweep {
  Shape shape;
  std::map<int64_t, std::map<CellKey, std::pair<double, int>>> cells;  // M → cell → (Σ file means, files)
  std::map<int64_t, double> memory_value;                              // M → the memory as written
};

std::string metric_of(const std::string& objective) {
  if (objective == "rel_err") return "rel_err";
  if (objective == "eps") return "eps_spectral";
  if (objective == "kept_mass") return "kept_mass";
  throw Error("--objective must be rel_err, eps or kept_mass, not '" + objective + "'");
}

void read_file(const std::string& path, const AllocateOptions& o, Sweep& sw, bool first) {
  const h5::File f = h5::File::open_read(path);
  Shape s;
  s.n = f.attr_int("n_tokens");
  s.n_heads = int(f.attr_int("n_heads"));
  s.n_kv_heads = int(f.attr_int("n_kv_heads"));
  std::vector<int64_t> model_of = f.has_attr("layers") ? f.attr_ints("layers") : std::vector<int64_t>{};
  std::set<int64_t> local;
  if (f.has_attr("local_layers"))
    for (int64_t l : f.attr_ints("local_layers")) local.insert(l);
  std::map<int64_t, int> model_layer;  // recording layer → model layer
  if (f.has_attr("model_layers")) {
    if (!f.has_attr("model_n_layers")) throw Error(path + ": a layer-subset run without model_n_layers (rerun it with this kvsim)");
    const std::vector<int64_t> m = f.attr_ints("model_layers");
    for (size_t i = 0; i < m.size() && i < model_of.size(); ++i) model_layer[model_of[i]] = int(m[i]);
    s.n_layers = int(f.attr_int("model_n_layers"));
  } else {
    s.n_layers = int(f.attr_int("n_layers"));
  }
  if (first) sw.shape = s;
  else if (s != sw.shape) throw Error(path + ": another model shape or n than the first results file (one sweep at a time)");
  const int G = s.n_heads / std::max(1, s.n_kv_heads);
  const std::string metric = metric_of(o.objective);
  std::map<int64_t, std::string> labels;
  for (const std::string& g : f.list("/")) {
    if (g.rfind("policy_", 0) != 0 || f.attr_string("name", g) != o.policy || !f.has_attr("param_memory", g)) continue;
    if (f.has_attr("param_budgets_file", g)) continue;  // an allocation already applied: not the uniform curve
    const double mem = f.attr_double("param_memory", g);
    const int64_t M = memory_target_tokens(memory_param(mem), s.n);
    const std::string label = f.attr_string("label", g);
    if (labels.count(M))
      throw Error(path + ": '" + labels[M] + "' and '" + label + "' are both " + o.policy + " at " + std::to_string(M) +
                  " tokens (allocate reads one entry per memory: run a sweep with one)");
    labels[M] = label;
    sw.memory_value[M] = mem;
    if (!f.exists(g + "/" + metric)) throw Error(path + ": " + g + " has no dataset '" + metric + "'");
    const auto layer = f.read_int_vector(g + "/layer"), head = f.read_int_vector(g + "/head");
    const auto value = f.read_double_vector(g + "/" + metric);
    std::map<CellKey, std::pair<double, int64_t>> sums;
    for (size_t i = 0; i < value.size(); ++i) {
      if (local.count(layer[i]) || !std::isfinite(value[i])) continue;
      const int ml = model_layer.empty() ? layer[i] : model_layer.at(layer[i]);
      auto& acc = sums[{ml, head[i] / G}];
      acc.first += o.objective == "kept_mass" ? 1.0 - value[i] : value[i];
      ++acc.second;
    }
    for (const auto& [key, acc] : sums) {
      auto& cell = sw.cells[M][key];
      cell.first += acc.first / double(acc.second);
      ++cell.second;
    }
  }
  if (labels.empty()) throw Error(path + ": no entry of policy '" + o.policy + "' with a 'memory' parameter");
}

}  // namespace

std::string cmd_allocate(const AllocateOptions& o) {
  if (o.granularity != "head" && o.granularity != "layer")
    throw Error("--granularity must be head or layer, not '" + o.granularity + "'");
  metric_of(o.objective);
  if (o.memory.empty()) throw Error("--memory: give at least one mean memory (a fraction of n, or tokens)");
  Sweep sw;
  std::vector<std::string> files;
  for (const auto& s : o.sweeps)
    for (const auto& f : result_files(s)) files.push_back(f);
  for (size_t i = 0; i < files.size(); ++i) read_file(files[i], o, sw, i == 0);
  if (sw.cells.size() < 2) throw Error("policy '" + o.policy + "' was measured at one memory only: allocate needs a curve (≥ 2 memories)");
  // The units: every (layer, KV head) measured at every memory (per layer: their mean over KV heads).
  std::set<CellKey> keys;
  for (const auto& [M, cells] : sw.cells)
    for (const auto& [k, v] : cells) keys.insert(k);
  std::set<int> layer_set;
  for (const auto& k : keys) layer_set.insert(k.first);
  const std::vector<int> layers(layer_set.begin(), layer_set.end());
  const int H = sw.shape.n_kv_heads;
  const bool per_layer = o.granularity == "layer";
  std::vector<BudgetCurve> curves(per_layer ? layers.size() : layers.size() * size_t(H));
  for (const auto& [M, cells] : sw.cells)
    for (size_t li = 0; li < layers.size(); ++li)
      for (int h = 0; h < H; ++h) {
        const auto it = cells.find({layers[li], h});
        if (it == cells.end() || it->second.second != int(files.size()))
          throw Error("layer " + std::to_string(layers[li]) + ", KV head " + std::to_string(h) + " lacks memory " +
                      std::to_string(M) + " tokens in some results file");
        BudgetCurve& c = curves[per_layer ? li : li * size_t(H) + size_t(h)];
        const double v = it->second.first / double(files.size()) / (per_layer ? H : 1);
        if (per_layer && h > 0) c.value.back() += v;
        else {
          c.tokens.push_back(M);
          c.value.push_back(v);
        }
      }
  BudgetsFile out;
  out.n_layers = sw.shape.n_layers;
  out.n_kv_heads = H;
  out.layers = layers;
  out.n = sw.shape.n;
  out.granularity = o.granularity;
  out.objective = o.objective;
  out.policy = o.policy;
  for (size_t i = 0; i < o.sweeps.size(); ++i) out.source += (i ? " " : "") + o.sweeps[i];
  std::ostringstream rep;
  rep << "kvsim allocate: " << o.policy << ", " << o.objective << " per " << (per_layer ? "layer" : "(layer, KV head)") << ", "
      << curves.size() << " units, " << files.size() << " results file(s), n = " << sw.shape.n << "\n";
  rep << "memory  tokens  summed " << o.objective << " (allocated / uniform)  budgets min-max\n";
  for (const std::string& m : o.memory) {
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(m, &used);
      if (used != m.size() || !(v > 0)) throw std::invalid_argument(m);
    } catch (const std::exception&) {
      throw Error("--memory '" + m + "' is not a positive number (a fraction of n, or tokens)");
    }
    const int64_t M = memory_target_tokens(memory_param(v), sw.shape.n);
    const BudgetAllocationResult r = allocate_budgets(curves, M);
    BudgetAllocation a;
    a.memory = v;
    a.memory_tokens = M;
    for (size_t li = 0; li < layers.size(); ++li) {
      std::vector<int64_t> row;
      for (int h = 0; h < H; ++h) row.push_back(r.budgets[per_layer ? li : li * size_t(H) + size_t(h)]);
      a.budgets.push_back(row);
    }
    out.allocations.push_back(a);
    const auto [lo, hi] = std::minmax_element(r.budgets.begin(), r.budgets.end());
    rep << m << "  " << M << "  " << r.objective << " / " << r.uniform_objective << "  " << *lo << "-" << *hi << "\n";
  }
  write_budgets_file(o.out, out);
  rep << "wrote " << o.out << "\n";
  return rep.str();
}

}  // namespace kvsim
