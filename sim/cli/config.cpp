#include "kvsim/cli/config.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <iostream>
#include <sstream>
#include <toml.hpp>

#include "kvsim/cli/closed_loop.hpp"
#include "kvsim/analysis/clustering.hpp"
#include "kvsim/core/error.hpp"
#include "config_toml.hpp"
#include "overrides.hpp"

namespace kvsim {
namespace {

using TV = toml::value;
namespace fs = std::filesystem;
using namespace config_detail;

Experiment interpret(const TV& root, const std::string& origin) {
  Experiment ex;
  check_keys(root, {"name", "seed", "data", "eval", "policy", "runtime"}, origin + " (top level)");
  ex.name = get_string(root, "name", "experiment", "");
  int64_t seed = get_int(root, "seed", 1, "");
  if (seed < 0) fail_at(root.at("seed"), "seed must be ≥ 0");
  ex.seed = uint64_t(seed);

  if (!root.contains("data") || !root.at("data").is_table()) throw Error(origin + ": missing [data] table");
  const TV& data = root.at("data");
  check_keys(data, {"path", "synthetic", "n", "d", "n_layers", "n_heads", "n_kv_heads", "layers", "heads", "tokens",
                    "prefill", "softmax_scale", "q_scale", "k_scale", "v_scale", "cluster_c", "cluster_gamma", "cluster_diameter",
                    "center_scale", "query_norm", "n_heavy", "heavy_strength", "sequences", "recipe", "local_layers"},
             "[data]");
  const bool has_path = data.contains("path"), has_syn = data.contains("synthetic");
  if (has_path == has_syn) throw Error(origin + ": [data] needs exactly one of 'path' (a recording) or 'synthetic' (a preset)");
  ex.data.layers = get_int_list(data, "layers", "data.");
  ex.data.heads = get_int_list(data, "heads", "data.");
  ex.data.tokens = get_int(data, "tokens", 0, "data.");
  if (ex.data.tokens < 0) fail_at(data.at("tokens"), "data.tokens must be ≥ 0");
  ex.data.prefill = get_int(data, "prefill", 0, "data.");
  if (ex.data.prefill < 0) fail_at(data.at("prefill"), "data.prefill must be ≥ 0 (0 = no prompt)");
  if (ex.data.tokens > 0 && ex.data.prefill >= ex.data.tokens)
    fail_at(data.at("prefill"), "data.prefill must be < data.tokens (at least one decoded step)");
  const std::string local = get_string(data, "local_layers", "exact", "data.");
  if (local != "exact" && local != "replay")
    fail_at(data.at("local_layers"), "data.local_layers must be \"exact\" (leave local layers out) or \"replay\" (replay them "
                                     "against window attention), not \"" + local + "\"");
  ex.data.replay_local = local == "replay";
  if (has_path) {
    const std::vector<std::string> paths = get_string_list(data, "path", "data.");
    ex.data.path = paths.front();
    ex.data.recipe = get_string(data, "recipe", "", "data.");
    if (paths.size() > 1) ex.data.paths = paths;
    for (const char* k : {"n", "d", "n_layers", "n_heads", "n_kv_heads", "sequences"})
      if (data.contains(k)) fail_at(data.at(k), std::string("data.") + k + " only applies to synthetic data");
  } else {
    auto& s = ex.data.synth;
    ex.data.synthetic = true;
    s.preset = get_string(data, "synthetic", "", "data.");
    s.n = get_int(data, "n", s.n, "data.");
    s.head_dim = get_int32(data, "d", s.head_dim, "data.");
    s.n_layers = get_int32(data, "n_layers", s.n_layers, "data.");
    s.n_heads = get_int32(data, "n_heads", s.n_heads, "data.");
    s.n_kv_heads = get_int32(data, "n_kv_heads", s.n_heads, "data.");
    s.seed = ex.seed;
    s.softmax_scale = get_double(data, "softmax_scale", s.softmax_scale, "data.");
    s.q_scale = get_double(data, "q_scale", s.q_scale, "data.");
    s.k_scale = get_double(data, "k_scale", s.k_scale, "data.");
    s.v_scale = get_double(data, "v_scale", s.v_scale, "data.");
    s.cluster_c = get_double(data, "cluster_c", s.cluster_c, "data.");
    s.cluster_gamma = get_double(data, "cluster_gamma", s.cluster_gamma, "data.");
    s.cluster_diameter = get_double(data, "cluster_diameter", s.cluster_diameter, "data.");
    s.center_scale = get_double(data, "center_scale", s.center_scale, "data.");
    s.query_norm = get_double(data, "query_norm", s.query_norm, "data.");
    s.n_heavy = get_int32(data, "n_heavy", s.n_heavy, "data.");
    s.heavy_strength = get_double(data, "heavy_strength", s.heavy_strength, "data.");
    s.validate(origin + ": data.");
    const int64_t seqs = get_int(data, "sequences", 1, "data.");
    if (seqs < 1 || seqs > 100000) fail_at(data.at("sequences"), "data.sequences must be in [1, 100000]");
    ex.data.sequences = int(seqs);
  }

  parse_eval(root, ex.eval);
  eval_after_prompt(root, ex.data.prefill, "data.prefill", ex.eval);
  parse_runtime(root, ex.runtime);
  apply_runtime_environment(ex.runtime);  // the environment overrides the config (named in runtime_keys())
  ex.policies = parse_policies(root, origin);
  return ex;
}

/// The experiment a parsed config (paths anchored, overrides applied) describes.
Experiment experiment_from(const TV& root, const std::string& origin) {
  try {
    Experiment ex = interpret(root, origin);
    std::ostringstream s;
    s << toml::format(root, 100);
    ex.config_text = s.str();
    ex.resolved_text = resolved_config(ex);
    return ex;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

}  // namespace

ParamValue parse_param_value(const std::string& text) {
  TV v = parse_override_value(text);
  if (v.is_array()) throw Error("--param " + text + ": lists are not allowed here (one value per run)");
  return to_param(v, text);
}

ClosedLoopConfig load_closed_loop(const std::string& path, const std::vector<std::string>& overrides) {
  TV root = load_root(path, overrides);
  try {
    ClosedLoopConfig c;
    check_keys(root, {"name", "seed", "model", "eval", "policy"}, path + " (top level)");
    c.name = get_string(root, "name", c.name, "");
    int64_t seed = get_int(root, "seed", 1, "");
    if (seed < 0) fail_at(root.at("seed"), "seed must be ≥ 0");
    c.seed = uint64_t(seed);
    if (!root.contains("model") || !root.at("model").is_table()) throw Error(path + ": missing [model] table");
    const TV& m = root.at("model");
    check_keys(m, {"checkpoint", "tokenizer", "text", "text_tail", "tokens", "windows", "generate", "prefill"}, "[model]");
    c.checkpoint = get_string(m, "checkpoint", "", "model.");
    c.tokenizer = get_string(m, "tokenizer", "", "model.");
    c.text = get_string(m, "text", "", "model.");
    if (c.checkpoint.empty() || c.text.empty())
      throw Error(path + ": [model] needs 'checkpoint' and 'text' (and 'tokenizer' for a llama2.c checkpoint)");
    c.tokens = get_int32(m, "tokens", c.tokens, "model.");
    c.windows = get_int32(m, "windows", c.windows, "model.");
    c.generate = get_int32(m, "generate", 0, "model.");
    if (c.windows < 1) fail_at(m.at("windows"), "model.windows must be ≥ 1");
    c.text_tail = get_double(m, "text_tail", 0.0, "model.");
    if (!(c.text_tail >= 0 && c.text_tail < 1)) fail_at(m.at("text_tail"), "model.text_tail must be in [0, 1)");
    if (c.generate < 0) fail_at(m.at("generate"), "model.generate must be ≥ 0");
    c.prefill = get_int32(m, "prefill", 0, "model.");
    if (c.prefill < 0 || c.prefill >= c.tokens)
      fail_at(m.at("prefill"), "model.prefill must be in [0, model.tokens) (0 = no prompt)");
    parse_eval(root, c.eval);
    eval_after_prompt(root, c.prefill, "model.prefill", c.eval);
    c.policies = parse_policies(root, path);
    return c;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

ClusterStudy load_cluster_study(const std::string& path, const std::vector<std::string>& overrides) {
  TV root = load_root(path, overrides);
  try {
    ClusterStudy s;
    check_keys(root, {"name", "data", "clusters"}, path + " (top level)");
    s.name = get_string(root, "name", s.name, "");
    if (!root.contains("data") || !root.at("data").is_table()) throw Error(path + ": missing [data] table");
    check_keys(root.at("data"), {"path", "recipe"}, "[data]");
    s.path = get_string(root.at("data"), "path", "", "data.");
    if (s.path.empty()) throw Error(path + ": [data] needs 'path' (a recording)");
    if (root.contains("clusters")) {
      const TV& c = root.at("clusters");
      check_keys(c, {"delta_rel", "centers", "layers"}, "[clusters]");
      s.delta_rel = get_double(c, "delta_rel", s.delta_rel, "clusters.");
      if (!(s.delta_rel > 0)) fail_at(c.at("delta_rel"), "clusters.delta_rel must be > 0");
      s.centers = get_int(c, "centers", s.centers, "clusters.");
      if (s.centers < 1) fail_at(c.at("centers"), "clusters.centers must be ≥ 1");
      s.layers = get_int_list(c, "layers", "clusters.");
    }
    return s;
  } catch (const toml::exception& e) {
    throw one_line(e);
  }
}

Experiment parse_experiment(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  std::istringstream in(text);
  return experiment_from(parse_root(in, origin, overrides), origin);
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  return experiment_from(load_root(path, overrides), path);
}

}  // namespace kvsim
