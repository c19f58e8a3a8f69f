#include "keraunos/codegen/fused_program.h"

#include "keraunos/codegen/torch_program.h"
#include "keraunos/ir/error.h"
#include "keraunos/passes/partition.h"
#include "keraunos/passes/pass.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace keraunos::codegen {

namespace {

void flatten(const BoundSymbol& b, std::vector<BoundSymbol>& out) {
  if (b.def().is_prim() || b.subsymbols.empty()) {
    BoundSymbol c = b;
    c.subsymbols.clear();
    out.push_back(std::move(c));
    return;
  }
  for (const auto& s : b.subsymbols) flatten(s, out);
}

// A composite's inner detach (softmax's shift by its maximum: no gradient flows through it)
// changes no value: its readers read its input instead, so the decomposition stays all prims.
// A detach the composite returns stays (its result must be a view without grad).
void drop_inner_detaches(std::vector<BoundSymbol>& prims, const std::vector<TensorRef>& outs) {
  ProxyMap m;
  std::vector<BoundSymbol> kept;
  for (auto& p : prims) {
    if (p.op == OpId::detach &&
        std::none_of(outs.begin(), outs.end(), [&](const TensorRef& o) { return o.get() == p.out.tensor().get(); })) {
      const TensorRef& x = p.args.at(0).tensor();
      auto it = m.find(x.get());
      m[p.out.tensor().get()] = it != m.end() ? it->second : x;
      continue;
    }
    kept.push_back(m.empty() ? std::move(p) : substitute(p, m));
  }
  prims = std::move(kept);
}

// Moves the views of values the region does not compute (its inputs: q[..., :d] of a rotary
// embedding) before its first prim. They run through torch as free views; left in place, a
// view between two prims would end one kernel and start another.
void hoist_input_views(std::vector<BoundSymbol>& prims) {
  std::unordered_set<const TensorProxy*> computed;
  std::vector<BoundSymbol> views, rest;
  for (auto& p : prims) {
    bool of_input = p.def().has(tags::V) && !kernel_supports(p);
    for (const auto& t : p.inputs()) of_input = of_input && !computed.count(t.get());
    if (!of_input)
      for (const auto& t : p.outputs()) computed.insert(t.get());
    (of_input ? views : rest).push_back(std::move(p));
  }
  prims = std::move(views);
  for (auto& p : rest) prims.push_back(std::move(p));
}

std::optional<Device> device_of(const BoundSymbol& b) {
  for (const auto& t : b.outputs()) return t->device;
  for (const auto& t : b.inputs()) return t->device;
  return std::nullopt;
}

// A program statement after lowering.
struct PStep {
  int kernel = -1;                  // index into FusedProgram::kernels
  const BoundSymbol* bsym = nullptr; // a top-level symbol or a region's prim, run by torch
  BoundSymbol owned;                 // the prim itself, when it comes from a region
  bool is_owned = false;
  bool dropped = false; // an epilogue copy fused into its kernel
  bool as_view = false; // a prims.reshape that may share its input's memory
};

std::vector<TensorRef> step_inputs(const PStep& s, const FusedProgram& fp) {
  if (s.kernel >= 0) return fp.kernels[s.kernel].inputs;
  return (s.is_owned ? s.owned : *s.bsym).inputs();
}

// prims.reshape makes a tensor of its own; torch's reshape of a contiguous tensor is a view
// (no copy). A program that writes no memory cannot tell the two apart, except through what it
// returns (a fresh tensor must not alias): there every reshape not returned runs as a view.
// Backward programs (no writes; most of their reshapes flatten batch dims of a gradient for a
// matmul) are the ones this pays for.
void view_reshapes(std::vector<PStep>& steps, const Trace& trace) {
  for (const auto& b : trace.bsyms)
    if (writes_memory(b)) return;
  std::vector<TensorRef> returned;
  trace.output().collect_tensors(returned);
  std::unordered_set<const TensorProxy*> returned_set;
  for (const auto& t : returned) returned_set.insert(t.get());
  for (auto& s : steps) {
    if (s.kernel >= 0 || s.dropped) continue;
    const BoundSymbol& b = s.is_owned ? s.owned : *s.bsym;
    if (b.op == OpId::prim_reshape && !returned_set.count(b.out.tensor().get())) s.as_view = true;
  }
}

// Whether a kernel writes output `out` and reads input buffer `in` (-1: none) only at the
// element it writes, in loops without reductions or scans (so that writing `out` into `in`'s
// memory changes no value it reads: each element is read before the same iteration writes it).
bool reads_only_where_it_writes(const kir::Kernel& k, int in, int out) {
  std::string store_index;
  bool ok = true;
  std::function<void(const kir::Block&)> scan = [&](const kir::Block& blk) {
    for (const auto& s : blk) {
      if (s.kind == kir::Stmt::Kind::Loop) {
        if ((s.loop->kind == kir::LoopKind::Reduce || s.loop->kind == kir::LoopKind::Scan) && in >= 0)
          ok = false;
        scan(s.loop->body);
      } else if (s.kind == kir::Stmt::Kind::Store && s.store.buffer == k.num_inputs() + out) {
        store_index = s.store.index.str();
      }
    }
  };
  scan(k.body);
  std::function<void(const kir::Block&)> loads = [&](const kir::Block& blk) {
    for (const auto& s : blk) {
      if (s.kind == kir::Stmt::Kind::Loop) loads(s.loop->body);
      if (s.kind == kir::Stmt::Kind::Load && s.load.buffer == in && s.load.index.str() != store_index)
        ok = false;
    }
  };
  loads(k.body);
  return ok && !store_index.empty();
}

// Fuses `copy_(x, t)` into the kernel that computes t when that kernel reads x only at the
// element it writes and nothing after it reads x or t.
void reinplace(std::vector<PStep>& steps, FusedProgram& fp, const Trace& trace) {
  std::unordered_map<const TensorProxy*, std::pair<int, int>> made_by; // value -> (step, output)
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].kernel >= 0) {
      const auto& kc = fp.kernels[steps[i].kernel];
      for (size_t j = 0; j < kc.outputs.size(); ++j)
        made_by[kc.outputs[j].get()] = {static_cast<int>(i), static_cast<int>(j)};
    }
  std::unordered_map<int64_t, int> inputs_per_storage;
  for (const auto& t : trace.inputs) ++inputs_per_storage[t->storage_id];
  std::vector<TensorRef> returned;
  trace.output().collect_tensors(returned);
  std::unordered_set<const TensorProxy*> returned_set;
  for (const auto& t : returned) returned_set.insert(t.get());

  for (size_t c = 0; c < steps.size(); ++c) {
    if (steps[c].kernel >= 0 || steps[c].is_owned || steps[c].bsym->op != OpId::prim_copy_)
      continue;
    const BoundSymbol& cp = *steps[c].bsym;
    const TensorRef& x = cp.args[0].tensor();
    if (!cp.args[1].is_tensor()) continue;
    const TensorRef& t = cp.args[1].tensor();
    auto it = made_by.find(t.get());
    if (it == made_by.end()) continue;
    auto [ks, j] = it->second;
    KernelCall& kc = fp.kernels[steps[ks].kernel];
    if (t->dtype != x->dtype || t->shape != x->shape || returned_set.count(t.get())) continue;
    if (inputs_per_storage[x->storage_id] != 1) continue;
    const kir::Buffer& ob = kc.kernel.buffers[kc.kernel.num_inputs() + j];
    if (ob.strides != x->strides) continue;
    // Nothing after the kernel reads x or t (but this copy).
    bool read_later = false;
    for (size_t s = ks + 1; s < steps.size() && !read_later; ++s) {
      if (s == c || steps[s].dropped) continue;
      // `return x` reads x after the epilogue write anyway.
      if (steps[s].kernel < 0 && !steps[s].is_owned && steps[s].bsym->def().has(tags::Ret))
        continue;
      for (const auto& in : step_inputs(steps[s], fp))
        if (in.get() == x.get() || in.get() == t.get()) read_later = true;
    }
    if (read_later) continue;
    int xbuf = -1;
    for (size_t b = 0; b < kc.inputs.size(); ++b)
      if (kc.inputs[b].get() == x.get()) xbuf = static_cast<int>(b);
    if (!reads_only_where_it_writes(kc.kernel, xbuf, j)) continue;
    kc.write_into[j] = x;
    if (xbuf >= 0) kc.kernel.noalias = false;
    steps[c].dropped = true;
  }
}

