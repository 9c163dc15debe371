// Internal: rewrites of a parsed TOML config before it is interpreted (sim/cli/overrides.cpp):
// `--set key=value` overrides and file paths anchored at the config's folder.
#pragma once
#include <string>
#include <toml.hpp>

namespace kvsim::config_detail {

/// Parse `text` as a TOML value (a bare word falls back to a string).
toml::value parse_override_value(const std::string& text);

/// Applies `key.path=value` to the parsed config: `eval.every=4`, `policy.2.sink=8` (entry 2),
/// `policy.budget=0.1` (every [[policy]] entry whose policy accepts `budget`; the skipped ones are
/// named on stderr, and no accepting entry is an error). Throws kvsim::Error naming the override.
void apply_override(toml::value& root, const std::string& spec);

/// `p` relative to the folder `base` (absolute paths and an empty base leave it), lexically normalised.
std::string anchor(const std::string& p, const std::string& base);
/// `[data] path` (string or list), `[model]` checkpoint, tokenizer, text and `[task] filler` made relative to `base`.
void anchor_paths(toml::value& root, const std::string& base);

}  // namespace kvsim::config_detail
