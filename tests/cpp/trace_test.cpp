// The trace printer, the torch program printer and the verifier, on small traces built with
// the Builder.
#include "keraunos/codegen/torch_program.h"
#include "keraunos/ir/error.h"
#include "keraunos/ir/verifier.h"
#include "keraunos/ops/builder.h"

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

// def f(a, b): c = a + b * 2 (with alpha); d = c.sin(); a.mul_(2); return d, c
Trace sample() {
  Builder b;
  auto x = b.add_input(F32, Device{}, {2, 3}, {});
  auto y = b.add_input(F32, Device{}, {3}, {});
  auto loc = std::make_shared<SourceLoc>(SourceLoc{"user.py", 7, "f"});
  Arg c = b.call_user(OpId::add, {Arg(x), Arg(y)}, {{"alpha", Arg(int64_t{2})}}, "torch.add", loc);
  Arg d = b.call_user(OpId::sin, {c}, {}, "torch.sin", nullptr);
  b.call_user(OpId::mul_, {Arg(x), Arg(int64_t{2})}, {}, "torch.Tensor.mul_", nullptr);
  b.set_return(Arg(Arg::List{d, c}));
  return b.finish();
}

TEST(Printer, Golden) {
  EXPECT_EQ(sample().str(),
            "# Constructed by acquire (0.000 ms)\n"
            "def computation(t0, t1):\n"
            "  # t0: cpu f32[2, 3]\n"
            "  # t1: cpu f32[3]\n"
            "  t4 = ltorch.add(t0, t1, alpha=2)  # t4: cpu f32[2, 3]; at user.py:7\n"
            "    # t2 = prims.mul(t1, 2)  # t2: cpu f32[3]\n"
            "    # t3 = prims.broadcast_in_dim(t2, [2, 3], [1])  # t3: cpu f32[2, 3] strides=[0, 1]\n"
            "    # t4 = prims.add(t0, t3)  # t4: cpu f32[2, 3]\n"
            "  t5 = ltorch.sin(t4)  # t5: cpu f32[2, 3]\n"
            "    # t5 = prims.sin(t4)  # t5: cpu f32[2, 3]\n"
            "  ltorch.mul_(t0, 2)\n"
            "    # t6 = ltorch.mul(t0, 2)  # t6: cpu f32[2, 3]\n"
            "      # t6 = prims.mul(t0, 2)  # t6: cpu f32[2, 3]\n"
            "    # prims.copy_(t0, t6)\n"
            "  return t5, t4\n");
  EXPECT_EQ(sample().str(false),
            "# Constructed by acquire (0.000 ms)\n"
            "def computation(t0, t1):\n"
            "  # t0: cpu f32[2, 3]\n"
            "  # t1: cpu f32[3]\n"
            "  t4 = ltorch.add(t0, t1, alpha=2)  # t4: cpu f32[2, 3]; at user.py:7\n"
            "  t5 = ltorch.sin(t4)  # t5: cpu f32[2, 3]\n"
            "  ltorch.mul_(t0, 2)\n"
            "  return t5, t4\n");
}

TEST(Printer, FormatCallArgsDropsTrailingDefaults) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {4}, {});
  const OpDef& div = op_def(OpId::div);
  EXPECT_EQ(format_call_args(div, {Arg(x), Arg(2.0), Arg()}), "t0, 2.0");
  EXPECT_EQ(format_call_args(div, {Arg(x), Arg(2.0), Arg("floor")}), "t0, 2.0, rounding_mode='floor'");
  const OpDef& full = op_def(OpId::prim_full);
  EXPECT_EQ(format_call_args(full, {Arg::int_list({2, 2}), Arg(true), Arg(DType::Bool), Arg(Device{})}),
            "[2, 2], True, dtype=torch.bool, device=torch.device('cpu')");
}

TEST(TorchProgram, Golden) {
  EXPECT_EQ(torch_program(sample(), "fn"),
            "def fn(t0, t1):\n"
            "  t4 = _kr.add(t0, t1, alpha=2)\n"
            "  t5 = torch.sin(t4)\n"
            "  torch.Tensor.mul_(t0, 2)\n"
            "  return (t5, t4, )\n");
}

TEST(TorchProgram, SingleOutputAndNoInputs) {
  Builder b;
  Arg r = b.call(OpId::randn, {Arg::int_list({4}), Arg(F32), Arg(Device{}), Arg(false)});
  b.set_return(r);
  EXPECT_EQ(torch_program(b.finish()),
            "def program():\n"
            "  t0 = torch.randn([4], dtype=torch.float32, device=torch.device('cpu'))\n"
            "  return t0\n");
}

