// Small helpers for building kir::Kernels by hand in tests.
#pragma once
#include "keraunos/codegen/kernel_ir.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace keraunos::kir::build {

// The dtypes of the variables the builders below declared (in the order a kernel's braced
// lists build them), for the expressions of later lets.
inline std::map<std::string, DType>& declared() {
  thread_local std::map<std::string, DType> d;
  return d;
}

inline Index idx(std::vector<std::pair<std::string, int64_t>> terms, int64_t constant = 0) {
  Index i;
  i.terms = std::move(terms);
  i.constant = constant;
  return i;
}
inline Stmt loop(std::string var, int64_t extent, LoopKind kind, Block body) {
  return Stmt::of(Loop{std::move(var), extent, kind, std::move(body)});
}
inline Stmt par(std::string var, int64_t extent, Block body) {
  return loop(std::move(var), extent, LoopKind::Parallel, std::move(body));
}
inline Stmt red(std::string var, int64_t extent, Block body) {
  return loop(std::move(var), extent, LoopKind::Reduce, std::move(body));
}
inline Stmt inner(std::string var, int64_t extent, Block body) {
  return loop(std::move(var), extent, LoopKind::Inner, std::move(body));
}
inline Stmt load(std::string var, DType dtype, int buffer, Index index) {
  declared()[var] = dtype;
  return Stmt::of(Load{std::move(var), dtype, buffer, std::move(index)});
}
// An expression written in the C subset kir::c_text prints: loop variables (i<n>, r<n>) read
// as int64, declared variables in their dtype, others in `dtype`.
inline Expr expr(const std::string& text, DType dtype) {
  return parse(text, [dtype](const std::string& name) {
    const bool loop_var = name.size() > 1 && (name[0] == 'i' || name[0] == 'r') &&
                          name.find_first_not_of("0123456789", 1) == std::string::npos;
    if (loop_var) return DType::Int64;
    auto it = declared().find(name);
    return it == declared().end() ? dtype : it->second;
  });
}
inline Stmt let(std::string var, DType dtype, const std::string& text) {
  Expr e = expr(text, dtype);
  declared()[var] = dtype;
  return Stmt::of(Let{std::move(var), dtype, std::move(e)});
}
inline Stmt acc(std::string var, DType dtype, ReduceOp op) {
  declared()[var] = dtype;
  return Stmt::of(AccInit{std::move(var), dtype, op});
}
inline Stmt update(std::string var, ReduceOp op, std::string value) {
  return Stmt::of(AccUpdate{std::move(var), op, std::move(value)});
}
inline Stmt store(int buffer, Index index, std::string value) {
  return Stmt::of(Store{buffer, std::move(index), std::move(value)});
}
inline Buffer buffer(std::string name, DType dtype, bool output, Shape shape) {
  Buffer b;
  b.name = std::move(name);
  b.dtype = dtype;
  b.output = output;
  b.strides = contiguous_strides(shape);
  b.shape = std::move(shape);
  return b;
}

constexpr DType F32 = DType::Float32;

// out0 = gelu(in0) * in1 + in2 over [rows, cols] (contiguous).
inline Kernel gelu_mul_add(int64_t rows, int64_t cols, DType dt = F32) {
  Kernel k;
  k.name = "gelu_mul_add";
  k.device = DeviceType::CUDA;
  for (int i = 0; i < 3; ++i) k.buffers.push_back(buffer("in" + std::to_string(i), dt, false, {rows, cols}));
  k.buffers.push_back(buffer("out0", dt, true, {rows, cols}));
  const Index ix = idx({{"i0", cols}, {"i1", 1}});
  k.body = {par("i0", rows,
                {par("i1", cols,
                     {load("v0", F32, 0, ix), load("v1", F32, 1, ix), load("v2", F32, 2, ix),
                      let("v3", F32, "((0.5f * v0) * (1.0f + kr_erf((v0 * 0.70710678118654752f))))"),
                      let("v4", F32, "((v3 * v1) + v2)"), store(3, ix, "v4")})})};
  return k;
}

// out0 = in0 (a copy), over n elements.
inline Kernel copy_kernel(int64_t n) {
  Kernel k;
  k.name = "copy";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", F32, false, {n}), buffer("out0", F32, true, {n})};
  k.body = {par("i0", n, {load("v0", F32, 0, idx({{"i0", 1}})), store(1, idx({{"i0", 1}}), "v0")})};
  return k;
}

