// Functionalization: the one pass that understands mutation. Rewrites views and in-place ops
// into pure dataflow, so that later passes may reorder and fuse freely.
//
// Each storage that is written is a versioned value. When nothing views it (the common case),
// the value is simply the newest result written into its root tensor. When it is also viewed
// (or shared by several inputs), it is modelled as a flat 1-D value in storage order: a read
// of any alias gathers from the newest version (gather_strided), a write scatters into a new
// version (scatter_strided). Reads after a write therefore see it, whichever alias they use.
// At the end, an epilogue writes the final version of each mutated program input into that
// input (one prims.copy_ per storage), immediately before `return`; nothing else mutates.
// Outputs that alias inputs are returned as real views of them (as_strided with eager's
// strides and offset); outputs that alias each other share one final storage value.
//
//   t1 = ltorch.view(t0, [-1])        t1 = ltorch.as_strided(t0, [6], [1], 0)
//   ltorch.sin_(t1)             ->    t2 = ltorch.gather_strided(t1, [6], [1], 0)
//   return None                       t3 = ltorch.sin(t2)
//                                     t4 = ltorch.scatter_strided(t1, t3, [6], [1], 0)
//                                     prims.copy_(t1, t4)
//                                     return None
//
// Needs: a well-formed acquired trace. Guarantees: no in-place symbol but the epilogue; the
// same values of outputs and final contents of inputs as executing the input trace in order.
#include "keraunos/passes/functionalize.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace keraunos {

namespace {

// The symbols in execution order, with every memory-writing symbol replaced by its
// decomposition (recursively) down to prims.copy_.
struct Step {
  const BoundSymbol* bsym;
  std::shared_ptr<const SourceLoc> loc; // of the user's call it came from
};

void expand(const BoundSymbol& b, std::shared_ptr<const SourceLoc> loc, std::vector<Step>& out) {
  if (b.loc) loc = b.loc;
  if (b.op != OpId::prim_copy_ && !b.def().has(tags::Ret) && writes_memory(b) &&
      !b.subsymbols.empty()) {
    for (const auto& s : b.subsymbols) expand(s, loc, out);
    return;
  }
  out.push_back({&b, loc});
}

// A view op that did make a view (reshape, for one, copies when it must).
bool makes_alias(const BoundSymbol& b) {
  if (!b.def().has(tags::V)) return false;
  auto ins = b.inputs();
  for (const auto& o : b.outputs())
    for (const auto& i : ins)
      if (o->storage_id == i->storage_id) return true;
  return false;
}

struct Storage {
  int64_t id = -1;
  bool written = false;
  bool viewed = false;
  bool flat = false;
  bool recorded_write = false; // written through a tensor autograd sees (not a detached alias)
  TensorRef input;      // an input living in this storage, if any
  TensorRef value;      // simple storages: the newest value of the root
  TensorRef flat_view;  // flat input storages: the 1-D view of the input written back
  TensorRef S;          // flat storages: the newest 1-D value
  int64_t base = 0, extent = 0;
  int version = 0;
};

// Dense strides with the dim order of `t`'s strides (t's own strides when it is dense).
Shape dense_layout(const TensorProxy& t) {
  Shape perm(t.ndim());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    return t.strides[a] > t.strides[b];
  });
  Shape strides(t.ndim());
  int64_t acc = 1;
  for (int64_t i = t.ndim() - 1; i >= 0; --i) {
    strides[perm[i]] = acc;
    acc *= std::max<int64_t>(t.shape[perm[i]], 1);
  }
  return strides;
}

int64_t last_element(const TensorProxy& t) {
  int64_t hi = t.storage_offset;
  for (int64_t i = 0; i < t.ndim(); ++i) hi += (t.shape[i] - 1) * t.strides[i];
  return hi;
}

class Functionalizer {
public:
  Functionalizer(const Trace& t, const PassContext& ctx) : trace_(t), b_(ctx.builder) {
    b_.reserve_names(t);
  }

