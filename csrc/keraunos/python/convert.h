// Python <-> Arg conversion for the bindings.
#pragma once
#include "keraunos/ir/value.h"

#include <nanobind/nanobind.h>

namespace keraunos::py {
namespace nb = nanobind;

Arg arg_from_py(nb::handle h);
nb::object arg_to_py(const Arg& a);

} // namespace keraunos::py
