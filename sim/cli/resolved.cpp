// The resolved configuration: an Experiment written back as TOML with every default filled in, so a
// result records exactly what ran (results.h5 attribute `resolved_config`).
#include "kvsim/cli/config.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "kvsim/policies/registry.hpp"

namespace kvsim {
namespace {

std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

std::string toml_value(const ParamValue& v) {
  if (auto s = std::get_if<std::string>(&v)) return quoted(*s);
  if (auto d = std::get_if<double>(&v)) {
    char buf[64];
    for (int digits = 15; digits <= 17; ++digits) {  // the shortest form that reads back as the same double
      std::snprintf(buf, sizeof buf, "%.*g", digits, *d);
      if (std::strtod(buf, nullptr) == *d) break;
    }
    std::string t = buf;
    if (t.find_first_of(".eEn") == std::string::npos) t += ".0";  // stays a float in TOML
    return t;
  }
  return param_to_string(v);
}

std::string int_list(const std::vector<int>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
  return o + "]";
}

void write_data(std::ostream& o, const DataSpec& d) {
  o << "[data]\n";
  if (d.synthetic) {
    const SynthParams& s = d.synth;
    o << "synthetic = " << quoted(s.preset) << "\nsequences = " << d.sequences << "\nn = " << s.n << "\nd = " << s.head_dim
      << "\nn_layers = " << s.n_layers << "\nn_heads = " << s.n_heads << "\nn_kv_heads = " << s.n_kv_heads
      << "\nsoftmax_scale = " << toml_value(s.softmax_scale) << "\nq_scale = " << toml_value(s.q_scale)
      << "\nk_scale = " << toml_value(s.k_scale) << "\nv_scale = " << toml_value(s.v_scale)
      << "\ncluster_c = " << toml_value(s.cluster_c) << "\ncluster_gamma = " << toml_value(s.cluster_gamma)
      << "\ncluster_diameter = " << toml_value(s.cluster_diameter) << "\ncenter_scale = " << toml_value(s.center_scale)
      << "\nquery_norm = " << toml_value(s.query_norm) << "\nn_heavy = " << s.n_heavy
      << "\nheavy_strength = " << toml_value(s.heavy_strength) << "\n";
  } else {
    const std::vector<std::string> paths = d.paths.empty() ? std::vector<std::string>{d.path} : d.paths;
    o << "path = [";
    for (size_t i = 0; i < paths.size(); ++i) {
      std::error_code ec;
      o << (i ? ", " : "") << quoted(std::filesystem::absolute(paths[i], ec).lexically_normal().string());
    }
    o << "]\n";
  }
  o << "layers = " << int_list(d.layers) << "   # [] = all\nheads = " << int_list(d.heads) << "   # [] = all\ntokens = "
    << d.tokens << "   # 0 = all\nprefill = " << d.prefill << "   # 0 = no prompt\nlocal_layers = "
    << quoted(d.replay_local ? "replay" : "exact") << "   # exact: local sliding-window layers left out; replay: against window attention\n";
}

void write_eval(std::ostream& o, const EvalSpec& e) {
  o << "\n[eval]\nevery = " << e.every << "\nfrom = " << e.from << "\ngqa = " << quoted(to_string(e.gqa))
    << "\ngroup_agg = " << quoted(to_string(e.group_agg)) << "\npolicy_precision = " << quoted(to_string(e.policy_precision))
    << "\nreference_precision = " << quoted(to_string(e.reference_precision)) << "\ndevice = " << quoted(to_string(e.device))
    << "\nclosed_form = " << quoted(to_string(e.closed_form)) << "\nstepping = " << quoted(to_string(e.stepping))
    << "\nstepping_block = " << e.stepping_block
    << "\nobjectives = " << (e.objectives ? "true" : "false") << "\nobjectives_every = " << e.objectives_every
    << "\nobjectives_max_t = " << e.objectives_max_t << "\ntheorem44_alpha = " << toml_value(e.theorem44_alpha)
    << "\ntheorem44_beta = " << toml_value(e.theorem44_beta) << "\ntopk = " << e.topk << "\n";
}

}  // namespace

std::string resolved_config(const Experiment& ex) {
  std::ostringstream o;
  o << "# resolved by kvsim: every default filled in\nname = " << quoted(ex.name) << "\nseed = " << ex.seed << "\n\n";
  write_data(o, ex.data);
  write_eval(o, ex.eval);
  o << "\n[runtime]   # how the run was carried out (no number depends on it); the environment's overrides applied\n"
    << runtime_toml(ex.runtime);
  for (const auto& p : ex.policies) {
    o << "\n[[policy]]\nname = " << quoted(p.name) << "\nlabel = " << quoted(p.label) << "\n";
    std::map<std::string, std::string> lines;  // key order, given and default alike
    for (const auto& [k, v] : p.params.values()) lines[k] = toml_value(v);
    for (const auto& q : policy_info(p.name).params) {
      const auto lit = literal_default(q);
      if (!p.params.has(q.name) && lit) lines[q.name] = toml_value(*lit) + "   # default";
    }
    for (const auto& [k, v] : lines) o << k << " = " << v << "\n";
  }
  return o.str();
}

}  // namespace kvsim
