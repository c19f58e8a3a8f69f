// Kernel IR passes: hoisting loop-invariant lets out of Reduce / Inner loops.
#include "keraunos/codegen/kernel_ir.h"
#include "kir_builders.h"

#include <gtest/gtest.h>

using namespace keraunos;
using namespace keraunos::kir;
using namespace keraunos::kir::build;

TEST(KernelIr, HoistsPointConstantsOutOfInnerLoops) {
  Kernel k = rms_norm_rows(4, 8);
  // Put the per-point rsqrt inside the inner loop, as lowering first places it.
  Loop& point = *k.body[0].loop;
  Stmt rs = point.body[2];
  ASSERT_EQ(rs.kind, Stmt::Kind::Let);
  point.body.erase(point.body.begin() + 2);
  Loop& in = *point.body[2].loop;
  in.body.insert(in.body.begin() + 2, rs);
  // And one that reads the inner variable, and one that reads a value loaded in the loop.
  in.body.insert(in.body.begin() + 3, let("w1", DType::Float32, "(float)(i1 + 1)"));
  in.body.insert(in.body.begin() + 4, let("w2", DType::Float32, "(v2 * 2.0f)"));
  in.body.insert(in.body.begin() + 5, let("w3", DType::Float32, "(w2 + v3)"));
  hoist_invariants(k.body);
  EXPECT_EQ(k.str(), R"(kernel rms_norm(in0: f32[4, 8], in1: f32[8], out0: f32[4, 8]):
  parallel i0 < 4:
    acc a0 sum
    reduce r0 < 8:
      v0 = load in0[8 * i0 + r0]
      let v1 = v0 * v0
      update a0 sum v1
    let v2 = kr_rsqrt((a0 / 8.0f) + 1e-06f)
    let w2 = v2 * 2.0f
    inner i1 < 8:
      v3 = load in0[8 * i0 + i1]
      v4 = load in1[i1]
      let w1 = (float)(i1 + 1LL)
      let w3 = w2 + v3
      let v5 = (v3 * v2) * v4
      store out0[8 * i0 + i1] = v5
)");
}

TEST(KernelIr, HoistsLoadsAPointReadsOnTheCpuOnly) {
  // A per-row statistic loaded in the row's inner loop (a backward reads the forward's saved
  // rstd there): with `loads`, the load and what it alone feeds move before the loop; a load of
  // a buffer the kernel stores to stays.
  auto make = [] {
    Kernel k = rms_norm_rows(4, 8);
    k.buffers.insert(k.buffers.begin() + 2, buffer("in2", DType::Float32, false, {4}));
    Loop& in = *k.body[0].loop->body[3].loop;
    for (Stmt& s : in.body)
      if (s.kind == Stmt::Kind::Store) s.store.buffer = 3;
    in.body.insert(in.body.begin(), load("s0", DType::Float32, 2, idx({{"i0", 1}})));
    in.body.insert(in.body.begin() + 1, let("s1", DType::Float32, "(s0 * 2.0f)"));
    in.body.insert(in.body.begin() + 2, load("s2", DType::Float32, 3, idx({{"i0", 8}})));
    return k;
  };
  Kernel cuda = make(), cpu = make();
  const std::string before = cuda.str();
  hoist_invariants(cuda.body);
  EXPECT_EQ(cuda.str(), before);
  hoist_invariants(cpu.body, /*loads=*/true);
  const std::string s = cpu.str();
  EXPECT_NE(s.find("    s0 = load in2[i0]\n    let s1 = s0 * 2.0f\n    inner i1 < 8:\n      s2 = load "
                   "out0[8 * i0]"),
            std::string::npos)
      << s;
}

TEST(KernelIr, KeepsLetsThatReadAccumulatorsUpdatedInTheLoop) {
  Kernel k = rms_norm_rows(4, 8);
  Loop& red_loop = *k.body[0].loop->body[1].loop;
  // Reads the accumulator this loop updates: a running value, not an invariant. A longer name
  // that starts with it does not count as a read.
  red_loop.body.push_back(let("w0", DType::Float32, "(a0 * 1e-06f)"));
  red_loop.body.push_back(let("w1", DType::Float32, "(kr_v0 + a00)"));
  hoist_invariants(k.body);
  const std::string s = k.str();
  EXPECT_NE(s.find("      let w0 = a0 * 1e-06f"), std::string::npos) << s;
  EXPECT_NE(s.find("    let w1 = kr_v0 + a00\n    reduce"), std::string::npos) << s;
}

