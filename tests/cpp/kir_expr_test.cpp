// Kernel IR expressions: interning, typing, printing, parsing (text in, text out), rewriting.
#include "keraunos/codegen/kir_expr.h"
#include "keraunos/ir/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

using namespace keraunos;
using namespace keraunos::kir;

namespace {

constexpr DType F32 = DType::Float32;
constexpr DType F64 = DType::Float64;
constexpr DType I64 = DType::Int64;

Expr p(const std::string& text, DType vars = F32) {
  return parse(text, [vars](const std::string& name) { return name[0] == 'i' ? I64 : vars; });
}

} // namespace

TEST(KirExpr, EqualStructuresAreOneNode) {
  Expr a = binary(ExprKind::Add, var("v0", F32), float_lit(1.5, F32));
  Expr b = binary(ExprKind::Add, var("v0", F32), float_lit(1.5, F32));
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), binary(ExprKind::Add, var("v0", F64), float_lit(1.5, F32)).get());
  EXPECT_NE(float_lit(0.0, F32).get(), float_lit(-0.0, F32).get()) << "compared by bits";
  EXPECT_EQ(float_lit(std::nan(""), F32).get(), float_lit(std::nan(""), F32).get());
  // A node stays one node while it is alive, whatever else is built in between.
  for (int i = 0; i < 5000; ++i) var("t" + std::to_string(i), F32);
  EXPECT_EQ(a.get(), binary(ExprKind::Add, var("v0", F32), float_lit(1.5, F32)).get());
}

TEST(KirExpr, Types) {
  Expr x = var("x", F32), d = var("d", F64), i = var("i0", I64);
  EXPECT_EQ(binary(ExprKind::Mul, x, d)->dtype, F64);
  EXPECT_EQ(binary(ExprKind::Add, i, x)->dtype, F32);
  EXPECT_EQ(binary(ExprKind::Lt, x, x)->dtype, DType::Bool);
  EXPECT_EQ(cast(F32, x).get(), x.get()) << "a cast to a value's own dtype is the value";
  EXPECT_EQ(cast(F64, x)->kind, ExprKind::Cast);
  Expr e = call(prim_helper(OpId::prim_exp), {x}, F32, OpId::prim_exp);
  EXPECT_TRUE(e->costly) << "prim_exp is tagged costly (tags::X)";
  EXPECT_TRUE(binary(ExprKind::Mul, e, x)->costly);
  EXPECT_FALSE(call(prim_helper(OpId::prim_sqrt), {x}, F32, OpId::prim_sqrt)->costly);
  EXPECT_FALSE(call("kr_h2f", {x}, F32)->costly);
}

TEST(KirExpr, PrintsCWithTheParenthesesItNeeds) {
  Expr x = var("x", F32), y = var("y", F32);
  EXPECT_EQ(c_text(binary(ExprKind::Mul, binary(ExprKind::Add, x, y), y)), "(x + y) * y");
  EXPECT_EQ(c_text(binary(ExprKind::Add, binary(ExprKind::Mul, x, y), y)), "(x * y) + y");
  EXPECT_EQ(c_text(select(binary(ExprKind::Lt, x, y), x, unary(ExprKind::Neg, y))),
            "(x < y) ? x : -(y)");
  EXPECT_EQ(c_text(cast(F64, binary(ExprKind::Sub, x, y))), "(double)(x - y)");
  EXPECT_EQ(c_text(float_lit(8, F32)), "8.0f");
  EXPECT_EQ(c_text(float_lit(1e-6, F32)), "1e-06f");
  EXPECT_EQ(c_text(float_lit(-0.5, F64)), "(-0.5)");
  EXPECT_EQ(c_text(float_lit(0.1, F64)), "0.1");
  EXPECT_EQ(c_text(float_lit(-0.0, F32)), "(-0.0f)");
  EXPECT_EQ(c_text(float_lit(-INFINITY, F32)), "(-kr_inf_f())");
  EXPECT_EQ(c_text(float_lit(NAN, F64)), "kr_nan_d()");
  EXPECT_EQ(c_text(int_lit(-3, I64)), "(-3LL)");
  EXPECT_EQ(c_text(int_lit(7, DType::Int8)), "((int8_t)7LL)");
  EXPECT_EQ(c_text(int_lit(std::numeric_limits<int64_t>::min(), I64)),
            "(-9223372036854775807LL - 1LL)");
}

