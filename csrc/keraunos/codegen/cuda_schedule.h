// The CUDA emitter's schedules share these: the loop-tree analysis, the printer of
// statements, the row (block / cluster) plans and the entry points of each schedule's file
// (cuda_pointwise.cpp, cuda_row_plan.cpp, cuda_row_kernel.cpp). Internal to codegen.
#pragma once
#include "keraunos/codegen/cuda_emitter.h"
#include "keraunos/codegen/kernel_ir.h"
#include "keraunos/ir/error.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace keraunos::codegen::cudagen {


using kir::Block;
using kir::Index;
using kir::Kernel;
using kir::Loop;
using kir::LoopKind;
using kir::Stmt;

// Iteration spaces and indices below this use 32-bit math: a grid stride (< 2^31) added to an
// index below 2^30 cannot wrap an unsigned.
constexpr int64_t kNarrowLimit = int64_t{1} << 30;
constexpr int kPointwiseThreads = 256;
// Values per thread kept in registers for a row (block schedule): a block of 1024 threads has
// 64 registers per thread, one of 512 has 128.
inline int register_cache_max(int threads) { return threads <= 512 ? 32 : 16; }
constexpr int kWarpPointsPerBlock = 4;
// Rows longer than this go to the cluster schedule on sm_90+ (a block of 512 threads keeps up
// to 32 values per thread, 16k per row, in registers).
constexpr int64_t kBlockRowMax = 16384;
constexpr int kMaxCluster = 8; // the portable cluster size

// ---------------------------------------------------------------------------------------------
// The shape of the loop tree.

inline void visit(const Block& b, const std::function<void(const Stmt&)>& f) {
  for (const Stmt& s : b) {
    f(s);
    if (s.kind == Stmt::Kind::Loop) visit(s.loop->body, f);
  }
}

// A loop and the single-child loops of the same kind directly nested in it, flattened into one
// iteration space (outermost first); `body` is the innermost loop's body.
struct LoopNest {
  std::vector<const Loop*> loops;
  const Block* body = nullptr;
  int64_t extent = 1;
  LoopKind kind = LoopKind::Inner;
};

inline LoopNest nest_of(const Loop* l) {
  LoopNest n;
  n.kind = l->kind;
  for (;;) {
    n.loops.push_back(l);
    n.extent *= l->extent;
    if (l->body.size() != 1 || l->body[0].kind != Stmt::Kind::Loop ||
        l->body[0].loop->kind != n.kind)
      break;
    l = l->body[0].loop.get();
  }
  n.body = &l->body;
  return n;
}

struct Analysis {
  LoopNest grid;                 // the Parallel loops mapped to the grid (none for 0-d)
  const Block* point = nullptr;  // what one outer point runs
  int64_t points = 1;
  bool nested = false;           // the point body has loops
  bool wide = false;             // 64-bit index math
  std::map<std::string, int64_t> extents;
  std::map<std::string, DType> acc_dtypes;
};

// Whether `ix` reads the same place for every outer point (a row's weight): it uses none of
// the grid's variables.
inline bool row_invariant(const Analysis& a, const Index& ix) {
  if (!ix.affine()) return false; // an opaque part may use them (or a gathered index)
  for (const auto& [var, coef] : ix.terms)
    for (const Loop* l : a.grid.loops)
      if (l->var == var) return false;
  return true;
}

inline int64_t index_bound(const Index& ix, const std::map<std::string, int64_t>& extents) {
  int64_t bound = ix.constant < 0 ? -ix.constant : ix.constant;
  for (const auto& [var, coef] : ix.terms) {
    auto it = extents.find(var);
    KR_INTERNAL(it != extents.end(), "CUDA emitter: index uses '", var, "', not a loop variable");
    const int64_t c = coef < 0 ? -coef : coef;
    if (it->second > 0 && c > (INT64_MAX - bound) / it->second) return INT64_MAX;
    bound += c * std::max<int64_t>(it->second - 1, 0);
  }
  return bound;
}

