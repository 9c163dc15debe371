// Per-layer and per-(layer, KV head) budgets from a file (include/kvsim/policies/budgets.hpp).
#include "kvsim/policies/budgets.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kvsim/core/error.hpp"
#include "kvsim/io/files.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

const json& key(const std::string& path, const json& j, const std::string& k, const std::string& where = "") {
  if (!j.is_object() || !j.contains(k)) fail(path, "missing key '" + where + k + "'");
  return j.at(k);
}

int64_t integer(const std::string& path, const json& j, const std::string& name, int64_t lo) {
  if (!j.is_number_integer()) fail(path, "'" + name + "' must be an integer, not " + j.dump());
  const int64_t v = j.get<int64_t>();
  if (v < lo) fail(path, "'" + name + "' must be ≥ " + std::to_string(lo) + ", not " + std::to_string(v));
  return v;
}

std::string text(const std::string& path, const json& j, const std::string& k) {
  if (!j.contains(k)) return "";
  if (!j.at(k).is_string()) fail(path, "'" + k + "' must be a string");
  return j.at(k).get<std::string>();
}

/// `memory` as a policy parameter (an integer = tokens, a float = fraction of n).
Params memory_param(double memory, bool tokens) {
  Params p;
  if (tokens) p.set("memory", int64_t(std::llround(memory)));
  else p.set("memory", memory);
  return p;
}

void validate(const std::string& path, const BudgetsFile& f) {
  std::set<int> seen;
  for (int l : f.layers) {
    if (l < 0 || l >= f.n_layers)
      fail(path, "'layers' holds " + std::to_string(l) + ", outside the model's " + std::to_string(f.n_layers) + " layers");
    if (!seen.insert(l).second) fail(path, "'layers' holds layer " + std::to_string(l) + " twice");
  }
  if (f.granularity != "layer" && f.granularity != "head")
    fail(path, "'granularity' must be \"layer\" or \"head\", not \"" + f.granularity + "\"");
  if (f.allocations.empty()) fail(path, "'allocations' is empty");
  for (size_t a = 0; a < f.allocations.size(); ++a) {
    const BudgetAllocation& al = f.allocations[a];
    const std::string at = "allocations[" + std::to_string(a) + "].";
    if (al.budgets.size() != f.layers.size())
      fail(path, at + "budgets has " + std::to_string(al.budgets.size()) + " rows, not one per layer (" +
                     std::to_string(f.layers.size()) + ")");
    int64_t total = 0;
    for (size_t i = 0; i < al.budgets.size(); ++i) {
      if (al.budgets[i].size() != size_t(f.n_kv_heads))
        fail(path, at + "budgets[" + std::to_string(i) + "] has " + std::to_string(al.budgets[i].size()) +
                       " entries, not one per KV head (" + std::to_string(f.n_kv_heads) + ")");
      for (size_t h = 0; h < al.budgets[i].size(); ++h) {
        const int64_t b = al.budgets[i][h];
        if (b < 1 || b > f.n) fail(path, at + "budgets[" + std::to_string(i) + "][" + std::to_string(h) + "] = " +
                                             std::to_string(b) + " is outside [1, n = " + std::to_string(f.n) + "]");
        if (f.granularity == "layer" && b != al.budgets[i][0])
          fail(path, at + "budgets[" + std::to_string(i) + "]: granularity \"layer\" gives every KV head of a layer one budget");
        total += b;
      }
    }
    const int64_t caches = int64_t(f.layers.size()) * f.n_kv_heads;
    if (total != caches * al.memory_tokens)
      fail(path, at + "budgets sum to " + std::to_string(total) + " tokens, not " + std::to_string(caches) + " caches × " +
                     std::to_string(al.memory_tokens) + " (the declared memory)");
  }
}

}  // namespace

BudgetsFile read_budgets_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot open budgets file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    fail(path, std::string("not JSON (") + e.what() + ")");
  }
  if (integer(path, key(path, j, "kvsim_budgets"), "kvsim_budgets", 1) != 1) fail(path, "'kvsim_budgets' must be 1");
  BudgetsFile f;
  f.n_layers = int(integer(path, key(path, j, "n_layers"), "n_layers", 1));
  f.n_kv_heads = int(integer(path, key(path, j, "n_kv_heads"), "n_kv_heads", 1));
  f.n = integer(path, key(path, j, "n"), "n", 1);
  const json& layers = key(path, j, "layers");
  if (!layers.is_array() || layers.empty()) fail(path, "'layers' must be a non-empty list of the model's layer indices");
  for (const json& l : layers) f.layers.push_back(int(integer(path, l, "layers[]", 0)));
  f.granularity = j.contains("granularity") ? text(path, j, "granularity") : "head";
  f.objective = text(path, j, "objective");
  f.policy = text(path, j, "policy");
  f.source = text(path, j, "source");
  const json& allocs = key(path, j, "allocations");
  if (!allocs.is_array()) fail(path, "'allocations' must be a list");
  for (size_t a = 0; a < allocs.size(); ++a) {
    const std::string at = "allocations[" + std::to_string(a) + "].";
    const json& e = allocs[a];
    BudgetAllocation al;
    const json& mem = key(path, e, "memory", at);
    if (!mem.is_number()) fail(path, "'" + at + "memory' must be a number (tokens, or a fraction of n)");
    al.memory = mem.get<double>();
    al.memory_tokens = integer(path, key(path, e, "memory_tokens", at), at + "memory_tokens", 1);
    const int64_t want = memory_target_tokens(memory_param(al.memory, mem.is_number_integer()), f.n);
    if (al.memory_tokens != want)
      fail(path, at + "memory_tokens = " + std::to_string(al.memory_tokens) + ", but memory " + mem.dump() + " at n = " +
                     std::to_string(f.n) + " is " + std::to_string(want) + " tokens");
    const json& rows = key(path, e, "budgets", at);
    if (!rows.is_array()) fail(path, "'" + at + "budgets' must be a list of rows, one per layer");
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].is_array()) fail(path, "'" + at + "budgets[" + std::to_string(i) + "]' must be a list, one budget per KV head");
      std::vector<int64_t> row;
      for (size_t h = 0; h < rows[i].size(); ++h)
        row.push_back(integer(path, rows[i][h], at + "budgets[" + std::to_string(i) + "][" + std::to_string(h) + "]", 1));
      al.budgets.push_back(std::move(row));
    }
    f.allocations.push_back(std::move(al));
  }
  validate(path, f);
  return f;
}

