#include "keraunos/codegen/lower.h"

#include "keraunos/codegen/reuse_reduced_values.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/meta.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace keraunos::codegen {

using kir::Index;

namespace {

bool is_low_float(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

// The dtype of the tensor operands of an elementwise prim (they agree; numbers follow).
DType operand_dtype(const BoundSymbol& b) {
  for (const auto& a : b.args)
    if (a.is_tensor()) return a.tensor()->dtype;
  return b.outputs().at(0)->dtype;
}

} // namespace

bool kernel_supports(const BoundSymbol& b) {
  auto outs = b.outputs();
  if (outs.size() != 1) return false;
  DType out = outs[0]->dtype;
  DType in = operand_dtype(b);
  switch (b.op) {
  case OpId::prim_div:
  case OpId::prim_floor_divide:
  case OpId::prim_remainder:
  case OpId::prim_fmod:
  case OpId::prim_pow:
    // Integer division by zero raises in eager; integer pow has its own rules.
    return is_float(in);
  case OpId::prim_exp:
  case OpId::prim_exp2:
  case OpId::prim_log:
  case OpId::prim_log2:
  case OpId::prim_log1p:
  case OpId::prim_expm1:
  case OpId::prim_sin:
  case OpId::prim_cos:
  case OpId::prim_tan:
  case OpId::prim_tanh:
  case OpId::prim_sigmoid:
  case OpId::prim_sqrt:
  case OpId::prim_rsqrt:
  case OpId::prim_erf:
  case OpId::prim_reciprocal:
    return is_float(in) && in == out;
  case OpId::prim_convert_element_type:
    // Float to integer conversion of out-of-range values is undefined in C++ and differs
    // between eager's kernels: leave it to torch.
    return !(is_float(in) && !is_float(out) && !is_bool(out));
  case OpId::prim_clone:
  case OpId::prim_abs:
  case OpId::prim_neg:
  case OpId::prim_floor:
  case OpId::prim_ceil:
  case OpId::prim_round:
  case OpId::prim_trunc:
  case OpId::prim_sign:
  case OpId::prim_isnan:
  case OpId::prim_isinf:
  case OpId::prim_bitwise_not:
  case OpId::prim_logical_not:
  case OpId::prim_add:
  case OpId::prim_sub:
  case OpId::prim_mul:
  case OpId::prim_maximum:
  case OpId::prim_minimum:
  case OpId::prim_eq:
  case OpId::prim_ne:
  case OpId::prim_lt:
  case OpId::prim_le:
  case OpId::prim_gt:
  case OpId::prim_ge:
  case OpId::prim_bitwise_and:
  case OpId::prim_bitwise_or:
  case OpId::prim_bitwise_xor:
  case OpId::prim_logical_and:
  case OpId::prim_logical_or:
  case OpId::prim_logical_xor:
  case OpId::prim_where:
  case OpId::prim_broadcast_in_dim:
  case OpId::prim_reshape:
  case OpId::prim_permute:
  case OpId::prim_slice:
  case OpId::prim_squeeze:
  case OpId::prim_diagonal:
  case OpId::prim_as_strided:
  case OpId::prim_restride:
  case OpId::prim_full:
    return true;
  case OpId::prim_iota:
    return !is_low_float(out);
  case OpId::prim_sum:
  case OpId::prim_amax:
  case OpId::prim_amin:
    return true;
  case OpId::prim_prod:
    return !is_bool(in);
  case OpId::prim_var:
    return is_float(in);
  default:
    return false;
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Index arithmetic over loop variables with known extents.

struct Dim {
  Index ix;
  std::set<std::string> deps; // variables of the opaque part
};

struct Vars {
  std::unordered_map<std::string, int64_t> extent;
};

Dim constant(int64_t c) {
  Dim d;
  d.ix.constant = c;
  return d;
}

Dim variable(const std::string& v) {
  Dim d;
  d.ix.terms.push_back({v, 1});
  return d;
}

std::set<std::string> deps_of(const Dim& d) {
  std::set<std::string> s = d.deps;
  for (const auto& [v, c] : d.ix.terms) s.insert(v);
  return s;
}

void add_scaled(Index& acc, std::set<std::string>& deps, const Dim& d, int64_t scale) {
  if (scale == 0) return;
  for (const auto& [v, c] : d.ix.terms) {
    bool found = false;
    for (auto& [w, e] : acc.terms)
      if (w == v) {
        e += c * scale;
        found = true;
      }
    if (!found) acc.terms.push_back({v, c * scale});
  }
  acc.terms.erase(std::remove_if(acc.terms.begin(), acc.terms.end(),
                                 [](const auto& t) { return t.second == 0; }),
                  acc.terms.end());
  acc.constant += d.ix.constant * scale;
  if (!d.ix.opaque.empty()) {
    std::string term = scale == 1 ? "(" + d.ix.opaque + ")"
                                  : "(" + d.ix.opaque + ") * " + std::to_string(scale);
    acc.opaque = acc.opaque.empty() ? term : acc.opaque + " + " + term;
    deps.insert(d.deps.begin(), d.deps.end());
  }
}

// sum(scale_k * dims_k)
Dim linear(const std::vector<Dim>& dims, const Shape& scales) {
  Dim out;
  for (size_t k = 0; k < dims.size(); ++k) add_scaled(out.ix, out.deps, dims[k], scales[k]);
  return out;
}

// The largest value an affine index takes (coefficients may be negative); nullopt if opaque.
bool affine_range(const Dim& d, const Vars& vars, int64_t* lo, int64_t* hi) {
  if (!d.ix.opaque.empty()) return false;
  int64_t a = d.ix.constant, b = d.ix.constant;
  for (const auto& [v, c] : d.ix.terms) {
    int64_t span = c * (vars.extent.at(v) - 1);
    (span > 0 ? b : a) += span;
  }
  *lo = a;
  *hi = b;
  return true;
}

// (d / div) % mod, simplified where the ranges allow (mod <= 0: no modulus).
Dim div_mod(const Dim& d, int64_t div, int64_t mod, const Vars& vars) {
  int64_t lo, hi;
  if (affine_range(d, vars, &lo, &hi) && lo >= 0) {
    // Split into terms whose coefficient is a multiple of div and the rest.
    Dim high, low;
    for (const auto& [v, c] : d.ix.terms) (c % div == 0 ? high : low).ix.terms.push_back({v, c});
    high.ix.constant = d.ix.constant - d.ix.constant % div;
    low.ix.constant = d.ix.constant % div;
    int64_t llo, lhi;
    bool ok = true;
    for (const auto& [v, c] : low.ix.terms) ok = ok && c > 0;
    for (const auto& [v, c] : high.ix.terms) ok = ok && c > 0;
    if (ok && affine_range(low, vars, &llo, &lhi) && llo >= 0 && lhi < div) {
      Dim q;
      for (const auto& [v, c] : high.ix.terms) q.ix.terms.push_back({v, c / div});
      q.ix.constant = high.ix.constant / div;
      if (mod <= 0) return q;
      // Drop terms that are multiples of mod; keep the rest if it stays below mod.
      Dim r;
      for (const auto& [v, c] : q.ix.terms)
        if (c % mod != 0) r.ix.terms.push_back({v, c});
      r.ix.constant = q.ix.constant % mod;
      int64_t rlo, rhi;
      if (affine_range(r, vars, &rlo, &rhi) && rlo >= 0 && rhi < mod) return r;
    }
    if (hi < div) return constant(0);
    if (div == 1 && (mod <= 0 || hi < mod)) return d;
  }
  Dim out;
  std::string s = "(" + d.ix.str() + ")";
  if (div != 1) s = "(" + s + " / " + std::to_string(div) + ")";
  if (mod > 0) s = "(" + s + " % " + std::to_string(mod) + ")";
  out.ix.opaque = s;
  out.deps = deps_of(d);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Literals.

std::string float_literal(double v, DType compute) {
  if (std::isnan(v)) return compute == DType::Float64 ? "kr_nan_d()" : "kr_nan_f()";
  if (std::isinf(v)) {
    std::string s = compute == DType::Float64 ? "kr_inf_d()" : "kr_inf_f()";
    return v < 0 ? "(-" + s + ")" : s;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return compute == DType::Float64 ? std::string("(") + buf + ")"
                                   : std::string("((float)") + buf + ")";
}

std::string literal(const Arg& a, DType compute) {
  if (is_bool(compute)) return a.as_double() != 0 ? "true" : "false";
  if (a.is_bool()) return a.as_bool() ? "1" : "0";
  if (is_float(compute)) return float_literal(a.as_double(), compute);
  if (a.is_float()) {
    // A float scalar in an integer op: eager converts it to the integer type.
    return "((" + std::string(kir::ctype(compute)) + ")" + std::to_string(static_cast<int64_t>(a.as_double())) + "LL)";
  }
  return "((" + std::string(kir::ctype(compute)) + ")" + std::to_string(a.as_int()) + "LL)";
}

// ---------------------------------------------------------------------------------------------
// Kernel generation.

struct Restart {
  const TensorProxy* value; // materialize it (or end its group after it)
};

struct Scope {
  kir::Block block;
  std::vector<std::string> vars; // all variables visible here (outer ones included)
  std::string var;               // this scope's loop variable ("" for the top)
  int64_t extent = 1;
  kir::LoopKind kind = kir::LoopKind::Parallel;
  std::unordered_map<std::string, std::string> memo;
};

class KernelGen {
public:
  KernelGen(const std::unordered_map<const TensorProxy*, const BoundSymbol*>& producer,
            const std::unordered_set<const TensorProxy*>& loadable, kir::Kernel& k,
            KernelCall& call)
      : producer_(producer), loadable_(loadable), k_(k), call_(call) {
    scopes_.emplace_back();
  }

  void open(const std::string& var, int64_t extent, kir::LoopKind kind) {
    Scope s;
    s.vars = scopes_.back().vars;
    s.vars.push_back(var);
    s.var = var;
    s.extent = extent;
    s.kind = kind;
    vars_.extent[var] = extent;
    scopes_.push_back(std::move(s));
  }

  void close() {
    Scope s = std::move(scopes_.back());
    scopes_.pop_back();
    kir::Loop l;
    l.var = s.var;
    l.extent = s.extent;
    l.kind = s.kind;
    l.body = std::move(s.block);
    scopes_.back().block.push_back(kir::Stmt::of(std::move(l)));
  }

  kir::Block finish() {
    KR_INTERNAL(scopes_.size() == 1, "kernel generation left loops open");
    return std::move(scopes_.back().block);
  }

  std::string fresh(const char* prefix) { return prefix + std::to_string(next_++); }

  void emit(kir::Stmt s) {
    const std::string* v = s.kind == kir::Stmt::Kind::Let     ? &s.let.var
                           : s.kind == kir::Stmt::Kind::Load  ? &s.load.var
                           : s.kind == kir::Stmt::Kind::AccInit ? &s.acc.var
                                                                 : nullptr;
    if (v) depth_[*v] = scopes_.size() - 1;
    scopes_.back().block.push_back(std::move(s));
  }

  int buffer_for(const TensorRef& t) {
    auto it = buffers_.find(t.get());
    if (it != buffers_.end()) return it->second;
    kir::Buffer b;
    b.name = "in" + std::to_string(call_.inputs.size());
    b.dtype = t->dtype;
    b.shape = t->shape;
    b.strides = t->strides;
    int idx = static_cast<int>(k_.buffers.size());
    k_.buffers.push_back(b);
    call_.inputs.push_back(t);
    buffers_[t.get()] = idx;
    return idx;
  }

  Vars& vars() { return vars_; }

  // The variable holding `t` at index `idx` (one Dim per dim of t).
  std::string gen(const TensorRef& t, const std::vector<Dim>& idx) {
    std::string key = t->name;
    for (const auto& d : idx) key += "," + d.ix.str();
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto m = it->memo.find(key);
      if (m != it->memo.end()) return m->second;
    }
    std::string v = compute(t, idx);
    scopes_.back().memo[key] = v;
    return v;
  }

private:
  std::string let(DType storage, const std::string& expr, bool costly = false) {
    DType c = kir::compute_dtype(storage);
    std::string e = expr;
    if (storage == DType::Float16) e = "kr_h2f(kr_f2h((float)(" + e + ")))";
    if (storage == DType::BFloat16) e = "kr_bf2f(kr_f2bf((float)(" + e + ")))";
    kir::Let l;
    l.var = fresh("v");
    l.dtype = c;
    l.expr = "(" + std::string(kir::ctype(c)) + ")(" + e + ")";
    l.costly = costly;
    emit(kir::Stmt::of(l));
    return l.var;
  }

  std::string load(const TensorRef& t, const std::vector<Dim>& idx) {
    int buf = buffer_for(t);
    Dim lin = linear(idx, t->strides);
    kir::Load l;
    l.var = fresh("v");
    l.dtype = kir::compute_dtype(t->dtype);
    l.buffer = buf;
    l.index = lin.ix;
    emit(kir::Stmt::of(l));
    return l.var;
  }

  // An operand: a tensor (at idx, broadcast already explicit) or a number.
  std::string operand(const Arg& a, const std::vector<Dim>& idx, DType compute) {
    if (a.is_tensor()) return gen(a.tensor(), idx);
    return literal(a, compute);
  }

  std::string compute(const TensorRef& t, const std::vector<Dim>& idx) {
    if (loadable_.count(t.get())) return load(t, idx);
    auto pit = producer_.find(t.get());
    KR_INTERNAL(pit != producer_.end(), "kernel generation: no producer for ", t->name);
    const BoundSymbol& b = *pit->second;
    const DType out = t->dtype;
    const DType oc = kir::compute_dtype(out);
    const bool costly = b.def().has(tags::X);
    auto un = [&](const std::string& fn) {
      std::string a = operand(b.args[0], idx, oc);
      return let(out, fn + "(" + a + ")", costly);
    };
    auto bin_in = [&](DType in) {
      DType ic = kir::compute_dtype(in);
      return std::pair{operand(b.args[0], idx, ic), operand(b.args[1], idx, ic)};
    };
    auto infix = [&](const char* op) {
      auto [x, y] = bin_in(operand_dtype(b));
      return let(out, x + " " + op + " " + y);
    };
    auto call2 = [&](const char* fn) {
      auto [x, y] = bin_in(operand_dtype(b));
      return let(out, std::string(fn) + "(" + x + ", " + y + ")", costly);
    };
    const DType in = operand_dtype(b);
    switch (b.op) {
    case OpId::prim_clone:
    case OpId::prim_restride:
      return gen(b.args[0].tensor(), idx);
    case OpId::prim_abs:
      return is_bool(in) ? gen(b.args[0].tensor(), idx) : un(is_float(in) ? "kr_abs" : "kr_abs");
    case OpId::prim_neg:
      return un("-");
    case OpId::prim_exp:
      return un("kr_exp");
    case OpId::prim_exp2:
      return un("kr_exp2");
    case OpId::prim_log:
      return un("kr_log");
    case OpId::prim_log2:
      return un("kr_log2");
    case OpId::prim_log1p:
      return un("kr_log1p");
    case OpId::prim_expm1:
      return un("kr_expm1");
    case OpId::prim_sin:
      return un("kr_sin");
    case OpId::prim_cos:
      return un("kr_cos");
    case OpId::prim_tan:
      return un("kr_tan");
    case OpId::prim_tanh:
      return un("kr_tanh");
    case OpId::prim_sigmoid:
      return un("kr_sigmoid");
    case OpId::prim_sqrt:
      return un("kr_sqrt");
    case OpId::prim_rsqrt:
      return un("kr_rsqrt");
    case OpId::prim_erf:
      return un("kr_erf");
    case OpId::prim_reciprocal:
      return un("kr_reciprocal");
    case OpId::prim_floor:
      return is_float(in) ? un("kr_floor") : gen(b.args[0].tensor(), idx);
    case OpId::prim_ceil:
      return is_float(in) ? un("kr_ceil") : gen(b.args[0].tensor(), idx);
    case OpId::prim_round:
      return is_float(in) ? un("kr_round") : gen(b.args[0].tensor(), idx);
    case OpId::prim_trunc:
      return is_float(in) ? un("kr_trunc") : gen(b.args[0].tensor(), idx);
    case OpId::prim_sign:
      return is_bool(in) ? gen(b.args[0].tensor(), idx) : un("kr_sign");
    case OpId::prim_isnan: {
      if (!is_float(in)) return let(out, "false");
      std::string a = operand(b.args[0], idx, kir::compute_dtype(in));
      return let(out, "kr_isnan(" + a + ")");
    }
    case OpId::prim_isinf: {
      if (!is_float(in)) return let(out, "false");
      std::string a = operand(b.args[0], idx, kir::compute_dtype(in));
      return let(out, "kr_isinf(" + a + ")");
    }
    case OpId::prim_bitwise_not:
      return is_bool(in) ? un("!") : un("~");
    case OpId::prim_logical_not: {
      std::string a = operand(b.args[0], idx, kir::compute_dtype(in));
      return let(out, "!(bool)(" + a + ")");
    }
    case OpId::prim_add:
      return infix("+");
    case OpId::prim_sub:
      return infix("-");
    case OpId::prim_mul:
      return is_bool(in) ? infix("&&") : infix("*");
    case OpId::prim_div: {
      // A divisor computed once outside the current loop (softmax's sum, a mean's count):
      // multiply by its reciprocal, as eager's softmax kernels do, instead of dividing each
      // element (a division costs several multiplications). Differs by at most one ulp.
      auto [x, y] = bin_in(in);
      auto d = depth_.find(y);
      if (is_float(in) && d != depth_.end() && d->second + 1 < scopes_.size())
        return let(out, x + " * (" + literal(Arg(1.0), kir::compute_dtype(in)) + " / " + y + ")");
      return let(out, x + " / " + y);
    }
    case OpId::prim_floor_divide:
      return call2("kr_floor_divide");
    case OpId::prim_remainder:
      return call2("kr_remainder");
    case OpId::prim_fmod:
      return call2("kr_fmod");
    case OpId::prim_pow:
      if (b.args[0].is_tensor() && b.args[1].is_number()) {
        // Eager's pow special-cases these exponents (pow_tensor_scalar_optimized): match it.
        double e = b.args[1].as_double();
        std::string x = gen(b.args[0].tensor(), idx);
        std::string one = literal(Arg(1.0), oc);
        if (e == 2) return let(out, x + " * " + x);
        if (e == 3) return let(out, x + " * " + x + " * " + x);
        if (e == 0.5) return let(out, "kr_sqrt(" + x + ")");
        if (e == -0.5) return let(out, "kr_rsqrt(" + x + ")");
        if (e == -1) return let(out, one + " / " + x);
        if (e == -2) return let(out, one + " / (" + x + " * " + x + ")");
      }
      return call2("kr_pow");
    case OpId::prim_maximum:
      return call2("kr_maximum");
    case OpId::prim_minimum:
      return call2("kr_minimum");
    case OpId::prim_eq:
      return infix("==");
    case OpId::prim_ne:
      return infix("!=");
    case OpId::prim_lt:
      return infix("<");
    case OpId::prim_le:
      return infix("<=");
    case OpId::prim_gt:
      return infix(">");
    case OpId::prim_ge:
      return infix(">=");
    case OpId::prim_bitwise_and:
      return infix("&");
    case OpId::prim_bitwise_or:
      return infix("|");
    case OpId::prim_bitwise_xor:
      return infix("^");
    case OpId::prim_logical_and:
    case OpId::prim_logical_or:
    case OpId::prim_logical_xor: {
      auto [x, y] = bin_in(in);
      const char* op = b.op == OpId::prim_logical_and  ? " && "
                       : b.op == OpId::prim_logical_or ? " || "
                                                       : " != ";
      return let(out, "(bool)(" + x + ")" + op + "(bool)(" + y + ")");
    }
    case OpId::prim_where: {
      std::string c = operand(b.args[0], idx, DType::Bool);
      DType vd = b.args[1].is_tensor() ? b.args[1].tensor()->dtype
                 : b.args[2].is_tensor() ? b.args[2].tensor()->dtype
                                         : out;
      DType vc = kir::compute_dtype(vd);
      std::string x = operand(b.args[1], idx, vc), y = operand(b.args[2], idx, vc);
      return let(out, "(bool)(" + c + ") ? " + x + " : " + y);
    }
    case OpId::prim_convert_element_type: {
      const auto& a = b.args[0].tensor();
      std::string x = gen(a, idx);
      if (is_bool(out)) return let(out, x + " != 0");
      return let(out, x);
    }
    case OpId::prim_full:
      return let(out, literal(b.args[1], oc));
    case OpId::prim_iota: {
      // start + step * i, in the output dtype (eager's arange computes in it too).
      std::string i = "(" + std::string(kir::ctype(oc)) + ")(" + idx.at(0).ix.str() + ")";
      return let(out, literal(b.args[1], oc) + " + " + literal(b.args[2], oc) + " * " + i);
    }
    case OpId::prim_broadcast_in_dim: {
      const auto& a = b.args[0].tensor();
      Shape bd = b.args[2].int_list();
      std::vector<Dim> ai(a->ndim());
      for (int64_t k = 0; k < a->ndim(); ++k)
        ai[k] = a->shape[k] == 1 ? constant(0) : idx.at(bd[k]);
      return gen(a, ai);
    }
    case OpId::prim_permute: {
      const auto& a = b.args[0].tensor();
      Shape perm = b.args[1].int_list();
      std::vector<Dim> ai(a->ndim());
      for (size_t k = 0; k < perm.size(); ++k) ai[perm[k]] = idx[k];
      return gen(a, ai);
    }
    case OpId::prim_reshape: {
      const auto& a = b.args[0].tensor();
      Dim lin = linear(idx, contiguous_strides(t->shape));
      Shape as = contiguous_strides(a->shape);
      std::vector<Dim> ai(a->ndim());
      for (int64_t k = 0; k < a->ndim(); ++k)
        ai[k] = a->shape[k] == 1 ? constant(0)
                                 : div_mod(lin, as[k], k == 0 ? 0 : a->shape[k], vars_);
      return gen(a, ai);
    }
    case OpId::prim_slice: {
      const auto& a = b.args[0].tensor();
      Shape start = b.args[1].int_list(), step = b.args[3].int_list();
      std::vector<Dim> ai(a->ndim());
      for (int64_t k = 0; k < a->ndim(); ++k) {
        Dim d;
        add_scaled(d.ix, d.deps, idx[k], step[k]);
        d.ix.constant += start[k];
        ai[k] = d;
      }
      return gen(a, ai);
    }
    case OpId::prim_squeeze: {
      const auto& a = b.args[0].tensor();
      Shape dims = b.args[1].int_list();
      std::vector<Dim> ai;
      size_t j = 0;
      for (int64_t k = 0; k < a->ndim(); ++k) {
        if (std::find(dims.begin(), dims.end(), k) != dims.end())
          ai.push_back(constant(0));
        else
          ai.push_back(idx.at(j++));
      }
      return gen(a, ai);
    }
    case OpId::prim_diagonal: {
      const auto& a = b.args[0].tensor();
      int64_t off = b.args[1].as_int();
      int64_t d1 = wrap_dim(b.args[2].as_int(), a->ndim(), "diagonal");
      int64_t d2 = wrap_dim(b.args[3].as_int(), a->ndim(), "diagonal");
      std::vector<Dim> ai(a->ndim());
      size_t j = 0;
      for (int64_t k = 0; k < a->ndim(); ++k)
        if (k != d1 && k != d2) ai[k] = idx.at(j++);
      const Dim& di = idx.back();
      Dim x = di, y = di;
      if (off >= 0)
        y.ix.constant += off;
      else
        x.ix.constant -= off;
      ai[d1] = x;
      ai[d2] = y;
      return gen(a, ai);
    }
    case OpId::prim_as_strided: {
      const auto& a = b.args[0].tensor();
      Shape stride = b.args[2].int_list();
      Dim d = linear(idx, stride);
      d.ix.constant += b.args[3].as_int();
      return gen(a, {d});
    }
    case OpId::prim_sum:
    case OpId::prim_prod:
    case OpId::prim_amax:
    case OpId::prim_amin:
    case OpId::prim_var:
      return reduce(t, b, idx);
    default:
      KR_INTERNAL(false, "kernel generation: unsupported prim ", b.def().id_name);
    }
    return "";
  }

  // Places a reduction at the outermost scope its index depends on.
  std::string reduce(const TensorRef& t, const BoundSymbol& b, const std::vector<Dim>& idx) {
    const auto& a = b.args[0].tensor();
    Shape dims = b.args[1].int_list();
    // Its index must name each of its points once (distinct variables with coefficient 1 or
    // constants), and no enclosing loop outside those variables may repeat it.
    std::set<std::string> deps;
    for (const auto& d : idx) {
      if (!d.ix.affine() || d.ix.terms.size() > 1) throw Restart{t.get()};
      if (d.ix.terms.size() == 1) {
        if (d.ix.terms[0].second != 1 || d.ix.constant != 0) throw Restart{t.get()};
        if (!deps.insert(d.ix.terms[0].first).second) throw Restart{t.get()};
      }
    }
    size_t place = 0;
    for (size_t s = 0; s < scopes_.size(); ++s) {
      bool covers = true;
      for (const auto& v : deps)
        if (std::find(scopes_[s].vars.begin(), scopes_[s].vars.end(), v) == scopes_[s].vars.end())
          covers = false;
      if (covers) {
        place = s;
        break;
      }
    }
    for (size_t s = 1; s <= place; ++s)
      if (!deps.count(scopes_[s].var) && scopes_[s].extent > 1) throw Restart{t.get()};
    std::string key = "reduce:" + t->name;
    for (const auto& d : idx) key += "," + d.ix.str();
    // Move the inner scopes aside, generate at `place`, put them back.
    std::vector<Scope> saved(std::make_move_iterator(scopes_.begin() + place + 1),
                             std::make_move_iterator(scopes_.end()));
    scopes_.resize(place + 1);
    std::string result;
    auto m = scopes_.back().memo.find(key);
    if (m != scopes_.back().memo.end()) {
      result = m->second;
    } else {
      result = reduce_here(t, b, a, dims, idx);
      scopes_.back().memo[key] = result;
    }
    for (auto& s : saved) scopes_.push_back(std::move(s));
    return result;
  }

  // One pass over the reduced dims: `acc op= value(a at the full index)`.
  std::string reduction_loop(const TensorRef& a, const Shape& dims, const std::vector<Dim>& idx,
                             kir::ReduceOp op, DType acc_dtype,
                             const std::function<std::string(const std::string&)>& value) {
    kir::AccInit init;
    init.var = fresh("a");
    init.dtype = acc_dtype;
    init.op = op;
    emit(kir::Stmt::of(init));
    std::vector<Dim> full;
    size_t j = 0;
    int opened = 0;
    for (int64_t k = 0; k < a->ndim(); ++k) {
      if (std::find(dims.begin(), dims.end(), k) != dims.end()) {
        if (a->shape[k] == 1) {
          full.push_back(constant(0));
        } else {
          std::string r = fresh("r");
          open(r, a->shape[k], kir::LoopKind::Reduce);
          ++opened;
          full.push_back(variable(r));
        }
      } else {
        full.push_back(idx.at(j++));
      }
    }
    std::string x = gen(a, full);
    std::string v = value(x);
    kir::AccUpdate u;
    u.var = init.var;
    u.op = op;
    u.value = v;
    emit(kir::Stmt::of(u));
    for (int i = 0; i < opened; ++i) close();
    return init.var;
  }

  std::string reduce_here(const TensorRef& t, const BoundSymbol& b, const TensorRef& a,
                          const Shape& dims, const std::vector<Dim>& idx) {
    const DType ac = kir::compute_dtype(t->dtype);
    auto cast_to = [&](DType d) {
      return [this, d](const std::string& x) {
        kir::Let l;
        l.var = fresh("v");
        l.dtype = d;
        l.expr = "(" + std::string(kir::ctype(d)) + ")(" + x + ")";
        emit(kir::Stmt::of(l));
        return l.var;
      };
    };
    // `op` over `a` cast to `d`, computed once per scope: layer_norm's mean and the first pass
    // of its variance are the same sum when both accumulate in the same dtype.
    auto plain = [&](kir::ReduceOp op, DType d) {
      std::string key = "plain:" + a->name + ":" + std::to_string(static_cast<int>(op)) + ":" +
                        std::string(kir::ctype(d));
      for (auto dim : dims) key += "," + std::to_string(dim);
      for (const auto& x : idx) key += ";" + x.ix.str();
      if (auto m = scopes_.back().memo.find(key); m != scopes_.back().memo.end()) return m->second;
      std::string acc = reduction_loop(a, dims, idx, op, d, cast_to(d));
      // (Not a reference taken before: the loop's scopes may reallocate scopes_.)
      scopes_.back().memo[key] = acc;
      return acc;
    };
    switch (b.op) {
    case OpId::prim_sum:
      return let(t->dtype, plain(kir::ReduceOp::Sum, ac));
    case OpId::prim_prod:
      return let(t->dtype, plain(kir::ReduceOp::Prod, ac));
    case OpId::prim_amax:
      return let(t->dtype, plain(kir::ReduceOp::Max, ac));
    case OpId::prim_amin:
      return let(t->dtype, plain(kir::ReduceOp::Min, ac));
    case OpId::prim_var: {
      // Two passes (the mean, then the squared deviations from it) in eager's accumulation
      // type: double on the CPU (its var accumulates floats in double), the compute dtype on
      // CUDA (float for float and half inputs: eager's Welford runs in float there, and float
      // math keeps the kernel at the memory bandwidth; two passes are the more accurate form).
      const DType vd = k_.device == DeviceType::CUDA ? ac : DType::Float64;
      const char* vc = kir::ctype(vd);
      int64_t n = 1;
      for (auto d : dims) n *= a->shape[d];
      double corr = b.args[2].as_double();
      std::string s = plain(kir::ReduceOp::Sum, vd);
      kir::Let mean;
      mean.var = fresh("v");
      mean.dtype = vd;
      mean.expr = s + " / " + float_literal(static_cast<double>(n), vd);
      emit(kir::Stmt::of(mean));
      std::string q = reduction_loop(
          a, dims, idx, kir::ReduceOp::Sum, vd, [&](const std::string& x) {
            kir::Let d;
            d.var = fresh("v");
            d.dtype = vd;
            d.expr = "((" + std::string(vc) + ")(" + x + ") - " + mean.var + ")";
            emit(kir::Stmt::of(d));
            kir::Let sq;
            sq.var = fresh("v");
            sq.dtype = vd;
            sq.expr = d.var + " * " + d.var;
            emit(kir::Stmt::of(sq));
            return sq.var;
          });
      if (kir::Block& blk = scopes_.back().block;
          !blk.empty() && blk.back().kind == kir::Stmt::Kind::Loop)
        blk.back().loop->deviations = kir::Loop::Deviations{s, mean.var};
      double denom = std::max(0.0, static_cast<double>(n) - corr);
      return let(t->dtype, q + " / " + float_literal(denom, vd));
    }
    default:
      KR_INTERNAL(false, "reduce_here: not a reduction");
    }
    return "";
  }

  const std::unordered_map<const TensorProxy*, const BoundSymbol*>& producer_;
  const std::unordered_set<const TensorProxy*>& loadable_;
  kir::Kernel& k_;
  KernelCall& call_;
  std::vector<Scope> scopes_;
  std::unordered_map<const TensorProxy*, int> buffers_;
  Vars vars_;
  int next_ = 0;
  std::unordered_map<std::string, size_t> depth_; // scope depth where each variable is defined
};

// The strides a kernel output is allocated with: the proxy's when they describe a dense,
// non-overlapping layout, else contiguous.
Shape output_strides(const TensorRef& t) {
  if (non_overlapping_dense(t->shape, t->strides)) return t->strides;
  return contiguous_strides(t->shape);
}

// Parallel loops below the first one whose body holds more than the next loop become Inner.
void mark_inner(kir::Block& top) {
  kir::Block* b = &top;
  bool inner = false;
  while (true) {
    kir::Loop* next = nullptr;
    for (auto& s : *b)
      if (s.kind == kir::Stmt::Kind::Loop && s.loop->kind == kir::LoopKind::Parallel)
        next = s.loop.get();
    if (!next) return;
    if (b->size() > 1) inner = true;
    if (inner) next->kind = kir::LoopKind::Inner;
    b = &next->body;
  }
}

struct Segment {
  std::vector<const BoundSymbol*> members;
};

class SegmentLowering {
public:
  SegmentLowering(const Segment& seg, const std::unordered_set<const TensorProxy*>& needed,
                  DeviceType device, const std::string& prefix, int* counter)
      : seg_(seg), needed_(needed), device_(device), prefix_(prefix), counter_(counter) {
    for (size_t i = 0; i < seg.members.size(); ++i)
      for (const auto& o : seg.members[i]->outputs()) {
        producer_[o.get()] = seg.members[i];
        position_[o.get()] = static_cast<int>(i);
      }
  }

  std::vector<KernelCall> run() {
    // Values to materialize, in definition order.
    std::set<std::pair<int, const TensorProxy*>> mat;
    std::unordered_map<const TensorProxy*, TensorRef> refs;
    for (const auto* m : seg_.members)
      for (const auto& o : m->outputs()) {
        refs[o.get()] = o;
        if (needed_.count(o.get())) mat.insert({position_[o.get()], o.get()});
      }
    std::set<const TensorProxy*> breaks_after;
    for (int attempt = 0;; ++attempt) {
      KR_INTERNAL(attempt < 10000, "kernel lowering did not converge");
      try {
        return build(mat, breaks_after, refs);
      } catch (const Restart& r) {
        auto key = std::pair{position_.at(r.value), r.value};
        if (mat.count(key))
          breaks_after.insert(r.value);
        else
          mat.insert(key);
      }
    }
  }

private:
  std::vector<KernelCall> build(const std::set<std::pair<int, const TensorProxy*>>& mat,
                                const std::set<const TensorProxy*>& breaks_after,
                                const std::unordered_map<const TensorProxy*, TensorRef>& refs) {
    // Groups: consecutive materialized values of one shape.
    std::vector<std::vector<TensorRef>> groups;
    const TensorProxy* prev = nullptr;
    for (const auto& [pos, p] : mat) {
      const TensorRef& t = refs.at(p);
      bool same = prev && prev->shape == t->shape && !breaks_after.count(prev) &&
                  output_strides(refs.at(prev)) == output_strides(t);
      if (!same) groups.emplace_back();
      groups.back().push_back(t);
      prev = p;
    }
    std::vector<KernelCall> calls;
    std::unordered_set<const TensorProxy*> loadable;
    // Everything not produced in the segment is loaded.
    for (const auto* m : seg_.members)
      for (const auto& in : m->inputs())
        if (!producer_.count(in.get())) loadable.insert(in.get());
    int local = 0;
    for (const auto& g : groups) {
      KernelCall call;
      kir::Kernel& k = call.kernel;
      k.name = prefix_ + std::to_string(*counter_ + local++);
      k.device = device_;
      KernelGen gen(producer_, loadable, k, call);
      const TensorRef& first = g.front();
      Shape ost = output_strides(first);
      // Loop order: outermost = largest output stride; size-1 dims are not looped.
      std::vector<int64_t> order;
      for (int64_t d = 0; d < first->ndim(); ++d)
        if (first->shape[d] != 1) order.push_back(d);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return ost[x] > ost[y]; });
      std::vector<Dim> idx(first->ndim(), constant(0));
      bool empty = first->numel() == 0;
      if (!empty)
        for (int64_t d : order) {
          std::string v = gen.fresh("i");
          gen.open(v, first->shape[d], kir::LoopKind::Parallel);
          idx[d] = variable(v);
        }
      std::vector<std::pair<int, std::string>> stores;
      for (const auto& t : g) {
        kir::Buffer b;
        b.name = "out" + std::to_string(call.outputs.size());
        b.dtype = t->dtype;
        b.output = true;
        b.shape = t->shape;
        b.strides = output_strides(t);
        call.outputs.push_back(t);
        call.write_into.push_back(nullptr);
        out_buffers_.push_back(b);
        if (empty) continue;
        std::string v = gen.gen(t, idx);
        stores.push_back({static_cast<int>(out_buffers_.size() - 1), v});
      }
      // Output buffers come after the inputs; their indices are known only now.
      int first_out = static_cast<int>(k.buffers.size());
      int base = static_cast<int>(out_buffers_.size() - g.size());
      for (size_t i = 0; i < g.size(); ++i) k.buffers.push_back(out_buffers_[base + i]);
      for (const auto& [ob, v] : stores) {
        kir::Store s;
        s.buffer = first_out + (ob - base);
        s.index = linear(idx, k.buffers[s.buffer].strides).ix;
        s.value = v;
        gen.emit(kir::Stmt::of(s));
      }
      if (!empty)
        for (size_t i = 0; i < order.size(); ++i) gen.close();
      k.body = gen.finish();
      mark_inner(k.body);
      kir::fuse_sibling_reductions(k.body);
      // CPU kernels re-read rows from cache cheaply; GPU kernels prefer recomputing.
      if (device_ == DeviceType::CPU) reuse_reduced_values(k);
      kir::hoist_invariants(k.body);
      for (const auto& t : g) loadable.insert(t.get());
      calls.push_back(std::move(call));
    }
    *counter_ += local;
    return calls;
  }

  const Segment& seg_;
  const std::unordered_set<const TensorProxy*>& needed_;
  DeviceType device_;
  std::string prefix_;
  int* counter_;
  std::unordered_map<const TensorProxy*, const BoundSymbol*> producer_;
  std::unordered_map<const TensorProxy*, int> position_;
  std::vector<kir::Buffer> out_buffers_;
};

} // namespace

LoweredRegion lower_region(const std::vector<BoundSymbol>& prims,
                           const std::vector<TensorRef>& needed, DeviceType device,
                           const std::string& prefix) {
  LoweredRegion out;
  // Values read after each position: by later prims of the region or after the region.
  std::unordered_map<const TensorProxy*, int> last_read;
  for (size_t i = 0; i < prims.size(); ++i)
    for (const auto& t : prims[i].inputs()) last_read[t.get()] = static_cast<int>(i);
  std::unordered_set<const TensorProxy*> after;
  for (const auto& t : needed) after.insert(t.get());

  int counter = 0;
  size_t i = 0;
  while (i < prims.size()) {
    if (!kernel_supports(prims[i])) {
      Step s;
      s.bsym = prims[i];
      out.steps.push_back(std::move(s));
      ++i;
      continue;
    }
    size_t j = i;
    Segment seg;
    // Long chains are cut into segments of at most kMaxSegment prims: generation recurses
    // along data edges, and a kernel of thousands of ops compiles slowly for no gain.
    constexpr size_t kMaxSegment = 256;
    while (j < prims.size() && kernel_supports(prims[j]) && j - i < kMaxSegment)
      seg.members.push_back(&prims[j++]);
    // Needed: read after the segment.
    std::unordered_set<const TensorProxy*> seg_needed;
    for (size_t m = i; m < j; ++m)
      for (const auto& o : prims[m].outputs()) {
        auto it = last_read.find(o.get());
        if (after.count(o.get()) || (it != last_read.end() && it->second >= static_cast<int>(j)))
          seg_needed.insert(o.get());
      }
    SegmentLowering sl(seg, seg_needed, device, prefix, &counter);
    for (auto& c : sl.run()) {
      Step s;
      s.kernel = static_cast<int>(out.kernels.size());
      out.kernels.push_back(std::move(c));
      out.steps.push_back(std::move(s));
    }
    i = j;
  }
  return out;
}

} // namespace keraunos::codegen
