// kvsim: experiment configs (TOML, parsed with toml11).
//
//   name = "quickstart"            # used for the default output folder results/<name>
//   seed = 1
//   [data]
//   path = "rec.h5"                # a recording (relative paths: to the current directory), or a
//                                  # list of recordings = several sequences — or —
//   synthetic = "clustered"        # an inline synthetic preset (gaussian | clustered | heavy_hitter)
//   n = 2048                       # synthetic shape: n, d, n_layers, n_heads, n_kv_heads and the
//   d = 64                         # preset's parameters (cluster_gamma, query_norm, ...; see synth.hpp)
//   layers = [0, 1]                # optional selection of layers / query heads (default: all)
//   heads = [0, 1, 2, 3]
//   tokens = 0                     # replay only the first `tokens` tokens (0 = all)
//   sequences = 8                  # synthetic: 8 independently seeded sequences (default 1)
//   [eval]
//   every = 1                      # evaluate every `every` steps from step `from` (last step always)
//   from = 1
//   gqa = "kv_head"                # or "query_head"
//   group_agg = "mean"             # or "max", "sum"
//   [[policy]]
//   name = "window"
//   budget = [0.1, 0.25]           # list-valued parameters expand into a sweep (cartesian product)
//   label = "..."                  # optional display label (default: name(param=value,...))
//
// Unknown keys are errors naming the key and its line. `--set key=value` overrides apply before
// interpretation: `eval.every=4`, `data.tokens=128`, `policy.budget=0.1` (every policy entry) or
// `policy.2.budget=0.1` (entry 2, 0-based); the value is read as TOML (a bare word is a string).
#pragma once
#include <string>
#include <vector>

#include "kvsim/replay/engine.hpp"

namespace kvsim {

/// A policy parameter from text, read as a TOML value (integer, float, boolean, string; a bare word
/// is a string) — for `--param key=value`.
ParamValue parse_param_value(const std::string& text);

/// The experiment as TOML with every default filled in (data, eval, each policy's documented literal
/// defaults; recordings as absolute paths). Parsing it gives the same experiment.
std::string resolved_config(const Experiment& ex);

/// Parse a config file with overrides; throws kvsim::Error naming the file, key and line.
/// Relative file paths in the file (`[data] path`, `[model]` checkpoint/tokenizer/text) resolve
/// against the config file's folder; paths given by `--set` resolve against the working directory.
Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides = {});
/// Same, from text (`origin` names it in errors); relative paths resolve against the working directory.
Experiment parse_experiment(const std::string& text, const std::string& origin,
                            const std::vector<std::string>& overrides = {});

}  // namespace kvsim
