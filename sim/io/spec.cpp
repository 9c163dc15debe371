#include "kvsim/io/spec.hpp"

#include <cstdio>

#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"

namespace kvsim {

namespace {
constexpr uint64_t kSequenceTag = 0x5e9;
}  // namespace

int sequence_count(const DataSpec& d) {
  if (d.synthetic) return d.sequences;
  return d.paths.empty() ? 1 : int(d.paths.size());
}

DataSpec sequence_spec(const DataSpec& d, int i) {
  if (i < 0 || i >= sequence_count(d))
    throw Error("data: sequence " + std::to_string(i) + " out of range [0, " + std::to_string(sequence_count(d)) + ")");
  DataSpec one = d;
  one.paths.clear();
  one.sequences = 1;
  if (d.synthetic) {
    if (i > 0) one.synth.seed = derive_seed({d.synth.seed, kSequenceTag, uint64_t(i)});
  } else if (!d.paths.empty()) {
    one.path = d.paths[size_t(i)];
  }
  return one;
}

std::string sequence_folder(int i) {
  char dir[32];
  std::snprintf(dir, sizeof dir, "seq_%02d", i);
  return dir;
}

}  // namespace kvsim
