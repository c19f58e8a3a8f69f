// Partition: groups fusible symbols of the functional trace into fusion regions.
//
// `consecutive` merges runs of adjacent fusible symbols and keeps program order. `dataflow`
// lets a fusible symbol join the region of one of its producers when the merge can make no
// cycle (no other producer of the symbol reads from that region), then emits the regions and the other symbols in a topological order of their data
// edges (ties keep program order). Random draws are chained (each depends on the previous
// one), so they keep eager's order and its random numbers. The epilogue copies into inputs
// and `return` always stay last.
//
//   t1 = ltorch.sin(t0)              t5, = ltorch.fusion([t0], 0)
//   t2 = ltorch.matmul(t0, t0)    ->   # t1 = ltorch.sin(t0)
//   t3 = ltorch.cos(t1)                # t5 = ltorch.cos(t1)
//   return t3, t2                    t2 = ltorch.matmul(t0, t0)
//                                    return t5, t2        (dataflow)
//
// Needs: a functional trace. Guarantees: every region's inputs are defined before it and its
// outputs are the member outputs read after it; the order is topological.
#include "keraunos/passes/partition.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <numeric>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace keraunos {

bool fusible(const BoundSymbol& b, const std::vector<TensorRef>& returned) {
  const OpDef& d = b.def();
  if (d.has(tags::T | tags::I | tags::S | tags::Ret | tags::F)) return false;
  if (d.has(tags::V)) {
    // A view that escapes must stay a real view of its base.
    for (const auto& o : b.outputs())
      for (const auto& r : returned)
        if (o->storage_id == r->storage_id) return false;
    return true;
  }
  if (d.has(tags::E | tags::R | tags::M | tags::D | tags::C | tags::Scan)) return true;
  // A composite op (softmax, layer_norm, ...) whose decomposition is all fusible prims.
  if (d.is_prim() || b.subsymbols.empty()) return false;
  for (const auto& s : b.subsymbols)
    if (!fusible(s, returned)) return false;
  return true;
}

namespace {

struct Graph {
  std::vector<std::vector<int>> producers; // per symbol, the symbols it reads from
};

int find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

} // namespace

namespace {

// See partition(): for each fusion region G (in order), the values G reads from another region
// P that P computes by recomputable symbols from P's inputs (or from values P materializes
// anyway) are computed again at the start of G, under fresh names, when the tensors G then
// reads in addition take fewer bytes than those values.
void recompute_across_regions(const std::vector<BoundSymbol>& bs,
                              const std::unordered_map<const TensorProxy*, int>& def,
                              const std::unordered_map<int, std::vector<int>>& members,
                              const std::vector<int>& order, const std::vector<bool>& can_fuse,
                              const std::unordered_set<const TensorProxy*>& read_outside,
                              const std::unordered_map<const TensorProxy*, int>& group_of,
                              std::unordered_map<int, std::vector<BoundSymbol>>& group_syms,
                              const Trace& trace, const PassContext& ctx) {
  auto group = [&](int i) { return group_of.at(bs[i].outputs().at(0).get()); };
  std::optional<Builder> bb;
  for (int G : order) {
    const auto& ms = members.at(G);
    if (ms.size() < 2 || !can_fuse[ms[0]]) continue; // only regions recompute
    std::unordered_set<const TensorProxy*> reads, made;
    for (int m : ms)
      for (const auto& t : bs[m].outputs()) made.insert(t.get());
    for (int m : ms)
      for (const auto& t : bs[m].inputs())
        if (!made.count(t.get())) reads.insert(t.get());
    // Candidates, by the region that makes them.
    std::map<int, std::vector<const TensorProxy*>> by_region;
    for (const TensorProxy* t : reads) {
      auto it = def.find(t);
      if (it == def.end() || !recomputable(bs[it->second])) continue;
      const int P = group(it->second);
      if (P == G || members.at(P).size() < 2 || !can_fuse[it->second]) continue;
      by_region[P].push_back(t);
    }
    for (auto& [P, cands] : by_region) {
      std::sort(cands.begin(), cands.end(), [](auto* a, auto* b) { return a->name < b->name; });
      std::set<int> cone;
      std::unordered_set<const TensorProxy*> leaves;
      std::vector<const TensorProxy*> taken;
      for (const TensorProxy* c : cands) {
        // The symbols that make c, back to P's inputs or to values P materializes anyway.
        std::set<int> mine;
        std::vector<int> stack{def.at(c)};
        bool ok = true;
        while (!stack.empty() && ok) {
          int i = stack.back();
          stack.pop_back();
          if (!mine.insert(i).second) continue;
          if (!bs[i].out.is_tensor()) {
            ok = false;
            continue;
          }
          for (const auto& x : bs[i].inputs()) {
            auto it = def.find(x.get());
            if (it == def.end() || group(it->second) != P) continue;
            if (recomputable(bs[it->second])) {
              stack.push_back(it->second);
            } else if (!read_outside.count(x.get())) {
              ok = false; // a reduction P keeps to itself
            }
          }
        }
        if (!ok) continue;
        taken.push_back(c);
        cone.insert(mine.begin(), mine.end());
      }
      if (taken.empty()) continue;
      std::unordered_set<const TensorProxy*> cone_out;
      for (int i : cone)
        for (const auto& t : bs[i].outputs()) cone_out.insert(t.get());
      int64_t added = 0, dropped = 0;
      for (int i : cone)
        for (const auto& x : bs[i].inputs())
          if (!cone_out.count(x.get()) && !reads.count(x.get()) && leaves.insert(x.get()).second)
            added += memory_bytes(*x);
      for (const TensorProxy* c : taken) dropped += memory_bytes(*c);
      if (added >= dropped) continue;
      if (!bb) {
        bb.emplace(ctx.builder);
        bb->reserve_names(trace);
      }
      ProxyMap fresh;
      std::vector<BoundSymbol> copies;
      for (int i : cone) { // program order
        BoundSymbol c = substitute(bs[i], fresh);
        const TensorRef& o = bs[i].out.tensor();
        auto t = bb->new_tensor(o->dtype, o->device, o->shape, o->strides);
        fresh[o.get()] = t;
        c.out = Arg(t);
        copies.push_back(std::move(c));
      }
      auto& syms = group_syms[G];
      for (auto& b : syms) b = substitute(b, fresh);
      syms.insert(syms.begin(), std::make_move_iterator(copies.begin()),
                  std::make_move_iterator(copies.end()));
      for (const TensorProxy* x : leaves) reads.insert(x);
    }
  }
}

} // namespace