  PassResult run() {
    for (const auto& t : trace_.inputs) aliases_.insert(t.get());
    for (const auto& b : trace_.bsyms)
      for (const auto& t : b.outputs()) user_visible_.insert(t.get());
    std::vector<Step> seq;
    for (const auto& bs : trace_.bsyms) expand(bs, nullptr, seq);
    scan(seq);
    bool any_write = false;
    for (auto& [id, s] : storages_) any_write |= s.written;
    if (!any_write) return {trace_, false};
    for (const Step& st : seq) {
      loc_ = st.loc;
      process(*st.bsym);
    }
    PassResult r;
    r.trace = b_.finish();
    r.trace.inputs = trace_.inputs;
    r.changed = true;
    return r;
  }

private:
  void see(const TensorRef& t) {
    Storage& s = storages_[t->storage_id];
    s.id = t->storage_id;
    if (t->numel() == 0) return;
    int64_t lo = t->storage_offset, hi = last_element(*t) + 1;
    if (s.extent == 0) {
      s.base = lo;
      s.extent = hi - lo;
    } else {
      int64_t nlo = std::min(s.base, lo), nhi = std::max(s.base + s.extent, hi);
      s.base = nlo;
      s.extent = nhi - nlo;
    }
  }

  void scan(const std::vector<Step>& steps) {
    std::vector<const BoundSymbol*> seq;
    for (const auto& st : steps) seq.push_back(st.bsym);
    std::unordered_map<int64_t, int> inputs_per_storage;
    for (const auto& t : trace_.inputs) {
      see(t);
      Storage& s = storages_[t->storage_id];
      if (!s.input) s.input = t;
      if (++inputs_per_storage[t->storage_id] > 1) s.viewed = true;
      // An input whose elements share memory (expanded) is written through its flat storage.
      for (int64_t i = 0; i < t->ndim(); ++i)
        if (t->strides[i] == 0 && t->shape[i] > 1) s.viewed = true;
    }
    for (const BoundSymbol* bs : seq) {
      for (const auto& t : bs->inputs()) see(t);
      for (const auto& t : bs->outputs()) see(t);
      if (bs->op == OpId::prim_copy_) storages_[bs->args[0].tensor()->storage_id].written = true;
      if (makes_alias(*bs))
        for (const auto& t : bs->inputs()) storages_[t->storage_id].viewed = true;
    }
    for (auto& [id, s] : storages_) s.flat = s.written && s.viewed;
  }

  Storage* storage_of(const TensorRef& t) {
    auto it = storages_.find(t->storage_id);
    return it == storages_.end() ? nullptr : &it->second;
  }

  TensorRef emit(OpId op, Arg::List args) { return b_.call(op, std::move(args), loc_).tensor(); }

  // The flat value of a storage, made on first use.
  TensorRef& flat_value(Storage& s, const TensorRef& any_alias) {
    if (s.S) return s.S;
    if (s.input) {
      s.flat_view = emit(OpId::as_strided, {Arg(s.input), Arg::int_list({s.extent}),
                                            Arg::int_list({1}), Arg(s.base)});
      s.S = s.flat_view;
    } else {
      // An intermediate: its root is a fresh dense tensor with offset 0.
      const TensorRef& root = any_alias;
      KR_INTERNAL(root->storage_offset == 0 && root->numel() == s.extent && s.base == 0,
                  "functionalize: storage root ", root->name, " is not dense");
      Shape perm(root->ndim());
      std::iota(perm.begin(), perm.end(), 0);
      std::stable_sort(perm.begin(), perm.end(), [&](int64_t x, int64_t y) {
        return root->strides[x] > root->strides[y];
      });
      s.S = emit(OpId::flat_storage, {Arg(root), Arg::int_list(perm)});
    }
    return s.S;
  }

