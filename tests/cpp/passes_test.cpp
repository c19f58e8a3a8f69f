// Dead code elimination, common subexpression elimination and folding of remap chains.
#include "keraunos/ir/verifier.h"
#include "keraunos/ops/builder.h"
#include "keraunos/passes/cse.h"
#include "keraunos/passes/dce.h"
#include "keraunos/passes/fold_remaps.h"

#include <gtest/gtest.h>

namespace keraunos {
namespace {

// The verifier with the meta functions' re-inference (as the pass manager runs it).
VerifyOptions with_meta() {
  VerifyOptions o;
  o.reinfer = [](const BoundSymbol& b) { return reinfer(b, BuilderOptions{}); };
  return o;
}

constexpr DType F32 = DType::Float32;

// The top-level lines of a trace (no subsymbols, no header).
std::vector<std::string> lines(const Trace& t) {
  std::vector<std::string> out;
  for (const auto& b : t.bsyms) out.push_back(bsym_line(b));
  return out;
}

using Lines = std::vector<std::string>;

Arg randn(Builder& b, int64_t n) {
  return b.call(OpId::randn, {Arg::int_list({n}), Arg(F32), Arg(Device{}), Arg(false)});
}

TEST(DCE, DropsDeadPureSymbolsKeepsEffects) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {4}, {});
  Arg s = b.call(OpId::sin, {Arg(x)});          // dead
  b.call(OpId::exp, {s});                        // dead, and makes sin dead transitively
  Arg c = b.call(OpId::cos, {Arg(x)});           // returned
  randn(b, 4);                                   // dead but random: stays
  Arg z = b.call(OpId::zeros, {Arg::int_list({4}), Arg(F32), Arg(Device{}), Arg(false)});
  b.call(OpId::fill_, {z, Arg(1.0)});            // in-place into a dead temporary: stays
  b.call(OpId::sin_, {Arg(x)});                  // in-place on the input: stays
  b.set_return(c);
  Trace t = b.finish();
  PassContext ctx;
  PassResult r = dce(t, ctx);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(lines(r.trace), (Lines{
                                "t3 = ltorch.cos(t0)",
                                "t4 = ltorch.randn([4], dtype=torch.float32, device=torch.device('cpu'))",
                                "t5 = ltorch.zeros([4], dtype=torch.float32, device=torch.device('cpu'))",
                                "ltorch.fill_(t5, 1.0)",
                                "ltorch.sin_(t0)",
                                "return t3",
                            }));
  EXPECT_EQ(verify(r.trace, with_meta()), "");
  // Nothing left to remove.
  PassResult again = dce(r.trace, ctx);
  EXPECT_FALSE(again.changed);
  EXPECT_EQ(lines(again.trace), lines(r.trace));
}

TEST(DCE, KeepsTheBugReportProgram) {
  // def f(): torch.randn(4).sin_()   -- returns None; the draw and the write stay.
  Builder b;
  Arg r = randn(b, 4);
  b.call(OpId::sin_, {r});
  b.set_return(Arg());
  PassResult out = dce(b.finish(), PassContext{});
  EXPECT_FALSE(out.changed);
  EXPECT_EQ(lines(out.trace),
            (Lines{"t0 = ltorch.randn([4], dtype=torch.float32, device=torch.device('cpu'))",
                   "ltorch.sin_(t0)", "return None"}));
}

TEST(CSE, MergesIdenticalPureOps) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {4}, {});
  Arg s1 = b.call(OpId::sin, {Arg(x)});
  Arg s2 = b.call(OpId::sin, {Arg(x)});
  Arg a = b.call(OpId::add, {s1, s2, Arg(int64_t{1})});
  Arg m1 = b.call(OpId::mul, {a, Arg(int64_t{2})});
  Arg m2 = b.call(OpId::mul, {a, Arg(2.0)}); // 2 and 2.0 are different arguments
  b.set_return(Arg(Arg::List{m1, m2}));
  PassResult r = cse(b.finish(), PassContext{});
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(lines(r.trace), (Lines{
                                "t1 = ltorch.sin(t0)",
                                "t3 = ltorch.add(t1, t1)",
                                "t4 = ltorch.mul(t3, 2)",
                                "t5 = ltorch.mul(t3, 2.0)",
                                "return t4, t5",
                            }));
  EXPECT_EQ(verify(r.trace, with_meta()), "");
}

