#include "keraunos/codegen/kernel_passes.h"

#include "keraunos/codegen/reuse_reduced_values.h"

namespace keraunos::codegen {

const std::vector<KernelPass>& kernel_passes() {
  static const std::vector<KernelPass> passes = {
      {"fuse_sibling_reductions", true, true,
       [](kir::Kernel& k) { kir::fuse_sibling_reductions(k.body); },
       "merges independent Reduce loops of one extent into one pass over the row"},
      // CPU kernels re-read a row from cache cheaply; GPU kernels prefer recomputing a value
      // over storing and reloading it.
      {"reuse_reduced_values", true, false, [](kir::Kernel& k) { reuse_reduced_values(k); },
       "stores a costly value a reduction loop computed; the pointwise loop reloads it"},
      {"hoist_invariants", true, true,
       [](kir::Kernel& k) { kir::hoist_invariants(k.body, k.device == DeviceType::CPU); },
       "moves lets (and on the CPU loads) that are constant per outer point out of Reduce and "
       "Inner loops"},
  };
  return passes;
}

void run_kernel_passes(kir::Kernel& k, std::vector<KernelStage>* stages) {
  if (stages) stages->push_back({"lower", k.str()});
  for (const KernelPass& p : kernel_passes()) {
    if (!(k.device == DeviceType::CPU ? p.cpu : p.cuda)) continue;
    p.run(k);
    if (stages) stages->push_back({std::string(p.name), k.str()});
  }
}

} // namespace keraunos::codegen