// softmax over the last dim of [rows, cols], as in kernel_ir.h's example.
inline Kernel softmax(int64_t rows, int64_t cols, DType dt = F32) {
  Kernel k;
  k.name = "softmax";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", dt, false, {rows, cols}), buffer("out0", dt, true, {rows, cols})};
  auto row = [&](const char* v) { return idx({{"i0", cols}, {v, 1}}); };
  k.body = {par("i0", rows,
                {acc("a0", F32, ReduceOp::Max),
                 red("r0", cols, {load("v0", F32, 0, row("r0")), update("a0", ReduceOp::Max, "v0")}),
                 acc("a1", F32, ReduceOp::Sum),
                 red("r1", cols,
                     {load("v1", F32, 0, row("r1")), let("v2", F32, "kr_exp((v1 - a0))"),
                      update("a1", ReduceOp::Sum, "v2")}),
                 inner("i1", cols,
                       {load("v3", F32, 0, row("i1")), let("v4", F32, "kr_exp((v3 - a0))"),
                        let("v5", F32, "(v4 / a1)"), store(1, row("i1"), "v5")})})};
  return k;
}

// layer_norm over the last dim of [rows, cols] with weight and bias (two-pass variance).
inline Kernel layer_norm(int64_t rows, int64_t cols, DType dt = F32) {
  Kernel k;
  k.name = "layer_norm";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", dt, false, {rows, cols}), buffer("in1", dt, false, {cols}),
               buffer("in2", dt, false, {cols}), buffer("out0", dt, true, {rows, cols})};
  auto row = [&](const char* v) { return idx({{"i0", cols}, {v, 1}}); };
  const std::string n = std::to_string(cols) + ".0f";
  k.body = {par("i0", rows,
                {acc("a0", F32, ReduceOp::Sum),
                 red("r0", cols, {load("v0", F32, 0, row("r0")), update("a0", ReduceOp::Sum, "v0")}),
                 let("v1", F32, "(a0 / " + n + ")"),
                 acc("a1", F32, ReduceOp::Sum),
                 red("r1", cols,
                     {load("v2", F32, 0, row("r1")), let("v3", F32, "(v2 - v1)"),
                      let("v4", F32, "(v3 * v3)"), update("a1", ReduceOp::Sum, "v4")}),
                 let("v5", F32, "kr_rsqrt(((a1 / " + n + ") + 1e-05f))"),
                 inner("i1", cols,
                       {load("v6", F32, 0, row("i1")), load("v7", F32, 1, idx({{"i1", 1}})),
                        load("v8", F32, 2, idx({{"i1", 1}})),
                        let("v9", F32, "((((v6 - v1) * v5) * v7) + v8)"),
                        store(3, row("i1"), "v9")})})};
  k.body[0].loop->body[4].loop->deviations = kir::Loop::Deviations{"a0", "v1"}; // as lowered
  return k;
}

// rms_norm over the last dim of [rows, cols] with a weight; in0's rows are `row_stride` apart
// (cols when 0) and start at element `offset` (a slice), out0 is contiguous. The weight has
// dtype `weight_dtype` (dt when absent).
inline Kernel rms_norm_rows(int64_t rows, int64_t cols, DType dt = F32, int64_t row_stride = 0,
                       int64_t offset = 0, std::optional<DType> weight_dtype = {}) {
  if (row_stride == 0) row_stride = cols;
  const DType wdt = weight_dtype.value_or(dt);
  Kernel k;
  k.name = "rms_norm";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", dt, false, {rows, cols}), buffer("in1", wdt, false, {cols}),
               buffer("out0", dt, true, {rows, cols})};
  k.buffers[0].strides = {row_stride, 1};
  auto x = [&](const char* v) { return idx({{"i0", row_stride}, {v, 1}}, offset); };
  const std::string n = std::to_string(cols) + ".0f";
  k.body = {par("i0", rows,
                {acc("a0", F32, ReduceOp::Sum),
                 red("r0", cols,
                     {load("v0", F32, 0, x("r0")), let("v1", F32, "(v0 * v0)"),
                      update("a0", ReduceOp::Sum, "v1")}),
                 let("v2", F32, "kr_rsqrt(((a0 / " + n + ") + 1e-06f))"),
                 inner("i1", cols,
                       {load("v3", F32, 0, x("i1")), load("v4", F32, 1, idx({{"i1", 1}})),
                        let("v5", F32, "((v3 * v2) * v4)"),
                        store(2, idx({{"i0", cols}, {"i1", 1}}), "v5")})})};
  return k;
}

