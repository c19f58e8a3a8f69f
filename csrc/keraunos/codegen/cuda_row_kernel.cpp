// CUDA row schedules: the kernel of one block, one warp or one cluster per outer point.
#include "keraunos/codegen/cuda_schedule.h"

#include "keraunos/ir/error.h"

namespace keraunos::codegen::cudagen {

// `vecs` empty: the scalar variant; otherwise the width per nest (block_vector_plan).
// `smem_bytes`: the dynamic shared memory the kernel needs at launch.
void emit_block_kernel(Emitter& e, const std::string& name, const BlockPlan& plan,
                       int64_t& smem_bytes, const std::vector<int>& vecs_in) {
  Out& o = e.out;
  const Analysis& a = e.a;
  const int nt = plan.threads;       // per block
  const int rt = plan.row_threads(); // per outer point
  const int ppb = plan.points_per_block;
  const int cl = plan.cluster;

  std::vector<LoopNest> nests;
  std::map<const Stmt*, size_t> nest_of_stmt;
  std::set<std::string> point_accs;
  bool reduces = false;
  for (const Stmt& s : *a.point) {
    if (s.kind == Stmt::Kind::Loop) {
      nest_of_stmt[&s] = nests.size();
      nests.push_back(nest_of(s.loop.get()));
      reduces |= s.loop->kind == LoopKind::Reduce;
    }
    if (s.kind == Stmt::Kind::AccInit) point_accs.insert(s.acc.var);
  }
  const std::vector<int> vecs = vecs_in.empty() ? std::vector<int>(nests.size(), 0) : vecs_in;
  KR_INTERNAL(vecs.size() == nests.size(), "CUDA emitter: vector plan of another kernel");
  RegisterCache cache = plan_cache(e, nests, plan, vecs);
  // (Not in clusters: their rows hold 32 values per thread under a 64-register cap, the reused
  // values would double that, and the next row's prefetch takes those registers; on an H200
  // the reuse gained nothing there.)
  if (plan.reuse_values && cl == 1) plan_value_reuse(nests, plan, vecs, cache);
  // Operands every row reads at the same place (layer_norm's weight and bias), in persistent
  // clusters whose rows live in registers: a cluster's blocks always take the same columns, so
  // each thread copies its part into shared memory once, before the first row, and every row
  // reads it there (16-byte vector layout) instead of from L2. On rows of 256k floats the weight
  // alone is 1 MB per row of L2 reads, as much as the row itself.
  struct Hoist {
    const Stmt* load;
    const LoopNest* nest;
    std::string arr;
    int vec;
    int64_t offset;
    int64_t trips; // the first trips, all of them when the operand fits
  };
  std::vector<Hoist> hoists;
  if (cl > 1 && plan.hoist_smem_bytes > 0 && !vecs_in.empty() && e.k.noalias && !cache.smem) {
    std::map<std::string, std::string> by_key;
    int64_t used = 0;
    for (size_t n = 0; n < nests.size(); ++n) {
      const int vec = vecs[n];
      const LoopNest& nest = nests[n];
      if (vec <= 1 || nest.loops.size() != 1 || (nest.extent / vec) % rt != 0) continue;
      for (const Stmt& b : *nest.body) {
        if (b.kind != Stmt::Kind::Load || cache.first.count(&b) || cache.reuse.count(&b) ||
            !vector_access(b.load.index, nest) || vec * itemsize(b.load.dtype) != 16)
          continue;
        if (!row_invariant(a, b.load.index)) continue;
        const std::string key = std::to_string(b.load.buffer) + "|" +
                                index_expr(b.load.index, {{nest.loops.back()->var, "@"}}) + "|" +
                                std::to_string(nest.extent) + "|" + std::to_string(vec);
        auto it = by_key.find(key);
        if (it == by_key.end()) {
          // The trips that fit (the last operand may fit only in part).
          const int64_t all = nest.extent / vec / rt, trip_bytes = int64_t{nt} * 16;
          const int64_t trips = std::min(all, (plan.hoist_smem_bytes - used) / trip_bytes);
          if (trips <= 0) continue;
          const std::string arr = "kr_h" + std::to_string(hoists.size());
          hoists.push_back({&b, &nest, arr, vec, cache.smem_bytes + used, trips});
          used += trips * trip_bytes;
          if (trips < all) cache.held_trips[arr] = trips;
          it = by_key.emplace(key, arr).first;
        }
        cache.reuse[&b] = it->second;
        cache.vec[it->second] = vec;
      }
    }
    cache.smem_bytes += used;
  }
  smem_bytes = cache.smem_bytes;
  // Row prefetch: shared-memory arrays of the vectorized variant whose fill copies the buffer's
  // bytes (storage dtype = compute dtype) in 4/8/16-byte groups, in nests without a tail, in a
  // kernel whose outputs alias no input (the next row's copies must not see this row's stores).
  std::vector<AsyncFill> fills;                  // in fill-nest order
  std::map<size_t, std::vector<AsyncFill>> refill; // last nest reading an array -> its fills
  std::set<size_t> waits;                        // nests that read an async fill first
  if (plan.prefetch && cache.smem && !vecs_in.empty() && e.k.noalias) {
    for (size_t n = 0; n < nests.size(); ++n) {
      const int vec = vecs[n];
      for (const Stmt& b : *nests[n].body) {
        auto f = cache.first.find(&b);
        if (f == cache.first.end() || !cache.vec.count(f->second)) continue;
        const kir::Buffer& buf = e.k.buffers.at(b.load.buffer);
        const int64_t bytes = int64_t{vec} * itemsize(buf.dtype);
        if (vec <= 1 || !vector_access(b.load.index, nests[n]) || buf.dtype != b.load.dtype ||
            (nests[n].extent / vec) % rt != 0 || (bytes != 4 && bytes != 8 && bytes != 16))
          continue;
        size_t last = n;
        for (size_t m = 0; m < nests.size(); ++m)
          for (const Stmt& u : *nests[m].body)
            if (auto r = cache.reuse.find(&u); r != cache.reuse.end() && r->second == f->second)
              last = std::max(last, m);
        cache.async.insert(f->second);
        fills.push_back({&b, &nests[n], f->second});
        refill[last].push_back(fills.back());
        waits.insert(n);
      }
    }
  }
  // The same for rows cached in registers (cluster schedule): the row's last loop, after its
  // trip k, loads trip k of the next row into the registers of trip k (by then the current
  // row's values there are dead: the last loop reads them for the last time), and the fill loop
  // reads the registers. Single-loop nests of one shape, and only rows that one loop reads
  // between the fill and the last loop's read: on an H200 this took rms_norm on rows of 256k
  // from 93% to 95% of a device copy, but softmax and layer_norm (a second reduction loop
  // reads the row too) from 83% to 59-66%.
  std::vector<AsyncFill> reg_fills;
  std::set<const Stmt*> reg_filled;
  const size_t last_nest = nests.empty() ? 0 : nests.size() - 1;
  if (plan.prefetch && (cl > 1 || plan.persist) && ppb == 1 && !cache.smem && !vecs_in.empty() &&
      e.k.noalias && !nests.empty()) {
    const LoopNest& last = nests[last_nest];
    for (size_t n = 0; n < nests.size(); ++n) {
      const int vec = vecs[n];
      for (const Stmt& b : *nests[n].body) {
        auto f = cache.first.find(&b);
        if (f == cache.first.end() || vec <= 1 || vecs[last_nest] != vec) continue;
        if (nests[n].loops.size() != 1 || last.loops.size() != 1 ||
            nests[n].extent != last.extent || (nests[n].extent / vec) % rt != 0 ||
            !vector_access(b.load.index, nests[n]))
          continue;
        std::set<size_t> readers;
        for (size_t m = 0; m < nests.size(); ++m)
          for (const Stmt& u : *nests[m].body)
            if (auto r = cache.reuse.find(&u); r != cache.reuse.end() && r->second == f->second)
              readers.insert(m);
        if (readers != std::set<size_t>{last_nest}) continue;
        reg_fills.push_back({&b, &nests[n], f->second});
        reg_filled.insert(&b);
      }
    }
  }
  // Trip k of the next row's registers for `reg_fills` (the point's vars renamed _n; in a nest
  // of the same shape, kr_vb is the same group).
  auto reg_prefetch = [&](const std::string& guard) {
    std::vector<std::string> lines;
    if (reg_fills.empty()) return lines;
    lines.push_back("if (" + guard + ") {");
    for (size_t i = 0; i < reg_fills.size(); ++i) {
      const AsyncFill& f = reg_fills[i];
      const kir::Buffer& buf = e.k.buffers.at(f.load->load.buffer);
      const int vec = vecs[static_cast<size_t>(f.nest - &nests[0])];
      Rename ix;
      for (const auto& [var, extent] : dims_of(e.a.grid)) ix[var] = var + "_n";
      ix[f.nest->loops.back()->var] = "kr_vb";
      const std::string st = kir::ctype(buf.dtype);
      const std::string reg = "kr_pf" + std::to_string(i);
      lines.push_back("  const kr_vec<" + st + ", " + std::to_string(vec) + "> " + reg +
                      " = kr_load_vec<" + st + ", " + std::to_string(vec) + ">(" + buf.name +
                      " + " + index_expr(f.load->load.index, ix) + ");");
      if (cache.raw.count(f.arr)) {
        lines.push_back("  " + cache.put_words(f.arr, "kr_k * " + std::to_string(vec), vec, reg));
        continue;
      }
      lines.push_back("  #pragma unroll");
      lines.push_back("  for (int kr_l = 0; kr_l < " + std::to_string(vec) + "; ++kr_l) " +
                      cache.at(f.arr, "kr_k * " + std::to_string(vec) + " + kr_l") + " = " +
                      load_conv(buf.dtype, f.load->load.dtype, reg + ".v[kr_l]") + ";");
    }
    lines.push_back("}");
    return lines;
  };
  KR_INTERNAL(cl == 1 || ppb == 1, "CUDA emitter: a cluster handles one outer point at a time");

  const std::string cluster_attr =
      cl > 1 ? "__cluster_dims__(" + std::to_string(cl) + ", 1, 1) " : "";
  // Cluster kernels: at most 64 registers per thread (1024 / nt blocks per SM), so that two
  // blocks of 512 threads share an SM; left alone, the compiler hoists the loads of a row's
  // broadcast operands (layer_norm's weight and bias) into registers and one block fills the SM.
  // (The scalar entry, for misaligned pointers, needs more registers for its addresses.)
  // (Blocks of the plain block schedule: plan.min_blocks, a tuning experiment.)
  int blocks_per_sm = 0;
  if (!vecs_in.empty()) blocks_per_sm = cl > 1 ? (nt < 1024 ? 1024 / nt : 0) : plan.min_blocks;
  const std::string min_blocks = blocks_per_sm > 0 ? ", " + std::to_string(blocks_per_sm) : "";
  o.line(0, "extern \"C\" __global__ void " + cluster_attr + "__launch_bounds__(" +
                std::to_string(nt * ppb) + min_blocks + ") " + name + "(" + e.params() + ") {");
  const bool async_reduce = cl > 1 && plan.async_reduce;
  if (reduces && nt > 32 && !async_reduce) o.line(1, "__shared__ long long kr_smem[32];");
  if (cache.smem || !hoists.empty())
    o.line(1, "extern __shared__ __align__(16) unsigned char kr_dyn[];");
  o.line(1, "const int kr_tid = threadIdx.x;");
  if (cl > 1) {
    // The cluster's blocks walk the same outer points; block `kr_rank` takes the row's threads
    // kr_rank * nt .. kr_rank * nt + nt - 1. Two reduction slots alternate (kr_cluster_allreduce).
    o.line(1, "const unsigned kr_rank = kr_cluster_rank();");
    o.line(1, "const int kr_rt = (int)kr_rank * " + std::to_string(nt) + " + kr_tid;");
    if (reduces && async_reduce) {
      o.line(1, "__shared__ long long kr_cr[" + std::to_string(2 * (nt / 32) * cl) + "];");
      o.line(1, "__shared__ unsigned long long kr_cbar[2];");
      o.line(1, "unsigned kr_round = 0;");
      o.line(1, "kr_cluster_reduce_init(kr_cbar);");
    } else if (reduces) {
      o.line(1, "__shared__ long long kr_cs[2];");
      o.line(1, "int kr_ph = 0;");
    }
  }
  const std::string first_point =
      cl > 1     ? "(" + e.ft() + ")blockIdx.x / " + std::to_string(cl) + e.fsuf()
      : ppb == 1 ? "(" + e.ft() + ")blockIdx.x"
                 : "(" + e.ft() + ")blockIdx.x * " + std::to_string(ppb) + e.fsuf() +
                       " + threadIdx.y";
  const std::string point_step =
      cl > 1     ? "(" + e.ft() + ")gridDim.x / " + std::to_string(cl) + e.fsuf()
      : ppb == 1 ? "(" + e.ft() + ")gridDim.x"
                 : "(" + e.ft() + ")gridDim.x * " + std::to_string(ppb) + e.fsuf();
  // Opens `for (kr_k ...) {` over this thread's `trips` groups of `vec` elements at depth d, with
  // kr_g (the group) and kr_vb (its first element) as the row's vector nests define them.
  auto open_trips = [&](int d, int64_t trips, int vec) {
    o.line(d, "#pragma unroll");
    o.line(d, "for (" + e.vt() + " kr_k = 0; kr_k < " + std::to_string(trips) + "; ++kr_k) {");
    o.line(d + 1, "const " + e.ft() + " kr_g = " + plan.row_tid() + " + (" + e.ft() +
                      ")kr_k * " + std::to_string(rt) + e.fsuf() + ";");
    o.line(d + 1, "const " + e.vt() + " kr_vb = (" + e.vt() + ")kr_g * " + std::to_string(vec) +
                      ";");
  };
  const bool decls_outside = cache.smem || !reg_fills.empty();
  if (decls_outside)
    for (const std::string& d : cache.decls) o.line(1, d);
  for (const Hoist& h : hoists) {
    // This thread's part of the operand, as the rows' trips read it.
    const kir::Buffer& buf = e.k.buffers.at(h.load->load.buffer);
    const std::string st = kir::ctype(buf.dtype), ct = kir::ctype(h.load->load.dtype);
    const std::string lanes = std::to_string(h.vec);
    o.line(1, ct + "* const " + h.arr + " = reinterpret_cast<" + ct + "*>(kr_dyn + " +
                  std::to_string(h.offset) + ");");
    open_trips(1, h.trips, h.vec);
    o.line(2, "const kr_vec<" + st + ", " + lanes + "> kr_hl = kr_load_vec<" + st + ", " + lanes +
                  ">(" + buf.name + " + " +
                  index_expr(h.load->load.index, {{h.nest->loops.back()->var, "kr_vb"}}) + ");");
    o.line(2, "kr_vec<" + ct + ", " + lanes + "> kr_hv;");
    o.line(2, "#pragma unroll");
    o.line(2, "for (int kr_l = 0; kr_l < " + lanes + "; ++kr_l) kr_hv.v[kr_l] = " +
                  load_conv(buf.dtype, h.load->load.dtype, "kr_hl.v[kr_l]") + ";");
    o.line(2, "*reinterpret_cast<kr_vec<" + ct + ", " + lanes + ">*>(" + cache.vec_ptr(h.arr) +
                  ") = kr_hv;");
    o.line(1, "}");
  }
  if (!fills.empty()) emit_prefetch(e, plan, cache, fills, first_point, 1);
  // The next row's point variables (var_n) from its index kr_pn.
  auto recover_next = [&](int d) {
    auto grid = dims_of(a.grid);
    for (auto& [var, extent] : grid) var += "_n";
    e.recover(grid, "kr_pn", d);
    for (const auto& [var, extent] : grid) o.line(d, "(void)" + var + ";");
  };
  if (!reg_fills.empty()) {
    // The first row's registers.
    o.line(1, "{");
    o.line(2, "const " + e.ft() + " kr_pn = " + first_point + ";");
    recover_next(2);
    const int vec = vecs[static_cast<size_t>(reg_fills.front().nest - &nests[0])];
    open_trips(2, reg_fills.front().nest->extent / vec / rt, vec);
    for (const std::string& l : reg_prefetch("kr_pn < " + std::to_string(a.points) + e.fsuf()))
      o.line(3, l);
    o.line(2, "}");
    o.line(1, "}");
  }
  o.line(1, "for (" + e.ft() + " kr_p = " + first_point + "; kr_p < " +
                std::to_string(a.points) + e.fsuf() + "; kr_p += " + point_step + ") {");
  e.recover(dims_of(a.grid), "kr_p", 2);
  if (!decls_outside)
    for (const std::string& d : cache.decls) o.line(2, d);

  const std::vector<MergedPair> pairs =
      async_reduce ? merged_pairs(e, nests, nest_of_stmt, vecs, rt, plan.merge_variance,
                                  plan.merge_softmax)
                   : std::vector<MergedPair>{};
  std::set<const Stmt*> deferred; // lets that wait for a pair's all-reduce
  for (const MergedPair& p : pairs) deferred.insert(p.between.begin(), p.between.end());
  for (const Stmt& s : *a.point) {
    if (s.kind == Stmt::Kind::Store) {
      o.line(2, std::string(cl > 1 ? "if (kr_tid == 0 && kr_rank == 0) " : "if (kr_tid == 0) ") +
                    e.store_line(s.store));
      continue;
    }
    if (s.kind != Stmt::Kind::Loop) {
      if (!deferred.count(&s)) e.stmt(s, 2);
      continue;
    }
    const MergedPair* first_of = nullptr;
    const MergedPair* second_of = nullptr;
    for (const MergedPair& p : pairs) {
      if (p.first_loop == &s) first_of = &p;
      if (p.second_loop == &s) second_of = &p;
    }
    if (second_of) {
      // The second loop over this thread's values, on its own first result: the squared
      // deviations from its own mean, or exp(x - its own max).
      o.line(2, "{");
      if (second_of->kind == MergedPair::Kind::Moments) {
        o.line(2, "const float " + second_of->carrier + " = " + second_of->first + " / " +
                      second_of->count + ";");
      } else {
        // A thread whose values are all -inf (a masked row part) sums exp(x - 0) = 0, not
        // exp(-inf + inf) = NaN; the pair keeps its max of -inf.
        const std::string& m = second_of->first;
        o.line(2, "const float kr_lm = " + m + " == -kr_inf_f() ? 0.0f : " + m + ";");
        o.line(2, "{");
        o.line(2, "const float " + m + " = kr_lm;");
        for (const Stmt* l : second_of->between) e.stmt(*l, 2);
      }
    }
    const size_t ni = nest_of_stmt.at(&s);
    const LoopNest& nest = nests[ni];
    const int vec = vecs[ni];
    if (vec > 1) {
      if (waits.count(ni)) o.line(2, "kr_cp_async_wait_all();");
      std::vector<std::string> tail;
      if (!reg_fills.empty() && ni == last_nest) {
        o.line(2, "const " + e.ft() + " kr_pn = kr_p + " + point_step + ";");
        o.line(2, "const bool kr_pv = kr_pn < " + std::to_string(a.points) + e.fsuf() + ";");
        recover_next(2);
        tail = reg_prefetch("kr_pv");
      }
      // Fills the prefetch already made read their registers.
      RegisterCache view = cache;
      for (const Stmt* b : reg_filled) {
        view.reuse[b] = view.first.at(b);
        view.first.erase(b);
      }
      emit_vector_nest(e, nest, plan, vec, reg_filled.empty() ? cache : view, tail);
      // This row's last read of these arrays is done: copy the next row in.
      if (auto it = refill.find(ni); it != refill.end())
        emit_prefetch(e, plan, cache, it->second, "kr_p + " + point_step, 2);
    } else {
      const int64_t trips = (nest.extent + rt - 1) / rt;
      for (const Stmt& b : *nest.body) {
        if (auto it = cache.first.find(&b); it != cache.first.end())
          e.after[&b] = cache.at(it->second, "kr_k") + " = " + b.load.var + ";";
        if (auto it = cache.reuse.find(&b); it != cache.reuse.end())
          e.replace[&b] = std::string("const ") + kir::ctype(b.load.dtype) + " " + b.load.var +
                          " = " + cache.read(it->second, "kr_k", b) + ";";
        if (auto it = cache.let_first.find(&b); it != cache.let_first.end())
          e.after[&b] = it->second + "[kr_k] = " + b.let.var + ";";
        if (auto it = cache.let_reuse.find(&b); it != cache.let_reuse.end())
          e.replace[&b] = std::string("const ") + kir::ctype(b.let.dtype) + " " + b.let.var +
                          " = " + it->second + "[kr_k];";
      }
      o.line(2, trips <= 32 ? "#pragma unroll" : "#pragma unroll 4");
      o.line(2, "for (" + e.vt() + " kr_k = 0; kr_k < " + std::to_string(trips) + "; ++kr_k) {");
      o.line(3, "const " + e.ft() + " kr_r = " + plan.row_tid() + " + (" + e.ft() + ")kr_k * " +
                    std::to_string(rt) + e.fsuf() + ";");
      int d = 3;
      if (nest.extent % rt != 0) {
        o.line(3, "if (kr_r < " + std::to_string(nest.extent) + e.fsuf() + ") {");
        d = 4;
      }
      e.recover(dims_of(nest), "kr_r", d);
      for (const Loop* l : nest.loops) o.line(d, "(void)" + l->var + ";"); // unused when cached
      e.serial(*nest.body, d);
      if (d == 4) o.line(3, "}");
      o.line(2, "}");
      e.replace.clear();
      e.after.clear();
    }
    if (nest.kind != LoopKind::Reduce || first_of) continue;
    if (second_of) {
      // Both results in one round; then the lets between the loops, on the merged results.
      const bool mo = second_of->kind == MergedPair::Kind::Moments;
      o.line(2, mo ? "}" : "}}");
      const std::string head = "kr_cluster_" + std::string(mo ? "moments" : "expsum") +
                               "_async<" + std::to_string(nt) + ", " + std::to_string(cl) +
                               ", float>({" + second_of->first + ", " + second_of->second + "}";
      o.line(2, "{");
      o.line(3, "const auto kr_mg = " + head + (mo ? ", " + second_of->count : "") +
                    ", kr_cr, kr_cbar, kr_round);");
      o.line(3, second_of->first + (mo ? " = kr_mg.s;" : " = kr_mg.m;"));
      o.line(3, second_of->second + (mo ? " = kr_mg.q;" : " = kr_mg.s;"));
      o.line(2, "}");
      for (const Stmt* l : second_of->between) e.stmt(*l, 2);
      continue;
    }
    // Combine the threads' partial accumulators; every thread gets the result.
    std::vector<std::string> updated;
    visit(*nest.body, [&](const Stmt& b) {
      if (b.kind == Stmt::Kind::AccUpdate && point_accs.count(b.update.var) &&
          std::find(updated.begin(), updated.end(), b.update.var) == updated.end())
        updated.push_back(b.update.var);
    });
    for (const std::string& acc : updated) {
      kir::ReduceOp op{};
      visit(*nest.body, [&](const Stmt& b) {
        if (b.kind == Stmt::Kind::AccUpdate && b.update.var == acc) op = b.update.op;
      });
      const std::string t = kir::ctype(e.acc_dtype(acc));
      if (async_reduce) {
        o.line(2, acc + " = kr_cluster_allreduce_async<" + op_macro(op) + ", " +
                      std::to_string(nt) + ", " + std::to_string(cl) + ", " + t + ">(" + acc +
                      ", kr_cr, kr_cbar, kr_round);");
        continue;
      }
      if (nt <= 32)
        o.line(2, acc + " = kr_warp_allreduce<" + op_macro(op) + ", " + std::to_string(nt) +
                      ", " + t + ">(" + acc + ");");
      else
        o.line(2, acc + " = kr_block_allreduce<" + op_macro(op) + ", " + std::to_string(nt) +
                      ", " + t + ">(" + acc + ", kr_smem);");
      if (cl > 1)
        o.line(2, acc + " = kr_cluster_allreduce<" + op_macro(op) + ", " + std::to_string(cl) +
                      ", " + t + ">(" + acc + ", kr_cs, kr_ph);");
    }
  }
  o.line(1, "}");
  // No block may leave while another still reads its reduction slots.
  if (cl > 1 && reduces) o.line(1, "kr_cluster_sync();");
  o.line(0, "}");
}


} // namespace keraunos::codegen::cudagen
