#include "keraunos/codegen/torch_program.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

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

ProgramWriter::ProgramWriter(const std::string& name, const std::vector<TensorRef>& inputs, bool boxed)
    : name_(name), boxed_(boxed) {
  for (const auto& t : inputs) inputs_.push_back(t->name);
}

void ProgramWriter::add(std::string text, const std::vector<TensorRef>& reads,
                        const std::vector<TensorRef>& binds) {
  Statement s{std::move(text), {}};
  for (const auto& t : reads) s.names.push_back(t->name);
  for (const auto& t : binds) s.names.push_back(t->name);
  statements_.push_back(std::move(s));
}

void ProgramWriter::add_torch(const BoundSymbol& b) {
  if (b.def().has(tags::F)) {
    add("  # fusion region " + std::to_string(b.args.at(1).as_int()) + "\n", {}, {});
    for (const auto& m : b.subsymbols) add_torch(m);
    return;
  }
  add(torch_statement(b), b.inputs(), b.outputs());
}

std::string ProgramWriter::str() const {
  // Statement 0 is the header (it binds the inputs); the last statement returns, so nothing
  // after it needs freeing.
  std::unordered_map<std::string, size_t> last;
  if (boxed_)
    for (const auto& n : inputs_) last[n] = 0;
  std::unordered_set<std::string> held_by_caller;
  if (!boxed_) held_by_caller.insert(inputs_.begin(), inputs_.end());
  for (size_t i = 0; i < statements_.size(); ++i)
    for (const auto& n : statements_[i].names)
      if (!held_by_caller.count(n)) last[n] = i + 1;
  std::vector<std::vector<std::string>> dead(statements_.size() + 1);
  for (const auto& [n, i] : last)
    if (i < statements_.size()) dead[i].push_back(n);
  for (auto& d : dead) std::sort(d.begin(), d.end());
  auto del = [&](std::ostringstream& os, size_t i) {
    if (dead[i].empty()) return;
    os << "  del ";
    for (size_t k = 0; k < dead[i].size(); ++k) os << (k ? ", " : "") << dead[i][k];
    os << "\n";
  };
  std::ostringstream os;
  os << "def " << name_ << "(";
  if (boxed_) {
    os << "args):\n";
    if (!inputs_.empty()) {
      os << "  ";
      for (const auto& n : inputs_) os << n << ", ";
      os << "= args\n";
    }
    os << "  args.clear()\n";
    del(os, 0);
  } else {
    for (size_t i = 0; i < inputs_.size(); ++i) os << (i ? ", " : "") << inputs_[i];
    os << "):\n";
  }
  for (size_t i = 0; i < statements_.size(); ++i) {
    os << statements_[i].text;
    del(os, i + 1);
  }
  return os.str();
}

std::string torch_program(const Trace& trace, const std::string& name, bool boxed) {
  ProgramWriter w(name, trace.inputs, boxed);
  for (const auto& b : trace.bsyms) w.add_torch(b);
  return w.str();
}

std::string torch_statement(const BoundSymbol& b) {
  std::ostringstream os;
  emit(os, b);
  return os.str();
}

namespace {
// The Python callable of a symbol on the torch executor: the op table's, except for a CPU
// matmul whose result the CPU buffer pool can hold (python/cpu_pool.h: 64 KiB or more).
std::string_view torch_callable(const BoundSymbol& b) {
  const OpDef& d = b.def();
  if (d.id == OpId::matmul || d.id == OpId::prim_matmul) {
    auto outs = b.outputs();
    if (outs.size() == 1 && outs[0]->device.type == DeviceType::CPU &&
        outs[0]->numel() * itemsize(outs[0]->dtype) >= (int64_t{64} << 10))
      return "_kr.cpu_matmul";
  }
  return d.torch_fn;
}

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
    os << torch_callable(b) << "(" << format_call_args(d, b.args) << ")\n";
  }
}
} // namespace

} // namespace keraunos
