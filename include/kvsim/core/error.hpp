// kvsim: error type used across the library. Every user-facing failure (bad file, bad config,
// bad argument) is a kvsim::Error whose message names the file / dataset / key at fault; the CLI
// prints it and exits with a non-zero status.
#pragma once
#include <stdexcept>
#include <string>

namespace kvsim {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace kvsim
