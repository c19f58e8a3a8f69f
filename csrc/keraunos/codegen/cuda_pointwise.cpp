// CUDA schedules of pointwise kernels: grid-stride loops, scalar and vectorized.
#include "keraunos/codegen/cuda_schedule.h"

#include "keraunos/ir/error.h"

#include <map>
#include <optional>

namespace keraunos::codegen::cudagen {

// ---------------------------------------------------------------------------------------------
// Pointwise (and one-thread-per-outer-point) kernels.

CudaLaunch grid_stride_launch(int64_t work) {
  CudaLaunch l;
  // Small spaces get whole warps (one thread for a single point, e.g. a 0-d kernel).
  const int64_t threads = work >= kPointwiseThreads ? kPointwiseThreads
                          : work <= 1               ? 1
                                                    : (work + 31) / 32 * 32;
  l.block[0] = static_cast<unsigned>(threads);
  l.grid[0] = clamp_grid((work + threads - 1) / threads); // loops only past 2^31 blocks

  l.work = static_cast<uint64_t>(work);
  return l;
}

void emit_grid_stride(Emitter& e, const std::string& name, int threads) {
  Out& o = e.out;
  const std::string t = std::to_string(threads) + e.fsuf();
  o.line(0, "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads) + ") " +
                name + "(" + e.params() + ") {");
  o.line(1, "const " + e.ft() + " kr_stride = (" + e.ft() + ")gridDim.x * " + t + ";");
  o.line(1, "for (" + e.ft() + " kr_i = (" + e.ft() + ")blockIdx.x * " + t +
                " + threadIdx.x; kr_i < " + std::to_string(e.a.points) + e.fsuf() +
                "; kr_i += kr_stride) {");
  e.recover(dims_of(e.a.grid), "kr_i", 2);
  e.serial(*e.a.point, 2);
  o.line(1, "}");
  o.line(0, "}");
}

bool column_schedulable(const Analysis& a) {
  for (const Stmt& s : *a.point) {
    if (s.kind != Stmt::Kind::Loop) continue;
    const LoopNest nest = nest_of(s.loop.get());
    if (nest.kind != LoopKind::Reduce) return false;
    bool plain = true; // no loops, stores or accumulators of its own inside the nest
    visit(*nest.body, [&](const Stmt& b) {
      plain = plain && b.kind != Stmt::Kind::Loop && b.kind != Stmt::Kind::Store &&
              b.kind != Stmt::Kind::AccInit;
    });
    if (!plain) return false;
  }
  return true;
}

