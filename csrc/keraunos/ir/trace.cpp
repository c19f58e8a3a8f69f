#include "keraunos/ir/trace.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace keraunos {

std::vector<TensorRef> BoundSymbol::outputs() const {
  std::vector<TensorRef> outs;
  out.collect_tensors(outs);
  return outs;
}

std::vector<TensorRef> BoundSymbol::inputs() const {
  std::vector<TensorRef> ins;
  for (const auto& a : args) a.collect_tensors(ins);
  return ins;
}

TensorRef BoundSymbol::written() const {
  if (!def().is_inplace()) return nullptr;
  return args.at(0).tensor();
}

const BoundSymbol& Trace::return_symbol() const {
  KR_INTERNAL(!bsyms.empty() && bsyms.back().def().has(tags::Ret), "trace has no return");
  return bsyms.back();
}

static bool arg_equal(const Arg& a, const Arg& b) {
  if (a.v.index() != b.v.index()) {
    if (a.is_number() && b.is_number()) return a.as_double() == b.as_double() && a.is_bool() == b.is_bool();
    return false;
  }
  if (a.is_list()) {
    const auto &la = a.list(), &lb = b.list();
    if (la.size() != lb.size()) return false;
    for (size_t i = 0; i < la.size(); ++i)
      if (!arg_equal(la[i], lb[i])) return false;
    return true;
  }
  if (a.is_tensor()) return a.tensor() == b.tensor();
  return a.v == b.v;
}

std::string format_call_args(const OpDef& d, const Arg::List& args) {
  const auto& ps = d.schema.params;
  std::vector<std::string> parts;
  // Positional parameters up to the last one that differs from its default.
  size_t last = 0;
  for (size_t i = 0; i < ps.size() && i < args.size(); ++i)
    if (!ps[i].kwarg_only && !(ps[i].has_default && arg_equal(args[i], ps[i].default_value)))
      last = i + 1;
  for (size_t i = 0; i < last; ++i) parts.push_back(args[i].str());
  for (size_t i = 0; i < ps.size() && i < args.size(); ++i)
    if (ps[i].kwarg_only && !(ps[i].has_default && arg_equal(args[i], ps[i].default_value)))
      parts.push_back(ps[i].name + "=" + args[i].str());
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
  return s;
}

static std::string out_str(const Arg& out) {
  if (out.is_list()) {
    std::string s;
    for (size_t i = 0; i < out.list().size(); ++i) s += (i ? ", " : "") + out.list()[i].str();
    return out.list().size() == 1 ? s + "," : s;
  }
  return out.str();
}

std::string bsym_line(const BoundSymbol& b) {
  const OpDef& d = b.def();
  if (d.has(tags::Ret)) return "return " + out_str(b.args.at(0));
  std::string call = d.qualified_name() + "(" + format_call_args(d, b.args) + ")";
  if (b.out.is_none()) return call;
  if (b.out.is_list() && b.out.list().empty()) return "_ = " + call;
  return out_str(b.out) + " = " + call;
}

static void print_bsym(std::ostringstream& os, const BoundSymbol& b, int depth, bool subs) {
  std::string indent(2 + 2 * depth, ' ');
  std::string line = bsym_line(b);
  os << indent << (depth ? "# " : "") << line;
  std::vector<std::string> notes;
  if (!b.def().has(tags::Ret)) {
    for (const auto& t : b.outputs()) notes.push_back(t->name + ": " + t->type_str());
  }
  if (depth == 0 && b.loc && b.loc->line > 0) notes.push_back("at " + b.loc->str());
  if (!notes.empty()) {
    os << "  # ";
    for (size_t i = 0; i < notes.size(); ++i) os << (i ? "; " : "") << notes[i];
  }
  os << "\n";
  if (subs)
    for (const auto& s : b.subsymbols) print_bsym(os, s, depth + 1, subs);
}

std::string Trace::str(bool with_subsymbols) const {
  std::ostringstream os;
  char ms_buf[32];
  std::snprintf(ms_buf, sizeof ms_buf, "%.3f", ms);
  os << "# Constructed by " << stage << " (" << ms_buf << " ms)\n";
  os << "def computation(";
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i]->name;
  os << "):\n";
  for (const auto& t : inputs) os << "  # " << t->name << ": " << t->type_str() << "\n";
  for (const auto& b : bsyms) print_bsym(os, b, 0, with_subsymbols);
  return os.str();
}

} // namespace keraunos
