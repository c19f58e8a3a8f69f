#include "keraunos/codegen/embedded.h"

#include "keraunos/ir/error.h"

namespace keraunos::codegen {

std::string_view embedded_file(std::string_view name) {
  for (std::size_t i = 0; i < detail::kNumEmbeddedFiles; ++i)
    if (detail::kEmbeddedFiles[i].name == name) return detail::kEmbeddedFiles[i].text;
  KR_INTERNAL(false, "no embedded device file '", name, "' (csrc/keraunos/codegen/device/)");
  return {};
}

} // namespace keraunos::codegen