void emit_column_kernel(Emitter& e, const std::string& name, int ny, int cl) {
  Out& o = e.out;
  const std::string points = std::to_string(e.a.points) + e.fsuf();
  const std::string cluster_attr = cl > 1 ? "__cluster_dims__(1, " + std::to_string(cl) + ", 1) " : "";
  o.line(0, "extern \"C\" __global__ void " + cluster_attr + "__launch_bounds__(" +
                std::to_string(32 * ny) + ") " + name + "(" + e.params() + ") {");
  // One 8-byte slot per thread holds any accumulator type.
  o.line(1, "__shared__ long long kr_col[" + std::to_string(32 * ny) + "];");
  if (cl > 1) {
    // The cluster's blocks (blockIdx.y) take every cl-th share of ny rows of the same columns.
    o.line(1, "__shared__ long long kr_ccol[64];");
    o.line(1, "int kr_phase = 0;");
  }
  // Every thread of the block walks the same tiles of points (the barriers need them all).
  o.line(1, "for (" + e.ft() + " kr_p0 = (" + e.ft() + ")blockIdx.x * 32" + e.fsuf() + "; kr_p0 < " +
                points + "; kr_p0 += (" + e.ft() + ")gridDim.x * 32" + e.fsuf() + ") {");
  o.line(2, "const bool kr_in = kr_p0 + threadIdx.x < " + points + ";");
  // Threads past the last point repeat it (their reads stay in bounds; they store nothing).
  o.line(2, "const " + e.ft() + " kr_p = kr_in ? kr_p0 + threadIdx.x : " + points + " - 1" +
                e.fsuf() + ";");
  e.recover(dims_of(e.a.grid), "kr_p", 2);
  const std::string first_row = cl > 1 ? "blockIdx.y * " + std::to_string(ny) + " + threadIdx.y" : "threadIdx.y";
  for (const Stmt& s : *e.a.point) {
    if (s.kind == Stmt::Kind::Store) {
      o.line(2, "if (kr_in && threadIdx.y == 0" + std::string(cl > 1 ? " && blockIdx.y == 0" : "") +
                    ") " + e.store_line(s.store));
      continue;
    }
    if (s.kind != Stmt::Kind::Loop) {
      e.stmt(s, 2);
      continue;
    }
    const LoopNest nest = nest_of(s.loop.get());
    o.line(2, "for (" + e.vt() + " kr_r = " + first_row + "; kr_r < " + std::to_string(nest.extent) +
                  "; kr_r += " + std::to_string(ny * cl) + ") {");
    e.recover(dims_of(nest), "kr_r", 3);
    e.serial(*nest.body, 3);
    o.line(2, "}");
    std::vector<std::pair<std::string, kir::ReduceOp>> updated;
    visit(*nest.body, [&](const Stmt& b) {
      if (b.kind != Stmt::Kind::AccUpdate) return;
      for (const auto& u : updated)
        if (u.first == b.update.var) return;
      updated.emplace_back(b.update.var, b.update.op);
    });
    for (const auto& [acc, op] : updated) {
      const std::string t = kir::ctype(e.acc_dtype(acc));
      o.line(2, acc + " = kr_column_allreduce<" + op_macro(op) + ", " + std::to_string(ny) + ", " +
                    t + ">(" + acc + ", reinterpret_cast<" + t + "*>(kr_col));");
      if (cl > 1)
        o.line(2, acc + " = kr_cluster_column_allreduce<" + op_macro(op) + ", " + std::to_string(cl) +
                      ", " + t + ">(" + acc + ", kr_ccol, kr_phase);");
    }
  }
  o.line(1, "}");
  if (cl > 1) o.line(1, "kr_cluster_sync();");
  o.line(0, "}");
}

namespace {

// coefficients and constant of an affine integer expression (nullopt if it is not one).
struct Affine {
  std::map<std::string, int64_t> coef;
  int64_t constant = 0;
};
std::optional<Affine> affine_form(const kir::Expr& e) {
  using K = kir::ExprKind;
  switch (e->kind) {
  case K::Var: {
    Affine f;
    f.coef[e->name] = 1;
    return f;
  }
  case K::Int: {
    Affine f;
    f.constant = e->i;
    return f;
  }
  case K::Cast:
    return is_int(e->dtype) ? affine_form(e->args[0]) : std::nullopt;
  case K::Neg:
  case K::Add:
  case K::Sub:
  case K::Mul: {
    std::vector<Affine> a;
    for (const kir::Expr& x : e->args) {
      auto f = affine_form(x);
      if (!f) return std::nullopt;
      a.push_back(*f);
    }
    if (e->kind == K::Mul) { // by a literal
      const bool lit0 = a[0].coef.empty(), lit1 = a[1].coef.empty();
      if (!lit0 && !lit1) return std::nullopt;
      Affine f = lit0 ? a[1] : a[0];
      const int64_t m = lit0 ? a[0].constant : a[1].constant;
      for (auto& [v, c] : f.coef) c *= m;
      f.constant *= m;
      return f;
    }
    const int64_t sign = e->kind == K::Add ? 1 : -1;
    if (e->kind == K::Neg) a.insert(a.begin(), Affine{});
    Affine f = a[0];
    for (const auto& [v, c] : a[1].coef) f.coef[v] += sign * c;
    f.constant += sign * a[1].constant;
    return f;
  }
  case K::Float:
  case K::Bool:
  case K::Not:
  case K::BitNot:
  case K::Div:
  case K::Mod:
  case K::Eq:
  case K::Ne:
  case K::Lt:
  case K::Le:
  case K::Gt:
  case K::Ge:
  case K::BitAnd:
  case K::BitOr:
  case K::BitXor:
  case K::And:
  case K::Or:
  case K::Select:
  case K::Clamp:
  case K::Call:
    break;
  }
  return std::nullopt;
}

int64_t mod_of(int64_t x, int64_t m) { return ((x % m) + m) % m; }

// Whether integer expression `e` is a multiple of m for every value of its variables: a literal
// that is, a product with such a factor, a sum or difference of such.
bool multiple_of(const kir::Expr& e, int64_t m) {
  using K = kir::ExprKind;
  switch (e->kind) {
  case K::Int:
    return mod_of(e->i, m) == 0;
  case K::Mul:
    return multiple_of(e->args[0], m) || multiple_of(e->args[1], m);
  case K::Add:
  case K::Sub:
    return multiple_of(e->args[0], m) && multiple_of(e->args[1], m);
  case K::Neg:
    return multiple_of(e->args[0], m);
  default:
    return false;
  }
}

// An index whose opaque part uses only the outer grid loops (a merged dim's quotient:
// repeat_kv's head / rep), not the innermost one `v` nor a loaded value (a gathered index): the
// same for every lane of a group, so lanes stay affine in v. With `vec` > 0, also whether it is
// a multiple of vec (the group's base stays aligned).
bool outer_opaque(const Index& ix, const Analysis& a, int vec) {
  if (!ix.opaque) return false;
  const std::string& v = a.grid.loops.back()->var;
  bool outer = true;
  kir::for_each_var(ix.opaque, [&](const std::string& name) {
    bool found = false;
    for (const Loop* l : a.grid.loops) found = found || (l->var == name && name != v);
    outer = outer && found;
  });
  return outer && (vec <= 0 || multiple_of(ix.opaque, vec));
}

} // namespace