TEST(CSE, NeverMergesRandomOps) {
  Builder b;
  Arg r1 = randn(b, 3);
  Arg r2 = randn(b, 3);
  b.set_return(Arg(Arg::List{r1, r2}));
  Trace t = b.finish();
  PassResult r = cse(t, PassContext{});
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(lines(r.trace), lines(t));
}

TEST(CSE, KeepsReturnedTensorsDistinct) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {4}, {});
  Arg s1 = b.call(OpId::sin, {Arg(x)});
  Arg s2 = b.call(OpId::sin, {Arg(x)});
  b.set_return(Arg(Arg::List{s1, s2}));
  Trace t = b.finish();
  PassResult r = cse(t, PassContext{});
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(lines(r.trace), lines(t));
}

TEST(CSE, NotAcrossAnInPlaceWriteToTheSameStorage) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {4}, {}, 0, /*storage_id=*/0);
  auto alias = b.add_input(F32, Device{}, {4}, {}, 0, /*storage_id=*/0); // same memory as x
  auto other = b.add_input(F32, Device{}, {4}, {});
  Arg s1 = b.call(OpId::sin, {Arg(x)});
  b.call(OpId::mul_, {Arg(other), Arg(int64_t{3})}); // another storage: no effect on x
  Arg s2 = b.call(OpId::sin, {Arg(x)});               // merges with s1
  b.call(OpId::add_, {Arg(alias), Arg(int64_t{1}), Arg(int64_t{1})}); // writes x's memory
  Arg s3 = b.call(OpId::sin, {Arg(x)});               // a new value: stays
  Arg s4 = b.call(OpId::sin, {Arg(x)});               // merges with s3
  // Returned tensors stay distinct (as in eager), so return sums of the pairs.
  Arg u = b.call(OpId::add, {s1, s2, Arg(int64_t{1})});
  Arg v = b.call(OpId::add, {s3, s4, Arg(int64_t{1})});
  b.set_return(Arg(Arg::List{u, v}));
  PassResult r = cse(b.finish(), PassContext{});
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(lines(r.trace), (Lines{
                                "t3 = ltorch.sin(t0)",
                                "ltorch.mul_(t2, 3)",
                                "ltorch.add_(t1, 1)",
                                "t7 = ltorch.sin(t0)",
                                "t9 = ltorch.add(t3, t3)",
                                "t10 = ltorch.add(t7, t7)",
                                "return t9, t10",
                            }));
  EXPECT_EQ(verify(r.trace, with_meta()), "");
}

TEST(FoldRemaps, PermutesComposeAndCancelReshapesCollapse) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {2, 3, 4}, {});
  Arg p1 = b.call(OpId::prim_permute, {Arg(x), Arg::int_list({1, 2, 0})});  // [3, 4, 2]
  Arg p2 = b.call(OpId::prim_permute, {p1, Arg::int_list({2, 0, 1})});      // back: [2, 3, 4]
  Arg s = b.call(OpId::prim_sin, {p2});
  Arg p3 = b.call(OpId::prim_permute, {p1, Arg::int_list({1, 0, 2})});      // [4, 3, 2]
  Arg r1 = b.call(OpId::prim_reshape, {Arg(x), Arg::int_list({6, 4})});
  Arg r2 = b.call(OpId::prim_reshape, {r1, Arg::int_list({24})});
  Arg r3 = b.call(OpId::prim_reshape, {r2, Arg::int_list({2, 3, 4})});      // x's shape again
  Arg c = b.call(OpId::prim_cos, {r3});
  Arg kept = b.call(OpId::prim_permute, {p1, Arg::int_list({2, 0, 1})});    // returned: stays
  b.set_return(Arg(Arg::List{s, p3, r2, c, kept}));
  PassContext ctx;
  PassResult r = fold_remaps(b.finish(), ctx);
  EXPECT_TRUE(r.changed);
  Trace t = dce(r.trace, ctx).trace;
  EXPECT_EQ(lines(t), (Lines{
                          "t3 = prims.sin(t0)",
                          "t4 = prims.permute(t0, [2, 1, 0])",
                          "t6 = prims.reshape(t0, [24])",
                          "t8 = prims.cos(t0)",
                          "t9 = prims.permute(t0, [0, 1, 2])",
                          "return t3, t4, t6, t8, t9",
                      }));
  EXPECT_EQ(verify(t, with_meta()), "");
  EXPECT_FALSE(fold_remaps(t, ctx).changed);
}

} // namespace
} // namespace keraunos