inline Analysis analyze(const Kernel& k) {
  Analysis a;
  if (k.body.size() == 1 && k.body[0].kind == Stmt::Kind::Loop &&
      k.body[0].loop->kind == LoopKind::Parallel) {
    a.grid = nest_of(k.body[0].loop.get());
    a.point = a.grid.body;
    a.points = a.grid.extent;
  } else {
    a.point = &k.body;
  }
  visit(k.body, [&](const Stmt& s) {
    if (s.kind == Stmt::Kind::Loop) {
      a.extents[s.loop->var] = s.loop->extent;
      a.wide |= s.loop->extent >= kNarrowLimit;
    }
    if (s.kind == Stmt::Kind::AccInit) a.acc_dtypes[s.acc.var] = s.acc.dtype;
  });
  for (const Stmt& s : *a.point) a.nested |= s.kind == Stmt::Kind::Loop;
  a.wide |= a.points >= kNarrowLimit;
  visit(k.body, [&](const Stmt& s) {
    const Index* ix = s.kind == Stmt::Kind::Load    ? &s.load.index
                      : s.kind == Stmt::Kind::Store ? &s.store.index
                                                    : nullptr;
    if (!ix) return;
    // An opaque part may compute intermediates larger than the index: 64-bit unless each of
    // them stays in range (a cat's clamped reads, divisions by constants).
    int64_t bound = index_bound(*ix, a.extents);
    if (ix->opaque) {
      auto range = kir::int_range(
          ix->opaque,
          [&](const std::string& v) -> std::optional<kir::Range> {
            auto it = a.extents.find(v);
            if (it == a.extents.end()) return std::nullopt;
            return kir::Range{0, std::max<int64_t>(it->second - 1, 0)};
          },
          kNarrowLimit);
      bound = !range ? INT64_MAX
                     : bound + std::max(range->first < 0 ? -range->first : range->first,
                                        range->second < 0 ? -range->second : range->second);
    }
    a.wide |= bound >= kNarrowLimit;
  });
  return a;
}

// ---------------------------------------------------------------------------------------------
// Printing.

struct Out {
  std::ostringstream os;
  void line(int depth, const std::string& s) { os << std::string(2 * depth, ' ') << s << '\n'; }
};

inline const char* op_macro(kir::ReduceOp op) {
  switch (op) {
  case kir::ReduceOp::Sum:
    return "KR_SUM";
  case kir::ReduceOp::Prod:
    return "KR_PROD";
  case kir::ReduceOp::Max:
    return "KR_MAX";
  case kir::ReduceOp::Min:
    return "KR_MIN";
  }
  return "?";
}

inline std::string load_conv(DType storage, DType compute, const std::string& e) {
  if (storage == DType::Float16) return "kr_h2f(" + e + ")";
  if (storage == DType::BFloat16) return "kr_bf2f(" + e + ")";
  if (storage == compute) return e;
  return std::string("(") + kir::ctype(compute) + ")(" + e + ")";
}

inline std::string store_conv(DType storage, const std::string& e) {
  if (storage == DType::Float16) return "kr_f2h(" + e + ")";
  if (storage == DType::BFloat16) return "kr_f2bf(" + e + ")";
  return std::string("(") + kir::ctype(storage) + ")(" + e + ")";
}

using Rename = std::map<std::string, std::string>;

inline std::string index_expr(const Index& ix, const Rename& rename = {}) {
  std::string s;
  for (const auto& [var, coef] : ix.terms) {
    auto it = rename.find(var);
    const std::string& v = it == rename.end() ? var : it->second;
    const int64_t c = coef < 0 ? -coef : coef;
    if (s.empty())
      s = coef < 0 ? "-" : "";
    else
      s += coef < 0 ? " - " : " + ";
    s += c == 1 ? v : std::to_string(c) + " * " + v;
  }
  if (ix.opaque) {
    const kir::Expr o = kir::substitute(ix.opaque, [&](const kir::ExprNode& x) -> kir::Expr {
      auto it = rename.find(x.name);
      return it == rename.end() ? nullptr : kir::var(it->second, x.dtype);
    });
    s += (s.empty() ? "(" : " + (") + kir::c_text(o) + ")";
  }
  if (ix.constant != 0 || s.empty()) {
    if (s.empty())
      s = std::to_string(ix.constant);
    else
      s += (ix.constant < 0 ? " - " : " + ") +
           std::to_string(ix.constant < 0 ? -ix.constant : ix.constant);
  }
  return s;
}

struct Emitter {
  const Kernel& k;
  const Analysis& a;
  Out& out;
  // Statements printed differently (or not at all, when empty) by the current schedule.
  std::map<const Stmt*, std::string> replace;
  // Extra lines printed right after a statement.
  std::map<const Stmt*, std::string> after;

  std::string vt() const { return a.wide ? "int64_t" : "int"; }      // loop variables
  std::string ft() const { return a.wide ? "uint64_t" : "unsigned"; } // flat indices
  std::string fsuf() const { return a.wide ? "ul" : "u"; }

