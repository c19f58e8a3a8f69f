#include "keraunos/codegen/lower.h"

#include "keraunos/codegen/kernel_passes.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/meta.h"
#include "keraunos/support/options.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
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

// An integer division whose divisor is a constant a kernel may divide by (Accept::
// FloatOrIntByConstant): a tensor of a non-bool integer dtype over an integer literal in that
// dtype's range, neither 0 nor -1.
bool int_by_constant(const BoundSymbol& b) {
  if (b.args.size() != 2 || !b.args[0].is_tensor() || !b.args[1].is_int()) return false;
  const DType d = b.args[0].tensor()->dtype;
  if (!is_int(d)) return false;
  const int64_t v = b.args[1].as_int();
  if (v == 0 || v == -1) return false;
  if (d == DType::UInt8) return v > 0 && v <= 255;
  // An int8 divided by +-2 came out of NVRTC (CUDA 13) wrong on the H100 and the H200 (-1 // 2
  // gave 127: the byte was not sign extended), even computed in int32; other divisors and
  // dtypes were right. Powers of two stay in torch for int8.
  const uint64_t mag = v < 0 ? -static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  if (d == DType::Int8 && mag > 1 && (mag & (mag - 1)) == 0) return false;
  const int bits = 8 * itemsize(d);
  return bits == 64 || (v >= -(int64_t{1} << (bits - 1)) && v < (int64_t{1} << (bits - 1)));
}

} // namespace

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
  if (d.ix.opaque) {
    kir::Expr term = scale == 1 ? d.ix.opaque
                                : kir::binary(kir::ExprKind::Mul, d.ix.opaque,
                                              kir::int_lit(scale, DType::Int64));
    acc.opaque = acc.opaque ? kir::binary(kir::ExprKind::Add, acc.opaque, term) : term;
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
  if (d.ix.opaque) return false;
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
    ok = ok && affine_range(low, vars, &llo, &lhi) && llo >= 0;
    // One term of the rest may cross div where its coefficient c divides div and the terms
    // below it stay under c: (c * v + below) / div == v / (div / c). A reshape that merges dims
    // gives this (repeat_kv's [b, kv, rep, s, d] -> [b, kv * rep, s, d]: the kv index is
    // head / rep, and s and d stay affine, so the kernel still vectorizes along d).
    std::string cross;
    int64_t cross_c = 0;
    if (ok && lhi >= div) {
      for (const auto& [v, c] : low.ix.terms)
        if (c > cross_c) cross = v, cross_c = c;
      Dim below;
      for (const auto& [v, c] : low.ix.terms)
        if (v != cross) below.ix.terms.push_back({v, c});
      below.ix.constant = low.ix.constant;
      int64_t blo, bhi;
      ok = div % cross_c == 0 && affine_range(below, vars, &blo, &bhi) && blo >= 0 && bhi < cross_c;
    }
    if (ok) {
      Dim q;
      for (const auto& [v, c] : high.ix.terms) q.ix.terms.push_back({v, c / div});
      q.ix.constant = high.ix.constant / div;
      // The crossing term's quotient, v / (div / c), and its largest value.
      kir::Expr vq;
      int64_t vq_hi = 0;
      if (cross_c) {
        vq = kir::binary(kir::ExprKind::Div, variable(cross).ix.expr(),
                         kir::int_lit(div / cross_c, DType::Int64));
        vq_hi = (vars.extent.at(cross) - 1) / (div / cross_c);
      }
      auto with_cross = [&](Dim d) {
        if (vq) {
          d.ix.opaque = vq;
          d.deps = {cross};
        }
        return d;
      };
      if (mod <= 0) return with_cross(q);
      // Drop terms that are multiples of mod; keep the rest if it stays below mod.
      Dim r;
      for (const auto& [v, c] : q.ix.terms)
        if (c % mod != 0) r.ix.terms.push_back({v, c});
      r.ix.constant = q.ix.constant % mod;
      int64_t rlo, rhi;
      if (affine_range(r, vars, &rlo, &rhi) && rlo >= 0 && rhi + vq_hi < mod) return with_cross(r);
    }
    if (hi < div) return constant(0);
    if (div == 1 && (mod <= 0 || hi < mod)) return d;
    // x % mod with x >= 0 drops x's terms that are multiples of mod when the rest stays >= 0
    // (a transpose's merged dim: (256 * i1 + i2) % 32 is i2 % 32).
    if (div == 1 && mod > 0) {
      Dim r;
      for (const auto& [v, c] : d.ix.terms)
        if (c % mod != 0) r.ix.terms.push_back({v, c});
      r.ix.constant = d.ix.constant % mod;
      int64_t rlo, rhi;
      if (r.ix.terms.size() < d.ix.terms.size() && affine_range(r, vars, &rlo, &rhi) && rlo >= 0)
        return div_mod(r, 1, mod, vars);
    }
  }
  Dim out;
  kir::Expr e = d.ix.expr();
  if (div != 1) e = kir::binary(kir::ExprKind::Div, e, kir::int_lit(div, DType::Int64));
  if (mod > 0) e = kir::binary(kir::ExprKind::Mod, e, kir::int_lit(mod, DType::Int64));
  out.ix.opaque = e;
  out.deps = deps_of(d);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Literals.

