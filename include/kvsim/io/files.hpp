// kvsim: small text outputs (CSV, JSON) written the way every kvsim result is: to PATH.tmp, then
// renamed into place, so a failed run never leaves a half-written file.
#pragma once
#include <string>

namespace kvsim {

/// Writes `text` to `path` atomically; throws kvsim::Error naming the file when it cannot be written
/// or moved into place.
void write_file_atomically(const std::string& path, const std::string& text);

/// One CSV field (RFC 4180): as is, or double-quoted with inner quotes doubled when it holds a
/// comma, quote or newline — e.g. a policy label `h2o(budget=0.1,group_agg=max)`.
std::string csv_field(const std::string& s);

}  // namespace kvsim