// amax over dims (1, 2) of an int32 [64, 48, 40]: two nested Reduce loops (1920 per row).
inline Kernel amax12() {
  Kernel k;
  k.name = "amax12";
  k.buffers = {buffer("in0", DType::Int32, false, {64, 48, 40}),
               buffer("out0", DType::Int32, true, {64})};
  k.body = {par("i0", 64,
                {acc("a0", DType::Int32, ReduceOp::Max),
                 red("r0", 48, {red("r1", 40, {load("v0", DType::Int32, 0,
                                                    idx({{"i0", 1920}, {"r0", 40}, {"r1", 1}})),
                                               update("a0", ReduceOp::Max, "v0")})}),
                 store(1, idx({{"i0", 1}}), "a0")})};
  return k;
}

// out0[i0] = argmax(in0[i0, :]) as the lowering computes it: a max of (value, position) keys.
inline Kernel row_argmax(int64_t rows, int64_t cols, DType dt = F32, bool argmin = false) {
  Kernel k;
  k.name = argmin ? "row_argmin" : "row_argmax";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", dt, false, {rows, cols}), buffer("out0", DType::Int64, true, {rows})};
  const std::string f = argmin ? "kr_argmin" : "kr_argmax";
  const ReduceOp op = argmin ? ReduceOp::Min : ReduceOp::Max;
  k.body = {par("i0", rows,
                {acc("a0", DType::Int64, op),
                 red("r0", cols,
                     {load("v0", kir::compute_dtype(dt), 0, idx({{"i0", cols}, {"r0", 1}})),
                      let("v1", DType::Int64, f + "_key(v0, r0)"), update("a0", op, "v1")}),
                 let("v2", DType::Int64, f + "_index(a0)"), store(1, idx({{"i0", 1}}), "v2")})};
  return k;
}

// out0 = cumsum(in0, dim=1) over [rows, cols], accumulated in the compute dtype.
inline Kernel row_cumsum(int64_t rows, int64_t cols, DType dt = F32) {
  Kernel k;
  k.name = "row_cumsum";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", dt, false, {rows, cols}), buffer("out0", dt, true, {rows, cols})};
  const Index ix = idx({{"i0", cols}, {"s0", 1}});
  const DType c = kir::compute_dtype(dt);
  k.body = {par("i0", rows,
                {acc("a0", c, ReduceOp::Sum),
                 loop("s0", cols, LoopKind::Scan,
                      {load("v0", c, 0, ix), update("a0", ReduceOp::Sum, "v0"), let("v1", c, "a0"),
                       store(1, ix, "v1")})})};
  return k;
}

// out0[i0] = sum(in0[i0, :]) / cols: a row mean, one store per row.
inline Kernel row_mean(int64_t rows, int64_t cols) {
  Kernel k;
  k.name = "row_mean";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", F32, false, {rows, cols}), buffer("out0", F32, true, {rows})};
  k.body = {par("i0", rows,
                {acc("a0", F32, ReduceOp::Sum),
                 red("r0", cols,
                     {load("v0", F32, 0, idx({{"i0", cols}, {"r0", 1}})),
                      update("a0", ReduceOp::Sum, "v0")}),
                 let("v1", F32, "(a0 / " + std::to_string(cols) + ".0f)"),
                 store(1, idx({{"i0", 1}}), "v1")})};
  return k;
}

// out0[i] = amax(in0[:, i]): a reduction over the outer dim of [rows, cols] (columns).
inline Kernel column_max(int64_t rows, int64_t cols) {
  Kernel k;
  k.name = "column_max";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", F32, false, {rows, cols}), buffer("out0", F32, true, {cols})};
  k.body = {par("i0", cols,
                {acc("a0", F32, ReduceOp::Max),
                 red("r0", rows,
                     {load("v0", F32, 0, idx({{"r0", cols}, {"i0", 1}})),
                      update("a0", ReduceOp::Max, "v0")}),
                 store(1, idx({{"i0", 1}}), "a0")})};
  return k;
}

// out0[i] = sum_r in0[r, i] * in1[r]: a column sum weighted by a per-row vector (a layer norm's
// weight gradient reads its per-row statistics this way).
inline Kernel column_weighted_sum(int64_t rows, int64_t cols) {
  Kernel k;
  k.name = "column_weighted_sum";
  k.device = DeviceType::CUDA;
  k.buffers = {buffer("in0", F32, false, {rows, cols}), buffer("in1", F32, false, {rows}),
               buffer("out0", F32, true, {cols})};
  k.body = {par("i0", cols,
                {acc("a0", F32, ReduceOp::Sum),
                 red("r0", rows,
                     {load("v0", F32, 0, idx({{"r0", cols}, {"i0", 1}})),
                      load("v1", F32, 1, idx({{"r0", 1}})), let("v2", F32, "v0 * v1"),
                      update("a0", ReduceOp::Sum, "v2")}),
                 store(2, idx({{"i0", 1}}), "a0")})};
  return k;
}

} // namespace keraunos::kir::build