TEST(KernelIr, ParallelLoopsKeepTheirLets) {
  Kernel k = rms_norm_rows(4, 8);
  k.body[0].loop->body.insert(k.body[0].loop->body.begin(), let("c", DType::Float32, "1.0f"));
  const std::string before = k.str();
  hoist_invariants(k.body);
  EXPECT_EQ(k.str(), before);
}

TEST(KernelIr, FusesIndependentSiblingReductions) {
  Kernel k;
  k.name = "sum_and_sumsq";
  k.buffers = {buffer("in0", DType::Float32, false, {4, 8}),
               buffer("out0", DType::Float32, true, {4})};
  auto row = [](const char* v) { return idx({{"i0", 8}, {v, 1}}); };
  k.body = {par("i0", 4,
                {acc("a0", DType::Float32, ReduceOp::Sum),
                 red("r0", 8, {load("v0", DType::Float32, 0, row("r0")),
                               update("a0", ReduceOp::Sum, "v0")}),
                 let("v1", DType::Float32, "(a0 / 8.0f)"),
                 acc("a1", DType::Float64, ReduceOp::Sum),
                 red("r1", 8, {load("v2", DType::Float32, 0, row("r1")),
                               let("v3", DType::Float64, "((double)v2 * (double)r1)"),
                               update("a1", ReduceOp::Sum, "v3")}),
                 // Reads the first loop's result: stays a separate pass.
                 acc("a2", DType::Float32, ReduceOp::Max),
                 red("r2", 8, {load("v4", DType::Float32, 0, row("r2")),
                               let("v5", DType::Float32, "(v4 - v1)"),
                               update("a2", ReduceOp::Max, "v5")}),
                 let("v6", DType::Float32, "(v1 + (float)a1 + a2)"),
                 store(1, idx({{"i0", 1}}), "v6")})};
  fuse_sibling_reductions(k.body);
  EXPECT_EQ(k.str(), R"(kernel sum_and_sumsq(in0: f32[4, 8], out0: f32[4]):
  parallel i0 < 4:
    acc a0 sum
    acc a1 sum
    reduce r0 < 8:
      v0 = load in0[8 * i0 + r0]
      update a0 sum v0
      v2 = load in0[8 * i0 + r0]
      let v3 = (double)(v2) * (double)(r0)
      update a1 sum v3
    let v1 = a0 / 8.0f
    acc a2 max
    reduce r2 < 8:
      v4 = load in0[8 * i0 + r2]
      let v5 = v4 - v1
      update a2 max v5
    let v6 = (v1 + (float)(a1)) + a2
    store out0[i0] = v6
)");
}

TEST(KernelIr, ScanLoopsKeepTheirRunningValues) {
  // A Scan loop (cumsum) prints as `scan`; a let of the running sum stays in the loop, a
  // per-row constant leaves it.
  Kernel k;
  k.name = "cumsum";
  k.buffers = {buffer("in0", F32, false, {4, 8}), buffer("in1", F32, false, {4}),
               buffer("out0", F32, true, {4, 8})};
  const Index ix = idx({{"i0", 8}, {"s0", 1}});
  k.body = {par("i0", 4,
                {load("w", F32, 1, idx({{"i0", 1}})), acc("a0", F32, ReduceOp::Sum),
                 loop("s0", 8, LoopKind::Scan,
                      {load("v0", F32, 0, ix), let("c", F32, "(w * 2.0f)"),
                       let("v1", F32, "(v0 * c)"), update("a0", ReduceOp::Sum, "v1"),
                       let("v2", F32, "a0"), store(2, ix, "v2")})})};
  hoist_invariants(k.body);
  EXPECT_EQ(k.str(), R"(kernel cumsum(in0: f32[4, 8], in1: f32[4], out0: f32[4, 8]):
  parallel i0 < 4:
    w = load in1[i0]
    acc a0 sum
    let c = w * 2.0f
    scan s0 < 8:
      v0 = load in0[8 * i0 + s0]
      let v1 = v0 * c
      update a0 sum v1
      let v2 = a0
      store out0[8 * i0 + s0] = v2
)");
}