  std::string load_line(const kir::Load& l, const Rename& rename = {}) const {
    const kir::Buffer& b = k.buffers.at(l.buffer);
    return std::string("const ") + kir::ctype(l.dtype) + " " + l.var + " = " +
           load_conv(b.dtype, l.dtype, b.name + "[" + index_expr(l.index, rename) + "]") + ";";
  }
  std::string store_line(const kir::Store& s) const {
    const kir::Buffer& b = k.buffers.at(s.buffer);
    return b.name + "[" + index_expr(s.index) + "] = " + store_conv(b.dtype, s.value) + ";";
  }
  DType acc_dtype(const std::string& var) const {
    auto it = a.acc_dtypes.find(var);
    KR_INTERNAL(it != a.acc_dtypes.end(), "CUDA emitter: update of undeclared accumulator ", var);
    return it->second;
  }

  // Statements, run by one thread in order.
  void serial(const Block& b, int d) {
    for (const Stmt& s : b) {
      if (auto it = replace.find(&s); it != replace.end()) {
        if (!it->second.empty()) out.line(d, it->second);
      } else {
        stmt(s, d);
      }
      if (auto it = after.find(&s); it != after.end()) out.line(d, it->second);
    }
  }

  void stmt(const Stmt& s, int d) {
    switch (s.kind) {
    case Stmt::Kind::Loop: {
      const Loop& l = *s.loop;
      out.line(d, "for (" + vt() + " " + l.var + " = 0; " + l.var + " < " +
                      std::to_string(l.extent) + "; ++" + l.var + ") {");
      serial(l.body, d + 1);
      out.line(d, "}");
      break;
    }
    case Stmt::Kind::Load:
      out.line(d, load_line(s.load));
      break;
    case Stmt::Kind::Let:
      out.line(d, std::string("const ") + kir::ctype(s.let.dtype) + " " + s.let.var + " = " +
                      kir::c_text(s.let.expr) + ";");
      break;
    case Stmt::Kind::AccInit: {
      const std::string t = kir::ctype(s.acc.dtype);
      out.line(d, t + " " + s.acc.var + " = kr_identity<" + op_macro(s.acc.op) + ", " + t +
                      ">();");
      break;
    }
    case Stmt::Kind::AccUpdate: {
      const std::string t = kir::ctype(acc_dtype(s.update.var));
      out.line(d, s.update.var + " = kr_combine<" + op_macro(s.update.op) + ", " + t + ">(" +
                      s.update.var + ", " + s.update.value + ");");
      break;
    }
    case Stmt::Kind::Store:
      out.line(d, store_line(s.store));
      break;
    }
  }

  // Declares the variables of `dims` (outermost first) from the flat index `flat`.
  void recover(const std::vector<std::pair<std::string, int64_t>>& dims, const std::string& flat,
               int d) {
    if (dims.empty()) return;
    std::string rest = flat;
    for (size_t j = dims.size() - 1; j > 0; --j) {
      const std::string e = std::to_string(dims[j].second) + fsuf();
      out.line(d, "const " + vt() + " " + dims[j].first + " = (" + vt() + ")(" + rest + " % " +
                      e + ");");
      const std::string q = "kr_q_" + dims[j].first;
      out.line(d, "const " + ft() + " " + q + " = " + rest + " / " + e + ";");
      rest = q;
    }
    out.line(d, "const " + vt() + " " + dims[0].first + " = (" + vt() + ")" + rest + ";");
  }

  std::string params() const {
    std::string p;
    for (const kir::Buffer& b : k.buffers) {
      if (!p.empty()) p += ", ";
      // No __restrict__ when an output shares memory with an input (reinplaced writes).
      p += std::string(b.output ? "" : "const ") + kir::ctype(b.dtype) +
           (k.noalias ? "* __restrict__ " : "* ") + b.name;
    }
    return p;
  }
};

inline std::vector<std::pair<std::string, int64_t>> dims_of(const LoopNest& n) {
  std::vector<std::pair<std::string, int64_t>> dims;
  for (const Loop* l : n.loops) dims.emplace_back(l->var, l->extent);
  return dims;
}

