// CUDA row schedules: what a row keeps in registers or shared memory, vector widths, the
// vectorized nests, the row prefetch and the reductions merged into one cluster round.
#include "keraunos/codegen/cuda_schedule.h"

#include "keraunos/ir/error.h"

namespace keraunos::codegen::cudagen {

RegisterCache plan_cache(const Emitter& e, const std::vector<LoopNest>& nests,
                         const BlockPlan& plan, const std::vector<int>& vecs) {
  const int threads = plan.row_threads();
  const bool smem = plan.smem_cache_bytes > 0;
  const int64_t max_values = smem ? INT64_MAX : plan.reg_values;
  // Canonical key of a load: the buffer, its index with the nest's variables by position, and
  // the nest's extents and vector width (same extents, width and thread count: the same element
  // per thread, trip and lane).
  std::map<std::string, std::vector<std::pair<size_t, const Stmt*>>> uses;
  for (size_t n = 0; n < nests.size(); ++n) {
    const LoopNest& nest = nests[n];
    if (values_per_thread(nest, threads, vecs[n]) > max_values) continue;
    Rename canon;
    std::string shape = "v" + std::to_string(vecs[n]) + ":";
    for (size_t j = 0; j < nest.loops.size(); ++j) {
      canon[nest.loops[j]->var] = "@" + std::to_string(j);
      shape += std::to_string(nest.loops[j]->extent) + ",";
    }
    for (const Stmt& s : *nest.body) {
      if (s.kind != Stmt::Kind::Load || !s.load.index.affine()) continue;
      const std::string key = std::to_string(s.load.buffer) + "|" +
                              index_expr(s.load.index, canon) + "|" + shape;
      uses[key].emplace_back(n, &s);
    }
  }
  RegisterCache c;
  c.smem = smem;
  c.threads = plan.threads;
  for (const auto& [key, list] : uses) {
    std::set<size_t> loops;
    for (const auto& [n, s] : list) loops.insert(n);
    if (loops.size() < 2) continue;
    const std::string arr = "kr_c" + std::to_string(c.decls.size());
    const Stmt* first = list.front().second;
    const int64_t trips =
        values_per_thread(nests[list.front().first], threads, vecs[list.front().first]);
    const std::string t = kir::ctype(first->load.dtype);
    if (smem) {
      const int64_t bytes = trips * plan.threads * itemsize(first->load.dtype);
      if (c.smem_bytes + bytes > plan.smem_cache_bytes) continue; // read it again (from L2)
      c.decls.push_back(t + "* const " + arr + " = reinterpret_cast<" + t + "*>(kr_dyn + " +
                        std::to_string(c.smem_bytes) + ");");
      c.smem_bytes += (bytes + 15) / 16 * 16;
      if (const int v = vecs[list.front().first]; v > 1) c.vec[arr] = v;
    } else {
      const size_t fn = list.front().first;
      const DType storage = e.k.buffers.at(first->load.buffer).dtype;
      if (vecs[fn] > 1 && vector_access(first->load.index, nests[fn]) &&
          (storage == DType::Float16 || storage == DType::BFloat16) &&
          storage != first->load.dtype) {
        c.raw[arr] = storage;
        c.decls.push_back("unsigned " + arr + "[" + std::to_string(trips / 2) + "];");
      } else {
        c.decls.push_back(t + " " + arr + "[" + std::to_string(trips) + "];");
      }
    }
    const size_t first_loop = list.front().first;
    bool filled = false;
    for (const auto& [n, s] : list) {
      if (n == first_loop && !filled) {
        c.first[s] = arr;
        filled = true;
      } else if (n != first_loop) {
        c.reuse[s] = arr;
      }
    }
  }
  return c;
}

// Expensive values a later loop of the row computes again (softmax's exp(x - max) in the sum
// loop and in the output loop) are kept in registers by the loop that computes them first, and
// the later loop reads them instead (register caches only: the compiler frees the cached loads
// the value was computed from once their last reader is done, so the row costs no more
// registers). Two lets compute the same value when their expressions match after replacing
// each variable of the loop by what it stands for: cached loads by their array, other loads by
// buffer and index, loop variables by position, lets by the number of their form (forms are
// interned expressions: equal forms are one node). The same values, computed once: bitwise
// unchanged. Worth it for lets of an op tagged costly (kir::Let::costly).
void plan_value_reuse(const std::vector<LoopNest>& nests, const BlockPlan& plan,
                      const std::vector<int>& vecs, RegisterCache& c) {
  if (c.smem) return;
  const int threads = plan.row_threads();
  struct Seen {
    const Stmt* let;
    size_t nest;
  };
  // Each distinct value gets a number; a let's form names its operands by their numbers, so
  // forms stay short however the lets nest (spelled out, `y * y + y` chains grow exponentially).
  std::map<std::string, int> ids;
  auto id_of = [&](const std::string& form) {
    return "%" + std::to_string(ids.emplace(form, static_cast<int>(ids.size())).first->second);
  };
  std::map<std::string, Seen> first; // shape + value number -> first let computing it
  std::vector<kir::Expr> alive;      // the forms whose nodes key `ids`
  for (size_t n = 0; n < nests.size(); ++n) {
    const LoopNest& nest = nests[n];
    if (values_per_thread(nest, threads, vecs[n]) > plan.reg_values) continue;
    std::string shape = "v" + std::to_string(vecs[n]) + ":";
    std::map<std::string, std::string> canon;
    Rename pos;
    for (size_t j = 0; j < nest.loops.size(); ++j) {
      canon[nest.loops[j]->var] = pos[nest.loops[j]->var] = "@" + std::to_string(j);
      shape += std::to_string(nest.loops[j]->extent) + ",";
    }
    for (const Stmt& s : *nest.body) {
      if (s.kind == Stmt::Kind::Load) {
        auto f = c.first.find(&s);
        auto r = c.reuse.find(&s);
        canon[s.load.var] =
            f != c.first.end()   ? id_of("#" + f->second)
            : r != c.reuse.end() ? id_of("#" + r->second)
                                 : id_of("ld" + std::to_string(s.load.buffer) + "[" +
                                         index_expr(s.load.index, pos) + "]");
        continue;
      }
      if (s.kind != Stmt::Kind::Let) continue;
      const kir::Expr form = kir::substitute(s.let.expr, [&](const kir::ExprNode& x) -> kir::Expr {
        auto it = canon.find(x.name);
        return it == canon.end() ? nullptr : kir::var(it->second, x.dtype);
      });
      alive.push_back(form);
      std::ostringstream key_of_form;
      key_of_form << kir::ctype(s.let.dtype) << ":" << static_cast<const void*>(form.get());
      const std::string v = id_of(key_of_form.str());
      canon[s.let.var] = v;
      // Worth keeping when the let itself computes a costly op (a cast of a costly value is
      // cheap to redo from the kept value).
      if (!s.let.costly()) continue;
      const std::string key = shape + v;
      auto it = first.find(key);
      if (it == first.end()) {
        first.emplace(key, Seen{&s, n});
        continue;
      }
      if (it->second.nest == n) continue;
      auto arr = c.let_first.find(it->second.let);
      std::string name;
      if (arr == c.let_first.end()) {
        name = "kr_e" + std::to_string(c.let_first.size());
        c.let_first[it->second.let] = name;
        c.decls.push_back(std::string(kir::ctype(s.let.dtype)) + " " + name + "[" +
                          std::to_string(values_per_thread(nest, threads, vecs[n])) + "];");
      } else {
        name = arr->second;
      }
      c.let_reuse[&s] = name;
    }
  }
}

// The vectorized block variant: in a Reduce/Inner nest whose innermost loop variable has
// coefficient 1 in an access, each thread handles `vec` consecutive elements per trip, read and
// written with one kr_vec access per buffer. One width for the kernel, 16 bytes over the widest
// item read or written along a loop (8 for bfloat16, 4 for float32), so that the register cache
// sees the same elements per thread in every nest. A nest runs vectorized when its innermost
// extent is a multiple of the width, every unit-stride access keeps the alignment (its other
// coefficients and its constant are multiples of the width), every store is unit-stride, and it
// holds no further loops. Other loads of a vectorized nest (broadcasts, strided, opaque) stay
// scalar, per lane. Returns the width per nest (0: scalar); all 0 when none qualifies.
std::vector<int> block_vector_plan(const Kernel& k, const std::vector<LoopNest>& nests) {
  std::vector<int> vecs(nests.size(), 0);
  int widest = 0;
  for (const LoopNest& nest : nests) {
    const std::string& v = nest.loops.back()->var;
    visit(*nest.body, [&](const Stmt& s) {
      if (s.kind == Stmt::Kind::Load && s.load.index.affine() && s.load.index.coef(v) == 1)
        widest = std::max(widest, itemsize(k.buffers.at(s.load.buffer).dtype));
      if (s.kind == Stmt::Kind::Store && s.store.index.affine() && s.store.index.coef(v) == 1)
        widest = std::max(widest, itemsize(k.buffers.at(s.store.buffer).dtype));
    });
  }
  if (widest == 0 || widest > 8) return vecs;
  const int vec = 16 / widest;
  bool any_nest = false;
  for (size_t n = 0; n < nests.size(); ++n) {
    const LoopNest& nest = nests[n];
    const std::string& v = nest.loops.back()->var;
    if (nest.loops.back()->extent % vec != 0) continue;
    bool ok = true, any = false;
    auto aligned = [&](const Index& ix) {
      if (ix.constant % vec != 0) return false;
      for (const auto& [var, coef] : ix.terms)
        if (var != v && coef % vec != 0) return false;
      return true;
    };
    for (const Stmt& s : *nest.body) {
      if (s.kind == Stmt::Kind::Loop) ok = false;
      if (s.kind == Stmt::Kind::Store) {
        const Index& ix = s.store.index;
        ok &= ix.affine() && ix.coef(v) == 1 && aligned(ix);
        any = true;
      }
      if (s.kind == Stmt::Kind::Load && s.load.index.affine() && s.load.index.coef(v) == 1) {
        ok &= aligned(s.load.index);
        any = true;
      }
    }
    if (ok && any) {
      vecs[n] = vec;
      any_nest = true;
    }
  }
  if (!any_nest) std::fill(vecs.begin(), vecs.end(), 0);
  return vecs;
}

// Collects the Reduce/Inner nests of an outer point, in order.
std::vector<LoopNest> point_nests(const Analysis& a) {
  std::vector<LoopNest> nests;
  for (const Stmt& s : *a.point)
    if (s.kind == Stmt::Kind::Loop) nests.push_back(nest_of(s.loop.get()));
  return nests;
}

// One vectorized nest of the block variant: trip kr_k of thread kr_tid handles the group
// kr_g = kr_tid + kr_k * threads of `vec` consecutive innermost elements; its unit-stride loads
// are read with kr_load_vec before the lanes run, its stores written with kr_store_vec after.
void emit_vector_nest(Emitter& e, const LoopNest& nest, const BlockPlan& plan, int vec,
                      const RegisterCache& cache,
                      const std::vector<std::string>& trip_tail) {
  const int nt = plan.row_threads();
  Out& o = e.out;
  const Kernel& k = e.k;
  const std::string v = nest.loops.back()->var;
  const std::string lanes = std::to_string(vec);
  const int64_t groups = nest.extent / vec;
  const int64_t trips = (groups + nt - 1) / nt;
  const Rename base{{v, "kr_vb"}};
  const std::string slot = "kr_k * " + lanes + " + kr_l";
  // Shared-memory arrays in the vector layout: one 16-byte read before the lanes (reuses, and
  // fills the row prefetch already copied in), or one write after them (other fills).
  std::vector<std::string> cache_before, cache_after;
  for (const Stmt& b : *nest.body) {
    if (auto it = cache.let_first.find(&b); it != cache.let_first.end())
      e.after[&b] = it->second + "[" + slot + "] = " + b.let.var + ";";
    if (auto it = cache.let_reuse.find(&b); it != cache.let_reuse.end())
      e.replace[&b] = std::string("const ") + kir::ctype(b.let.dtype) + " " + b.let.var + " = " +
                      it->second + "[" + slot + "];";
    const auto f = cache.first.find(&b);
    const auto r = cache.reuse.find(&b);
    if (f == cache.first.end() && r == cache.reuse.end()) continue;
    const std::string& arr = f != cache.first.end() ? f->second : r->second;
    const std::string t = kir::ctype(b.load.dtype);
    if (cache.vec.count(arr)) {
      const std::string vt = "kr_vec<" + t + ", " + std::to_string(cache.vec.at(arr)) + ">";
      const std::string reg = "kr_cv" + std::to_string(cache_before.size());
      if (f != cache.first.end() && !cache.async.count(arr)) {
        cache_before.push_back(vt + " " + reg + ";");
        e.after[&b] = reg + ".v[kr_l] = " + b.load.var + ";";
        cache_after.push_back("*reinterpret_cast<" + vt + "*>(" + cache.vec_ptr(arr) + ") = " +
                              reg + ";");
      } else if (auto h = cache.held_trips.find(arr); h != cache.held_trips.end()) {
        // Trips past the held ones read the buffer (the trip loop is unrolled: no branch).
        const kir::Buffer& buf = k.buffers.at(b.load.buffer);
        const std::string st = kir::ctype(buf.dtype), w = std::to_string(cache.vec.at(arr));
        cache_before.push_back(vt + " " + reg + ";");
        cache_before.push_back("if (kr_k < " + std::to_string(h->second) + ") " + reg +
                               " = *reinterpret_cast<const " + vt + "*>(" + cache.vec_ptr(arr) +
                               ");");
        cache_before.push_back("else { const kr_vec<" + st + ", " + w + "> kr_hg = kr_load_vec<" +
                               st + ", " + w + ">(" + buf.name + " + " +
                               index_expr(b.load.index, {{nest.loops.back()->var, "kr_vb"}}) +
                               "); for (int kr_l = 0; kr_l < " + w + "; ++kr_l) " + reg +
                               ".v[kr_l] = " + load_conv(buf.dtype, b.load.dtype, "kr_hg.v[kr_l]") +
                               "; }");
        e.replace[&b] = "const " + t + " " + b.load.var + " = " + reg + ".v[kr_l];";
      } else {
        cache_before.push_back("const " + vt + " " + reg + " = *reinterpret_cast<const " + vt +
                               "*>(" + cache.vec_ptr(arr) + ");");
        e.replace[&b] = "const " + t + " " + b.load.var + " = " + reg + ".v[kr_l];";
      }
    } else if (f != cache.first.end()) {
      e.after[&b] = cache.at(arr, slot) + " = " + b.load.var + ";";
    } else {
      e.replace[&b] = "const " + t + " " + b.load.var + " = " + cache.read(arr, slot, b) + ";";
    }
  }
  o.line(2, trips * vec <= 32 ? "#pragma unroll" : "#pragma unroll 4");
  o.line(2, "for (" + e.vt() + " kr_k = 0; kr_k < " + std::to_string(trips) + "; ++kr_k) {");
  o.line(3, "const " + e.ft() + " kr_g = " + plan.row_tid() + " + (" + e.ft() + ")kr_k * " +
                std::to_string(nt) + e.fsuf() + ";");
  int d = 3;
  if (groups % nt != 0) {
    o.line(3, "if (kr_g < " + std::to_string(groups) + e.fsuf() + ") {");
    d = 4;
  }
  auto dims = dims_of(nest);
  dims.back() = {"kr_vg", dims.back().second / vec};
  e.recover(dims, "kr_g", d);
  o.line(d, "const " + e.vt() + " kr_vb = kr_vg * " + lanes + ";");
  for (size_t j = 0; j + 1 < nest.loops.size(); ++j)
    o.line(d, "(void)" + nest.loops[j]->var + ";");
  for (const std::string& l : cache_before) o.line(d, l);
  std::vector<std::string> stores_after;
  int n = 0;
  for (const Stmt& b : *nest.body) {
    if (b.kind == Stmt::Kind::Load && vector_access(b.load.index, nest) &&
        !e.replace.count(&b)) {
      const kir::Buffer& buf = k.buffers.at(b.load.buffer);
      const std::string st = kir::ctype(buf.dtype);
      const std::string reg = "kr_ld" + std::to_string(n++);
      const int hint = buf.output || vec * itemsize(buf.dtype) != 16
                           ? 0
                           : plan.cache_hints & (row_invariant(e.a, b.load.index) ? 2 : 1);
      o.line(d, "const kr_vec<" + st + ", " + lanes + "> " + reg + " = kr_load_vec" +
                    (hint ? "_hint<" + std::to_string(hint) + ", " : "<") + st + ", " + lanes +
                    ">(" + buf.name + " + " + index_expr(b.load.index, base) + ");");
      e.replace[&b] = std::string("const ") + kir::ctype(b.load.dtype) + " " + b.load.var +
                      " = " + load_conv(buf.dtype, b.load.dtype, reg + ".v[kr_l]") + ";";
      if (auto f = cache.first.find(&b); f != cache.first.end() && cache.raw.count(f->second)) {
        e.after.erase(&b);
        o.line(d, cache.put_words(f->second, "kr_k * " + lanes, vec, reg));
      }
    } else if (b.kind == Stmt::Kind::Store) {
      const kir::Buffer& buf = k.buffers.at(b.store.buffer);
      const std::string reg = "kr_st" + std::to_string(n++);
      e.replace[&b] = vector_store(e, buf, b.store, reg, vec, base, d, stores_after, *nest.body,
                                   (plan.cache_hints & 4) != 0 &&
                                       vec * itemsize(buf.dtype) == 16);
    }
  }
  o.line(d, "#pragma unroll");
  o.line(d, "for (int kr_l = 0; kr_l < " + lanes + "; ++kr_l) {");
  o.line(d + 1, "const " + e.vt() + " " + v + " = kr_vb + kr_l;");
  o.line(d + 1, "(void)" + v + ";"); // unused when every read is cached or a vector
  e.serial(*nest.body, d + 1);
  o.line(d, "}");
  for (const std::string& l : cache_after) o.line(d, l);
  for (const std::string& st : stores_after) o.line(d, st);
  for (const std::string& l : trip_tail) o.line(d, l);
  if (d == 4) o.line(3, "}");
  o.line(2, "}");
  e.replace.clear();
  e.after.clear();
}

// Issues the cp.async copies of `fills` for outer point `point` (an expression; nothing when it
// is past the last point) and commits them as one group: each thread copies the groups of
// `vec` values it will read from the vector layout (RegisterCache::vec_ptr).
void emit_prefetch(Emitter& e, const BlockPlan& plan, const RegisterCache& cache,
                   const std::vector<AsyncFill>& fills, const std::string& point, int d) {
  Out& o = e.out;
  const int rt = plan.row_threads();
  o.line(d, "{");
  o.line(d + 1, "const " + e.ft() + " kr_pn = " + point + ";");
  o.line(d + 1, "if (kr_pn < " + std::to_string(e.a.points) + e.fsuf() + ") {");
  Rename next;
  auto grid = dims_of(e.a.grid);
  for (auto& [var, extent] : grid) {
    next[var] = var + "_n";
    var += "_n";
  }
  e.recover(grid, "kr_pn", d + 2);
  for (const auto& [var, extent] : grid) o.line(d + 2, "(void)" + var + ";");
  for (const AsyncFill& f : fills) {
    const int vec = cache.vec.at(f.arr);
    const kir::Buffer& buf = e.k.buffers.at(f.load->load.buffer);
    const int64_t trips = f.nest->extent / vec / rt;
    o.line(d + 2, "#pragma unroll 4");
    o.line(d + 2, "for (" + e.vt() + " kr_k = 0; kr_k < " + std::to_string(trips) + "; ++kr_k) {");
    o.line(d + 3, "const " + e.ft() + " kr_g = " + plan.row_tid() + " + (" + e.ft() + ")kr_k * " +
                      std::to_string(rt) + e.fsuf() + ";");
    auto dims = dims_of(*f.nest);
    Rename ix = next;
    for (size_t j = 0; j + 1 < dims.size(); ++j) {
      ix[dims[j].first] = dims[j].first + "_n";
      dims[j].first += "_n";
    }
    dims.back() = {"kr_vg_n", dims.back().second / vec};
    e.recover(dims, "kr_g", d + 3);
    for (size_t j = 0; j + 1 < dims.size(); ++j) o.line(d + 3, "(void)" + dims[j].first + ";");
    o.line(d + 3, "const " + e.vt() + " kr_vb_n = kr_vg_n * " + std::to_string(vec) + ";");
    ix[f.nest->loops.back()->var] = "kr_vb_n";
    o.line(d + 3, "kr_cp_async<" + std::to_string(vec * itemsize(buf.dtype)) + ">(" +
                      cache.vec_ptr(f.arr) + ", " + buf.name + " + " +
                      index_expr(f.load->load.index, ix) + ");");
    o.line(d + 2, "}");
  }
  o.line(d + 1, "}");
  o.line(d + 1, "kr_cp_async_commit();");
  o.line(d, "}");
}

std::vector<MergedPair> merged_pairs(const Emitter& e, const std::vector<LoopNest>& nests,
                                     const std::map<const Stmt*, size_t>& nest_of_stmt,
                                     const std::vector<int>& vecs, int rt, bool variance,
                                     bool softmax) {
  std::vector<MergedPair> pairs;
  const Block& point = *e.a.point;
  // The accumulators a loop updates, with their update (null: updated more than once).
  auto updates = [](const Block& b) {
    std::map<std::string, const kir::AccUpdate*> accs;
    visit(b, [&](const Stmt& s) {
      if (s.kind != Stmt::Kind::AccUpdate) return;
      auto [it, fresh] = accs.emplace(s.update.var, &s.update);
      if (!fresh) it->second = nullptr;
    });
    return accs;
  };
  // Statements of a loop body by the variable they define.
  auto defs = [](const Block& b) {
    std::map<std::string, const Stmt*> d;
    visit(b, [&](const Stmt& s) {
      if (s.kind == Stmt::Kind::Let) d[s.let.var] = &s;
      if (s.kind == Stmt::Kind::Load) d[s.load.var] = &s;
    });
    return d;
  };
  // A float value through the lets that only copy it (a cast to float32 of a float32 value is
  // never built: kir::cast returns the value).
  auto resolve = [](const std::map<std::string, const Stmt*>& d, std::string v) {
    for (auto it = d.find(v); it != d.end() && it->second->kind == Stmt::Kind::Let &&
                              it->second->let.dtype == DType::Float32 &&
                              it->second->let.expr->kind == kir::ExprKind::Var &&
                              it->second->let.expr->dtype == DType::Float32;
         it = d.find(v))
      v = it->second->let.expr->name;
    return v;
  };
  for (size_t i = 0; i < point.size(); ++i) {
    const Stmt& s = point[i];
    if (s.kind != Stmt::Kind::Loop || s.loop->kind != LoopKind::Reduce) continue;
    size_t j = i;
    std::vector<const Stmt*> lets;
    std::map<std::string, const Stmt*> between;
    while (j > 0 && (point[j - 1].kind == Stmt::Kind::Let ||
                     point[j - 1].kind == Stmt::Kind::AccInit)) {
      --j;
      if (point[j].kind == Stmt::Kind::Let) {
        lets.insert(lets.begin(), &point[j]);
        between[point[j].let.var] = &point[j];
      }
    }
    if (j == 0 || point[j - 1].kind != Stmt::Kind::Loop ||
        point[j - 1].loop->kind != LoopKind::Reduce)
      continue;
    const Stmt& first = point[j - 1];
    const auto u1 = updates(first.loop->body), u2 = updates(s.loop->body);
    if (u1.size() != 1 || u2.size() != 1 || !u1.begin()->second || !u2.begin()->second ||
        u2.begin()->second->op != kir::ReduceOp::Sum)
      continue;
    const std::string a1 = u1.begin()->first, a2 = u2.begin()->first;
    const kir::AccUpdate &up1 = *u1.begin()->second, &up2 = *u2.begin()->second;
    if (e.acc_dtype(a1) != DType::Float32 || e.acc_dtype(a2) != DType::Float32) continue;
    const size_t n1 = nest_of_stmt.at(&first), n2 = nest_of_stmt.at(&s);
    const LoopNest &na = nests[n1], &nb = nests[n2];
    // Whole nests: a loop left in a nest's body (a let hoisted between nested reduce loops)
    // runs serially in each thread, which then holds more values than extent / threads.
    auto holds_loop = [](const LoopNest& n) {
      return std::any_of(n.body->begin(), n.body->end(),
                         [](const Stmt& b) { return b.kind == Stmt::Kind::Loop; });
    };
    auto same_loops = [](const LoopNest& a, const LoopNest& b) {
      return std::equal(a.loops.begin(), a.loops.end(), b.loops.begin(), b.loops.end(),
                        [](const Loop* x, const Loop* y) { return x->extent == y->extent; });
    };
    if (!same_loops(na, nb) || vecs[n1] != vecs[n2] || holds_loop(na) || holds_loop(nb)) continue;
    // A loop is in one pair at most (the second of one pair may not open another).
    if (std::any_of(pairs.begin(), pairs.end(),
                    [&](const MergedPair& q) { return q.second_loop == &first; }))
      continue;
    MergedPair p{MergedPair::Kind::Moments, &first, &s, a1, a2, "", "", lets};
    if (variance && s.loop->deviations && s.loop->deviations->sum == a1 &&
        up1.op == kir::ReduceOp::Sum && between.count(s.loop->deviations->mean)) {
      const int64_t units = vecs[n1] > 1 ? na.extent / vecs[n1] : na.extent;
      if (units % rt != 0) continue;
      p.carrier = s.loop->deviations->mean;
      p.count = std::to_string(na.extent / rt) + ".0f";
    } else if (softmax && up1.op == kir::ReduceOp::Max) {
      // second: sum of exp(x - m), m a let between that casts a1, x the value of the first loop.
      const auto d1 = defs(first.loop->body), d2 = defs(s.loop->body);
      const auto let_of = [](const std::map<std::string, const Stmt*>& d, const std::string& v) {
        auto it = d.find(v);
        return it != d.end() && it->second->kind == Stmt::Kind::Let ? it->second : nullptr;
      };
      const Stmt* ex = let_of(d2, resolve(d2, up2.value));
      if (!ex) continue;
      const kir::Expr& call = ex->let.expr;
      if (call->kind != kir::ExprKind::Call || call->prim != OpId::prim_exp ||
          call->dtype != DType::Float32)
        continue;
      // The argument: x - m, inline or in a let.
      kir::Expr dx = call->args[0];
      if (dx->kind == kir::ExprKind::Var) {
        const Stmt* diff = let_of(d2, resolve(d2, dx->name));
        if (!diff) continue;
        dx = diff->let.expr;
      }
      if (dx->kind != kir::ExprKind::Sub || dx->args[0]->kind != kir::ExprKind::Var ||
          dx->args[1]->kind != kir::ExprKind::Var)
        continue;
      const std::string x = dx->args[0]->name, m = dx->args[1]->name;
      if (m != a1 && resolve(between, m) != a1) continue;
      // x and the first loop's value: one load of the same element, through casts.
      auto load_of = [&](const std::map<std::string, const Stmt*>& d, const std::string& v,
                         const LoopNest& nest) -> std::string {
        auto it = d.find(v);
        if (it == d.end() || it->second->kind != Stmt::Kind::Load ||
            !it->second->load.index.affine())
          return "";
        Rename canon;
        for (size_t k = 0; k < nest.loops.size(); ++k)
          canon[nest.loops[k]->var] = "@" + std::to_string(k);
        return std::to_string(it->second->load.buffer) + "|" +
               index_expr(it->second->load.index, canon);
      };
      const std::string l1 = load_of(d1, resolve(d1, up1.value), na);
      if (l1.empty() || l1 != load_of(d2, resolve(d2, x), nb)) continue;
      p.kind = MergedPair::Kind::ExpSum;
      p.carrier = m;
    } else {
      continue;
    }
    // The second loop reads no let between the loops but the carrier, and its accumulator is
    // all it leaves (a store would write values computed on the thread's own first result).
    bool reads_between = false;
    auto check = [&](const kir::Expr& expr) {
      if (!expr) return;
      kir::for_each_var(expr, [&](const std::string& id) {
        reads_between |= id != p.carrier && between.count(id) > 0;
      });
    };
    visit(s.loop->body, [&](const Stmt& b) {
      if (b.kind == Stmt::Kind::Let) check(b.let.expr);
      if (b.kind == Stmt::Kind::Load) check(b.load.index.opaque);
      reads_between |= b.kind == Stmt::Kind::Store;
    });
    if (!reads_between) pairs.push_back(p);
  }
  return pairs;
}


} // namespace keraunos::codegen::cudagen