PassResult partition(const Trace& trace, const PassContext& ctx) {
  const auto& bs = trace.bsyms;
  // The body: everything before the epilogue copies and return.
  size_t body = bs.size();
  while (body > 0 && (bs[body - 1].def().has(tags::Ret) || bs[body - 1].op == OpId::prim_copy_))
    --body;
  std::vector<TensorRef> returned;
  trace.output().collect_tensors(returned);
  const int n = static_cast<int>(body);

  std::unordered_map<const TensorProxy*, int> producer;
  Graph g;
  g.producers.resize(n);
  int last_random = -1;
  std::vector<bool> can_fuse(n);
  for (int i = 0; i < n; ++i) {
    for (const auto& t : bs[i].inputs()) {
      auto it = producer.find(t.get());
      if (it != producer.end()) g.producers[i].push_back(it->second);
    }
    if (bs[i].def().has(tags::N)) {
      if (last_random >= 0) g.producers[i].push_back(last_random);
      last_random = i;
    }
    std::sort(g.producers[i].begin(), g.producers[i].end());
    g.producers[i].erase(std::unique(g.producers[i].begin(), g.producers[i].end()),
                         g.producers[i].end());
    for (const auto& t : bs[i].outputs()) producer[t.get()] = i;
    can_fuse[i] = fusible(bs[i], returned);
  }
  // An index remap (a transpose of a weight, a reshape) read only by matmul-class ops, or by
  // such remaps, stays out of regions: torch gives it as a view, which the matmul reads with
  // its strides, where a kernel would copy it.
  {
    std::vector<std::vector<int>> readers(n);
    for (int i = 0; i < n; ++i)
      for (int p : g.producers[i]) readers[p].push_back(i);
    for (int i = n; i-- > 0;) {
      if (!can_fuse[i] || !bs[i].def().is_prim() || !bs[i].def().has(tags::M) || readers[i].empty())
        continue;
      bool views_only = true;
      for (int r : readers[i])
        views_only = views_only && (bs[r].def().has(tags::T) ||
                                    (!can_fuse[r] && bs[r].def().is_prim() && bs[r].def().has(tags::M)));
      if (views_only) can_fuse[i] = false;
    }
  }

  // Group symbols (union-find over symbol indices; a group's first symbol is its leader).
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::vector<int> first(n);
  std::iota(first.begin(), first.end(), 0);
  if (ctx.fusion_type == "consecutive") {
    for (int i = 1; i < n; ++i)
      if (can_fuse[i] && can_fuse[i - 1]) parent[find(parent, i)] = find(parent, i - 1);
  } else {
    // A symbol joins all its fusible producers' regions at once when no symbol outside them,
    // between the first of them and the symbol, reads from them: a path that left the merged
    // region and came back would pass through such a symbol (program order is topological).
    // `cat(a.sin(), b * 2)` is one region. Otherwise it joins one producer's region when that
    // closes no cycle in the region graph (closes_cycle).
    std::vector<int> in_union(n, -1);
    // Each region's members (at its root), for the region-level search below.
    std::vector<std::vector<int>> members_of(n);
    for (int i = 0; i < n; ++i) members_of[i] = {i};
    auto unite = [&](int child, int root) { // both roots
      if (child == root) return;
      parent[child] = root;
      first[root] = std::min(first[root], first[child]);
      auto& big = members_of[root];
      auto& small = members_of[child];
      if (small.size() > big.size()) std::swap(small, big);
      big.insert(big.end(), small.begin(), small.end());
      std::vector<int>().swap(small);
    };
    for (int i = 0; i < n; ++i) {
      if (!can_fuse[i]) continue;
      std::vector<int> roots;
      for (int p : g.producers[i])
        if (can_fuse[p] && std::find(roots.begin(), roots.end(), find(parent, p)) == roots.end())
          roots.push_back(find(parent, p));
      int start = i;
      for (int r : roots) start = std::min(start, first[r]);
      // (The scan is bounded: a producer region that began far back is joined alone.)
      if (roots.size() > 1 && i - start <= 4096) {
        for (int s = start; s < i; ++s)
          if (std::find(roots.begin(), roots.end(), find(parent, s)) != roots.end()) in_union[s] = i;
        bool safe = true;
        for (int s = start; s < i && safe; ++s) {
          if (in_union[s] == i) continue;
          for (int q : g.producers[s]) safe = safe && !(q >= start && in_union[q] == i);
        }
        if (safe) {
          for (int r : roots) unite(find(parent, r), find(parent, roots[0]));
          unite(find(parent, i), find(parent, roots[0]));
          continue;
        }
      }
      // Whether joining region r would close a cycle: whether r reaches (along the region
      // graph's edges) the region of another producer of i. Regions are nodes taken whole —
      // they need not be contiguous in program order, so a region reachable from r may lie
      // entirely before r's first member (r -> {5, 20} via 20, {5, 20} -> {7} via 5) and no
      // index bound prunes the search: it walks the other producers' regions' members back,
      // exactly, up to a budget of producer edges (past it, assume a cycle: no join).
      auto closes_cycle = [&](int r) {
        std::vector<int> stack;
        std::unordered_set<int> seen;
        for (int q : g.producers[i]) {
          const int R = find(parent, q);
          if (R != r && seen.insert(R).second) stack.push_back(R);
        }
        int64_t budget = int64_t{1} << 14;
        while (!stack.empty()) {
          const int R = stack.back();
          stack.pop_back();
          for (int j : members_of[R])
            for (int x : g.producers[j]) {
              if (--budget < 0) return true;
              const int X = find(parent, x);
              if (X == r) return true;
              if (seen.insert(X).second) stack.push_back(X);
            }
        }
        return false;
      };
      for (auto it = g.producers[i].rbegin(); it != g.producers[i].rend(); ++it) {
        int p = *it;
        if (!can_fuse[p]) continue;
        int r = find(parent, p);
        // `silu(x @ a) * (x @ b)` puts the product with the silu, after both matmuls (the up
        // projection does not read from the silu's region).
        if (!closes_cycle(r)) {
          unite(find(parent, i), r);
          break;
        }
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    int r = find(parent, i);
    first[r] = std::min(first[r], i);
  }

  // Groups in a topological order of their edges, ties by first position.
  std::unordered_map<int, std::vector<int>> members;
  for (int i = 0; i < n; ++i) members[find(parent, i)].push_back(i);
  std::unordered_map<int, std::unordered_set<int>> succ;
  std::unordered_map<int, int> indeg;
  for (auto& [r, ms] : members) indeg[r] = 0;
  for (int i = 0; i < n; ++i)
    for (int p : g.producers[i]) {
      int a = find(parent, p), b = find(parent, i);
      if (a != b && succ[a].insert(b).second) ++indeg[b];
    }
  std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>, std::greater<>> ready;
  for (auto& [r, d] : indeg)
    if (d == 0) ready.push({first[r], r});
  std::vector<int> order;
  while (!ready.empty()) {
    int r = ready.top().second;
    ready.pop();
    order.push_back(r);
    for (int s : succ[r])
      if (--indeg[s] == 0) ready.push({first[s], s});
  }
  KR_INTERNAL(order.size() == members.size(), "partition: the region graph has a cycle");

  // Which tensors are read after (outside) each region.
  std::unordered_map<const TensorProxy*, int> group_of;
  for (int i = 0; i < n; ++i)
    for (const auto& t : bs[i].outputs()) group_of[t.get()] = find(parent, i);
  std::unordered_set<const TensorProxy*> read_outside;
  for (size_t i = 0; i < bs.size(); ++i) {
    int gi = i < body ? find(parent, static_cast<int>(i)) : -1;
    for (const auto& t : bs[i].inputs()) {
      auto it = group_of.find(t.get());
      if (it != group_of.end() && it->second != gi) read_outside.insert(t.get());
    }
  }

  // Each group's symbols, then recomputation across regions: a region that reads pointwise
  // values another region computes from tensors it could read itself computes them again
  // when that reads fewer bytes (a backward's norm or GELU recomputed from the forward's saved
  // input would otherwise be materialized by one kernel, several full-size tensors, for the
  // next to read back).
  std::unordered_map<int, std::vector<BoundSymbol>> group_syms;
  for (int g_id : order)
    for (int m : members[g_id]) group_syms[g_id].push_back(bs[m]);
  recompute_across_regions(bs, producer, members, order, can_fuse, read_outside, group_of, group_syms, trace, ctx);

  // Which tensors are read outside their group now, and what each group still computes.
  std::unordered_map<const TensorProxy*, int> made_in;
  for (int g_id : order)
    for (const auto& b : group_syms[g_id])
      for (const auto& t : b.outputs()) made_in[t.get()] = g_id;
  std::unordered_set<const TensorProxy*> outside;
  auto note_reads = [&](const BoundSymbol& b, int gi) {
    for (const auto& t : b.inputs()) {
      auto it = made_in.find(t.get());
      if (it != made_in.end() && it->second != gi) outside.insert(t.get());
    }
  };
  for (int g_id : order)
    for (const auto& b : group_syms[g_id]) note_reads(b, g_id);
  for (size_t i = body; i < bs.size(); ++i) note_reads(bs[i], -1);

  PassResult r;
  r.trace.inputs = trace.inputs;
  int index = 0;
  for (int g_id : order) {
    auto& syms = group_syms[g_id];
    // What the group no longer needs (values now recomputed by their readers).
    {
      std::unordered_set<const TensorProxy*> live(outside);
      std::vector<BoundSymbol> kept;
      for (size_t k = syms.size(); k-- > 0;) {
        bool needed = has_effect(syms[k]) || syms.size() == 1;
        for (const auto& t : syms[k].outputs()) needed = needed || live.count(t.get());
        if (!needed) continue;
        for (const auto& t : syms[k].inputs()) live.insert(t.get());
        kept.push_back(std::move(syms[k]));
      }
      std::reverse(kept.begin(), kept.end());
      syms = std::move(kept);
    }
    if (syms.empty()) continue;
    if (syms.size() == 1) {
      r.trace.bsyms.push_back(std::move(syms[0]));
      continue;
    }
    BoundSymbol region;
    region.op = OpId::fusion;
    std::unordered_set<const TensorProxy*> inside;
    Arg::List ins, outs;
    std::unordered_set<const TensorProxy*> seen_in;
    for (auto& m : syms) {
      for (const auto& t : m.inputs())
        if (!inside.count(t.get()) && seen_in.insert(t.get()).second) ins.emplace_back(t);
      for (const auto& t : m.outputs()) {
        inside.insert(t.get());
        if (outside.count(t.get())) outs.emplace_back(t);
      }
    }
    region.loc = syms[0].loc;
    region.subsymbols = std::move(syms);
    region.args = {Arg(std::move(ins)), Arg(int64_t{index++})};
    region.out = Arg(std::move(outs));
    r.trace.bsyms.push_back(std::move(region));
  }
  for (size_t i = body; i < bs.size(); ++i) r.trace.bsyms.push_back(bs[i]);
  r.changed = index > 0 || [&] {
    for (size_t i = 0; i < order.size(); ++i)
      if (members[order[i]][0] != static_cast<int>(i)) return true;
    return false;
  }();
  return r;
}

} // namespace keraunos
