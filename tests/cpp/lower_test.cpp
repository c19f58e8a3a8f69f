// The lowering's rule table: every prim is lowered by a kernel or runs through torch, by rule;
// every helper a rule calls exists in both device headers.
#include "keraunos/codegen/embedded.h"
#include "keraunos/codegen/kir_expr.h"
#include "keraunos/codegen/lower.h"
#include "keraunos/ops/op_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>

using namespace keraunos;

TEST(Lower, EveryPrimHasAKernelRule) {
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (!op_def(op).has(tags::P)) continue;
    EXPECT_TRUE(codegen::has_kernel_rule(op)) << op_def(op).id_name << " has no kernel rule";
  }
}

TEST(Lower, EveryHelperARuleCallsIsDefinedForBothBackends) {
  const std::vector<OpId> prims = codegen::helper_prims();
  ASSERT_GT(prims.size(), 20u);
  for (const char* file : {"kr_cpu.h", "kr_cuda.cuh"}) {
    const std::string text(codegen::embedded_file(file));
    for (OpId op : prims) {
      // A definition: the name, then its parameter list, after a return type; or a line of
      // kr_cuda.cuh's KR_UNARY(name, float function, double function) table.
      const std::string h = kir::prim_helper(op);
      const std::regex def("([A-Za-z_0-9>]\\s+" + h + "\\s*\\()|(KR_UNARY\\(" + h + ",)");
      EXPECT_TRUE(std::regex_search(text, def))
          << file << " defines no " << kir::prim_helper(op) << " (" << op_def(op).id_name << ")";
    }
  }
}

TEST(Lower, CostlyPrimsAreHelperCalls) {
  // A prim tagged costly is computed by its device helper, so kernel passes see its cost
  // (kir::ExprNode::costly) wherever it is lowered.
  const std::vector<OpId> prims = codegen::helper_prims();
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (op_def(op).has(tags::P) && op_def(op).has(tags::X))
      EXPECT_NE(std::find(prims.begin(), prims.end(), op), prims.end()) << op_def(op).id_name;
  }
}

TEST(Lower, IndexReductionHelpersAreDefinedForBothBackends) {
  // argmax / argmin lower to a max / min of (value, position) keys (KernelGen::reduce_here):
  // helpers the rule calls by name, not the prims' own.
  for (const char* file : {"kr_cpu.h", "kr_cuda.cuh"}) {
    const std::string text(codegen::embedded_file(file));
    for (const char* h :
         {"kr_argmax_key", "kr_argmin_key", "kr_argmax_index", "kr_argmin_index", "kr_arg_order"}) {
      const std::regex def(std::string("[A-Za-z_0-9>]\\s+") + h + "\\s*\\(");
      EXPECT_TRUE(std::regex_search(text, def)) << file << " defines no " << h;
    }
  }
}

TEST(Lower, IndexReductionsAndScansHaveKernelRules) {
  for (OpId op : {OpId::prim_argmax, OpId::prim_argmin, OpId::prim_cumsum})
    EXPECT_TRUE(codegen::has_kernel_rule(op)) << op_def(op).id_name;
}
