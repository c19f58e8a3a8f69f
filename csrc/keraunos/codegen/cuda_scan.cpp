// CUDA schedule of scans along a row (cumsum over the innermost dim): one block per outer point
// walks the row in chunks of `threads` elements; each thread computes its element's value, a
// block-wide inclusive scan (warp shuffles, then the warps' sums through shared memory) gives
// the running values within the chunk, and a carry holds the sum of the chunks before. Scans
// that do not qualify (along an outer dim, short rows, bodies this plan does not split) run one
// thread per outer point (emit_grid_stride), walking the Scan loop in order.
//
//   parallel i0 < R:                         block per i0:
//     acc a0 sum                               carry = 0
//     scan s0 < N:                             for chunk c: s0 = c + tid
//       v0 = load in0[N * i0 + s0]     =>        x = (s0 < N) ? in0[N * i0 + s0] : 0
//       update a0 sum v0                          a0 = carry + inclusive_scan(x); carry += total
//       let v1 = a0                               if (s0 < N) { v1 = a0; out0[...] = v1 }
//       store out0[N * i0 + s0] = v1
#include "keraunos/codegen/cuda_schedule.h"

#include "keraunos/ir/error.h"

namespace keraunos::codegen::cudagen {

namespace {

int64_t pow2_at_least(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

} // namespace

std::optional<ScanPlan> scan_plan(const Analysis& a) {
  // The point: the accumulator, then the Scan loop, nothing else.
  const Block& point = *a.point;
  if (point.size() != 2 || point[0].kind != Stmt::Kind::AccInit ||
      point[1].kind != Stmt::Kind::Loop || point[1].loop->kind != LoopKind::Scan)
    return std::nullopt;
  const Loop& l = *point[1].loop;
  const std::string& acc = point[0].acc.var;
  if (point[0].acc.op != kir::ReduceOp::Sum || is_bool(point[0].acc.dtype)) return std::nullopt;
  ScanPlan p;
  p.loop = &l;
  p.acc = acc;
  p.update = -1;
  bool along_row = false;
  std::vector<std::string> before; // values defined before the update
  for (size_t i = 0; i < l.body.size(); ++i) {
    const Stmt& s = l.body[i];
    if (s.kind == Stmt::Kind::Loop || s.kind == Stmt::Kind::AccInit) return std::nullopt;
    if (s.kind == Stmt::Kind::AccUpdate) {
      if (p.update >= 0 || s.update.var != acc || s.update.op != kir::ReduceOp::Sum)
        return std::nullopt;
      p.update = static_cast<int>(i);
      continue;
    }
    if (s.kind == Stmt::Kind::Load) along_row |= s.load.index.coef(l.var) == 1;
    if (p.update < 0) {
      // Before the update: values of this element only, never the running sum.
      if (s.kind == Stmt::Kind::Store) return std::nullopt;
      if (s.kind == Stmt::Kind::Let && kir::mentions(s.let.expr, acc)) return std::nullopt;
      if (s.kind == Stmt::Kind::Load) before.push_back(s.load.var);
      if (s.kind == Stmt::Kind::Let) before.push_back(s.let.var);
      continue;
    }
    // After it: the running sum and values computed after it (the values before live in the
    // first guarded part of the chunk).
    for (const std::string& v : before) {
      if (s.kind == Stmt::Kind::Let && kir::mentions(s.let.expr, v)) return std::nullopt;
      if (s.kind == Stmt::Kind::Store && s.store.value == v) return std::nullopt;
      if (s.kind == Stmt::Kind::Load && s.load.index.opaque && kir::mentions(s.load.index.opaque, v))
        return std::nullopt;
      if (s.kind == Stmt::Kind::Store && s.store.index.opaque &&
          kir::mentions(s.store.index.opaque, v))
        return std::nullopt;
    }
  }
  if (p.update < 0 || !along_row || l.extent < 64) return std::nullopt;
  p.threads = static_cast<int>(std::clamp<int64_t>(pow2_at_least(l.extent), 32, 512));
  return p;
}

void emit_scan_block(Emitter& e, const std::string& name, const ScanPlan& p) {
  Out& o = e.out;
  const Loop& l = *p.loop;
  const std::string t = kir::ctype(e.acc_dtype(p.acc));
  const std::string nt = std::to_string(p.threads);
  const std::string extent = std::to_string(l.extent);
  const Stmt& update = l.body.at(static_cast<size_t>(p.update));
  const Block pre(l.body.begin(), l.body.begin() + p.update);
  const Block post(l.body.begin() + p.update + 1, l.body.end());
  o.line(0, "extern \"C\" __global__ void __launch_bounds__(" + nt + ") " + name + "(" +
                e.params() + ") {");
  o.line(1, "__shared__ " + t + " kr_smem[32];");
  o.line(1, "const int kr_tid = threadIdx.x;");
  o.line(1, "for (" + e.ft() + " kr_p = (" + e.ft() + ")blockIdx.x; kr_p < " +
                std::to_string(e.a.points) + e.fsuf() + "; kr_p += (" + e.ft() + ")gridDim.x) {");
  e.recover(dims_of(e.a.grid), "kr_p", 2);
  o.line(2, t + " kr_carry = kr_identity<KR_SUM, " + t + ">();");
  o.line(2, "for (" + e.vt() + " kr_c = 0; kr_c < " + extent + "; kr_c += " + nt + ") {");
  o.line(3, "const " + e.vt() + " " + l.var + " = kr_c + kr_tid;");
  o.line(3, t + " kr_x = kr_identity<KR_SUM, " + t + ">();");
  o.line(3, "if (" + l.var + " < " + extent + ") {");
  e.serial(pre, 4);
  o.line(4, "kr_x = (" + t + ")(" + update.update.value + ");");
  o.line(3, "}");
  o.line(3, t + " kr_total;");
  o.line(3, "const " + t + " " + p.acc + " = kr_carry + kr_block_inclusive_scan<" + nt + ", " +
                t + ">(kr_x, kr_smem, kr_total);");
  o.line(3, "if (" + l.var + " < " + extent + ") {");
  e.serial(post, 4);
  o.line(3, "}");
  o.line(3, "kr_carry += kr_total;");
  o.line(2, "}");
  o.line(1, "}");
  o.line(0, "}");
}

} // namespace keraunos::codegen::cudagen