TEST(KirExpr, ParsesWhatItPrints) {
  const char* const texts[] = {
      "kr_exp(v1 - a0)",
      "(v0 * 0.70710677f) + 1.0f",
      "kr_rsqrt((a0 / 8.0f) + 1e-06f)",
      "(double)(v8) - v5",
      "(x < y) ? x : -(y)",
      "kr_pow(x, 2.5f)",
      "!((bool)(x)) && (y != 0.0f)",
      "(-kr_inf_f())",
      "kr_h2f(kr_f2h(v0 * v1))",
      "(float)(((6LL * i0) + i1) / 4LL)",
      "(x & 3LL) | ~(y)",
      "kr_clamp_index(i3 + (-64LL), 0LL, 63LL)",
  };
  for (const char* t : texts) {
    const Expr e = p(t);
    EXPECT_EQ(c_text(e), t);
    EXPECT_EQ(p(c_text(e)).get(), e.get()) << t;
  }
  // Other spellings of the same expressions.
  EXPECT_EQ(c_text(p("((v0 * v0))")), "v0 * v0");
  EXPECT_EQ(c_text(p("(float)(v2)")), "v2") << "v2 is float already";
  EXPECT_EQ(c_text(p("a + b * c - d")), "(a + (b * c)) - d") << "C precedence";
  EXPECT_EQ(c_text(p("0x1.8p+2")), "6.0");
  EXPECT_EQ(c_text(p("((float)0x1p+0)")), "1.0f");
  EXPECT_EQ(p("kr_exp(x)")->prim, OpId::prim_exp);
  EXPECT_EQ(p("kr_isnan(x)")->dtype, DType::Bool);
  EXPECT_EQ(p("kr_f2bf(x)")->dtype, DType::BFloat16);
  EXPECT_THROW(p("x +"), InternalError);
  EXPECT_THROW(p("(x"), InternalError);
  EXPECT_THROW(p("x y"), InternalError);
}

TEST(KirExpr, ClampIsAnIndexKind) {
  const Expr c = p("kr_clamp_index(i3 + (-64LL), 0LL, 63LL)");
  EXPECT_EQ(c->kind, ExprKind::Clamp);
  EXPECT_EQ(c->dtype, I64);
  EXPECT_EQ(c.get(), clamp_index(p("i3 + (-64LL)"), 0, 63).get());
  EXPECT_THROW(p("kr_clamp_index(i3, i0, 63LL)"), InternalError) << "bounds are literals";
}

TEST(KirExpr, IntegerRanges) {
  auto range = [](const std::string& text, int64_t limit = int64_t{1} << 31) {
    return int_range(
        p(text),
        [](const std::string& v) -> std::optional<Range> {
          if (v == "i0") return Range{0, 99};
          if (v == "i1") return Range{0, 127};
          return std::nullopt; // a loaded value
        },
        limit);
  };
  EXPECT_EQ(range("(4096LL * i0) + i1"), Range(0, 4096 * 99 + 127));
  EXPECT_EQ(range("kr_clamp_index(i1 + (-64LL), 0LL, 63LL)"), Range(0, 63));
  EXPECT_EQ(range("kr_clamp_index(i1, 0LL, 63LL)"), Range(0, 63));
  EXPECT_EQ(range("((6LL * i0) + i1) / 4LL"), Range(0, (6 * 99 + 127) / 4));
  EXPECT_EQ(range("(i0 - 50LL) % 7LL"), Range(-6, 6));
  EXPECT_EQ(range("(i1 < 64LL) ? i1 : (i1 - 64LL)"), Range(-64, 127))
      << "both branches' ranges: the condition is not used (a bound, not the exact range)";
  EXPECT_EQ(range("i0 * i1", 1000), std::nullopt) << "an intermediate past the limit";
  EXPECT_EQ(range("x + i0"), std::nullopt) << "a loaded index";
  EXPECT_EQ(range("i1 / x"), std::nullopt);
}

TEST(KirExpr, SubstitutesVariables) {
  const Expr e = p("kr_exp(v1 - a0) * v1");
  EXPECT_TRUE(mentions(e, "a0"));
  EXPECT_FALSE(mentions(e, "a"));
  std::vector<std::string> seen;
  for_each_var(e, [&](const std::string& n) { seen.push_back(n); });
  EXPECT_EQ(seen, (std::vector<std::string>{"v1", "a0", "v1"}));
  EXPECT_EQ(c_text(rename(e, "v1", "w")), "kr_exp(w - a0) * w");
  EXPECT_EQ(rename(e, "zz", "w").get(), e.get()) << "unchanged trees are the same node";
  const Expr s = substitute(e, [](const ExprNode& v) -> Expr {
    return v.name == "a0" ? float_lit(2, F32) : nullptr;
  });
  EXPECT_EQ(c_text(s), "kr_exp(v1 - 2.0f) * v1");
  EXPECT_EQ(s.get(), p("kr_exp(v1 - 2.0f) * v1").get());
}

TEST(KirExpr, HelpersAreNamedAfterTheirPrims) {
  EXPECT_EQ(prim_helper(OpId::prim_exp), "kr_exp");
  EXPECT_EQ(prim_helper(OpId::prim_floor_divide), "kr_floor_divide");
  EXPECT_EQ(helper_prim("kr_exp"), OpId::prim_exp);
  EXPECT_EQ(helper_prim("kr_h2f"), std::nullopt) << "a conversion, no prim";
  EXPECT_EQ(helper_prim("exp"), std::nullopt);
  EXPECT_EQ(p("kr_pow(x, x)")->prim, OpId::prim_pow);
  EXPECT_TRUE(p("kr_pow(x, x)")->costly);
}