// One store of a vectorized trip: the lanes' values gathered in a kr_vec and written with one
// access after the lanes ran (`after` receives that line); returns the lane's statement.
// bfloat16 lanes are kept in float (bfloat16 stores round through float anyway) and rounded
// two at a time (kr_pack_bf16: one cvt per pair, already packed).
// A value the lowering already rounded to bfloat16 for this store (a let of the form
// (float)(kr_bf2f(kr_f2bf((float)(X))))) is stored as X: rounding twice rounds once.
inline std::string vector_store(Emitter& e, const kir::Buffer& b, const kir::Store& st,
                         const std::string& reg, int lanes,
                         const std::map<std::string, std::string>& base, int d,
                         std::vector<std::string>& after, const Block& body,
                         bool stream = false) {
  const std::string n = std::to_string(lanes);
  const std::string store = stream ? "kr_store_vec_cs<" : "kr_store_vec<";
  const std::string ptr = b.name + " + " + index_expr(st.index, base);
  if (b.dtype == DType::BFloat16 && lanes % 2 == 0) {
    std::string value = st.value;
    for (const Stmt& s : body) {
      if (s.kind != Stmt::Kind::Let || s.let.var != st.value || s.let.dtype != DType::Float32)
        continue;
      const kir::Expr& x = s.let.expr; // kr_bf2f(kr_f2bf(X))?
      if (x->kind == kir::ExprKind::Call && x->name == "kr_bf2f" &&
          x->args[0]->kind == kir::ExprKind::Call && x->args[0]->name == "kr_f2bf")
        value = kir::c_text(x->args[0]->args[0]);
    }
    e.out.line(d, "float " + reg + "[" + n + "];");
    after.push_back(store + "unsigned, " + std::to_string(lanes / 2) +
                    ">(reinterpret_cast<unsigned*>(" + ptr + "), kr_pack_bf16<" + n + ">(" + reg +
                    "));");
    return reg + "[kr_l] = (float)(" + value + ");";
  }
  const std::string t = kir::ctype(b.dtype);
  e.out.line(d, "kr_vec<" + t + ", " + n + "> " + reg + ";");
  after.push_back(store + t + ", " + n + ">(" + ptr + ", " + reg + ");");
  return reg + ".v[kr_l] = " + store_conv(b.dtype, st.value) + ";";
}

inline unsigned clamp_grid(int64_t blocks) {
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 0x7fffffff));
}

// ---------------------------------------------------------------------------------------------
// One block (or one warp) per outer point.

struct BlockPlan {
  int threads = 0; // per block
  int points_per_block = 1;
  // Blocks of a thread-block cluster (sm_90+) sharing one outer point: its loops are strided
  // over cluster * threads threads and accumulators all-reduced over the cluster through
  // distributed shared memory.
  int cluster = 1;
  // Bytes of dynamic shared memory the row cache may use; 0: the cache lives in registers.
  int64_t smem_cache_bytes = 0;
  int64_t reg_values = 0; // values per thread the register cache may hold
  bool prefetch = false;   // fill shared-memory row caches with cp.async, a row ahead
  int min_blocks = 0;      // block schedule: blocks per SM asked of __launch_bounds__ (0: none)
  bool async_reduce = false; // cluster all-reduces through st.async + mbarriers (no barriers)
  // With async_reduce: a variance's two sums, softmax's max and sum of exp, in one round
  // (MergedPair).
  bool merge_variance = false, merge_softmax = false;
  bool reuse_values = true;  // keep expensive values computed again by later loops in registers
  bool persist = false;      // block schedule: persistent blocks (block_persist)
  int cache_hints = 0;       // CudaDeviceInfo::cache_hints (buffers that do not alias)
  // Persistent clusters: shared memory a block may give to operands every row reads at the same
  // place (layer_norm's weight), copied in once before the first row (0: none).
  int64_t hoist_smem_bytes = 0;
  int row_threads() const { return threads * cluster; }
  // The thread's index among the row's threads.
  std::string row_tid() const { return cluster > 1 ? "kr_rt" : "kr_tid"; }
};

// Whether a load of a vectorized nest reads `vec` consecutive elements (one kr_vec access).
inline bool vector_access(const Index& ix, const LoopNest& nest) {
  return ix.affine() && ix.coef(nest.loops.back()->var) == 1;
}


