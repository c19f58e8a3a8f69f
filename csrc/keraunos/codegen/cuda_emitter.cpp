#include "keraunos/codegen/cuda_emitter.h"

#include "keraunos/codegen/embedded.h"
#include "keraunos/ir/error.h"
#include "keraunos/support/options.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace keraunos::codegen {

namespace {

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
int register_cache_max(int threads) { return threads <= 512 ? 32 : 16; }
constexpr int kWarpPointsPerBlock = 4;
// Rows longer than this go to the cluster schedule on sm_90+ (a block of 512 threads keeps up
// to 32 values per thread, 16k per row, in registers).
constexpr int64_t kBlockRowMax = 16384;
constexpr int kMaxCluster = 8; // the portable cluster size

// ---------------------------------------------------------------------------------------------
// The shape of the loop tree.

void visit(const Block& b, const std::function<void(const Stmt&)>& f) {
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

LoopNest nest_of(const Loop* l) {
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
bool row_invariant(const Analysis& a, const Index& ix) {
  for (const auto& [var, coef] : ix.terms)
    for (const Loop* l : a.grid.loops)
      if (l->var == var) return false;
  return true;
}

int64_t index_bound(const Index& ix, const std::map<std::string, int64_t>& extents) {
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

Analysis analyze(const Kernel& k) {
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
    // An opaque part may compute intermediates larger than the index: keep it 64-bit.
    a.wide |= !ix->affine() || index_bound(*ix, a.extents) >= kNarrowLimit;
  });
  return a;
}

// ---------------------------------------------------------------------------------------------
// Printing.

struct Out {
  std::ostringstream os;
  void line(int depth, const std::string& s) { os << std::string(2 * depth, ' ') << s << '\n'; }
};

const char* op_macro(kir::ReduceOp op) {
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

std::string load_conv(DType storage, DType compute, const std::string& e) {
  if (storage == DType::Float16) return "kr_h2f(" + e + ")";
  if (storage == DType::BFloat16) return "kr_bf2f(" + e + ")";
  if (storage == compute) return e;
  return std::string("(") + kir::ctype(compute) + ")(" + e + ")";
}

std::string store_conv(DType storage, const std::string& e) {
  if (storage == DType::Float16) return "kr_f2h(" + e + ")";
  if (storage == DType::BFloat16) return "kr_f2bf(" + e + ")";
  return std::string("(") + kir::ctype(storage) + ")(" + e + ")";
}

using Rename = std::map<std::string, std::string>;

std::string index_expr(const Index& ix, const Rename& rename = {}) {
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
  if (!ix.opaque.empty()) s += (s.empty() ? "(" : " + (") + ix.opaque + ")";
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
                      s.let.expr + ";");
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

std::vector<std::pair<std::string, int64_t>> dims_of(const LoopNest& n) {
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
std::string vector_store(Emitter& e, const kir::Buffer& b, const kir::Store& st,
                         const std::string& reg, int lanes,
                         const std::map<std::string, std::string>& base, int d,
                         std::vector<std::string>& after, const Block& body,
                         bool stream = false) {
  const std::string n = std::to_string(lanes);
  const std::string store = stream ? "kr_store_vec_cs<" : "kr_store_vec<";
  const std::string ptr = b.name + " + " + index_expr(st.index, base);
  if (b.dtype == DType::BFloat16 && lanes % 2 == 0) {
    std::string value = st.value;
    static const std::string kOpen = "(float)(kr_bf2f(kr_f2bf((float)(";
    static const std::string kClose = "))))";
    for (const Stmt& s : body)
      if (s.kind == Stmt::Kind::Let && s.let.var == st.value && s.let.dtype == DType::Float32 &&
          s.let.expr.size() > kOpen.size() + kClose.size() && s.let.expr.rfind(kOpen, 0) == 0 &&
          s.let.expr.compare(s.let.expr.size() - kClose.size(), kClose.size(), kClose) == 0)
        value = s.let.expr.substr(kOpen.size(),
                                  s.let.expr.size() - kOpen.size() - kClose.size());
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

unsigned clamp_grid(int64_t blocks) {
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 0x7fffffff));
}

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
    if (!ix.affine() || (c != 0 && c != 1)) return 0;
    if (s.kind == Stmt::Kind::Store && c != 1) return 0;
    if (c == 1) widest = std::max(widest, itemsize(k.buffers.at(buf).dtype));
  }
  if (widest == 0 || widest > 8) return 0;
  const int vec = 16 / widest;
  if (extent % vec != 0) return 0;
  for (const Stmt& s : *a.point) {
    if (s.kind != Stmt::Kind::Load && s.kind != Stmt::Kind::Store) continue;
    const Index& ix = s.kind == Stmt::Kind::Load ? s.load.index : s.store.index;
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
      if (s.load.index.coef(v) == 0) { // the same element for every lane: load it once
        o.line(2, e.load_line(s.load));
        e.replace[&s] = "";
        continue;
      }
      const std::string st = kir::ctype(b.dtype);
      const std::string reg = "kr_ld" + std::to_string(n++);
      o.line(2, "const kr_vec<" + st + ", " + lanes + "> " + reg + " = kr_load_vec<" + st +
                    ", " + lanes + ">(" + b.name + " + " + index_expr(s.load.index, base) +
                    ");");
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
bool vector_access(const Index& ix, const LoopNest& nest) {
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
int64_t values_per_thread(const LoopNest& nest, int threads, int vec) {
  if (vec <= 1) return (nest.extent + threads - 1) / threads;
  return (nest.extent / vec + threads - 1) / threads * vec;
}

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
// buffer and index, loop variables by position, lets by the number of their form. The same
// values, computed once: bitwise unchanged.
bool expensive(const std::string& expr) {
  static const char* const kFns[] = {"kr_exp", "kr_log", "kr_sin",  "kr_cos", "kr_tan",
                                     "kr_erf", "kr_pow", "kr_sqrt", "kr_rsqrt"};
  for (const char* f : kFns)
    if (expr.find(f) != std::string::npos) return true; // kr_exp also finds kr_exp2, kr_expm1
  return false;
}

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
      const std::string form =
          std::string(kir::ctype(s.let.dtype)) + ":(" +
          kir::map_identifiers(s.let.expr, [&](const std::string& id) {
            auto it = canon.find(id);
            return it == canon.end() ? id : it->second;
          }) +
          ")";
      const std::string v = id_of(form);
      canon[s.let.var] = v;
      // Worth keeping when the let itself calls an expensive function (a cast of an expensive
      // value is cheap to redo from the kept value).
      if (!expensive(s.let.expr)) continue;
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
                      const std::vector<std::string>& trip_tail = {}) {
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

// One cached row's copy for the row prefetch: the fill load and its (vectorized) nest.
struct AsyncFill {
  const Stmt* load;
  const LoopNest* nest;
  std::string arr;
};

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

// Whether the parenthesis at x[open] closes at the end of x.
bool closes_at_end(const std::string& x, size_t open) {
  int depth = 0;
  for (size_t i = open; i < x.size(); ++i) {
    depth += x[i] == '(' ? 1 : x[i] == ')' ? -1 : 0;
    if (depth == 0) return i == x.size() - 1;
  }
  return false;
}

// `expr` without enclosing parentheses and "(float)" casts of a whole expression.
std::string strip_float_casts(std::string expr) {
  const auto whole = closes_at_end;
  for (;;) {
    if (expr.rfind("(float)(", 0) == 0 && expr.back() == ')' && whole(expr, 7))
      expr = expr.substr(8, expr.size() - 9);
    else if (!expr.empty() && expr[0] == '(' && expr.back() == ')' && whole(expr, 0))
      expr = expr.substr(1, expr.size() - 2);
    else
      return expr;
  }
}

bool identifier(const std::string& x) {
  if (x.empty() || std::isdigit(static_cast<unsigned char>(x[0]))) return false;
  for (char c : x)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
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
  // A float value through the lets that only cast or copy it.
  auto resolve = [](const std::map<std::string, const Stmt*>& d, std::string v) {
    for (auto it = d.find(v); it != d.end() && it->second->kind == Stmt::Kind::Let &&
                              it->second->let.dtype == DType::Float32;
         it = d.find(v)) {
      const std::string x = strip_float_casts(it->second->let.expr);
      if (!identifier(x)) break;
      v = x;
    }
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
      const std::string call = strip_float_casts(ex->let.expr);
      if (call.rfind("kr_exp(", 0) != 0 || !closes_at_end(call, 6)) continue;
      // The argument: x - m, inline or in a let.
      std::string dx = strip_float_casts(call.substr(6));
      if (identifier(dx)) {
        const Stmt* diff = let_of(d2, resolve(d2, dx));
        if (!diff) continue;
        dx = strip_float_casts(diff->let.expr);
      }
      const size_t minus = dx.find(" - ");
      if (minus == std::string::npos) continue;
      const std::string x = dx.substr(0, minus), m = dx.substr(minus + 3);
      if (!identifier(x) || !identifier(m) || (m != a1 && resolve(between, m) != a1)) continue;
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
    auto check = [&](const std::string& expr) {
      kir::map_identifiers(expr, [&](const std::string& id) {
        reads_between |= id != p.carrier && between.count(id) > 0;
        return id;
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

// `vecs` empty: the scalar variant; otherwise the width per nest (block_vector_plan).
// `smem_bytes`: the dynamic shared memory the kernel needs at launch.
void emit_block_kernel(Emitter& e, const std::string& name, const BlockPlan& plan,
                       int64_t& smem_bytes, const std::vector<int>& vecs_in = {}) {
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

int64_t pow2_ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

} // namespace

void apply_cuda_tuning(CudaDeviceInfo& info, const std::string& spec) {
  // The keys, their ranges and meaning are declared in the options registry; here only which
  // field each sets.
  static const std::pair<const char*, int CudaDeviceInfo::*> kFields[] = {
      {"block_threads", &CudaDeviceInfo::block_threads},
      {"block_min_blocks", &CudaDeviceInfo::block_min_blocks},
      {"block_persist", &CudaDeviceInfo::block_persist},
      {"cache_hints", &CudaDeviceInfo::cache_hints},
      {"pointwise_vec", &CudaDeviceInfo::pointwise_vec},
      {"cluster_hoist_kb", &CudaDeviceInfo::cluster_hoist_kb},
      {"cluster_merge_variance", &CudaDeviceInfo::cluster_merge_variance},
      {"cluster_merge_softmax", &CudaDeviceInfo::cluster_merge_softmax},
      {"cluster_threads", &CudaDeviceInfo::cluster_threads},
      {"max_cluster", &CudaDeviceInfo::max_cluster},
      {"cluster_reg_values", &CudaDeviceInfo::cluster_reg_values},
      {"cluster_smem_bytes", &CudaDeviceInfo::cluster_smem_bytes},
      {"cluster_persist", &CudaDeviceInfo::cluster_persist},
      {"cluster_prefetch", &CudaDeviceInfo::cluster_prefetch},
      {"cluster_async_reduce", &CudaDeviceInfo::cluster_async_reduce},
      {"reuse_values", &CudaDeviceInfo::reuse_values},
  };
  for (const auto& [key, v] : options::tuning("cuda_tune", spec)) {
    auto f = std::find_if(std::begin(kFields), std::end(kFields),
                          [&](const auto& e) { return key == e.first; });
    KR_INTERNAL(f != std::end(kFields), "cuda_tune key ", key, " sets no field");
    info.*(f->second) = static_cast<int>(v);
  }
}

CudaKernelSource emit_cuda(const kir::Kernel& k, const CudaDeviceInfo& dev) {
  const Analysis a = analyze(k);
  Out out;
  Emitter e{k, a, out, {}, {}};
  CudaKernelSource r;
  r.entry = k.name;

  out.line(0, "// " + std::string(k.name) + ", generated by keraunos from:");
  {
    std::istringstream listing(k.str());
    for (std::string l; std::getline(listing, l);) out.line(0, "//   " + l);
  }

  if (!a.nested) {
    r.schedule = "pointwise";
    r.launch = grid_stride_launch(a.points);
    emit_grid_stride(e, r.entry, static_cast<int>(r.launch.block[0]));
    if (const int vec = std::min(vector_width(k, a), dev.pointwise_vec); vec > 1) {
      r.vec = vec;
      r.entry_vec = k.name + "_vec";
      r.launch_vec = grid_stride_launch(a.points / vec);
      out.line(0, "");
      emit_vectorized(e, r.entry_vec, vec, static_cast<int>(r.launch_vec.block[0]));
    }
  } else {
    // The longest loop of an outer point, and whether its loads run along the loop (a row) or
    // along the outer points (a column: neighbouring outer points read neighbouring elements).
    int64_t longest = 0;
    bool row_access = false, column_access = false;
    const std::string inner_point_var = a.grid.loops.empty() ? "" : a.grid.loops.back()->var;
    for (const Stmt& s : *a.point) {
      if (s.kind != Stmt::Kind::Loop) continue;
      const LoopNest nest = nest_of(s.loop.get());
      longest = std::max(longest, nest.extent);
      visit(*nest.body, [&](const Stmt& b) {
        if (b.kind != Stmt::Kind::Load) return;
        row_access |= b.load.index.coef(nest.loops.back()->var) == 1;
        column_access |= !inner_point_var.empty() && b.load.index.coef(inner_point_var) == 1;
      });
    }
    const bool columns = column_access && !row_access && a.points >= int64_t{dev.sm_count} * 256;
    // The widest item the point's loops load.
    int64_t row_itemsize = 1;
    for (const Stmt& s : *a.point)
      if (s.kind == Stmt::Kind::Loop)
        visit(s.loop->body, [&](const Stmt& b) {
          if (b.kind == Stmt::Kind::Load)
            row_itemsize = std::max<int64_t>(row_itemsize, itemsize(k.buffers.at(b.load.buffer).dtype));
        });
    if (longest <= 16 || columns) {
      r.schedule = "thread";
      r.launch = grid_stride_launch(a.points);
      emit_grid_stride(e, r.entry, static_cast<int>(r.launch.block[0]));
    } else {
      BlockPlan plan;
      plan.reuse_values = dev.reuse_values != 0;
      if (longest <= 256) {
        r.schedule = "warp";
        plan.threads = 32;
        plan.points_per_block = kWarpPointsPerBlock;
        plan.reg_values = register_cache_max(32);
      } else if (longest > kBlockRowMax && dev.major >= 9) {
        // Rows too long for one block's registers: a cluster of blocks per row, so that the row
        // is read from memory once: the fewest blocks (2, 4, ... max_cluster) that keep
        // <= cluster_reg_values per thread in registers, else max_cluster blocks with their part
        // of the row cached in dynamic shared memory when it fits the budget, else re-read
        // (from L2: only a few rows are in flight).
        r.schedule = "cluster";
        plan.threads = std::min(dev.cluster_threads, dev.max_threads_per_block);
        auto per_thread = [&](int c) {
          const int64_t t = int64_t{c} * plan.threads;
          return (longest + t - 1) / t;
        };
        plan.cluster = dev.max_cluster;
        for (int c = 2; c <= dev.max_cluster; c *= 2) {
          if (per_thread(c) <= dev.cluster_reg_values) {
            plan.cluster = c;
            break;
          }
        }
        plan.reg_values = dev.cluster_reg_values;
        plan.prefetch = dev.cluster_prefetch != 0;
        plan.async_reduce = dev.cluster_async_reduce != 0;
        plan.merge_variance = dev.cluster_merge_variance != 0;
        plan.merge_softmax = dev.cluster_merge_softmax != 0;
        // Two blocks of 512 threads per SM: each may take half the SM's shared memory, less
        // what the all-reduce and the runtime keep, and less is better (cluster_hoist_kb): the
        // SM's L1 is what its shared memory leaves, and the rows' loads in flight need it.
        if (dev.cluster_persist != 0)
          plan.hoist_smem_bytes = std::clamp<int64_t>(
              dev.shared_mem_optin / std::max(1, 1024 / plan.threads) - 8192, 0,
              int64_t{dev.cluster_hoist_kb} * 1024);
        if (per_thread(plan.cluster) > dev.cluster_reg_values)
          plan.smem_cache_bytes = dev.cluster_smem_bytes >= 0
                                      ? std::min(dev.cluster_smem_bytes, dev.shared_mem_optin)
                                      : std::max(0, dev.shared_mem_optin - 4096);
      } else {
        r.schedule = "block";
        // 128..512 threads, then 1024 when the row does not fit in registers (only before
        // sm_90: longer rows go to clusters). On an H200 (fp32, % of a device copy's bandwidth):
        // layer_norm on rows of 8k got 67% at 1024 threads and 97% at 512; softmax, layer_norm,
        // rms_norm reach 93-99% for rows of 1k-16k.
        // Threads by the row's bytes: ~64 bytes of the widest row buffer per thread (a bf16 row
        // of 8k elements gets 256 threads, 32 values each: 96% of copy, against 88% at 512).
        const int64_t max_threads = std::min(1024, dev.max_threads_per_block);
        int64_t threads =
            std::clamp<int64_t>(pow2_ceil((longest * row_itemsize + 63) / 64), 128, 512);
        if ((longest + threads - 1) / threads > register_cache_max(static_cast<int>(threads)))
          threads = max_threads;
        if (dev.block_threads > 0) threads = dev.block_threads;
        plan.threads = static_cast<int>(std::min(threads, max_threads));
        plan.reg_values = register_cache_max(plan.threads);
        plan.min_blocks = dev.block_min_blocks;
        plan.persist = dev.block_persist != 0;
        // Eviction priorities are PTX 7.4 on sm_70+ (the stores' .cs is older; one gate).
        plan.cache_hints = k.noalias && dev.major >= 7 ? dev.cache_hints : 0;
        plan.prefetch = plan.persist;
      }
      r.launch.block[0] = static_cast<unsigned>(plan.threads);
      r.launch.block[1] = static_cast<unsigned>(plan.points_per_block);
      if (plan.cluster > 1) {
        r.cluster = plan.cluster;
        const int64_t clusters = dev.cluster_persist > 0 ? dev.cluster_persist : 0x7fffffff / plan.cluster;
        r.launch.grid[0] =
            static_cast<unsigned>(std::min<int64_t>(a.points, clusters) * plan.cluster);
        r.fit_clusters = dev.cluster_persist < 0;
      } else {
        r.launch.grid[0] =
            clamp_grid((a.points + plan.points_per_block - 1) / plan.points_per_block);
        if (plan.persist) r.fit_blocks = dev.sm_count;
      }
      int64_t smem = 0;
      emit_block_kernel(e, r.entry, plan, smem);
      r.launch.shared_mem = static_cast<unsigned>(smem);
      const std::vector<int> vecs = block_vector_plan(k, point_nests(a));
      if (const int vec = *std::max_element(vecs.begin(), vecs.end()); vec > 1) {
        r.vec = vec;
        r.entry_vec = k.name + "_vec";
        r.launch_vec = r.launch; // the same threads: as many elements per thread
        out.line(0, "");
        emit_block_kernel(e, r.entry_vec, plan, smem, vecs);
        r.launch_vec.shared_mem = static_cast<unsigned>(smem);
      }
    }
  }
  r.source = std::string(embedded_file("kr_cuda.cuh")) + "\n" + out.os.str();
  return r;
}

} // namespace keraunos::codegen
