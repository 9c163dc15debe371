// kvsim: the enumerated choices of an experiment's `[eval]` table (docs/cli.md), parsed once when
// the config is read and compared as values everywhere after. Each enum's names are its config
// spelling: to_string() gives it back (results attributes, the resolved config), parse_choice()
// reads it, choice_names() lists the allowed ones for an error message.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvsim/core/hd.hpp"

namespace kvsim {

/// `[eval] gqa`: one cache per KV head shared by its query group (kv_head), or one cache per query
/// head (query_head).
enum class GqaMode { kv_head, query_head };
/// `[eval] group_agg`: how score-based policies combine a KV group's per-query-head scores
/// (docs/policies.md). The values are hd::GroupAgg's codes, which the CUDA path takes.
enum class GroupAgg : int { mean = hd::kAggMean, max = hd::kAggMax, sum = hd::kAggSum };
/// `[eval] policy_precision` and `[eval] reference_precision`: double or float32 arithmetic.
enum class Precision { float64, float32 };
/// `[eval] device`: where the exact reference (and the policies with a GPU replay) run.
enum class Device { cpu, cuda };
/// `[eval] closed_form`: closed-form caches (window, sink) answered a block of steps at a time by
/// banded GEMMs, or stepped token by token like every other policy.
enum class ClosedFormMode { blocked, per_step };
/// `[eval] stepping`: stepped caches that can (BlockStepper) advance a block of steps at a time, their
/// logits formed by one GEMM per block (BlockStepper, include/kvsim/policies/policy.hpp), or one step at a time.
enum class SteppingMode { blocked, per_step };

namespace choice_detail {
template <class E>
struct Names;
template <>
struct Names<GqaMode> {
  static constexpr std::array<std::pair<GqaMode, const char*>, 2> v{{{GqaMode::kv_head, "kv_head"}, {GqaMode::query_head, "query_head"}}};
};
template <>
struct Names<GroupAgg> {
  static constexpr std::array<std::pair<GroupAgg, const char*>, 3> v{
      {{GroupAgg::mean, "mean"}, {GroupAgg::max, "max"}, {GroupAgg::sum, "sum"}}};
};
template <>
struct Names<Precision> {
  static constexpr std::array<std::pair<Precision, const char*>, 2> v{
      {{Precision::float64, "float64"}, {Precision::float32, "float32"}}};
};
template <>
struct Names<Device> {
  static constexpr std::array<std::pair<Device, const char*>, 2> v{{{Device::cpu, "cpu"}, {Device::cuda, "cuda"}}};
};
template <>
struct Names<ClosedFormMode> {
  static constexpr std::array<std::pair<ClosedFormMode, const char*>, 2> v{
      {{ClosedFormMode::blocked, "blocked"}, {ClosedFormMode::per_step, "per_step"}}};
};
template <>
struct Names<SteppingMode> {
  static constexpr std::array<std::pair<SteppingMode, const char*>, 2> v{
      {{SteppingMode::blocked, "blocked"}, {SteppingMode::per_step, "per_step"}}};
};
}  // namespace choice_detail

/// The enums above (those with names).
template <class E>
concept Choice = requires { choice_detail::Names<E>::v; };

/// The config spelling of `e` ("kv_head", "mean", "float32", ...).
template <Choice E>
const char* to_string(E e) {
  for (const auto& [value, name] : choice_detail::Names<E>::v)
    if (value == e) return name;
  return "?";
}

/// `text` as a choice of E; nullopt when it is none of E's names.
template <Choice E>
std::optional<E> parse_choice(std::string_view text) {
  for (const auto& [value, name] : choice_detail::Names<E>::v)
    if (text == name) return value;
  return std::nullopt;
}

/// E's names in order (a command-line option's allowed values: CLI::IsMember(choice_list<GqaMode>())).
template <Choice E>
std::vector<std::string> choice_list() {
  std::vector<std::string> out;
  for (const auto& [value, name] : choice_detail::Names<E>::v) out.emplace_back(name);
  return out;
}

/// E's names for an error message: "\"mean\", \"max\" or \"sum\"".
template <Choice E>
std::string choice_names() {
  // Written as appends: GCC 12.2 at -O3 -march=native on a Sapphire Rapids host folded the former
  // nested `i == 0 ? "" : i + 1 == size ? " or " : ", "` to ", " for the last name (its value-range
  // pass: -fno-tree-vrp restored it); tests/unit/test_engine.cpp checks the message.
  const auto& v = choice_detail::Names<E>::v;
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += i + 1 < v.size() ? ", " : " or ";
    out += '"';
    out += v[i].second;
    out += '"';
  }
  return out;
}

}  // namespace kvsim