// Point-level loads that several loops of a row read at the same index are kept in registers:
// each thread's values live in a local array indexed by the (fully unrolled) trip number.
// With a shared-memory budget the arrays live in dynamic shared memory instead (rows too long
// for registers, cluster schedule): value `slot` of thread kr_tid at [slot * threads + kr_tid],
// so a warp's accesses hit consecutive banks.
//
// Shared-memory arrays of vectorized nests use a vector layout instead: trip kr_k's group of
// `vec` values of thread kr_tid at [(kr_k * threads + kr_tid) * vec], read and written with one
// 16-byte access (conflict-free: a quarter warp covers all banks once). Those the row prefetch
// fills (`async`) are copied in with cp.async, each thread copying the values it will read.
struct RegisterCache {
  std::map<const Stmt*, std::string> first; // load stmt -> array it fills
  std::map<const Stmt*, std::string> reuse; // load stmt -> array it reads
  std::vector<std::string> decls;
  bool smem = false;
  int threads = 0;            // per block
  int64_t smem_bytes = 0;     // dynamic shared memory the arrays take
  std::map<std::string, int> vec; // shared-memory arrays in the vector layout: their width
  // Vector-layout arrays that hold only their first trips (a row-invariant operand that did not
  // fit whole): later trips read the buffer itself.
  std::map<std::string, int64_t> held_trips;
  std::set<std::string> async;    // arrays filled by cp.async (row prefetch)
  // Register caches of computed values (plan_value_reuse): let stmt -> array it fills / reads.
  std::map<const Stmt*, std::string> let_first, let_reuse;
  // Register arrays of float16/bfloat16 rows (filled by vector loads) that hold the stored bits
  // rather than the floats they load as, two values to a 32-bit word (kr_put_words), converted
  // at each read (one instruction): a row of 32 values per thread takes 16 registers instead of
  // 32, and more rows fit on an SM. Array -> storage dtype.
  std::map<std::string, DType> raw;
  std::string at(const std::string& arr, const std::string& slot) const {
    if (!smem) return arr + "[" + slot + "]";
    return arr + "[(" + slot + ") * " + std::to_string(threads) + " + kr_tid]";
  }
  // The value `load` reads, from array `arr`.
  std::string read(const std::string& arr, const std::string& slot, const Stmt& load) const {
    auto r = raw.find(arr);
    if (r == raw.end()) return at(arr, slot);
    return load_conv(r->second, load.load.dtype,
                     "kr_word_half(" + arr + "[(" + slot + ") / 2], (" + slot + ") & 1)");
  }
  // Fills `vec` values of raw array `arr` from vector `reg` at value `first` (a multiple of vec).
  std::string put_words(const std::string& arr, const std::string& first, int vec,
                        const std::string& reg) const {
    return "kr_put_words<" + std::to_string(vec) + ">(" + arr + " + (" + first + ") / 2, " + reg +
           ");";
  }
  // Trip kr_k's group of thread kr_tid (vector layout).
  std::string vec_ptr(const std::string& arr) const {
    return arr + " + (kr_k * " + std::to_string(threads) + " + kr_tid) * " +
           std::to_string(vec.at(arr));
  }
};

// Values of a nest each thread handles: trips of one element, or of `vec` consecutive ones.
inline int64_t values_per_thread(const LoopNest& nest, int threads, int vec) {
  if (vec <= 1) return (nest.extent + threads - 1) / threads;
  return (nest.extent / vec + threads - 1) / threads * vec;
}

// One cached row's copy for the row prefetch: the fill load and its (vectorized) nest.
struct AsyncFill {
  const Stmt* load;
  const LoopNest* nest;
  std::string arr;
};

// Two reduction loops of a row whose results the cluster all-reduces in one round instead of
// two: each thread reduces its values in the first loop, runs the second on its own partial
// result, and the (first, second) pairs merge across the cluster; the lets between the loops
// then run on the merged results.
//  - Moments: a variance's passes (Loop::deviations): the sum, then the squared deviations from
//    the thread's own mean; pairs merge by Chan's formula (kr_cluster_moments_async), which
//    weighs them by their counts: every thread must hold as many values.
//  - ExpSum: softmax's max, then the sum of exp(x - max) (the lowering's casts aside); pairs
//    merge by rescaling to the larger max (kr_cluster_expsum_async), for any counts.
// Float accumulators, loops of one shape over the same values, and a second loop that stores
// nothing and reads no let between them but the one that carries the first loop's result.
struct MergedPair {
  enum class Kind { Moments, ExpSum } kind;
  const Stmt* first_loop;
  const Stmt* second_loop;
  std::string first, second; // accumulators
  std::string carrier;       // the let between them that the second loop reads
  std::string count;         // Moments: values per thread, a float literal
  std::vector<const Stmt*> between; // the lets between the loops
};

// ---------------------------------------------------------------------------------------------
// The schedules' entry points.


CudaLaunch grid_stride_launch(int64_t work);


