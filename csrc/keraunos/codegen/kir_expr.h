// Kernel IR expressions: typed, hash-consed trees over variables and literals.
//
// A kernel's per-element values (kir::Let) and its non-affine index parts are Exprs, not text:
// passes ask what an expression is (a call of exp, a cast, which variables it reads) and
// substitute variables in it; backends print it. Nodes are immutable and interned: two
// structurally equal expressions are the same node, so a pointer compare is a structural
// compare and a pointer is a key (value numbering across loops, reuse of computed values).
//
//   exp(x - max) in float:   Call kr_exp [prim_exp, costly] (Sub (Var v1 f32) (Var a0 f32))
//   printed (both backends): kr_exp(v1 - a0)
//
// Every value has a dtype (the compute dtype: float16 and bfloat16 values are float32 between
// their load and store; see kernel_ir.h).
#pragma once
#include "keraunos/ir/types.h"
#include "keraunos/ir/symbols.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keraunos::kir {

// float16 and bfloat16 compute in float32; others in themselves.
DType compute_dtype(DType storage);
// The C type of a compute dtype: "float", "double", "int64_t", "bool", ...
const char* ctype(DType compute);

enum class ExprKind : uint8_t {
  Var,   // a variable of the kernel: a loop variable, load, let or accumulator
  Int,   // an integer literal
  Float, // a float literal (NaN and infinities included)
  Bool,  // true / false
  Cast,  // a C conversion to `dtype`
  Neg,
  Not,
  BitNot,
  Add,
  Sub,
  Mul,
  Div,
  Mod,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  BitAnd,
  BitOr,
  BitXor,
  And,
  Or,
  Select, // args[0] ? args[1] : args[2]
  // An index kept in bounds (a cat's part read where the part may not hold the element):
  // args[0] where it lies in [args[1], args[2]] (integer literals); elsewhere some position in
  // that range, whose element is not used (a select picks another part). Printed as an exact
  // clamp; a vectorized schedule may read a whole group at a clamped base instead.
  Clamp,
  Call, // a helper of the device headers (kr_cpu.h, kr_cuda.cuh): kr_exp, kr_h2f, ...
};

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;

struct ExprNode {
  ExprKind kind;
  DType dtype;
  std::string name; // Var: the variable; Call: the helper
  int64_t i = 0;    // Int
  double f = 0;     // Float
  // Call: the prim the helper computes (nullopt for conversions such as kr_h2f).
  std::optional<OpId> prim;
  std::vector<Expr> args;
  // Whether the tree calls a helper of a prim tagged costly in the op table (tags::X: the
  // transcendentals). The one cost list of the kernel passes and backends.
  bool costly = false;
  size_t hash = 0;
};

// Constructors (interned).
Expr var(const std::string& name, DType dtype);
Expr int_lit(int64_t v, DType dtype);
Expr float_lit(double v, DType dtype);
Expr bool_lit(bool v);
Expr cast(DType to, const Expr& a); // a itself when already of dtype `to`
Expr unary(ExprKind k, const Expr& a);
Expr binary(ExprKind k, const Expr& a, const Expr& b);
Expr select(const Expr& c, const Expr& a, const Expr& b);
Expr clamp_index(const Expr& i, int64_t lo, int64_t hi); // int64, lo <= hi
Expr call(const std::string& helper, std::vector<Expr> args, DType result,
          std::optional<OpId> prim = std::nullopt);
// The device helper that computes an elementwise prim, by name: kr_exp for prim_exp (the
// lowering's rule table says which prims are computed by their helper), and back (nullopt for
// helpers that compute no prim, such as the conversions kr_h2f and kr_f2bf).
std::string prim_helper(OpId prim);
std::optional<OpId> helper_prim(std::string_view helper);

// The C text of `e` (the same for the C++ and CUDA backends).
std::string c_text(const Expr& e);

// Whether `e` reads variable `name`.
bool mentions(const Expr& e, const std::string& name);
// Calls fn on the name of every variable `e` reads (once per occurrence).
void for_each_var(const Expr& e, const std::function<void(const std::string&)>& fn);
// `e` with each variable replaced by fn(variable) where that returns an Expr (kept otherwise).
Expr substitute(const Expr& e, const std::function<Expr(const ExprNode&)>& fn);
// Renames one variable.
Expr rename(const Expr& e, const std::string& from, const std::string& to);

// The values an integer expression takes, by interval arithmetic, with var_range giving each
// variable's (nullopt: unknown, e.g. a loaded value). nullopt where unknown or where any
// intermediate value may leave [-limit, limit] (the caller then computes it wider).
using Range = std::pair<int64_t, int64_t>;
std::optional<Range> int_range(const Expr& e,
                               const std::function<std::optional<Range>(const std::string&)>& var_range,
                               int64_t limit);

// Parses the C subset c_text prints (for tests and golden kernels: text in, text out).
// `type_of` gives the dtype of a variable. Throws keraunos::Error on bad text.
Expr parse(std::string_view text, const std::function<DType(const std::string&)>& type_of);

} // namespace keraunos::kir