// A boxed program (a backward: it holds the only references to its saved tensors) lets a
// kernel write an output into the memory of a donatable input it reads for the last time, as
// AOTAutograd's donated buffers: the cross-entropy backward's gradient of the logits takes the
// logits' memory instead of holding both (256 MiB each in the LLaMA step). The kernel must
// read that input only at the element it writes, with the output's layout. The program hands
// such an input over in a one-element list, dropping its own name for it, and the kernel takes
// its memory only when nothing else references the tensor (bind_fusion.cpp: lendable; with
// retain_graph, autograd still holds it), else allocates as usual.
void donate(std::vector<PStep>& steps, FusedProgram& fp, const Trace& trace, const std::vector<bool>& donatable) {
  std::unordered_set<const TensorProxy*> candidates;
  for (size_t i = 0; i < trace.inputs.size() && i < donatable.size(); ++i)
    if (donatable[i]) candidates.insert(trace.inputs[i].get());
  if (candidates.empty()) return;
  // The last step naming each tensor (the return is a step: what it returns is never lent).
  std::unordered_map<const TensorProxy*, size_t> last;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].dropped) continue;
    for (const auto& in : step_inputs(steps[s], fp)) last[in.get()] = s;
    if (steps[s].kernel >= 0)
      for (const auto& t : fp.kernels[steps[s].kernel].write_into)
        if (t) last[t.get()] = s;
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].dropped || steps[s].kernel < 0) continue;
    KernelCall& kc = fp.kernels[steps[s].kernel];
    std::vector<bool> lent(kc.inputs.size(), false);
    for (size_t j = 0; j < kc.outputs.size(); ++j) {
      if (kc.write_into[j]) continue;
      const kir::Buffer& ob = kc.kernel.buffers[kc.kernel.num_inputs() + j];
      for (size_t b = 0; b < kc.inputs.size(); ++b) {
        const TensorRef& x = kc.inputs[b];
        if (lent[b] || !candidates.count(x.get()) || last.at(x.get()) != s) continue;
        if (std::count(kc.inputs.begin(), kc.inputs.end(), x) != 1) continue;
        if (x->dtype != ob.dtype || x->shape != ob.shape || !x->is_contiguous() ||
            x->strides != ob.strides || kc.kernel.buffers[b].strides != ob.strides)
          continue;
        if (!reads_only_where_it_writes(kc.kernel, static_cast<int>(b), static_cast<int>(j))) continue;
        kc.donor[j] = static_cast<int>(b);
        kc.kernel.noalias = false;
        lent[b] = true;
        break;
      }
    }
  }
}