kir::Expr literal(const Arg& a, DType compute) {
  if (is_bool(compute)) return kir::bool_lit(a.as_double() != 0);
  if (is_float(compute)) return kir::float_lit(a.is_bool() ? (a.as_bool() ? 1.0 : 0.0) : a.as_double(), compute);
  // A float scalar in an integer op: eager converts it to the integer type.
  if (a.is_bool()) return kir::int_lit(a.as_bool() ? 1 : 0, compute);
  if (a.is_float()) return kir::int_lit(static_cast<int64_t>(a.as_double()), compute);
  return kir::int_lit(a.as_int(), compute);
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

// ---------------------------------------------------------------------------------------------
// What a kernel claims: one rule per prim (kernel_rules below), the dtypes it takes and the
// KernelGen method that lowers it, or why it runs through torch. A prim without a rule is an
// internal error (tests/cpp/lower_test.cpp checks every prim of the op table has one).

class KernelGen;

// The random draws of a segment (kernel_random): one seed for all of its kernels, drawn by a
// prim_seed step before the first, and a stream per random tensor (its producer's position in
// the segment), so a tensor recomputed by two kernels draws the same numbers in both.
struct RandomDraws {
  std::string name; // the seed's name in the program
  TensorRef seed;   // created by the first draw
  const TensorRef& seed_of(const Device& dev) {
    if (!seed) {
      auto t = std::make_shared<TensorProxy>();
      t->name = name;
      t->dtype = DType::Int64;
      t->device = dev;
      seed = t;
    }
    return seed;
  }
};

// The dims a reduction prim reduces: its list, or argmax/argmin's one dim (none for a 0-d).
Shape reduced_dims(const BoundSymbol& b) {
  if (b.op == OpId::prim_argmax || b.op == OpId::prim_argmin) {
    if (b.args[0].tensor()->ndim() == 0) return {};
    return {b.args[1].as_int()};
  }
  return b.args[1].int_list();
}

// One element of a prim's result to compute: the result, its producer, the index.
struct Node {
  const TensorRef& t;
  const BoundSymbol& b;
  const std::vector<Dim>& idx;
};

enum class Accept : uint8_t {
  Any,
  FloatOperands,   // float operands (integer division by zero raises in eager; integer pow
                   // has its own rules)
  FloatSameDtype,  // float operands, result in their dtype (the transcendentals)
  FloatOrIntByConstant, // float operands, or an integer tensor and a constant divisor of its
                        // dtype that is neither 0 (eager raises) nor -1 (INT_MIN / -1 traps)
  NoFloatToNarrowInt, // float to int32/int64 only: eager's conversions to narrower integers
                      // of out-of-range values differ between its kernels
  NoHalfResult,    // iota in float16/bfloat16 (eager computes it in the output dtype)
  NoBoolOperands,  // prod of bools
  IndexReduction,  // argmax/argmin: values of at most 32 bits (a float16/bfloat16/float32, a
                   // narrower integer) along a dim shorter than 2^31 (kr_argmax_key)
  Random,          // float draws, with the kernel_random option (support/options.cpp)
  Never,           // runs through torch: `torch` says why
};

struct KernelRule {
  OpId op = OpId::kNumOps;
  Accept accept = Accept::Never;
  std::string (KernelGen::*lower)(const Node&) = nullptr;
  const char* torch = nullptr;
  bool calls_helper = false; // computes the prim by its device helper (kir::prim_helper)
};

// The rule of `op`; one whose `op` is kNumOps when it has none.
const KernelRule& kernel_rule(OpId op);

class KernelGen {
  friend struct RuleTable;

public:
  KernelGen(const std::unordered_map<const TensorProxy*, const BoundSymbol*>& producer,
            const std::unordered_set<const TensorProxy*>& loadable, kir::Kernel& k,
            KernelCall& call, RandomDraws& random,
            const std::unordered_map<const TensorProxy*, int>& position)
      : producer_(producer), loadable_(loadable), k_(k), call_(call), random_(random),
        position_(position) {
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
    if (v) {
      depth_[*v] = scopes_.size() - 1;
      types_[*v] = s.kind == kir::Stmt::Kind::Let    ? s.let.dtype
                   : s.kind == kir::Stmt::Kind::Load ? s.load.dtype
                                                     : s.acc.dtype;
    }
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

  // The scan `t` (a prim_cumsum's result) at `idx`, with its dim `dim` (-1: none, 0-d) not yet
  // indexed: declares its accumulator, opens the Scan loop over `dim` (none when its extent is
  // 1; the caller closes it: returns whether it opened one), sets idx[dim] and adds the element
  // there. `value` receives the running sum, rounded to t's dtype; the caller stores it inside
  // the loop. The sum runs in eager's accumulation type: double for floats on the CPU (its
  // cumsum kernel accumulates in at::acc_type<float, false>), the compute dtype otherwise.
  bool scan(const TensorRef& t, std::vector<Dim>& idx, int64_t dim, std::string* value) {
    const BoundSymbol& b = *producer_.at(t.get());
    KR_INTERNAL(b.op == OpId::prim_cumsum, "kernel generation: ", b.def().id_name,
                " is not a scan");
    const TensorRef& a = b.args[0].tensor();
    const DType c = kir::compute_dtype(t->dtype);
    const DType acc_dtype = is_float(c) && k_.device == DeviceType::CPU ? DType::Float64 : c;
    kir::AccInit init;
    init.var = fresh("a");
    init.dtype = acc_dtype;
    init.op = kir::ReduceOp::Sum;
    emit(kir::Stmt::of(init));
    bool opened = false;
    if (dim >= 0 && t->shape[dim] > 1) {
      std::string v = fresh("s");
      open(v, t->shape[dim], kir::LoopKind::Scan);
      idx[dim] = variable(v);
      opened = true;
    } else if (dim >= 0) {
      idx[dim] = constant(0);
    }
    std::string x = gen(a, idx);
    if (types_.at(x) != acc_dtype) {
      kir::Let cast;
      cast.var = fresh("v");
      cast.dtype = acc_dtype;
      cast.expr = kir::cast(acc_dtype, ref(x));
      emit(kir::Stmt::of(cast));
      x = cast.var;
    }
    kir::AccUpdate u;
    u.var = init.var;
    u.op = kir::ReduceOp::Sum;
    u.value = x;
    emit(kir::Stmt::of(u));
    *value = let(t->dtype, ref(init.var));
    return opened;
  }

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
  // A let of `e` stored as `storage` (rounded to it when it is a half type).
  std::string let(DType storage, kir::Expr e) {
    using kir::call;
    DType c = kir::compute_dtype(storage);
    if (storage == DType::Float16)
      e = call("kr_h2f", {call("kr_f2h", {kir::cast(DType::Float32, e)}, DType::Float16)},
               DType::Float32);
    if (storage == DType::BFloat16)
      e = call("kr_bf2f", {call("kr_f2bf", {kir::cast(DType::Float32, e)}, DType::BFloat16)},
               DType::Float32);
    kir::Let l;
    l.var = fresh("v");
    l.dtype = c;
    l.expr = kir::cast(c, e);
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

  // The variable `name` as an expression.
  kir::Expr ref(const std::string& name) const { return kir::var(name, types_.at(name)); }

  // An operand: a tensor (at idx, broadcast already explicit) or a number.
  kir::Expr operand(const Arg& a, const std::vector<Dim>& idx, DType compute) {
    if (a.is_tensor()) return ref(gen(a.tensor(), idx));
    return literal(a, compute);
  }

  std::string compute(const TensorRef& t, const std::vector<Dim>& idx) {
    if (loadable_.count(t.get())) return load(t, idx);
    auto pit = producer_.find(t.get());
    KR_INTERNAL(pit != producer_.end(), "kernel generation: no producer for ", t->name);
    const BoundSymbol& b = *pit->second;
    const KernelRule& r = kernel_rule(b.op);
    KR_INTERNAL(r.lower, "kernel generation: ", b.def().id_name, " runs through torch (",
                r.torch, ")");
    return (this->*r.lower)(Node{t, b, idx});
  }

  // ---- The lowerings of the rule table (kernel_rules below), one per form of prim. ----

  static DType in_c(const Node& n) { return kir::compute_dtype(operand_dtype(n.b)); }
  static DType out_c(const Node& n) { return kir::compute_dtype(n.t->dtype); }
  kir::Expr arg(const Node& n, size_t i, DType compute) {
    return operand(n.b.args.at(i), n.idx, compute);
  }
  // The device helper of the prim applied to its operands (in the operand dtype).
  kir::Expr helper(const Node& n, DType result) {
    std::vector<kir::Expr> args;
    for (size_t i = 0; i < n.b.args.size(); ++i) args.push_back(arg(n, i, in_c(n)));
    return kir::call(kir::prim_helper(n.b.op), std::move(args), result, n.b.op);
  }

  std::string same(const Node& n) { return gen(n.b.args[0].tensor(), n.idx); }
  std::string call_op(const Node& n) { return let(n.t->dtype, helper(n, in_c(n))); }
  std::string call_unless_bool(const Node& n) {
    return is_bool(operand_dtype(n.b)) ? same(n) : call_op(n);
  }
  std::string call_if_float(const Node& n) {
    return is_float(operand_dtype(n.b)) ? call_op(n) : same(n);
  }
  std::string classify(const Node& n) { // isnan, isinf: false for non-floats
    return let(n.t->dtype, is_float(operand_dtype(n.b)) ? helper(n, DType::Bool)
                                                        : kir::bool_lit(false));
  }
  std::string neg(const Node& n) {
    return let(n.t->dtype, kir::unary(kir::ExprKind::Neg, arg(n, 0, out_c(n))));
  }
  std::string bitwise_not(const Node& n) {
    const auto k = is_bool(operand_dtype(n.b)) ? kir::ExprKind::Not : kir::ExprKind::BitNot;
    return let(n.t->dtype, kir::unary(k, arg(n, 0, out_c(n))));
  }
  std::string logical_not(const Node& n) {
    return let(n.t->dtype,
               kir::unary(kir::ExprKind::Not, kir::cast(DType::Bool, arg(n, 0, in_c(n)))));
  }
  // (Operands are generated in order, each in its own statement: the order of a call's
  // arguments is unspecified, and it decides the order of loads and buffers.)
  template <kir::ExprKind K> std::string infix(const Node& n) {
    kir::Expr x = arg(n, 0, in_c(n));
    kir::Expr y = arg(n, 1, in_c(n));
    return let(n.t->dtype, kir::binary(K, x, y));
  }
  std::string mul(const Node& n) {
    return is_bool(operand_dtype(n.b)) ? infix<kir::ExprKind::And>(n)
                                       : infix<kir::ExprKind::Mul>(n);
  }
  template <kir::ExprKind K> std::string logical(const Node& n) {
    kir::Expr x = kir::cast(DType::Bool, arg(n, 0, in_c(n)));
    kir::Expr y = kir::cast(DType::Bool, arg(n, 1, in_c(n)));
    return let(n.t->dtype, kir::binary(K, x, y));
  }
  // Integer division by a constant d (Accept::FloatOrIntByConstant), as eager computes it:
  // C's truncating / and % (div, fmod), floored for floor_divide and remainder (the result of
  // remainder takes the divisor's sign). Floats call the prim's helper.
  // Integers narrower than 32 bits divide in int32, C's own promotion made explicit (int8 by a
  // power of two still stays in torch: int_by_constant).
  std::string division(const Node& n) {
    if (is_float(operand_dtype(n.b))) return call_op(n);
    using K = kir::ExprKind;
    const DType c = wide_int(in_c(n));
    const int64_t d = n.b.args[1].as_int();
    kir::Expr x = arg(n, 0, c), dl = kir::int_lit(d, c), zero = kir::int_lit(0, c);
    kir::Expr q = kir::binary(K::Div, x, dl), r = kir::binary(K::Mod, x, dl);
    // The remainder has the wrong sign for flooring when it is nonzero and its sign differs
    // from the divisor's.
    kir::Expr off = kir::binary(d > 0 ? K::Lt : K::Gt, r, zero);
    if (n.b.op == OpId::prim_floor_divide)
      return let(n.t->dtype, kir::select(off, kir::binary(K::Sub, q, kir::int_lit(1, c)), q));
    if (n.b.op == OpId::prim_remainder)
      return let(n.t->dtype, kir::select(off, kir::binary(K::Add, r, dl), r));
    KR_INTERNAL(n.b.op == OpId::prim_fmod, "division: not a division prim: ", n.b.def().id_name);
    return let(n.t->dtype, r);
  }
  static DType wide_int(DType c) {
    return c == DType::Int8 || c == DType::UInt8 || c == DType::Int16 ? DType::Int32 : c;
  }
  std::string div(const Node& n) {
    if (!is_float(operand_dtype(n.b))) { // truncating, by a constant (FloatOrIntByConstant)
      const DType c = wide_int(in_c(n));
      return let(n.t->dtype, kir::binary(kir::ExprKind::Div, arg(n, 0, c),
                                         kir::int_lit(n.b.args[1].as_int(), c)));
    }
    // A divisor computed once outside the current loop (softmax's sum, a mean's count):
    // multiply by its reciprocal, as eager's softmax kernels do, instead of dividing each
    // element (a division costs several multiplications). Differs by at most one ulp.
    using K = kir::ExprKind;
    kir::Expr x = arg(n, 0, in_c(n)), y = arg(n, 1, in_c(n));
    auto d = y->kind == K::Var ? depth_.find(y->name) : depth_.end();
    if (is_float(operand_dtype(n.b)) && d != depth_.end() && d->second + 1 < scopes_.size())
      return let(n.t->dtype,
                 kir::binary(K::Mul, x, kir::binary(K::Div, literal(Arg(1.0), in_c(n)), y)));
    return let(n.t->dtype, kir::binary(K::Div, x, y));
  }
  std::string pow(const Node& n) {
    using K = kir::ExprKind;
    const BoundSymbol& b = n.b;
    if (b.args[0].is_tensor() && b.args[1].is_number()) {
      // Eager's pow special-cases these exponents (pow_tensor_scalar_optimized): match it.
      const double e = b.args[1].as_double();
      const DType out = n.t->dtype;
      kir::Expr x = ref(same(n));
      kir::Expr one = literal(Arg(1.0), out_c(n));
      auto sq = [&] { return kir::binary(K::Mul, x, x); };
      auto call1 = [&](OpId p) { return kir::call(kir::prim_helper(p), {x}, x->dtype, p); };
      if (e == 1) return let(out, x); // eager copies the base (pow(x, 2)'s gradient has it)
      if (e == 2) return let(out, sq());
      if (e == 3) return let(out, kir::binary(K::Mul, sq(), x));
      if (e == 0.5) return let(out, call1(OpId::prim_sqrt));
      if (e == -0.5) return let(out, call1(OpId::prim_rsqrt));
      if (e == -1) return let(out, kir::binary(K::Div, one, x));
      if (e == -2) return let(out, kir::binary(K::Div, one, sq()));
    }
    return call_op(n);
  }
  std::string where(const Node& n) {
    const BoundSymbol& b = n.b;
    kir::Expr c = kir::cast(DType::Bool, arg(n, 0, DType::Bool));
    DType vd = b.args[1].is_tensor()   ? b.args[1].tensor()->dtype
               : b.args[2].is_tensor() ? b.args[2].tensor()->dtype
                                       : n.t->dtype;
    DType vc = kir::compute_dtype(vd);
    kir::Expr x = arg(n, 1, vc);
    kir::Expr y = arg(n, 2, vc);
    return let(n.t->dtype, kir::select(c, x, y));
  }
  std::string convert(const Node& n) {
    kir::Expr x = ref(same(n));
    // Float to int32/int64 (NoFloatToNarrowInt): on CUDA a C cast is the truncating, saturating
    // conversion eager's kernels make; the CPU helpers define what C++ leaves undefined as x86
    // (and eager) does.
    if (is_float(x->dtype) && is_int(n.t->dtype) && k_.device == DeviceType::CPU)
      return let(n.t->dtype, kir::call(n.t->dtype == DType::Int32 ? "kr_f2i32" : "kr_f2i64", {x},
                                       n.t->dtype));
    if (!is_bool(n.t->dtype)) return let(n.t->dtype, x);
    kir::Expr zero = is_float(x->dtype)  ? kir::float_lit(0, x->dtype)
                     : is_bool(x->dtype) ? kir::bool_lit(false)
                                         : kir::int_lit(0, x->dtype);
    return let(n.t->dtype, kir::binary(kir::ExprKind::Ne, x, zero));
  }
  std::string full(const Node& n) { return let(n.t->dtype, literal(n.b.args[1], out_c(n))); }
  std::string iota(const Node& n) {
    // start + step * i, in the output dtype (eager's arange computes in it too).
    using K = kir::ExprKind;
    const DType oc = out_c(n);
    kir::Expr i = kir::cast(oc, n.idx.at(0).ix.expr());
    return let(n.t->dtype, kir::binary(K::Add, literal(n.b.args[1], oc),
                                       kir::binary(K::Mul, literal(n.b.args[2], oc), i)));
  }
  // Random draws (kernel_random): the element's row-major position in the drawn tensor is the
  // Philox counter, the segment's seed the key (kr_cpu.h, kr_philox).
  std::string random(const Node& n, bool normal) {
    const TensorRef& seed = random_.seed_of(n.t->device);
    kir::Expr key = ref(load(seed, {}));
    const Shape& shape = n.b.args[0].int_list();
    const kir::Index at = linear(n.idx, contiguous_strides(shape)).ix;
    kir::Expr off = at.expr(at.affine() && numel(shape) <= INT32_MAX ? DType::Int32 : DType::Int64);
    kir::Expr stream = kir::int_lit(position_.at(n.t.get()), DType::Int64);
    const DType c = out_c(n);
    const bool f64 = c == DType::Float64;
    kir::Expr r;
    if (normal) {
      r = kir::call(f64 ? "kr_philox_normal64" : "kr_philox_normal", {key, off, stream}, c);
    } else if (f64) {
      r = kir::call("kr_philox_uniform64", {key, off, stream}, c);
    } else {
      const DType d = n.t->dtype;
      const int64_t bits = d == DType::BFloat16 ? 8 : d == DType::Float16 ? 11 : 24;
      r = kir::call("kr_philox_uniform", {key, off, stream, kir::int_lit(bits, DType::Int64)}, c);
    }
    // mean + std * z (a uniform draw is on [0, 1): Accept::Random); randn's skips it.
    const double mean = n.b.args[1].as_double(), std = n.b.args[2].as_double();
    using K = kir::ExprKind;
    if (normal && std != 1.0) r = kir::binary(K::Mul, kir::float_lit(std, c), r);
    if (normal && mean != 0.0) r = kir::binary(K::Add, kir::float_lit(mean, c), r);
    return let(n.t->dtype, r);
  }
  std::string uniform(const Node& n) { return random(n, false); }
  std::string normal(const Node& n) { return random(n, true); }
  template <kir::ReduceOp R> std::string reduction(const Node& n) {
    return reduce(n.t, n.b, n.idx, R);
  }
  std::string variance(const Node& n) { return reduce(n.t, n.b, n.idx, std::nullopt); }
  // A scan's elements are computed by a kernel of their own (SegmentLowering::build, scan):
  // a reader materializes them first and loads them.
  std::string scanned(const Node& n) { throw Restart{n.t.get()}; }

  // Index remaps: the operand at the index this element reads.
  std::string broadcast_in_dim(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    Shape bd = n.b.args[2].int_list();
    std::vector<Dim> ai(a->ndim());
    for (int64_t k = 0; k < a->ndim(); ++k)
      ai[k] = a->shape[k] == 1 ? constant(0) : n.idx.at(bd[k]);
    return gen(a, ai);
  }
  std::string permute(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    Shape perm = n.b.args[1].int_list();
    std::vector<Dim> ai(a->ndim());
    for (size_t k = 0; k < perm.size(); ++k) ai[perm[k]] = n.idx[k];
    return gen(a, ai);
  }
  std::string reshape(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    Dim lin = linear(n.idx, contiguous_strides(n.t->shape));
    Shape as = contiguous_strides(a->shape);
    std::vector<Dim> ai(a->ndim());
    for (int64_t k = 0; k < a->ndim(); ++k)
      ai[k] = a->shape[k] == 1 ? constant(0)
                               : div_mod(lin, as[k], k == 0 ? 0 : a->shape[k], vars_);
    return gen(a, ai);
  }
  std::string slice(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    Shape start = n.b.args[1].int_list(), step = n.b.args[3].int_list();
    std::vector<Dim> ai(a->ndim());
    for (int64_t k = 0; k < a->ndim(); ++k) {
      Dim d;
      add_scaled(d.ix, d.deps, n.idx[k], step[k]);
      d.ix.constant += start[k];
      ai[k] = d;
    }
    return gen(a, ai);
  }
  // Concatenation: the element of the part that holds this index along `dim`. Each part that
  // may hold it is read at the index clamped into its extent (every read stays in bounds), and
  // selects pick the one that does; parts the index never reaches are not read.
  std::string cat(const Node& n) {
    using K = kir::ExprKind;
    const auto parts = n.b.args[0].tensor_list();
    const int64_t dim = n.b.args[1].as_int();
    const Dim& d = n.idx.at(dim);
    int64_t lo = 0, hi = 0;
    const bool known = affine_range(d, vars_, &lo, &hi);
    const kir::Expr at = d.ix.expr();
    std::vector<std::pair<std::string, int64_t>> values; // (var, end of its part)
    int64_t begin = 0;
    for (const auto& part : parts) {
      const int64_t size = part->shape[dim], end = begin + size;
      if (size == 0 || (known && (hi < begin || lo >= end))) {
        begin = end;
        continue;
      }
      Dim local = d;
      local.ix.constant -= begin;
      const bool below = !known || lo < begin, above = !known || hi >= end;
      if (below || above) { // kept in [0, size - 1] where the index leaves it
        kir::Expr e = kir::clamp_index(local.ix.expr(), 0, size - 1);
        local = Dim{};
        local.ix.opaque = e;
        local.deps = deps_of(d);
      }
      std::vector<Dim> pi = n.idx;
      pi[dim] = local;
      values.push_back({gen(part, pi), end});
      begin = end;
    }
    KR_INTERNAL(!values.empty(), "kernel generation: a cat element in no part");
    if (values.size() == 1) return values[0].first;
    kir::Expr r = ref(values.back().first);
    for (size_t i = values.size() - 1; i-- > 0;)
      r = kir::select(kir::binary(K::Lt, at, kir::int_lit(values[i].second, DType::Int64)),
                      ref(values[i].first), r);
    // The parts' values are already in the output's dtype: no rounding.
    kir::Let l;
    l.var = fresh("v");
    l.dtype = out_c(n);
    l.expr = r;
    emit(kir::Stmt::of(l));
    return l.var;
  }
  // Gathers: take (index_select along `dim`: the index's dims replace it) and gather (the
  // index has the output's shape; it replaces the element's position along `dim`).
  std::string take(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    const auto& index = n.b.args[1].tensor();
    const int64_t dim = n.b.args[2].as_int();
    std::vector<Dim> ii(n.idx.begin() + dim, n.idx.begin() + dim + index->ndim());
    std::vector<Dim> ai(n.idx.begin(), n.idx.begin() + dim);
    ai.push_back(gathered(index, ii, a->shape[dim], dim, n.b.args[3].as_int()));
    ai.insert(ai.end(), n.idx.begin() + dim + index->ndim(), n.idx.end());
    return gen(a, ai);
  }
  std::string gather(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    const int64_t dim = n.b.args[1].as_int();
    const auto& index = n.b.args[2].tensor();
    std::vector<Dim> ai = n.idx;
    ai[dim] = gathered(index, n.idx, a->shape[dim], dim, n.b.args[3].as_int());
    return gen(a, ai);
  }
  // The position read from `index` at `ii`, along a dim of extent `size`. The indices must be
  // in memory before the kernel runs (a computed index tensor is materialized first): the
  // program checks them before a CPU kernel (prim_check_index, eager's errors), and a CUDA
  // kernel traps on one out of range, as eager's device-side assert does.
  Dim gathered(const TensorRef& index, const std::vector<Dim>& ii, int64_t size, int64_t dim,
               int64_t error) {
    if (!loadable_.count(index.get())) throw Restart{index.get()};
    kir::Expr v = kir::cast(DType::Int64, ref(gen(index, ii)));
    if (k_.device == DeviceType::CUDA) {
      v = kir::call("kr_check_index", {v, kir::int_lit(size, DType::Int64)}, DType::Int64);
    } else {
      bool seen = false;
      for (const auto& c : call_.index_checks)
        seen |= c.index.get() == index.get() && c.size == size && c.dim == dim && c.error == error;
      if (!seen) call_.index_checks.push_back({index, size, dim, error});
    }
    Dim d;
    d.ix.opaque = v;
    for (const auto& x : ii) {
      auto dx = deps_of(x);
      d.deps.insert(dx.begin(), dx.end());
    }
    return d;
  }
  std::string squeeze(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    Shape dims = n.b.args[1].int_list();
    std::vector<Dim> ai;
    size_t j = 0;
    for (int64_t k = 0; k < a->ndim(); ++k) {
      if (std::find(dims.begin(), dims.end(), k) != dims.end())
        ai.push_back(constant(0));
      else
        ai.push_back(n.idx.at(j++));
    }
    return gen(a, ai);
  }
  std::string diagonal(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    int64_t off = n.b.args[1].as_int();
    int64_t d1 = wrap_dim(n.b.args[2].as_int(), a->ndim(), "diagonal");
    int64_t d2 = wrap_dim(n.b.args[3].as_int(), a->ndim(), "diagonal");
    std::vector<Dim> ai(a->ndim());
    size_t j = 0;
    for (int64_t k = 0; k < a->ndim(); ++k)
      if (k != d1 && k != d2) ai[k] = n.idx.at(j++);
    const Dim& di = n.idx.back();
    Dim x = di, y = di;
    if (off >= 0)
      y.ix.constant += off;
    else
      x.ix.constant -= off;
    ai[d1] = x;
    ai[d2] = y;
    return gen(a, ai);
  }
  std::string as_strided(const Node& n) {
    const auto& a = n.b.args[0].tensor();
    Shape stride = n.b.args[2].int_list();
    Dim d = linear(n.idx, stride);
    d.ix.constant += n.b.args[3].as_int();
    return gen(a, {d});
  }

  // Places a reduction at the outermost scope its index depends on.
  // `op`: the combine of a plain reduction; nullopt for a variance.
  std::string reduce(const TensorRef& t, const BoundSymbol& b, const std::vector<Dim>& idx,
                     std::optional<kir::ReduceOp> op) {
    const auto& a = b.args[0].tensor();
    const Shape dims = reduced_dims(b);
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
    // No reduction inside a reduction's loop (a mean of per-row log-sum-exps): CUDA schedules
    // would give the outer loop's points to the threads of one warp, each walking its row
    // alone; materialized, the inner one gets a row schedule over the whole grid. (CPU kernels
    // could nest them; both devices lower a region alike, KernelCall::cuda_twin.)
    for (size_t s = 1; s <= place; ++s)
      if (scopes_[s].kind == kir::LoopKind::Reduce || scopes_[s].kind == kir::LoopKind::Scan)
        throw Restart{t.get()};
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
      result = reduce_here(t, b, a, dims, idx, op);
      scopes_.back().memo[key] = result;
    }
    for (auto& s : saved) scopes_.push_back(std::move(s));
    return result;
  }

  // One pass over the reduced dims: `acc op= value(a at the full index)`.
  std::string reduction_loop(const TensorRef& a, const Shape& dims, const std::vector<Dim>& idx,
                             kir::ReduceOp op, DType acc_dtype,
                             const std::function<std::string(const std::string&,
                                                             const std::vector<Dim>&)>& value) {
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
    std::string v = value(x, full);
    kir::AccUpdate u;
    u.var = init.var;
    u.op = op;
    u.value = v;
    emit(kir::Stmt::of(u));
    for (int i = 0; i < opened; ++i) close();
    return init.var;
  }

  std::string reduce_here(const TensorRef& t, const BoundSymbol& b, const TensorRef& a,
                          const Shape& dims, const std::vector<Dim>& idx,
                          std::optional<kir::ReduceOp> op) {
    const DType ac = kir::compute_dtype(t->dtype);
    auto cast_to = [&](DType d) {
      return [this, d](const std::string& x, const std::vector<Dim>&) {
        kir::Let l;
        l.var = fresh("v");
        l.dtype = d;
        l.expr = kir::cast(d, ref(x));
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
    if (b.op == OpId::prim_argmax || b.op == OpId::prim_argmin) {
      // A (value, position) pair packed into one int64 key (kr_argmax_key), reduced by max or
      // min: every schedule's combine of partial results keeps eager's first index.
      const bool mx = b.op == OpId::prim_argmax;
      std::string acc = reduction_loop(
          a, dims, idx, *op, DType::Int64, [&](const std::string& x, const std::vector<Dim>& full) {
            const kir::Expr at = dims.empty() ? kir::int_lit(0, DType::Int64)
                                              : kir::cast(DType::Int64, full.at(dims[0]).ix.expr());
            kir::Let l;
            l.var = fresh("v");
            l.dtype = DType::Int64;
            l.expr = kir::call(mx ? "kr_argmax_key" : "kr_argmin_key", {ref(x), at}, DType::Int64);
            emit(kir::Stmt::of(l));
            return l.var;
          });
      return let(t->dtype, kir::call(mx ? "kr_argmax_index" : "kr_argmin_index", {ref(acc)},
                                     DType::Int64));
    }
    if (op) return let(t->dtype, ref(plain(*op, ac)));
    {
      // Two passes (the mean, then the squared deviations from it) in eager's accumulation
      // type: double on the CPU (its var accumulates floats in double), the compute dtype on
      // CUDA (float for float and half inputs: eager's Welford runs in float there, and float
      // math keeps the kernel at the memory bandwidth; two passes are the more accurate form).
      const DType vd = k_.device == DeviceType::CUDA ? ac : DType::Float64;
      int64_t n = 1;
      for (auto d : dims) n *= a->shape[d];
      double corr = b.args[2].as_double();
      std::string s = plain(kir::ReduceOp::Sum, vd);
      kir::Let mean;
      mean.var = fresh("v");
      mean.dtype = vd;
      mean.expr = kir::binary(kir::ExprKind::Div, ref(s), kir::float_lit(static_cast<double>(n), vd));
      emit(kir::Stmt::of(mean));
      std::string q = reduction_loop(
          a, dims, idx, kir::ReduceOp::Sum, vd, [&](const std::string& x, const std::vector<Dim>&) {
            kir::Let d;
            d.var = fresh("v");
            d.dtype = vd;
            d.expr = kir::binary(kir::ExprKind::Sub, kir::cast(vd, ref(x)), ref(mean.var));
            emit(kir::Stmt::of(d));
            kir::Let sq;
            sq.var = fresh("v");
            sq.dtype = vd;
            sq.expr = kir::binary(kir::ExprKind::Mul, ref(d.var), ref(d.var));
            emit(kir::Stmt::of(sq));
            return sq.var;
          });
      if (kir::Block& blk = scopes_.back().block;
          !blk.empty() && blk.back().kind == kir::Stmt::Kind::Loop)
        blk.back().loop->deviations = kir::Loop::Deviations{s, mean.var};
      double denom = std::max(0.0, static_cast<double>(n) - corr);
      return let(t->dtype, kir::binary(kir::ExprKind::Div, ref(q), kir::float_lit(denom, vd)));
    }
  }

  const std::unordered_map<const TensorProxy*, const BoundSymbol*>& producer_;
  const std::unordered_set<const TensorProxy*>& loadable_;
  kir::Kernel& k_;
  KernelCall& call_;
  RandomDraws& random_;
  const std::unordered_map<const TensorProxy*, int>& position_; // of each value's producer
  std::vector<Scope> scopes_;
  std::unordered_map<const TensorProxy*, int> buffers_;
  Vars vars_;
  int next_ = 0;
  std::unordered_map<std::string, size_t> depth_; // scope depth where each variable is defined
  std::unordered_map<std::string, DType> types_;  // the dtype of each variable
};

struct RuleTable {
  std::array<KernelRule, kNumOps> rules{};

  RuleTable() {
    using G = KernelGen;
    using K = kir::ExprKind;
    auto add = [&](OpId op, Accept accept, std::string (G::*lower)(const Node&)) {
      rules[static_cast<size_t>(op)] = KernelRule{op, accept, lower, nullptr};
    };
    auto torch = [&](OpId op, const char* why) {
      rules[static_cast<size_t>(op)] = KernelRule{op, Accept::Never, nullptr, why};
    };
    // Elementwise.
    for (OpId op : {OpId::prim_exp, OpId::prim_exp2, OpId::prim_log, OpId::prim_log2,
                    OpId::prim_log1p, OpId::prim_expm1, OpId::prim_sin, OpId::prim_cos,
                    OpId::prim_tan, OpId::prim_tanh, OpId::prim_sigmoid, OpId::prim_sqrt,
                    OpId::prim_rsqrt, OpId::prim_erf, OpId::prim_reciprocal})
      add(op, Accept::FloatSameDtype, &G::call_op);
    for (OpId op : {OpId::prim_floor_divide, OpId::prim_remainder, OpId::prim_fmod})
      add(op, Accept::FloatOrIntByConstant, &G::division);
    add(OpId::prim_pow, Accept::FloatOperands, &G::pow);
    add(OpId::prim_div, Accept::FloatOrIntByConstant, &G::div);
    add(OpId::prim_maximum, Accept::Any, &G::call_op);
    add(OpId::prim_minimum, Accept::Any, &G::call_op);
    add(OpId::prim_clone, Accept::Any, &G::same);
    add(OpId::prim_restride, Accept::Any, &G::same);
    add(OpId::prim_abs, Accept::Any, &G::call_unless_bool);
    add(OpId::prim_sign, Accept::Any, &G::call_unless_bool);
    for (OpId op : {OpId::prim_floor, OpId::prim_ceil, OpId::prim_round, OpId::prim_trunc})
      add(op, Accept::Any, &G::call_if_float);
    add(OpId::prim_isnan, Accept::Any, &G::classify);
    add(OpId::prim_isinf, Accept::Any, &G::classify);
    add(OpId::prim_neg, Accept::Any, &G::neg);
    add(OpId::prim_bitwise_not, Accept::Any, &G::bitwise_not);
    add(OpId::prim_logical_not, Accept::Any, &G::logical_not);
    add(OpId::prim_add, Accept::Any, &G::infix<K::Add>);
    add(OpId::prim_sub, Accept::Any, &G::infix<K::Sub>);
    add(OpId::prim_mul, Accept::Any, &G::mul);
    add(OpId::prim_eq, Accept::Any, &G::infix<K::Eq>);
    add(OpId::prim_ne, Accept::Any, &G::infix<K::Ne>);
    add(OpId::prim_lt, Accept::Any, &G::infix<K::Lt>);
    add(OpId::prim_le, Accept::Any, &G::infix<K::Le>);
    add(OpId::prim_gt, Accept::Any, &G::infix<K::Gt>);
    add(OpId::prim_ge, Accept::Any, &G::infix<K::Ge>);
    add(OpId::prim_bitwise_and, Accept::Any, &G::infix<K::BitAnd>);
    add(OpId::prim_bitwise_or, Accept::Any, &G::infix<K::BitOr>);
    add(OpId::prim_bitwise_xor, Accept::Any, &G::infix<K::BitXor>);
    add(OpId::prim_logical_and, Accept::Any, &G::logical<K::And>);
    add(OpId::prim_logical_or, Accept::Any, &G::logical<K::Or>);
    add(OpId::prim_logical_xor, Accept::Any, &G::logical<K::Ne>);
    add(OpId::prim_where, Accept::Any, &G::where);
    add(OpId::prim_convert_element_type, Accept::NoFloatToNarrowInt, &G::convert);
    // Index remaps.
    add(OpId::prim_broadcast_in_dim, Accept::Any, &G::broadcast_in_dim);
    add(OpId::prim_reshape, Accept::Any, &G::reshape);
    add(OpId::prim_permute, Accept::Any, &G::permute);
    add(OpId::prim_slice, Accept::Any, &G::slice);
    add(OpId::prim_cat, Accept::Any, &G::cat);
    add(OpId::prim_take, Accept::Any, &G::take);
    add(OpId::prim_gather, Accept::Any, &G::gather);
    add(OpId::prim_squeeze, Accept::Any, &G::squeeze);
    add(OpId::prim_diagonal, Accept::Any, &G::diagonal);
    add(OpId::prim_as_strided, Accept::Any, &G::as_strided);
    // Creation.
    add(OpId::prim_full, Accept::Any, &G::full);
    add(OpId::prim_iota, Accept::NoHalfResult, &G::iota);
    // Reductions.
    add(OpId::prim_sum, Accept::Any, &G::reduction<kir::ReduceOp::Sum>);
    add(OpId::prim_amax, Accept::Any, &G::reduction<kir::ReduceOp::Max>);
    add(OpId::prim_amin, Accept::Any, &G::reduction<kir::ReduceOp::Min>);
    add(OpId::prim_prod, Accept::NoBoolOperands, &G::reduction<kir::ReduceOp::Prod>);
    add(OpId::prim_var, Accept::FloatOperands, &G::variance);
    add(OpId::prim_argmax, Accept::IndexReduction, &G::reduction<kir::ReduceOp::Max>);
    add(OpId::prim_argmin, Accept::IndexReduction, &G::reduction<kir::ReduceOp::Min>);
    // Scans.
    add(OpId::prim_cumsum, Accept::Any, &G::scanned);
    // Through torch.
    torch(OpId::prim_check_index, "the program's check of a CPU kernel's gather indices");
    torch(OpId::prim_index_put, "an indexed write");
    torch(OpId::prim_index_copy, "an indexed write");
    torch(OpId::prim_as_strided_scatter, "a write into a strided view");
    torch(OpId::prim_copy_, "a write into an existing tensor");
    add(OpId::prim_uniform, Accept::Random, &G::uniform);
    add(OpId::prim_normal, Accept::Random, &G::normal);
    torch(OpId::prim_seed, "draws a kernel's seed from torch's generator");
    torch(OpId::prim_matmul, "matrix products run in torch's libraries (tags::T)");
    torch(OpId::torch_fallback, "a torch call with no table entry");
    torch(OpId::torch_fallback_random, "a torch call with no table entry");
    torch(OpId::torch_vjp, "a torch op's backward, through torch.autograd");
    torch(OpId::torch_vjp_record, "a torch op run under autograd for its backward");
    torch(OpId::manual_seed, "a side effect on torch's generator");
    torch(OpId::set_rng_state, "a side effect on torch's generator");
    for (KernelRule& r : rules)
      r.calls_helper = r.lower == &G::call_op || r.lower == &G::call_unless_bool ||
                       r.lower == &G::call_if_float || r.lower == &G::classify ||
                       r.lower == &G::division ||
                       r.lower == &G::pow;
  }
};

const KernelRule& kernel_rule(OpId op) {
  static const RuleTable table;
  return table.rules.at(static_cast<size_t>(op));
}

} // namespace

bool has_kernel_rule(OpId op) { return kernel_rule(op).op == op; }

std::vector<OpId> helper_prims() {
  std::vector<OpId> out;
  for (int i = 0; i < kNumOps; ++i)
    if (kernel_rule(static_cast<OpId>(i)).calls_helper) out.push_back(static_cast<OpId>(i));
  return out;
}

bool kernel_supports(const BoundSymbol& b) {
  if (!b.def().has(tags::P)) return false; // a language op: lowering sees prims only
  const KernelRule& r = kernel_rule(b.op);
  KR_INTERNAL(r.op == b.op, "lowering: no kernel rule for prim ", b.def().id_name);
  auto outs = b.outputs();
  if (outs.size() != 1) return false;
  const DType out = outs[0]->dtype, in = operand_dtype(b);
  switch (r.accept) {
  case Accept::Any:
    return true;
  case Accept::FloatOperands:
    return is_float(in);
  case Accept::FloatSameDtype:
    return is_float(in) && in == out;
  case Accept::FloatOrIntByConstant:
    return is_float(in) || int_by_constant(b);
  case Accept::NoFloatToNarrowInt:
    return !(is_float(in) && is_int(out)) || out == DType::Int32 || out == DType::Int64;
  case Accept::NoHalfResult:
    return !is_low_float(out);
  case Accept::NoBoolOperands:
    return !is_bool(in);
  case Accept::IndexReduction: {
    const auto& a = b.args[0].tensor();
    const int64_t d = a->ndim() == 0 ? -1 : b.args[1].as_int();
    return itemsize(in) <= 4 && (d < 0 || a->shape[d] < (int64_t{1} << 31));
  }
  case Accept::Random:
    // A uniform draw on [low, high) other than [0, 1) stays in torch: low + (high - low) * u
    // can round up to `high`, which torch's kernels map back to `low`.
    if (b.op == OpId::prim_uniform &&
        (b.args[1].as_double() != 0.0 || b.args[2].as_double() != 1.0))
      return false;
    return is_float(out) && options::flag("kernel_random");
  case Accept::Never:
    return false;
  }
  return false;
}

namespace {

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
                  DeviceType device, const std::string& prefix, int* counter, bool record_stages)
      : seg_(seg), needed_(needed), device_(device), prefix_(prefix), counter_(counter),
        record_stages_(record_stages) {
    random_.name = prefix + "seed" + std::to_string(*counter);
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
  bool is_scan(const TensorProxy* t) const {
    auto it = producer_.find(t);
    return it != producer_.end() && it->second->def().has(tags::Scan);
  }

  std::vector<KernelCall> build(const std::set<std::pair<int, const TensorProxy*>>& mat,
                                const std::set<const TensorProxy*>& breaks_after,
                                const std::unordered_map<const TensorProxy*, TensorRef>& refs) {
    // Groups: consecutive materialized values of one shape. A scan is a group of its own (its
    // kernel's innermost loop runs along its dim).
    std::vector<std::vector<TensorRef>> groups;
    const TensorProxy* prev = nullptr;
    for (const auto& [pos, p] : mat) {
      const TensorRef& t = refs.at(p);
      bool same = prev && prev->shape == t->shape && !breaks_after.count(prev) &&
                  output_strides(refs.at(prev)) == output_strides(t) && !is_scan(prev) &&
                  !is_scan(p);
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
      KernelGen gen(producer_, loadable, k, call, random_, position_);
      const TensorRef& first = g.front();
      Shape ost = output_strides(first);
      // A scan's dim is looped last, by KernelGen::scan (-1: not a scan, or a 0-d one).
      const int64_t scan_dim = is_scan(first.get()) && first->ndim() > 0
                                   ? producer_.at(first.get())->args[1].as_int()
                                   : -1;
      // Loop order: outermost = largest output stride; size-1 dims are not looped.
      std::vector<int64_t> order;
      for (int64_t d = 0; d < first->ndim(); ++d)
        if (first->shape[d] != 1 && d != scan_dim) order.push_back(d);
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
      bool scan_loop = false;
      for (const auto& t : g) {
        kir::Buffer b;
        b.name = "out" + std::to_string(call.outputs.size());
        b.dtype = t->dtype;
        b.output = true;
        b.shape = t->shape;
        b.strides = output_strides(t);
        call.outputs.push_back(t);
        call.write_into.push_back(nullptr);
        call.donor.push_back(-1);
        out_buffers_.push_back(b);
        if (empty) continue;
        std::string v;
        if (is_scan(t.get()))
          scan_loop = gen.scan(t, idx, scan_dim, &v);
        else
          v = gen.gen(t, idx);
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
      if (scan_loop) gen.close();
      if (!empty)
        for (size_t i = 0; i < order.size(); ++i) gen.close();
      k.body = gen.finish();
      mark_inner(k.body);
      run_kernel_passes(k, record_stages_ ? &call.stages : nullptr);
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
  bool record_stages_;
  std::unordered_map<const TensorProxy*, const BoundSymbol*> producer_;
  std::unordered_map<const TensorProxy*, int> position_;
  std::vector<kir::Buffer> out_buffers_;

public:
  RandomDraws random_;
};

} // namespace

LoweredRegion lower_region(const std::vector<BoundSymbol>& prims,
                           const std::vector<TensorRef>& needed, DeviceType device,
                           const std::string& prefix, bool record_stages) {
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
    SegmentLowering sl(seg, seg_needed, device, prefix, &counter, record_stages);
    std::vector<KernelCall> calls = sl.run();
    if (const TensorRef& seed = sl.random_.seed) {
      Step draw;
      draw.bsym.op = OpId::prim_seed;
      draw.bsym.args = {Arg(seed->device)};
      draw.bsym.out = Arg(seed);
      out.steps.push_back(std::move(draw));
    }
    for (auto& c : calls) {
      for (const auto& ch : c.index_checks) {
        Step check;
        check.bsym.op = OpId::prim_check_index;
        check.bsym.args = {Arg(ch.index), Arg(ch.size), Arg(ch.dim), Arg(ch.error)};
        out.steps.push_back(std::move(check));
      }
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
