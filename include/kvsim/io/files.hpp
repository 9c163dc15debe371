// kvsim: small text outputs (CSV, JSON) written the way every kvsim result is: to PATH.tmp, then
// renamed into place, so a failed run never leaves a half-written file.
#pragma once
#include <string>

namespace kvsim {

/// Writes `text` to `path` atomically; throws kvsim::Error naming the file when it cannot be written
/// or moved into place.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kvsim