// Each tensor is deleted after its last reader; a boxed program takes its inputs as a list,
// empties it and deletes an input after its last use as well (a backward's saved tensors).
TEST(TorchProgram, DeletesEachTensorAfterItsLastUse) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {4}, {});
  auto y = b.add_input(F32, Device{}, {4}, {});
  auto unused = b.add_input(F32, Device{}, {4}, {});
  Arg s = b.call_user(OpId::sin, {Arg(x)}, {}, "torch.sin", nullptr);
  Arg c = b.call_user(OpId::cos, {s}, {}, "torch.cos", nullptr);
  Arg e = b.call_user(OpId::exp, {Arg(y)}, {}, "torch.exp", nullptr);
  Arg m = b.call_user(OpId::mul, {c, e}, {}, "torch.mul", nullptr);
  b.set_return(Arg(Arg::List{m, e}));
  Trace t = b.finish();
  EXPECT_EQ(torch_program(t, "f"),
            "def f(t0, t1, t2):\n"
            "  t3 = torch.sin(t0)\n"
            "  t4 = torch.cos(t3)\n"
            "  del t3\n"
            "  t5 = torch.exp(t1)\n"
            "  t6 = _kr.mul(t4, t5)\n"
            "  del t4\n"
            "  return (t6, t5, )\n");
  EXPECT_EQ(torch_program(t, "f", /*boxed=*/true),
            "def f(args):\n"
            "  t0, t1, t2, = args\n"
            "  args.clear()\n"
            "  del t2\n"
            "  t3 = torch.sin(t0)\n"
            "  del t0\n"
            "  t4 = torch.cos(t3)\n"
            "  del t3\n"
            "  t5 = torch.exp(t1)\n"
            "  del t1\n"
            "  t6 = _kr.mul(t4, t5)\n"
            "  del t4\n"
            "  return (t6, t5, )\n");
}

// Eager CUDA divides by a Python number as a multiplication by its float reciprocal and takes a
// mean as the sum times outputs / inputs (in float); the CPU divides both.
TEST(Printer, DivisionByNumberFollowsTheDevice) {
  auto trace = [](Device dev) {
    Builder b;
    auto x = b.add_input(DType::BFloat16, dev, {2, 6}, {});
    Arg q = b.call_user(OpId::div, {Arg(x), Arg(int64_t{3})}, {}, "torch.div", nullptr);
    Arg m = b.call_user(OpId::mean, {Arg(x), Arg::int_list({1})}, {}, "torch.mean", nullptr);
    b.set_return(Arg(Arg::List{q, m}));
    return b.finish().str();
  };
  EXPECT_EQ(trace(Device{DeviceType::CUDA, 0}),
            "# Constructed by acquire (0.000 ms)\n"
            "def computation(t0):\n"
            "  # t0: cuda:0 bf16[2, 6]\n"
            "  t3 = ltorch.div(t0, 3)  # t3: cuda:0 bf16[2, 6]\n"
            "    # t1 = prims.convert_element_type(t0, torch.float32)  # t1: cuda:0 f32[2, 6]\n"
            "    # t2 = prims.mul(t1, 0.3333333432674408)  # t2: cuda:0 f32[2, 6]\n"
            "    # t3 = prims.convert_element_type(t2, torch.bfloat16)  # t3: cuda:0 bf16[2, 6]\n"
            "  t7 = ltorch.mean(t0, [1])  # t7: cuda:0 bf16[2]\n"
            "    # t4 = prims.convert_element_type(t0, torch.float32)  # t4: cuda:0 f32[2, 6]\n"
            "    # t5 = prims.sum(t4, [1])  # t5: cuda:0 f32[2]\n"
            "    # t6 = prims.mul(t5, 0.1666666716337204)  # t6: cuda:0 f32[2]\n"
            "    # t7 = prims.convert_element_type(t6, torch.bfloat16)  # t7: cuda:0 bf16[2]\n"
            "  return t3, t7\n");
  EXPECT_EQ(trace(Device{}),
            "# Constructed by acquire (0.000 ms)\n"
            "def computation(t0):\n"
            "  # t0: cpu bf16[2, 6]\n"
            "  t3 = ltorch.div(t0, 3)  # t3: cpu bf16[2, 6]\n"
            "    # t1 = prims.convert_element_type(t0, torch.float32)  # t1: cpu f32[2, 6]\n"
            "    # t2 = prims.div(t1, 3)  # t2: cpu f32[2, 6]\n"
            "    # t3 = prims.convert_element_type(t2, torch.bfloat16)  # t3: cpu bf16[2, 6]\n"
            "  t7 = ltorch.mean(t0, [1])  # t7: cpu bf16[2]\n"
            "    # t4 = prims.convert_element_type(t0, torch.float32)  # t4: cpu f32[2, 6]\n"
            "    # t5 = prims.sum(t4, [1])  # t5: cpu f32[2]\n"
            "    # t6 = prims.div(t5, 6.0)  # t6: cpu f32[2]\n"
            "    # t7 = prims.convert_element_type(t6, torch.bfloat16)  # t7: cpu bf16[2]\n"
            "  return t3, t7\n");
}