// A cat's part read along the innermost grid loop `v`: an index whose opaque part is
// Clamp(v + rest, lo, hi), no other use of v. With `vec` > 0, also whether groups of `vec`
// lanes read it aligned and all inside or all outside [lo, hi], so that a group reads `vec`
// consecutive elements at its clamped base (ClampedRun::base).
std::optional<ClampedRun> clamped_run(const Index& ix, const std::string& v, int vec) {
  if (!ix.opaque || ix.opaque->kind != kir::ExprKind::Clamp || ix.coef(v) != 0) return std::nullopt;
  const kir::Expr& e = ix.opaque->args[0];
  const int64_t lo = ix.opaque->args[1]->i, hi = ix.opaque->args[2]->i;
  auto f = affine_form(e);
  if (!f || f->coef.count(v) == 0 || f->coef.at(v) != 1) return std::nullopt;
  if (vec > 0) {
    if (hi - lo + 1 < vec || mod_of(ix.constant, vec) != 0 || mod_of(lo - f->constant, vec) != 0 ||
        mod_of(hi + 1 - f->constant, vec) != 0)
      return std::nullopt;
    for (const auto& [var, c] : f->coef)
      if (var != v && mod_of(c, vec) != 0) return std::nullopt;
    for (const auto& [var, c] : ix.terms)
      if (mod_of(c, vec) != 0) return std::nullopt;
  }
  return ClampedRun{e, lo, hi};
}

// The vectorized pointwise variant: each thread and trip handles `vec` consecutive elements of
// the innermost grid loop. Returns 0 when the kernel does not qualify.
int vector_width(const Kernel& k, const Analysis& a) {
  if (a.grid.loops.empty() || a.nested) return 0;
  const std::string& v = a.grid.loops.back()->var;
  const int64_t extent = a.grid.loops.back()->extent;
  int widest = 0;
  for (const Stmt& s : *a.point) {
    if (s.kind != Stmt::Kind::Load && s.kind != Stmt::Kind::Store) continue;
    const Index& ix = s.kind == Stmt::Kind::Load ? s.load.index : s.store.index;
    const int buf = s.kind == Stmt::Kind::Load ? s.load.buffer : s.store.buffer;
    const int64_t c = ix.coef(v);
    const bool run = s.kind == Stmt::Kind::Load && clamped_run(ix, v, 0);
    if ((!ix.affine() && !run && !outer_opaque(ix, a, 0)) || (c != 0 && c != 1)) return 0;
    if (s.kind == Stmt::Kind::Store && c != 1) return 0;
    if (c == 1 || run) widest = std::max(widest, itemsize(k.buffers.at(buf).dtype));
  }
  if (widest == 0 || widest > 8) return 0;
  const int vec = 16 / widest;
  if (extent % vec != 0) return 0;
  for (const Stmt& s : *a.point) {
    if (s.kind != Stmt::Kind::Load && s.kind != Stmt::Kind::Store) continue;
    const Index& ix = s.kind == Stmt::Kind::Load ? s.load.index : s.store.index;
    // (An outer opaque part of a load read once per group needs no alignment.)
    if (!ix.affine() && !clamped_run(ix, v, vec) && !outer_opaque(ix, a, ix.coef(v) == 0 ? 0 : vec))
      return 0;
    if (ix.coef(v) != 1) continue;
    if (ix.constant % vec != 0) return 0;
    for (const auto& [var, coef] : ix.terms)
      if (var != v && coef % vec != 0) return 0;
  }
  return vec;
}

