// TEMPORARY stand-in for codegen/embedded.cpp (build-time embedding of codegen/device/*, on
// its way from another branch): reads the device file from the source tree at run time
// ($KERAUNOS_DEVICE_DIR, else the directory this build was configured from). Delete this file
// when the real embedding is merged; embedded.h is the same header, so nothing else changes.
#include "keraunos/codegen/embedded.h"

#include "keraunos/ir/error.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

namespace keraunos::codegen {

std::string_view embedded_file(std::string_view name) {
  // Files are read once and kept for the process (the returned views must stay valid).
  static std::mutex mu;
  static std::map<std::string, std::string, std::less<>> files;
  std::lock_guard lock(mu);
  if (auto it = files.find(name); it != files.end()) return it->second;
  const char* env = std::getenv("KERAUNOS_DEVICE_DIR");
  const std::string dir = env && *env ? env : KERAUNOS_DEVICE_DIR;
  const std::string path = dir + "/" + std::string(name);
  std::ifstream in(path, std::ios::binary);
  KR_INTERNAL(in.good(), "no device file '", name, "' (looked for ", path,
              "; set KERAUNOS_DEVICE_DIR to csrc/keraunos/codegen/device)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return files.emplace(std::string(name), ss.str()).first->second;
}

} // namespace keraunos::codegen