// --- verifier ---

TEST(Verifier, ValidTracePasses) {
  EXPECT_EQ(verify(sample(), with_meta()), "");
  VerifyOptions no_reinfer;
  EXPECT_EQ(verify(sample(), no_reinfer), "");
}

TEST(Verifier, UseBeforeDefinition) {
  Trace t = sample();
  std::swap(t.bsyms[0], t.bsyms[1]); // sin(t4) before t4 = add(...)
  EXPECT_EQ(verify(t, with_meta()), "proxy t4 is used before it is defined (line 0: t5 = ltorch.sin(t4))");
}

TEST(Verifier, DuplicatedName) {
  Trace t = sample();
  t.bsyms.insert(t.bsyms.begin() + 1, t.bsyms[1]); // t5 = sin(t4) twice
  EXPECT_EQ(verify(t, with_meta()), "proxy t5 is defined twice (line 2: t5 = ltorch.sin(t4))");
  // Two proxies (distinct objects) with one name.
  Trace u = sample();
  auto clash = std::make_shared<TensorProxy>(*u.inputs[1]);
  clash->name = "t0";
  u.inputs[1] = clash;
  EXPECT_EQ(verify(u, with_meta()), "proxy t0 is defined twice (input)");
}

TEST(Verifier, MissingReturn) {
  Trace t = sample();
  t.bsyms.pop_back();
  EXPECT_EQ(verify(t, with_meta()), "the trace does not end with return");
  Trace e;
  EXPECT_EQ(verify(e, with_meta()), "the trace does not end with return");
}

TEST(Verifier, ReturnNotLast) {
  Trace t = sample();
  t.bsyms.insert(t.bsyms.begin() + 2, t.bsyms.back());
  EXPECT_EQ(verify(t, with_meta()), "return is not last (line 2: return t5, t4)");
}

TEST(Verifier, TamperedOutputShape) {
  Builder b;
  auto x = b.add_input(F32, Device{}, {2, 3}, {});
  Arg s = b.call(OpId::prim_sin, {Arg(x)}); // a top-level prim: no decomposition
  b.set_return(s);
  Trace t = b.finish();
  ASSERT_EQ(verify(t, with_meta()), "");
  auto bad = std::make_shared<TensorProxy>(*t.bsyms[0].out.tensor());
  bad->shape = {6};
  bad->strides = {1};
  t.bsyms[0].out = Arg(TensorRef(bad));
  t.bsyms[1].args[0] = Arg(TensorRef(bad));
  EXPECT_EQ(verify(t, with_meta()), "recorded cpu f32[6] but the meta functions infer cpu f32[2, 3] (line 0: "
                       "t1 = prims.sin(t0))");
  VerifyOptions no_reinfer;
  EXPECT_EQ(verify(t, no_reinfer), "");
}

TEST(Verifier, TamperedOutputDType) {
  Trace t = sample();
  // The top-level output of sin no longer comes from its decomposition.
  auto other = std::make_shared<TensorProxy>(*t.bsyms[1].out.tensor());
  other->dtype = DType::Float64;
  t.bsyms[1].out = Arg(TensorRef(other));
  EXPECT_EQ(verify(t, with_meta()), "output t5 is not produced by the decomposition (line 1: t5 = ltorch.sin(t4))");
  // Tamper the decomposition consistently: the meta functions disagree.
  t.bsyms[1].subsymbols[0].out = Arg(TensorRef(other));
  EXPECT_EQ(verify(t, with_meta()), "recorded cpu f64[2, 3] but the meta functions infer cpu f32[2, 3] "
                       "(line 1: t5 = ltorch.sin(t4))");
}

TEST(Verifier, FunctionalMode) {
  VerifyOptions functional;
  functional.functional = true;
  EXPECT_EQ(verify(sample(), functional),
            "in-place symbol after functionalization (line 2: ltorch.mul_(t0, 2))");
}

} // namespace
} // namespace keraunos