void emit_vectorized(Emitter& e, const std::string& name, int vec, int threads) {
  Out& o = e.out;
  const Kernel& k = e.k;
  const Analysis& a = e.a;
  const std::string v = a.grid.loops.back()->var;
  const Rename base{{v, "kr_vb"}};
  const std::string t = std::to_string(threads) + e.fsuf();
  auto dims = dims_of(a.grid);
  dims.back() = {"kr_vg", dims.back().second / vec};
  o.line(0, "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads) + ") " +
                name + "(" + e.params() + ") {");
  o.line(1, "const " + e.ft() + " kr_stride = (" + e.ft() + ")gridDim.x * " + t + ";");
  o.line(1, "for (" + e.ft() + " kr_i = (" + e.ft() + ")blockIdx.x * " + t +
                " + threadIdx.x; kr_i < " + std::to_string(a.points / vec) + e.fsuf() +
                "; kr_i += kr_stride) {");
  e.recover(dims, "kr_i", 2);
  o.line(2, "const " + e.vt() + " kr_vb = kr_vg * " + std::to_string(vec) + ";");
  const std::string lanes = std::to_string(vec);
  std::vector<std::string> stores_after;
  e.replace.clear();
  int n = 0;
  for (const Stmt& s : *a.point) {
    if (s.kind == Stmt::Kind::Load) {
      const kir::Buffer& b = k.buffers.at(s.load.buffer);
      Index at = s.load.index;
      if (auto run = clamped_run(at, v, vec)) {
        // A cat's part: the group's `vec` elements at its base clamped to [lo, hi - vec + 1]
        // (exact where the group lies in the part; elsewhere not used: kir::ExprKind::Clamp).
        at.opaque = kir::clamp_index(run->e, run->lo, run->hi - vec + 1);
      } else if (at.coef(v) == 0) { // the same element for every lane: load it once
        o.line(2, e.load_line(s.load));
        e.replace[&s] = "";
        continue;
      }
      const std::string st = kir::ctype(b.dtype);
      const std::string reg = "kr_ld" + std::to_string(n++);
      o.line(2, "const kr_vec<" + st + ", " + lanes + "> " + reg + " = kr_load_vec<" + st +
                    ", " + lanes + ">(" + b.name + " + " + index_expr(at, base) + ");");
      e.replace[&s] = std::string("const ") + kir::ctype(s.load.dtype) + " " + s.load.var +
                      " = " + load_conv(b.dtype, s.load.dtype, reg + ".v[kr_l]") + ";";
    } else if (s.kind == Stmt::Kind::Store) {
      const kir::Buffer& b = k.buffers.at(s.store.buffer);
      const std::string reg = "kr_st" + std::to_string(n++);
      e.replace[&s] =
          vector_store(e, b, s.store, reg, std::stoi(lanes), base, 2, stores_after, *a.point);
    }
  }
  o.line(2, "#pragma unroll");
  o.line(2, "for (int kr_l = 0; kr_l < " + lanes + "; ++kr_l) {");
  o.line(3, "const " + e.vt() + " " + v + " = kr_vb + kr_l;");
  e.serial(*a.point, 3);
  o.line(2, "}");
  for (const std::string& s : stores_after) o.line(2, s);
  e.replace.clear();
  o.line(1, "}");
  o.line(0, "}");
}


} // namespace keraunos::codegen::cudagen