std::string names(const std::vector<TensorRef>& ts) {
  std::string s;
  for (const auto& t : ts) s += t->name + ", ";
  return s;
}

} // namespace

FusedProgram fused_program(const Trace& trace, const std::string& name, const FusionOptions& opt) {
  FusedProgram fp;
  std::vector<TensorRef> returned;
  trace.output().collect_tensors(returned);
  std::vector<PStep> steps;
  int region = 0;
  for (const auto& b : trace.bsyms) {
    const OpDef& d = b.def();
    bool region_like = d.has(tags::F) || (!d.has(tags::Ret) && fusible(b, returned));
    auto dev = device_of(b);
    bool claim = region_like && dev &&
                 ((dev->type == DeviceType::CPU && opt.cpu) ||
                  (dev->type == DeviceType::CUDA && opt.cuda));
    std::vector<BoundSymbol> prims;
    if (claim) {
      if (d.has(tags::F)) {
        // A member a kernel cannot compute whole runs through torch as itself (torch.randn
        // draws what eager draws; its prims would not).
        for (const auto& m : b.subsymbols) {
          std::vector<BoundSymbol> mp;
          flatten(m, mp);
          drop_inner_detaches(mp, m.outputs());
          bool all = true;
          for (const auto& p : mp) all = all && kernel_supports(p);
          if (all) {
            for (auto& p : mp) prims.push_back(std::move(p));
          } else {
            BoundSymbol whole = m;
            whole.subsymbols.clear();
            prims.push_back(std::move(whole));
          }
        }
        drop_inner_detaches(prims, b.outputs());
      } else {
        flatten(b, prims);
        drop_inner_detaches(prims, b.outputs());
      }
      // Only regions that compute: a lone view stays a (free) torch view. A reshape of an
      // expanded tensor (repeat_kv's expand + reshape) copies whatever the layout of what it
      // expands, and a kernel makes that copy at bandwidth with the reshape's index remap
      // (torch's strided copy kernel reaches about half of it on the H100). Other reshapes
      // the trace says must copy stay torch's: the trace's layout of an opaque op's result
      // (SDPA's) may not be the one torch gives, where torch.reshape is a free view and a
      // kernel would first copy its input into the inferred layout. A lone symbol is claimed
      // only when a kernel computes all of it (else torch runs it whole).
      auto copies_an_expand = [](const BoundSymbol& p) {
        if (p.op != OpId::prim_reshape) return false;
        const auto& in = p.args[0].tensor();
        for (int64_t d = 0; d < in->ndim(); ++d)
          if (in->shape[d] > 1 && in->strides[d] == 0) return true;
        return false;
      };
      bool computes = false, all = true;
      for (const auto& p : prims) {
        bool ks = kernel_supports(p);
        all = all && ks;
        if ((p.def().has(tags::E | tags::R | tags::Scan) || copies_an_expand(p)) &&
            p.op != OpId::prim_restride && ks)
          computes = true;
      }
      claim = computes && (d.has(tags::F) || all);
      hoist_input_views(prims);
      // A kernel reads memory on its own device only (eager lets a CPU 0-d tensor join CUDA
      // math; torch runs such a region).
      for (const auto& p : prims) {
        for (const auto& t : p.inputs()) claim = claim && t->device == *dev;
        for (const auto& t : p.outputs()) claim = claim && t->device == *dev;
      }
    }
    if (!claim) {
      PStep s;
      s.bsym = &b;
      steps.push_back(std::move(s));
      continue;
    }
    std::vector<TensorRef> needed = b.outputs();
    const std::string prefix = "k" + std::to_string(region++) + "_";
    LoweredRegion lr = lower_region(prims, needed, dev->type, prefix, opt.kernel_stages);
    if (opt.cuda_twins && dev->type == DeviceType::CPU) {
      LoweredRegion twin = lower_region(prims, needed, DeviceType::CUDA, prefix);
      KR_INTERNAL(twin.kernels.size() == lr.kernels.size(),
                  "fusion: a region lowers to different kernels for CPU and CUDA");
      for (size_t i = 0; i < lr.kernels.size(); ++i)
        lr.kernels[i].cuda_twin =
            std::make_shared<const kir::Kernel>(std::move(twin.kernels[i].kernel));
    }
    int base = static_cast<int>(fp.kernels.size());
    for (auto& k : lr.kernels) fp.kernels.push_back(std::move(k));
    for (auto& st : lr.steps) {
      PStep s;
      if (st.kernel >= 0) {
        s.kernel = base + st.kernel;
      } else {
        s.owned = std::move(st.bsym);
        s.is_owned = true;
      }
      steps.push_back(std::move(s));
    }
  }
  reinplace(steps, fp, trace);
  view_reshapes(steps, trace);
  if (opt.boxed) donate(steps, fp, trace, opt.donatable);

  ProgramWriter w(name, trace.inputs, opt.boxed);
  for (const auto& s : steps) {
    if (s.dropped) continue;
    if (s.kernel >= 0) {
      const KernelCall& kc = fp.kernels[s.kernel];
      std::vector<TensorRef> fresh, into;
      for (size_t j = 0; j < kc.outputs.size(); ++j)
        (kc.write_into[j] ? into : fresh).push_back(kc.write_into[j] ? kc.write_into[j] : kc.outputs[j]);
      std::string args = names(kc.inputs) + names(into);
      if (args.size() >= 2) args.resize(args.size() - 2);
      std::string text = "  ";
      if (!fresh.empty()) text += names(fresh) + "= ";
      text += kc.kernel.name + "(" + args + ")\n";
      std::vector<TensorRef> reads = kc.inputs;
      reads.insert(reads.end(), into.begin(), into.end());
      for (int d : kc.donor)
        if (d >= 0) {
          // Handed over in a list: the kernel may take its memory (donate above).
          const std::string& n = kc.inputs[d]->name;
          w.add("  " + n + " = [" + n + "]\n", {kc.inputs[d]}, {});
        }
      w.add(std::move(text), reads, fresh);
      continue;
    }
    const BoundSymbol& b = s.is_owned ? s.owned : *s.bsym;
    if (s.as_view) {
      w.add("  " + b.out.str() + " = _prims.reshape_view(" + format_call_args(b.def(), b.args) + ")\n",
            b.inputs(), b.outputs());
      continue;
    }
    w.add_torch(b);
  }
  fp.source = w.str();
  return fp;
}

} // namespace keraunos::codegen