void emit_grid_stride(Emitter& e, const std::string& name, int threads);
// Column reductions (cuda_pointwise.cpp): a block of 32 x ny threads takes 32 neighbouring
// outer points (threadIdx.x; their loads coalesce) and splits each point's reduction loops ny
// ways (threadIdx.y), combining the parts through shared memory. For points whose loops read
// along the outer points (a bias gradient's sum over rows) when there are too few points for
// one thread each to fill the device. With cl > 1 (sm_90+), a cluster of cl blocks along y
// splits the rows as well, the blocks' partials combined over distributed shared memory.
bool column_schedulable(const Analysis& a);
void emit_column_kernel(Emitter& e, const std::string& name, int ny, int cl);


// A load of a cat's part along the innermost grid loop (kir::ExprKind::Clamp); see
// cuda_pointwise.cpp.
struct ClampedRun {
  kir::Expr e;
  int64_t lo, hi;
};
std::optional<ClampedRun> clamped_run(const Index& ix, const std::string& v, int vec);

// The vectorized pointwise variant: each thread and trip handles `vec` consecutive elements of
// the innermost grid loop (cat parts included). Returns 0 when the kernel does not qualify.
int vector_width(const Kernel& k, const Analysis& a);


void emit_vectorized(Emitter& e, const std::string& name, int vec, int threads);


RegisterCache plan_cache(const Emitter& e, const std::vector<LoopNest>& nests,
                         const BlockPlan& plan, const std::vector<int>& vecs);


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
                      const std::vector<int>& vecs, RegisterCache& c);


// The vectorized block variant: in a Reduce/Inner nest whose innermost loop variable has
// coefficient 1 in an access, each thread handles `vec` consecutive elements per trip, read and
// written with one kr_vec access per buffer. One width for the kernel, 16 bytes over the widest
// item read or written along a loop (8 for bfloat16, 4 for float32), so that the register cache
// sees the same elements per thread in every nest. A nest runs vectorized when its innermost
// extent is a multiple of the width, every unit-stride access keeps the alignment (its other
// coefficients and its constant are multiples of the width), every store is unit-stride, and it
// holds no further loops. Other loads of a vectorized nest (broadcasts, strided, opaque) stay
// scalar, per lane. Returns the width per nest (0: scalar); all 0 when none qualifies.
std::vector<int> block_vector_plan(const Kernel& k, const std::vector<LoopNest>& nests);


// Collects the Reduce/Inner nests of an outer point, in order.
std::vector<LoopNest> point_nests(const Analysis& a);


// One vectorized nest of the block variant: trip kr_k of thread kr_tid handles the group
// kr_g = kr_tid + kr_k * threads of `vec` consecutive innermost elements; its unit-stride loads
// are read with kr_load_vec before the lanes run, its stores written with kr_store_vec after.
void emit_vector_nest(Emitter& e, const LoopNest& nest, const BlockPlan& plan, int vec,
                      const RegisterCache& cache,
                      const std::vector<std::string>& trip_tail = {});


// Issues the cp.async copies of `fills` for outer point `point` (an expression; nothing when it
// is past the last point) and commits them as one group: each thread copies the groups of
// `vec` values it will read from the vector layout (RegisterCache::vec_ptr).
void emit_prefetch(Emitter& e, const BlockPlan& plan, const RegisterCache& cache,
                   const std::vector<AsyncFill>& fills, const std::string& point, int d);


std::vector<MergedPair> merged_pairs(const Emitter& e, const std::vector<LoopNest>& nests,
                                     const std::map<const Stmt*, size_t>& nest_of_stmt,
                                     const std::vector<int>& vecs, int rt, bool variance,
                                     bool softmax);


// A scan along a row run by one block per outer point (cuda_scan.cpp): the point is
// [AccInit, Scan loop]; the loop's statements before its one update (the element's value) and
// after it (reading the running sum, never a value from before it).
struct ScanPlan {
  const Loop* loop = nullptr;
  std::string acc;
  int update = -1; // index of the AccUpdate in the loop's body
  int threads = 0;
};
std::optional<ScanPlan> scan_plan(const Analysis& a);
void emit_scan_block(Emitter& e, const std::string& name, const ScanPlan& plan);

// `vecs` empty: the scalar variant; otherwise the width per nest (block_vector_plan).
// `smem_bytes`: the dynamic shared memory the kernel needs at launch.
void emit_block_kernel(Emitter& e, const std::string& name, const BlockPlan& plan,
                       int64_t& smem_bytes, const std::vector<int>& vecs_in = {});

} // namespace keraunos::codegen::cudagen
