// Binding of the embedded device helper files (codegen/embedded.h), for tests and tools that
// compile kernels by hand.
#include "keraunos/codegen/embedded.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;
using namespace nb::literals;

void bind_embedded(nb::module_& m) {
  m.def("_embedded_file",
        [](const std::string& name) { return std::string(keraunos::codegen::embedded_file(name)); },
        "name"_a);
}
