#include "keraunos/codegen/torch_program.h"

#include "keraunos/ir/error.h"

#include <sstream>

namespace keraunos {

namespace {
std::string return_expr(const Arg& out) {
  if (out.is_list()) {
    std::string s = "(";
    for (const auto& e : out.list()) s += return_expr(e) + ", ";
    return s + ")";
  }
  return out.str();
}
} // namespace

namespace {
void emit(std::ostringstream& os, const BoundSymbol& b);
} // namespace

std::string torch_program(const Trace& trace, const std::string& name) {
  std::ostringstream os;
  os << "def " << name << "(";
  for (size_t i = 0; i < trace.inputs.size(); ++i) os << (i ? ", " : "") << trace.inputs[i]->name;
  os << "):\n";
  for (const auto& b : trace.bsyms) emit(os, b);
  return os.str();
}

std::string torch_statement(const BoundSymbol& b) {
  std::ostringstream os;
  emit(os, b);
  return os.str();
}

namespace {
void emit(std::ostringstream& os, const BoundSymbol& b) {
  {
    const OpDef& d = b.def();
    if (d.has(tags::F)) {
      // A region on the torch executor: its members, in order.
      os << "  # fusion region " << b.args.at(1).as_int() << "\n";
      for (const auto& m : b.subsymbols) emit(os, m);
      return;
    }
    if (d.has(tags::Ret)) {
      os << "  return " << return_expr(b.args.at(0)) << "\n";
      return;
    }
    os << "  ";
    if (!b.out.is_none()) {
      auto outs = b.outputs();
      if (b.out.is_list()) {
        for (const auto& t : outs) os << t->name << ", ";
        if (outs.empty()) os << "_";
      } else {
        os << b.out.str();
      }
      os << " = ";
    }
    os << d.torch_fn << "(" << format_call_args(d, b.args) << ")\n";
  }
}
} // namespace

} // namespace keraunos