void write_budgets_file(const std::string& path, const BudgetsFile& f) {
  validate(path, f);
  // Written by hand so that each layer's budgets stay on one line (json::dump puts every number on its own).
  std::ostringstream o;
  o << "{\"kvsim_budgets\": 1, \"n_layers\": " << f.n_layers << ", \"n_kv_heads\": " << f.n_kv_heads
    << ", \"n\": " << f.n << ",\n \"layers\": " << json(f.layers).dump() << ",\n \"granularity\": " << json(f.granularity).dump()
    << ", \"objective\": " << json(f.objective).dump() << ", \"policy\": " << json(f.policy).dump()
    << ",\n \"source\": " << json(f.source).dump() << ",\n \"allocations\": [";
  for (size_t a = 0; a < f.allocations.size(); ++a) {
    const BudgetAllocation& al = f.allocations[a];
    const bool tokens = al.memory > 1 && al.memory == std::floor(al.memory);
    o << (a ? ",\n  " : "\n  ") << "{\"memory\": " << (tokens ? json(int64_t(al.memory)) : json(al.memory)).dump()
      << ", \"memory_tokens\": " << al.memory_tokens << ", \"budgets\": [";
    for (size_t i = 0; i < al.budgets.size(); ++i) o << (i ? ",\n    " : "\n    ") << json(al.budgets[i]).dump();
    o << "]}";
  }
  o << "]}\n";
  write_file_atomically(path, o.str());
}

std::vector<std::vector<int64_t>> scale_budgets(const BudgetAllocation& a, int64_t target) {
  if (target == a.memory_tokens) return a.budgets;
  struct Part { double frac; size_t i, h; };
  std::vector<std::vector<int64_t>> out = a.budgets;
  std::vector<Part> parts;
  int64_t total = 0, caches = 0;
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t h = 0; h < out[i].size(); ++h) {
      const double exact = double(a.budgets[i][h]) * double(target) / double(a.memory_tokens);
      out[i][h] = int64_t(std::floor(exact));
      parts.push_back({exact - double(out[i][h]), i, h});
      total += out[i][h];
      ++caches;
    }
  std::stable_sort(parts.begin(), parts.end(), [](const Part& x, const Part& y) { return x.frac > y.frac; });
  for (int64_t k = 0; k < caches * target - total; ++k) ++out[parts[size_t(k)].i][parts[size_t(k)].h];
  return out;
}

const BudgetAllocation& allocation_for(const std::string& path, const BudgetsFile& f, const Params& memory) {
  const int64_t at_file = memory_target_tokens(memory, f.n);
  std::string held;
  for (const auto& a : f.allocations) {
    if (a.memory_tokens == at_file) return a;
    held += (held.empty() ? "" : ", ") + std::to_string(a.memory_tokens);
  }
  const std::string m = memory.to_string();
  fail(path, "no allocation for " + m + " (" + std::to_string(at_file) + " tokens at the file's n = " + std::to_string(f.n) +
                 "); it holds " + held + " tokens");
}

int64_t cell_budget(const std::string& path, const Params& memory, const StreamInfo& s) {
  return cell_budget(path, memory, memory, s);
}

int64_t cell_budget(const std::string& path, const Params& allocation, const Params& memory, const StreamInfo& s) {
  const BudgetsFile f = read_budgets_file(path);
  if (f.n_layers != s.n_layers || f.n_kv_heads != s.n_kv_heads)
    fail(path, "budgets for a model of " + std::to_string(f.n_layers) + " layers × " + std::to_string(f.n_kv_heads) +
                   " KV heads, but this model has " + std::to_string(s.n_layers) + " × " + std::to_string(s.n_kv_heads));
  const auto row = std::find(f.layers.begin(), f.layers.end(), s.layer);
  if (row == f.layers.end()) fail(path, "no budgets for layer " + std::to_string(s.layer) + " (see its 'layers')");
  if (s.kv_head < 0 || s.kv_head >= f.n_kv_heads) fail(path, "no budget for KV head " + std::to_string(s.kv_head));
  const BudgetAllocation& a = allocation_for(path, f, allocation);
  const int64_t b = scale_budgets(a, memory_target_tokens(memory, s.n))[size_t(row - f.layers.begin())][size_t(s.kv_head)];
  if (b < 1)
    fail(path, "layer " + std::to_string(s.layer) + ", KV head " + std::to_string(s.kv_head) + ": its budget scaled to n = " +
                   std::to_string(s.n) + " is 0 tokens");
  return b;
}

}  // namespace kvsim
