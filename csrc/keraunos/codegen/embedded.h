// Device helper files (codegen/device/: kr_cpu.h, kr_cuda.cuh, ...) are real files, so they can
// be read, linted and compiled on their own; CMake embeds their text into the core at build time
// (cmake/embed_files.cmake), and generated kernels start with it.
#pragma once
#include <cstddef>
#include <string_view>

namespace keraunos::codegen {

// The text of csrc/keraunos/codegen/device/<name>, embedded at build time; an internal error
// when absent.
std::string_view embedded_file(std::string_view name);

namespace detail {
struct EmbeddedFile {
  std::string_view name;
  std::string_view text;
};
// Defined in the generated embedded_files.cpp (build directory).
extern const EmbeddedFile kEmbeddedFiles[];
extern const std::size_t kNumEmbeddedFiles;
} // namespace detail

} // namespace keraunos::codegen
