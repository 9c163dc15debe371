#include "kvsim/io/files.hpp"

#include <filesystem>
#include <fstream>

#include "kvsim/core/error.hpp"

namespace kvsim {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream o(tmp);
    if (!o) throw Error(path + ": cannot write");
    o << text;
    o.flush();
    if (!o) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw Error(path + ": write failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path + ": cannot move into place: " + ec.message());
}

}  // namespace kvsim
