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
  Table data(root.at("data"), "data.", "[data]");  // the keys read below are [data]'s keys; finish() refuses others
  const bool has_path = data.contains("path"), has_syn = data.contains("synthetic");
  if (has_path == has_syn) throw Error(origin + ": [data] needs exactly one of 'path' (a recording) or 'synthetic' (a preset)");
  ex.data.layers = data.get_int_list("layers");
  ex.data.heads = data.get_int_list("heads");
  ex.data.tokens = data.get_int("tokens", 0);
  if (ex.data.tokens < 0) fail_at(data.at("tokens"), "data.tokens must be ≥ 0");
  ex.data.prefill = data.get_int("prefill", 0);
  if (ex.data.prefill < 0) fail_at(data.at("prefill"), "data.prefill must be ≥ 0 (0 = no prompt)");
  if (ex.data.tokens > 0 && ex.data.prefill >= ex.data.tokens)
    fail_at(data.at("prefill"), "data.prefill must be < data.tokens (at least one decoded step)");
  const std::string local = data.get_string("local_layers", "exact");
  if (local != "exact" && local != "replay")
    fail_at(data.at("local_layers"), "data.local_layers must be \"exact\" (leave local layers out) or \"replay\" (replay them "
                                     "against window attention), not \"" + local + "\"");
  ex.data.replay_local = local == "replay";
  if (has_path) {
    const std::vector<std::string> paths = data.get_string_list("path");
    ex.data.path = paths.front();
    ex.data.recipe = data.get_string("recipe", "");
    if (paths.size() > 1) ex.data.paths = paths;
    // A synthetic preset's key beside a recording is named as such (finish() would call it unknown).
    for (const char* k : {"n", "d", "n_layers", "n_heads", "n_kv_heads", "sequences", "softmax_scale", "q_scale", "k_scale",
                          "v_scale", "cluster_c", "cluster_gamma", "cluster_diameter", "center_scale", "query_norm",
                          "n_heavy", "heavy_strength"})
      if (data.contains(k)) fail_at(data.at(k), std::string("data.") + k + " only applies to synthetic data");
  } else {
    auto& s = ex.data.synth;
    ex.data.synthetic = true;
    s.preset = data.get_string("synthetic", "");
    s.n = data.get_int("n", s.n);
    s.head_dim = data.get_int32("d", s.head_dim);
    s.n_layers = data.get_int32("n_layers", s.n_layers);
    s.n_heads = data.get_int32("n_heads", s.n_heads);
    s.n_kv_heads = data.get_int32("n_kv_heads", s.n_heads);
    s.seed = ex.seed;
    s.softmax_scale = data.get_double("softmax_scale", s.softmax_scale);
    s.q_scale = data.get_double("q_scale", s.q_scale);
    s.k_scale = data.get_double("k_scale", s.k_scale);
    s.v_scale = data.get_double("v_scale", s.v_scale);
    s.cluster_c = data.get_double("cluster_c", s.cluster_c);
    s.cluster_gamma = data.get_double("cluster_gamma", s.cluster_gamma);
    s.cluster_diameter = data.get_double("cluster_diameter", s.cluster_diameter);
    s.center_scale = data.get_double("center_scale", s.center_scale);
    s.query_norm = data.get_double("query_norm", s.query_norm);
    s.n_heavy = data.get_int32("n_heavy", s.n_heavy);
    s.heavy_strength = data.get_double("heavy_strength", s.heavy_strength);
    s.validate(origin + ": data.");
    const int64_t seqs = data.get_int("sequences", 1);
    if (seqs < 1 || seqs > 100000) fail_at(data.at("sequences"), "data.sequences must be in [1, 100000]");
    ex.data.sequences = int(seqs);
    if (data.contains("recipe")) fail_at(data.at("recipe"), "data.recipe only applies to a recording (the command that makes it)");
  }
  data.finish();

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
    Table m(root.at("model"), "model.", "[model]");
    c.checkpoint = m.get_string("checkpoint", "");
    c.tokenizer = m.get_string("tokenizer", "");
    c.text = m.get_string("text", "");
    if (c.checkpoint.empty() || c.text.empty())
      throw Error(path + ": [model] needs 'checkpoint' and 'text' (and 'tokenizer' for a llama2.c checkpoint)");
    c.tokens = m.get_int32("tokens", c.tokens);
    c.windows = m.get_int32("windows", c.windows);
    c.generate = m.get_int32("generate", 0);
    if (c.windows < 1) fail_at(m.at("windows"), "model.windows must be ≥ 1");
    c.text_tail = m.get_double("text_tail", 0.0);
    if (!(c.text_tail >= 0 && c.text_tail < 1)) fail_at(m.at("text_tail"), "model.text_tail must be in [0, 1)");
    if (c.generate < 0) fail_at(m.at("generate"), "model.generate must be ≥ 0");
    c.prefill = m.get_int32("prefill", 0);
    if (c.prefill < 0 || c.prefill >= c.tokens)
      fail_at(m.at("prefill"), "model.prefill must be in [0, model.tokens) (0 = no prompt)");
    m.finish();
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
    Table data(root.at("data"), "data.", "[data]");
    s.path = data.get_string("path", "");
    data.get_string("recipe", "");  // the command that makes the recording (its error message's)
    data.finish();
    if (s.path.empty()) throw Error(path + ": [data] needs 'path' (a recording)");
    if (root.contains("clusters")) {
      Table c(root.at("clusters"), "clusters.", "[clusters]");
      s.delta_rel = c.get_double("delta_rel", s.delta_rel);
      if (!(s.delta_rel > 0)) fail_at(c.at("delta_rel"), "clusters.delta_rel must be > 0");
      s.centers = c.get_int("centers", s.centers);
      if (s.centers < 1) fail_at(c.at("centers"), "clusters.centers must be ≥ 1");
      s.layers = c.get_int_list("layers");
      c.finish();
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