  TensorRef read(const TensorRef& t) {
    Storage* s = storage_of(t);
    if (!s || !s->written) return t;
    if (!s->flat) return s->value ? s->value : t;
    if (!s->S) flat_value(*s, t);
    auto key = std::make_pair(t.get(), s->version);
    auto it = gathered_.find(key);
    if (it != gathered_.end()) return it->second;
    TensorRef g = emit(OpId::gather_strided, {Arg(s->S), Arg::int_list(t->shape),
                                              Arg::int_list(t->strides),
                                              Arg(t->storage_offset - s->base)});
    gathered_[key] = g;
    aliases_.insert(g.get()); // the torch executor's gather is a view of the storage value
    return g;
  }

  ProxyMap reads_of(const BoundSymbol& bs) {
    ProxyMap m;
    for (const auto& t : bs.inputs())
      if (!m.count(t.get())) {
        TensorRef v = read(t);
        if (v != t) m[t.get()] = v;
      }
    return m;
  }

  void write(const TensorRef& dst, TensorRef val) {
    Storage& s = *storage_of(dst);
    if (val->dtype != dst->dtype) val = emit(OpId::prim_convert_element_type, {Arg(val), Arg(dst->dtype)});
    if (!s.flat) {
      // The new value takes the layout of the tensor it is written into (later views of it
      // must see eager's strides) and must be a tensor of its own: a view of another storage
      // would make them alias (and an epilogue write into that storage would change it).
      Shape layout = dense_layout(*dst);
      bool same_layout = true;
      for (int64_t i = 0; i < val->ndim(); ++i)
        same_layout &= val->shape[i] == 1 || val->strides[i] == layout[i];
      if (!same_layout)
        val = emit(OpId::restride, {Arg(val), Arg::int_list(layout)});
      else if (aliases_.count(val.get()))
        val = emit(OpId::clone, {Arg(val)});
      s.value = val;
      return;
    }
    // Eager lets fill_/zero_ write an expanded tensor (every alias of an element gets the
    // same value): write one element per memory location.
    Shape shape = dst->shape, start(dst->ndim(), 0), end = dst->shape, step(dst->ndim(), 1);
    bool overlap = false;
    for (int64_t i = 0; i < dst->ndim(); ++i)
      if (dst->strides[i] == 0 && dst->shape[i] > 1) {
        shape[i] = end[i] = 1;
        overlap = true;
      }
    if (overlap)
      val = emit(OpId::prim_slice, {Arg(val), Arg::int_list(start), Arg::int_list(end),
                                    Arg::int_list(step)});
    TensorRef& S = flat_value(s, dst);
    S = emit(OpId::scatter_strided, {Arg(S), Arg(val), Arg::int_list(shape),
                                     Arg::int_list(dst->strides),
                                     Arg(dst->storage_offset - s.base)});
    ++s.version;
  }

  void process(const BoundSymbol& bs) {
    const OpDef& d = bs.def();
    if (d.has(tags::Ret)) {
      finish_outputs(bs);
      return;
    }
    if (bs.op == OpId::detach || (makes_alias(bs) && detached_.count(bs.args.at(0).tensor().get())))
      for (const auto& t : bs.outputs()) detached_.insert(t.get());
    if (bs.op == OpId::prim_copy_) {
      const TensorRef& src = bs.args[1].tensor();
      TensorRef val = read(src);
      // A tensor the program can still see (x.copy_(y) writes y's values, y stays y) is
      // copied, so the storage's new value is a tensor of its own.
      const TensorRef& dst = bs.args[0].tensor();
      if (!storage_of(dst)->input && user_visible_.count(src.get()) && !aliases_.count(val.get()))
        val = emit(OpId::clone, {Arg(val)});
      if (!detached_.count(dst.get())) storage_of(dst)->recorded_write = true;
      write(dst, val);
      return;
    }
    if (makes_alias(bs)) {
      // A view of a flat storage is an alias: reads of it gather from the storage.
      bool flat = false;
      for (const auto& t : bs.outputs())
        if (Storage* s = storage_of(t); s && s->flat) flat = true;
      if (flat) {
        for (const auto& t : bs.inputs()) {
          Storage* s = storage_of(t);
          if (s && s->flat) flat_value(*s, t);
        }
        return;
      }
    }
    ProxyMap m = reads_of(bs);
    BoundSymbol copy = m.empty() ? bs : substitute(bs, m);
    // Views, and index-remap prims (the torch executor runs them as views), share memory.
    if (makes_alias(copy) || copy.def().has(tags::M))
      for (const auto& t : copy.outputs()) aliases_.insert(t.get());
    if (!copy.loc) copy.loc = loc_;
    b_.append(std::move(copy));
    // A fresh intermediate storage that will be viewed and written starts its flat value now.
    for (const auto& t : bs.outputs())
      if (Storage* s = storage_of(t); s && s->flat && !s->S && !makes_alias(bs)) flat_value(*s, t);
  }

