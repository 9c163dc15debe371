// Internal: `--set key=value` overrides of a parsed TOML config (sim/cli/overrides.cpp).
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

}  // namespace kvsim::config_detail
