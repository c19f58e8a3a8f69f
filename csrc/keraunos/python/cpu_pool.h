// The CPU buffer pool: the memory of the tensors keraunos' CPU programs make (kernel outputs,
// matmul results) of 64 KiB or more is kept for reuse once every tensor on it has died, as
// PyTorch's CUDA caching allocator keeps freed device memory.
//
// Why: glibc returns the top of its heap to the system when a large enough block there is
// freed (M_TRIM_THRESHOLD), and the next allocation that grows the heap again pays a page
// fault (and the page's zeroing) for every 4 KiB it touches first. A training step allocates
// and frees its activations and gradients in a pattern that trims and regrows the heap every
// step: one LLaMA-style block on the CPU took ~900 faults per step under keraunos (~3 µs each
// on a virtual machine), ~100 under torch.compile, whose generated code reuses dead buffers.
//
// A pooled storage is held by the pool (its Python object, which holds one reference) and
// handed out again, for a request of the same byte size, when no tensor or view uses it (the
// storage's use count is 1) and nobody else holds its Python object (which torch hands to
// every untyped_storage() call: its reference count is the pool's only). The pool keeps at most kCapBytes; beyond,
// allocations are plain ones. KERAUNOS_CPU_POOL=0 turns it off; keraunos.empty_cpu_pool()
// releases what it holds. Everything runs under the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

namespace keraunos::py {

// Requests below this many bytes are plain allocations (glibc serves them from its bins).
inline constexpr int64_t kPoolMinBytes = int64_t{64} << 10;

// A tensor of `shape` and `strides` (tuples) and `dtype` on a free pooled storage of exactly
// `nbytes`, or on a fresh one the pool then keeps; a null object when the pool is off, full or
// `nbytes` is below kPoolMinBytes (the caller allocates as before).
nanobind::object pooled_empty(nanobind::handle shape, nanobind::handle strides,
                              nanobind::handle dtype, int64_t nbytes);

} // namespace keraunos::py