  Arg output_value(const Arg& a) {
    if (a.is_list()) {
      Arg::List l;
      for (const auto& e : a.list()) l.push_back(output_value(e));
      return Arg(std::move(l));
    }
    if (!a.is_tensor()) return a;
    const TensorRef& o = a.tensor();
    Storage* s = storage_of(o);
    if (!s || !s->written) return a;
    if (!s->flat) return Arg(s->input ? o : (s->value ? s->value : o));
    // An input is returned as itself (the epilogue updates it); anything else in the storage
    // as a real view, with eager's strides and offset, of the input or of the final storage.
    for (const auto& i : trace_.inputs)
      if (i == o) return a;
    auto key = o.get();
    if (auto it = out_views_.find(key); it != out_views_.end()) return Arg(it->second);
    TensorRef v;
    if (s->input) {
      v = emit(OpId::as_strided, {Arg(s->input), Arg::int_list(o->shape), Arg::int_list(o->strides),
                                  Arg(o->storage_offset)});
    } else {
      v = emit(OpId::as_strided, {Arg(s->S), Arg::int_list(o->shape), Arg::int_list(o->strides),
                                  Arg(o->storage_offset - s->base)});
    }
    out_views_[key] = v;
    return Arg(v);
  }

  void finish_outputs(const BoundSymbol& ret) {
    Arg out = output_value(ret.args.at(0));
    // The epilogue: one write per mutated input storage, after every read.
    std::map<int64_t, Storage*> ordered;
    for (auto& [id, s] : storages_)
      if (s.written && s.input) ordered[id] = &s;
    // An input that requires grad, written only through detached aliases (in-place ops under
    // torch.no_grad, x.detach().mul_(2)), is written back through one too: eager's write is
    // not recorded by autograd (and is allowed on a leaf). The detaches come before every copy:
    // the epilogue is the run of copies just before `return` (partition.cpp).
    std::map<int64_t, TensorRef> dst;
    for (auto& [id, s] : ordered) {
      TensorRef d = s->flat ? s->flat_view : s->input;
      if (s->flat ? s->S == s->flat_view : !s->value) continue;
      if (s->input->requires_grad && !s->recorded_write) d = emit(OpId::detach, {Arg(d)});
      dst[id] = d;
    }
    for (auto& [id, d] : dst) {
      Storage* s = ordered[id];
      b_.write_into(d, s->flat ? s->S : s->value);
    }
    b_.set_return(out);
  }

  const Trace& trace_;
  Builder b_;
  std::shared_ptr<const SourceLoc> loc_;
  std::unordered_map<int64_t, Storage> storages_;
  std::map<std::pair<const TensorProxy*, int>, TensorRef> gathered_;
  std::unordered_map<const TensorProxy*, TensorRef> out_views_;
  std::unordered_set<const TensorProxy*> aliases_; // inputs and views: values that share memory
  std::unordered_set<const TensorProxy*> user_visible_; // outputs of the program's own calls
  std::unordered_set<const TensorProxy*> detached_;     // detach()es and views of them
};

} // namespace

PassResult functionalize(const Trace& trace, const PassContext& ctx) {
  return Functionalizer(trace, ctx).run();
}

} // namespace keraunos
